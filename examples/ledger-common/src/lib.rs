//! What the budget and license examples share. Both grant Workloads something (a charge, a
//! license), keep who holds what in a ledger ConfigMap, and take back from Workloads that ended
//! unnoticed in a sweep; the ledger's safety (versions, conflicts, the check's label) is the
//! SDK's [`configmap_store`](kueue_admission_sdk::configmap_store). This crate holds only the
//! plumbing around it, so that each example shows what is its own.
//!
//! - [`Error`]: the one error type of such a check;
//! - [`read_workload`], [`read_config_map`]: the two reads from the API server both make;
//! - [`Sweep`] and [`sweep_while_leading`]: the sweep as a task of the leader;
//! - [`testing`]: the release and concurrency drivers of their unit tests.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::Api;
use kueue_admission_sdk::Extensions;
use kueue_admission_sdk::api::Workload;
use kueue_admission_sdk::configmap_store::StoreError;
use kueue_admission_sdk::shadow::ShadowScope;

pub mod testing;

/// What can go wrong. Nothing here is written into a Workload as a state: the runtime retries
/// with backoff and shows the message in an event on the Workload (`CheckFailed`,
/// `CheckReleaseFailed`) and in the logs. Bad user input (a malformed budget, pool or request)
/// is not an error but a `Pending` or `Rejected` decision with a message.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the API server failed.
    #[error("Kubernetes API: {0}")]
    Api(#[from] kube::Error),
    /// A ledger ConfigMap could not be read or updated: unreadable (ignoring an entry could
    /// overspend a budget or hand out a license twice, so the check grants nothing from that
    /// ledger until a person fixes or deletes the key), not the check's, or changed under every
    /// attempt to update it.
    #[error(transparent)]
    Ledger(#[from] StoreError),
    /// A Workload without a uid or namespace: not one read from the API server.
    #[error("workload {0} has no uid or namespace")]
    NotFromTheApiServer(String),
}

/// Reads a Workload fresh from the API server, not from a cache: what a Workload holds is
/// judged against the Workload read after the ledger, never before.
pub async fn read_workload(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Option<Workload>, Error> {
    Ok(Api::<Workload>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await?)
}

/// The data of a ConfigMap people write for the check (the budgets, the license pool), read
/// fresh for each decision so that a change takes effect at the next one; `None` if it does not
/// exist.
pub async fn read_config_map(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Option<BTreeMap<String, String>>, Error> {
    let cm = Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await?;
    Ok(cm.map(|cm| cm.data.unwrap_or_default()))
}

/// A check that reconciles its ledger with the Workloads. The runtime releases what a Workload
/// holds when it ends, but forgets what it asked on restart, and a Workload can end while no
/// controller runs: the sweep takes back what such Workloads still hold.
pub trait Sweep: Clone + Send + Sync + 'static {
    /// What one sweep took back.
    type Swept: Send;

    /// Takes back everything held by Workloads that no longer need it, each judged on its
    /// Workload as read now, and returns what it took back. Safe to run at any time and from
    /// any replica: it writes the ledger with the `resourceVersion` it read, like a grant.
    fn sweep(
        &self,
        client: &Client,
        shadow: Option<&ShadowScope>,
    ) -> impl Future<Output = Result<Vec<Self::Swept>, Error>> + Send;
}

/// The sweep of `check` as a task of the leader named `name`: once when this replica takes the
/// lead, then every `interval`.
pub fn sweep_while_leading<C: Sweep>(name: &str, interval: Duration, check: &C) -> Extensions {
    let check = check.clone();
    Extensions::new().every(name, interval, move |ctx| {
        let check = check.clone();
        async move { check.sweep(&ctx.client, ctx.shadow.as_ref()).await }
    })
}

//! For the examples' unit tests: the Workloads a fake backend reads, and drivers that call a
//! check the way the runtime does (a release, many decisions at once).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use futures::future::try_join_all;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kueue_admission_sdk::api::Workload;
use kueue_admission_sdk::testing::{decide_once, offline_client};
use kueue_admission_sdk::{AdmissionCheckController, Decision, ReleaseContext, ReleaseReason};

/// Workloads in memory by namespace and name, shared by clones: what a fake backend's fresh
/// Workload read returns (`None`: deleted, or never there).
#[derive(Clone, Debug, Default)]
pub struct MemoryWorkloads(Arc<Mutex<BTreeMap<(String, String), Workload>>>);

impl MemoryWorkloads {
    fn map(&self) -> MutexGuard<'_, BTreeMap<(String, String), Workload>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stores `wl` (replacing the Workload of that namespace and name).
    pub fn put(&self, wl: &Workload) {
        let key = (wl.namespace().unwrap_or_default(), wl.name_any());
        self.map().insert(key, wl.clone());
    }

    /// The Workload `namespace/name`, if stored.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Workload> {
        let key = (namespace.to_string(), name.to_string());
        self.map().get(&key).cloned()
    }
}

/// Calls `controller.release` once for `workload`'s entry of `check`, as the runtime does when
/// the Workload ends for `reason` at `now`, with an offline client.
pub async fn release_once<C: AdmissionCheckController>(
    controller: &C,
    workload: &Workload,
    check: &str,
    reason: ReleaseReason,
    now: Timestamp,
) -> Result<(), C::Error> {
    let client = offline_client();
    let ctx = ReleaseContext {
        namespace: &workload.namespace().unwrap_or_default(),
        name: &workload.name_any(),
        workload: Some(workload),
        check_name: check,
        reason,
        client: &client,
        now,
    };
    controller.release(&ctx).await
}

/// Decides for every Workload at once, the i-th by `replicas[i % replicas.len()]` (at least one
/// replica): replicas that share nothing but their backend, like two controllers without a
/// common lock. Returns every decision, and the names of the Workloads told `Ready`, in order.
pub async fn decide_concurrently<C: AdmissionCheckController>(
    replicas: &[C],
    workloads: &[Workload],
    check: &str,
    parameters: &C::Parameters,
) -> Result<(Vec<Decision>, Vec<String>), C::Error> {
    let decisions = try_join_all(
        workloads
            .iter()
            .enumerate()
            .map(|(i, wl)| decide_once(&replicas[i % replicas.len()], wl, check, parameters)),
    )
    .await?;
    let ready = workloads
        .iter()
        .zip(&decisions)
        .filter(|(_, d)| matches!(d, Decision::Ready { .. }))
        .map(|(wl, _)| wl.name_any())
        .collect();
    Ok((decisions, ready))
}

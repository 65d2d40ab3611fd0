//! Leader election on a `coordination.k8s.io/v1` Lease, so that of several replicas only one
//! writes. Built on `kube-lease-manager` (server-side apply on the Lease, expiry with a grace
//! period for clock skew, release on drop) rather than a hand-written lock loop.

use std::time::Duration;

use kube::Client;
use kube_lease_manager::{LeaseManagerBuilder, LeaseManagerError};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

/// How replicas elect the one that writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderElection {
    /// Namespace of the Lease (usually the controller's own).
    pub namespace: String,
    /// Name of the Lease; replicas of one controller share it.
    pub lease_name: String,
    /// This replica's identity in `holderIdentity` (pod name plus a random suffix by default).
    pub identity: String,
    /// How long a lease is valid after its last renewal; a standby takes over this long after
    /// the leader died without releasing it.
    pub lease_duration: Duration,
    /// The leader renews this long before the lease would expire (tolerated clock skew).
    pub renew_grace: Duration,
}

impl LeaderElection {
    /// A Lease named after the controller in `namespace`, with a fresh identity, a 15 s lease
    /// and 5 s of grace: a crashed leader is replaced within about 15 s, one that shuts down
    /// cleanly at once.
    pub fn new(namespace: impl Into<String>, lease_name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            lease_name: lease_name.into(),
            identity: default_identity(),
            lease_duration: Duration::from_secs(15),
            renew_grace: Duration::from_secs(5),
        }
    }
}

/// A Lease name derived from a controller name (`example.com/budget` → `example.com-budget`):
/// a DNS subdomain of at most 253 characters.
pub fn lease_name_for(controller_name: &str) -> String {
    let mut name: String = controller_name
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '-' | '.' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '-',
        })
        .collect();
    name.truncate(253);
    let trimmed = name.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    if trimmed.is_empty() {
        "kueue-admission-check".into()
    } else {
        trimmed.into()
    }
}

/// `$POD_NAME` (or the host name) and a random suffix, so that two processes on one host, or a
/// restarted pod that kept its name, never pass for each other.
fn default_identity() -> String {
    let base = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "kueue-admission-check".into());
    format!("{base}_{:08x}", rand::random::<u32>())
}

/// Whether this replica leads, as a watch channel; dropping every receiver releases the Lease.
/// Dropped without [`Leadership::release`] (the runtime's future dropped mid-way), the election
/// task is aborted and the Lease expires on its own, as after a crash.
pub(crate) struct Leadership {
    pub leading: watch::Receiver<bool>,
    /// Keeps the channel open when there is no election (always leading).
    _always: Option<watch::Sender<bool>>,
    task: Option<JoinHandle<Result<kube_lease_manager::LeaseManager, LeaseManagerError>>>,
}

impl Leadership {
    /// Always the leader: no election.
    pub fn always() -> Self {
        let (tx, rx) = watch::channel(true);
        Self {
            leading: rx,
            _always: Some(tx),
            task: None,
        }
    }

    /// Joins the election; fails if the Lease cannot be read or created (e.g. RBAC).
    pub async fn elect(client: Client, config: &LeaderElection) -> Result<Self, LeaseManagerError> {
        let manager = LeaseManagerBuilder::new(client, &config.lease_name)
            .with_namespace(&config.namespace)
            .with_identity(&config.identity)
            .with_duration(config.lease_duration.as_secs().max(2))
            .with_grace(
                config
                    .renew_grace
                    .as_secs()
                    .clamp(1, config.lease_duration.as_secs().max(2) - 1),
            )
            .with_field_manager(format!("kueue-admission-sdk/{}", config.identity))
            .build()
            .await?;
        let (leading, task) = manager.watch().await;
        info!(lease = %config.lease_name, namespace = %config.namespace, identity = %config.identity, "joined the leader election");
        Ok(Self {
            leading,
            _always: None,
            task: Some(task),
        })
    }

    /// Leaves the election, releasing the Lease if held, so a standby takes over at once.
    pub async fn release(mut self, timeout: Duration) {
        let Some(task) = self.task.take() else { return };
        drop(self);
        match tokio::time::timeout(timeout, task).await {
            Ok(Ok(Ok(_))) => info!("left the leader election"),
            Ok(Ok(Err(e))) => warn!(error = %e, "releasing the leader lease"),
            Ok(Err(e)) => warn!(error = %e, "the leader election task failed"),
            Err(_) => warn!("releasing the leader lease timed out; it expires on its own"),
        }
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::lease_name_for;

    #[test]
    fn lease_names_are_dns_subdomains() {
        assert_eq!(
            lease_name_for("kueue-admission-checks.dev/budget"),
            "kueue-admission-checks.dev-budget"
        );
        assert_eq!(
            lease_name_for("Example.COM/License_Check"),
            "example.com-license-check"
        );
        assert_eq!(lease_name_for("///"), "kueue-admission-check");
        assert!(lease_name_for(&"x".repeat(400)).len() <= 253);
    }
}

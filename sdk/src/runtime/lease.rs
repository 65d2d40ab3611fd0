//! Leader election on a `coordination.k8s.io/v1` Lease, so that of several replicas only one
//! writes. Built on `kube-lease-manager` (server-side apply on the Lease, expiry with a grace
//! period for clock skew, release on drop) rather than a hand-written lock loop.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
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

/// The annotation naming the controller a Lease elects for. A Lease without it, or naming
/// another controller, is not joined: the runtime never takes over another program's Lease,
/// and two controllers whose names map to the same Lease name fail loudly instead of one of
/// them standing by forever.
pub const LEASE_OWNER_ANNOTATION: &str = "kueue-admission-checks.dev/controller-name";

/// The field manager prefix of the SDK's Lease writes; a Lease written by an SDK controller
/// from before [`LEASE_OWNER_ANNOTATION`] existed is recognised by it.
const LEASE_FIELD_MANAGER_PREFIX: &str = "kueue-admission-sdk/";

/// Whether the Lease `lease` may be joined by `controller_name`: `Ok(true)` if it already
/// names it, `Ok(false)` if it is an SDK Lease from before the annotation (to be marked),
/// `Err` with the reason otherwise. Pure.
pub(crate) fn lease_ownership(lease: &Lease, controller_name: &str) -> Result<bool, String> {
    let qualified = format!(
        "{}/{}",
        lease.namespace().unwrap_or_default(),
        lease.name_any()
    );
    match lease.annotations().get(LEASE_OWNER_ANNOTATION) {
        Some(owner) if owner == controller_name => Ok(true),
        Some(owner) => Err(format!(
            "Lease {qualified} elects a leader for controller {owner:?}, not {controller_name:?}; \
             give this controller its own Lease (--leader-election-id)"
        )),
        None => {
            let ours = lease.managed_fields().iter().any(|m| {
                m.manager
                    .as_deref()
                    .is_some_and(|m| m.starts_with(LEASE_FIELD_MANAGER_PREFIX))
            });
            if ours {
                Ok(false)
            } else {
                Err(format!(
                    "Lease {qualified} exists and was not made by a kueue-admission-sdk \
                     controller; it is left alone: give this controller its own Lease \
                     (--leader-election-id)"
                ))
            }
        }
    }
}

/// Makes sure the Lease exists and is this controller's before the election uses it.
async fn claim_lease(
    client: &Client,
    config: &LeaderElection,
    controller_name: &str,
) -> Result<(), crate::error::Error> {
    let api: Api<Lease> = Api::namespaced(client.clone(), &config.namespace);
    let err = |e: kube::Error| crate::error::Error::LeaderElection(LeaseManagerError::KubeError(e));
    let existing = match api.get_opt(&config.lease_name).await.map_err(err)? {
        Some(lease) => lease,
        None => {
            let mut lease = Lease::default();
            lease.metadata.name = Some(config.lease_name.clone());
            lease.metadata.namespace = Some(config.namespace.clone());
            lease
                .annotations_mut()
                .insert(LEASE_OWNER_ANNOTATION.into(), controller_name.into());
            match api.create(&PostParams::default(), &lease).await {
                Ok(_) => return Ok(()),
                // Another replica created it meanwhile: judge what is there.
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    api.get(&config.lease_name).await.map_err(err)?
                }
                Err(e) => return Err(err(e)),
            }
        }
    };
    match lease_ownership(&existing, controller_name) {
        Ok(true) => Ok(()),
        Ok(false) => {
            let mark = serde_json::json!({"metadata": {"annotations": {LEASE_OWNER_ANNOTATION: controller_name}}});
            api.patch(
                &config.lease_name,
                &PatchParams::default(),
                &Patch::Merge(&mark),
            )
            .await
            .map_err(err)?;
            Ok(())
        }
        Err(why) => Err(crate::error::Error::Config(why)),
    }
}

/// Whether joining the election failed for a reason that passes by itself: the API server
/// unreachable, overloaded or failing (5xx, 429, 408). A refusal (403, a Lease that is not
/// ours, an invalid name) is not waited out: it needs the operator.
fn is_transient(error: &crate::error::Error) -> bool {
    match error {
        crate::error::Error::LeaderElection(LeaseManagerError::KubeError(e)) => match e {
            kube::Error::Api(status) => {
                status.code >= 500 || status.code == 429 || status.code == 408
            }
            kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => {
                true
            }
            _ => false,
        },
        _ => false,
    }
}

/// 1 s doubling to 30 s: a restarting API server is back within seconds, a longer outage is
/// probed twice a minute.
fn join_backoff() -> crate::retry::RetryPolicy {
    crate::retry::RetryPolicy::runtime_backoff(Duration::from_secs(30))
}

/// A Lease name derived from a controller name (`example.com/budget` → `example.com-budget`):
/// a DNS subdomain of at most 253 characters, each `.`-separated label starting and ending with
/// a letter or digit (`a/.b` would otherwise give the invalid label `a-`).
pub fn lease_name_for(controller_name: &str) -> String {
    let mapped: String = controller_name
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '-' | '.' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '-',
        })
        .collect();
    let mut name = String::with_capacity(mapped.len().min(253));
    for label in mapped
        .split('.')
        .map(|label| label.trim_matches('-'))
        .filter(|label| !label.is_empty())
    {
        // All ASCII by now, so byte lengths are character counts.
        let room = 253usize.saturating_sub(name.len() + usize::from(!name.is_empty()));
        let label = label[..label.len().min(room)].trim_end_matches('-');
        if label.is_empty() {
            break;
        }
        if !name.is_empty() {
            name.push('.');
        }
        name.push_str(label);
    }
    if name.is_empty() {
        "kueue-admission-check".into()
    } else {
        name
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

    /// Joins the election; fails if the Lease may not be read or created (e.g. RBAC), or is
    /// not this controller's (see [`LEASE_OWNER_ANNOTATION`]). An API server that cannot be
    /// reached or answers 5xx/429 is waited for (with backoff, each try logged), so a replica
    /// started during an outage joins once it ends instead of exiting into a crash loop.
    pub async fn elect(
        client: Client,
        config: &LeaderElection,
        controller_name: &str,
    ) -> Result<Self, crate::error::Error> {
        let mut failures = 0u32;
        loop {
            match Self::try_elect(client.clone(), config, controller_name).await {
                Err(e) if is_transient(&e) => {
                    failures = failures.saturating_add(1);
                    let delay = join_backoff().delay(failures, rand::random::<f64>());
                    warn!(error = %e, source = ?std::error::Error::source(&e), attempt = failures, retry_in = ?delay,
                        "cannot join the leader election yet; trying again");
                    tokio::time::sleep(delay).await;
                }
                outcome => return outcome,
            }
        }
    }

    async fn try_elect(
        client: Client,
        config: &LeaderElection,
        controller_name: &str,
    ) -> Result<Self, crate::error::Error> {
        claim_lease(&client, config, controller_name).await?;
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
            .await
            .map_err(crate::error::Error::LeaderElection)?;
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
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

    fn lease(annotation: Option<&str>, manager: Option<&str>) -> Lease {
        let mut lease = Lease::default();
        lease.metadata.name = Some("example.com-budget".into());
        lease.metadata.namespace = Some("ops".into());
        if let Some(owner) = annotation {
            lease
                .annotations_mut()
                .insert(LEASE_OWNER_ANNOTATION.into(), owner.into());
        }
        if let Some(m) = manager {
            lease.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
                manager: Some(m.into()),
                ..Default::default()
            }]);
        }
        lease
    }

    #[test]
    fn only_a_lease_of_this_controller_is_joined() {
        assert_eq!(
            lease_ownership(
                &lease(Some("example.com/budget"), None),
                "example.com/budget"
            ),
            Ok(true)
        );
        let other = lease_ownership(
            &lease(Some("example.com-budget"), None),
            "example.com/budget",
        )
        .expect_err("another controller's");
        assert!(other.contains("ops/example.com-budget") && other.contains("--leader-election-id"));
        assert_eq!(
            lease_ownership(
                &lease(None, Some("kueue-admission-sdk/pod-a_1234abcd")),
                "example.com/budget"
            ),
            Ok(false),
            "an SDK Lease from before the annotation is marked, not refused"
        );
        let foreign = lease_ownership(
            &lease(None, Some("kube-controller-manager")),
            "example.com/budget",
        )
        .expect_err("a foreign Lease");
        assert!(foreign.contains("not made by a kueue-admission-sdk controller"));
        assert!(lease_ownership(&lease(None, None), "example.com/budget").is_err());
    }

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
        // Found by property testing: labels must not start or end with '-', nor be empty.
        assert_eq!(lease_name_for("a/.b"), "a.b");
        assert_eq!(lease_name_for("a..b/-c"), "a.b--c");
        assert_eq!(lease_name_for(".-x-."), "x");
    }

    // Claiming the Lease against a scripted API server: each answer it can give.

    fn config() -> LeaderElection {
        LeaderElection::new("ops", "example.com-budget")
    }

    async fn claim(api: &crate::testing::ScriptedApi) -> Result<(), crate::error::Error> {
        claim_lease(&api.client(), &config(), "example.com/budget").await
    }

    #[tokio::test]
    async fn a_missing_lease_is_created_with_the_controllers_name() {
        let api = crate::testing::ScriptedApi::new();
        api.fail(404, "NotFound", "leases not found");
        api.answer(201, lease(Some("example.com/budget"), None));
        claim(&api).await.expect("claimed");
        let requests = api.requests();
        assert_eq!(requests[1].method, "POST");
        assert_eq!(
            requests[1].body["metadata"]["annotations"][LEASE_OWNER_ANNOTATION],
            "example.com/budget"
        );
    }

    #[tokio::test]
    async fn a_lease_another_controller_created_meanwhile_is_refused_with_the_fix() {
        let api = crate::testing::ScriptedApi::new();
        api.fail(404, "NotFound", "leases not found");
        api.fail(409, "AlreadyExists", "leases already exists");
        api.answer(200, lease(Some("example.com/license"), None));
        let err = claim(&api).await.expect_err("not ours");
        assert_eq!(err.label(), "config");
        assert!(err.to_string().contains("--leader-election-id"), "{err}");
        assert_eq!(api.calls().len(), 3, "nothing written to their Lease");
    }

    #[tokio::test]
    async fn a_lease_of_another_program_is_left_alone_and_an_old_sdk_lease_is_marked() {
        let api = crate::testing::ScriptedApi::new();
        api.answer(200, lease(None, Some("someone-else")));
        let err = claim(&api).await.expect_err("not ours");
        assert!(err.to_string().contains("left alone"), "{err}");
        assert!(api.requests().iter().all(|r| r.method == "GET"));

        let api = crate::testing::ScriptedApi::new();
        api.answer(200, lease(None, Some("kueue-admission-sdk/pod-1_0a")));
        api.answer(200, lease(Some("example.com/budget"), None));
        claim(&api).await.expect("an SDK Lease is ours");
        assert_eq!(api.requests()[1].method, "PATCH");
    }

    #[tokio::test]
    async fn a_lease_that_cannot_be_read_fails_the_start_with_the_api_error() {
        for code in [403, 500] {
            let api = crate::testing::ScriptedApi::new();
            api.fail(
                code,
                "Failure",
                "leases.coordination.k8s.io is not readable",
            );
            let err = claim(&api).await.expect_err("cannot read");
            assert_eq!(err.label(), "leader_election", "{code}");
            assert!(
                err.to_string().contains("not readable")
                    || format!("{err:?}").contains("not readable"),
                "{code}: {err:?}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_unreachable_or_failing_api_server_is_waited_for_and_a_refusal_is_not() {
        let api = crate::testing::ScriptedApi::new();
        api.drop_connection();
        api.fail(
            503,
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
        );
        api.fail(429, "TooManyRequests", "slow down");
        api.fail(403, "Forbidden", "leases.coordination.k8s.io is forbidden");
        let started = tokio::time::Instant::now();
        let err = Leadership::elect(api.client(), &config(), "example.com/budget")
            .await
            .err()
            .expect("a 403 ends the wait");
        assert_eq!(err.label(), "leader_election");
        assert!(format!("{err:?}").contains("forbidden"), "{err:?}");
        assert_eq!(
            api.calls().len(),
            4,
            "tried again after each transient failure, not after the 403"
        );
        assert!(
            started.elapsed() >= Duration::from_secs(3),
            "waited between tries: {:?}",
            started.elapsed()
        );

        // A Lease of another controller is a configuration error: no second try.
        let api = crate::testing::ScriptedApi::new();
        api.answer(200, lease(Some("example.com/license"), None));
        let err = Leadership::elect(api.client(), &config(), "example.com/budget")
            .await
            .err()
            .expect("not ours");
        assert_eq!(err.label(), "config");
        assert_eq!(api.calls().len(), 1);
    }

    /// DNS-1123 subdomain: at most 253 characters, labels of `[a-z0-9-]` that start and end with
    /// an alphanumeric character, separated by single dots.
    fn is_dns_subdomain(name: &str) -> bool {
        name.len() <= 253
            && !name.is_empty()
            && name.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 253
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            })
    }

    proptest::proptest! {
        #[test]
        fn every_controller_name_gives_a_valid_lease_name(name in "\\PC{0,300}|[a-zA-Z0-9./_-]{0,300}") {
            let lease = lease_name_for(&name);
            proptest::prop_assert!(is_dns_subdomain(&lease), "{name:?} gave {lease:?}");
            // Stable: a valid name maps to itself, so two replicas always agree.
            proptest::prop_assert_eq!(lease_name_for(&lease), lease);
        }
    }
}

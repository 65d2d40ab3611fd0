//! The Kueue API this runtime speaks, checked once before any watch starts: against a Kueue
//! older than v0.15 (no `kueue.x-k8s.io/v1beta2`) the watches would only fail with 404 again
//! and again, so the runtime says which Kueue it needs, where people look, and waits.

use std::time::Duration;

use kube::Client;
use tracing::{error, info, warn};

use crate::check::ApiKind;
use crate::error::Error;

use super::check_registry::why_not_served;
use super::http::Health;

/// The oldest Kueue that serves the API version below.
pub(crate) const OLDEST_KUEUE: &str = "v0.15";

/// What the runtime watches and writes: Workloads and AdmissionChecks at `v1beta2`.
pub(crate) const NEEDED: [ApiKind; 2] = [
    ApiKind {
        group: "kueue.x-k8s.io",
        version: "v1beta2",
        kind: "Workload",
        plural: "workloads",
    },
    ApiKind {
        group: "kueue.x-k8s.io",
        version: "v1beta2",
        kind: "AdmissionCheck",
        plural: "admissionchecks",
    },
];

/// The first discovery retry after a failure or a missing API; doubled up to the cap.
const FIRST_RETRY: Duration = Duration::from_secs(1);
/// Discovery has no watch: while waiting for a Kueue upgrade, ask at most this often.
const MAX_RETRY: Duration = Duration::from_secs(60);

/// `None` if the cluster serves every kind this runtime needs; else the message to show.
pub(crate) async fn missing(client: &Client) -> Result<Option<String>, Error> {
    for kind in &NEEDED {
        if let Some(why) = why_not_served(client, kind).await? {
            return Ok(Some(format!(
                "the runtime needs {} (Kueue {OLDEST_KUEUE} or newer), and {why}; install or \
                 upgrade Kueue (this replica starts by itself once the API is served)",
                kind.resource_path()
            )));
        }
    }
    Ok(None)
}

/// Returns once the cluster serves the Kueue API this runtime needs. Meanwhile `/readyz` says
/// why it is not ready, the log says it at error level (once per distinct reason), and
/// discovery is asked again with a doubling delay capped at a minute.
pub(crate) async fn wait_until_served(client: &Client, health: &Health) {
    let mut delay = FIRST_RETRY;
    let mut last_said: Option<String> = None;
    loop {
        // A Kueue too old is the user's to fix (error); a discovery that failed, a passing outage.
        let (why, user_must_act) = match missing(client).await {
            Ok(None) => {
                if last_said.is_some() {
                    info!("the Kueue API is served now; starting");
                }
                health.set_waiting_for(None);
                return;
            }
            Ok(Some(why)) => (why, true),
            Err(e) => (format!("cannot read the API discovery yet: {e}"), false),
        };
        if last_said.as_deref() != Some(why.as_str()) {
            if user_must_act {
                error!(retry_in = ?delay, "{why}");
            } else {
                warn!(retry_in = ?delay, "{why}");
            }
            health.set_waiting_for(Some(why.clone()));
            last_said = Some(why);
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(MAX_RETRY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::check_registry::discovery_fixtures;
    use crate::testing::ScriptedApi;

    fn resources(names: &[&str]) -> serde_json::Value {
        discovery_fixtures::resource_list("kueue.x-k8s.io/v1beta2", names)
    }

    fn kueue_only_at(versions: &[&str]) -> serde_json::Value {
        discovery_fixtures::group_list(&[("kueue.x-k8s.io", versions)])
    }

    #[tokio::test]
    async fn a_kueue_serving_v1beta2_passes_with_two_discovery_requests() {
        let api = ScriptedApi::new();
        api.answer(
            200,
            resources(&["workloads", "workloads/status", "admissionchecks"]),
        );
        api.answer(
            200,
            resources(&["workloads", "workloads/status", "admissionchecks"]),
        );
        assert_eq!(missing(&api.client()).await.expect("discovery"), None);
        assert_eq!(
            api.calls(),
            [
                "GET /apis/kueue.x-k8s.io/v1beta2",
                "GET /apis/kueue.x-k8s.io/v1beta2"
            ]
        );
    }

    #[tokio::test]
    async fn a_kueue_older_than_v0_15_is_named_with_the_versions_it_serves() {
        let api = ScriptedApi::new();
        discovery_fixtures::version_not_served(&api);
        api.answer(200, kueue_only_at(&["v1beta1", "v1alpha1"]));
        let why = missing(&api.client())
            .await
            .expect("discovery")
            .expect("not served");
        assert!(
            why.contains("workloads.kueue.x-k8s.io/v1beta2")
                && why.contains("Kueue v0.15 or newer")
                && why.contains("only at v1beta1, v1alpha1"),
            "{why}"
        );
    }

    #[tokio::test]
    async fn no_kueue_at_all_is_named() {
        let api = ScriptedApi::new();
        discovery_fixtures::version_not_served(&api);
        api.answer(200, discovery_fixtures::group_list(&[]));
        let why = missing(&api.client())
            .await
            .expect("discovery")
            .expect("not served");
        assert!(
            why.contains("serves no version of the API group \"kueue.x-k8s.io\""),
            "{why}"
        );
    }

    #[tokio::test]
    async fn a_failing_discovery_is_an_error_not_a_verdict() {
        let api = ScriptedApi::new();
        api.fail(503, "ServiceUnavailable", "etcd is down");
        let err = missing(&api.client()).await.expect_err("failed");
        assert_eq!(err.label(), "api");
    }

    #[tokio::test(start_paused = true)]
    async fn the_wait_shows_the_reason_on_readyz_and_ends_once_the_api_is_served() {
        let api = ScriptedApi::new();
        discovery_fixtures::version_not_served(&api);
        api.answer(200, kueue_only_at(&["v1beta1"]));
        discovery_fixtures::version_not_served(&api);
        api.answer(200, kueue_only_at(&["v1beta1"]));
        api.answer(200, resources(&["workloads", "admissionchecks"]));
        api.answer(200, resources(&["workloads", "admissionchecks"]));
        let health = std::sync::Arc::new(Health::new(Default::default()));
        let waiting = {
            let (client, health) = (api.client(), health.clone());
            tokio::spawn(async move { wait_until_served(&client, &health).await })
        };
        // The first answer said "not served": the reason is on /readyz before the retry.
        tokio::time::sleep(FIRST_RETRY / 2).await;
        let said = health.waiting_for().expect("a reason while waiting");
        assert!(said.contains("Kueue v0.15 or newer"), "{said}");
        waiting.await.expect("the wait ends once served");
        assert_eq!(health.waiting_for(), None);
        assert_eq!(api.calls().len(), 6, "{:?}", api.calls());
    }
}

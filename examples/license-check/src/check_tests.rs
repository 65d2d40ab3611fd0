//! The check's decisions with its real ConfigMap backend against the SDK's [`MemoryApi`]: no
//! cluster, but the same read, decide, write-if-unchanged cycle, with conflicts when writers
//! interleave.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kueue_admission_sdk::api::{CheckState, Workload};
use kueue_admission_sdk::testing::{MemoryApi, WorkloadBuilder, decide_with_client};
use kueue_admission_sdk::{Decision, NoParameters, ReleaseReason, RetryDelay};
use ledger_common::testing::{decide_concurrently, release_once};

use super::*;
use crate::request::LICENSES_ANNOTATION;

const CHECK: &str = "licenses";
/// Namespace of the pool and the ledger ConfigMaps.
const NS: &str = "ns";
const POOL: &str = "pool";
const LEDGER: &str = "ledger";

fn settings() -> Settings {
    Settings {
        controller_name: "example.com/licenses".into(),
        retry_policy: backoff(Duration::from_secs(10), Duration::from_secs(300)),
        pool_recheck: Duration::from_secs(30),
        sweep_interval: Duration::from_secs(300),
    }
}

/// A check on its real backend, and the API server in memory that holds its ConfigMaps and the
/// Workloads (a Workload not stored there reads as deleted).
struct Fixture {
    check: LicenseCheck,
    api: MemoryApi,
}

impl Fixture {
    /// No pool ConfigMap yet.
    fn without_pool() -> Self {
        Self {
            check: Self::replica(),
            api: MemoryApi::new(),
        }
    }

    /// A pool of `items` (feature, count).
    fn with_pool(items: &[(&str, u32)]) -> Self {
        let fixture = Self::without_pool();
        fixture.set_pool(items);
        fixture
    }

    /// A check of its own (its own updater) on the same ConfigMaps: another replica.
    fn replica() -> LicenseCheck {
        let backend = ConfigMapBackend {
            namespace: NS.into(),
            pool: POOL.into(),
            ledger: LEDGER.into(),
        };
        LicenseCheck::new(settings(), backend)
    }

    /// The pool ConfigMap with `data` (feature, count), as people write it.
    fn set_pool(&self, data: &[(&str, impl ToString)]) {
        let data = data.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        self.api.put(&ConfigMap {
            metadata: ObjectMeta {
                name: Some(POOL.into()),
                namespace: Some(NS.into()),
                ..ObjectMeta::default()
            },
            data: Some(data.collect()),
            ..ConfigMap::default()
        });
    }

    async fn decide(&self, wl: &Workload) -> Decision {
        decide_with_client(&self.check, &self.api.client(), wl, CHECK, &NoParameters)
            .await
            .expect("decides")
    }

    /// A Workload asking for `licenses`, granted them.
    async fn granted(&self, name: &str, licenses: &str) -> Workload {
        let wl = asking(name, licenses);
        let decision = self.decide(&wl).await;
        assert!(
            matches!(decision, Decision::Ready { .. }),
            "{name}: {decision:?}"
        );
        wl
    }

    async fn release(&self, wl: &Workload, reason: ReleaseReason) {
        let client = self.api.client();
        release_once(
            &self.check,
            &client,
            wl,
            CHECK,
            reason,
            Timestamp::UNIX_EPOCH,
        )
        .await
        .expect("releases");
    }

    /// The ledger as stored; empty while there is no ledger ConfigMap.
    fn ledger(&self) -> Ledger {
        let stored = self.api.get::<ConfigMap>(Some(NS), LEDGER);
        let data = stored.and_then(|cm| cm.data).unwrap_or_default();
        Ledger::from_config_map_data(&data).expect("the ledger reads")
    }

    fn held(&self) -> BTreeMap<String, u32> {
        self.ledger().in_use()
    }

    fn holders(&self) -> Vec<String> {
        let ledger = self.ledger();
        ledger.holdings().values().map(|h| h.name.clone()).collect()
    }
}

/// A Workload holding quota with the check Pending, asking for `licenses` on its pod template.
fn asking(name: &str, licenses: &str) -> Workload {
    let mut wl = WorkloadBuilder::new("team-a", name)
        .pod_set("main", 1, "1")
        .check(CHECK, CheckState::Pending)
        .quota_reserved("cq", "default")
        .build();
    wl.spec.pod_sets[0]
        .template
        .metadata
        .get_or_insert_with(Default::default)
        .annotations = Some(BTreeMap::from([(
        LICENSES_ANNOTATION.to_string(),
        licenses.to_string(),
    )]));
    wl
}

#[tokio::test]
async fn a_workload_without_the_annotation_passes_without_touching_the_ledger() {
    let fx = Fixture::without_pool();
    let wl = WorkloadBuilder::new("team-a", "plain")
        .pod_set("main", 1, "1")
        .check(CHECK, CheckState::Pending)
        .quota_reserved("cq", "default")
        .build();
    assert_eq!(
        fx.decide(&wl).await,
        Decision::ready("no licenses requested")
    );
    assert_eq!(fx.api.writes(), 0);
}

#[tokio::test]
async fn bad_requests_are_rejected_with_what_is_wrong() {
    let fx = Fixture::with_pool(&[("matlab", 2)]);
    for (value, expected) in [
        (
            "matlab=-1",
            "matlab=-1: the count must be a whole number from 1",
        ),
        (
            "abaqus=1",
            "unknown license feature abaqus; the pool has: matlab",
        ),
        (
            "matlab=3",
            "asks for more licenses than exist: 3 matlab (the pool has 2)",
        ),
    ] {
        let Decision::Rejected { message } = fx.decide(&asking("wl", value)).await else {
            panic!("{value}: not rejected");
        };
        assert!(message.ends_with(expected), "{value}: {message}");
    }
    assert_eq!(fx.api.writes(), 0);
}

#[tokio::test]
async fn a_missing_or_broken_pool_keeps_the_workload_pending_and_says_why() {
    let fx = Fixture::without_pool();
    let wl = asking("wl", "matlab=1");
    assert_eq!(
        fx.decide(&wl).await,
        Decision::pending_recheck_after(
            "the license pool ConfigMap ns/pool does not exist",
            Duration::from_secs(30)
        )
    );
    fx.set_pool(&[("matlab", "many")]);
    assert_eq!(
        fx.decide(&wl).await,
        Decision::pending_recheck_after(
            "the license pool ConfigMap ns/pool is invalid: \
             matlab: \"many\" is not a number of licenses (a whole number from 0)",
            Duration::from_secs(30)
        )
    );
    assert_eq!(fx.api.writes(), 0);
}

#[tokio::test]
async fn grants_once_and_recognises_the_holder_when_asked_again() {
    let fx = Fixture::with_pool(&[("matlab", 2)]);
    let wl = asking("a", "matlab=2");
    let first = fx.decide(&wl).await;
    assert_eq!(
        first,
        Decision::ready("holds matlab=2 until the workload finishes or is evicted")
    );
    // A conflict or a restart makes the runtime ask again for the same attempt.
    assert_eq!(fx.decide(&wl).await, first);
    assert_eq!(fx.held(), BTreeMap::from([("matlab".into(), 2)]));
    assert_eq!(fx.api.writes(), 1, "the second answer wrote nothing");
}

#[tokio::test]
async fn a_shortage_retries_with_the_policy_and_names_the_holder() {
    let fx = Fixture::with_pool(&[("matlab", 2)]);
    let holder = fx.granted("a", "matlab=2").await;
    fx.api.put(&holder);
    assert_eq!(
        fx.decide(&asking("b", "matlab=1")).await,
        Decision::Retry {
            message: "waiting for licenses: matlab: needs 1, 0 of 2 free, held by team-a/a (2)"
                .into(),
            delay: RetryDelay::Policy,
        }
    );
    assert_eq!(fx.holders(), vec!["a"]);
}

#[tokio::test]
async fn a_shortage_first_reclaims_from_workloads_that_moved_on() {
    for (why, gone) in [
        (
            "finished",
            Some(
                WorkloadBuilder::new("team-a", "a")
                    .check(CHECK, CheckState::Ready)
                    .finished()
                    .build(),
            ),
        ),
        (
            "evicted",
            Some(
                WorkloadBuilder::new("team-a", "a")
                    .check(CHECK, CheckState::Pending)
                    .quota_reserved("cq", "f")
                    .evicted("Preempted")
                    .build(),
            ),
        ),
        ("deleted", None),
        // Kueue recreated the Workload of a still existing Job: same name, new uid.
        (
            "replaced",
            Some(asking("a", "matlab=2")).map(|mut wl| {
                wl.metadata.uid = Some("new".into());
                wl
            }),
        ),
    ] {
        let fx = Fixture::with_pool(&[("matlab", 2)]);
        fx.granted("a", "matlab=2").await;
        if let Some(wl) = &gone {
            fx.api.put(wl);
        }
        assert_eq!(
            fx.decide(&asking("b", "matlab=1")).await,
            Decision::ready("holds matlab=1 until the workload finishes or is evicted"),
            "{why}"
        );
        assert_eq!(fx.holders(), vec!["b"], "{why}");
    }
}

#[tokio::test]
async fn release_gives_back_exactly_what_was_held_and_is_idempotent() {
    let fx = Fixture::with_pool(&[("matlab", 3)]);
    fx.granted("a", "matlab=1").await;
    let b = fx.granted("b", "matlab=2").await;
    fx.release(&b, ReleaseReason::Finished).await;
    fx.release(&b, ReleaseReason::Deleted).await;
    assert_eq!(fx.held(), BTreeMap::from([("matlab".into(), 1)]));
    assert_eq!(fx.holders(), vec!["a"]);
}

#[tokio::test]
async fn sweep_drops_only_holdings_whose_workload_moved_on() {
    let fx = Fixture::with_pool(&[("matlab", 3)]);
    let live = fx.granted("live", "matlab=1").await;
    let finished = fx.granted("done", "matlab=1").await;
    fx.granted("deleted", "matlab=1").await;
    fx.api.put(&live);
    let mut done = finished.clone();
    done.status
        .get_or_insert_with(Default::default)
        .conditions
        .push(k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
            type_: "Finished".into(),
            status: "True".into(),
            reason: "Succeeded".into(),
            message: String::new(),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
            observed_generation: None,
        });
    fx.api.put(&done);
    let swept = fx
        .check
        .sweep(&fx.api.client(), None)
        .await
        .expect("sweeps");
    let mut reasons: Vec<(String, String)> = swept
        .into_iter()
        .map(|s| (s.holding.name, s.reason))
        .collect();
    reasons.sort();
    assert_eq!(
        reasons,
        vec![
            ("deleted".into(), "its Workload no longer exists".into()),
            (
                "done".into(),
                "its Workload no longer needs it (finished)".into()
            )
        ]
    );
    assert_eq!(fx.holders(), vec!["live"]);
}

/// Two controllers that share nothing but the API server (two replicas, no common lock) decide for
/// many Workloads at once: the version check alone keeps the grants within the pool, and every
/// Workload told `Ready` is in the ledger.
#[tokio::test]
async fn concurrent_deciders_without_a_common_lock_never_exceed_the_pool() {
    let fx = Fixture::with_pool(&[("matlab", 3)]);
    let replicas = [Fixture::replica(), Fixture::replica()];
    let workloads: Vec<Workload> = (0..10)
        .map(|i| asking(&format!("wl-{i}"), "matlab=1"))
        .collect();
    let (decisions, ready) =
        decide_concurrently(&replicas, &fx.api, &workloads, CHECK, &NoParameters)
            .await
            .expect("decides");
    let mut holders = fx.holders();
    holders.sort();
    assert_eq!(ready.len(), 3, "{decisions:?}");
    assert_eq!(ready, holders);
    assert!(fx.api.conflicts() > 0, "the deciders did interleave");
}

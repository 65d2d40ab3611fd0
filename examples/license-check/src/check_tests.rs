//! The check's decisions against an in-memory backend: no cluster, but the same read, decide,
//! write-if-unchanged cycle as against ConfigMaps, with conflicts when writers interleave.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kueue_admission_sdk::api::{CheckState, Workload};
use kueue_admission_sdk::configmap_store::MemoryStore;
use kueue_admission_sdk::testing::{WorkloadBuilder, decide_once, offline_client};
use kueue_admission_sdk::{Decision, NoParameters, ReleaseReason, RetryDelay};
use ledger_common::testing::{MemoryWorkloads, decide_concurrently, release_once};

use super::*;
use crate::backend::{Saved, Versioned};
use crate::pool::Pool;
use crate::request::LICENSES_ANNOTATION;

const CHECK: &str = "licenses";

/// The pool and the Workloads in memory, and the ledger in the SDK's [`MemoryStore`]: a version
/// that every save must match, like `resourceVersion`, and reads that yield to other tasks so
/// that concurrent deciders interleave between read and write.
#[derive(Clone, Debug, Default)]
struct FakeBackend {
    /// `None`: the pool ConfigMap does not exist.
    pool: Option<Pool>,
    workloads: MemoryWorkloads,
    ledger: Arc<MemoryStore<Ledger>>,
}

/// The ledger's key in the [`MemoryStore`].
const LEDGER: &str = "ledger";

impl FakeBackend {
    fn with_pool(items: &[(&str, u32)]) -> Self {
        let total = items.iter().map(|(f, n)| (f.to_string(), *n)).collect();
        Self {
            pool: Some(Pool { total }),
            ..Self::default()
        }
    }

    fn held(&self) -> BTreeMap<String, u32> {
        self.ledger.value(LEDGER).in_use()
    }

    fn holders(&self) -> Vec<String> {
        let ledger = self.ledger.value(LEDGER);
        ledger.holdings().values().map(|h| h.name.clone()).collect()
    }
}

impl Backend for FakeBackend {
    async fn pool(&self, _: &Client) -> Result<Result<Pool, String>, Error> {
        let missing = || "the license pool ConfigMap ns/pool does not exist".to_string();
        Ok(self.pool.clone().ok_or_else(missing))
    }

    async fn load(&self, _: &Client) -> Result<Versioned<Ledger>, Error> {
        Ok(self.ledger.load(LEDGER).await)
    }

    async fn save(
        &self,
        _: &Client,
        ledger: &Ledger,
        version: Option<&str>,
    ) -> Result<Saved, Error> {
        Ok(self.ledger.save(LEDGER, ledger, version))
    }

    async fn workload(
        &self,
        _: &Client,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Workload>, Error> {
        Ok(self.workloads.get(namespace, name))
    }

    fn ledger_name(&self) -> String {
        "ns/ledger".into()
    }
}

fn settings() -> Settings {
    Settings {
        controller_name: "example.com/licenses".into(),
        retry_policy: backoff(Duration::from_secs(10), Duration::from_secs(300)),
        pool_recheck: Duration::from_secs(30),
        sweep_interval: Duration::from_secs(300),
    }
}

/// A check on a pool of `items` (feature, count), and its fake backend.
fn check_with_pool(items: &[(&str, u32)]) -> (LicenseCheck<FakeBackend>, FakeBackend) {
    let fake = FakeBackend::with_pool(items);
    (LicenseCheck::new(settings(), fake.clone()), fake)
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

async fn decide(check: &LicenseCheck<FakeBackend>, wl: &Workload) -> Decision {
    decide_once(check, wl, CHECK, &NoParameters)
        .await
        .expect("decides")
}

/// A Workload asking for `licenses`, granted them by `check`.
async fn granted(check: &LicenseCheck<FakeBackend>, name: &str, licenses: &str) -> Workload {
    let wl = asking(name, licenses);
    let decision = decide(check, &wl).await;
    assert!(
        matches!(decision, Decision::Ready { .. }),
        "{name}: {decision:?}"
    );
    wl
}

async fn release(check: &LicenseCheck<FakeBackend>, wl: &Workload, reason: ReleaseReason) {
    release_once(check, wl, CHECK, reason, Timestamp::UNIX_EPOCH)
        .await
        .expect("releases");
}

#[tokio::test]
async fn a_workload_without_the_annotation_passes_without_touching_the_ledger() {
    let fake = FakeBackend::default();
    let check = LicenseCheck::new(settings(), fake.clone());
    let wl = WorkloadBuilder::new("team-a", "plain")
        .pod_set("main", 1, "1")
        .check(CHECK, CheckState::Pending)
        .quota_reserved("cq", "default")
        .build();
    assert_eq!(
        decide(&check, &wl).await,
        Decision::ready("no licenses requested")
    );
    assert_eq!(fake.ledger.saves(), 0);
}

#[tokio::test]
async fn bad_requests_are_rejected_with_what_is_wrong() {
    let (check, fake) = check_with_pool(&[("matlab", 2)]);
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
        let Decision::Rejected { message } = decide(&check, &asking("wl", value)).await else {
            panic!("{value}: not rejected");
        };
        assert!(message.ends_with(expected), "{value}: {message}");
    }
    assert_eq!(fake.ledger.saves(), 0);
}

#[tokio::test]
async fn a_missing_or_broken_pool_keeps_the_workload_pending_and_says_why() {
    let fake = FakeBackend::default();
    let check = LicenseCheck::new(settings(), fake.clone());
    assert_eq!(
        decide(&check, &asking("wl", "matlab=1")).await,
        Decision::pending_recheck_after(
            "the license pool ConfigMap ns/pool does not exist",
            Duration::from_secs(30)
        )
    );
}

#[tokio::test]
async fn grants_once_and_recognises_the_holder_when_asked_again() {
    let (check, fake) = check_with_pool(&[("matlab", 2)]);
    let wl = asking("a", "matlab=2");
    let first = decide(&check, &wl).await;
    assert_eq!(
        first,
        Decision::ready("holds matlab=2 until the workload finishes or is evicted")
    );
    // A conflict or a restart makes the runtime ask again for the same attempt.
    assert_eq!(decide(&check, &wl).await, first);
    assert_eq!(fake.held(), BTreeMap::from([("matlab".into(), 2)]));
    assert_eq!(fake.ledger.saves(), 1, "the second answer wrote nothing");
}

#[tokio::test]
async fn a_shortage_retries_with_the_policy_and_names_the_holder() {
    let (check, fake) = check_with_pool(&[("matlab", 2)]);
    let holder = granted(&check, "a", "matlab=2").await;
    fake.workloads.put(&holder);
    assert_eq!(
        decide(&check, &asking("b", "matlab=1")).await,
        Decision::Retry {
            message: "waiting for licenses: matlab: needs 1, 0 of 2 free, held by team-a/a (2)"
                .into(),
            delay: RetryDelay::Policy,
        }
    );
    assert_eq!(fake.holders(), vec!["a"]);
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
        let (check, fake) = check_with_pool(&[("matlab", 2)]);
        granted(&check, "a", "matlab=2").await;
        if let Some(wl) = &gone {
            fake.workloads.put(wl);
        }
        assert_eq!(
            decide(&check, &asking("b", "matlab=1")).await,
            Decision::ready("holds matlab=1 until the workload finishes or is evicted"),
            "{why}"
        );
        assert_eq!(fake.holders(), vec!["b"], "{why}");
    }
}

#[tokio::test]
async fn release_gives_back_exactly_what_was_held_and_is_idempotent() {
    let (check, fake) = check_with_pool(&[("matlab", 3)]);
    granted(&check, "a", "matlab=1").await;
    let b = granted(&check, "b", "matlab=2").await;
    release(&check, &b, ReleaseReason::Finished).await;
    release(&check, &b, ReleaseReason::Deleted).await;
    assert_eq!(fake.held(), BTreeMap::from([("matlab".into(), 1)]));
    assert_eq!(fake.holders(), vec!["a"]);
}

#[tokio::test]
async fn sweep_drops_only_holdings_whose_workload_moved_on() {
    let (check, fake) = check_with_pool(&[("matlab", 3)]);
    let live = granted(&check, "live", "matlab=1").await;
    let finished = granted(&check, "done", "matlab=1").await;
    granted(&check, "deleted", "matlab=1").await;
    fake.workloads.put(&live);
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
    fake.workloads.put(&done);
    let swept = check.sweep(&offline_client(), None).await.expect("sweeps");
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
    assert_eq!(fake.holders(), vec!["live"]);
}

/// Two controllers that share nothing but the ledger (two replicas, no common lock) decide for
/// many Workloads at once: the version check alone keeps the grants within the pool, and every
/// Workload told `Ready` is in the ledger.
#[tokio::test]
async fn concurrent_deciders_without_a_common_lock_never_exceed_the_pool() {
    let fake = FakeBackend::with_pool(&[("matlab", 3)]);
    let replicas = [
        LicenseCheck::new(settings(), fake.clone()),
        LicenseCheck::new(settings(), fake.clone()),
    ];
    let workloads: Vec<Workload> = (0..10)
        .map(|i| asking(&format!("wl-{i}"), "matlab=1"))
        .collect();
    for wl in &workloads {
        fake.workloads.put(wl);
    }
    let (decisions, ready) = decide_concurrently(&replicas, &workloads, CHECK, &NoParameters)
        .await
        .expect("decides");
    let mut holders = fake.holders();
    holders.sort();
    assert_eq!(ready.len(), 3, "{decisions:?}");
    assert_eq!(ready, holders);
    assert!(fake.ledger.conflicts() > 0, "the deciders did interleave");
}

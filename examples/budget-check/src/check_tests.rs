//! The check's decisions against an API server in memory (the SDK's [`MemoryApi`]): no
//! cluster, but the real backend's read, decide, write-if-unchanged cycle on ConfigMaps, with
//! conflicts when writers interleave.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::ObjectMeta;
use kueue_admission_sdk::api::{CheckState, EvictionCount, SchedulingStats, Workload};
use kueue_admission_sdk::testing::{MemoryApi, WorkloadBuilder, decide_with_client};
use kueue_admission_sdk::{Decision, NoParameters, ReleaseReason, RetryDelay};
use ledger_common::testing::{decide_concurrently, release_once};

use super::*;
use crate::money::Credits;
use crate::window::Period;

const CHECK: &str = "budget";
const NS: &str = "team-a";
/// Where the check keeps budgets and ledgers in these tests.
const STATE_NAMESPACE: &str = "ops";

/// The check's ConfigMaps: budgets `ops/budgets`, ledgers `ops/ledger-<namespace>`.
fn backend() -> ConfigMapBackend {
    ConfigMapBackend {
        namespace: STATE_NAMESPACE.into(),
        budgets: "budgets".into(),
        ledger_prefix: "ledger-".into(),
    }
}

/// The API server in memory that holds the budgets, the ledgers and the Workloads (a Workload
/// not stored reads as deleted).
#[derive(Clone, Debug, Default)]
struct Cluster {
    api: MemoryApi,
}

impl Cluster {
    fn with_budget(budget: &str) -> Self {
        let cluster = Self::default();
        cluster.set_budget(NS, budget);
        cluster
    }

    /// Writes a namespace's budget into the budgets ConfigMap, as a person would.
    fn set_budget(&self, namespace: &str, budget: &str) {
        let mut budgets = self
            .api
            .get::<ConfigMap>(Some(STATE_NAMESPACE), "budgets")
            .unwrap_or_else(|| ConfigMap {
                metadata: ObjectMeta {
                    name: Some("budgets".into()),
                    namespace: Some(STATE_NAMESPACE.into()),
                    ..ObjectMeta::default()
                },
                ..ConfigMap::default()
            });
        let data = budgets.data.get_or_insert_default();
        data.insert(namespace.into(), budget.into());
        self.api.put(&budgets);
    }

    /// The namespace's ledger as stored.
    fn ledger(&self) -> BudgetLedger {
        let name = backend().ledger_of(NS).name;
        let stored = self.api.get::<ConfigMap>(Some(STATE_NAMESPACE), &name);
        let data = stored.and_then(|cm| cm.data).unwrap_or_default();
        BudgetLedger::from_config_map_data(&data).expect("the ledger reads back")
    }

    /// The Workloads with an open charge in the namespace's ledger, by name.
    fn charged(&self) -> Vec<String> {
        self.ledger().charged_workloads()
    }
}

/// The check as the runtime runs it: with a client of the cluster it keeps its state in.
struct Check {
    controller: BudgetCheck,
    client: Client,
}

impl Check {
    fn new(settings: Settings, cluster: &Cluster) -> Self {
        Self {
            controller: BudgetCheck::new(settings, backend()),
            client: cluster.api.client(),
        }
    }
}

fn settings() -> Settings {
    Settings {
        controller_name: "example.com/budget".into(),
        prices: "cpu=1".parse().expect("prices"),
        default_runtime: Duration::from_secs(3600),
        budget_recheck: Duration::from_secs(30),
        max_wait: None,
        sweep_interval: Duration::from_secs(300),
    }
}

/// A check on a namespace with this budget, and the cluster it keeps its state in.
fn check_with_budget(budget: &str) -> (Check, Cluster) {
    let fake = Cluster::with_budget(budget);
    (Check::new(settings(), &fake), fake)
}

fn at(s: &str) -> Timestamp {
    s.parse().expect("timestamp")
}

/// 10:00 UTC on a Thursday: the day has 14 hours left.
const NOW: &str = "2026-11-26T10:00:00Z";

/// A Workload of one pod requesting `cpu` cores, holding quota with the check Pending, as seen
/// at `now` (decide_once decides at the time of its newest condition).
fn asking_at(name: &str, cpu: &str, now: &str) -> Workload {
    WorkloadBuilder::new(NS, name)
        .at(at(now))
        .pod_set("main", 1, cpu)
        .check(CHECK, CheckState::Pending)
        .quota_reserved("cq", "default")
        .build()
}

fn asking(name: &str, cpu: &str) -> Workload {
    asking_at(name, cpu, NOW)
}

async fn decide(check: &Check, wl: &Workload) -> Decision {
    decide_with_client(&check.controller, &check.client, wl, CHECK, &NoParameters)
        .await
        .expect("decides")
}

async fn release(check: &Check, wl: &Workload, reason: ReleaseReason, now: &str) {
    release_once(&check.controller, &check.client, wl, CHECK, reason, at(now))
        .await
        .expect("releases");
}

fn spent_today(fake: &Cluster) -> Credits {
    fake.ledger()
        .spent(&Window::containing(Period::Day, at(NOW)))
}

fn credits(s: &str) -> Credits {
    s.parse().expect("credits")
}

#[tokio::test]
async fn a_fitting_workload_is_charged_once_however_often_it_is_asked() {
    let (check, fake) = check_with_budget("10/day");
    let wl = asking("a", "4");
    let first = decide(&check, &wl).await;
    assert_eq!(
        first,
        Decision::ready(
            "charged 4 credits (4 cpu for 1h); namespace team-a has spent 4 of 10 credits this day, until 2026-11-27T00:00:00Z"
        )
    );
    assert_eq!(decide(&check, &wl).await, first);
    assert_eq!(spent_today(&fake), credits("4"));
    assert_eq!(fake.api.writes(), 1);
}

#[tokio::test]
async fn over_budget_waits_exactly_until_the_window_resets() {
    let (check, fake) = check_with_budget("10/day");
    let a = asking("a", "8");
    fake.api.put(&a);
    decide(&check, &a).await;
    let Decision::Retry { message, delay } = decide(&check, &asking("b", "4")).await else {
        panic!("not a retry");
    };
    assert_eq!(delay, RetryDelay::After(Duration::from_secs(14 * 3600)));
    assert_eq!(
        message,
        "the estimated cost of 4 credits (4 cpu for 1h) would take namespace team-a over its budget: 8 of 10 credits spent this day; the budget starts again at 2026-11-27T00:00:00Z"
    );
    assert_eq!(
        spent_today(&fake),
        credits("8"),
        "a refusal charges nothing"
    );

    let mut capped = settings();
    capped.max_wait = Some(Duration::from_secs(600));
    let check = Check::new(capped, &fake);
    let Decision::Retry { delay, .. } = decide(&check, &asking("b", "4")).await else {
        panic!("not a retry");
    };
    assert_eq!(delay, RetryDelay::After(Duration::from_secs(600)));
}

#[tokio::test]
async fn what_can_never_fit_is_rejected_and_what_cannot_be_priced_too() {
    let (check, fake) = check_with_budget("10/week");
    assert_eq!(
        decide(&check, &asking("big", "11")).await,
        Decision::rejected(
            "the estimated cost of 11 credits (11 cpu for 1h) is more than the whole budget of namespace team-a: 10 credits per week"
        )
    );
    let Decision::Rejected { message } = decide(&check, &asking("odd", "two")).await else {
        panic!("not rejected");
    };
    assert!(
        message.starts_with(
            "cannot estimate the cost: podset \"main\": container \"main\" request cpu"
        ),
        "{message}"
    );
    assert_eq!(fake.api.writes(), 0);
}

#[tokio::test]
async fn a_missing_budget_keeps_the_workload_pending_and_free_workloads_pass() {
    let fake = Cluster::default();
    let check = Check::new(settings(), &fake);
    let recheck = Duration::from_secs(30);
    assert_eq!(
        decide(&check, &asking("a", "1")).await,
        Decision::pending_recheck_after(
            "the budgets ConfigMap ops/budgets does not exist",
            recheck
        )
    );
    fake.set_budget("team-b", "10/day");
    assert_eq!(
        decide(&check, &asking("a", "1")).await,
        Decision::pending_recheck_after(
            "namespace team-a has no budget: the budgets ConfigMap ops/budgets has no key \"team-a\"",
            recheck
        )
    );
    fake.set_budget(NS, "ten/day");
    let Decision::Pending { message, .. } = decide(&check, &asking("a", "1")).await else {
        panic!("not pending");
    };
    assert!(
        message.starts_with(
            "the budget of namespace team-a in the budgets ConfigMap ops/budgets is invalid: "
        ),
        "{message}"
    );
    assert_eq!(fake.api.writes(), 0, "nothing charged without a budget");
    let mut gpu_only = settings();
    gpu_only.prices = "nvidia.com/gpu=10".parse().expect("prices");
    let check = Check::new(gpu_only, &Cluster::default());
    assert_eq!(
        decide(&check, &asking("a", "1")).await,
        Decision::ready("costs nothing: requests none of the priced resources (nvidia.com/gpu=10)")
    );
}

#[tokio::test]
async fn finishing_early_gives_back_the_unused_part() {
    let (check, fake) = check_with_budget("10/day");
    let a = asking("a", "8");
    decide(&check, &a).await;
    // It ran 15 of its 60 minutes: 2 credits used, 6 given back.
    let done = WorkloadBuilder::new(NS, "a")
        .at(at("2026-11-26T10:15:00Z"))
        .check(CHECK, CheckState::Ready)
        .finished()
        .build();
    // Released twice (a retried release): settled once.
    for _ in 0..2 {
        release(
            &check,
            &done,
            ReleaseReason::Finished,
            "2026-11-26T10:20:00Z",
        )
        .await;
    }
    assert_eq!(spent_today(&fake), credits("2"));
    assert!(fake.ledger().open_charges().is_empty());
    assert!(matches!(
        decide(&check, &asking("b", "8")).await,
        Decision::Ready { .. }
    ));
}

#[tokio::test]
async fn an_eviction_nobody_reported_is_settled_before_charging_the_new_admission() {
    let (check, fake) = check_with_budget("10/day");
    decide(&check, &asking("a", "4")).await;
    // Evicted and admitted again half an hour later; the release never came (a restart).
    let mut again = asking_at("a", "4", "2026-11-26T10:30:00Z");
    again
        .status
        .get_or_insert_with(Default::default)
        .scheduling_stats = Some(SchedulingStats {
        evictions: vec![EvictionCount {
            reason: "Preempted".into(),
            underlying_cause: String::new(),
            count: 1,
        }],
    });
    assert!(matches!(
        decide(&check, &again).await,
        Decision::Ready { .. }
    ));
    assert!(matches!(
        decide(&check, &again).await,
        Decision::Ready { .. }
    ));
    // 2 used by the first admission (30 of 60 minutes), 4 charged for the second.
    assert_eq!(spent_today(&fake), credits("6"));
    assert_eq!(fake.ledger().open_charges().len(), 1);
}

#[tokio::test]
async fn before_making_a_workload_wait_it_settles_what_ended_unnoticed() {
    for (why, gone) in [
        (
            "finished",
            Some(
                WorkloadBuilder::new(NS, "a")
                    .at(at("2026-11-26T10:30:00Z"))
                    .check(CHECK, CheckState::Ready)
                    .finished()
                    .build(),
            ),
        ),
        ("deleted", None),
        (
            "replaced",
            Some(asking("a", "8")).map(|mut wl| {
                wl.metadata.uid = Some("new".into());
                wl
            }),
        ),
    ] {
        let (check, fake) = check_with_budget("10/day");
        decide(&check, &asking("a", "8")).await;
        if let Some(wl) = &gone {
            fake.api.put(wl);
        }
        assert!(
            matches!(
                decide(&check, &asking("b", "4")).await,
                Decision::Ready { .. }
            ),
            "{why}"
        );
        assert_eq!(fake.charged(), vec!["b"], "{why}");
    }
}

#[tokio::test]
async fn sweep_settles_every_namespace_and_keeps_what_still_runs() {
    let fake = Cluster::with_budget("100/day");
    fake.set_budget("team-b", "100/day");
    let check = Check::new(settings(), &fake);
    let live = asking("live", "1");
    fake.api.put(&live);
    decide(&check, &live).await;
    decide(&check, &asking("gone", "1")).await;
    let other = WorkloadBuilder::new("team-b", "gone-too")
        .at(at(NOW))
        .pod_set("main", 1, "1")
        .check(CHECK, CheckState::Pending)
        .quota_reserved("cq", "f")
        .build();
    decide(&check, &other).await;
    let swept = check
        .controller
        .sweep(&check.client, None)
        .await
        .expect("sweeps");
    let mut names: Vec<(String, String)> = swept
        .iter()
        .map(|s| (s.namespace.clone(), s.settlement.charge.name.clone()))
        .collect();
    names.sort();
    assert_eq!(
        names,
        vec![
            ("team-a".into(), "gone".into()),
            ("team-b".into(), "gone-too".into())
        ]
    );
    assert_eq!(fake.charged(), vec!["live"]);
    assert_eq!(
        check
            .controller
            .sweep(&check.client, None)
            .await
            .expect("sweeps"),
        vec![],
        "nothing left to settle"
    );
}

/// Two controllers sharing nothing but the ledgers decide for many Workloads at once: the
/// version check alone keeps the namespace within its budget, and every Workload told `Ready`
/// has its charge.
#[tokio::test]
async fn concurrent_deciders_without_a_common_lock_never_overspend() {
    let fake = Cluster::with_budget("10/day");
    let replicas = [
        BudgetCheck::new(settings(), backend()),
        BudgetCheck::new(settings(), backend()),
    ];
    let workloads: Vec<Workload> = (0..8).map(|i| asking(&format!("wl-{i}"), "3")).collect();
    let (decisions, ready) =
        decide_concurrently(&replicas, &fake.api, &workloads, CHECK, &NoParameters)
            .await
            .expect("decides");
    assert_eq!(ready.len(), 3, "{decisions:?}");
    assert_eq!(ready, fake.charged());
    assert_eq!(spent_today(&fake), credits("9"));
    assert!(fake.api.conflicts() > 0, "the deciders did interleave");
}

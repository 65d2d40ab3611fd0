//! Work started before Kueue adds a check's entry, in whole reconciles against a scripted API
//! server: which orderings of reservation, entry, queue change, eviction and time start it,
//! carry it into the decision, or release it.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::runtime::reflector;
use kube::runtime::watcher::Event;

use super::{Context, reconcile};
use crate::api::{CheckState, ClusterQueue, Workload};
use crate::check::{
    AdmissionCheckController, CheckContext, Decision, ErrorClass, NoParameters, ReleaseContext,
    ReleaseReason,
};
use crate::runtime::check_registry::ActiveCheck;
use crate::runtime::own_writes::OwnWrites;
use crate::runtime::{config::RuntimeConfig, metrics::Metrics};
use crate::testing::{ScriptedApi, WorkloadBuilder};

const CHECK: &str = "capacity";
const WAIT: Duration = Duration::from_secs(60);

/// A check that starts early and answers `Ready` once its entry comes; counts each call.
#[derive(Default)]
struct Early {
    started: AtomicU32,
    /// The attempt each start was for.
    started_for: Mutex<Vec<u32>>,
    asked: AtomicU32,
    released: Mutex<Vec<ReleaseReason>>,
    /// How many of the next starts fail transiently.
    failing_starts: AtomicU32,
    /// How many of the next starts fail for good (an invalid request).
    refusing_starts: AtomicU32,
    /// Every call of `start_early`, failed or not.
    start_calls: AtomicU32,
}

impl AdmissionCheckController for Early {
    type Parameters = NoParameters;
    type Error = std::io::Error;

    fn controller_name(&self) -> &str {
        "example.com/capacity"
    }

    fn starts_early(&self) -> bool {
        true
    }

    async fn start_early(&self, ctx: &CheckContext<'_, NoParameters>) -> std::io::Result<()> {
        assert_eq!(ctx.entry.name, CHECK);
        assert_eq!(ctx.entry.state, CheckState::Pending);
        self.start_calls.fetch_add(1, Ordering::SeqCst);
        let refusing = self.refusing_starts.load(Ordering::SeqCst);
        if refusing > 0 {
            self.refusing_starts.store(refusing - 1, Ordering::SeqCst);
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the API server refused the request as invalid",
            ));
        }
        let failing = self.failing_starts.load(Ordering::SeqCst);
        if failing > 0 {
            self.failing_starts.store(failing - 1, Ordering::SeqCst);
            return Err(std::io::Error::other("the capacity API timed out"));
        }
        self.started.fetch_add(1, Ordering::SeqCst);
        self.started_for
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(ctx.attempt());
        Ok(())
    }

    fn classify_error(&self, error: &std::io::Error) -> ErrorClass {
        match error.kind() {
            std::io::ErrorKind::InvalidInput => ErrorClass::Permanent {
                message: error.to_string(),
            },
            _ => ErrorClass::Transient,
        }
    }

    async fn decide(&self, _: &CheckContext<'_, NoParameters>) -> std::io::Result<Decision> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        Ok(Decision::ready("capacity is there"))
    }

    async fn release(&self, ctx: &ReleaseContext<'_>) -> std::io::Result<()> {
        self.released
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(ctx.reason);
        Ok(())
    }
}

impl Early {
    fn started(&self) -> u32 {
        self.started.load(Ordering::SeqCst)
    }

    fn asked(&self) -> u32 {
        self.asked.load(Ordering::SeqCst)
    }

    fn released(&self) -> Vec<ReleaseReason> {
        self.released
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// A runtime context for [`Early`], its Workload and ClusterQueue caches (with their writers)
/// and its scripted API.
struct World {
    ctx: Arc<Context<Early>>,
    api: ScriptedApi,
    workloads: reflector::store::Writer<Workload>,
    queues: reflector::store::Writer<ClusterQueue>,
}

impl World {
    /// The ClusterQueue `cq` applies the check on `on_flavors` (all when empty).
    fn new(on_flavors: &[&str]) -> Self {
        let api = ScriptedApi::new();
        let (cache, workloads) = reflector::store::<Workload>();
        let (queue_cache, queues) = reflector::store::<ClusterQueue>();
        let names: Arc<dyn Fn() -> Vec<String> + Send + Sync> =
            Arc::new(|| vec![CHECK.to_string()]);
        let metrics = Arc::new(Metrics::new(
            &mut prometheus_client::registry::Registry::default(),
            cache.clone(),
            names,
        ));
        metrics.check_active(CHECK, true);
        let config = RuntimeConfig {
            field_manager: "test".into(),
            early_start_wait: WAIT,
            ..Default::default()
        };
        let ctx = Context::new(
            api.client(),
            Arc::new(Early::default()),
            Arc::default(),
            &config,
            metrics,
            Arc::new(OwnWrites::default()),
        );
        let active = ActiveCheck {
            parameters: NoParameters,
            policy: crate::RetryPolicy::default(),
            message: String::new(),
        };
        ctx.registry
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(CHECK.to_string(), Ok(Arc::new(active)));
        let ctx = ctx
            .with_cache(cache)
            .with_cluster_queues(crate::ClusterQueues::cached(queue_cache));
        let mut world = Self {
            ctx: Arc::new(ctx),
            api,
            workloads,
            queues,
        };
        world.queue(&[(CHECK, on_flavors)]);
        world
    }

    /// `cq` now has these rules.
    fn queue(&mut self, rules: &[(&str, &[&str])]) {
        let queue = crate::testing::cluster_queue("cq", &["on-demand", "spot", "gpu"], rules);
        self.queues.apply_watcher_event(&Event::Apply(queue));
    }

    /// The watch delivers `wl` and it is reconciled.
    async fn sees(&mut self, wl: Workload) -> Result<(), crate::error::Error> {
        self.workloads
            .apply_watcher_event(&Event::Apply(wl.clone()));
        reconcile(Arc::new(wl), self.ctx.clone()).await.map(|_| ())
    }

    fn check(&self) -> &Early {
        &self.ctx.controller
    }
}

/// The Workload at `rv`; conditions it is given date from now.
fn wl(rv: &str) -> WorkloadBuilder {
    wl_at(rv, Timestamp::now())
}

/// The Workload at `rv`; conditions it is given date from `at`.
fn wl_at(rv: &str, at: Timestamp) -> WorkloadBuilder {
    WorkloadBuilder::new("ns", "wl")
        .at(at)
        .resource_version(rv)
        .pod_set("main", 1, "1")
}

/// Quota reserved in `cq` `ago` ago, no entry yet.
fn reserved_ago(rv: &str, ago: Duration) -> Workload {
    let at = Timestamp::now() - SignedDuration::try_from(ago).expect("a short duration");
    wl_at(rv, at).quota_reserved("cq", "on-demand").build()
}

/// Quota reserved in `cq` on `flavor`, no entry yet.
fn reserved(rv: &str, flavor: &str) -> Workload {
    wl(rv).quota_reserved("cq", flavor).build()
}

/// The entry came (Pending).
fn with_entry(rv: &str) -> Workload {
    wl(rv)
        .check(CHECK, CheckState::Pending)
        .quota_reserved("cq", "on-demand")
        .build()
}

#[tokio::test]
async fn work_starts_once_at_the_reservation_and_the_entry_gets_the_answer_at_once() {
    let mut w = World::new(&[]);
    w.sees(reserved("10", "on-demand")).await.expect("started");
    assert_eq!(w.check().started(), 1);
    assert_eq!(
        w.check().asked(),
        0,
        "nothing to decide on before the entry"
    );
    assert!(
        w.api.requests().is_empty(),
        "nothing written without an entry"
    );
    // Kueue's bookkeeping changes the Workload again: not started a second time.
    w.sees(reserved("11", "on-demand")).await.expect("no-op");
    assert_eq!(w.check().started(), 1);

    // The entry comes: the check is asked and its answer written in the same reconcile.
    w.api
        .answer(200, serde_json::to_value(with_entry("13")).expect("json"));
    w.sees(with_entry("12")).await.expect("decided");
    assert_eq!(w.check().asked(), 1);
    let calls = w.api.calls();
    assert!(
        calls.len() == 1 && calls[0].starts_with("PATCH ") && calls[0].ends_with("/wl/status"),
        "{calls:?}"
    );
    assert!(
        w.check().released().is_empty(),
        "{:?}",
        w.check().released()
    );
    assert_eq!(
        *w.check().started_for.lock().expect("lock"),
        [1],
        "started for the attempt the entry has"
    );
}

#[tokio::test]
async fn a_workload_that_loses_its_quota_before_the_entry_releases_what_was_started() {
    let mut w = World::new(&[]);
    w.sees(reserved("10", "on-demand")).await.expect("started");
    assert_eq!(w.check().started(), 1);
    w.sees(wl("11").build()).await.expect("released");
    assert_eq!(w.check().released(), [ReleaseReason::QuotaReleased]);
    // Nothing is released twice.
    w.sees(wl("12").build()).await.expect("no-op");
    assert_eq!(w.check().released().len(), 1);
}

#[tokio::test]
async fn a_check_removed_from_the_queue_before_the_entry_releases_what_was_started() {
    let mut w = World::new(&[]);
    w.sees(reserved("10", "on-demand")).await.expect("started");
    w.queue(&[("another-check", &[])]);
    // The queue watch wakes the Workload (unchanged).
    reconcile(Arc::new(reserved("10", "on-demand")), w.ctx.clone())
        .await
        .expect("released");
    assert_eq!(w.check().released(), [ReleaseReason::CheckRemoved]);
    assert_eq!(w.check().started(), 1);
}

#[tokio::test]
async fn on_flavors_that_exclude_the_flavor_assigned_start_nothing() {
    let mut w = World::new(&["gpu"]);
    w.sees(reserved("10", "on-demand")).await.expect("no-op");
    assert_eq!(w.check().started(), 0);
    w.sees(reserved("11", "gpu")).await.expect("started");
    assert_eq!(w.check().started(), 1, "the rule's own flavor starts it");
}

#[tokio::test]
async fn a_workload_admitted_before_the_check_applied_starts_nothing() {
    let mut w = World::new(&[]);
    let admitted = wl("10")
        .quota_reserved("cq", "on-demand")
        .admitted()
        .build();
    w.sees(admitted).await.expect("no-op");
    assert_eq!(w.check().started(), 0);
}

#[tokio::test]
async fn evicted_and_reserved_again_before_the_entry_releases_then_starts_anew() {
    let mut w = World::new(&[]);
    w.sees(reserved("10", "on-demand")).await.expect("started");
    // Preempted and given quota again between two reconciles: another eviction counted.
    let again = wl("14")
        .quota_reserved("cq", "on-demand")
        .eviction_count("Preempted", 1)
        .build();
    w.sees(again).await.expect("released and started");
    assert_eq!(w.check().released(), [ReleaseReason::Evicted]);
    assert_eq!(w.check().started(), 2);
}

#[tokio::test]
async fn an_entry_that_never_comes_releases_after_the_wait_once_and_the_entry_starts_over() {
    let mut w = World::new(&[]);
    w.sees(reserved("10", "on-demand")).await.expect("started");
    // The wait counts from the reservation (the QuotaReserved condition), not from the start.
    w.sees(reserved_ago("11", WAIT - Duration::from_secs(5)))
        .await
        .expect("waiting");
    assert!(w.check().released().is_empty(), "released before the wait");

    w.sees(reserved_ago("12", WAIT + Duration::from_secs(1)))
        .await
        .expect("released");
    assert_eq!(w.check().released(), [ReleaseReason::EntryNotAdded]);
    assert!(
        w.api
            .event_reasons()
            .contains(&"EarlyStartAbandoned".to_string()),
        "{:?}",
        w.api.event_reasons()
    );
    // Not started again in this attempt, nor released twice.
    w.sees(reserved_ago("13", WAIT + Duration::from_secs(2)))
        .await
        .expect("no-op");
    assert_eq!(w.check().started(), 1);
    assert_eq!(w.check().released().len(), 1);

    // The entry comes after all: the check decides as for any Workload.
    w.api
        .answer(200, serde_json::to_value(with_entry("15")).expect("json"));
    w.sees(with_entry("14")).await.expect("decided");
    assert_eq!(w.check().asked(), 1);
}

#[tokio::test]
async fn a_restart_neither_starts_the_wait_again_nor_starts_work_after_it() {
    // A process that first sees a Workload reserved longer ago than the wait (it restarted, or
    // took the lead, after the wait was over): released once, never started.
    let mut w = World::new(&[]);
    w.sees(reserved_ago("10", WAIT + Duration::from_secs(30)))
        .await
        .expect("released");
    assert_eq!(w.check().started(), 0);
    assert_eq!(w.check().released(), [ReleaseReason::EntryNotAdded]);
    // One that sees it within the wait starts it, and looks again when the wait ends (what is
    // left of it, not the whole wait again).
    let mut w = World::new(&[]);
    let wl = reserved_ago("10", WAIT - Duration::from_secs(20));
    w.workloads.apply_watcher_event(&Event::Apply(wl.clone()));
    let action = reconcile(Arc::new(wl), w.ctx.clone())
        .await
        .expect("started");
    assert_eq!(w.check().started(), 1);
    let looks_again = format!("{action:?}");
    assert!(
        looks_again.contains("requeue_after: Some(19")
            || looks_again.contains("requeue_after: Some(20"),
        "{looks_again}"
    );
}

#[tokio::test]
async fn a_start_that_fails_transiently_is_an_error_and_is_tried_again() {
    let mut w = World::new(&[]);
    w.check().failing_starts.store(1, Ordering::SeqCst);
    let failed = w.sees(reserved("10", "on-demand")).await;
    assert!(failed.is_err(), "the reconcile backs off");
    assert_eq!(w.check().started(), 0);
    w.sees(reserved("11", "on-demand")).await.expect("started");
    assert_eq!(w.check().started(), 1);
    // What a failed start may have left is released like the rest.
    w.sees(wl("12").build()).await.expect("released");
    assert_eq!(w.check().released(), [ReleaseReason::QuotaReleased]);
}

#[tokio::test]
async fn a_start_refused_for_good_is_tried_once_per_attempt_and_released_after_the_wait() {
    let mut w = World::new(&[]);
    w.check().refusing_starts.store(100, Ordering::SeqCst);
    let wl = reserved_ago("10", WAIT - Duration::from_secs(20));
    w.workloads.apply_watcher_event(&Event::Apply(wl.clone()));
    let action = reconcile(Arc::new(wl), w.ctx.clone()).await;
    let action = format!("{:?}", action.expect("no error: nothing to retry"));
    // Looked at again when the wait ends, so that what a refused start left is released.
    assert!(
        action.contains("requeue_after: Some(19") || action.contains("requeue_after: Some(20"),
        "{action}"
    );
    // Later changes in the same attempt do not try again.
    w.sees(reserved_ago("11", WAIT - Duration::from_secs(10)))
        .await
        .expect("no-op");
    assert_eq!(w.check().start_calls.load(Ordering::SeqCst), 1);
    // The wait over: released (what the refused request left behind goes), once.
    w.sees(reserved_ago("12", WAIT + Duration::from_secs(1)))
        .await
        .expect("released");
    assert_eq!(w.check().released(), [ReleaseReason::EntryNotAdded]);
    assert_eq!(w.check().start_calls.load(Ordering::SeqCst), 1);
}

/// A Workload whose early start is due waits in the early starts' line until its work starts;
/// then, until the entry comes, it waits with other work; with the entry, with the answers.
#[tokio::test]
async fn an_early_start_due_is_classed_for_the_start_turns_until_its_work_starts() {
    use crate::runtime::line::Class;
    let mut w = World::new(&["spot"]);
    let reserved_spot = reserved("10", "spot");
    assert_eq!(w.ctx.line_class(&reserved_spot), Class::Start);
    assert_eq!(
        w.ctx.line_class(&reserved("10", "on-demand")),
        Class::Other,
        "the queue does not apply the check on this flavor"
    );
    assert_eq!(
        w.ctx.line_class(&wl("10").build()),
        Class::Other,
        "no quota reserved"
    );
    w.sees(reserved_spot).await.expect("started");
    assert_eq!(w.check().started(), 1);
    assert_eq!(
        w.ctx.line_class(&reserved("11", "spot")),
        Class::Other,
        "started in this attempt: nothing left to start"
    );
    let entry = wl("12")
        .check(CHECK, CheckState::Pending)
        .quota_reserved("cq", "spot")
        .build();
    assert_eq!(w.ctx.line_class(&entry), Class::Answer);
    // An inactive check (bad parameters, shadow mode) starts nothing early: no start turn.
    let fresh = WorkloadBuilder::new("ns", "another")
        .pod_set("main", 1, "1")
        .quota_reserved("cq", "spot")
        .build();
    assert_eq!(w.ctx.line_class(&fresh), Class::Start);
    w.ctx
        .registry
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .insert(
            CHECK.to_string(),
            Err(crate::runtime::check_registry::Inactive {
                reason: crate::runtime::check_registry::Reason::BadParametersRef,
                message: "no such parameters".into(),
            }),
        );
    assert_eq!(w.ctx.line_class(&fresh), Class::Other);
}

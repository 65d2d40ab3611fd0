//! The leader's part: reporting leadership, and the reconciler with the tasks the check runs
//! while leading.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::{Stream, StreamExt};
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::{ReceiverStream, UnboundedReceiverStream};
use tracing::{info, warn};

use super::config::Shutdown;
use super::{context, metrics, reconcile, tasks};
use crate::api::Workload;
use crate::check::AdmissionCheckController;
use crate::error::Error;
use crate::extensions::{Extensions, LeaderContext, WorkloadWaker};

/// What the leader needs to reconcile.
pub(super) struct Leading<C: AdmissionCheckController> {
    pub(super) ctx: Arc<context::Context<C>>,
    /// For the check's own tasks: the client, the Workload cache, the shadow scope.
    pub(super) client: Client,
    pub(super) cache: Store<Workload>,
    pub(super) shadow: Option<crate::shadow::ShadowScope>,
    /// Whether the Workload cache had its first complete list.
    pub(super) cache_ready: watch::Receiver<bool>,
    /// Changes of Workloads, from the watch.
    pub(super) changes: mpsc::Receiver<Workload>,
    /// Asks to reconcile every cached Workload.
    pub(super) reconcile_all: mpsc::Receiver<()>,
    pub(super) leading: watch::Receiver<bool>,
    /// The check's tasks to run while leading.
    pub(super) extensions: Extensions,
    /// Wakes for single Workloads (the check's tasks get the sender).
    pub(super) wake: (
        mpsc::Sender<kube::runtime::reflector::ObjectRef<Workload>>,
        mpsc::Receiver<kube::runtime::reflector::ObjectRef<Workload>>,
    ),
    /// For the check's tasks.
    pub(super) cluster_queues: crate::ClusterQueues,
    pub(super) shutdown: Shutdown,
}

/// Reconciles Workloads, with the check's tasks beside, until `shutdown` or until the lead is
/// lost ([`Error::LeadershipLost`]). On a stop, reconciles in flight finish first.
pub(super) async fn lead<C: AdmissionCheckController>(l: Leading<C>) -> Result<(), Error> {
    info!("leading: reconciling Workloads");
    let (wake_tx, wake_rx) = l.wake;
    let cache = l.cache.clone();
    let leader_context = LeaderContext {
        client: l.client,
        workloads: l.cache,
        waker: WorkloadWaker(wake_tx),
        shadow: l.shadow,
        cluster_queues: l.cluster_queues,
    };
    let tasks = start_tasks(l.extensions, leader_context, &l.cache_ready);
    let lost = Arc::new(AtomicBool::new(false));
    let stop = stop_signal(l.shutdown.clone(), l.leading.clone(), lost.clone());
    let stop_unsynced = stop_before_sync(
        stop_signal(l.shutdown, l.leading, lost.clone()),
        l.cache_ready.clone(),
    );
    let changes = changes_kube_needs(l.ctx.clone(), l.changes);
    let wakes = wakes_kube_needs(l.ctx.clone(), wake_rx);
    // Workloads whose turn came (see `line`): not filtered, their reconcile takes the turn.
    let (granted_tx, granted_rx) = mpsc::unbounded_channel();
    l.ctx.line.connect(granted_tx);
    let granted = UnboundedReceiverStream::new(granted_rx);
    let sweep = sweep_the_line(l.ctx.clone());
    let queue = l.ctx.clone();
    let reconciler = Controller::for_stream(changes, cache.clone())
        // Unlimited here: the reconcile takes a fair turn itself (see `line`). kube still never
        // runs two reconciles of one Workload at once.
        .with_config(ControllerConfig::default().concurrency(0))
        .reconcile_on(when_complete(
            l.reconcile_all,
            cache.clone(),
            l.cache_ready,
            l.ctx.clone(),
        ))
        .reconcile_on(wakes)
        .reconcile_on(granted)
        .graceful_shutdown_on(stop)
        .run(reconcile::reconcile, reconcile::error_policy, l.ctx)
        .for_each(|res| async { after_reconcile(&queue, res) });
    tokio::select! {
        () = reconciler => {}
        () = stop_unsynced => {}
        () = sweep => {}
    }
    tasks.stop().await;
    queue.line.clear();
    queue.metrics.queue_depth(0);
    if lost.load(Ordering::Acquire) {
        Err(Error::LeadershipLost)
    } else {
        Ok(())
    }
}

/// kube's controller starts reconciling only once the Workload cache is complete, and until
/// then does not end on a graceful stop either. A stop before that (the cache may never fill:
/// RBAC, a missing CRD) has nothing in flight to finish, so it ends at once: this resolves on
/// `stopped` only while the cache was never complete.
async fn stop_before_sync(stopped: impl Future<Output = ()>, cache_ready: watch::Receiver<bool>) {
    stopped.await;
    if *cache_ready.borrow() {
        std::future::pending::<()>().await;
    }
    warn!("stopping before the Workload cache was ever complete");
}

/// The Workload changes from the watch that kube needs: not those of a Workload waiting in
/// line (its reconcile will read the change from the cache). Each is counted for the queue
/// metrics.
fn changes_kube_needs<C: AdmissionCheckController>(
    ctx: Arc<context::Context<C>>,
    changes: mpsc::Receiver<Workload>,
) -> impl Stream<Item = Result<Workload, kube::runtime::watcher::Error>> {
    ReceiverStream::new(changes).filter_map(move |wl: Workload| {
        let now = tokio::time::Instant::now();
        let namespace = wl.namespace().unwrap_or_default();
        let class = ctx.line_class(&wl);
        let (needed, waiting) = ctx.line.change(&namespace, &wl.name_any(), class, now);
        ctx.metrics.queue_depth(waiting);
        futures::future::ready(needed.then_some(Ok(wl)))
    })
}

/// The wakes (from the check's tasks and the ClusterQueue watch) that kube needs: not those of
/// a Workload waiting in line.
fn wakes_kube_needs<C: AdmissionCheckController>(
    ctx: Arc<context::Context<C>>,
    wakes: mpsc::Receiver<ObjectRef<Workload>>,
) -> impl Stream<Item = ObjectRef<Workload>> {
    ReceiverStream::new(wakes).filter(move |wl| {
        let namespace = wl.namespace.as_deref().unwrap_or_default();
        futures::future::ready(ctx.line.wake(namespace, &wl.name))
    })
}

/// Puts a Workload granted a turn and never reconciled (only a defect would leave one) back in
/// line, for ever.
async fn sweep_the_line<C: AdmissionCheckController>(ctx: Arc<context::Context<C>>) {
    loop {
        tokio::time::sleep(super::line::GRANT_TIMEOUT / 2).await;
        ctx.line.sweep(tokio::time::Instant::now());
    }
}

/// What a reconcile's end means beyond the reconcile: a Workload deleted before its reconcile
/// leaves the line.
fn after_reconcile<C: AdmissionCheckController, T>(
    ctx: &context::Context<C>,
    result: Result<T, kube::runtime::controller::Error<Error, kube::runtime::watcher::Error>>,
) {
    match result {
        Ok(_) => {}
        Err(e) if is_deleted_before_reconcile(&e) => {
            tracing::debug!(error = %e, "workload gone before its reconcile");
            if let kube::runtime::controller::Error::ObjectNotFound(gone) = &e {
                let namespace = gone.namespace.as_deref().unwrap_or_default();
                let now = tokio::time::Instant::now();
                let waiting = ctx.line.gone(namespace, &gone.name, now);
                ctx.metrics.queue_depth(waiting);
            }
        }
        Err(e) => warn!(error = %e, "workload reconcile failed"),
    }
}

/// Waits until this replica leads (`true`) or `shutdown` comes first (`false`, also when the
/// election ended without it leading).
pub(super) async fn wait_to_lead(mut leading: watch::Receiver<bool>, shutdown: &Shutdown) -> bool {
    tokio::select! {
        led = leading.wait_for(|l| *l) => led.is_ok(),
        () = shutdown.clone() => false,
    }
}

/// Starts the check's tasks, each once the Workload cache is complete (so a Workload missing
/// from it is gone).
fn start_tasks(
    extensions: Extensions,
    ctx: LeaderContext,
    cache_ready: &watch::Receiver<bool>,
) -> tasks::TaskGroup {
    let mut started = tasks::TaskGroup::default();
    for (name, task) in extensions.tasks {
        let fut = task(ctx.clone());
        let mut cache_ready = cache_ready.clone();
        started.push(tokio::spawn(async move {
            if cache_ready.wait_for(|r| *r).await.is_err() {
                return;
            }
            fut.await;
            warn!(task = %name, "a task running beside the runtime returned");
        }));
    }
    started
}

/// Resolves on `shutdown`, or when the lead is lost (then sets `lost`; a closed channel means
/// the election task died: as good as lost).
async fn stop_signal(
    shutdown: Shutdown,
    mut leading: watch::Receiver<bool>,
    lost: Arc<AtomicBool>,
) {
    tokio::select! {
        () = shutdown => {}
        _ = leading.wait_for(|l| !*l) => lost.store(true, Ordering::Release),
    }
}

/// The asks to reconcile everything, each once the cache is complete: kube takes its snapshot
/// of the cache when the ask arrives, not when the runner may start, so an ask that arrived
/// before the cache was complete (this replica took the lead during its first list) would
/// reconcile only part of it.
fn when_complete<C: AdmissionCheckController>(
    asks: mpsc::Receiver<()>,
    cache: Store<Workload>,
    cache_ready: watch::Receiver<bool>,
    ctx: Arc<context::Context<C>>,
) -> impl futures::Stream<Item = ObjectRef<Workload>> {
    ReceiverStream::new(asks)
        .then(move |()| {
            let (cache, mut cache_ready, ctx) = (cache.clone(), cache_ready.clone(), ctx.clone());
            async move {
                let _ = cache_ready.wait_for(|ready| *ready).await;
                let cached = cache.state();
                let chosen: Vec<ObjectRef<Workload>> = cached
                    .iter()
                    .filter(|wl| {
                        let known = wl.uid().is_some_and(|uid| ctx.memory.knows(&uid));
                        may_need_this_controller(wl, known)
                    })
                    .map(|wl| ObjectRef::from_obj(wl.as_ref()))
                    .collect();
                info!(
                    workloads = chosen.len(),
                    cached = cached.len(),
                    "reconciling every cached Workload that may need this controller"
                );
                futures::stream::iter(chosen)
            }
        })
        .flatten()
}

/// Whether a reconcile of everything (on taking the lead, after a new list) must include `wl`:
/// unless it is being deleted, holds quota, has an admission check entry, or the runtime
/// remembers something about it (`known`), no check of this controller can have anything to
/// decide or release for it. At 10,000 pending Workloads the rest cost kube's scheduler 5 MiB
/// that it kept (its maps do not shrink), and a reconcile each.
pub(super) fn may_need_this_controller(wl: &Workload, known: bool) -> bool {
    known
        || wl.metadata.deletion_timestamp.is_some()
        || wl.condition_is_true(crate::api::workload_condition::QUOTA_RESERVED)
        || wl
            .status
            .as_ref()
            .is_some_and(|s| !s.admission_checks.is_empty())
}

/// Logs leadership changes and keeps the leader gauge.
pub(super) async fn report_leadership(
    mut leading: watch::Receiver<bool>,
    metrics: Arc<metrics::Metrics>,
) {
    loop {
        let now = *leading.borrow_and_update();
        metrics.leader(now);
        if !now {
            info!("standing by: another replica holds the leader Lease");
        }
        if leading.changed().await.is_err() {
            metrics.leader(false);
            return;
        }
    }
}

/// A Workload deleted while a reconcile of it was queued: normal (every deletion can do it),
/// not worth a warning that log-based alerting would page on; its release runs on the deletion
/// itself.
pub(super) fn is_deleted_before_reconcile<E1, E2>(
    error: &kube::runtime::controller::Error<E1, E2>,
) -> bool {
    matches!(error, kube::runtime::controller::Error::ObjectNotFound(_))
}

#[cfg(test)]
mod tests {
    use kube::runtime::controller::Error as ControllerError;
    use kube::runtime::reflector::ObjectRef;

    use super::*;

    #[test]
    fn a_reconcile_of_everything_skips_only_pending_workloads_nothing_is_known_of() {
        use crate::api::CheckState;
        use crate::testing::WorkloadBuilder;
        let pending = WorkloadBuilder::new("ns", "pending").uid("u1").build();
        assert!(!may_need_this_controller(&pending, false));
        assert!(may_need_this_controller(&pending, true), "remembered");
        let reserved = WorkloadBuilder::new("ns", "reserved")
            .quota_reserved("cq", "default")
            .build();
        assert!(may_need_this_controller(&reserved, false));
        // Evicted, quota gone, the entry kept: its release may be due.
        let with_entry = WorkloadBuilder::new("ns", "entry")
            .check("prov", CheckState::Pending)
            .build();
        assert!(may_need_this_controller(&with_entry, false));
        let mut deleting = pending.clone();
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert!(may_need_this_controller(&deleting, false));
    }

    #[test]
    fn a_workload_deleted_before_its_reconcile_is_not_a_warning() {
        let wl = || {
            Box::new(
                ObjectRef::<crate::api::Workload>::new("wl")
                    .within("ns")
                    .erase(),
            )
        };
        let gone: ControllerError<std::io::Error, std::io::Error> =
            ControllerError::ObjectNotFound(wl());
        assert!(is_deleted_before_reconcile(&gone));
        let failed: ControllerError<std::io::Error, std::io::Error> =
            ControllerError::ReconcilerFailed(std::io::Error::other("boom"), wl());
        assert!(!is_deleted_before_reconcile(&failed));
    }
}

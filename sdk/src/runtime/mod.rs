//! The thin I/O shell around [`crate::decide`]: watches, reconcile, status writes.
//!
//! Two loops share one registry of "our" AdmissionChecks:
//! - the AdmissionCheck loop keeps the checks whose `controllerName` is ours, resolves and
//!   validates their parameters, writes their `Active` condition, and asks for every Workload
//!   to be reconciled again when a check changes;
//! - the Workload controller (kube-runtime: one reconcile at a time per Workload, bounded
//!   concurrency, backoff on errors) asks the check whenever [`crate::decide::eligibility`]
//!   says so and applies what [`crate::decide::plan`] allows.
//!
//! Everything is event driven; the only timers are the ones a check asks for (recheck after,
//! revalidation) and error backoff.

mod checks;
mod claim;
mod extensions;
mod http;
mod kueue_api;
mod leader;
mod metrics;
mod own_writes;
mod reconcile;
mod relist;
mod shadow;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Client, Resource, ResourceExt};
use tokio::sync::{mpsc, watch};
use tracing::{debug, error, info, warn};

pub use extensions::{Extensions, LeaderContext, WorkloadWaker};
pub use leader::{LEASE_OWNER_ANNOTATION, LeaderElection, lease_name_for};

use crate::api::{AdmissionCheck, Workload};
use crate::check::{AdmissionCheckController, CheckParameters};
use crate::error::Error;

/// How the runtime runs a check.
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// Where `/metrics`, `/healthz` and `/readyz` are served; `None` serves nothing.
    pub metrics_address: Option<std::net::SocketAddr>,
    /// Prefix of the server-side apply field managers; each check gets its own manager, so one
    /// process serving several checks never strips another check's entry.
    pub field_manager: String,
    /// How many Workloads are reconciled at once.
    pub concurrency: u16,
    /// Elect a leader among replicas; `None` writes from this process unconditionally.
    pub leader_election: Option<LeaderElection>,
    /// The longest retry delay written; a longer one (from a policy or an explicit delay) is
    /// written as this, counted and announced. Kueue keeps the Workload's quota for the whole
    /// delay, so an absurd configuration must not hold it for years.
    pub max_retry_delay: std::time::Duration,
    /// How long a Workload keeps its quota after its check failed permanently (see
    /// [`crate::check::ErrorClass`]) before the runtime answers `Retry` for it: the time the
    /// user has to fix what the entry's message says without losing the reservation.
    pub permanent_failure_hold: std::time::Duration,
    /// Shadow mode: decide for the Workloads holding quota in this scope and publish what would
    /// have been answered, writing nothing on Workloads (see [`crate::shadow`]). `None`: the
    /// checks answer for real.
    pub shadow: Option<crate::shadow::ShadowScope>,
}

/// The default of [`RuntimeConfig::permanent_failure_hold`]: two minutes, enough to read the
/// message and fix an annotation, short enough not to starve a queue.
pub const DEFAULT_PERMANENT_FAILURE_HOLD: std::time::Duration = std::time::Duration::from_secs(120);

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            metrics_address: Some(std::net::SocketAddr::from(([0, 0, 0, 0], 8080))),
            field_manager: "kueue-admission-sdk".into(),
            concurrency: 8,
            leader_election: None,
            max_retry_delay: crate::retry::DEFAULT_MAX_RETRY_DELAY,
            permanent_failure_hold: DEFAULT_PERMANENT_FAILURE_HOLD,
            shadow: None,
        }
    }
}

/// Runs `controller` until the process gets SIGTERM or Ctrl-C; see [`run_until`].
pub async fn run<C: AdmissionCheckController>(
    client: Client,
    controller: C,
    config: RuntimeConfig,
) -> Result<(), Error> {
    run_until(client, controller, config, termination_signal()).await
}

/// Resolves on SIGTERM (what Kubernetes sends) or Ctrl-C: the `shutdown` a binary that calls
/// [`run_until`] itself passes.
pub async fn termination_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => info!("SIGTERM: shutting down"),
                    _ = tokio::signal::ctrl_c() => info!("interrupted: shutting down"),
                }
            }
            Err(e) => {
                warn!(error = %e, "cannot listen for SIGTERM; Ctrl-C only");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// How long a clean shutdown waits for the Lease to be released.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs `controller` until `shutdown` resolves, with the work it declares in
/// [`AdmissionCheckController::while_leading`] beside the reconciler while this replica leads.
///
/// Every replica watches AdmissionChecks and Workloads, so its caches are warm and `/readyz`
/// reports ready once they have synced. Only the leader (every process, without
/// [`RuntimeConfig::leader_election`]) writes: it reconciles Workloads and keeps the
/// AdmissionChecks' `Active` condition.
///
/// On `shutdown`, no new reconcile starts, those in flight finish (their status writes land or
/// fail, never half-done), and the Lease is released so that a standby takes over at once.
/// Returns [`Error::LeadershipLost`] if another replica took the Lease: the caller should exit
/// and restart as a standby, as Kubernetes does with a non-zero exit.
pub async fn run_until<C, S>(
    client: Client,
    controller: C,
    config: RuntimeConfig,
    shutdown: S,
) -> Result<(), Error>
where
    C: AdmissionCheckController,
    S: Future<Output = ()> + Send + 'static,
{
    let extensions = controller.while_leading();
    if config.shadow.is_some()
        && let Some(reason) = controller.shadow_mode_refusal()
    {
        return Err(Error::Config(format!(
            "{} cannot run in shadow mode: {reason}",
            controller.controller_name()
        )));
    }
    let shutdown = shutdown.boxed().shared();
    let registry: checks::Registry<C::Parameters> = Default::default();
    let controller = Arc::new(controller);
    // One pending "reconcile everything" is enough: more would only repeat it.
    let (trigger_tx, trigger_rx) = mpsc::channel::<()>(1);

    let (reader, writer) = reflector::store::<Workload>();

    let mut prometheus = prometheus_client::registry::Registry::default();
    let names = registry.clone();
    let check_names = Arc::new(move || {
        names
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect()
    });
    let metrics = metrics::Metrics::new(&mut prometheus, reader.clone(), check_names);
    let metrics = Arc::new(if config.shadow.is_some() {
        metrics.in_shadow_mode()
    } else {
        metrics
    });
    controller.register_metrics(&mut prometheus);
    let health = Arc::new(http::Health::new(prometheus));
    // Bind before anything else starts, so a taken port fails the start with its reason.
    let server = match config.metrics_address {
        Some(addr) => Some(AbortOnDrop::new(tokio::spawn(http::serve(
            http::bind(addr).await.map_err(Error::Serve)?,
            health.clone(),
        )))),
        None => None,
    };
    // Against a Kueue without the API version we speak, watches would only fail with 404:
    // say which Kueue is needed and wait for it (an upgrade needs no restart of ours).
    tokio::select! {
        () = kueue_api::wait_until_served(&client, &health) => {}
        () = shutdown.clone() => {
            info!("stopped while waiting for the Kueue API");
            return Ok(());
        }
    }
    let leadership = match &config.leader_election {
        None => leader::Leadership::always(),
        // Joining waits out an unreachable API server; a stop meanwhile ends the run cleanly.
        Some(election) => tokio::select! {
            joined = leader::Leadership::elect(client.clone(), election, controller.controller_name()) => joined?,
            () = shutdown.clone() => {
                info!("stopped before joining the leader election");
                return Ok(());
            }
        },
    };

    // Aborted when this function returns or its future is dropped: nothing it started outlives it.
    let mut background = TaskGroup::default();
    background.push(tokio::spawn(report_leadership(
        leadership.leading.clone(),
        metrics.clone(),
    )));
    let checks_synced = Arc::new(tokio::sync::Notify::new());
    background.push(tokio::spawn(watch_admission_checks(
        client.clone(),
        controller.clone(),
        registry.clone(),
        config.field_manager.clone(),
        trigger_tx.clone(),
        metrics.clone(),
        checks_synced.clone(),
        leadership.leading.clone(),
        CheckSettings {
            max_retry_delay: config.max_retry_delay,
            shadow: config.shadow.clone(),
        },
        config.leader_election.as_ref().map(claim::claim_of),
    )));
    // Ready once both watches delivered their first complete list (InitDone), seen on the
    // streams themselves.
    let workloads_synced = Arc::new(tokio::sync::Notify::new());
    // Our own "Workload cache complete" flag: kube's `Store::wait_until_ready` can miss its
    // wake-up when several tasks wait on it at once (one waker is kept), so tasks wait on this.
    let (cache_ready_tx, cache_ready) = watch::channel(false);
    background.push({
        let (workloads_synced, health) = (workloads_synced.clone(), health.clone());
        tokio::spawn(async move {
            workloads_synced.notified().await;
            let _ = cache_ready_tx.send(true);
            // Kept until the runtime stops, so waiters never see the channel closed.
            let _keep = cache_ready_tx;
            checks_synced.notified().await;
            health.ready.store(true, Ordering::Release);
            info!("caches synced, ready");
        })
    });
    // The Workload cache is kept on every replica; changes reach the reconciler only while this
    // replica leads (on taking the lead, everything cached is reconciled once).
    let (changes_tx, changes_rx) = mpsc::channel::<Workload>(256);
    // Unbounded: a burst of deletions must not lose a release; each entry is one Workload.
    let (deleted_tx, mut deleted_rx) = mpsc::unbounded_channel::<Workload>();
    let own_writes = Arc::new(own_writes::OwnWrites::default());
    let workload_events = watcher(
        Api::<Workload>::all(client.clone()),
        watcher::Config::default().any_semantic(),
    )
    .default_backoff();
    background.push(tokio::spawn(watch_workloads(WorkloadWatch {
        events: workload_events,
        writer,
        cache: reader.clone(),
        synced: workloads_synced,
        changes: changes_tx,
        deleted: deleted_tx,
        reconcile_all: trigger_tx.clone(),
        leading: leadership.leading.clone(),
        own_writes: own_writes.clone(),
    })));
    let recorder = Recorder::new(client.clone(), Reporter::from(config.field_manager.clone()));
    let extension_client = client.clone();
    let (claims_client, claimed) = (client.clone(), registry.clone());
    let ctx = Arc::new(
        reconcile::Context::new(
            client, controller, registry, &config, recorder, metrics, own_writes,
        )
        .with_cache(reader.clone()),
    );
    // A deleted Workload never reaches the reconciler again: release what its checks hold here.
    background.push({
        let ctx = ctx.clone();
        tokio::spawn(async move {
            while let Some(wl) = deleted_rx.recv().await {
                reconcile::release_deleted(&ctx, &wl).await;
            }
        })
    });

    let mut leading = leadership.leading.clone();
    let became_leader = tokio::select! {
        led = leading.wait_for(|l| *l) => led.is_ok(),
        () = shutdown.clone() => false,
    };
    let mut outcome = Ok(());
    let mut leader_tasks = TaskGroup::default();
    if became_leader {
        info!("leading: reconciling Workloads");
        let _ = trigger_tx.try_send(());
        let (wake_tx, wake_rx) = mpsc::channel(1024);
        let leader_ctx = LeaderContext {
            client: extension_client,
            workloads: reader.clone(),
            waker: WorkloadWaker(wake_tx),
            shadow: config.shadow.clone(),
        };
        for (name, task) in extensions.tasks {
            let fut = task(leader_ctx.clone());
            let mut cache_ready = cache_ready.clone();
            leader_tasks.push(tokio::spawn(async move {
                // A task starts with a complete cache, so a Workload missing from it is gone.
                if cache_ready.wait_for(|r| *r).await.is_err() {
                    return;
                }
                fut.await;
                warn!(task = %name, "a task running beside the runtime returned");
            }));
        }
        drop(leader_ctx);
        let lost = Arc::new(AtomicBool::new(false));
        let stop = {
            let (mut leading, lost, shutdown) = (leading.clone(), lost.clone(), shutdown.clone());
            async move {
                tokio::select! {
                    () = shutdown => {}
                    // A closed channel means the election task died: as good as lost.
                    _ = leading.wait_for(|l| !*l) => lost.store(true, Ordering::Release),
                }
            }
        };
        // kube's controller starts reconciling only once the Workload cache is complete, and
        // until then does not end on a graceful stop either. A stop before that (the cache may
        // never fill: RBAC, a missing CRD) has nothing in flight to finish, so it ends at once.
        let stop_unsynced = {
            let (mut leading, lost, shutdown) = (leading.clone(), lost.clone(), shutdown.clone());
            let cache_ready = cache_ready.clone();
            async move {
                tokio::select! {
                    () = shutdown => {}
                    _ = leading.wait_for(|l| !*l) => lost.store(true, Ordering::Release),
                }
                if *cache_ready.borrow() {
                    std::future::pending::<()>().await;
                }
                warn!("stopping before the Workload cache was ever complete");
            }
        };
        let changes = tokio_stream::wrappers::ReceiverStream::new(changes_rx).map(Ok);
        // kube takes its snapshot of the cache when the trigger arrives, not when the runner may
        // start: a trigger that arrived before the cache was complete (this replica took the
        // lead during its first list) would reconcile only part of it. So it waits for it.
        let (cached, cache_complete) = (reader.clone(), cache_ready.clone());
        let trigger = tokio_stream::wrappers::ReceiverStream::new(trigger_rx).then(move |()| {
            let (cached, mut cache_complete) = (cached.clone(), cache_complete.clone());
            async move {
                let _ = cache_complete.wait_for(|ready| *ready).await;
                info!(
                    workloads = cached.state().len(),
                    "reconciling every cached Workload"
                );
            }
        });
        let reconciler = Controller::for_stream(changes, reader)
            // Unlimited here: the reconcile takes a fair turn itself (see `reconcile::Context`).
            // kube still never runs two reconciles of one Workload at once.
            .with_config(ControllerConfig::default().concurrency(0))
            .reconcile_all_on(trigger)
            .reconcile_on(tokio_stream::wrappers::ReceiverStream::new(wake_rx))
            .graceful_shutdown_on(stop)
            .run(reconcile::reconcile, reconcile::error_policy, ctx)
            .for_each(|res| async move {
                match res {
                    Ok(_) => {}
                    Err(e) if is_deleted_before_reconcile(&e) => {
                        tracing::debug!(error = %e, "workload gone before its reconcile");
                    }
                    Err(e) => warn!(error = %e, "workload reconcile failed"),
                }
            });
        tokio::select! {
            () = reconciler => {}
            () = stop_unsynced => {}
        }
        if lost.load(Ordering::Acquire) {
            outcome = Err(Error::LeadershipLost);
        }
    }
    // Every receiver of the leadership channel must be gone before the Lease is released, and
    // nothing may write after it.
    leader_tasks.stop().await;
    background.stop().await;
    // A leader stopping cleanly (not one that lost its Lease) withdraws its claims while it
    // still holds the Lease, before a standby of its own could write them again.
    if let (true, Ok(()), Some(election)) = (became_leader, &outcome, &config.leader_election) {
        let names: Vec<String> = claimed
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect();
        withdraw_claims(
            &claims_client,
            &config.field_manager,
            &claim::claim_of(election),
            &names,
        )
        .await;
    }
    drop(leading);
    leadership.release(RELEASE_TIMEOUT).await;
    drop(server);
    info!("stopped");
    outcome
}

/// A Workload deleted while a reconcile of it was queued: normal (every deletion can do it),
/// not worth a warning that log-based alerting would page on; its release runs on the deletion
/// itself.
fn is_deleted_before_reconcile<E1, E2>(error: &kube::runtime::controller::Error<E1, E2>) -> bool {
    matches!(error, kube::runtime::controller::Error::ObjectNotFound(_))
}

/// A task aborted when dropped.
struct AbortOnDrop<T>(Option<tokio::task::JoinHandle<T>>);

impl<T> AbortOnDrop<T> {
    fn new(task: tokio::task::JoinHandle<T>) -> Self {
        Self(Some(task))
    }

    /// Aborts the task and waits until it is gone (and has dropped what it held).
    async fn stop(mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}

/// Tasks that live exactly as long as the runtime.
#[derive(Default)]
struct TaskGroup(Vec<AbortOnDrop<()>>);

impl TaskGroup {
    fn push(&mut self, task: tokio::task::JoinHandle<()>) {
        self.0.push(AbortOnDrop::new(task));
    }

    async fn stop(self) {
        for task in self.0 {
            task.stop().await;
        }
    }
}

/// What the Workload watch needs.
struct WorkloadWatch<S> {
    /// The watcher's events.
    events: S,
    writer: reflector::store::Writer<Workload>,
    /// The cache `writer` fills.
    cache: reflector::Store<Workload>,
    /// Told when a list is complete and in the cache.
    synced: Arc<tokio::sync::Notify>,
    /// Changes for the reconciler (while leading).
    changes: mpsc::Sender<Workload>,
    /// Deleted Workloads, to release (while leading).
    deleted: mpsc::UnboundedSender<Workload>,
    /// Asks for every cached Workload to be reconciled.
    reconcile_all: mpsc::Sender<()>,
    leading: watch::Receiver<bool>,
    own_writes: Arc<own_writes::OwnWrites>,
}

/// Keeps the Workload cache and forwards changes to the reconciler while this replica leads.
/// What a (re)list brings is not forwarded one by one: the cache takes it only at the list's
/// end, so its end asks for everything to be reconciled instead (see [`relist::WorkloadLists`]).
async fn watch_workloads<S>(w: WorkloadWatch<S>)
where
    S: futures::Stream<Item = Result<watcher::Event<Workload>, watcher::Error>>,
{
    let WorkloadWatch {
        events,
        writer,
        cache,
        synced,
        changes,
        deleted,
        reconcile_all,
        leading,
        own_writes,
    } = w;
    let leading_on_delete = leading.clone();
    let deleted_live = deleted.clone();
    let events = events
        // The cache keeps only what the runtime reads.
        .modify(|wl| {
            wl.managed_fields_mut().clear();
            wl.annotations_mut()
                .remove("kubectl.kubernetes.io/last-applied-configuration");
        })
        .inspect(move |event| {
            if let Ok(watcher::Event::Delete(wl)) = event
                && *leading_on_delete.borrow()
            {
                // Fails only once the runtime is stopping.
                let _ = deleted_live.send(wl.clone());
            }
        })
        .reflect(writer);
    let mut events = std::pin::pin!(events);
    let mut lists = relist::WorkloadLists::default();
    while let Some(event) = events.next().await {
        let now = tokio::time::Instant::now();
        // The reflector has applied `event` to the cache by now.
        let touched = match event {
            Err(e) => {
                warn!(error = %e, "watching Workloads");
                continue;
            }
            Ok(watcher::Event::Init) => {
                lists.begin(cache.state());
                continue;
            }
            Ok(watcher::Event::InitApply(wl)) => {
                lists.delivered(&wl);
                continue;
            }
            Ok(watcher::Event::InitDone) => {
                let done = lists.done();
                // The cache holds these versions now: reconciles waiting for our own write may
                // go on.
                for (uid, rv) in &done.versions {
                    own_writes.seen(uid, rv, now);
                }
                synced.notify_one();
                if *leading.borrow() {
                    for wl in done.gone {
                        debug!(workload = %wl.name_any(), "deleted while the watch was away");
                        let _ = deleted.send((*wl).clone());
                    }
                    // The first list is covered by the reconcile of everything on taking the
                    // lead, which waits for it.
                    if done.relist {
                        info!(
                            workloads = done.versions.len(),
                            "Workloads listed again; reconciling all of them"
                        );
                        let _ = reconcile_all.try_send(());
                    }
                }
                continue;
            }
            Ok(watcher::Event::Apply(wl)) => {
                if let (Some(uid), Some(rv)) = (wl.uid(), wl.resource_version()) {
                    own_writes.seen(&uid, &rv, now);
                }
                wl
            }
            Ok(watcher::Event::Delete(wl)) => wl,
        };
        if *leading.borrow() && changes.send(touched).await.is_err() {
            // The reconciler stopped: keep the cache for metrics and readiness.
            continue;
        }
    }
}

/// Logs leadership changes and keeps the leader gauge.
async fn report_leadership(mut leading: watch::Receiver<bool>, metrics: Arc<metrics::Metrics>) {
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

/// Keeps the registry of our checks and their `Active` conditions in line with the cluster:
/// reacts to AdmissionChecks, to the parameters objects they name, and to taking the lead
/// (only the leader writes conditions, so a new leader writes them all once). A check whose
/// parameters could not be read, or whose condition could not be written, is tried again with
/// backoff: nothing else would bring it back (an RBAC fix, say, changes no watched object).
#[allow(clippy::too_many_arguments)]
async fn watch_admission_checks<C: AdmissionCheckController>(
    client: Client,
    controller: Arc<C>,
    registry: checks::Registry<C::Parameters>,
    field_manager: String,
    trigger: mpsc::Sender<()>,
    metrics: Arc<metrics::Metrics>,
    synced: Arc<tokio::sync::Notify>,
    mut leading: watch::Receiver<bool>,
    settings: CheckSettings,
    // This deployment's claim on the checks it answers (`None` without leader election).
    claim: Option<String>,
) {
    let recorder = Recorder::new(client.clone(), Reporter::from(field_manager.clone()));
    // Checks another deployment claims, with the claim and what to tell the operator: this one
    // stands down for them.
    let mut claimed_elsewhere: BTreeMap<String, (String, ClaimedElsewhere)> = BTreeMap::new();
    let api = Api::<AdmissionCheck>::all(client.clone());
    let mut events = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
    let mut parameters = std::pin::pin!(watch_parameters::<C::Parameters>(client.clone()));
    // Ours, by name, as last seen.
    let mut ours: BTreeMap<String, AdmissionCheck> = BTreeMap::new();
    let mut names = relist::NameTracker::default();
    // Checks to sync again after a failure: when, after how many failures in a row, and
    // whether a change of the check or its parameters is still to be taken in.
    let mut retries: BTreeMap<String, Retry> = BTreeMap::new();
    let mut election_over = false;
    loop {
        let next_retry = retries.values().map(|r| r.at).min();
        // Which checks to resolve again, why, and which went away.
        let (to_sync, why, gone): (Vec<AdmissionCheck>, SyncCause, Vec<String>) = tokio::select! {
            event = events.next() => match event {
                None => return,
                Some(Err(e)) => {
                    warn!(error = %e, "watching AdmissionChecks");
                    continue;
                }
                Some(Ok(event)) => {
                    let touched = names.observe(&event);
                    match event {
                        watcher::Event::Apply(ac) | watcher::Event::InitApply(ac)
                            if ac.spec.controller_name == controller.controller_name()
                                && claimed_by_another(claim.as_deref(), &ac).is_some() =>
                        {
                            let name = ac.name_any();
                            let other = claimed_by_another(claim.as_deref(), &ac).unwrap_or_default();
                            if claimed_elsewhere.get(&name).is_none_or(|(seen, _)| *seen != other) {
                                let found = ClaimedElsewhere::new(&ac, controller.controller_name(), &other);
                                error!(check = %name, "{}", found.message);
                                metrics.check_claimed_elsewhere(&name, true);
                                let lead = *leading.borrow();
                                if lead {
                                    found.publish(&recorder).await;
                                }
                                claimed_elsewhere.insert(name.clone(), (other, found));
                            }
                            // Forgotten like a check that went away: nothing answered or released here.
                            (Vec::new(), SyncCause::Changed, vec![name])
                        }
                        watcher::Event::Apply(ac) | watcher::Event::InitApply(ac)
                            if ac.spec.controller_name == controller.controller_name() =>
                        {
                            if claimed_elsewhere.remove(&ac.name_any()).is_some() {
                                info!(check = %ac.name_any(), "no other deployment claims the admission check any more: answering it");
                                metrics.check_claimed_elsewhere(&ac.name_any(), false);
                            }
                            let before = ours.insert(ac.name_any(), ac.clone());
                            // Its spec changed (or it is new): resolve it again. Only its status
                            // changed (our own condition coming back, Kueue's finalizer): write
                            // the condition again only if it is not what it should be. A re-list
                            // showing it unchanged: nothing.
                            let spec_changed = before.is_none_or(|b| {
                                b.metadata.generation != ac.metadata.generation || b.spec != ac.spec
                            });
                            let unclaimed = claim
                                .as_deref()
                                .is_some_and(|ours| claim::judge(&ac, ours) != claim::Claim::Ours);
                            let condition_off = unclaimed
                                || checks::summary(&registry, &ac.name_any()).is_none_or(|state| {
                                    checks::desired_active_condition(
                                        &ac,
                                        &state,
                                        k8s_openapi::jiff::Timestamp::now(),
                                    )
                                    .is_some()
                                });
                            match (touched.is_empty(), spec_changed, condition_off) {
                                (false, true, _) => (vec![ac], SyncCause::Changed, Vec::new()),
                                (false, false, true) => (vec![ac], SyncCause::Rewrite, Vec::new()),
                                _ => (Vec::new(), SyncCause::Rewrite, Vec::new()),
                            }
                        }
                        watcher::Event::InitDone => {
                            synced.notify_one();
                            // Those a re-list no longer has were deleted while the watch was down.
                            (Vec::new(), SyncCause::Changed, touched)
                        }
                        // Deleted, not (or no longer) ours, or a list beginning.
                        _ => {
                            for name in &touched {
                                if claimed_elsewhere.remove(name).is_some() {
                                    metrics.check_claimed_elsewhere(name, false);
                                }
                            }
                            (Vec::new(), SyncCause::Changed, touched)
                        }
                    }
                }
            },
            changed = leading.changed(), if !election_over => {
                if changed.is_err() {
                    election_over = true;
                    continue;
                }
                if !*leading.borrow_and_update() {
                    continue;
                }
                // A standby found these before it led: the Events are the leader's to write.
                for (_, found) in claimed_elsewhere.values() {
                    found.publish(&recorder).await;
                }
                // To write every condition; taking the lead reconciles every Workload anyway.
                (ours.values().cloned().collect(), SyncCause::Rewrite, Vec::new())
            },
            Some(name) = parameters.next() => (
                ours
                    .values()
                    .filter(|ac| ac.spec.parameters.as_ref().is_some_and(|r| r.name == name))
                    .cloned()
                    .collect(),
                SyncCause::Changed,
                Vec::new(),
            ),
            () = sleep_until_or_never(next_retry) => {
                let now = tokio::time::Instant::now();
                // Each due one is synced below, and then forgotten or rescheduled (keeping its
                // count of failures, so the backoff grows).
                retries.retain(|name, _| ours.contains_key(name));
                let due: Vec<AdmissionCheck> = retries
                    .iter()
                    .filter(|(_, r)| r.at <= now)
                    .filter_map(|(name, _)| ours.get(name).cloned())
                    .collect();
                (due, SyncCause::Rewrite, Vec::new())
            },
        };
        let mut changed = false;
        for name in gone {
            // A check of ours that went away: every Workload may now be decided differently.
            if ours.remove(&name).is_some() {
                write_registry(&registry).remove(&name);
                metrics.forget_check(&name);
                retries.remove(&name);
                changed = true;
            }
        }
        let write = *leading.borrow();
        for ac in &to_sync {
            let name = ac.name_any();
            let before = checks::summary(&registry, &name);
            let Synced { recorded, result } = sync_check(
                &client,
                controller.as_ref(),
                &registry,
                (&field_manager, claim.as_deref()),
                ac,
                &metrics,
                write,
                &settings,
            )
            .await;
            let after = checks::summary(&registry, &name);
            let earlier = retries.get(&name).copied();
            // A change of the check or its parameters not taken in yet (this one, or one whose
            // sync failed before it was recorded).
            let pending_change =
                why == SyncCause::Changed || earlier.is_some_and(|r| r.pending_change);
            // New parameters leave an active check active: only a change that was seen can have
            // brought them.
            changed |=
                before != after || (recorded && pending_change && matches!(after, Some(Ok(_))));
            let pending_change = pending_change && !recorded;
            match result {
                Ok(()) => {
                    retries.remove(&name);
                }
                Err(e) => {
                    metrics.check_sync_error(&name);
                    let failures = earlier.map_or(0, |r| r.failures).saturating_add(1);
                    let delay = check_retry_backoff().delay(failures, rand::random::<f64>());
                    warn!(check = %name, error = %e, failures, retry_in = ?delay, "syncing the admission check");
                    let retry = Retry {
                        at: tokio::time::Instant::now() + delay,
                        failures,
                        pending_change,
                    };
                    retries.insert(name, retry);
                }
            }
        }
        if changed {
            // A check appeared, changed or went away: every Workload may now be decided
            // differently.
            let _ = trigger.try_send(());
        }
    }
}

/// The claim of another deployment on `ac`, if this one claims checks (leader election) and
/// another one's claim is on it.
fn claimed_by_another(ours: Option<&str>, ac: &AdmissionCheck) -> Option<String> {
    match claim::judge(ac, ours?) {
        claim::Claim::Elsewhere(other) => Some(other),
        claim::Claim::Ours | claim::Claim::Unclaimed => None,
    }
}

/// Another deployment's claim found on one of our checks: what the log, and the leader's
/// Warning Event on the check, tell the operator.
struct ClaimedElsewhere {
    reference: k8s_openapi::api::core::v1::ObjectReference,
    message: String,
}

impl ClaimedElsewhere {
    fn new(ac: &AdmissionCheck, controller_name: &str, other: &str) -> Self {
        Self {
            reference: ac.object_ref(&()),
            message: claim::conflict_message(&ac.name_any(), controller_name, other),
        }
    }

    async fn publish(&self, recorder: &Recorder) {
        let event = kube::runtime::events::Event {
            type_: kube::runtime::events::EventType::Warning,
            reason: "ClaimedElsewhere".into(),
            note: Some(self.message.clone()),
            action: "StandDown".into(),
            secondary: None,
        };
        if let Err(e) = recorder.publish(&event, &self.reference).await {
            warn!(check = ?self.reference.name, error = %e, "publishing an event");
        }
    }
}

/// What made the AdmissionCheck loop sync checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SyncCause {
    /// The check's spec or its parameters object changed (or appeared): Workloads may now be
    /// decided differently.
    Changed,
    /// To write the condition again or try again: this replica took the lead, the condition
    /// is not what it should be, an earlier sync failed.
    Rewrite,
}

/// A check whose sync failed, to try again.
#[derive(Clone, Copy, Debug)]
struct Retry {
    at: tokio::time::Instant,
    failures: u32,
    /// A change of the check or its parameters is among what failed.
    pending_change: bool,
}

/// Backoff for syncing one AdmissionCheck again after a failure: 1 s, 2 s, 4 s ... (each up to
/// 20 % longer) and never over 1 min.
fn check_retry_backoff() -> crate::retry::RetryPolicy {
    crate::retry::RetryPolicy::exponential(
        Duration::from_secs(1),
        2.0,
        Duration::from_secs(60),
        0.2,
    )
}

async fn sleep_until_or_never(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Names of the parameters objects of kind `P` as they change or go away, re-lists included
/// (none if `P` takes none).
fn watch_parameters<P: CheckParameters>(
    client: Client,
) -> futures::stream::BoxStream<'static, String> {
    let Some(kind) = P::reference() else {
        return futures::stream::pending().boxed();
    };
    let gvk = GroupVersionKind::gvk(kind.group, kind.version, kind.kind);
    let resource = ApiResource::from_gvk_with_plural(&gvk, kind.plural);
    let api: Api<DynamicObject> = Api::all_with(client, &resource);
    let mut names = relist::NameTracker::default();
    watcher(api, watcher::Config::default())
        .default_backoff()
        .flat_map(move |event| {
            let touched = match event {
                Ok(event) => names.observe(&event),
                Err(e) => {
                    warn!(error = %e, "watching the checks' parameters");
                    Vec::new()
                }
            };
            futures::stream::iter(touched)
        })
        .boxed()
}

/// What syncing an AdmissionCheck needs of the configuration.
#[derive(Clone, Debug)]
struct CheckSettings {
    /// [`RuntimeConfig::max_retry_delay`].
    max_retry_delay: Duration,
    /// [`RuntimeConfig::shadow`].
    shadow: Option<crate::shadow::ShadowScope>,
}

/// What one sync of a check did.
struct Synced {
    /// Its state (active with new parameters, or inactive) was recorded in the registry.
    recorded: bool,
    /// Ok, or what is worth trying again: an API error reading the parameters (what was known
    /// before stays), or writing the condition.
    result: Result<(), Error>,
}

/// Resolves a check's parameters, records the result, and (on the leader) writes its `Active`
/// condition.
#[allow(clippy::too_many_arguments)] // one call site; the restructuring issue gives it a struct
async fn sync_check<C: AdmissionCheckController>(
    client: &Client,
    controller: &C,
    registry: &checks::Registry<C::Parameters>,
    (field_manager, claim): (&str, Option<&str>),
    ac: &AdmissionCheck,
    metrics: &metrics::Metrics,
    write_condition: bool,
    settings: &CheckSettings,
) -> Synced {
    let name = ac.name_any();
    let (resolved, failure) = match checks::resolve(
        client,
        controller,
        ac,
        settings.max_retry_delay,
    )
    .await
    {
        Ok(active) => (Ok(Arc::new(active)), None),
        Err(Ok(inactive)) => {
            warn!(check = %name, reason = inactive.reason, message = %inactive.message, "admission check inactive");
            (Err(inactive), None)
        }
        // Shown on the check, and tried again until fixed: an API the check needs that is
        // not served, or our own RBAC (see `checks::inactive_for`).
        Err(Err(e)) => match checks::inactive_for::<C::Parameters>(ac, &e) {
            Some(inactive) => {
                warn!(check = %name, reason = inactive.reason, message = %inactive.message, "admission check inactive");
                (Err(inactive), Some(e))
            }
            None => {
                if checks::summary(registry, &name).is_none() {
                    // Never resolved here: not served, whatever the condition says.
                    metrics.check_active(&name, false);
                }
                return Synced {
                    recorded: false,
                    result: Err(e),
                };
            }
        },
    };
    let state = resolved
        .as_ref()
        .map(|a| a.message.clone())
        .map_err(Clone::clone);
    metrics.check_active(&name, state.is_ok());
    write_registry(registry).insert(name.clone(), resolved);
    // In shadow mode a check that could answer is shown inactive: no ClusterQueue may wait on
    // answers that are never written.
    let shown = match (state, &settings.shadow) {
        (Ok(message), Some(scope)) => Err(checks::shadow_mode(scope, &message)),
        (state, _) => state,
    };
    let written = if write_condition {
        write_active_condition(client, field_manager, ac, &shown, claim).await
    } else {
        Ok(())
    };
    Synced {
        recorded: true,
        result: written.and(failure.map_or(Ok(()), Err)),
    }
}

/// Writes the `Active` condition for `state`, resolved from `ac`, unless it is already there.
async fn write_active_condition(
    client: &Client,
    field_manager: &str,
    ac: &AdmissionCheck,
    state: &Result<String, checks::Inactive>,
    claim: Option<&str>,
) -> Result<(), Error> {
    // Compared with the check as it is now, not as cached: the watch may not have brought back
    // a condition written a moment ago, and writing it again would move its lastTransitionTime.
    let Some(current) = Api::<AdmissionCheck>::all(client.clone())
        .get_opt(&ac.name_any())
        .await?
    else {
        return Ok(());
    };
    // Changed since it was resolved (re-created, a new spec, another controllerName): the
    // watch event for that change syncs it again.
    if current.uid() != ac.uid()
        || current.metadata.generation != ac.metadata.generation
        || current.spec.controller_name != ac.spec.controller_name
    {
        return Ok(());
    }
    let now = k8s_openapi::jiff::Timestamp::now();
    // Another deployment's claim is never overwritten: its watch event makes this one stand
    // down. Ours (or none) is written with the Active condition, in the same apply, since an
    // apply that left it out would remove it.
    let claim_missing = match claim.map(|ours| claim::judge(&current, ours)) {
        Some(claim::Claim::Elsewhere(_)) => return Ok(()),
        Some(claim::Claim::Unclaimed) => true,
        Some(claim::Claim::Ours) | None => false,
    };
    let active = match checks::desired_active_condition(&current, state, now) {
        Some(condition) => condition,
        None if claim_missing => match current.active_condition() {
            Some(condition) => condition.clone(),
            None => return Ok(()),
        },
        None => return Ok(()),
    };
    let mut conditions = vec![active];
    conditions.extend(claim.map(|ours| claim::claim_condition(&current, ours, now)));
    checks::apply_active_condition(client, field_manager, &current, conditions).await
}

/// Withdraws this deployment's claim from every check that carries it, keeping the `Active`
/// condition as it is: on a clean stop of the leader, so that another deployment (the same
/// controller moved to another namespace or Lease) takes the checks over. Best effort: a
/// check left claimed is taken back by this deployment's next leader.
async fn withdraw_claims(client: &Client, field_manager: &str, ours: &str, checks: &[String]) {
    let api = Api::<AdmissionCheck>::all(client.clone());
    for name in checks {
        let withdrawn = async {
            let Some(current) = api.get_opt(name).await? else {
                return Ok(());
            };
            if claim::judge(&current, ours) != claim::Claim::Ours {
                return Ok(());
            }
            let active: Vec<_> = current.active_condition().cloned().into_iter().collect();
            checks::apply_active_condition(client, field_manager, &current, active).await
        };
        match withdrawn.await {
            Ok(()) => {
                info!(check = %name, "withdrew this deployment's claim on the admission check")
            }
            Err(e) => {
                warn!(check = %name, error = %e, "withdrawing the claim on the admission check")
            }
        }
    }
}

fn write_registry<P>(
    registry: &checks::Registry<P>,
) -> std::sync::RwLockWriteGuard<'_, checks::CheckMap<P>> {
    // A panic while holding the lock cannot leave the map half-updated: every write is one insert
    // or remove. So a poisoned lock is still safe to use.
    registry.write().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use kube::runtime::controller::Error as ControllerError;
    use kube::runtime::reflector::ObjectRef;

    use super::*;

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

    #[tokio::test]
    async fn a_check_that_refuses_shadow_mode_stops_the_start_with_its_reason() {
        struct Provisions;
        impl AdmissionCheckController for Provisions {
            type Parameters = crate::NoParameters;
            type Error = std::convert::Infallible;
            fn controller_name(&self) -> &str {
                "example.com/provisions"
            }
            fn shadow_mode_refusal(&self) -> Option<String> {
                Some("it creates capacity".into())
            }
            async fn decide(
                &self,
                _: &crate::CheckContext<'_, crate::NoParameters>,
            ) -> Result<crate::Decision, Self::Error> {
                unreachable!("never started")
            }
        }
        // The scripted API answers nothing: any request would fail the test.
        let api = crate::testing::ScriptedApi::new();
        let config = RuntimeConfig {
            metrics_address: None,
            shadow: Some(crate::shadow::ShadowScope::AllClusterQueues),
            ..Default::default()
        };
        let err = run_until(api.client(), Provisions, config, std::future::pending())
            .await
            .expect_err("refused");
        assert_eq!(err.label(), "config");
        assert!(
            err.to_string()
                .contains("example.com/provisions cannot run in shadow mode: it creates capacity"),
            "{err}"
        );
        assert!(api.requests().is_empty(), "nothing was asked of the API");
    }

    /// What the Workload watch handed on.
    struct Handed {
        changes: Vec<String>,
        deleted: Vec<String>,
        reconcile_all: usize,
        /// Each change, with whether the cache held that version (or a later one) when it was
        /// handed on.
        changes_cached: Vec<bool>,
    }

    fn wl(name: &str, version: &str) -> Workload {
        crate::testing::WorkloadBuilder::new("ns", name)
            .resource_version(version)
            .build()
    }

    /// Feeds `events` to the Workload watch of a replica that leads (or not) and collects what
    /// it hands on.
    async fn feed(events: Vec<watcher::Event<Workload>>, leading: bool) -> Handed {
        let (cache, writer) = reflector::store::<Workload>();
        let (changes_tx, mut changes_rx) = mpsc::channel(64);
        let (deleted_tx, mut deleted_rx) = mpsc::unbounded_channel();
        let (all_tx, mut all_rx) = mpsc::channel(8);
        let (_leading_tx, leading_rx) = watch::channel(leading);
        let watch = WorkloadWatch {
            events: futures::stream::iter(events.into_iter().map(Ok)),
            writer,
            cache: cache.clone(),
            synced: Default::default(),
            changes: changes_tx,
            deleted: deleted_tx,
            reconcile_all: all_tx,
            leading: leading_rx,
            own_writes: Default::default(),
        };
        // Checks, as each change arrives, that the cache already holds it.
        let cache_check = cache.clone();
        let collect = async move {
            let mut names = Vec::new();
            let mut cached = Vec::new();
            while let Some(w) = changes_rx.recv().await {
                // That version or a later one (the watch may have gone on meanwhile).
                let version = |w: &Workload| {
                    w.resource_version()
                        .and_then(|v| v.parse::<u64>().ok())
                        .unwrap_or_default()
                };
                let held = cache_check
                    .get(&reflector::ObjectRef::from_obj(&w))
                    .is_some_and(|c| version(&c) >= version(&w));
                names.push(w.name_any());
                cached.push(held);
            }
            (names, cached)
        };
        let ((), (changes, changes_cached)) = tokio::join!(watch_workloads(watch), collect);
        let mut deleted = Vec::new();
        while let Ok(w) = deleted_rx.try_recv() {
            deleted.push(w.name_any());
        }
        let mut reconcile_all = 0;
        while all_rx.try_recv().is_ok() {
            reconcile_all += 1;
        }
        Handed {
            changes,
            deleted,
            reconcile_all,
            changes_cached,
        }
    }

    #[tokio::test]
    async fn a_relist_reconciles_everything_once_the_cache_holds_it_and_releases_the_vanished() {
        use watcher::Event::*;
        let handed = feed(
            vec![
                Init,
                InitApply(wl("a", "1")),
                InitApply(wl("b", "1")),
                InitDone,
                Apply(wl("a", "2")),
                // The watch expires and lists again: "b" was deleted and "c" created (and
                // given quota) meanwhile; the cache still holds "a"@2 and "b" until InitDone.
                Init,
                InitApply(wl("a", "3")),
                InitApply(wl("c", "1")),
                InitDone,
                Apply(wl("c", "2")),
            ],
            true,
        )
        .await;
        // Only live changes are handed on, each already in the cache; nothing from a list,
        // which the cache does not hold until the list ends.
        assert_eq!(handed.changes, ["a", "c"]);
        assert!(handed.changes_cached.iter().all(|held| *held));
        // The first list is the leadership's reconcile of everything; the relist asks for one.
        assert_eq!(handed.reconcile_all, 1);
        // "b" vanished without a Delete event: released all the same.
        assert_eq!(handed.deleted, ["b"]);
    }

    #[tokio::test]
    async fn a_standby_hands_nothing_on() {
        use watcher::Event::*;
        let handed = feed(
            vec![
                Init,
                InitApply(wl("a", "1")),
                InitDone,
                Apply(wl("a", "2")),
                Init,
                InitDone,
                Delete(wl("x", "1")),
            ],
            false,
        )
        .await;
        assert!(handed.changes.is_empty());
        assert!(handed.deleted.is_empty());
        assert_eq!(handed.reconcile_all, 0);
    }
}

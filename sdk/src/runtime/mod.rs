//! The thin I/O shell around the crate's pure decision layer (`decide`): watches, reconcile,
//! status writes.
//!
//! [`run_until`] (this file) puts the parts together; each hop of the work has a file:
//! - `admission_checks`: the AdmissionCheck loop keeps the checks whose `controllerName` is
//!   ours in the registry (`check_registry`: resolving parameters, the `Active` condition;
//!   `claim`: which deployment answers), and asks for every Workload to be reconciled when one
//!   changes;
//! - `workloads`: the Workload watch keeps the cache every replica holds and hands changes and
//!   deletions on while this replica leads (`relist`: what a re-list means);
//!   `cluster_queue_watch` keeps the ClusterQueues, for a check that starts early;
//! - `lease` elects on a Lease; `leader_work` runs the leader's part: kube-runtime's controller
//!   (one reconcile at a time per Workload, backoff on errors) and the check's own tasks
//!   ([`Extensions`]);
//! - `reconcile` executes, for each (Workload, check) pair, the step that
//!   [`crate::lifecycle`] gives: `answer` asks the check and writes its answer (conflicts,
//!   refusals, holds; `status_write`: the entry and the attempt record written); `shadow`: the
//!   same, writing nothing; `unanswerable`: the hold of a check that cannot answer; `memory`:
//!   what is kept per Workload between reconciles; `own_writes`: our writes the cache lacks
//!   yet; `line`: the Workloads waiting to be reconciled, their changes and the turns
//!   (`--concurrency` at once, first come, first served, answers first, the waiting kept out of kube);
//! - `http` serves metrics and probes (`metrics`); `kueue_api` waits for a Kueue we can talk
//!   to; `tasks` ties every task to the run.
//!
//! Everything is event driven; the only timers are the ones a check asks for (recheck after,
//! revalidation), error backoff, and a sweep that takes back a turn granted and never taken.

mod admission_checks;
mod answer;
mod check_registry;
mod claim;
mod cluster_queue_watch;
mod config;
mod context;
mod http;
mod kueue_api;
mod leader_work;
mod lease;
mod line;
mod memory;
mod metrics;
mod metrics_auth;
mod own_writes;
mod reconcile;
mod relist;
mod shadow;
mod status_write;
mod tasks;
mod tls;
mod unanswerable;
mod workloads;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::FutureExt;
use kube::Client;

use kube::runtime::reflector;
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

pub use crate::extensions::{Extensions, LeaderContext, WorkloadWaker};
use config::Shutdown;
pub use config::{
    DEFAULT_EARLY_START_WAIT, DEFAULT_FIELD_MANAGER, DEFAULT_HEALTH_ADDRESS,
    DEFAULT_METRICS_ADDRESS, DEFAULT_PERMANENT_FAILURE_HOLD, MetricsSecurity, RuntimeConfig,
    TlsSource,
};
pub use lease::{LEASE_OWNER_ANNOTATION, LeaderElection, lease_name_for};
pub use metrics_auth::{METRICS_AUTH_CACHE_SIZE, METRICS_AUTH_CACHE_TTL};

use crate::api::Workload;
use crate::check::AdmissionCheckController;
use crate::error::Error;

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

/// How long a stop waits for the Events the reconciles handed over to be published.
const EVENT_FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

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
    refuse_shadow_mode(&controller, &config)?;
    let config = RuntimeConfig {
        early_start_wait: early_start_wait(&controller, &config),
        ..config
    };
    let extensions = controller.while_leading();
    let shutdown: Shutdown = shutdown.boxed().shared();
    let controller = Arc::new(controller);
    let registry: check_registry::Registry<C::Parameters> = Default::default();
    let (cache, cache_writer) = reflector::store::<Workload>();
    let (metrics, health) = observability(controller.as_ref(), &registry, cache.clone(), &config);
    // Bound before anything else starts, so a taken port fails the start with its reason.
    let server = http::start(&config, &health, &client).await?;
    let Some(leadership) = join(&client, &health, &config, &*controller, &shutdown).await? else {
        return Ok(());
    };
    let joined = Joined {
        client,
        controller,
        registry,
        cache: (cache, cache_writer),
        metrics,
        health,
        extensions,
        shutdown,
    };
    let outcome = serve(joined, &config, leadership.leading.clone()).await;
    leadership.release(RELEASE_TIMEOUT).await;
    drop(server);
    info!("stopped");
    outcome
}

/// What a replica has once it joined the election.
struct Joined<C: AdmissionCheckController> {
    client: Client,
    controller: Arc<C>,
    registry: check_registry::Registry<C::Parameters>,
    cache: (
        reflector::Store<Workload>,
        reflector::store::Writer<Workload>,
    ),
    metrics: Arc<metrics::Metrics>,
    health: Arc<http::Health>,
    extensions: Extensions,
    shutdown: Shutdown,
}

/// Runs a replica that joined: watches, and leads while it is the leader, until the shutdown
/// or a lost lead; then stops everything it started, so that the Lease can be released.
async fn serve<C: AdmissionCheckController>(
    j: Joined<C>,
    config: &RuntimeConfig,
    leading: watch::Receiver<bool>,
) -> Result<(), Error> {
    let Joined {
        client,
        controller,
        registry,
        cache: (cache, cache_writer),
        metrics,
        health,
        extensions,
        shutdown,
    } = j;
    // Aborted when this function returns or its future is dropped: nothing it started outlives it.
    let mut background = tasks::TaskGroup::default();
    background.push(tokio::spawn(leader_work::report_leadership(
        leading.clone(),
        metrics.clone(),
    )));
    let claim = config.leader_election.as_ref().map(claim::claim_of);
    let parts = Parts {
        client: &client,
        controller,
        registry: &registry,
        cache,
        metrics,
        health,
        claim: &claim,
        leading: &leading,
        config,
    };
    let watching = watch_everything(parts, cache_writer, &mut background);
    let events = watching.ctx.clone();
    let became_leader = leader_work::wait_to_lead(leading.clone(), &shutdown).await;
    let outcome = if became_leader {
        let leads = Leads::new(&client, config, &leading, extensions, shutdown);
        lead(watching, leads).await
    } else {
        Ok(())
    };
    // What the reconciles decided is told before the process goes.
    events.flush_events(EVENT_FLUSH_TIMEOUT).await;
    // Every receiver of the leadership channel must be gone before the Lease is released, and
    // nothing may write after it.
    background.stop().await;
    // A leader stopping cleanly (not one that lost its Lease) withdraws its claims while it
    // still holds the Lease, before a standby of its own could write them again.
    if became_leader && outcome.is_ok() {
        withdraw_claims(&client, config, claim.as_deref(), &registry).await;
    }
    // The leadership channel's receivers go with this function, before the Lease is released.
    outcome
}

/// Withdraws this deployment's claim (if it elects a leader) from every check of ours.
async fn withdraw_claims<P>(
    client: &Client,
    config: &RuntimeConfig,
    claim: Option<&str>,
    registry: &check_registry::Registry<P>,
) {
    if let Some(claim) = claim {
        let checks = check_registry::names(registry);
        admission_checks::withdraw_claims(client, &config.field_manager, claim, &checks).await;
    }
}

/// What the leader's part gets beside the watches.
struct Leads {
    client: Client,
    shadow: Option<crate::shadow::ShadowScope>,
    leading: watch::Receiver<bool>,
    extensions: Extensions,
    shutdown: Shutdown,
}

impl Leads {
    fn new(
        client: &Client,
        config: &RuntimeConfig,
        leading: &watch::Receiver<bool>,
        extensions: Extensions,
        shutdown: Shutdown,
    ) -> Self {
        Self {
            client: client.clone(),
            shadow: config.shadow.clone(),
            leading: leading.clone(),
            extensions,
            shutdown,
        }
    }
}

/// Leads (see [`leader_work::lead`]) once asked to reconcile everything.
async fn lead<C: AdmissionCheckController>(w: Watching<C>, l: Leads) -> Result<(), Error> {
    let _ = w.reconcile_all.try_send(());
    leader_work::lead(leader_work::Leading {
        ctx: w.ctx,
        client: l.client,
        cache: w.cache,
        shadow: l.shadow,
        cache_ready: w.cache_ready,
        changes: w.changes,
        reconcile_all: w.reconcile_all_asked,
        leading: l.leading,
        extensions: l.extensions,
        wake: w.wake,
        cluster_queues: w.cluster_queues,
        shutdown: l.shutdown,
    })
    .await
}

/// What every replica has once it joined: what [`watch_everything`] starts from.
struct Parts<'a, C: AdmissionCheckController> {
    client: &'a Client,
    controller: Arc<C>,
    registry: &'a check_registry::Registry<C::Parameters>,
    cache: reflector::Store<Workload>,
    metrics: Arc<metrics::Metrics>,
    health: Arc<http::Health>,
    claim: &'a Option<String>,
    leading: &'a watch::Receiver<bool>,
    config: &'a RuntimeConfig,
}

/// What the watches give the leader's part.
struct Watching<C: AdmissionCheckController> {
    ctx: Arc<context::Context<C>>,
    cache: reflector::Store<Workload>,
    cache_ready: watch::Receiver<bool>,
    changes: mpsc::Receiver<Workload>,
    reconcile_all: mpsc::Sender<()>,
    reconcile_all_asked: mpsc::Receiver<()>,
    wake: (
        mpsc::Sender<reflector::ObjectRef<Workload>>,
        mpsc::Receiver<reflector::ObjectRef<Workload>>,
    ),
    cluster_queues: crate::ClusterQueues,
}

/// What every reconcile shares, on this replica's caches.
fn reconcile_context<C: AdmissionCheckController>(
    p: &Parts<'_, C>,
    feed: &workloads::Feed,
    cluster_queues: crate::ClusterQueues,
) -> Arc<context::Context<C>> {
    let ctx = context::Context::new(
        p.client.clone(),
        p.controller.clone(),
        p.registry.clone(),
        p.config,
        p.metrics.clone(),
        feed.own_writes.clone(),
    );
    Arc::new(
        ctx.with_cache(p.cache.clone())
            .with_cluster_queues(cluster_queues)
            .with_events_in_background(),
    )
}

/// Starts the AdmissionCheck loop in `background`; returns what it notifies once every check
/// was synced.
fn start_check_sync<C: AdmissionCheckController>(
    p: &Parts<'_, C>,
    reconcile_all: &mpsc::Sender<()>,
    background: &mut tasks::TaskGroup,
) -> Arc<tokio::sync::Notify> {
    let checks_synced = Arc::new(tokio::sync::Notify::new());
    let check_sync = admission_checks::CheckSync {
        client: p.client.clone(),
        controller: p.controller.clone(),
        registry: p.registry.clone(),
        reconcile_all: reconcile_all.clone(),
        metrics: p.metrics.clone(),
        claim: p.claim.clone(),
        settings: p.config.into(),
    };
    background.push(tokio::spawn(
        check_sync.run(checks_synced.clone(), p.leading.clone()),
    ));
    checks_synced
}

/// Starts what every replica runs, in `background`: the AdmissionCheck loop, the Workload watch
/// (and the ClusterQueue watch for a check that starts early), readiness, and the releases of
/// deleted Workloads; returns what the leader's part needs.
fn watch_everything<C: AdmissionCheckController>(
    p: Parts<'_, C>,
    cache_writer: reflector::store::Writer<Workload>,
    background: &mut tasks::TaskGroup,
) -> Watching<C> {
    // One pending "reconcile everything" is enough: more would only repeat it.
    let (reconcile_all, reconcile_all_asked) = mpsc::channel::<()>(1);
    let checks_synced = start_check_sync(&p, &reconcile_all, background);
    let feed = workloads::start(
        p.client,
        (p.cache.clone(), cache_writer),
        p.controller.cached_pod_sets(),
        &reconcile_all,
        p.metrics.reserved_seen(),
        p.leading,
        background,
    );
    // Wakes from the check's tasks and the ClusterQueue watch.
    let (wake, woken) = mpsc::channel(1024);
    // Nothing waits for the queues: while they are unknown only the early start waits.
    let cluster_queues = match p.controller.starts_early() {
        true => cluster_queue_watch::start(
            p.client,
            p.metrics.clone(),
            p.cache.clone(),
            wake.clone(),
            p.leading.clone(),
            background,
        ),
        false => crate::ClusterQueues::default(),
    };
    let synced = Synced {
        workloads: feed.synced.clone(),
        checks: checks_synced,
    };
    let cache_ready = readiness(synced, p.health.clone(), background);
    let ctx = reconcile_context(&p, &feed, cluster_queues.clone());
    background.push(tokio::spawn(release_deleted(ctx.clone(), feed.deleted)));
    Watching {
        ctx,
        cache: p.cache,
        cache_ready,
        changes: feed.changes,
        reconcile_all,
        reconcile_all_asked,
        wake: (wake, woken),
        cluster_queues,
    }
}

/// Refuses shadow mode to a check that acts on the cluster when it decides.
fn refuse_shadow_mode<C: AdmissionCheckController>(
    controller: &C,
    config: &RuntimeConfig,
) -> Result<(), Error> {
    match (&config.shadow, controller.shadow_mode_refusal()) {
        (Some(_), Some(reason)) => Err(Error::Config(format!(
            "{} cannot run in shadow mode: {reason}",
            controller.controller_name()
        ))),
        _ => Ok(()),
    }
}

/// The wait for the entry after an early start: the configured one, cut to how long what the
/// check starts early lasts (a longer wait would keep it past its use), with a warning.
fn early_start_wait<C: AdmissionCheckController>(
    controller: &C,
    config: &RuntimeConfig,
) -> Duration {
    let configured = config.early_start_wait;
    match controller
        .early_work_lasts()
        .filter(|lasts| configured > *lasts)
    {
        Some(lasts) if controller.starts_early() => {
            warn!(
                configured_seconds = configured.as_secs(),
                used_seconds = lasts.as_secs(),
                "--early-start-wait-seconds is longer than what {} starts early lasts; waiting {}s \
                 for the entry instead",
                controller.controller_name(),
                lasts.as_secs()
            );
            lasts
        }
        _ => configured,
    }
}

/// The runtime's metrics and the check's own, and what the HTTP endpoints report.
fn observability<C: AdmissionCheckController>(
    controller: &C,
    registry: &check_registry::Registry<C::Parameters>,
    cache: reflector::Store<Workload>,
    config: &RuntimeConfig,
) -> (Arc<metrics::Metrics>, Arc<http::Health>) {
    let mut prometheus = prometheus_client::registry::Registry::default();
    let names = registry.clone();
    let check_names = Arc::new(move || check_registry::names(&names));
    let metrics = metrics::Metrics::new(&mut prometheus, cache, check_names);
    if controller.starts_early() {
        metrics.register_cluster_queues(&mut prometheus);
    }
    let metrics = Arc::new(if config.shadow.is_some() {
        metrics.in_shadow_mode()
    } else {
        metrics
    });
    controller.register_metrics(&mut prometheus);
    (metrics, Arc::new(http::Health::new(prometheus)))
}

/// Waits until Kueue serves the API version we speak, then joins the leader election (if any).
/// `None` if `shutdown` came first: the run ends cleanly.
async fn join(
    client: &Client,
    health: &http::Health,
    config: &RuntimeConfig,
    controller: &impl AdmissionCheckController,
    shutdown: &Shutdown,
) -> Result<Option<lease::Leadership>, Error> {
    // Against a Kueue without the API version we speak, watches would only fail with 404:
    // say which Kueue is needed and wait for it (an upgrade needs no restart of ours).
    tokio::select! {
        () = kueue_api::wait_until_served(client, health) => {}
        () = shutdown.clone() => {
            info!("stopped while waiting for the Kueue API");
            return Ok(None);
        }
    }
    let Some(election) = &config.leader_election else {
        return Ok(Some(lease::Leadership::always()));
    };
    // Joining waits out an unreachable API server; a stop meanwhile ends the run cleanly.
    tokio::select! {
        joined = lease::Leadership::elect(client.clone(), election, controller.controller_name()) => joined.map(Some),
        () = shutdown.clone() => {
            info!("stopped before joining the leader election");
            Ok(None)
        }
    }
}

/// The first complete list of each watch (InitDone, seen on the streams themselves).
struct Synced {
    workloads: Arc<tokio::sync::Notify>,
    checks: Arc<tokio::sync::Notify>,
}

/// Marks the runtime ready once the Workload and AdmissionCheck watches delivered their first
/// complete list (not the ClusterQueues': unknown queues cost only the early start, and a
/// refused watch of them must not keep a replica unready). Returns our own "Workload cache
/// complete" flag: kube's `Store::wait_until_ready` can miss its
/// wake-up when several tasks wait on it at once (one waker is kept), so tasks wait on this.
fn readiness(
    synced: Synced,
    health: Arc<http::Health>,
    background: &mut tasks::TaskGroup,
) -> watch::Receiver<bool> {
    let (cache_ready_tx, cache_ready) = watch::channel(false);
    let Synced {
        workloads: workloads_synced,
        checks: checks_synced,
    } = synced;
    background.push(tokio::spawn(async move {
        workloads_synced.notified().await;
        let _ = cache_ready_tx.send(true);
        // Kept until the runtime stops, so waiters never see the channel closed.
        let _keep = cache_ready_tx;
        checks_synced.notified().await;
        health.ready.store(true, Ordering::Release);
        info!("caches synced, ready");
    }));
    cache_ready
}

/// A deleted Workload never reaches the reconciler again: releases what its checks hold here.
async fn release_deleted<C: AdmissionCheckController>(
    ctx: Arc<context::Context<C>>,
    mut deleted: mpsc::UnboundedReceiver<Workload>,
) {
    while let Some(wl) = deleted.recv().await {
        reconcile::release_deleted(&ctx, &wl).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_for_the_entry_is_cut_to_what_the_early_work_lasts() {
        struct Books(bool);
        impl AdmissionCheckController for Books {
            type Parameters = crate::check::NoParameters;
            type Error = std::convert::Infallible;
            fn controller_name(&self) -> &str {
                "example.com/books"
            }
            fn starts_early(&self) -> bool {
                self.0
            }
            fn early_work_lasts(&self) -> Option<Duration> {
                Some(Duration::from_secs(600))
            }
            async fn decide(
                &self,
                _: &crate::check::CheckContext<'_, crate::check::NoParameters>,
            ) -> Result<crate::check::Decision, Self::Error> {
                unreachable!("never asked")
            }
        }
        let waiting = |secs| RuntimeConfig {
            early_start_wait: Duration::from_secs(secs),
            ..Default::default()
        };
        assert_eq!(
            early_start_wait(&Books(true), &waiting(900)),
            Duration::from_secs(600)
        );
        assert_eq!(
            early_start_wait(&Books(true), &waiting(300)),
            Duration::from_secs(300)
        );
        // A check that does not start early waits for nothing: the setting is left alone.
        assert_eq!(
            early_start_wait(&Books(false), &waiting(900)),
            Duration::from_secs(900)
        );
    }

    #[tokio::test]
    async fn unusable_metrics_settings_stop_the_start_with_their_reason() {
        struct Quiet;
        impl AdmissionCheckController for Quiet {
            type Parameters = crate::check::NoParameters;
            type Error = std::convert::Infallible;
            fn controller_name(&self) -> &str {
                "example.com/quiet"
            }
            async fn decide(
                &self,
                _: &crate::check::CheckContext<'_, crate::check::NoParameters>,
            ) -> Result<crate::check::Decision, Self::Error> {
                unreachable!("never started")
            }
        }
        let local = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
        let missing = std::env::temp_dir().join("sdk-no-such-dir/tls.crt");
        let files = RuntimeConfig {
            metrics_address: Some(local),
            health_address: None,
            metrics_security: MetricsSecurity::Authenticated {
                tls: TlsSource::Files {
                    cert: missing.clone(),
                    key: missing.with_file_name("tls.key"),
                },
            },
            ..Default::default()
        };
        let shared = std::net::SocketAddr::from(([127, 0, 0, 1], 9));
        let one_address = RuntimeConfig {
            metrics_address: Some(shared),
            health_address: Some(shared),
            ..Default::default()
        };
        for (config, why) in [
            (files, missing.display().to_string()),
            (one_address, "--health-address".to_string()),
        ] {
            // The scripted API answers nothing: any request would fail the test.
            let api = crate::testing::ScriptedApi::new();
            let err = run_until(api.client(), Quiet, config, std::future::pending())
                .await
                .expect_err("refused");
            assert_eq!(err.label(), "config");
            assert!(err.to_string().contains(&why), "{err}");
            assert!(api.requests().is_empty(), "nothing was asked of the API");
        }
    }

    #[tokio::test]
    async fn a_check_that_refuses_shadow_mode_stops_the_start_with_its_reason() {
        struct Provisions;
        impl AdmissionCheckController for Provisions {
            type Parameters = crate::check::NoParameters;
            type Error = std::convert::Infallible;
            fn controller_name(&self) -> &str {
                "example.com/provisions"
            }
            fn shadow_mode_refusal(&self) -> Option<String> {
                Some("it creates capacity".into())
            }
            async fn decide(
                &self,
                _: &crate::check::CheckContext<'_, crate::check::NoParameters>,
            ) -> Result<crate::check::Decision, Self::Error> {
                unreachable!("never started")
            }
        }
        // The scripted API answers nothing: any request would fail the test.
        let api = crate::testing::ScriptedApi::new();
        let config = RuntimeConfig {
            metrics_address: None,
            health_address: None,
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
}

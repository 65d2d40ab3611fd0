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
mod http;
mod metrics;
mod reconcile;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::api::{AdmissionCheck, Workload};
use crate::check::AdmissionCheckController;
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
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            metrics_address: Some(std::net::SocketAddr::from(([0, 0, 0, 0], 8080))),
            field_manager: "kueue-admission-sdk".into(),
            concurrency: 8,
        }
    }
}

/// Runs `controller` until the process gets SIGTERM or Ctrl-C.
pub async fn run<C: AdmissionCheckController>(
    client: Client,
    controller: C,
    config: RuntimeConfig,
) -> Result<(), Error> {
    let registry: checks::Registry<C::Parameters> = Default::default();
    let controller = Arc::new(controller);
    let (trigger_tx, trigger_rx) = mpsc::channel::<()>(16);

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
    let metrics = Arc::new(metrics::Metrics::new(
        &mut prometheus,
        reader.clone(),
        check_names,
    ));
    let health = Arc::new(http::Health {
        registry: prometheus,
        ready: Default::default(),
    });
    // Bind before anything else starts, so a taken port fails the start with its reason.
    let server = match config.metrics_address {
        Some(addr) => Some(tokio::spawn(http::serve(
            http::bind(addr).await.map_err(Error::Serve)?,
            health.clone(),
        ))),
        None => None,
    };

    let checks_synced = Arc::new(tokio::sync::Notify::new());
    let checks_loop = tokio::spawn(watch_admission_checks(
        client.clone(),
        controller.clone(),
        registry.clone(),
        config.field_manager.clone(),
        trigger_tx,
        metrics.clone(),
        checks_synced.clone(),
    ));
    // Ready once both watches delivered their first complete list (InitDone), seen on the
    // streams themselves.
    let workloads_synced = Arc::new(tokio::sync::Notify::new());
    let readiness = {
        let (workloads_synced, health) = (workloads_synced.clone(), health.clone());
        tokio::spawn(async move {
            workloads_synced.notified().await;
            checks_synced.notified().await;
            health
                .ready
                .store(true, std::sync::atomic::Ordering::Release);
            info!("caches synced, ready");
        })
    };

    let workloads = watcher(
        Api::<Workload>::all(client.clone()),
        watcher::Config::default().any_semantic(),
    )
    .default_backoff()
    // The cache keeps only what the runtime reads.
    .modify(|wl| {
        wl.managed_fields_mut().clear();
        wl.annotations_mut()
            .remove("kubectl.kubernetes.io/last-applied-configuration");
    })
    .inspect(move |event| {
        if matches!(event, Ok(watcher::Event::InitDone)) {
            workloads_synced.notify_one();
        }
    })
    .reflect(writer)
    .touched_objects();
    let trigger = tokio_stream::wrappers::ReceiverStream::new(trigger_rx);
    let recorder = Recorder::new(client.clone(), Reporter::from(config.field_manager.clone()));
    let ctx = Arc::new(reconcile::Context {
        client,
        controller,
        registry,
        field_manager: config.field_manager,
        recorder,
        asked: Default::default(),
        metrics,
    });
    Controller::for_stream(workloads, reader)
        .with_config(ControllerConfig::default().concurrency(config.concurrency))
        .reconcile_all_on(trigger)
        .shutdown_on_signal()
        .run(reconcile::reconcile, reconcile::error_policy, ctx)
        .for_each(|res| async move {
            if let Err(e) = res {
                warn!(error = %e, "workload reconcile failed");
            }
        })
        .await;
    checks_loop.abort();
    readiness.abort();
    if let Some(server) = server {
        server.abort();
    }
    info!("stopped");
    Ok(())
}

/// Keeps the registry of our checks and their `Active` conditions in line with the cluster.
async fn watch_admission_checks<C: AdmissionCheckController>(
    client: Client,
    controller: Arc<C>,
    registry: checks::Registry<C::Parameters>,
    field_manager: String,
    trigger: mpsc::Sender<()>,
    metrics: Arc<metrics::Metrics>,
    synced: Arc<tokio::sync::Notify>,
) {
    let api = Api::<AdmissionCheck>::all(client.clone());
    let mut events = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                warn!(error = %e, "watching AdmissionChecks");
                continue;
            }
        };
        match event {
            watcher::Event::Apply(ac) | watcher::Event::InitApply(ac) => {
                if ac.spec.controller_name != controller.controller_name() {
                    continue;
                }
                sync_check(
                    &client,
                    controller.as_ref(),
                    &registry,
                    &field_manager,
                    &ac,
                    &metrics,
                )
                .await;
            }
            watcher::Event::Delete(ac) => {
                write_registry(&registry).remove(&ac.name_any());
                metrics.check_active(&ac.name_any(), None);
            }
            watcher::Event::InitDone => synced.notify_one(),
            watcher::Event::Init => {}
        }
        // A check appeared, changed or went away: every Workload may now be decided differently.
        let _ = trigger.try_send(());
    }
}

async fn sync_check<C: AdmissionCheckController>(
    client: &Client,
    controller: &C,
    registry: &checks::Registry<C::Parameters>,
    field_manager: &str,
    ac: &AdmissionCheck,
    metrics: &metrics::Metrics,
) {
    let name = ac.name_any();
    let resolved = match checks::resolve(client, controller, ac).await {
        Ok(active) => Ok(Arc::new(active)),
        Err(Ok(inactive)) => {
            warn!(check = %name, reason = inactive.reason, message = %inactive.message, "admission check inactive");
            Err(inactive)
        }
        Err(Err(e)) => {
            // Transient: keep what we knew; the watch's next event or resync retries.
            warn!(check = %name, error = %e, "resolving parameters");
            return;
        }
    };
    let state = resolved.as_ref().map(|_| ()).map_err(Clone::clone);
    metrics.check_active(&name, Some(state.is_ok()));
    write_registry(registry).insert(name.clone(), resolved);
    if let Some(condition) =
        checks::desired_active_condition(ac, &state, k8s_openapi::jiff::Timestamp::now())
        && let Err(e) = checks::apply_active_condition(client, field_manager, ac, condition).await
    {
        warn!(check = %name, error = %e, "writing the Active condition");
    }
}

fn write_registry<P>(
    registry: &checks::Registry<P>,
) -> std::sync::RwLockWriteGuard<'_, checks::CheckMap<P>> {
    // A panic while holding the lock cannot leave the map half-updated: every write is one insert
    // or remove. So a poisoned lock is still safe to use.
    registry.write().unwrap_or_else(|p| p.into_inner())
}

/// Delay before a Workload is reconciled again after an error.
pub(crate) const ERROR_REQUEUE: Duration = Duration::from_secs(5);

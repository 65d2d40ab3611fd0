//! Work a controller runs beside the runtime: watching the objects its check creates, waking the
//! Workloads they belong to, reconciling what it holds.

use std::future::Future;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, Stream};
use kube::Client;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::mpsc;
use tracing::warn;

use crate::api::Workload;

/// Tasks started when this replica takes the lead and its Workload cache has its first complete
/// list, beside the Workload reconciler, and stopped (dropped) with the runtime. A task that
/// returns early is logged, not restarted. A check declares them in
/// [`AdmissionCheckController::while_leading`](crate::AdmissionCheckController::while_leading).
///
/// ```no_run
/// # use std::time::Duration;
/// # use kueue_admission_sdk::extensions::{Extensions, LeaderContext};
/// let extensions = Extensions::new()
///     .while_leading("watch-my-objects", |ctx: LeaderContext| async move {
///         // Runs as long as this replica leads, e.g. a watch that wakes Workloads.
///         # let _ = ctx;
///     })
///     .every("sweep", Duration::from_secs(300), |ctx: LeaderContext| async move {
///         // The Workload cache is complete: e.g. reclaim what deleted Workloads still hold.
///         let live = ctx.workloads.state().len();
///         # let _ = live;
///         Ok::<(), std::convert::Infallible>(())
///     });
/// ```
#[derive(Default)]
pub struct Extensions {
    pub(crate) tasks: Vec<(String, LeaderTask)>,
}

pub(crate) type LeaderTask = Box<dyn FnOnce(LeaderContext) -> BoxFuture<'static, ()> + Send>;

impl std::fmt::Debug for Extensions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.tasks.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("Extensions").field("tasks", &names).finish()
    }
}

impl Extensions {
    /// No extra work.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `task` while this replica leads (from taking the Lease until the runtime stops; a
    /// replica that loses the Lease stops altogether). `name` appears in logs.
    pub fn while_leading<F, Fut>(mut self, name: impl Into<String>, task: F) -> Self
    where
        F: FnOnce(LeaderContext) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.tasks
            .push((name.into(), Box::new(move |ctx| task(ctx).boxed())));
        self
    }

    /// Runs `task` once when this replica takes the lead, then every `period` (at least a
    /// second) while it leads. A run that overruns its period delays the next, never overlaps
    /// it; a failed run is logged with `name` and the next comes at its time.
    pub fn every<F, Fut, T, E>(self, name: impl Into<String>, period: Duration, task: F) -> Self
    where
        F: Fn(LeaderContext) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        E: std::fmt::Display,
    {
        let name = name.into();
        let label = name.clone();
        let period = period.max(MIN_PERIOD);
        self.while_leading(name, move |ctx| async move {
            let mut ticks = tokio::time::interval(period);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                if let Err(e) = task(ctx.clone()).await {
                    warn!(task = %label, error = %e, "a periodic task failed; it runs again in {period:?}");
                }
            }
        })
    }
}

/// The shortest period of [`Extensions::every`]: a zero would spin.
const MIN_PERIOD: Duration = Duration::from_secs(1);

/// What a [`Extensions::while_leading`] task gets.
#[derive(Clone)]
pub struct LeaderContext {
    /// The runtime's client (with its rate limit).
    pub client: Client,
    /// The runtime's Workload cache (all namespaces; without managedFields, and without podsets
    /// where [`crate::AdmissionCheckController::cached_pod_sets`] says), complete
    /// when the task starts: a Workload missing from it is gone (or created after the last event seen).
    /// Don't call [`Store::wait_until_ready`]: concurrent waiters on it can miss their wake-up.
    pub workloads: Store<Workload>,
    /// Asks the runtime to reconcile a Workload now.
    pub waker: WorkloadWaker,
    /// The runtime runs in shadow mode, in this scope (see [`crate::holding::stale_reason`]).
    pub shadow: Option<crate::shadow::ShadowScope>,
    /// The ClusterQueues, watched when the check
    /// [starts early](crate::AdmissionCheckController::starts_early): whether a Workload's
    /// entry for a check is still to come (see [`crate::holding::stale_reason_expecting_entry`]).
    pub cluster_queues: crate::ClusterQueues,
}

impl std::fmt::Debug for LeaderContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderContext").finish_non_exhaustive()
    }
}

/// Asks the runtime to reconcile a Workload (and so ask its checks again) because something the
/// check depends on changed, e.g. an object it created got a new status. Wakes for the same
/// Workload that arrive while it is queued are merged.
#[derive(Clone, Debug)]
pub struct WorkloadWaker(pub(crate) mpsc::Sender<ObjectRef<Workload>>);

impl WorkloadWaker {
    /// Queues the Workload `namespace/name`. Waits while the queue is full; does nothing once
    /// the runtime is stopping.
    pub async fn wake(&self, namespace: &str, name: &str) {
        let _ = self.0.send(ObjectRef::new(name).within(namespace)).await;
    }

    /// A waker whose wakes go to the returned stream; for unit tests of a task.
    pub fn for_tests(capacity: usize) -> (Self, impl Stream<Item = ObjectRef<Workload>>) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        (Self(tx), tokio_stream::wrappers::ReceiverStream::new(rx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn leader_context() -> LeaderContext {
        let (reader, _writer) = kube::runtime::reflector::store::<Workload>();
        LeaderContext {
            client: crate::testing::offline_client(),
            workloads: reader,
            waker: WorkloadWaker::for_tests(1).0,
            shadow: None,
            cluster_queues: Default::default(),
        }
    }

    /// Runs the only task of `extensions` for `for_how_long` of paused time.
    async fn run_for(extensions: Extensions, for_how_long: Duration) {
        let mut tasks = extensions.tasks;
        assert_eq!(tasks.len(), 1);
        let (_, task) = tasks.remove(0);
        let _ = tokio::time::timeout(for_how_long, task(leader_context())).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_periodic_task_runs_at_once_then_each_period_and_survives_its_failures() {
        let runs = Arc::new(AtomicU32::new(0));
        let counted = runs.clone();
        let extensions = Extensions::new().every("sweep", Duration::from_secs(10), move |_ctx| {
            let run = counted.fetch_add(1, Ordering::SeqCst);
            async move {
                // Every other run fails; the next still comes.
                if run % 2 == 1 {
                    Err("the ledger is busy")
                } else {
                    Ok(())
                }
            }
        });
        // At 0, 10, 20 and 30 s; not yet at 40.
        run_for(extensions, Duration::from_secs(35)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_period_is_taken_as_a_second() {
        let runs = Arc::new(AtomicU32::new(0));
        let counted = runs.clone();
        let extensions = Extensions::new().every("spin", Duration::ZERO, move |_ctx| {
            counted.fetch_add(1, Ordering::SeqCst);
            async { Ok::<(), std::convert::Infallible>(()) }
        });
        run_for(extensions, Duration::from_millis(2_500)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 3);
    }
}

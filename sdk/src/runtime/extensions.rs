//! Work a controller runs beside the runtime: watching the objects its check creates, waking the
//! Workloads they belong to, reconciling what it holds.

use std::future::Future;

use futures::future::BoxFuture;
use futures::{FutureExt, Stream};
use kube::Client;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::mpsc;

use crate::api::Workload;

/// Tasks started when this replica takes the lead and its Workload cache has its first complete
/// list, beside the Workload reconciler, and stopped (dropped) with the runtime. A task that
/// returns early is logged, not restarted.
///
/// ```no_run
/// # use kueue_admission_sdk::runtime::{Extensions, LeaderContext};
/// let extensions = Extensions::new().while_leading("sweep", |ctx: LeaderContext| async move {
///     // The Workload cache is complete: e.g. reclaim what deleted Workloads still hold.
///     let live = ctx.workloads.state().len();
///     # let _ = live;
/// });
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
}

/// What a [`Extensions::while_leading`] task gets.
#[derive(Clone)]
pub struct LeaderContext {
    /// The runtime's client (with its rate limit).
    pub client: Client,
    /// The runtime's Workload cache (all namespaces; managedFields stripped), complete when the
    /// task starts: a Workload missing from it is gone (or created after the last event seen).
    /// Don't call [`Store::wait_until_ready`]: concurrent waiters on it can miss their wake-up.
    pub workloads: Store<Workload>,
    /// Asks the runtime to reconcile a Workload now.
    pub waker: WorkloadWaker,
    /// The runtime runs in shadow mode, in this scope (see [`crate::shadow::no_longer_needed`]).
    pub shadow: Option<crate::shadow::ShadowScope>,
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

//! Tasks that live exactly as long as the runtime: aborted when dropped, awaited when stopped.

/// A task aborted when dropped.
pub(super) struct AbortOnDrop<T>(Option<tokio::task::JoinHandle<T>>);

impl<T> AbortOnDrop<T> {
    pub(super) fn new(task: tokio::task::JoinHandle<T>) -> Self {
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
pub(super) struct TaskGroup(Vec<AbortOnDrop<()>>);

impl TaskGroup {
    pub(super) fn push(&mut self, task: tokio::task::JoinHandle<()>) {
        self.0.push(AbortOnDrop::new(task));
    }

    pub(super) async fn stop(self) {
        for task in self.0 {
            task.stop().await;
        }
    }
}

//! The Workload changes the reconciler has taken from the watch and not reconciled yet, each
//! with the time it was taken: the queue metrics (`kueue_ac_reconcile_queue_depth`,
//! `kueue_ac_reconcile_queue_wait_seconds`) that tell whether a lag is in this process or
//! before it (the API server's watch, Kueue).
//!
//! Keyed as kube's queue is (namespace and name: several changes of one Workload wait as one,
//! since its oldest), and emptied the three ways a queued change ends: a reconcile starts and
//! reads it, kube finds the Workload gone before its reconcile, or the reconciler stops.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::runtime::memory::lock;

/// A Workload by namespace and name.
type WorkloadKey = (String, String);

/// Changes waiting for a reconcile, by Workload: since when the oldest waits.
#[derive(Debug, Default)]
pub(crate) struct QueuedChanges(Mutex<HashMap<WorkloadKey, Instant>>);

impl QueuedChanges {
    /// The reconciler took a change of `namespace/name` at `now`. Returns how many Workloads
    /// wait.
    pub fn taken(&self, namespace: &str, name: &str, now: Instant) -> usize {
        let mut waiting = lock(&self.0);
        waiting
            .entry((namespace.to_string(), name.to_string()))
            .or_insert(now);
        waiting.len()
    }

    /// A reconcile of `namespace/name` starts at `now`: how long its oldest change waited (none
    /// if no change waited: a requeue, a wake, a reconcile of everything), and how many
    /// Workloads still wait.
    pub fn reconciling(
        &self,
        namespace: &str,
        name: &str,
        now: Instant,
    ) -> (Option<Duration>, usize) {
        let mut waiting = lock(&self.0);
        let since = waiting.remove(&(namespace.to_string(), name.to_string()));
        (
            since.map(|s| now.saturating_duration_since(s)),
            waiting.len(),
        )
    }

    /// kube found `namespace/name` gone before its reconcile: its changes need none. Returns
    /// how many Workloads still wait.
    pub fn gone(&self, namespace: &str, name: &str) -> usize {
        let mut waiting = lock(&self.0);
        waiting.remove(&(namespace.to_string(), name.to_string()));
        waiting.len()
    }

    /// The reconciler stopped (the lead ended): nothing waits for it any more.
    pub fn clear(&self) {
        lock(&self.0).clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A queue that took a change of each `namespace/name` at the instant returned.
    fn taken_at_once(workloads: &[(&str, &str)]) -> (QueuedChanges, Instant) {
        let (queued, start) = (QueuedChanges::default(), Instant::now());
        for (namespace, name) in workloads {
            queued.taken(namespace, name, start);
        }
        (queued, start)
    }

    #[test]
    fn a_workload_waits_once_since_its_oldest_change() {
        let (queued, start) = taken_at_once(&[("ns", "a"), ("other", "a")]);
        let later = start + Duration::from_secs(2);
        assert_eq!(queued.taken("ns", "a", later), 2, "one entry per Workload");
        let (waited, left) = queued.reconciling("ns", "a", start + Duration::from_secs(5));
        assert_eq!((waited, left), (Some(Duration::from_secs(5)), 1));
        // A second reconcile without a change in between read nothing that waited.
        let (again, _) = queued.reconciling("ns", "a", start + Duration::from_secs(6));
        assert_eq!(again, None);
    }

    #[test]
    fn a_gone_workload_and_a_stop_leave_nothing_waiting() {
        let (queued, start) = taken_at_once(&[("ns", "deleted"), ("ns", "kept")]);
        assert_eq!(queued.gone("ns", "deleted"), 1);
        queued.clear();
        assert_eq!(queued.taken("ns", "next", start), 1);
    }
}

//! Which checks a Workload's ClusterQueue applies to it: what the runtime reads to start a
//! check's work before Kueue adds its entry
//! ([`AdmissionCheckController::start_early`](crate::AdmissionCheckController::start_early)).

use kube::runtime::reflector::{self, ObjectRef, Store};

use crate::api::{ClusterQueue, Workload};
use crate::decide::queue_applies_check;

/// The ClusterQueues, as the runtime's cache holds them. Empty (nothing applies) unless the
/// check [starts early](crate::AdmissionCheckController::starts_early), since only then are
/// they watched.
#[derive(Clone, Default)]
pub struct ClusterQueues(Option<Store<ClusterQueue>>);

impl std::fmt::Debug for ClusterQueues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cached = self.0.as_ref().map(|s| s.state().len());
        f.debug_struct("ClusterQueues")
            .field("cached", &cached)
            .finish()
    }
}

impl ClusterQueues {
    /// The queues of `store` (filled by a watch).
    pub(crate) fn cached(store: Store<ClusterQueue>) -> Self {
        Self(Some(store))
    }

    /// A fixed set of queues, for tests of a check or a task.
    pub fn for_tests(queues: impl IntoIterator<Item = ClusterQueue>) -> Self {
        let (store, mut writer) = reflector::store();
        for queue in queues {
            writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(queue));
        }
        Self(Some(store))
    }

    /// Whether the ClusterQueue that reserved `wl`'s quota lists `check` for the flavors it
    /// was assigned: a rule for the check whose `onFlavors` is empty or names a flavor assigned to
    /// some podset, the rule by which Kueue adds the entry. `false` without a reservation, for a queue
    /// not (yet) in the cache, and when the queues are not watched.
    pub fn check_applies(&self, wl: &Workload, check: &str) -> bool {
        let Some(store) = &self.0 else { return false };
        let Some(admission) = wl.status.as_ref().and_then(|s| s.admission.as_ref()) else {
            return false;
        };
        store
            .get(&ObjectRef::new(&admission.cluster_queue))
            .is_some_and(|queue| queue_applies_check(&queue.spec, check, wl))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{WorkloadBuilder, cluster_queue as queue};

    fn reserved(queue: &str, flavor: &str) -> Workload {
        WorkloadBuilder::new("ns", "w")
            .pod_set("main", 1, "1")
            .quota_reserved(queue, flavor)
            .build()
    }

    #[test]
    fn a_check_applies_by_its_rule_in_the_queue_that_reserved() {
        let queues = ClusterQueues::for_tests([
            queue("all", &[("c", &[])]),
            queue("gpus", &[("c", &["gpu"]), ("other", &[])]),
            queue("none", &[("other", &[])]),
        ]);
        assert!(queues.check_applies(&reserved("all", "cpu"), "c"));
        assert!(queues.check_applies(&reserved("gpus", "gpu"), "c"));
        assert!(
            !queues.check_applies(&reserved("gpus", "cpu"), "c"),
            "onFlavors excludes the flavor assigned"
        );
        assert!(!queues.check_applies(&reserved("none", "cpu"), "c"));
        assert!(
            !queues.check_applies(&reserved("unknown", "cpu"), "c"),
            "a queue not in the cache"
        );
        let no_quota = WorkloadBuilder::new("ns", "w").build();
        assert!(!queues.check_applies(&no_quota, "c"));
        assert!(!ClusterQueues::default().check_applies(&reserved("all", "cpu"), "c"));
    }
}

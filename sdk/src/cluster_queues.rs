//! Which checks a Workload's ClusterQueue applies to it: what the runtime reads to start a
//! check's work before Kueue adds its entry
//! ([`AdmissionCheckController::start_early`](crate::AdmissionCheckController::start_early)).

use std::sync::{Arc, RwLock};

use kube::runtime::reflector::{self, ObjectRef, Store};

use crate::api::{ClusterQueue, Workload};
use crate::decide::FlavorRule;

/// The ClusterQueues, as the runtime's cache holds them. Empty (nothing applies) unless the
/// check [starts early](crate::AdmissionCheckController::starts_early), since only then are
/// they watched.
#[derive(Clone, Default)]
pub struct ClusterQueues(Option<Watched>);

#[derive(Clone)]
struct Watched {
    store: Store<ClusterQueue>,
    known: Arc<RwLock<Known>>,
}

/// Whether the watch's cache can be trusted now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Known {
    /// The first list has not ended yet.
    Listing,
    /// Listed, and not refused since.
    Synced,
    /// The API server refused the list or the watch: its message.
    Refused(String),
}

/// Whether a Workload's ClusterQueue applies a check to it, as far as this replica knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueRule {
    /// The queue that reserved the quota lists the check for the flavors assigned: Kueue will
    /// add the entry.
    Applies,
    /// It does not (or the Workload holds no quota, or its queue is gone): no entry will come.
    DoesNotApply,
    /// The queues are not known now (their watch has not listed them yet, or is refused):
    /// neither is assumed. Nothing is started early, and nothing started is released for it.
    Unknown,
}

impl std::fmt::Debug for ClusterQueues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cached = self.0.as_ref().map(|w| w.store.state().len());
        f.debug_struct("ClusterQueues")
            .field("cached", &cached)
            .field("unknown_because", &self.unknown_because())
            .finish()
    }
}

impl ClusterQueues {
    /// The queues of `store` (filled by a watch), trusted once `known` says so.
    pub(crate) fn watched(store: Store<ClusterQueue>, known: Arc<RwLock<Known>>) -> Self {
        Self(Some(Watched { store, known }))
    }

    /// The queues of `store`, trusted as they are.
    #[cfg(test)]
    pub(crate) fn cached(store: Store<ClusterQueue>) -> Self {
        Self::watched(store, Arc::new(RwLock::new(Known::Synced)))
    }

    /// A fixed set of queues, for tests of a check or a task.
    pub fn for_tests(queues: impl IntoIterator<Item = ClusterQueue>) -> Self {
        let (store, mut writer) = reflector::store();
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Init);
        for queue in queues {
            writer.apply_watcher_event(&kube::runtime::watcher::Event::InitApply(queue));
        }
        writer.apply_watcher_event(&kube::runtime::watcher::Event::InitDone);
        Self::watched(store, Arc::new(RwLock::new(Known::Synced)))
    }

    /// Queues whose watch has not listed them yet, for tests of a check or a task.
    pub fn unknown_for_tests() -> Self {
        let (store, _) = reflector::store();
        Self::watched(store, Arc::new(RwLock::new(Known::Listing)))
    }

    /// Whether the ClusterQueue that reserved `wl`'s quota lists `check` for the flavors it
    /// was assigned, by the rule by which Kueue adds the entry
    /// ([`crate::FlavorRule::EARLY_START`]). [`QueueRule::Unknown`] while the watch has not listed the
    /// queues or is refused; [`QueueRule::DoesNotApply`] when the queues are not watched.
    pub fn rule_for(&self, wl: &Workload, check: &str) -> QueueRule {
        let Some(watched) = &self.0 else {
            return QueueRule::DoesNotApply;
        };
        if *watched.known.read().unwrap_or_else(|p| p.into_inner()) != Known::Synced {
            return QueueRule::Unknown;
        }
        let Some(admission) = wl.status.as_ref().and_then(|s| s.admission.as_ref()) else {
            return QueueRule::DoesNotApply;
        };
        let queue = watched.store.get(&ObjectRef::new(&admission.cluster_queue));
        match queue.is_some_and(|queue| FlavorRule::EARLY_START.applies(&queue.spec, check, wl)) {
            true => QueueRule::Applies,
            false => QueueRule::DoesNotApply,
        }
    }

    /// Whether the queue is known to apply the check ([`Self::rule_for`] is
    /// [`QueueRule::Applies`]): `false` without a reservation, for a queue not in the cache,
    /// while the queues are not known, and when they are not watched.
    pub fn check_applies(&self, wl: &Workload, check: &str) -> bool {
        self.rule_for(wl, check) == QueueRule::Applies
    }

    /// Why the queues are not known now (`None`: known, or not watched): for messages.
    pub fn unknown_because(&self) -> Option<String> {
        let watched = self.0.as_ref()?;
        match &*watched.known.read().unwrap_or_else(|p| p.into_inner()) {
            Known::Synced => None,
            Known::Listing => Some(format!("the watch of {RESOURCE} has not listed them yet")),
            Known::Refused(message) => Some(format!(
                "this controller may not list and watch {RESOURCE} ({message})"
            )),
        }
    }
}

/// The resource, as messages name it.
pub(crate) const RESOURCE: &str = "clusterqueues.kueue.x-k8s.io";

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
            queue("all", &["cpu"], &[("c", &[])]),
            queue("gpus", &["cpu", "gpu"], &[("c", &["gpu"]), ("other", &[])]),
            queue("none", &["cpu"], &[("other", &[])]),
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

    #[test]
    fn queues_not_listed_or_refused_are_unknown_not_empty() {
        let (store, mut writer) = reflector::store();
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(queue(
            "all",
            &["cpu"],
            &[("c", &[])],
        )));
        let known = Arc::new(RwLock::new(Known::Listing));
        let queues = ClusterQueues::watched(store, known.clone());
        let wl = reserved("all", "cpu");
        assert_eq!(queues.rule_for(&wl, "c"), QueueRule::Unknown);
        assert!(!queues.check_applies(&wl, "c"));
        assert!(
            queues
                .unknown_because()
                .expect("in the test")
                .contains("not listed them yet")
        );
        *known.write().expect("in the test") = Known::Synced;
        assert_eq!(queues.rule_for(&wl, "c"), QueueRule::Applies);
        assert_eq!(queues.unknown_because(), None);
        *known.write().expect("in the test") = Known::Refused("forbidden".into());
        assert_eq!(queues.rule_for(&wl, "c"), QueueRule::Unknown);
        let why = queues.unknown_because().expect("in the test");
        assert!(
            why.contains("may not list and watch clusterqueues.kueue.x-k8s.io (forbidden)"),
            "{why}"
        );
        // Not watched: the check does not start early, no entry is expected of it.
        assert_eq!(
            ClusterQueues::default().rule_for(&wl, "c"),
            QueueRule::DoesNotApply
        );
    }
}

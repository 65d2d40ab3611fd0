//! The ClusterQueue watch, for a check that starts early: every replica keeps the queues (a
//! handful of small objects), so whether a Workload's entry is due is known without a read;
//! the leader wakes the Workloads a queue's change concerns.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use crate::ClusterQueues;
use crate::api::{AdmissionChecksStrategy, ClusterQueue, Workload, workload_condition as cond};
use crate::cluster_queues::{Known, RESOURCE};

/// Starts watching ClusterQueues into the returned cache. While this replica leads, a change of
/// a queue's check rules wakes its Workloads that hold quota and are not admitted yet: whether a
/// check applies to them may have changed (a check removed before its entry came releases what
/// was started early). Kueue rewrites a queue's status with every Workload it reserves or
/// admits; those changes wake nothing, or a burst would wake every waiting Workload once per
/// admission.
///
/// Nothing waits for this watch: until it has listed the queues (or while the API server
/// refuses it), the queues are [unknown](crate::QueueRule::Unknown), which costs the early
/// start only, and the log says why. Once they are known (again), every waiting Workload is
/// woken to start what it could not.
pub(super) fn start(
    client: &Client,
    metrics: Arc<super::metrics::Metrics>,
    workloads: Store<Workload>,
    wake: mpsc::Sender<ObjectRef<Workload>>,
    leading: watch::Receiver<bool>,
    background: &mut super::tasks::TaskGroup,
) -> ClusterQueues {
    let (store, writer) = reflector::store::<ClusterQueue>();
    let known = Arc::new(RwLock::new(Known::Listing));
    let events = watcher(Api::<ClusterQueue>::all(client.clone()), Default::default())
        .default_backoff()
        .modify(|cq| cq.managed_fields_mut().clear())
        .reflect(writer);
    let queues = ClusterQueues::watched(store, known.clone());
    background.push(tokio::spawn(async move {
        let mut seen = Seen {
            metrics,
            rules: RulesSeen::default(),
            listed_changes: BTreeSet::new(),
        };
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            let woken = match event {
                Err(e) => {
                    seen.failed(&known, &e);
                    continue;
                }
                Ok(event) => seen.event(&known, event),
            };
            if woken.is_empty() || !*leading.borrow() {
                continue;
            }
            for wl in waiting_in(&workloads, &woken) {
                debug!(workload = %wl.name, "its ClusterQueue changed or became known; waking");
                if wake.send(wl).await.is_err() {
                    return;
                }
            }
        }
    }));
    queues
}

/// What the watch has seen: the check rules per queue, and the queues changed during a list
/// (woken once it ends: the cache takes a list's queues only then).
struct Seen {
    metrics: Arc<super::metrics::Metrics>,
    rules: RulesSeen,
    listed_changes: BTreeSet<String>,
}

/// Which queues' waiting Workloads to wake.
#[derive(Debug, PartialEq, Eq)]
enum Woken {
    None,
    Queues(BTreeSet<String>),
    Every,
}

impl Woken {
    fn is_empty(&self) -> bool {
        matches!(self, Woken::None)
    }
}

impl Seen {
    /// Takes one event; what it wakes.
    fn event(&mut self, known: &RwLock<Known>, event: watcher::Event<ClusterQueue>) -> Woken {
        match event {
            watcher::Event::Init => Woken::None,
            watcher::Event::InitApply(cq) => {
                if self.rules.changed(&cq, false) {
                    self.listed_changes.insert(cq.name_any());
                }
                Woken::None
            }
            watcher::Event::InitDone => {
                let changed = std::mem::take(&mut self.listed_changes);
                self.metrics.cluster_queues_known(true);
                let was = std::mem::replace(
                    &mut *known.write().unwrap_or_else(|p| p.into_inner()),
                    Known::Synced,
                );
                match was {
                    Known::Synced => Woken::Queues(changed),
                    Known::Listing => {
                        debug!("ClusterQueues listed: checks that start early may start");
                        Woken::Every
                    }
                    Known::Refused(_) => {
                        info!(
                            resource = RESOURCE,
                            "ClusterQueues listed again: checks that start early start again"
                        );
                        Woken::Every
                    }
                }
            }
            watcher::Event::Apply(cq) => self.one(&cq, false),
            watcher::Event::Delete(cq) => self.one(&cq, true),
        }
    }

    fn one(&mut self, cq: &ClusterQueue, deleted: bool) -> Woken {
        match self.rules.changed(cq, deleted) {
            true => Woken::Queues(BTreeSet::from([cq.name_any()])),
            false => Woken::None,
        }
    }

    /// A failed list or watch: a refusal makes the queues unknown until the next list, said
    /// once; other errors are retried by the watch (with its backoff) and logged.
    fn failed(&mut self, known: &RwLock<Known>, error: &watcher::Error) {
        let Some(message) = refusal(error) else {
            warn!(error = %error, resource = RESOURCE, "watching ClusterQueues");
            return;
        };
        let mut known = known.write().unwrap_or_else(|p| p.into_inner());
        if !matches!(&*known, Known::Refused(_)) {
            warn!(
                resource = RESOURCE,
                %message,
                "this controller may not list and watch ClusterQueues: no check starts its \
                 work before Kueue adds the entry until it may (grant list and watch on \
                 clusterqueues, group kueue.x-k8s.io; the Helm chart's ClusterRole does); \
                 every check is still asked once its entry comes"
            );
        }
        *known = Known::Refused(message);
        self.metrics.cluster_queues_known(false);
    }
}

/// The API server's message, if `error` is a refusal (403).
fn refusal(error: &watcher::Error) -> Option<String> {
    let api = match error {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s)) => s,
        watcher::Error::WatchError(s) => s,
        _ => return None,
    };
    (api.code == 403).then(|| api.message.clone())
}

/// The check rules last seen per queue, so that only a change of them wakes Workloads.
#[derive(Default)]
struct RulesSeen(HashMap<String, Option<AdmissionChecksStrategy>>);

impl RulesSeen {
    /// Records `queue`'s rules (none once `deleted`); whether they differ from those seen
    /// before. A queue seen for the first time counts as changed unless it has no rules; an
    /// empty strategy is no rules.
    fn changed(&mut self, queue: &ClusterQueue, deleted: bool) -> bool {
        let now = match deleted {
            true => None,
            false => (queue.spec.admission_checks_strategy.clone())
                .filter(|s| !s.admission_checks.is_empty()),
        };
        let name = queue.name_any();
        let before = match deleted {
            true => self.0.remove(&name).flatten(),
            false => self.0.insert(name, now.clone()).flatten(),
        };
        before != now
    }
}

/// The Workloads holding quota in the `woken` queues that are neither admitted nor finished.
fn waiting_in(workloads: &Store<Workload>, woken: &Woken) -> Vec<ObjectRef<Workload>> {
    workloads
        .state()
        .iter()
        .filter(|wl| {
            let queue = wl.status.as_ref().and_then(|s| s.admission.as_ref());
            let reserved_here = queue.is_some_and(|a| match woken {
                Woken::None => false,
                Woken::Queues(names) => names.contains(&a.cluster_queue),
                Woken::Every => true,
            });
            reserved_here
                && wl.condition_is_true(cond::QUOTA_RESERVED)
                && !wl.condition_is_true(cond::ADMITTED)
                && !wl.condition_is_true(cond::FINISHED)
        })
        .map(|wl| ObjectRef::from_obj(wl.as_ref()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::WorkloadBuilder;

    #[test]
    fn a_queue_change_concerns_its_workloads_waiting_with_quota() {
        let (store, mut writer) = reflector::store::<Workload>();
        for wl in [
            WorkloadBuilder::new("ns", "waiting").quota_reserved("cq", "f"),
            WorkloadBuilder::new("ns", "admitted")
                .quota_reserved("cq", "f")
                .admitted(),
            WorkloadBuilder::new("ns", "elsewhere").quota_reserved("other", "f"),
            WorkloadBuilder::new("ns", "queued"),
        ] {
            writer.apply_watcher_event(&watcher::Event::Apply(wl.build()));
        }
        let woken: Vec<String> = waiting_in(&store, &Woken::Queues(BTreeSet::from(["cq".into()])))
            .into_iter()
            .map(|r| r.name)
            .collect();
        assert_eq!(woken, ["waiting"]);
    }

    fn seen() -> Seen {
        let mut registry = prometheus_client::registry::Registry::default();
        let (store, _) = reflector::store::<Workload>();
        let metrics = super::super::metrics::Metrics::new(&mut registry, store, Arc::new(Vec::new));
        Seen {
            metrics: Arc::new(metrics),
            rules: RulesSeen::default(),
            listed_changes: BTreeSet::new(),
        }
    }

    fn refused() -> watcher::Error {
        watcher::Error::InitialListFailed(kube::Error::Api(Box::new(kube::core::Status {
            code: 403,
            message: "clusterqueues is forbidden".into(),
            ..Default::default()
        })))
    }

    #[test]
    fn queues_become_known_at_the_end_of_a_list_and_unknown_when_refused() {
        use crate::testing::cluster_queue;
        let mut seen = seen();
        let known = RwLock::new(Known::Listing);
        assert_eq!(seen.event(&known, watcher::Event::Init), Woken::None);
        let with_check = cluster_queue("cq", &["f"], &[("c", &[])]);
        assert_eq!(
            seen.event(&known, watcher::Event::InitApply(with_check.clone())),
            Woken::None
        );
        assert_eq!(*known.read().expect("in the test"), Known::Listing);
        // Every waiting Workload could not start until now.
        assert_eq!(seen.event(&known, watcher::Event::InitDone), Woken::Every);
        assert_eq!(*known.read().expect("in the test"), Known::Synced);

        // Refused: unknown until the next list ends, then everything is woken again.
        seen.failed(&known, &refused());
        assert_eq!(
            *known.read().expect("in the test"),
            Known::Refused("clusterqueues is forbidden".into())
        );
        seen.event(&known, watcher::Event::Init);
        assert_eq!(seen.event(&known, watcher::Event::InitDone), Woken::Every);

        // A relist of a known cache wakes the queues whose rules changed, once it ends.
        seen.event(&known, watcher::Event::Init);
        let moved = cluster_queue("cq", &["f"], &[("c", &["gpu"])]);
        seen.event(&known, watcher::Event::InitApply(moved));
        seen.event(
            &known,
            watcher::Event::InitApply(cluster_queue("plain", &["f"], &[])),
        );
        assert_eq!(
            seen.event(&known, watcher::Event::InitDone),
            Woken::Queues(BTreeSet::from(["cq".to_string()]))
        );
        // Other errors leave the queues known: the watch retries.
        seen.failed(&known, &watcher::Error::NoResourceVersion);
        assert_eq!(*known.read().expect("in the test"), Known::Synced);
    }

    #[test]
    fn only_a_change_of_the_check_rules_wakes() {
        use crate::testing::cluster_queue;
        let mut seen = RulesSeen::default();
        let with_check = cluster_queue("cq", &["f"], &[("c", &[])]);
        assert!(seen.changed(&with_check, false), "first seen, with rules");
        let mut status_only = with_check.clone();
        status_only.metadata.resource_version = Some("2".into());
        status_only.status = Some(Default::default());
        assert!(!seen.changed(&status_only, false), "a status update");
        let on_gpus = cluster_queue("cq", &["f"], &[("c", &["gpu"])]);
        assert!(seen.changed(&on_gpus, false), "onFlavors changed");
        let without = cluster_queue("cq", &["f"], &[]);
        assert!(seen.changed(&without, false), "the check removed");
        assert!(!seen.changed(&without, true), "deleted without rules");
        assert!(seen.changed(&on_gpus, false), "recreated with rules");
        assert!(seen.changed(&on_gpus, true), "deleted with rules");
        let bare = cluster_queue("plain", &["f"], &[]);
        assert!(!seen.changed(&bare, false), "first seen, no rules");
    }
}

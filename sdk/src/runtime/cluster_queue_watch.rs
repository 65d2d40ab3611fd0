//! The ClusterQueue watch, for a check that starts early: every replica keeps the queues (a
//! handful of small objects), so whether a Workload's entry is due is known without a read;
//! the leader wakes the Workloads a queue's change concerns.

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::{Notify, mpsc, watch};
use tracing::{debug, warn};

use crate::ClusterQueues;
use crate::api::{AdmissionChecksStrategy, ClusterQueue, Workload, workload_condition as cond};

/// Starts watching ClusterQueues into the returned cache; `synced` is told when the first list
/// is in it. While this replica leads, a change of a queue's check rules wakes its Workloads
/// that hold quota and are not admitted yet: whether a check applies to them may have changed (a
/// check removed before its entry came releases what was started early). Kueue rewrites a
/// queue's status with every Workload it reserves or admits; those changes wake nothing, or a
/// burst would wake every waiting Workload once per admission.
pub(super) fn start(
    client: &Client,
    workloads: Store<Workload>,
    wake: mpsc::Sender<ObjectRef<Workload>>,
    leading: watch::Receiver<bool>,
    background: &mut super::tasks::TaskGroup,
) -> (ClusterQueues, Arc<Notify>) {
    let (store, writer) = reflector::store::<ClusterQueue>();
    let synced = Arc::new(Notify::new());
    let events = watcher(Api::<ClusterQueue>::all(client.clone()), Default::default())
        .default_backoff()
        .modify(|cq| cq.managed_fields_mut().clear())
        .reflect(writer);
    let told = synced.clone();
    background.push(tokio::spawn(async move {
        let mut rules = RulesSeen::default();
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            let queue = match event {
                Err(e) => {
                    warn!(error = %e, "watching ClusterQueues");
                    continue;
                }
                Ok(watcher::Event::InitDone) => {
                    told.notify_one();
                    continue;
                }
                // A relist after a broken watch may carry a change missed meanwhile.
                Ok(watcher::Event::Apply(cq) | watcher::Event::InitApply(cq)) => {
                    if !rules.changed(&cq, false) {
                        continue;
                    }
                    cq.name_any()
                }
                Ok(watcher::Event::Delete(cq)) => {
                    if !rules.changed(&cq, true) {
                        continue;
                    }
                    cq.name_any()
                }
                Ok(watcher::Event::Init) => continue,
            };
            if !*leading.borrow() {
                continue;
            }
            for wl in waiting_in(&workloads, &queue) {
                debug!(workload = %wl.name, cluster_queue = %queue, "queue changed; waking");
                if wake.send(wl).await.is_err() {
                    return;
                }
            }
        }
    }));
    (ClusterQueues::cached(store), synced)
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

/// The Workloads holding quota in `queue` that are neither admitted nor finished.
fn waiting_in(workloads: &Store<Workload>, queue: &str) -> Vec<ObjectRef<Workload>> {
    workloads
        .state()
        .iter()
        .filter(|wl| {
            let reserved_here = wl
                .status
                .as_ref()
                .and_then(|s| s.admission.as_ref())
                .is_some_and(|a| a.cluster_queue == queue);
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
        let woken: Vec<String> = waiting_in(&store, "cq")
            .into_iter()
            .map(|r| r.name)
            .collect();
        assert_eq!(woken, ["waiting"]);
    }

    #[test]
    fn only_a_change_of_the_check_rules_wakes() {
        use crate::testing::cluster_queue;
        let mut seen = RulesSeen::default();
        let with_check = cluster_queue("cq", &[("c", &[])]);
        assert!(seen.changed(&with_check, false), "first seen, with rules");
        let mut status_only = with_check.clone();
        status_only.metadata.resource_version = Some("2".into());
        status_only.status = Some(Default::default());
        assert!(!seen.changed(&status_only, false), "a status update");
        let on_gpus = cluster_queue("cq", &[("c", &["gpu"])]);
        assert!(seen.changed(&on_gpus, false), "onFlavors changed");
        let without = cluster_queue("cq", &[]);
        assert!(seen.changed(&without, false), "the check removed");
        assert!(!seen.changed(&without, true), "deleted without rules");
        assert!(seen.changed(&on_gpus, false), "recreated with rules");
        assert!(seen.changed(&on_gpus, true), "deleted with rules");
        let bare = cluster_queue("plain", &[]);
        assert!(!seen.changed(&bare, false), "first seen, no rules");
    }
}

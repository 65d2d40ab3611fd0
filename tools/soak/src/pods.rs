//! The soak's witness of pods: where each pod of a Job ran, and on what capacity.
//!
//! It watches the run namespace's Workloads, ProvisioningRequests and pods, and the Nodes, and
//! keeps, for every pod it saw bound to a Node, the request its `consume-provisioning-request`
//! annotation names and the Node's labels. At the end of the run [`PodWitness::judge`] holds
//! each pod to [`super::recorder::Invariant::PodsOnTheirCapacity`]: a pod of a Job whose queue
//! has a provisioning check consumes a request provisioned for its own Workload by that check
//! (seen `Provisioned=True`, or named by the check's `Ready` entry of that Workload), and runs
//! on a Node carrying the flavor's node labels; a pod of a queue without one (or of a Workload
//! admitted while the check was off its queue) consumes none. A pod of the capacity-buffer
//! check's queue consumes none and runs on a Node that Karpenter made for its own Workload (the
//! dedication label has the Workload's uid).
//! Judged at the end, when everything seen is known, so the order in which the watches
//! delivered things does not matter.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use kueue_admission_sdk::api::{CheckState, ProvisioningRequest, Workload, find_condition};
use kueue_provisioning_controller::identity::{CHECK_ANNOTATION, WORKLOAD_UID_LABEL};

use super::plan::{Plan, Queue};

/// The annotation by which a pod consumes a ProvisioningRequest.
const CONSUME: &str = "autoscaling.x-k8s.io/consume-provisioning-request";

/// A pod as seen once bound to a Node.
#[derive(Clone, Debug)]
struct Sighting {
    name: String,
    /// The uid of the Job that owns it.
    job_uid: String,
    consumes: Option<String>,
    node: String,
}

/// A Workload of a Job, as far as the pods need it.
#[derive(Clone, Debug, Default)]
struct JobWorkload {
    /// Plan index (from the Workload's name).
    index: Option<usize>,
    uid: String,
    /// Requests its `Ready` entries named in their podSetUpdates, by check.
    named: BTreeSet<(String, String)>,
    /// Whether it was seen admitted with no entry at all for some check: a check removed from
    /// its ClusterQueue meanwhile asks for no request (noted per entry name present).
    admitted_with: Vec<BTreeSet<String>>,
}

#[derive(Debug, Default)]
struct Seen {
    sightings: BTreeMap<String, Sighting>,
    /// By the uid of the Job that owns the Workload.
    workloads: BTreeMap<String, JobWorkload>,
    /// Requests seen `Provisioned=True`: name → (Workload uid, check).
    provisioned: BTreeSet<(String, String, String)>,
    node_labels: BTreeMap<String, BTreeMap<String, String>>,
}

/// The witness; cheap to share.
#[derive(Clone, Debug, Default)]
pub struct PodWitness(Arc<Mutex<Seen>>);

/// The verdict of [`PodWitness::judge`].
#[derive(Debug, Default)]
pub struct PodVerdict {
    /// Pods checked.
    pub pods: usize,
    /// Of which consumed a request.
    pub consuming: usize,
    /// What was wrong, a line each.
    pub violations: Vec<String>,
}

impl PodWitness {
    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn workload(&self, wl: &Workload) {
        let Some(job) = wl.owner_references().iter().find(|o| o.kind == "Job") else {
            return;
        };
        let mut seen = self.seen();
        let w = seen.workloads.entry(job.uid.clone()).or_default();
        w.index = super::recorder::index_of(wl);
        w.uid = wl.uid().unwrap_or_default();
        if wl.condition_is_true(kueue_admission_sdk::api::workload_condition::ADMITTED) {
            let entries = wl.status.iter().flat_map(|s| &s.admission_checks);
            w.admitted_with
                .push(entries.map(|e| e.name.clone()).collect());
        }
        for entry in wl.status.iter().flat_map(|s| &s.admission_checks) {
            if entry.state != CheckState::Ready {
                continue;
            }
            for update in &entry.pod_set_updates {
                if let Some(request) = update.annotations.get(CONSUME) {
                    w.named.insert((entry.name.clone(), request.clone()));
                }
            }
        }
    }

    fn request(&self, r: &ProvisioningRequest) {
        let conditions = r.status.as_ref().map_or(&[][..], |s| &s.conditions[..]);
        if find_condition(conditions, "Provisioned").is_none_or(|c| c.status != "True") {
            return;
        }
        let uid = r
            .labels()
            .get(WORKLOAD_UID_LABEL)
            .cloned()
            .unwrap_or_default();
        let check = r
            .annotations()
            .get(CHECK_ANNOTATION)
            .cloned()
            .unwrap_or_default();
        self.seen().provisioned.insert((r.name_any(), uid, check));
    }

    fn pod(&self, pod: &Pod) {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            return;
        };
        let Some(job) = pod.owner_references().iter().find(|o| o.kind == "Job") else {
            return;
        };
        let sighting = Sighting {
            name: pod.name_any(),
            job_uid: job.uid.clone(),
            consumes: pod.annotations().get(CONSUME).cloned(),
            node,
        };
        self.seen()
            .sightings
            .entry(pod.uid().unwrap_or_default())
            .or_insert(sighting);
    }

    fn node(&self, node: &Node) {
        let labels = node.labels().clone();
        self.seen().node_labels.insert(node.name_any(), labels);
    }

    /// Holds every pod seen to the invariant, by what its queue's capacity is.
    pub fn judge(&self, plan: &Plan, capacity: &BTreeMap<Queue, Capacity>) -> PodVerdict {
        let seen = self.seen();
        let mut verdict = PodVerdict::default();
        for s in seen.sightings.values() {
            verdict.pods += 1;
            verdict.consuming += usize::from(s.consumes.is_some());
            let problem = judge_one(&seen, s, plan, capacity);
            if let Some(problem) = problem {
                verdict
                    .violations
                    .push(format!("pod {} on {}: {problem}", s.name, s.node));
            }
        }
        verdict
    }
}

/// Where a queue's pods must run.
#[derive(Clone, Debug)]
pub enum Capacity {
    /// On the flavor's standing Nodes (these labels), consuming a request of this provisioning
    /// check (none: no request).
    Standing {
        /// The flavor's node labels.
        labels: Vec<(String, String)>,
        /// The provisioning check guarding the queue.
        check: Option<String>,
    },
    /// On a Node made for its own Workload alone: this label has the Workload's uid. No
    /// request.
    Dedicated {
        /// The dedication label key.
        label: String,
        /// The capacity-buffer check guarding the queue.
        check: String,
    },
}

/// What is wrong with one pod, if anything.
fn judge_one(
    seen: &Seen,
    s: &Sighting,
    plan: &Plan,
    capacity: &BTreeMap<Queue, Capacity>,
) -> Option<String> {
    let Some(wl) = seen.workloads.get(&s.job_uid) else {
        return Some("its Job's Workload was never seen".into());
    };
    let Some(queue) = wl
        .index
        .and_then(|i| plan.workloads.get(i))
        .map(|w| w.queue)
    else {
        return Some("its Workload is not one of the plan's".into());
    };
    let labels = seen.node_labels.get(&s.node);
    let has = |k: &str, v: &str| labels.is_some_and(|l| l.get(k).map(String::as_str) == Some(v));
    let (node_labels, check) = match capacity.get(&queue) {
        None => return Some(format!("the soak knows no capacity for queue {queue:?}")),
        Some(Capacity::Dedicated { label, check }) => {
            return if s.consumes.is_some() {
                Some("consumes a request, but its queue's capacity comes from Karpenter".into())
            } else if wl.admitted_with.iter().any(|e| !e.contains(check)) {
                // Admitted by Kueue with no entry of the check: no Node was made for it, its
                // pods go where Karpenter puts them (the recorder reports the admission).
                None
            } else if !has(label, &wl.uid) {
                Some(format!(
                    "the Node does not carry {label}={} (made for another Workload, or not by Karpenter)",
                    wl.uid
                ))
            } else {
                None
            };
        }
        Some(Capacity::Standing { labels, check }) => (labels, check.clone()),
    };
    if !node_labels.iter().all(|(k, v)| has(k, v)) {
        return Some(format!(
            "the Node lacks the flavor's labels {node_labels:?}"
        ));
    }
    match (check, &s.consumes) {
        (None, None) => None,
        (None, Some(r)) => Some(format!(
            "consumes {r}, but its queue has no provisioning check"
        )),
        // Admitted while the check was off its ClusterQueue: no request was needed.
        (Some(check), None) if wl.admitted_with.iter().any(|e| !e.contains(&check)) => None,
        (Some(check), None) => Some(format!("consumes no request, but {check} guards its queue")),
        (Some(check), Some(r)) => {
            let provisioned =
                seen.provisioned
                    .contains(&(r.clone(), wl.uid.clone(), check.clone()));
            let named = wl.named.contains(&(check.clone(), r.clone()));
            (!provisioned && !named).then(|| {
                format!("consumes {r}, never seen provisioned for its own Workload by {check}")
            })
        }
    }
}

/// Starts the witness's watches of `namespace` (and of the Nodes). Returns once each has listed.
pub async fn start(
    witness: PodWitness,
    client: &Client,
    namespace: &str,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let (ready, mut ready_rx) = tokio::sync::mpsc::channel::<()>(4);
    let mut tasks = Vec::new();
    let w = witness.clone();
    tasks.push(spawn(
        Api::<Workload>::namespaced(client.clone(), namespace),
        ready.clone(),
        move |wl| w.workload(&wl),
    ));
    let w = witness.clone();
    tasks.push(spawn(
        Api::<ProvisioningRequest>::namespaced(client.clone(), namespace),
        ready.clone(),
        move |r| w.request(&r),
    ));
    let w = witness.clone();
    tasks.push(spawn(
        Api::<Pod>::namespaced(client.clone(), namespace),
        ready.clone(),
        move |p| w.pod(&p),
    ));
    let w = witness;
    tasks.push(spawn(Api::<Node>::all(client.clone()), ready, move |n| {
        w.node(&n)
    }));
    for _ in 0..4 {
        tokio::time::timeout(e2e::DEFAULT_TIMEOUT, ready_rx.recv())
            .await
            .map_err(|_| anyhow::anyhow!("a pod witness watch never completed its first list"))?;
    }
    Ok(tasks)
}

/// Feeds every object `api` shows (listed or changed) to `seen`; sends on `ready` once listed.
/// Deletions change nothing of what was seen; errors are retried by the watch.
fn spawn<K>(
    api: Api<K>,
    ready: tokio::sync::mpsc::Sender<()>,
    seen: impl Fn(K) + Send + 'static,
) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let on_event = move |event| {
        if let watcher::Event::Apply(k) | watcher::Event::InitApply(k) = event {
            seen(k);
        }
    };
    crate::witness::spawn(api, watcher::Config::default(), ready, on_event, |_| {})
}

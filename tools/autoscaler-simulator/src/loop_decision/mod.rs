//! One loop of the simulated cluster-autoscaler: from a [`ClusterView`], the settings, the
//! in-memory [`LoopState`] and `now`, the [`LoopActions`] to carry out. Pure: no I/O, no clock;
//! every rule of `docs/autoscaler-contract.md` ("What a faithful simulator must do") that is not
//! the API server's lives here and is pinned by a test citing its number.
//!
//! A loop runs the phases of cluster-autoscaler 1.36.1's `RunOnce`, in its order:
//!
//! 1. **Refresh**: BookingExpired after the
//!    booking window, Failed/`Expired` for requests never provisioned within `expire_after`, at
//!    most 20 such writes; then deletion of requests whose Provisioned or Failed condition is
//!    older than `request_ttl`.
//! 2. **Snapshot**: Nodes with their bound pods. Pending pods kube-scheduler marked
//!    unschedulable are placed where they fit (cluster-autoscaler counts on the scheduler to
//!    put them there, and this happens before bookings, so they may take booked room); the
//!    rest, minus those carrying a consume annotation, are the ordinary scale-up's pods.
//! 3. **Pick**: the first available supported request in scan order (one
//!    per loop; up to the batch size of check-capacity requests when batching). A request whose
//!    PodTemplate is missing fails `FailedToCreatePods` and the scan goes on. Accepted is
//!    written on the pick.
//! 4. **Booking**: the pods of Provisioned requests still booked are
//!    placed in the snapshot.
//! 5. **Scale-up** (and [`scale`]): either the picked request(s) or the ordinary
//!    unschedulable pods; when both wait, loops alternate between them.
//! 6. **Scale-down** ([`scale::scale_down`]): Nodes of the groups with no pod that matters
//!    (bound, booked or about to be scheduled) become unneeded; after
//!    `scale_down_unneeded_time` unneeded they are deleted, down to the group's min count,
//!    except within `scale_down_delay_after_add` of a scale-up or of a check-capacity request
//!    found to fit (rule 19).
//!
//! The next loop runs at once after a loop that processed a request, created or deleted Nodes
//! (cluster-autoscaler's frequent loops), else `scan_interval` later.

mod provision;
mod requests;
pub mod scale;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kueue_admission_sdk::api::ProvisioningRequest;

use crate::conditions::{
    BEST_EFFORT_CLASS, CHECK_CAPACITY_CLASS, PROCESSOR_INSTANCE_PARAMETER, condition, is_true,
};
use crate::settings::{BACKOFF_CACHE_SIZE, Settings};
use crate::snapshot::{ClusterView, Snapshot};

/// How the simulator handles a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handling {
    /// It follows a script (see [`crate::script`]); the default mode leaves it alone.
    Scripted,
    /// `check-capacity.autoscaling.x-k8s.io`.
    CheckCapacity,
    /// `best-effort-atomic-scale-up.autoscaling.x-k8s.io`.
    BestEffort,
    /// Any other class, or a request carrying `parameters.processorInstance`: no status write,
    /// ever (rule 2); only garbage collection may delete it.
    Unsupported,
}

/// How `request` is handled under `settings`.
pub fn handling(
    request: &ProvisioningRequest,
    view: &ClusterView,
    settings: &Settings,
) -> Handling {
    let class = request.spec.provisioning_class_name.as_str();
    if settings.scripts_class(class) || view.has_script_annotation(request) {
        return Handling::Scripted;
    }
    let instance = request.spec.parameters.get(PROCESSOR_INSTANCE_PARAMETER);
    if instance.is_some_and(|i| !i.is_empty()) {
        return Handling::Unsupported;
    }
    match class {
        CHECK_CAPACITY_CLASS => Handling::CheckCapacity,
        BEST_EFFORT_CLASS => Handling::BestEffort,
        _ => Handling::Unsupported,
    }
}

/// A request, by namespace, name and UID.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct RequestKey {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its UID (a write or delete must not hit a recreated namesake).
    pub uid: String,
}

impl RequestKey {
    /// The key of `request`.
    pub fn of(request: &ProvisioningRequest) -> Self {
        Self {
            namespace: request.namespace().unwrap_or_default(),
            name: request.name_any(),
            uid: request.uid().unwrap_or_default(),
        }
    }
}

/// A status write: the request's full condition list after the loop.
#[derive(Clone, Debug, PartialEq)]
pub struct StatusWrite {
    /// The request.
    pub request: RequestKey,
    /// All its conditions, as they are to be written.
    pub conditions: Vec<Condition>,
}

/// Nodes to add to a group.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeCreation {
    /// The group.
    pub group: String,
    /// How many Nodes.
    pub count: usize,
    /// For a best-effort scale-up: the request's status to write instead of its
    /// Provisioned=True if the Nodes cannot be created (Provisioned=False,
    /// `CapacityIsNotFound`).
    pub if_refused: Option<StatusWrite>,
}

/// What one loop does.
#[derive(Clone, Debug, PartialEq)]
pub struct LoopActions {
    /// Status writes, at most one per request. Carry them out after the creations.
    pub status_writes: Vec<StatusWrite>,
    /// Nodes to create, first.
    pub node_creations: Vec<NodeCreation>,
    /// Nodes to delete, by name.
    pub node_deletions: Vec<String>,
    /// Requests to delete (garbage collection).
    pub request_deletions: Vec<RequestKey>,
    /// When the next loop is due.
    pub next_loop: Timestamp,
}

/// The retry delays of Provisioned=False requests by UID: cluster-autoscaler's in-memory LRU
/// (lost on restart), at most [`BACKOFF_CACHE_SIZE`] entries, least recently used forgotten.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Backoff {
    /// Most recently used last.
    entries: Vec<(String, Duration)>,
}

impl Backoff {
    /// The delay remembered for `uid`, marking it used.
    pub fn get(&mut self, uid: &str) -> Option<Duration> {
        let i = self.entries.iter().position(|(u, _)| u == uid)?;
        let entry = self.entries.remove(i);
        let delay = entry.1;
        self.entries.push(entry);
        Some(delay)
    }

    /// Remembers `delay` for `uid`.
    pub fn set(&mut self, uid: &str, delay: Duration) {
        self.forget(uid);
        self.entries.push((uid.to_string(), delay));
        if self.entries.len() > BACKOFF_CACHE_SIZE {
            self.entries.remove(0);
        }
    }

    /// Forgets `uid`.
    pub fn forget(&mut self, uid: &str) {
        self.entries.retain(|(u, _)| u != uid);
    }

    /// How many UIDs are remembered.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// What the simulator remembers between loops (all of it lost on restart, as in
/// cluster-autoscaler).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoopState {
    /// Retry delays by request UID.
    pub backoff: Backoff,
    /// Since when each unneeded Node (by name) has been unneeded.
    pub unneeded_since: BTreeMap<String, Timestamp>,
    /// Whether the next loop with both picked requests and ordinary unschedulable pods serves
    /// the requests.
    pub requests_turn: bool,
    /// The last loop that scaled up, or found capacity for a check-capacity request (rule 19):
    /// scale-down waits `scale_down_delay_after_add` after it.
    pub last_scale_up: Option<Timestamp>,
}

/// A request during the loop: its conditions as the loop leaves them.
#[derive(Clone, Debug)]
pub(crate) struct Req<'a> {
    pub object: &'a ProvisioningRequest,
    pub key: RequestKey,
    pub handling: Handling,
    pub conditions: Vec<Condition>,
    pub dirty: bool,
    pub deleted: bool,
}

impl Req<'_> {
    /// Writes a condition (restamped `now`), replacing its type in place or appending it.
    pub fn set(
        &mut self,
        type_: &str,
        status: bool,
        reason: &str,
        message: String,
        now: Timestamp,
    ) {
        let new = condition(
            type_,
            status,
            reason,
            message,
            self.object.metadata.generation,
            now,
        );
        match self.conditions.iter_mut().find(|c| c.type_ == type_) {
            Some(slot) => *slot = new,
            None => self.conditions.push(new),
        }
        self.dirty = true;
    }

    pub fn is_true(&self, type_: &str) -> bool {
        is_true(&self.conditions, type_)
    }

    pub fn find(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }

    /// Supported by the default mode (check-capacity or best-effort) and not deleted.
    pub fn supported(&self) -> bool {
        !self.deleted
            && matches!(
                self.handling,
                Handling::CheckCapacity | Handling::BestEffort
            )
    }

    pub fn write(&self) -> StatusWrite {
        StatusWrite {
            request: self.key.clone(),
            conditions: self.conditions.clone(),
        }
    }
}

/// What a loop works on.
pub(crate) struct Work<'a> {
    pub view: &'a ClusterView,
    pub settings: &'a Settings,
    pub now: Timestamp,
    pub requests: Vec<Req<'a>>,
    /// A check-capacity request was found to fit in this loop: a successful scale-up to
    /// scale-down (rule 19).
    pub capacity_found: bool,
}

/// Whether `since + after` is before `now` (overflow: never).
pub(crate) fn older_than(since: Timestamp, after: Duration, now: Timestamp) -> bool {
    since.checked_add(after).is_ok_and(|due| due < now)
}

/// One loop of the simulated cluster-autoscaler.
pub fn run_loop(
    settings: &Settings,
    view: &ClusterView,
    state: &mut LoopState,
    now: Timestamp,
) -> LoopActions {
    let mut work = Work {
        view,
        settings,
        now,
        requests: view
            .requests
            .iter()
            .map(|r| Req {
                object: r,
                key: RequestKey::of(r),
                handling: handling(r, view, settings),
                conditions: r
                    .status
                    .as_ref()
                    .map(|s| s.conditions.clone())
                    .unwrap_or_default(),
                dirty: false,
                deleted: false,
            })
            .collect(),
        capacity_found: false,
    };
    requests::expire(&mut work);
    let request_deletions = requests::collect_garbage(&mut work);
    let mut snapshot = Snapshot::of(view);
    let regular: Vec<_> = view
        .unschedulable_pods()
        .into_iter()
        .filter(|(pod, consumes)| !snapshot.place(pod) && !consumes)
        .map(|(pod, _)| pod)
        .collect();
    let picked = requests::pick(&mut work, &mut state.backoff);
    requests::book(&mut work, &mut snapshot);
    let mut node_creations = Vec::new();
    let requests_turn = !picked.requests.is_empty() && (regular.is_empty() || state.requests_turn);
    if requests_turn {
        node_creations = provision::provision(&mut work, &picked.requests, &mut snapshot);
    } else if !regular.is_empty() {
        node_creations.extend(scale::regular_scale_up(settings, view, &regular));
    }
    if !picked.requests.is_empty() || !regular.is_empty() {
        state.requests_turn = !requests_turn;
    }
    if !node_creations.is_empty() || work.capacity_found {
        state.last_scale_up = Some(now);
    }
    let node_deletions = scale::scale_down(settings, view, &snapshot, state, now);
    let busy = picked.processed || !node_creations.is_empty() || !node_deletions.is_empty();
    let next_loop = if busy {
        now
    } else {
        now.checked_add(settings.scan_interval).unwrap_or(now)
    };
    LoopActions {
        status_writes: work
            .requests
            .iter()
            .filter(|r| r.dirty && !r.deleted)
            .map(Req::write)
            .collect(),
        node_creations,
        node_deletions,
        request_deletions,
        next_loop,
    }
}

#[cfg(test)]
mod tests;

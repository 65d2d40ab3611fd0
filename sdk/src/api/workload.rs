use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::{PodTemplateSpec, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

use super::conditions::{find_condition, is_condition_true};

kueue_kind! {
    [kind = "Workload", namespaced, status = "WorkloadStatus"]
    /// `Workload.spec`: what a batch job asks Kueue for.
    #[serde(default, rename_all = "camelCase")]
    pub struct WorkloadSpec {
        /// The groups of identical pods the workload runs (1 to 8).
        pub pod_sets: Vec<PodSet>,
        /// The LocalQueue the workload was submitted to.
        pub queue_name: Option<String>,
        /// Priority resolved from the priority class.
        pub priority: Option<i32>,
        /// `false` once the workload is deactivated (e.g. after a `Rejected` check); absent means true.
        pub active: Option<bool>,
        /// Upper bound of the run time, if the job declared one.
        pub maximum_execution_time_seconds: Option<i32>,
    }
}

/// `Workload.spec.podSets[]`.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct PodSet {
    /// Podset name, unique in the workload (`main` for a batch/v1 Job).
    pub name: String,
    /// The pod template every pod of the podset is created from.
    pub template: PodTemplateSpec,
    /// Number of pods requested.
    pub count: i32,
    /// Lowest acceptable count for partial admission.
    pub min_count: Option<i32>,
}

/// `Workload.status`.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct WorkloadStatus {
    /// `QuotaReserved`, `Admitted`, `Evicted`, `Requeued`, `Finished`, `DeactivationTarget`, ...
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Set while quota is reserved: which ClusterQueue, and the flavors and counts per podset.
    pub admission: Option<Admission>,
    /// Requeueing bookkeeping; `requeueAt` also carries admission check retry delays.
    pub requeue_state: Option<RequeueState>,
    /// One entry per admission check that applies to the workload (at most 8).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub admission_checks: Vec<AdmissionCheckState>,
    /// Counters Kueue keeps about the workload, e.g. evictions per reason.
    pub scheduling_stats: Option<SchedulingStats>,
}

/// `Workload.status.schedulingStats`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct SchedulingStats {
    /// Evictions counted per reason and underlying cause.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub evictions: Vec<EvictionCount>,
}

/// `Workload.status.schedulingStats.evictions[]`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct EvictionCount {
    /// Eviction reason, e.g. `AdmissionCheck` (a check answered Retry) or `Deactivated`.
    pub reason: String,
    /// What lies behind the reason, e.g. `AdmissionCheck` for a deactivation after Rejected.
    #[serde(default)]
    pub underlying_cause: String,
    /// How many evictions of this kind happened.
    pub count: i32,
}

/// `Workload.status.admission`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Admission {
    /// The ClusterQueue that reserved the quota.
    pub cluster_queue: String,
    /// Per podset: assigned flavors and count.
    #[serde(default)]
    pub pod_set_assignments: Vec<PodSetAssignment>,
}

/// `Workload.status.admission.podSetAssignments[]`.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodSetAssignment {
    /// Podset name.
    pub name: String,
    /// ResourceFlavor assigned per resource name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub flavors: BTreeMap<String, String>,
    /// Total quota used per resource.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resource_usage: BTreeMap<String, Quantity>,
    /// Pods admitted for this podset (lower than requested under partial admission).
    pub count: Option<i32>,
}

/// `Workload.status.requeueState`.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct RequeueState {
    /// How many times the workload was requeued for waitForPodsReady.
    pub count: Option<i32>,
    /// The workload is not requeued before this time.
    pub requeue_at: Option<Time>,
}

/// The state of one admission check on one workload: `status.admissionChecks[]`.
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionCheckState {
    /// AdmissionCheck name; the list-map key.
    pub name: String,
    /// The check's answer.
    pub state: CheckState,
    /// When `state` last changed. Kueue adds `requeueAfterSeconds` to it to compute the retry time.
    pub last_transition_time: Option<Time>,
    /// Human-readable explanation; the API requires the field, possibly empty.
    #[serde(default)]
    pub message: String,
    /// Minimum delay before Kueue retries after a `Retry`.
    pub requeue_after_seconds: Option<i32>,
    /// Times this check answered `Retry`, counted by Kueue at each eviction. Never written by checks.
    pub retry_count: Option<i32>,
    /// Additive changes to the pods of each podset, applied when the job starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_set_updates: Vec<PodSetUpdate>,
}

impl AdmissionCheckState {
    /// Kueue's limit on `message`, in characters.
    pub const MAX_MESSAGE_CHARS: usize = 32_768;
    /// Kueue's limit on `podSetUpdates`.
    pub const MAX_POD_SET_UPDATES: usize = 18;
}

/// `status.admissionChecks[].state`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CheckState {
    /// The check has not answered yet (or was reset by an eviction).
    #[default]
    Pending,
    /// The check passed.
    Ready,
    /// Evict, release quota and try again later.
    Retry,
    /// Deactivate the workload.
    Rejected,
}

impl CheckState {
    /// The string Kueue uses for the state.
    pub fn as_str(self) -> &'static str {
        match self {
            CheckState::Pending => "Pending",
            CheckState::Ready => "Ready",
            CheckState::Retry => "Retry",
            CheckState::Rejected => "Rejected",
        }
    }
}

impl fmt::Display for CheckState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `status.admissionChecks[].podSetUpdates[]`: additive only; a key set twice with different
/// values makes the job fail to start.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodSetUpdate {
    /// Podset name.
    pub name: String,
    /// Labels to add to the pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations to add to the pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Node selector entries to add to the pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Tolerations to add to the pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
}

/// Workload condition types an admission check reacts to.
pub mod workload_condition {
    /// Quota is reserved in a ClusterQueue; checks may act.
    pub const QUOTA_RESERVED: &str = "QuotaReserved";
    /// Quota reserved and every check Ready.
    pub const ADMITTED: &str = "Admitted";
    /// The workload was evicted (reason says why, e.g. `AdmissionCheck`).
    pub const EVICTED: &str = "Evicted";
    /// The workload was put back in its queue.
    pub const REQUEUED: &str = "Requeued";
    /// The job finished.
    pub const FINISHED: &str = "Finished";
    /// Kueue is about to deactivate the workload (e.g. a check answered `Rejected`).
    pub const DEACTIVATION_TARGET: &str = "DeactivationTarget";
}

impl Workload {
    pub(crate) fn conditions(&self) -> &[Condition] {
        self.status
            .as_ref()
            .map_or(&[], |s| s.conditions.as_slice())
    }

    /// A status condition by type.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        find_condition(self.conditions(), type_)
    }

    /// Whether the condition of this type is `True`.
    pub fn condition_is_true(&self, type_: &str) -> bool {
        is_condition_true(self.conditions(), type_)
    }

    /// The entry of one admission check, if the workload has it.
    pub fn admission_check(&self, name: &str) -> Option<&AdmissionCheckState> {
        self.status
            .as_ref()?
            .admission_checks
            .iter()
            .find(|c| c.name == name)
    }

    /// How many times the workload was evicted for `reason`.
    pub fn evictions(&self, reason: &str) -> i32 {
        let stats = self
            .status
            .as_ref()
            .and_then(|s| s.scheduling_stats.as_ref());
        stats.map_or(0, |s| {
            s.evictions
                .iter()
                .filter(|e| e.reason == reason)
                .fold(0i32, |sum, e| sum.saturating_add(e.count))
        })
    }

    /// How many times the workload was evicted, for any reason.
    pub fn total_evictions(&self) -> i32 {
        self.status
            .as_ref()
            .and_then(|s| s.scheduling_stats.as_ref())
            // Saturating: the counts come from the cluster, and a sum past i32::MAX must not
            // panic (debug builds) or wrap to a negative count (release builds).
            .map_or(0, |s| {
                s.evictions
                    .iter()
                    .fold(0i32, |sum, e| sum.saturating_add(e.count))
            })
    }

    /// `status.requeueState.requeueAt`: when Kueue requeues the workload (set by a `Retry`
    /// with a delay, among others; cleared once it requeues).
    pub fn requeue_at(&self) -> Option<k8s_openapi::jiff::Timestamp> {
        self.status
            .as_ref()
            .and_then(|s| s.requeue_state.as_ref())
            .and_then(|r| r.requeue_at.as_ref())
            .map(|t| t.0)
    }

    /// Pods of the podset `pod_set`: the count Kueue assigned (with partial admission it can be
    /// less than asked), else the count the spec asks for; 0 for an unknown podset or a
    /// negative count.
    pub fn pod_count(&self, pod_set: &str) -> u32 {
        let assigned = self
            .status
            .as_ref()
            .and_then(|s| s.admission.as_ref())
            .and_then(|a| a.pod_set_assignments.iter().find(|p| p.name == pod_set))
            .and_then(|p| p.count);
        let asked = self
            .spec
            .pod_sets
            .iter()
            .find(|p| p.name == pod_set)
            .map(|p| p.count);
        assigned
            .or(asked)
            .map_or(0, |n| u32::try_from(n).unwrap_or(0))
    }

    /// `spec.active`, which defaults to true.
    pub fn is_active(&self) -> bool {
        self.spec.active.unwrap_or(true)
    }
}

#[cfg(test)]
mod tests {
    use crate::testing::WorkloadBuilder;

    #[test]
    fn pod_count_is_the_assigned_count_else_the_asked_one() {
        let asked = WorkloadBuilder::new("ns", "wl")
            .pod_set("main", 4, "1")
            .pod_set("aux", -1, "1")
            .build();
        assert_eq!(asked.pod_count("main"), 4);
        assert_eq!(asked.pod_count("aux"), 0, "a negative count counts no pods");
        assert_eq!(asked.pod_count("unknown"), 0);

        let partial = WorkloadBuilder::new("ns", "wl")
            .pod_set("main", 4, "1")
            .quota_reserved("cq", "default")
            .with(|wl| {
                let admission = wl.status.as_mut().and_then(|s| s.admission.as_mut());
                admission.expect("reserved").pod_set_assignments[0].count = Some(2);
            })
            .build();
        assert_eq!(partial.pod_count("main"), 2, "partial admission");
    }
}

//! Why and how a check is told that a Workload no longer needs what it gave it.

use k8s_openapi::jiff::Timestamp;

use crate::api::Workload;

/// Why a Workload no longer needs what a check gave it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReleaseReason {
    /// Quota was released without an eviction (e.g. the ClusterQueue was stopped).
    QuotaReleased,
    /// Kueue evicted the Workload.
    Evicted,
    /// The Workload was deactivated (`spec.active: false`).
    Deactivated,
    /// The job finished.
    Finished,
    /// The Workload is being deleted or is gone.
    Deleted,
    /// The check no longer applies to the Workload (removed from the ClusterQueue).
    CheckRemoved,
    /// Work started early ([`crate::AdmissionCheckController::start_early`]) waited longer than
    /// [`crate::RuntimeConfig::early_start_wait`] for Kueue to add the check's entry.
    EntryNotAdded,
}

impl ReleaseReason {
    /// A stable label for metrics and events.
    pub fn as_str(self) -> &'static str {
        match self {
            ReleaseReason::QuotaReleased => "quota_released",
            ReleaseReason::Evicted => "evicted",
            ReleaseReason::Deactivated => "deactivated",
            ReleaseReason::Finished => "finished",
            ReleaseReason::Deleted => "deleted",
            ReleaseReason::CheckRemoved => "check_removed",
            ReleaseReason::EntryNotAdded => "entry_not_added",
        }
    }
}

/// What a check gets when a Workload stops needing it.
pub struct ReleaseContext<'a> {
    /// Namespace of the Workload.
    pub namespace: &'a str,
    /// Name of the Workload.
    pub name: &'a str,
    /// The Workload, unless it is already gone.
    pub workload: Option<&'a Workload>,
    /// The AdmissionCheck the release is for.
    pub check_name: &'a str,
    /// Why.
    pub reason: ReleaseReason,
    /// A client.
    pub client: &'a kube::Client,
    /// The time of the release.
    pub now: Timestamp,
}

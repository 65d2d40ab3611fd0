//! Whether what a check holds for a Workload is still needed: the rule a check that keeps
//! something outside the Workload (a ledger of charges or licenses, a ProvisioningRequest) uses
//! to reconcile it with the Workloads that exist. `release` covers the Workloads this process
//! saw go; this covers the ones that went while no replica ran, or whose release failed.
//!
//! Pure: the caller reads the Workload (from the runtime's cache, then again from the API
//! server before it takes anything back) and asks [`stale_reason`].

use kube::ResourceExt;

use crate::api::Workload;
use crate::decide::{Eligibility, standing};
use crate::shadow::{ShadowEligibility, ShadowScope, shadow_eligibility};

/// What a check gave one Workload, as the check recorded it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Holding<'a> {
    /// The uid of the Workload it was given to: a Workload of the same name with another uid
    /// is another one.
    pub uid: &'a str,
    /// The AdmissionCheck it was given for.
    pub check: &'a str,
    /// How long it lasts.
    pub lasts: Lasts,
}

/// How long a [`Holding`] lasts, at the longest (the Workload's deletion, finishing or
/// deactivation end every kind).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lasts {
    /// While the Workload holds quota with the check's entry `Pending` or `Ready`; in shadow
    /// mode while it holds quota in the scope. Licenses: taken back on an eviction, given again
    /// on the next admission.
    WhileAnswered,
    /// As [`Lasts::WhileAnswered`], within the one admission it was given in: Kueue's count of
    /// the Workload's evictions then. A charge: an eviction settles it.
    ForTheAdmission {
        /// Kueue's count of the Workload's evictions when it was given.
        evictions: i32,
    },
    /// While the Workload holds quota with the check's entry (whatever its state: Kueue may
    /// still act on the answer) and the check's attempt has not passed this one. A request
    /// made for one attempt.
    ForTheAttempt(u32),
}

/// Why `holding` is no longer needed, judged on its Workload as read now (`None`: no Workload
/// has that name any more), or `None` while it is: for the log and the record of what was
/// taken back.
pub fn stale_reason(
    holding: &Holding<'_>,
    workload: Option<&Workload>,
    shadow: Option<&ShadowScope>,
) -> Option<String> {
    stale_reason_expecting_entry(holding, workload, shadow, false)
}

/// As [`stale_reason`], for a check that starts early
/// ([`crate::AdmissionCheckController::start_early`]): `entry_expected` says whether the
/// Workload's ClusterQueue applies the check to it
/// ([`crate::ClusterQueues::check_applies`], from [`crate::LeaderContext::cluster_queues`]), so that what was started before Kueue added the
/// entry is kept while the entry is due (it still goes once the Workload loses its quota).
pub fn stale_reason_expecting_entry(
    holding: &Holding<'_>,
    workload: Option<&Workload>,
    shadow: Option<&ShadowScope>,
    entry_expected: bool,
) -> Option<String> {
    let Some(wl) = workload else {
        return Some("its Workload no longer exists".into());
    };
    if wl.uid().as_deref() != Some(holding.uid) {
        return Some("its Workload was deleted (one of the same name is another one)".into());
    }
    let idle = |reason: crate::release::ReleaseReason| {
        Some(format!(
            "its Workload no longer needs it ({})",
            reason.as_str().replace('_', " ")
        ))
    };
    if let Some(scope) = shadow {
        return match shadow_eligibility(wl, scope) {
            ShadowEligibility::Decide { .. } => None,
            ShadowEligibility::Idle(reason) => idle(reason),
        };
    }
    match (
        standing(wl, holding.check, true, entry_expected),
        holding.lasts,
    ) {
        (Eligibility::Idle(reason), _) => idle(reason),
        (Eligibility::Wait(state), Lasts::WhileAnswered | Lasts::ForTheAdmission { .. }) => {
            Some(format!("its check answered {state}"))
        }
        (_, Lasts::ForTheAdmission { evictions }) if wl.total_evictions() != evictions => {
            Some("its Workload was evicted since".into())
        }
        (_, Lasts::ForTheAttempt(attempt)) => {
            let current = crate::attempts::attempt(wl, holding.check);
            (attempt < current)
                .then(|| format!("attempt {attempt} was superseded by attempt {current}"))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::CheckState;
    use crate::testing::WorkloadBuilder;

    const UID: &str = "uid-ns-w";

    fn holding(lasts: Lasts) -> Holding<'static> {
        Holding {
            uid: UID,
            check: "c",
            lasts,
        }
    }

    fn holding_quota(state: CheckState) -> WorkloadBuilder {
        WorkloadBuilder::new("ns", "w")
            .check("c", state)
            .quota_reserved("cq", "f")
    }

    #[test]
    fn every_kind_ends_with_the_workload() {
        let scope = ShadowScope::AllClusterQueues;
        let other = WorkloadBuilder::new("ns", "w").uid("another").build();
        let finished = holding_quota(CheckState::Ready).finished().build();
        let lasts = [
            Lasts::WhileAnswered,
            Lasts::ForTheAdmission { evictions: 0 },
            Lasts::ForTheAttempt(1),
        ];
        for lasts in lasts {
            let h = holding(lasts);
            for shadow in [None, Some(&scope)] {
                let gone = stale_reason(&h, None, shadow).unwrap_or_default();
                assert!(gone.contains("no longer exists"), "{gone}");
                let renamed = stale_reason(&h, Some(&other), shadow).unwrap_or_default();
                assert!(renamed.contains("another one"), "{renamed}");
                let done = stale_reason(&h, Some(&finished), shadow).unwrap_or_default();
                assert!(done.contains("(finished)"), "{done}");
            }
        }
    }

    #[test]
    fn a_charge_ends_with_its_admission_and_licenses_with_the_answer() {
        let charge = holding(Lasts::ForTheAdmission { evictions: 0 });
        let licenses = holding(Lasts::WhileAnswered);
        let ready = holding_quota(CheckState::Ready).build();
        assert_eq!(stale_reason(&charge, Some(&ready), None), None);
        assert_eq!(stale_reason(&licenses, Some(&ready), None), None);
        let readmitted = holding_quota(CheckState::Pending)
            .eviction_count("Preempted", 1)
            .build();
        assert!(
            stale_reason(&charge, Some(&readmitted), None).is_some_and(|r| r.contains("evicted"))
        );
        assert_eq!(stale_reason(&licenses, Some(&readmitted), None), None);
        let retried = holding_quota(CheckState::Retry).build();
        assert_eq!(
            stale_reason(&licenses, Some(&retried), None).as_deref(),
            Some("its check answered Retry")
        );
    }

    #[test]
    fn a_request_lasts_for_its_attempt_while_kueue_acts_on_the_answer() {
        let request = holding(Lasts::ForTheAttempt(1));
        let retried = holding_quota(CheckState::Retry).build();
        assert_eq!(stale_reason(&request, Some(&retried), None), None);
        let next = holding_quota(CheckState::Pending)
            .retry_count("c", 1)
            .build();
        let reason = stale_reason(&request, Some(&next), None).unwrap_or_default();
        assert!(reason.contains("superseded by attempt 2"), "{reason}");
        let no_quota = WorkloadBuilder::new("ns", "w")
            .check("c", CheckState::Pending)
            .build();
        assert!(stale_reason(&request, Some(&no_quota), None).is_some());
    }

    #[test]
    fn in_shadow_mode_the_quota_in_scope_is_what_needs_it() {
        let scope = ShadowScope::of(vec!["cq".into()]);
        let admitted_without_entry = WorkloadBuilder::new("ns", "w")
            .quota_reserved("cq", "f")
            .admitted()
            .build();
        let h = holding(Lasts::WhileAnswered);
        assert_eq!(
            stale_reason(&h, Some(&admitted_without_entry), Some(&scope)),
            None
        );
        let reason = stale_reason(&h, Some(&admitted_without_entry), None).unwrap_or_default();
        assert!(reason.contains("(check removed)"), "{reason}");
    }
}

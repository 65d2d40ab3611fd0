//! Shadow mode, the pure part: which Workloads a shadowed check is asked about, when it is
//! asked again, and which of its answers are news worth an Event and a count.
//!
//! A check in shadow mode decides as usual but writes no answers on Workloads: no ClusterQueue
//! waits on it (its AdmissionCheck is kept `Active=False`, reason `ShadowMode`, so a queue that
//! lists it by mistake stops admitting rather than waiting forever). A Workload that already
//! holds quota with its entry `Pending` (the check was enforcing, or the queue lists it) is
//! told so on the entry and gives its quota back (`Retry`) after the permanent-failure hold. It is asked about every
//! Workload holding quota on a ClusterQueue in its [`ShadowScope`], once per quota reservation
//! (again while its answer is `Pending`), and its would-be answers are published. What it took
//! (a budget charge, a license) is given back through `release` as in enforcing mode, so its
//! bookkeeping shows what enforcing would have held.

use std::collections::BTreeSet;

use crate::api::{CheckState, Workload, workload_condition as cond};
use crate::release::ReleaseReason;

/// Which Workloads a check in shadow mode is asked about.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ShadowScope {
    /// Workloads holding quota on any ClusterQueue.
    #[default]
    AllClusterQueues,
    /// Workloads holding quota on one of these ClusterQueues.
    ClusterQueues(BTreeSet<String>),
}

impl ShadowScope {
    /// A scope from a list of ClusterQueue names; an empty list means every ClusterQueue.
    pub fn of(cluster_queues: impl IntoIterator<Item = String>) -> Self {
        let names: BTreeSet<String> = cluster_queues
            .into_iter()
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
            .collect();
        if names.is_empty() {
            Self::AllClusterQueues
        } else {
            Self::ClusterQueues(names)
        }
    }

    /// Whether Workloads of `cluster_queue` are in the scope.
    pub fn covers(&self, cluster_queue: &str) -> bool {
        match self {
            Self::AllClusterQueues => true,
            Self::ClusterQueues(names) => names.contains(cluster_queue),
        }
    }

    /// For messages: "every ClusterQueue" or "ClusterQueues a, b".
    pub fn describe(&self) -> String {
        match self {
            Self::AllClusterQueues => "every ClusterQueue".into(),
            Self::ClusterQueues(names) => {
                let list: Vec<&str> = names.iter().map(String::as_str).collect();
                format!("ClusterQueues {}", list.join(", "))
            }
        }
    }
}

/// Whether a shadowed check is asked about a Workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShadowEligibility {
    /// The Workload holds quota in scope; `reservation` names this reservation, so an answer
    /// is asked for once per reservation.
    Decide {
        /// The ClusterQueue and the time quota was reserved.
        reservation: String,
    },
    /// Not in the shadow's view (anymore): what the check took for it may be released.
    Idle(ReleaseReason),
}

/// Decides whether a shadowed check is asked about `wl`.
pub fn shadow_eligibility(wl: &Workload, scope: &ShadowScope) -> ShadowEligibility {
    use ShadowEligibility::*;
    if wl.metadata.deletion_timestamp.is_some() {
        return Idle(ReleaseReason::Deleted);
    }
    if wl.condition_is_true(cond::FINISHED) {
        return Idle(ReleaseReason::Finished);
    }
    if !wl.is_active() || wl.condition_is_true(cond::DEACTIVATION_TARGET) {
        return Idle(ReleaseReason::Deactivated);
    }
    if wl.condition_is_true(cond::EVICTED) {
        return Idle(ReleaseReason::Evicted);
    }
    let Some(reserved) = wl
        .condition(cond::QUOTA_RESERVED)
        .filter(|c| c.status == "True")
    else {
        return Idle(ReleaseReason::QuotaReleased);
    };
    let Some(cluster_queue) = wl
        .status
        .as_ref()
        .and_then(|s| s.admission.as_ref())
        .map(|a| a.cluster_queue.as_str())
    else {
        return Idle(ReleaseReason::QuotaReleased);
    };
    if !scope.covers(cluster_queue) {
        return Idle(ReleaseReason::CheckRemoved);
    }
    Decide {
        reservation: format!("{cluster_queue}@{}", reserved.last_transition_time.0),
    }
}

/// A shadowed check's last would-be answer for one Workload and check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShadowRecord {
    /// The reservation it was given for ([`ShadowEligibility::Decide`]).
    pub reservation: String,
    /// The would-be state.
    pub state: CheckState,
    /// The would-be message.
    pub message: String,
}

/// What to do for a Workload in scope, given the last record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShadowStep {
    /// Ask the check (first time for this reservation, or its last answer was `Pending`).
    Ask,
    /// Ask, after releasing what it took for an earlier reservation (evicted and given quota
    /// again between two looks).
    ReleaseThenAsk,
    /// Its answer for this reservation is final (`Ready`, `Retry`, `Rejected`).
    Done,
}

/// The next step for a Workload in scope at `reservation`.
pub fn shadow_step(last: Option<&ShadowRecord>, reservation: &str) -> ShadowStep {
    match last {
        None => ShadowStep::Ask,
        Some(r) if r.reservation != reservation => ShadowStep::ReleaseThenAsk,
        Some(r) if r.state == CheckState::Pending => ShadowStep::Ask,
        Some(_) => ShadowStep::Done,
    }
}

/// Whether `answer` is news: the first for its reservation, or another state or message than
/// the last. Only news is published (an Event and a count), so a `Pending` asked again on every
/// change of the Workload is counted once.
pub fn is_news(last: Option<&ShadowRecord>, answer: &ShadowRecord) -> bool {
    last.is_none_or(|r| {
        r.reservation != answer.reservation
            || r.state != answer.state
            || r.message != answer.message
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::WorkloadBuilder;

    fn record(reservation: &str, state: CheckState, message: &str) -> ShadowRecord {
        ShadowRecord {
            reservation: reservation.into(),
            state,
            message: message.into(),
        }
    }

    #[test]
    fn a_scope_from_an_empty_list_is_every_queue() {
        assert_eq!(ShadowScope::of(Vec::new()), ShadowScope::AllClusterQueues);
        assert_eq!(
            ShadowScope::of(vec![" ".into()]),
            ShadowScope::AllClusterQueues
        );
        let scope = ShadowScope::of(vec!["a".into(), " b ".into()]);
        assert!(scope.covers("a") && scope.covers("b") && !scope.covers("c"));
        assert_eq!(scope.describe(), "ClusterQueues a, b");
    }

    #[test]
    fn only_workloads_holding_quota_in_scope_are_asked() {
        let scope = ShadowScope::of(vec!["cq".into()]);
        let holding = WorkloadBuilder::new("ns", "w")
            .quota_reserved("cq", "f")
            .build();
        assert!(matches!(
            shadow_eligibility(&holding, &scope),
            ShadowEligibility::Decide { reservation } if reservation.starts_with("cq@")
        ));
        let elsewhere = WorkloadBuilder::new("ns", "w")
            .quota_reserved("other", "f")
            .build();
        assert_eq!(
            shadow_eligibility(&elsewhere, &scope),
            ShadowEligibility::Idle(ReleaseReason::CheckRemoved)
        );
        let queued = WorkloadBuilder::new("ns", "w").build();
        assert_eq!(
            shadow_eligibility(&queued, &scope),
            ShadowEligibility::Idle(ReleaseReason::QuotaReleased)
        );
        let finished = WorkloadBuilder::new("ns", "w")
            .quota_reserved("cq", "f")
            .finished()
            .build();
        assert_eq!(
            shadow_eligibility(&finished, &scope),
            ShadowEligibility::Idle(ReleaseReason::Finished)
        );
        let evicted = WorkloadBuilder::new("ns", "w")
            .quota_reserved("cq", "f")
            .evicted("Preempted")
            .build();
        assert_eq!(
            shadow_eligibility(&evicted, &ShadowScope::AllClusterQueues),
            ShadowEligibility::Idle(ReleaseReason::Evicted)
        );
    }

    #[test]
    fn asked_once_per_reservation_and_again_while_pending() {
        assert_eq!(shadow_step(None, "cq@1"), ShadowStep::Ask);
        let pending = record("cq@1", CheckState::Pending, "waiting");
        assert_eq!(shadow_step(Some(&pending), "cq@1"), ShadowStep::Ask);
        for state in [CheckState::Ready, CheckState::Retry, CheckState::Rejected] {
            let r = record("cq@1", state, "m");
            assert_eq!(shadow_step(Some(&r), "cq@1"), ShadowStep::Done);
            assert_eq!(shadow_step(Some(&r), "cq@2"), ShadowStep::ReleaseThenAsk);
        }
    }

    #[test]
    fn only_a_new_state_or_message_or_reservation_is_news() {
        let last = record("cq@1", CheckState::Pending, "waiting");
        assert!(is_news(None, &last));
        assert!(!is_news(Some(&last), &last.clone()));
        assert!(is_news(
            Some(&last),
            &record("cq@1", CheckState::Pending, "still waiting")
        ));
        assert!(is_news(
            Some(&last),
            &record("cq@1", CheckState::Rejected, "waiting")
        ));
        assert!(is_news(
            Some(&last),
            &record("cq@2", CheckState::Pending, "waiting")
        ));
    }
}

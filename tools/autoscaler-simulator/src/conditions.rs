//! The vocabulary of cluster-autoscaler 1.36.1 on ProvisioningRequests: its classes, parameters,
//! pod annotations and condition reasons (these strings carry over exactly), and how a condition
//! write merges into a status (pure).
//!
//! Condition messages are the simulator's own words: only the reasons are cluster-autoscaler's.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kueue_admission_sdk::api::find_condition;

/// The class that checks for existing capacity and never scales up.
pub const CHECK_CAPACITY_CLASS: &str = "check-capacity.autoscaling.x-k8s.io";

/// The class that scales up one node group for all the pods at once, or not at all.
pub const BEST_EFFORT_CLASS: &str = "best-effort-atomic-scale-up.autoscaling.x-k8s.io";

/// The parameter that makes a check-capacity request fail instead of retrying (`"true"` only).
pub const NO_RETRY_PARAMETER: &str = "noRetry";

/// The parameter that routes a check-capacity request to one processor instance. cluster-
/// autoscaler without `--check-capacity-processor-instance` (as simulated) ignores every request
/// that carries a non-empty one.
pub const PROCESSOR_INSTANCE_PARAMETER: &str = "processorInstance";

/// The pod annotation naming the request a pod consumes.
pub const CONSUME_ANNOTATION: &str = "autoscaling.x-k8s.io/consume-provisioning-request";

/// The deprecated pod annotation naming the request a pod consumes, still honoured.
pub const DEPRECATED_CONSUME_ANNOTATION: &str =
    "cluster-autoscaler.kubernetes.io/consume-provisioning-request";

/// The reasons cluster-autoscaler 1.36.1 writes.
pub mod reason {
    /// Accepted=True.
    pub const ACCEPTED: &str = "Accepted";
    /// Provisioned=True: the pods fit existing (or upcoming) capacity.
    pub const CAPACITY_IS_FOUND: &str = "CapacityIsFound";
    /// Provisioned=True after a best-effort scale-up was requested.
    pub const CAPACITY_IS_PROVISIONED: &str = "CapacityIsProvisioned";
    /// Provisioned=False (retried after a backoff), or Failed=True with `noRetry`.
    pub const CAPACITY_IS_NOT_FOUND: &str = "CapacityIsNotFound";
    /// Failed=True: a referenced PodTemplate is missing.
    pub const FAILED_TO_CREATE_PODS: &str = "FailedToCreatePods";
    /// Failed=True: a booked request's PodTemplate is gone.
    pub const FAILED_TO_BOOK_CAPACITY: &str = "FailedToBookCapacity";
    /// BookingExpired=True: the booking window passed.
    pub const CAPACITY_RESERVATION_TIME_EXPIRED: &str = "CapacityReservationTimeExpired";
    /// Failed=True: never provisioned within the request's lifetime.
    pub const EXPIRED: &str = "Expired";
}

/// Whether the condition of this type is present with status `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find_condition(conditions, type_).is_some_and(|c| c.status == "True")
}

/// A condition of `type_` with `True` or `False`, stamped `now` (cluster-autoscaler restamps
/// lastTransitionTime on every write, even when nothing else changes).
pub fn condition(
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: Timestamp,
) -> Condition {
    Condition {
        type_: type_.to_string(),
        status: if status { "True" } else { "False" }.to_string(),
        reason: reason.to_string(),
        message,
        last_transition_time: Time(whole_seconds(now)),
        observed_generation: generation,
    }
}

/// `existing` with every condition of `added` replacing the one of its type in place, or
/// appended: how cluster-autoscaler updates a status.
pub fn merged_conditions(existing: &[Condition], added: Vec<Condition>) -> Vec<Condition> {
    let mut merged = existing.to_vec();
    for condition in added {
        match merged.iter_mut().find(|c| c.type_ == condition.type_) {
            Some(slot) => *slot = condition,
            None => merged.push(condition),
        }
    }
    merged
}

/// `now`, to the second: what the API server keeps of a condition's lastTransitionTime.
pub fn whole_seconds(now: Timestamp) -> Timestamp {
    Timestamp::from_second(now.as_second()).unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + second).expect("in range")
    }

    /// Rule 11: a write replaces a type in place (restamped) and appends a new type.
    #[test]
    fn rule_11_merging_replaces_in_place_and_appends() {
        let old = vec![
            condition(
                "Accepted",
                true,
                reason::ACCEPTED,
                "a".into(),
                Some(1),
                at(0),
            ),
            condition("Other", true, "X", "x".into(), Some(1), at(0)),
        ];
        let merged = merged_conditions(
            &old,
            vec![
                condition(
                    "Accepted",
                    true,
                    reason::ACCEPTED,
                    "a".into(),
                    Some(2),
                    at(9),
                ),
                condition("Provisioned", false, "R", "r".into(), Some(2), at(9)),
            ],
        );
        let seen: Vec<_> = merged
            .iter()
            .map(|c| (c.type_.as_str(), c.last_transition_time.0))
            .collect();
        assert_eq!(
            seen,
            [
                ("Accepted", at(9)),
                ("Other", at(0)),
                ("Provisioned", at(9))
            ]
        );
        assert!(is_true(&merged, "Accepted") && !is_true(&merged, "Provisioned"));
    }

    #[test]
    fn stamps_are_whole_seconds() {
        let now = at(0)
            .checked_add(Duration::from_millis(900))
            .expect("in range");
        assert_eq!(whole_seconds(now), at(0));
        let c = condition("Failed", true, reason::EXPIRED, String::new(), None, now);
        assert_eq!(
            (c.status.as_str(), c.last_transition_time),
            ("True", Time(at(0)))
        );
    }
}

//! Which deployment answers an AdmissionCheck: a claim the leader writes on the check.
//!
//! Replicas of one deployment elect one leader on their Lease. Two *deployments* configured with
//! the same `controllerName` (a second Helm release in another namespace, a copy run by hand)
//! elect on different Leases, and both leaders would answer the same Workloads: two
//! ProvisioningRequests per attempt, a license booked twice. So a leader names its Lease in a
//! condition of its own on each check it answers ([`CLAIM_CONDITION`]), and a leader that finds
//! another Lease named stands down for that check, says so loudly (an Event on the check, the
//! log, `kueue_ac_check_claimed_elsewhere`) and never overwrites the claim. A leader that stops
//! cleanly withdraws its claims, so moving a controller to another namespace or Lease hands
//! the checks over by itself. Pure: the runtime reads and writes.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use crate::api::{AdmissionCheck, find_condition};

use super::lease::LeaderElection;

/// The condition type of the claim (a prefixed type, so it never collides with Kueue's own).
pub(crate) const CLAIM_CONDITION: &str = "kueue-admission-checks.dev/AnsweredBy";
/// Its reason.
const CLAIM_REASON: &str = "ElectedLeader";

/// The claim message of a deployment electing on `election`'s Lease: the same for every
/// replica of it, different for any other deployment.
pub(crate) fn claim_of(election: &LeaderElection) -> String {
    format!(
        "answered by the controller that elects its leader on Lease {}/{}",
        election.namespace, election.lease_name
    )
}

/// Who answers `ac`, as far as the check says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Claim {
    /// Nobody claims it: the leader may.
    Unclaimed,
    /// This deployment does.
    Ours,
    /// Another deployment does; its claim message.
    Elsewhere(String),
}

/// Judges the claim on `ac` against `ours` (this deployment's claim message).
pub(crate) fn judge(ac: &AdmissionCheck, ours: &str) -> Claim {
    match claim_on(ac) {
        None => Claim::Unclaimed,
        Some(message) if message == ours => Claim::Ours,
        Some(message) => Claim::Elsewhere(message.to_string()),
    }
}

/// The claim message on `ac`, if any.
pub(crate) fn claim_on(ac: &AdmissionCheck) -> Option<&str> {
    ac.status
        .as_ref()
        .and_then(|s| find_condition(&s.conditions, CLAIM_CONDITION))
        .filter(|c| c.status == "True")
        .map(|c| c.message.as_str())
}

/// The claim condition to write on `ac`, keeping its transition time if it already says so.
pub(crate) fn claim_condition(ac: &AdmissionCheck, ours: &str, now: Timestamp) -> Condition {
    let current = ac
        .status
        .as_ref()
        .and_then(|s| find_condition(&s.conditions, CLAIM_CONDITION));
    let last_transition_time = match current {
        Some(c) if c.status == "True" && c.message == ours => c.last_transition_time.clone(),
        _ => Time(now),
    };
    Condition {
        type_: CLAIM_CONDITION.into(),
        status: "True".into(),
        reason: CLAIM_REASON.into(),
        message: ours.into(),
        last_transition_time,
        observed_generation: ac.metadata.generation,
    }
}

/// What a deployment that finds `other` claiming `check` tells the operator.
pub(crate) fn conflict_message(check: &str, controller_name: &str, other: &str) -> String {
    format!(
        "AdmissionCheck {check} (controllerName {controller_name}) is {other}, not by this \
         deployment: two deployments are configured with the same controllerName. This one \
         stands down for the check and answers nothing for it. Remove one deployment, or give \
         each its own controllerName; if the other one no longer runs, remove the \
         {CLAIM_CONDITION} condition from the check's status"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(claim: Option<&str>) -> AdmissionCheck {
        let conditions: Vec<_> = claim
            .map(|m| {
                json!({"type": CLAIM_CONDITION, "status": "True", "reason": CLAIM_REASON,
                       "message": m, "lastTransitionTime": "2026-11-25T00:00:00Z"})
            })
            .into_iter()
            .chain([
                json!({"type": "Active", "status": "True", "reason": "Active",
                           "message": "", "lastTransitionTime": "2026-11-25T00:00:00Z"}),
            ])
            .collect();
        serde_json::from_value(json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "AdmissionCheck",
            "metadata": {"name": "capacity", "generation": 3},
            "spec": {"controllerName": "example.com/capacity"},
            "status": {"conditions": conditions},
        }))
        .expect("an AdmissionCheck")
    }

    #[test]
    fn every_replica_of_a_deployment_shares_its_claim_and_another_deployment_differs() {
        let mut a1 = LeaderElection::new("team-a", "example.com-capacity");
        let a2 = LeaderElection::new("team-a", "example.com-capacity");
        a1.identity = "pod-1_0001".into();
        let b = LeaderElection::new("team-b", "example.com-capacity");
        assert_eq!(claim_of(&a1), claim_of(&a2));
        assert_ne!(claim_of(&a1), claim_of(&b));
        assert!(claim_of(&b).contains("Lease team-b/example.com-capacity"));
    }

    #[test]
    fn a_claim_is_judged_against_ours() {
        let ours = claim_of(&LeaderElection::new("team-a", "x"));
        let theirs = claim_of(&LeaderElection::new("team-b", "x"));
        assert_eq!(judge(&check(None), &ours), Claim::Unclaimed);
        assert_eq!(judge(&check(Some(&ours)), &ours), Claim::Ours);
        assert_eq!(
            judge(&check(Some(&theirs)), &ours),
            Claim::Elsewhere(theirs.clone())
        );
        let message = conflict_message("capacity", "example.com/capacity", &theirs);
        assert!(
            message.contains("team-b/x") && message.contains("stands down"),
            "{message}"
        );
    }

    #[test]
    fn a_rewritten_claim_keeps_its_transition_time_a_taken_over_one_does_not() {
        let ours = claim_of(&LeaderElection::new("team-a", "x"));
        let now = Timestamp::from_second(1_900_000_000).expect("a time");
        let kept = claim_condition(&check(Some(&ours)), &ours, now);
        assert_eq!(
            kept.last_transition_time.0.to_string(),
            "2026-11-25T00:00:00Z"
        );
        assert_eq!(kept.observed_generation, Some(3));
        let fresh = claim_condition(&check(None), &ours, now);
        assert_eq!(fresh.last_transition_time.0, now);
        assert_eq!(fresh.message, ours);
    }
}

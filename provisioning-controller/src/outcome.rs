//! Pure: what a ProvisioningRequest's conditions (and the clock) mean for the check.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kueue_admission_sdk::Decision;
use kueue_admission_sdk::api::{
    PodSetUpdate, ProvisioningRequest, ProvisioningRequestPodSetUpdatesNodeSelector,
    find_condition, provisioning_condition as pr,
};

/// Pod annotation naming the request whose capacity the pod consumes.
pub const CONSUME_ANNOTATION: &str = "autoscaling.x-k8s.io/consume-provisioning-request";
/// Pod annotation naming the request's provisioning class.
pub const CLASS_ANNOTATION: &str = "autoscaling.x-k8s.io/provisioning-class-name";

/// What the request says, in the order Kueue's built-in check reads it (first match wins).
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// `Failed`: this attempt is over.
    Failed(String),
    /// `CapacityRevoked`: the capacity is gone, also after admission.
    Revoked(String),
    /// `BookingExpired` before the Workload was admitted: the booking is gone.
    BookingExpired(String),
    /// `Provisioned` (a `BookingExpired` after admission changes nothing here: see [`stranded`]).
    Provisioned,
    /// Not provisioned within the timeout, counted from the request's creation.
    TimedOut(Duration),
    /// No condition yet, younger than [`UNSEEN_GRACE`]: no autoscaler has looked at it yet,
    /// and none is expected to have; `grace_left` until that changes.
    Unseen {
        /// Time left before the grace ends.
        grace_left: Duration,
    },
    /// Still waiting; the request's latest message (e.g. an ETA) and when the timeout falls due.
    Waiting {
        /// The message of the request's most recent condition, if any.
        message: Option<String>,
        /// Time left before the timeout, if one is set.
        timeout_in: Option<Duration>,
    },
}

/// How long a request may go without any condition before the check says so: an autoscaler
/// looks at a new request in its next loop (cluster-autoscaler's runs every 10 s by default).
/// Until then the entry is left as it is when it says nothing or already names the request
/// ([`quiet`]): with a fast autoscaler the next word is `Provisioned`, and a `Pending` write
/// that only says "created" would be one more Workload status write (and watch event for every
/// watcher of Workloads) per attempt.
pub const UNSEEN_GRACE: Duration = Duration::from_secs(10);

/// The reason of `BookingExpired` that cluster-autoscaler 1.37 writes once every pod of the
/// request is scheduled: the booking ended because it was used, not because it ran out. A
/// non-event, admitted or not (unlike `CapacityReservationTimeExpired`).
pub const BOOKING_CONSUMED: &str = "CapacityBookingConsumed";

/// The request's `BookingExpired=True` when its booking ran out, not when it was used up by
/// its pods ([`BOOKING_CONSUMED`]).
pub fn booking_ran_out(
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
) -> Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    find_condition(conditions, pr::BOOKING_EXPIRED)
        .filter(|c| c.status == "True" && c.reason != BOOKING_CONSUMED)
}

/// Reads `request` for a Workload that is `admitted` or not, at `now`.
pub fn outcome(
    request: &ProvisioningRequest,
    admitted: bool,
    timeout: Option<Duration>,
    now: Timestamp,
) -> Outcome {
    let conditions = request
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let is_true = |type_: &str| find_condition(conditions, type_).filter(|c| c.status == "True");
    let text = |c: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition| {
        if c.message.is_empty() {
            c.reason.clone()
        } else {
            c.message.clone()
        }
    };
    if let Some(c) = is_true(pr::FAILED) {
        return Outcome::Failed(text(c));
    }
    if let Some(c) = is_true(pr::CAPACITY_REVOKED) {
        return Outcome::Revoked(text(c));
    }
    if let Some(c) = booking_ran_out(conditions)
        && !admitted
    {
        return Outcome::BookingExpired(text(c));
    }
    if is_true(pr::PROVISIONED).is_some() {
        return Outcome::Provisioned;
    }
    let created = request
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0)
        .unwrap_or(now);
    // A creation time ahead of our clock (skew with the API server) is age 0, not its distance:
    // an absolute value would count the skew as age and time the request out early.
    let age = age_at(now, created);
    let timeout_in = match timeout {
        Some(limit) if age >= limit => return Outcome::TimedOut(limit),
        Some(limit) => Some(limit - age),
        None => None,
    };
    if conditions.is_empty() && age < UNSEEN_GRACE {
        return Outcome::Unseen {
            grace_left: UNSEEN_GRACE - age,
        };
    }
    let message = match conditions.is_empty() {
        true => Some(format!(
            "no autoscaler has written a condition on it in {}s; is one serving its \
             provisioning class?",
            UNSEEN_GRACE.as_secs()
        )),
        false => conditions
            .iter()
            .filter(|c| !c.message.is_empty())
            .max_by_key(|c| c.last_transition_time.0)
            .map(|c| c.message.clone()),
    };
    Outcome::Waiting {
        message,
        timeout_in,
    }
}

/// The podSetUpdates of a provisioned request: for every podset it covers (merged ones
/// included), the two autoscaler annotations, and a node selector per configured entry whose
/// detail the request carries.
pub fn pod_set_updates(
    request: &ProvisioningRequest,
    pod_sets: &[String],
    node_selector: &[ProvisioningRequestPodSetUpdatesNodeSelector],
) -> Vec<PodSetUpdate> {
    let name = request.metadata.name.clone().unwrap_or_default();
    let details = request
        .status
        .as_ref()
        .map(|s| &s.provisioning_class_details);
    let selector: BTreeMap<String, String> = node_selector
        .iter()
        .filter_map(|e| {
            details
                .and_then(|d| d.get(&e.value_from_provisioning_class_detail))
                .map(|v| (e.key.clone(), v.clone()))
        })
        .collect();
    pod_sets
        .iter()
        .map(|pod_set| PodSetUpdate {
            name: pod_set.clone(),
            annotations: BTreeMap::from([
                (CONSUME_ANNOTATION.to_string(), name.clone()),
                (
                    CLASS_ANNOTATION.to_string(),
                    request.spec.provisioning_class_name.clone(),
                ),
            ]),
            node_selector: selector.clone(),
            ..Default::default()
        })
        .collect()
}

/// The check's answer for an outcome. `Retry` carries no delay: the SDK applies the config's
/// retry strategy and turns it into `Rejected` past `backoffLimitCount`.
pub fn decision(
    outcome: &Outcome,
    request: &str,
    attempt: u32,
    updates: impl FnOnce() -> Vec<PodSetUpdate>,
) -> Decision {
    match outcome {
        Outcome::Failed(m) => Decision::retry(format!("ProvisioningRequest {request} failed: {m}")),
        Outcome::BookingExpired(m) => Decision::retry(format!(
            "ProvisioningRequest {request}: the booking expired before admission: {m}"
        )),
        Outcome::TimedOut(limit) => Decision::retry(format!(
            "ProvisioningRequest {request} was not provisioned within {}s",
            limit.as_secs()
        )),
        Outcome::Revoked(m) => Decision::rejected(format!(
            "ProvisioningRequest {request}: capacity revoked: {m}"
        )),
        Outcome::Provisioned => {
            let updates = updates();
            let mut message = format!("ProvisioningRequest {request} provisioned");
            if let Some(why) = invalid_class_detail(&updates) {
                // The SDK refuses this Ready (Kueue would): the reason goes on the entry, the
                // quota is held for a while, then given back. The message says where it came from.
                message.push_str(&format!(
                    ", but {why}; fix the autoscaler's class details or the \
                     ProvisioningRequestConfig's podSetUpdates.nodeSelector"
                ));
            }
            Decision::ready_with_updates(message, updates)
        }
        Outcome::Unseen { grace_left } => Decision::pending_recheck_after(
            format!(
                "waiting for ProvisioningRequest {request} (attempt {attempt}) to be provisioned"
            ),
            *grace_left,
        ),
        Outcome::Waiting {
            message,
            timeout_in,
        } => {
            let mut text = format!(
                "waiting for ProvisioningRequest {request} (attempt {attempt}) to be provisioned"
            );
            if let Some(m) = message {
                text.push_str(": ");
                text.push_str(m);
            }
            match timeout_in {
                // Asked again when the timeout falls due, even if the request never changes.
                Some(left) => Decision::pending_recheck_after(text, *left),
                None => Decision::pending(text),
            }
        }
    }
}

/// While `request` is [`Outcome::Unseen`], the answer that writes nothing: `Pending` with the
/// entry's own message (`entry_message`), asked again when the grace ends (the request's watch
/// wakes the Workload sooner, as soon as an autoscaler writes a condition). Only when the entry
/// says nothing yet (Kueue adds it empty) or already names this request: a message of another
/// attempt is replaced at once. `None`: answer as [`decision`] says.
pub fn quiet(outcome: &Outcome, entry_message: &str, request: &str) -> Option<Decision> {
    let Outcome::Unseen { grace_left } = outcome else {
        return None;
    };
    (entry_message.is_empty() || names(entry_message, request))
        .then(|| Decision::pending_recheck_after(entry_message, *grace_left))
}

/// Whether `message` names the request `name` (`namespace/name`) itself, not one whose name
/// only begins with it (attempt 1's `wl-check-1` in attempt 10's `wl-check-10`).
fn names(message: &str, name: &str) -> bool {
    message.match_indices(name).any(|(at, _)| {
        message[at + name.len()..]
            .chars()
            .next()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '-' || c == '.'))
    })
}

/// What a `Ready` entry becomes when its request changes (the Workload `admitted` or not):
/// `None` keeps the answer as written. The capacity revoked withdraws it, also after admission;
/// before admission, an expired booking or a request that failed after it was provisioned
/// (another check still holding the Workload back) is a failed attempt, as with Kueue's
/// built-in check: `Retry`, counted against the retry limit. After admission a `Failed` or an
/// expired booking changes nothing: the pods are placed, and only a revocation takes the
/// capacity away (Kueue's built-in check answers `Retry` to a `Failed` then, evicting the
/// running Workload). Pods left without room when the booking runs out are [`stranded`]'s.
pub fn revalidation(
    outcome: &Outcome,
    admitted: bool,
    request: &str,
    attempt: u32,
) -> Option<Decision> {
    match outcome {
        Outcome::Revoked(_) | Outcome::BookingExpired(_) => {
            Some(decision(outcome, request, attempt, Vec::new))
        }
        Outcome::Failed(m) if !admitted => Some(Decision::retry(format!(
            "ProvisioningRequest {request} failed after it was provisioned, before the \
             workload was admitted: {m}"
        ))),
        _ => None,
    }
}

/// A pod that consumes a request and that the scheduler tried and found no room for.
#[derive(Clone, Debug, PartialEq)]
pub struct Unplaced {
    /// The pod's name.
    pub pod: String,
    /// The scheduler's message (`0/30 nodes are available: ...`).
    pub why: String,
}

/// The pods of `pods` that consume `request` and that the scheduler has tried and could not
/// place: `Pending`, bound to no Node, not being deleted, `PodScheduled=False` with reason
/// `Unschedulable`. A pod not tried yet is not one of them.
pub fn unplaced_consumers(pods: &[Pod], request: &str) -> Vec<Unplaced> {
    pods.iter()
        .filter(|p| {
            p.annotations().get(CONSUME_ANNOTATION).map(String::as_str) == Some(request)
                && p.metadata.deletion_timestamp.is_none()
                && p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none()
        })
        .filter_map(|p| {
            let status = p.status.as_ref()?;
            if status.phase.as_deref() != Some("Pending") {
                return None;
            }
            let scheduled = status
                .conditions
                .as_ref()?
                .iter()
                .find(|c| c.type_ == "PodScheduled")?;
            (scheduled.status == "False" && scheduled.reason.as_deref() == Some("Unschedulable"))
                .then(|| Unplaced {
                    pod: p.name_any(),
                    why: scheduled.message.clone().unwrap_or_default(),
                })
        })
        .collect()
}

/// The longest part of the scheduler's message quoted on the entry.
const QUOTED_REASON: usize = 300;

/// What an admitted Workload's `Ready` answer becomes once its request's booking ran out while
/// some of its pods are `unplaced` (others took the room made for them: the scheduler knows
/// nothing of requests). cluster-autoscaler never scales up for a pod that consumes a request,
/// so those pods would stay `Pending` for good with the quota held: `Retry` at once (no delay:
/// the delay would keep the quota until it ends), which evicts the Workload and makes a new
/// attempt ask for capacity again. It counts against the retry limit. `None`: nothing unplaced.
pub fn stranded(request: &str, unplaced: &[Unplaced]) -> Option<Decision> {
    let first = unplaced.first()?;
    let mut why: String = first.why.chars().take(QUOTED_REASON).collect();
    if why.len() < first.why.len() {
        why.push_str("...");
    }
    Some(Decision::retry_after(
        format!(
            "ProvisioningRequest {request}: its booking ran out with {} pod(s) that consume it \
             not scheduled ({}: {why}); other pods took the capacity made for them, and \
             cluster-autoscaler never scales up for pods that consume a request, so a new \
             attempt asks for capacity again",
            unplaced.len(),
            first.pod,
        ),
        Duration::ZERO,
    ))
}

/// The first node selector of `updates` whose value (from the request's
/// `provisioningClassDetails`) is not a label value, said for the user: Kueue refuses such a
/// podSetUpdate, so the Workload could never start with it.
pub fn invalid_class_detail(updates: &[PodSetUpdate]) -> Option<String> {
    updates.iter().find_map(|u| {
        u.node_selector.iter().find_map(|(key, value)| {
            kueue_admission_sdk::api::validation::label_value(value)
                .err()
                .map(|why| {
                    format!(
                        "the provisioningClassDetails value for node selector {key:?} is not a \
                         valid label value: it {why}"
                    )
                })
        })
    })
}

/// How long ago `since` was at `now`, 0 if it is in the future.
pub(crate) fn age_at(now: Timestamp, since: Timestamp) -> Duration {
    now.duration_since(since)
        .max(k8s_openapi::jiff::SignedDuration::ZERO)
        .unsigned_abs()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use kueue_admission_sdk::api::{
        CheckState, ProvisioningRequestSpec, ProvisioningRequestStatus,
    };

    const T0: i64 = 1_800_000_000;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(T0 + secs).expect("valid")
    }

    fn request(conditions: &[(&str, i64, &str)]) -> ProvisioningRequest {
        let mut r = ProvisioningRequest::new(
            "wl-check-1",
            ProvisioningRequestSpec {
                provisioning_class_name: "check-capacity.autoscaling.x-k8s.io".into(),
                ..Default::default()
            },
        );
        r.metadata.creation_timestamp = Some(Time(at(0)));
        r.status = Some(ProvisioningRequestStatus {
            conditions: conditions
                .iter()
                .map(|(t, when, msg)| Condition {
                    type_: t.to_string(),
                    status: "True".into(),
                    reason: format!("{t}Reason"),
                    message: msg.to_string(),
                    last_transition_time: Time(at(*when)),
                    observed_generation: None,
                })
                .collect(),
            provisioning_class_details: BTreeMap::from([("zone".into(), "zone-a".into())]),
        });
        r
    }

    #[test]
    fn a_request_created_ahead_of_our_clock_is_not_timed_out_by_the_skew() {
        // Created at T0 by the API server's clock, 10 min ahead of ours; a 5 min timeout.
        let r = request(&[]);
        let timeout = Some(Duration::from_secs(300));
        assert_eq!(
            outcome(&r, false, timeout, at(-600)),
            Outcome::Unseen {
                grace_left: UNSEEN_GRACE
            }
        );
        assert_eq!(age_at(at(-600), at(0)), Duration::ZERO);
        assert_eq!(age_at(at(7), at(0)), Duration::from_secs(7));
    }

    #[test]
    fn first_match_wins_in_kueues_order() {
        let conditions = [
            (pr::PROVISIONED, 1, ""),
            (pr::BOOKING_EXPIRED, 2, ""),
            (pr::CAPACITY_REVOKED, 3, "revoked"),
            (pr::FAILED, 4, "no nodes"),
        ];
        // (how many of the conditions the request has, admitted, expected, why)
        for (n, admitted, expected, why) in [
            (4, false, Outcome::Failed("no nodes".into()), "failed first"),
            (3, true, Outcome::Revoked("revoked".into()), "then revoked"),
            (
                2,
                false,
                Outcome::BookingExpired("BookingExpiredReason".into()),
                "an empty message falls back to the reason",
            ),
            (
                2,
                true,
                Outcome::Provisioned,
                "an expired booking after admission changes nothing",
            ),
        ] {
            let r = request(&conditions[..n]);
            assert_eq!(outcome(&r, admitted, None, at(10)), expected, "{why}");
        }
    }

    #[test]
    fn a_booking_ended_because_its_pods_were_scheduled_is_no_failed_attempt() {
        let mut consumed = request(&[(pr::PROVISIONED, 1, ""), (pr::BOOKING_EXPIRED, 2, "")]);
        for c in &mut consumed.status.as_mut().expect("status").conditions {
            if c.type_ == pr::BOOKING_EXPIRED {
                c.reason = BOOKING_CONSUMED.into();
            }
        }
        // Even if our read is older than the admission (the pods only run once admitted).
        for admitted in [false, true] {
            let o = outcome(&consumed, admitted, None, at(10));
            assert_eq!(o, Outcome::Provisioned, "admitted: {admitted}");
            assert_eq!(revalidation(&o, admitted, "ns/wl-check-1", 1), None);
        }
    }

    #[test]
    fn a_ready_answer_is_withdrawn_before_admission_by_a_failure_and_after_only_by_revocation() {
        let provisioned = [(pr::ACCEPTED, 1, ""), (pr::PROVISIONED, 2, "")];
        let then = |c: (&'static str, i64, &'static str)| {
            let mut all = provisioned.to_vec();
            all.push(c);
            request(&all)
        };
        let failed = then((pr::FAILED, 5, "node group deleted"));
        let expired = then((pr::BOOKING_EXPIRED, 5, ""));
        let revoked = then((pr::CAPACITY_REVOKED, 5, "gone"));
        let still = request(&provisioned);
        let state = |r: &ProvisioningRequest, admitted: bool| {
            let o = outcome(r, admitted, None, at(10));
            revalidation(&o, admitted, "ns/wl-check-1", 1)
                .map(|d| (d.state(), d.message().to_string()))
        };
        assert_eq!(
            state(&failed, false),
            Some((
                CheckState::Retry,
                "ProvisioningRequest ns/wl-check-1 failed after it was provisioned, before the \
                 workload was admitted: node group deleted"
                    .to_string()
            ))
        );
        assert_eq!(
            state(&failed, true),
            None,
            "a failure after admission keeps Ready"
        );
        assert_eq!(state(&expired, false).map(|s| s.0), Some(CheckState::Retry));
        assert_eq!(state(&expired, true), None);
        for admitted in [false, true] {
            assert_eq!(
                state(&revoked, admitted).map(|s| s.0),
                Some(CheckState::Rejected)
            );
            assert_eq!(state(&still, admitted), None);
        }
    }

    #[test]
    fn a_false_condition_is_not_a_match() {
        let mut r = request(&[(pr::FAILED, 1, "no")]);
        if let Some(s) = r.status.as_mut() {
            s.conditions[0].status = "False".into();
        }
        assert!(matches!(
            outcome(&r, false, None, at(5)),
            Outcome::Waiting { .. }
        ));
    }

    #[test]
    fn waiting_carries_the_latest_message_and_the_time_left() {
        let r = request(&[(pr::ACCEPTED, 1, "ETA 10 minutes")]);
        assert_eq!(
            outcome(&r, false, Some(Duration::from_secs(60)), at(20)),
            Outcome::Waiting {
                message: Some("ETA 10 minutes".into()),
                timeout_in: Some(Duration::from_secs(40)),
            }
        );
        let d = decision(
            &outcome(&r, false, Some(Duration::from_secs(60)), at(20)),
            "ns/wl-check-1",
            1,
            Vec::new,
        );
        assert_eq!(
            d,
            Decision::pending_recheck_after(
                "waiting for ProvisioningRequest ns/wl-check-1 (attempt 1) to be provisioned: ETA 10 minutes",
                Duration::from_secs(40)
            )
        );
    }

    #[test]
    fn a_request_no_autoscaler_has_looked_at_yet_is_left_unsaid_for_the_grace_only() {
        let r = request(&[]);
        let fresh = outcome(&r, false, None, at(3));
        assert_eq!(
            fresh,
            Outcome::Unseen {
                grace_left: UNSEEN_GRACE - Duration::from_secs(3)
            }
        );
        let left = UNSEEN_GRACE - Duration::from_secs(3);
        // Kueue's empty entry, or one naming this request: nothing new to write.
        for entry in [
            "",
            "created ProvisioningRequest ns/wl-check-1 (attempt 1); waiting",
        ] {
            assert_eq!(
                quiet(&fresh, entry, "ns/wl-check-1"),
                Some(Decision::pending_recheck_after(entry, left)),
                "{entry:?}"
            );
        }
        // Another attempt's request (a prefix of this name or not) is replaced at once.
        for entry in [
            "waiting for ProvisioningRequest ns/wl-check-10 (attempt 10)",
            "Reset to Pending after eviction. Previously: Retry",
        ] {
            assert_eq!(quiet(&fresh, entry, "ns/wl-check-1"), None, "{entry:?}");
        }
        assert_eq!(
            decision(&fresh, "ns/wl-check-1", 1, Vec::new),
            Decision::pending_recheck_after(
                "waiting for ProvisioningRequest ns/wl-check-1 (attempt 1) to be provisioned",
                left
            )
        );
        // Past the grace with still no condition: said, with where to look.
        let unseen = outcome(&r, false, None, at(10));
        assert_eq!(quiet(&unseen, "", "ns/wl-check-1"), None);
        let said = decision(&unseen, "ns/wl-check-1", 1, Vec::new);
        assert!(
            said.message()
                .contains("no autoscaler has written a condition on it in 10s"),
            "{}",
            said.message()
        );
        // A condition of any kind ends the grace at once, and is no reason to say that.
        let accepted = request(&[(pr::ACCEPTED, 1, "")]);
        assert_eq!(
            outcome(&accepted, false, None, at(2)),
            Outcome::Waiting {
                message: None,
                timeout_in: None
            }
        );
    }

    #[test]
    fn the_timeout_counts_from_creation_and_is_a_failed_attempt() {
        let r = request(&[(pr::ACCEPTED, 1, "")]);
        let limit = Duration::from_secs(60);
        assert_eq!(
            outcome(&r, false, Some(limit), at(60)),
            Outcome::TimedOut(limit)
        );
        assert!(matches!(
            decision(&Outcome::TimedOut(limit), "r", 2, Vec::new),
            Decision::Retry { .. }
        ));
        // Provisioned in time wins over a timeout that fell due later.
        let done = request(&[(pr::ACCEPTED, 1, ""), (pr::PROVISIONED, 30, "")]);
        assert_eq!(
            outcome(&done, false, Some(limit), at(600)),
            Outcome::Provisioned
        );
    }

    #[test]
    fn a_class_detail_that_is_no_label_value_names_the_node_selector_key() {
        let mut r = request(&[(pr::PROVISIONED, 1, "")]);
        if let Some(s) = r.status.as_mut() {
            s.provisioning_class_details
                .insert("zone".into(), format!("zone-{}", "a".repeat(70)));
        }
        let selector = [ProvisioningRequestPodSetUpdatesNodeSelector {
            key: "topology.kubernetes.io/zone".into(),
            value_from_provisioning_class_detail: "zone".into(),
        }];
        let updates = pod_set_updates(&r, &["main".into()], &selector);
        let d = decision(&Outcome::Provisioned, "ns/wl-check-1", 1, || {
            updates.clone()
        });
        let why = invalid_class_detail(&updates).expect("invalid");
        assert!(
            why.contains("\"topology.kubernetes.io/zone\"") && why.contains("75 characters"),
            "{why}"
        );
        assert!(d.message().contains(&why), "{d:?}");
        // The SDK refuses that Ready, so the permanent path (hold, Retry, Rejected) takes it.
        let wl = kueue_admission_sdk::testing::WorkloadBuilder::new("ns", "wl")
            .pod_set("main", 1, "1")
            .check("check", kueue_admission_sdk::api::CheckState::Pending)
            .quota_reserved("cq", "default")
            .build();
        let planned = kueue_admission_sdk::testing::plan_once(
            &wl,
            "check",
            d,
            &kueue_admission_sdk::testing::PlanSettings::default(),
        );
        assert!(
            matches!(planned, kueue_admission_sdk::testing::Planned::Invalid(_)),
            "{planned:?}"
        );
        // A good value is no reason.
        assert_eq!(
            invalid_class_detail(&pod_set_updates(
                &request(&[(pr::PROVISIONED, 1, "")]),
                &["main".into()],
                &selector
            )),
            None
        );
    }

    #[test]
    fn every_pod_set_gets_the_updates_and_missing_details_are_skipped() {
        let r = request(&[(pr::PROVISIONED, 1, "")]);
        let selector = [
            ProvisioningRequestPodSetUpdatesNodeSelector {
                key: "topology.kubernetes.io/zone".into(),
                value_from_provisioning_class_detail: "zone".into(),
            },
            ProvisioningRequestPodSetUpdatesNodeSelector {
                key: "pool".into(),
                value_from_provisioning_class_detail: "absent".into(),
            },
        ];
        let updates = pod_set_updates(&r, &["launcher".into(), "workers".into()], &selector);
        assert_eq!(updates.len(), 2);
        for (u, name) in updates.iter().zip(["launcher", "workers"]) {
            assert_eq!(u.name, name);
            assert_eq!(u.annotations[CONSUME_ANNOTATION], "wl-check-1");
            assert_eq!(
                u.annotations[CLASS_ANNOTATION],
                "check-capacity.autoscaling.x-k8s.io"
            );
            assert_eq!(
                u.node_selector,
                BTreeMap::from([("topology.kubernetes.io/zone".into(), "zone-a".into())])
            );
        }
    }

    /// A pod consuming `request` (if any), on `node` (if any), in `phase`, with the scheduler's
    /// `PodScheduled` condition `(status, reason)` if it has one.
    fn pod(
        name: &str,
        request: Option<&str>,
        node: Option<&str>,
        phase: &str,
        scheduled: Option<(&str, &str)>,
    ) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": name,
                "annotations": request.map(|r| BTreeMap::from([(CONSUME_ANNOTATION, r)])),
            },
            "spec": {"containers": [], "nodeName": node},
            "status": {
                "phase": phase,
                "conditions": scheduled.map(|(status, reason)| vec![serde_json::json!({
                    "type": "PodScheduled", "status": status, "reason": reason,
                    "message": "0/3 nodes are available: 3 Insufficient cpu.",
                })]),
            },
        }))
        .expect("a pod")
    }

    #[test]
    fn only_pods_of_the_request_the_scheduler_found_no_room_for_are_unplaced() {
        let unschedulable = Some(("False", "Unschedulable"));
        let pods = [
            pod("stuck", Some("r-1"), None, "Pending", unschedulable),
            pod(
                "running",
                Some("r-1"),
                Some("n1"),
                "Running",
                Some(("True", "")),
            ),
            pod(
                "bound-not-started",
                Some("r-1"),
                Some("n1"),
                "Pending",
                Some(("True", "")),
            ),
            pod("not-tried-yet", Some("r-1"), None, "Pending", None),
            pod(
                "gated",
                Some("r-1"),
                None,
                "Pending",
                Some(("False", "SchedulingGated")),
            ),
            pod("other-request", Some("r-2"), None, "Pending", unschedulable),
            pod("no-request", None, None, "Pending", unschedulable),
        ];
        let unplaced = unplaced_consumers(&pods, "r-1");
        let names: Vec<&str> = unplaced.iter().map(|u| u.pod.as_str()).collect();
        assert_eq!(names, ["stuck"]);
        assert_eq!(
            unplaced[0].why,
            "0/3 nodes are available: 3 Insufficient cpu."
        );

        let mut deleting = pod("deleting", Some("r-1"), None, "Pending", unschedulable);
        deleting.metadata.deletion_timestamp = Some(Time(at(1)));
        assert!(unplaced_consumers(&[deleting], "r-1").is_empty());
    }

    #[test]
    fn unplaced_pods_after_the_booking_retry_at_once_naming_the_first() {
        assert_eq!(stranded("ns/r-1", &[]), None);
        let unplaced = [
            Unplaced {
                pod: "a".into(),
                why: "Insufficient cpu".into(),
            },
            Unplaced {
                pod: "b".into(),
                why: "Insufficient cpu".into(),
            },
        ];
        let Some(Decision::Retry { message, delay }) = stranded("ns/r-1", &unplaced) else {
            panic!("a Retry");
        };
        assert_eq!(
            delay,
            kueue_admission_sdk::RetryDelay::After(Duration::ZERO)
        );
        assert!(
            message.contains("ns/r-1") && message.contains("2 pod(s)"),
            "{message}"
        );
        assert!(message.contains("a: Insufficient cpu"), "{message}");
        // A long scheduler message is cut, so the entry stays readable.
        let long = [Unplaced {
            pod: "a".into(),
            why: "x".repeat(5000),
        }];
        let Some(Decision::Retry { message, .. }) = stranded("ns/r-1", &long) else {
            panic!("a Retry");
        };
        assert!(
            message.len() < 1000 && message.contains("x..."),
            "{}",
            message.len()
        );
    }
}

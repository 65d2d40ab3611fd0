//! Scripted mode ("fault injection"): a request follows a [`Script`] instead of
//! cluster-autoscaler's rules.
//!
//! A request is scripted when the pod template of its first podset (read from the PodTemplate
//! the podset references) carries [`SCRIPT_ANNOTATION`], or when its class is one of
//! [`Settings::scripted_classes`](crate::Settings::scripted_classes) (then
//! [`Settings::default_script`](crate::Settings::default_script) applies). A script is a
//! comma-separated list of steps; attempt `n` of a request (the trailing `-<n>` of its name, see
//! [`attempt_of_name`]) plays the `n`-th step, and the last step repeats for every later attempt.
//! So `fail,provision` fails the first attempt and provisions the retry.
//!
//! | step              | what the simulator writes                                             |
//! |-------------------|-----------------------------------------------------------------------|
//! | `provision`       | `Accepted`, then at once `Provisioned`                                |
//! | `provision:<s>`   | `Accepted`, then `Provisioned` `s` seconds after `Accepted`           |
//! | `fail`            | `Accepted` and `Failed`                                               |
//! | `accept`          | `Accepted` only (a stuck request)                                     |
//! | `ignore`          | nothing at all                                                        |
//! | `expire:<s>`      | as `provision`, then `BookingExpired` `s` seconds after `Provisioned` |
//! | `revoke:<s>`      | as `provision`, then `CapacityRevoked` `s` seconds after `Provisioned`|
//!
//! `Provisioned` comes with the `status.provisioningClassDetails` given by the pod template's
//! [`CLASS_DETAILS_ANNOTATION`] (`key=value,key2=value2`).
//!
//! Scripts may write what cluster-autoscaler never does (`CapacityRevoked`, class details): that
//! is their point. Scripted requests create no Node and are invisible to the default mode (no
//! booking, expiry or garbage collection).
//!
//! What to write is decided by the pure [`decide`] from the request's conditions and the clock
//! alone, so the simulator is idempotent and restart-safe: a condition already present is never
//! written again, and a delayed step is due at a time computed from the lastTransitionTime of
//! the condition it follows.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kueue_admission_sdk::api::provisioning_condition::{
    ACCEPTED, BOOKING_EXPIRED, CAPACITY_REVOKED, FAILED, PROVISIONED,
};
use kueue_admission_sdk::api::{ProvisioningRequestStatus, find_condition};

use crate::conditions::CHECK_CAPACITY_CLASS;

/// Pod-template annotation holding a request's [`Script`].
pub const SCRIPT_ANNOTATION: &str = "simulator.kueue-admission-checks.dev/script";

/// Pod-template annotation holding the `provisioningClassDetails` to report, as
/// `key=value,key2=value2`.
pub const CLASS_DETAILS_ANNOTATION: &str = "simulator.kueue-admission-checks.dev/class-details";

/// What the simulated autoscaler does with one attempt of a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// `provision[:<secs>]`: `Accepted` now, `Provisioned` `after` the acceptance.
    Provision {
        /// Delay between `Accepted` and `Provisioned`.
        after: Duration,
    },
    /// `fail`: `Accepted` and `Failed`.
    Fail,
    /// `accept`: `Accepted` only, nothing ever after.
    Accept,
    /// `ignore`: nothing at all.
    Ignore,
    /// `expire:<secs>`: provisioned at once, `BookingExpired` `after` the provisioning.
    Expire {
        /// Delay between `Provisioned` and `BookingExpired`.
        after: Duration,
    },
    /// `revoke:<secs>`: provisioned at once, `CapacityRevoked` `after` the provisioning.
    Revoke {
        /// Delay between `Provisioned` and `CapacityRevoked`.
        after: Duration,
    },
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Provision { after } if after.is_zero() => f.write_str("provision"),
            Step::Provision { after } => write!(f, "provision:{}", after.as_secs()),
            Step::Fail => f.write_str("fail"),
            Step::Accept => f.write_str("accept"),
            Step::Ignore => f.write_str("ignore"),
            Step::Expire { after } => write!(f, "expire:{}", after.as_secs()),
            Step::Revoke { after } => write!(f, "revoke:{}", after.as_secs()),
        }
    }
}

impl FromStr for Step {
    type Err = ScriptError;

    /// One step, surrounding whitespace ignored; step names are case-insensitive, delays are
    /// whole seconds.
    fn from_str(text: &str) -> Result<Self, ScriptError> {
        let step = text.trim();
        let (name, argument) = match step.split_once(':') {
            Some((name, argument)) => (name.trim(), Some(argument.trim())),
            None => (step, None),
        };
        let bad = |reason: &'static str| ScriptError::BadArgument {
            step: step.to_string(),
            reason,
        };
        let seconds = |argument: &str| {
            if !argument.is_empty() && argument.bytes().all(|b| b.is_ascii_digit()) {
                argument
                    .parse::<u64>()
                    .map(Duration::from_secs)
                    .map_err(|_| bad("too many seconds"))
            } else {
                Err(bad("the delay must be a whole number of seconds"))
            }
        };
        let name = name.to_ascii_lowercase();
        match (name.as_str(), argument) {
            ("provision", None) => Ok(Step::Provision {
                after: Duration::ZERO,
            }),
            ("provision", Some(a)) => Ok(Step::Provision { after: seconds(a)? }),
            ("expire", Some(a)) => Ok(Step::Expire { after: seconds(a)? }),
            ("revoke", Some(a)) => Ok(Step::Revoke { after: seconds(a)? }),
            ("expire" | "revoke", None) => Err(bad("a delay in seconds is required")),
            ("fail", None) => Ok(Step::Fail),
            ("accept", None) => Ok(Step::Accept),
            ("ignore", None) => Ok(Step::Ignore),
            ("fail" | "accept" | "ignore", Some(_)) => Err(bad("this step takes no delay")),
            ("", _) => Err(ScriptError::EmptyStep),
            _ => Err(ScriptError::UnknownStep {
                step: step.to_string(),
            }),
        }
    }
}

/// Why a script does not parse. Each variant names the offending step.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScriptError {
    /// The script, or one of its comma-separated steps, is blank.
    #[error("empty step (a script is one or more comma-separated steps)")]
    EmptyStep,
    /// Not one of the known steps.
    #[error(
        "unknown step {step:?} (expected provision, provision:<secs>, fail, accept, ignore, \
         expire:<secs> or revoke:<secs>)"
    )]
    UnknownStep {
        /// The step as written.
        step: String,
    },
    /// A known step with a missing, unexpected or malformed delay.
    #[error("step {step:?}: {reason}")]
    BadArgument {
        /// The step as written.
        step: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// A non-empty list of steps, one per attempt, the last one repeating.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Script(Vec<Step>);

impl Script {
    /// The script of these steps; `None` if there are none.
    pub fn new(steps: Vec<Step>) -> Option<Self> {
        (!steps.is_empty()).then_some(Self(steps))
    }

    /// The steps, in attempt order.
    pub fn steps(&self) -> &[Step] {
        &self.0
    }

    /// The step of attempt `attempt` (1-based; 0 counts as 1); the last step repeats.
    pub fn step(&self, attempt: u32) -> &Step {
        let index = usize::try_from(attempt.saturating_sub(1)).unwrap_or(usize::MAX);
        let last = self.0.len().saturating_sub(1);
        &self.0[index.min(last)]
    }
}

impl Default for Script {
    /// `provision`.
    fn default() -> Self {
        Self(vec![Step::Provision {
            after: Duration::ZERO,
        }])
    }
}

impl fmt::Display for Script {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, step) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{step}")?;
        }
        Ok(())
    }
}

impl FromStr for Script {
    type Err = ScriptError;

    /// Comma-separated steps, e.g. `fail,provision:5`.
    fn from_str(text: &str) -> Result<Self, ScriptError> {
        text.split(',')
            .map(Step::from_str)
            .collect::<Result<Vec<_>, _>>()
            .map(Self)
    }
}

/// The attempt number of a request: the trailing `-<number>` of its name (Kueue's controller
/// and ours both name requests `<...>-<attempt>`). No such suffix, or `-0`, counts as attempt 1;
/// a number too large for `u32` as `u32::MAX`.
pub fn attempt_of_name(request_name: &str) -> u32 {
    let Some((_, suffix)) = request_name.rsplit_once('-') else {
        return 1;
    };
    if suffix.is_empty() || !suffix.bytes().all(|b| b.is_ascii_digit()) {
        return 1;
    }
    suffix.parse::<u32>().unwrap_or(u32::MAX).max(1)
}

/// Parses [`CLASS_DETAILS_ANNOTATION`]: `key=value` entries separated by commas, whitespace
/// around keys and values ignored, blank entries skipped. Returns the details and the entries
/// that are not `key=value` with a non-empty key.
pub fn parse_class_details(text: &str) -> (BTreeMap<String, String>, Vec<String>) {
    let mut details = BTreeMap::new();
    let mut bad = Vec::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        match entry.split_once('=') {
            Some((key, value)) if !key.trim().is_empty() => {
                details.insert(key.trim().to_string(), value.trim().to_string());
            }
            _ => bad.push(entry.to_string()),
        }
    }
    (details, bad)
}

/// What [`decide`] says to do with a request now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Decision {
    /// Condition types to set to `True` now, in order (build them with [`new_condition`]).
    pub add: Vec<&'static str>,
    /// When the next delayed step is due, if one is pending once `add` is written. Always
    /// after `now`.
    pub wake_at: Option<Timestamp>,
}

impl Decision {
    /// Whether `Provisioned` is among the conditions to add (then the class details go too).
    pub fn provisions(&self) -> bool {
        self.add.contains(&PROVISIONED)
    }
}

/// When a condition of this type became `True`, if it is `True`.
fn true_since(conditions: &[Condition], type_: &str) -> Option<Timestamp> {
    find_condition(conditions, type_)
        .filter(|c| c.status == "True")
        .map(|c| c.last_transition_time.0)
}

/// Whether the request reached an end: `Failed`, `BookingExpired` or `CapacityRevoked`.
pub fn is_finished(status: Option<&ProvisioningRequestStatus>) -> bool {
    let conditions = status.map_or(&[][..], |s| &s.conditions[..]);
    [FAILED, BOOKING_EXPIRED, CAPACITY_REVOKED]
        .iter()
        .any(|t| true_since(conditions, t).is_some())
}

/// `since + after`, or `None` if that is past the end of time (never due).
fn due(since: Timestamp, after: Duration) -> Option<Timestamp> {
    since.checked_add(after).ok()
}

/// What to write now on a request in `status` playing `step`, at `now`.
///
/// Only conditions not already `True` are added; a finished request (see [`is_finished`]) gets
/// nothing. Delays count from the lastTransitionTime of the condition they follow (or from
/// `now` if that condition is being added now), so a restarted simulator keeps the schedule.
pub fn decide(status: Option<&ProvisioningRequestStatus>, step: &Step, now: Timestamp) -> Decision {
    let conditions = status.map_or(&[][..], |s| &s.conditions[..]);
    let mut decision = Decision::default();
    if is_finished(status) {
        return decision;
    }
    let set_now = |type_: &'static str, decision: &mut Decision| {
        true_since(conditions, type_).unwrap_or_else(|| {
            decision.add.push(type_);
            now
        })
    };
    let (provision_after, last) = match step {
        Step::Ignore => return decision,
        Step::Accept => {
            set_now(ACCEPTED, &mut decision);
            return decision;
        }
        Step::Fail => {
            set_now(ACCEPTED, &mut decision);
            set_now(FAILED, &mut decision);
            return decision;
        }
        Step::Provision { after } => (*after, None),
        Step::Expire { after } => (Duration::ZERO, Some((BOOKING_EXPIRED, *after))),
        Step::Revoke { after } => (Duration::ZERO, Some((CAPACITY_REVOKED, *after))),
    };
    let accepted_at = set_now(ACCEPTED, &mut decision);
    let provisioned_at = match true_since(conditions, PROVISIONED) {
        Some(at) => at,
        None => match due(accepted_at, provision_after) {
            Some(at) if at <= now => set_now(PROVISIONED, &mut decision),
            wake_at => {
                decision.wake_at = wake_at;
                return decision;
            }
        },
    };
    if let Some((type_, after)) = last {
        match due(provisioned_at, after) {
            Some(at) if at <= now => {
                set_now(type_, &mut decision);
            }
            wake_at => decision.wake_at = wake_at,
        }
    }
    decision
}

/// The `True` condition of type `type_` the simulator writes on a request of `class` at
/// `generation`, with cluster-autoscaler's reasons.
pub fn new_condition(
    type_: &str,
    class: &str,
    generation: Option<i64>,
    now: Timestamp,
) -> Condition {
    let (reason, message) = match type_ {
        ACCEPTED => ("Accepted", "simulated: the autoscaler took the request"),
        PROVISIONED if class == CHECK_CAPACITY_CLASS => {
            ("CapacityIsFound", "simulated: the capacity exists")
        }
        PROVISIONED => (
            "CapacityIsProvisioned",
            "simulated: the capacity was provisioned",
        ),
        FAILED => ("CapacityIsNotFound", "simulated: no capacity"),
        BOOKING_EXPIRED => (
            "CapacityReservationTimeExpired",
            "simulated: the booking expired",
        ),
        CAPACITY_REVOKED => ("CapacityRevoked", "simulated: the capacity was revoked"),
        _ => ("Simulated", "simulated"),
    };
    Condition {
        type_: type_.to_string(),
        status: "True".to_string(),
        reason: reason.to_string(),
        message: message.to_string(),
        last_transition_time: Time(now),
        observed_generation: generation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conditions::merged_conditions;
    use proptest::prelude::*;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + second).expect("in range")
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn status(conditions: &[(&str, &str, i64)]) -> ProvisioningRequestStatus {
        ProvisioningRequestStatus {
            conditions: conditions
                .iter()
                .map(|(type_, status, second)| Condition {
                    type_: type_.to_string(),
                    status: status.to_string(),
                    reason: "R".into(),
                    message: String::new(),
                    last_transition_time: Time(at(*second)),
                    observed_generation: Some(1),
                })
                .collect(),
            provisioning_class_details: BTreeMap::new(),
        }
    }

    fn decision(add: &[&'static str], wake_at: Option<i64>) -> Decision {
        Decision {
            add: add.to_vec(),
            wake_at: wake_at.map(at),
        }
    }

    #[test]
    fn scripts_parse() {
        let script: Script = " fail , provision:5,EXPIRE:0,revoke:30,accept,ignore,provision"
            .parse()
            .expect("valid");
        assert_eq!(
            script.steps(),
            &[
                Step::Fail,
                Step::Provision { after: secs(5) },
                Step::Expire { after: secs(0) },
                Step::Revoke { after: secs(30) },
                Step::Accept,
                Step::Ignore,
                Step::Provision { after: secs(0) },
            ]
        );
        assert_eq!(
            script.to_string(),
            "fail,provision:5,expire:0,revoke:30,accept,ignore,provision"
        );
        assert_eq!("provision".parse::<Script>(), Ok(Script::default()));
    }

    #[test]
    fn bad_scripts_name_the_bad_step() {
        assert_eq!("".parse::<Script>(), Err(ScriptError::EmptyStep));
        assert_eq!(
            "provision,,fail".parse::<Script>(),
            Err(ScriptError::EmptyStep)
        );
        assert_eq!("fail,".parse::<Script>(), Err(ScriptError::EmptyStep));
        assert_eq!(
            "provision,boom".parse::<Script>(),
            Err(ScriptError::UnknownStep {
                step: "boom".into()
            })
        );
        for (script, step) in [
            ("expire", "expire"),
            ("revoke:", "revoke:"),
            ("provision:-1", "provision:-1"),
            ("provision:1.5", "provision:1.5"),
            ("provision:5s", "provision:5s"),
            ("fail:3", "fail:3"),
            ("accept:", "accept:"),
            (
                "expire:99999999999999999999999",
                "expire:99999999999999999999999",
            ),
        ] {
            match script.parse::<Script>() {
                Err(ScriptError::BadArgument { step: s, .. }) => assert_eq!(s, step, "{script}"),
                other => panic!("{script}: {other:?}"),
            }
        }
        let message = "ok,boom".parse::<Script>().expect_err("bad").to_string();
        assert!(message.contains("\"ok\""), "{message}");
    }

    #[test]
    fn attempts_pick_steps_and_the_last_repeats() {
        let script: Script = "fail,accept,provision".parse().expect("valid");
        assert_eq!(script.step(0), &Step::Fail);
        assert_eq!(script.step(1), &Step::Fail);
        assert_eq!(script.step(2), &Step::Accept);
        assert_eq!(script.step(3), &Step::Provision { after: secs(0) });
        assert_eq!(script.step(u32::MAX), &Step::Provision { after: secs(0) });
        assert!(Script::new(vec![]).is_none());
    }

    #[test]
    fn attempts_come_from_the_name() {
        assert_eq!(attempt_of_name("job-abc12-prov-1"), 1);
        assert_eq!(attempt_of_name("job-abc12-prov-3"), 3);
        assert_eq!(attempt_of_name("job-abc12-prov-12"), 12);
        assert_eq!(attempt_of_name("job"), 1);
        assert_eq!(attempt_of_name("job-"), 1);
        assert_eq!(attempt_of_name("job-x3"), 1);
        assert_eq!(attempt_of_name("job-0"), 1);
        assert_eq!(attempt_of_name("job-99999999999"), u32::MAX);
        assert_eq!(attempt_of_name("3"), 1);
    }

    #[test]
    fn class_details_parse() {
        let (details, bad) = parse_class_details(" pool = gpu-a ,zone=eu=1,,oops,=x");
        assert_eq!(
            details,
            BTreeMap::from([
                ("pool".to_string(), "gpu-a".to_string()),
                ("zone".to_string(), "eu=1".to_string()),
            ])
        );
        assert_eq!(bad, ["oops", "=x"]);
        assert_eq!(parse_class_details(""), (BTreeMap::new(), vec![]));
    }

    /// `step` decided on each `(status so far, second, expected decision)`; `None`: no status
    /// written yet.
    fn assert_decides(step: &Step, cases: &[(Option<&ProvisioningRequestStatus>, i64, Decision)]) {
        for (i, (status, now, expected)) in cases.iter().enumerate() {
            let decided = decide(*status, step, at(*now));
            assert_eq!(&decided, expected, "{step:?}, case {i}");
        }
    }

    #[test]
    fn provision_accepts_and_provisions_at_once() {
        let done = status(&[(ACCEPTED, "True", 0), (PROVISIONED, "True", 0)]);
        let waiting = status(&[(ACCEPTED, "True", 0), (PROVISIONED, "False", 0)]);
        assert_decides(
            &Step::Provision { after: secs(0) },
            &[
                (None, 0, decision(&[ACCEPTED, PROVISIONED], None)),
                (Some(&done), 100, Decision::default()),
                // A Provisioned=False (capacity not found yet) is overwritten.
                (Some(&waiting), 1, decision(&[PROVISIONED], None)),
            ],
        );
    }

    #[test]
    fn delayed_provision_counts_from_acceptance() {
        let accepted = status(&[(ACCEPTED, "True", 0)]);
        assert_decides(
            &Step::Provision { after: secs(10) },
            &[
                (None, 0, decision(&[ACCEPTED], Some(10))),
                (Some(&accepted), 4, decision(&[], Some(10))),
                (Some(&accepted), 10, decision(&[PROVISIONED], None)),
                // A restart long after the due time provisions at once.
                (Some(&accepted), 1000, decision(&[PROVISIONED], None)),
            ],
        );
    }

    #[test]
    fn fail_and_accept_and_ignore() {
        let accepted = status(&[(ACCEPTED, "True", 0)]);
        assert_decides(
            &Step::Fail,
            &[
                (None, 0, decision(&[ACCEPTED, FAILED], None)),
                (Some(&accepted), 1, decision(&[FAILED], None)),
            ],
        );
        assert_decides(
            &Step::Accept,
            &[
                (None, 0, decision(&[ACCEPTED], None)),
                (Some(&accepted), 9, Decision::default()),
            ],
        );
        assert_decides(&Step::Ignore, &[(None, 0, Decision::default())]);
    }

    #[test]
    fn expire_and_revoke_count_from_provisioning() {
        let provisioned = status(&[(ACCEPTED, "True", 0), (PROVISIONED, "True", 5)]);
        for (step, last) in [
            (Step::Expire { after: secs(30) }, BOOKING_EXPIRED),
            (Step::Revoke { after: secs(30) }, CAPACITY_REVOKED),
        ] {
            let finished = status(&[
                (ACCEPTED, "True", 0),
                (PROVISIONED, "True", 5),
                (last, "True", 35),
            ]);
            assert_decides(
                &step,
                &[
                    (None, 0, decision(&[ACCEPTED, PROVISIONED], Some(30))),
                    (Some(&provisioned), 20, decision(&[], Some(35))),
                    (Some(&provisioned), 35, decision(&[last], None)),
                    (Some(&finished), 99, Decision::default()),
                ],
            );
        }
        let at_once = decision(&[ACCEPTED, PROVISIONED, BOOKING_EXPIRED], None);
        assert_decides(&Step::Expire { after: secs(0) }, &[(None, 0, at_once)]);
    }

    #[test]
    fn finished_requests_are_left_alone() {
        let failed = status(&[(ACCEPTED, "True", 0), (FAILED, "True", 0)]);
        for step in [
            Step::Provision { after: secs(0) },
            Step::Fail,
            Step::Expire { after: secs(1) },
        ] {
            assert_eq!(decide(Some(&failed), &step, at(5)), Decision::default());
        }
    }

    #[test]
    fn huge_delays_are_never_due() {
        let step = Step::Provision {
            after: Duration::from_secs(u64::MAX),
        };
        assert_eq!(decide(None, &step, at(0)), decision(&[ACCEPTED], None));
    }

    #[test]
    fn conditions_carry_cluster_autoscaler_reasons() {
        let c = new_condition(PROVISIONED, CHECK_CAPACITY_CLASS, Some(3), at(7));
        assert_eq!(
            (c.status.as_str(), c.reason.as_str(), c.observed_generation),
            ("True", "CapacityIsFound", Some(3))
        );
        assert_eq!(c.last_transition_time, Time(at(7)));
        let c = new_condition(PROVISIONED, "queued-provisioning.gke.io", None, at(7));
        assert_eq!(c.reason, "CapacityIsProvisioned");
        let c = new_condition(FAILED, CHECK_CAPACITY_CLASS, None, at(7));
        assert_eq!(
            (c.reason.as_str(), c.message.as_str()),
            ("CapacityIsNotFound", "simulated: no capacity")
        );
        assert_eq!(
            new_condition(BOOKING_EXPIRED, "", None, at(0)).reason,
            "CapacityReservationTimeExpired"
        );
        assert_eq!(
            new_condition(CAPACITY_REVOKED, "", None, at(0)).reason,
            "CapacityRevoked"
        );
        assert_eq!(new_condition(ACCEPTED, "", None, at(0)).reason, "Accepted");
    }

    #[test]
    fn merging_replaces_by_type_and_keeps_the_rest() {
        let existing = status(&[("Other", "True", 0), (PROVISIONED, "False", 0)]).conditions;
        let merged = merged_conditions(
            &existing,
            vec![
                new_condition(PROVISIONED, "", None, at(5)),
                new_condition(ACCEPTED, "", None, at(5)),
            ],
        );
        let types: Vec<_> = merged
            .iter()
            .map(|c| (c.type_.as_str(), c.status.as_str()))
            .collect();
        assert_eq!(
            types,
            [("Other", "True"), (PROVISIONED, "True"), (ACCEPTED, "True")]
        );
    }

    fn step_strategy() -> impl Strategy<Value = Step> {
        let after = (0u64..100_000).prop_map(Duration::from_secs);
        prop_oneof![
            after.clone().prop_map(|after| Step::Provision { after }),
            Just(Step::Fail),
            Just(Step::Accept),
            Just(Step::Ignore),
            after.clone().prop_map(|after| Step::Expire { after }),
            after.prop_map(|after| Step::Revoke { after }),
        ]
    }

    fn apply(status: &mut ProvisioningRequestStatus, decision: &Decision, now: Timestamp) {
        let added = decision
            .add
            .iter()
            .map(|t| new_condition(t, "", Some(1), now))
            .collect();
        status.conditions = merged_conditions(&status.conditions, added);
    }

    proptest! {
        #[test]
        fn scripts_round_trip(steps in prop::collection::vec(step_strategy(), 1..8)) {
            let script = Script::new(steps).expect("non-empty");
            prop_assert_eq!(script.to_string().parse::<Script>(), Ok(script));
        }

        #[test]
        fn parsing_never_panics(text in ".{0,40}") {
            let _ = text.parse::<Script>();
            let _ = parse_class_details(&text);
            let _ = attempt_of_name(&text);
        }

        #[test]
        fn names_give_back_their_attempt(prefix in "[a-z0-9][a-z0-9.-]{0,40}", n in 1u32..) {
            prop_assert_eq!(attempt_of_name(&format!("{prefix}-{n}")), n);
        }

        #[test]
        fn steps_follow_the_attempts(
            steps in prop::collection::vec(step_strategy(), 1..8),
            attempt in 1u32..20,
        ) {
            let script = Script::new(steps.clone()).expect("non-empty");
            let index = (attempt as usize - 1).min(steps.len() - 1);
            prop_assert_eq!(script.step(attempt), &steps[index]);
        }

        /// Following the decisions, each waking when told, reaches the step's final state;
        /// deciding again at any time then writes nothing; wake-ups are always in the future.
        #[test]
        fn decisions_converge(step in step_strategy(), start in 0i64..1_000_000, late in 0i64..200_000) {
            let mut status = ProvisioningRequestStatus::default();
            let mut now = at(start);
            for _ in 0..4 {
                let decision = decide(Some(&status), &step, now);
                if let Some(wake_at) = decision.wake_at {
                    prop_assert!(wake_at > now);
                }
                apply(&mut status, &decision, now);
                // Deciding again at once writes nothing new.
                prop_assert!(decide(Some(&status), &step, now).add.is_empty());
                match decision.wake_at {
                    Some(wake_at) => now = wake_at,
                    None => break,
                }
            }
            let again = decide(Some(&status), &step, now.checked_add(Duration::from_secs(late as u64)).expect("in range"));
            prop_assert_eq!(again, Decision::default());
            let mut types: Vec<&str> = status.conditions.iter().map(|c| c.type_.as_str()).collect();
            types.sort_unstable();
            let mut expected: Vec<&str> = match step {
                Step::Ignore => vec![],
                Step::Accept => vec![ACCEPTED],
                Step::Fail => vec![ACCEPTED, FAILED],
                Step::Provision { .. } => vec![ACCEPTED, PROVISIONED],
                Step::Expire { .. } => vec![ACCEPTED, PROVISIONED, BOOKING_EXPIRED],
                Step::Revoke { .. } => vec![ACCEPTED, PROVISIONED, CAPACITY_REVOKED],
            };
            expected.sort_unstable();
            prop_assert_eq!(types, expected);
        }
    }
}

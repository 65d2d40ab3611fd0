//! Pure: what an attempt's buffers (and the NodeClaims Karpenter launched for them) mean for
//! the check, at a given time.
//!
//! Karpenter writes each buffer's `Provisioning` condition after every provisioning pass:
//! `True`/`FitsExistingCapacity` once all its virtual pods fit on Nodes that exist or are
//! launching, `False`/`RequiresNewCapacity` with "`a`/`b` virtual pods required new capacity,
//! `f` failed" otherwise (`f` > 0: pods no NodePool can take, e.g. past its limits). Launching is
//! not there yet, so capacity counts as there only when every NodeClaim carrying the Workload's
//! dedication label is `Ready` too.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::api::{CapacityBuffer, buffer_condition as bc, condition};
use crate::names;

/// A NodeClaim launched for the Workload (it carries the Workload's dedication label).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    /// The NodeClaim's name.
    pub name: String,
    /// Its `Ready` condition is `True`: launched, registered, initialized.
    pub ready: bool,
    /// The Node it became.
    pub node: Option<String>,
}

/// What the attempt's buffers say.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// These buffers (names) do not exist yet.
    Missing(Vec<String>),
    /// Every buffer was found ready before and shrunk to zero by this check: `Ready` again.
    AlreadyReady,
    /// Every buffer's pods fit, and every NodeClaim made for the Workload is `Ready`.
    CapacityReady {
        /// The NodeClaims' Nodes.
        nodes: Vec<String>,
    },
    /// Not there within the timeout, counted from the oldest buffer's creation.
    TimedOut(Duration),
    /// Karpenter cannot place some of the pods (a NodePool's limits, no instance type fits),
    /// for longer than the grace.
    Unprovisionable(String),
    /// A buffer's template did not resolve (Karpenter's reason and message).
    Unresolved(String),
    /// Still coming: what Karpenter says, and when to look again without an event.
    Waiting {
        /// For the check's message.
        message: String,
        /// The next deadline (timeout, or the end of the grace for unplaceable pods).
        recheck_after: Option<Duration>,
    },
}

/// How long the check waits.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// From the oldest buffer's creation until the capacity must be there.
    pub timeout: Duration,
    /// How long Karpenter may report unplaceable pods.
    pub unprovisionable_grace: Duration,
}

/// The failed count in Karpenter's `RequiresNewCapacity` message ("… , 2 failed").
pub fn failed_pods(message: &str) -> Option<u32> {
    let before = message.trim_end().strip_suffix("failed")?.trim_end();
    let digits = before.rsplit(|c: char| !c.is_ascii_digit()).next()?;
    digits.parse().ok()
}

fn since(at: Timestamp, now: Timestamp) -> Duration {
    Duration::try_from(now.duration_since(at)).unwrap_or_default()
}

/// Reads the attempt's buffers (`(name, found)`, in plan order) and the Workload's NodeClaims.
pub fn outcome(
    buffers: &[(String, Option<&CapacityBuffer>)],
    claims: &[Claim],
    limits: Limits,
    now: Timestamp,
) -> Outcome {
    let missing: Vec<String> = buffers
        .iter()
        .filter(|(_, b)| b.is_none())
        .map(|(n, _)| n.clone())
        .collect();
    if !missing.is_empty() {
        return Outcome::Missing(missing);
    }
    let found: Vec<&CapacityBuffer> = buffers.iter().filter_map(|(_, b)| *b).collect();
    if found.iter().all(|b| {
        b.annotations()
            .contains_key(names::CAPACITY_READY_ANNOTATION)
    }) {
        return Outcome::AlreadyReady;
    }
    let oldest = found
        .iter()
        .filter_map(|b| b.metadata.creation_timestamp.as_ref().map(|t| t.0))
        .min();
    let age = oldest.map(|t| since(t, now)).unwrap_or_default();
    let mut fits = 0;
    let mut notes = Vec::new();
    let mut grace_ends: Option<Duration> = None;
    for b in &found {
        let conditions = b
            .status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default();
        let name = b.name_any();
        if let Some(c) = condition(conditions, bc::READY_FOR_PROVISIONING)
            && c.status == "False"
        {
            return Outcome::Unresolved(format!(
                "Karpenter cannot resolve CapacityBuffer {name}: {} ({})",
                c.message, c.reason
            ));
        }
        let current =
            |observed: Option<i64>| observed.is_none() || observed == b.metadata.generation;
        match condition(conditions, bc::PROVISIONING) {
            Some(c) if c.status == "True" && current(c.observed_generation) => fits += 1,
            Some(c) if c.status == "False" => {
                if let Some(failed) = failed_pods(&c.message).filter(|f| *f > 0) {
                    let unplaceable_for = since(c.last_transition_time.0, now);
                    if unplaceable_for >= limits.unprovisionable_grace {
                        return Outcome::Unprovisionable(format!(
                            "Karpenter cannot place {failed} of the pods of CapacityBuffer {name} on any NodePool (a NodePool's limits, or no instance type that fits the pods): {}",
                            c.message
                        ));
                    }
                    let left = limits.unprovisionable_grace - unplaceable_for;
                    grace_ends = Some(grace_ends.map_or(left, |g| g.min(left)));
                }
                notes.push(format!("{name}: {}", c.message));
            }
            _ => notes.push(format!("{name}: not looked at by Karpenter yet")),
        }
    }
    let ready_claims = claims.iter().filter(|c| c.ready).count();
    if fits == found.len() && !claims.is_empty() && ready_claims == claims.len() {
        let mut nodes: Vec<String> = claims.iter().filter_map(|c| c.node.clone()).collect();
        nodes.sort();
        return Outcome::CapacityReady { nodes };
    }
    if age >= limits.timeout {
        return Outcome::TimedOut(limits.timeout);
    }
    let timeout_in = limits.timeout - age;
    if fits == found.len() {
        notes.push(if claims.is_empty() {
            "the pods fit, but no NodeClaim carries the Workload's label (is a Node labelled by hand?)".to_string()
        } else {
            format!("{ready_claims}/{} NodeClaims ready", claims.len())
        });
    }
    Outcome::Waiting {
        message: format!("waiting for Karpenter's capacity: {}", notes.join("; ")),
        recheck_after: Some(grace_ends.map_or(timeout_in, |g| g.min(timeout_in))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{CapacityBufferSpec, CapacityBufferStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).expect("time")
    }

    fn cond(type_: &str, status: &str, reason: &str, message: &str, at: i64) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: Time(t(at)),
            observed_generation: Some(1),
        }
    }

    fn buffer(name: &str, conditions: Vec<Condition>) -> CapacityBuffer {
        let mut b = CapacityBuffer::new(name, CapacityBufferSpec::default());
        b.metadata.creation_timestamp = Some(Time(t(0)));
        b.metadata.generation = Some(1);
        b.status = Some(CapacityBufferStatus {
            conditions,
            replicas: Some(2),
        });
        b
    }

    fn resolved() -> Condition {
        cond(
            bc::READY_FOR_PROVISIONING,
            "True",
            "Resolved",
            "Pod template resolved successfully",
            0,
        )
    }

    fn fits() -> Condition {
        cond(
            bc::PROVISIONING,
            "True",
            bc::FITS_EXISTING_CAPACITY,
            "All 2 virtual pods fit on existing capacity",
            5,
        )
    }

    fn needs(failed: u32, at: i64) -> Condition {
        let m = format!("2/2 virtual pods required new capacity, {failed} failed");
        cond(bc::PROVISIONING, "False", bc::REQUIRES_NEW_CAPACITY, &m, at)
    }

    fn claim(name: &str, ready: bool) -> Claim {
        Claim {
            name: name.into(),
            ready,
            node: Some(format!("node-{name}")),
        }
    }

    const LIMITS: Limits = Limits {
        timeout: Duration::from_secs(600),
        unprovisionable_grace: Duration::from_secs(30),
    };

    fn read(buffers: &[CapacityBuffer], claims: &[Claim], at: i64) -> Outcome {
        let found: Vec<(String, Option<&CapacityBuffer>)> =
            buffers.iter().map(|b| (b.name_any(), Some(b))).collect();
        outcome(&found, claims, LIMITS, t(at))
    }

    #[test]
    fn karpenters_failed_count_is_read_from_its_message() {
        assert_eq!(
            failed_pods("3/4 virtual pods required new capacity, 2 failed"),
            Some(2)
        );
        assert_eq!(
            failed_pods("1/1 virtual pods required new capacity, 0 failed"),
            Some(0)
        );
        assert_eq!(
            failed_pods("All 2 virtual pods fit on existing capacity"),
            None
        );
        assert_eq!(failed_pods("failed"), None);
    }

    #[test]
    fn missing_buffers_are_named_in_plan_order() {
        let b = buffer("a", vec![]);
        let found = [("a".to_string(), Some(&b)), ("b".to_string(), None)];
        assert_eq!(
            outcome(&found, &[], LIMITS, t(1)),
            Outcome::Missing(vec!["b".into()])
        );
    }

    #[test]
    fn ready_needs_every_buffer_fitting_and_every_claim_ready() {
        let both = [
            buffer("a", vec![resolved(), fits()]),
            buffer("b", vec![resolved(), fits()]),
        ];
        let ready = read(&both, &[claim("x", true), claim("y", true)], 10);
        assert_eq!(
            ready,
            Outcome::CapacityReady {
                nodes: vec!["node-x".into(), "node-y".into()]
            }
        );
        // A NodeClaim still launching: the capacity is promised, not there.
        let Outcome::Waiting { message, .. } =
            read(&both, &[claim("x", true), claim("y", false)], 10)
        else {
            panic!("waits");
        };
        assert!(message.contains("1/2 NodeClaims ready"), "{message}");
        // One buffer still needing capacity.
        let one = [
            buffer("a", vec![resolved(), fits()]),
            buffer("b", vec![resolved(), needs(0, 5)]),
        ];
        assert!(matches!(
            read(&one, &[claim("x", true)], 10),
            Outcome::Waiting { .. }
        ));
        // Fits, but nothing was launched for it: never Ready on Nodes not made for the Workload.
        let Outcome::Waiting { message, .. } = read(&both, &[], 10) else {
            panic!("waits")
        };
        assert!(message.contains("no NodeClaim"), "{message}");
    }

    #[test]
    fn a_condition_of_an_older_generation_is_not_an_answer() {
        let mut stale = fits();
        stale.observed_generation = Some(0);
        assert!(matches!(
            read(
                &[buffer("a", vec![resolved(), stale])],
                &[claim("x", true)],
                10
            ),
            Outcome::Waiting { .. }
        ));
    }

    #[test]
    fn unplaceable_pods_are_a_failure_only_after_the_grace() {
        let b = [buffer("a", vec![resolved(), needs(2, 5)])];
        let Outcome::Waiting { recheck_after, .. } = read(&b, &[], 20) else {
            panic!("grace")
        };
        assert_eq!(
            recheck_after,
            Some(Duration::from_secs(15)),
            "looks again when the grace ends"
        );
        let Outcome::Unprovisionable(message) = read(&b, &[], 35) else {
            panic!("past the grace")
        };
        assert!(
            message.contains("cannot place 2 of the pods of CapacityBuffer a"),
            "{message}"
        );
        assert!(message.contains("limits"), "{message}");
    }

    #[test]
    fn the_timeout_counts_from_the_oldest_buffer_and_ready_capacity_beats_it() {
        let b = [buffer("a", vec![resolved(), needs(0, 5)])];
        let Outcome::Waiting { recheck_after, .. } = read(&b, &[], 100) else {
            panic!("waits")
        };
        assert_eq!(recheck_after, Some(Duration::from_secs(500)));
        assert_eq!(
            read(&b, &[], 600),
            Outcome::TimedOut(Duration::from_secs(600))
        );
        let ready = [buffer("a", vec![resolved(), fits()])];
        assert!(matches!(
            read(&ready, &[claim("x", true)], 700),
            Outcome::CapacityReady { .. }
        ));
    }

    #[test]
    fn an_unresolved_template_and_an_earlier_ready_are_read_first() {
        let bad = cond(
            bc::READY_FOR_PROVISIONING,
            "False",
            bc::POD_TEMPLATE_NOT_FOUND,
            "podtemplate x not found",
            1,
        );
        let Outcome::Unresolved(message) = read(&[buffer("a", vec![bad])], &[], 2) else {
            panic!("unresolved")
        };
        assert!(message.contains("PodTemplateNotFound"), "{message}");
        let mut shrunk = buffer("a", vec![]);
        shrunk.annotations_mut().insert(
            names::CAPACITY_READY_ANNOTATION.into(),
            "2026-01-01T00:00:00Z".into(),
        );
        assert_eq!(read(&[shrunk], &[], 2000), Outcome::AlreadyReady);
    }
}

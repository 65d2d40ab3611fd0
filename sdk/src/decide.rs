//! The pure core: whether a check may be asked about a Workload, and what a check's
//! [`Decision`] turns into, or why it must not be written. No I/O, no clock: the runtime passes
//! the Workload it read, the time and a random sample for jitter.
//!
//! The guards against stranding a Workload live here and nowhere else. Kueue acts on `Retry`
//! and `Rejected` only while the Workload holds quota and is not evicted; a state written at any
//! other time is never cleared (upstream issues #3543, #3322), and a `Ready` written after an
//! eviction reset would admit the next reservation without asking the check. So nothing is
//! written unless the Workload, as read, holds quota, is active, not evicted, not finished, and
//! our entry is `Pending` (or `Ready`, when the check revalidates). The runtime sends the write
//! with the `resourceVersion` of that same read, so the API server refuses it (409) if the
//! Workload changed in between; the runtime then reads again and asks again.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use serde_json::json;

use crate::api::{
    AdmissionCheckState, CheckState, PodSetUpdate, Workload, workload_condition as cond,
};
use crate::attempts::{self, AttemptRecord};
use crate::check::{Decision, RetryDelay};
use crate::release::ReleaseReason;
use crate::retry::{RetryPolicy, requeue_after_seconds};

/// Whether a check should be asked about a Workload now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Eligibility {
    /// Ask the check. `revalidating` when the entry is already `Ready`.
    Decide {
        /// The entry is `Ready` and the check asked to revalidate such entries.
        revalidating: bool,
    },
    /// The Workload holds quota, but our entry already says this and Kueue has yet to act.
    Wait(CheckState),
    /// The Workload does not need the check now; what it held may be released.
    /// `QuotaReleased` also covers a Workload that never had quota.
    Idle(ReleaseReason),
    /// The Workload holds quota and its ClusterQueue applies the check to the flavors
    /// assigned, but Kueue has not added the entry yet: work may start
    /// ([`crate::AdmissionCheckController::start_early`]), nothing may be written.
    Early,
}

/// Decides whether `check` should be asked about `wl`. A Workload without the check's entry is
/// [`Eligibility::Idle`] here; see [`standing`] for one whose entry is still to come.
pub fn eligibility(wl: &Workload, check: &str, revalidate_ready: bool) -> Eligibility {
    standing(wl, check, revalidate_ready, false)
}

/// As [`eligibility`], knowing whether the Workload's ClusterQueue applies `check` to it
/// (`applies`, from [`FlavorRule::applies`]): a Workload that holds quota, is active and not
/// evicted, without the entry yet, is then [`Eligibility::Early`]. Without the entry, the
/// reason a Workload is idle is the first of: deleted, finished, deactivated, evicted, quota
/// released, check removed.
pub fn standing(wl: &Workload, check: &str, revalidate_ready: bool, applies: bool) -> Eligibility {
    use Eligibility::*;
    if wl.metadata.deletion_timestamp.is_some() {
        return Idle(ReleaseReason::Deleted);
    }
    if wl.condition_is_true(cond::FINISHED) {
        return Idle(ReleaseReason::Finished);
    }
    let Some(entry) = wl.admission_check(check) else {
        return match holds_quota_idle(wl) {
            Some(reason) => Idle(reason),
            // An admitted Workload got the check after its admission: Kueue does not
            // un-admit it, so there is nothing to start.
            None if applies && !wl.condition_is_true(cond::ADMITTED) => Early,
            None => Idle(ReleaseReason::CheckRemoved),
        };
    };
    if let Some(reason) = holds_quota_idle(wl) {
        return Idle(reason);
    }
    match entry.state {
        CheckState::Pending => Decide {
            revalidating: false,
        },
        CheckState::Ready if revalidate_ready => Decide { revalidating: true },
        state => Wait(state),
    }
}

/// Why a Workload that is neither deleted nor finished does not hold usable quota, if so:
/// deactivated, evicted, or no quota reserved.
fn holds_quota_idle(wl: &Workload) -> Option<ReleaseReason> {
    if !wl.is_active() || wl.condition_is_true(cond::DEACTIVATION_TARGET) {
        return Some(ReleaseReason::Deactivated);
    }
    if wl.condition_is_true(cond::EVICTED) {
        return Some(ReleaseReason::Evicted);
    }
    if !wl.condition_is_true(cond::QUOTA_RESERVED) {
        return Some(ReleaseReason::QuotaReleased);
    }
    None
}

/// How Kueue chooses which of a ClusterQueue's checks a Workload with a quota reservation gets
/// (its `AdmissionChecksForWorkload`). In every version a rule's flavors are its `onFlavors`,
/// or, when empty, every flavor of the queue's resource groups; the versions differ in what
/// they do beyond matching those against the flavors assigned to the Workload's podsets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlavorRule {
    /// v0.15.0 to v0.16.5 and v0.17.0: when every rule covers exactly the queue's flavors,
    /// every check applies, whatever was assigned; otherwise the rules whose flavors meet the
    /// assigned ones.
    EveryCheckWhenAllCoverAll,
    /// v0.16.6 to v0.16.9 and v0.17.1 to v0.17.8: the rules whose flavors meet the assigned
    /// ones; an admission without any assigned flavor gets every check.
    EveryCheckWhenFlavorless,
    /// v0.18.0 and later: the rules whose flavors meet the assigned ones, nothing else. A
    /// Workload whose podsets request nothing the queue covers, or whose flavor has left the
    /// queue, gets no check.
    Intersection,
}

impl FlavorRule {
    /// The rule of Kueue `v0.<minor>.<patch>`.
    pub fn of_kueue(minor: u32, patch: u32) -> Self {
        match (minor, patch) {
            (..=15, _) | (16, ..=5) | (17, 0) => FlavorRule::EveryCheckWhenAllCoverAll,
            (16, _) | (17, _) => FlavorRule::EveryCheckWhenFlavorless,
            _ => FlavorRule::Intersection,
        }
    }

    /// What the runtime assumes when it starts work before Kueue adds the entry:
    /// [`FlavorRule::Intersection`], Kueue's rule since v0.18 and a subset of every earlier
    /// one, so that nothing is started for an entry that will not come on any Kueue version
    /// (on an older one, the rare Workload without assigned flavors only misses the early
    /// start).
    pub const EARLY_START: FlavorRule = FlavorRule::Intersection;

    /// Whether the ClusterQueue `queue` (its spec; the queue that reserved `wl`'s quota,
    /// `status.admission.clusterQueue`) gives `wl` the entry of `check` by this rule.
    /// `false` without a reservation: the early start needs one.
    pub fn applies(self, queue: &crate::api::ClusterQueueSpec, check: &str, wl: &Workload) -> bool {
        let Some(admission) = wl.status.as_ref().and_then(|s| s.admission.as_ref()) else {
            return false;
        };
        let queue_flavors: Vec<&str> = queue
            .resource_groups
            .iter()
            .flat_map(|g| &g.flavors)
            .map(|f| f.name.as_str())
            .collect();
        let mut rules = queue
            .admission_checks_strategy
            .iter()
            .flat_map(|s| &s.admission_checks);
        let Some(rule) = rules.clone().find(|r| r.name == check) else {
            return false;
        };
        let mut assigned = admission
            .pod_set_assignments
            .iter()
            .flat_map(|p| p.flavors.values());
        let rule_flavors = flavors_of(rule, &queue_flavors);
        let meets = assigned.clone().any(|f| rule_flavors.contains(&f.as_str()));
        match self {
            FlavorRule::EveryCheckWhenAllCoverAll => {
                meets || rules.all(|r| same_set(&flavors_of(r, &queue_flavors), &queue_flavors))
            }
            FlavorRule::EveryCheckWhenFlavorless => meets || assigned.next().is_none(),
            FlavorRule::Intersection => meets,
        }
    }
}

/// A rule's flavors: its `onFlavors`, or every flavor of the queue when empty.
fn flavors_of<'a>(
    rule: &'a crate::api::AdmissionCheckStrategyRule,
    queue_flavors: &[&'a str],
) -> Vec<&'a str> {
    match rule.on_flavors.is_empty() {
        true => queue_flavors.to_vec(),
        false => rule.on_flavors.iter().map(String::as_str).collect(),
    }
}

/// Whether two lists of names hold the same names.
fn same_set(a: &[&str], b: &[&str]) -> bool {
    a.iter().all(|x| b.contains(x)) && b.iter().all(|x| a.contains(x))
}

/// Everything [`plan`] needs.
#[derive(Clone, Debug)]
pub struct PlanInput<'a> {
    /// The Workload as read; the write will carry its `resourceVersion`.
    pub workload: &'a Workload,
    /// The AdmissionCheck decided.
    pub check: &'a str,
    /// The check's answer.
    pub decision: Decision,
    /// The attempt decided: [`attempts::attempt`] of the Workload.
    pub attempt: u32,
    /// The check's retry policy.
    pub policy: &'a RetryPolicy,
    /// The longest retry delay written; longer ones (from the policy or an explicit
    /// [`RetryDelay::After`]) are cut to it. At most [`crate::retry::MAX_DELAY`].
    pub max_retry_delay: Duration,
    /// Whether the check revalidates `Ready` entries.
    pub revalidate_ready: bool,
    /// The time of the decision: `lastTransitionTime` of a new state, start of a retry delay.
    pub now: Timestamp,
    /// A uniform sample in `[0, 1)` for the retry jitter.
    pub jitter_sample: f64,
}

/// What to do with a decision.
#[derive(Clone, Debug, PartialEq)]
pub enum Plan {
    /// Apply this entry.
    Write(Write),
    /// The entry already says this; write nothing.
    Unchanged {
        /// Ask the check again after this long (a `Pending` that asked for it).
        recheck_after: Option<Duration>,
    },
    /// Must not be written.
    Refused(Refusal),
}

/// An entry to apply, and what it means.
#[derive(Clone, Debug, PartialEq)]
pub struct Write {
    /// The complete entry: name, state, message, lastTransitionTime, and the optional fields
    /// this check owns. Never `retryCount`, which belongs to Kueue.
    pub entry: AdmissionCheckState,
    /// The attempt decided (see [`crate::attempts`]).
    pub attempt: u32,
    /// The attempt record to write on the Workload first (with the same `resourceVersion`
    /// precondition): a `Retry` is counted before it can land.
    pub record: Option<AttemptRecord>,
    /// For a `Retry` whose delay was cut to the ceiling: the delay asked for.
    pub clamped_from: Option<Duration>,
    /// The state changed (the moment for an event).
    pub state_changed: bool,
    /// For a `Retry`: the delay asked for.
    pub retry_delay: Option<Duration>,
    /// A `Retry` became `Rejected` because the retry limit was reached.
    pub gave_up: bool,
    /// Ask the check again after this long.
    pub recheck_after: Option<Duration>,
}

/// Why a decision is not written.
#[derive(Clone, Debug, PartialEq)]
pub enum Refusal {
    /// The Workload, as read, is not in a state where the check may answer.
    NotEligible(Eligibility),
    /// The check answered something Kueue would not accept, or that makes no sense.
    InvalidDecision(String),
}

/// Turns a decision into the entry to write, or refuses it.
pub fn plan(input: PlanInput<'_>) -> Plan {
    let PlanInput {
        workload: wl,
        check,
        decision,
        attempt,
        policy,
        max_retry_delay,
        revalidate_ready,
        now,
        jitter_sample,
    } = input;
    let revalidating = match eligibility(wl, check, revalidate_ready) {
        Eligibility::Decide { revalidating } => revalidating,
        other => return Plan::Refused(Refusal::NotEligible(other)),
    };
    let Some(current) = wl.admission_check(check) else {
        return Plan::Refused(Refusal::NotEligible(Eligibility::Idle(
            ReleaseReason::CheckRemoved,
        )));
    };
    if let Err(why) = validate_decision(wl, current, &decision, revalidating) {
        return Plan::Refused(Refusal::InvalidDecision(why));
    }
    let terms = RetryTerms {
        attempt,
        policy,
        ceiling: max_retry_delay.min(crate::retry::MAX_DELAY),
        now,
        jitter_sample,
    };
    let asked = asked(decision, terms);
    let unchanged = current.state == asked.state
        && current.message == asked.message
        && current.pod_set_updates == asked.pod_set_updates
        && (asked.state != CheckState::Retry);
    if unchanged {
        return Plan::Unchanged {
            recheck_after: asked.recheck_after,
        };
    }
    let state_changed = current.state != asked.state;
    // A hold starts where its first showing is written: the entry's lastTransitionTime is its
    // start, read back after a restart (see `crate::lifecycle`).
    let starts_hold = asked.message.contains(crate::hold::HOLD_MARK)
        && crate::hold::hold_started(wl, check).is_none();
    let last_transition_time = if state_changed || starts_hold {
        Some(Time(now))
    } else {
        current.last_transition_time.clone().or(Some(Time(now)))
    };
    let record = attempts::record_to_write(wl, check, attempt, asked.state == CheckState::Retry);
    let entry = AdmissionCheckState {
        name: check.to_string(),
        state: asked.state,
        last_transition_time,
        message: asked.message,
        requeue_after_seconds: asked.requeue_after_seconds,
        retry_count: None,
        pod_set_updates: asked.pod_set_updates,
    };
    Plan::Write(Write {
        entry,
        attempt,
        record,
        clamped_from: asked.clamped_from,
        state_changed,
        retry_delay: asked.retry_delay,
        gave_up: asked.gave_up,
        recheck_after: asked.recheck_after,
    })
}

/// What a `Retry` is written under.
#[derive(Clone, Copy)]
struct RetryTerms<'a> {
    attempt: u32,
    policy: &'a RetryPolicy,
    /// The longest delay written.
    ceiling: Duration,
    now: Timestamp,
    jitter_sample: f64,
}

/// What a decision asks to write, before it is compared with the entry as read.
struct Asked {
    state: CheckState,
    /// Within Kueue's limit.
    message: String,
    pod_set_updates: Vec<PodSetUpdate>,
    requeue_after_seconds: Option<i32>,
    /// For a `Retry`: the delay written, and the one asked for when the ceiling cut it.
    retry_delay: Option<Duration>,
    clamped_from: Option<Duration>,
    /// A `Retry` past the retry limit, written as `Rejected`.
    gave_up: bool,
    recheck_after: Option<Duration>,
}

impl Asked {
    /// `state` with `message` and nothing else.
    fn only(state: CheckState, message: String) -> Self {
        Self {
            state,
            message: truncate_message(message),
            pod_set_updates: Vec::new(),
            requeue_after_seconds: None,
            retry_delay: None,
            clamped_from: None,
            gave_up: false,
            recheck_after: None,
        }
    }
}

/// What `decision` asks to write; a `Retry` past the retry limit is `Rejected`.
fn asked(decision: Decision, terms: RetryTerms<'_>) -> Asked {
    let RetryTerms {
        attempt, policy, ..
    } = terms;
    match decision {
        Decision::Ready {
            message,
            pod_set_updates,
        } => Asked {
            pod_set_updates,
            ..Asked::only(CheckState::Ready, message)
        },
        Decision::Pending {
            message,
            recheck_after,
        } => Asked {
            recheck_after,
            ..Asked::only(CheckState::Pending, message)
        },
        Decision::Rejected { message } => Asked::only(CheckState::Rejected, message),
        Decision::Retry { message, .. } if policy.exhausted(attempt) => {
            let limit = policy.retry_limit.unwrap_or_default();
            let message = format!("{message} (attempt {attempt}: no retries left after {limit})");
            Asked {
                gave_up: true,
                ..Asked::only(CheckState::Rejected, message)
            }
        }
        Decision::Retry { message, delay } => delayed_retry(&message, delay, terms),
    }
}

/// A `Retry` within the retry limit: its delay, cut to the ceiling, in whole seconds, and a
/// message that tells the attempt and when the next one starts.
fn delayed_retry(message: &str, delay: RetryDelay, terms: RetryTerms<'_>) -> Asked {
    let RetryTerms {
        attempt,
        policy,
        ceiling,
        now,
        jitter_sample,
    } = terms;
    let mut delay = match delay {
        RetryDelay::Policy => policy.delay(attempt, jitter_sample),
        RetryDelay::After(d) => d,
    };
    let mut clamped_from = None;
    if delay > ceiling {
        clamped_from = Some(delay);
        delay = ceiling;
    }
    // Kueue stores lastTransitionTime at whole seconds and retries at that time plus
    // requeueAfterSeconds; counting the dropped fraction keeps the delay from shrinking.
    let dropped = Duration::from_nanos(u64::try_from(now.subsec_nanosecond()).unwrap_or(0));
    let secs = requeue_after_seconds(delay.saturating_add(dropped).min(ceiling))
        .filter(|_| !delay.is_zero());
    let of = policy
        .retry_limit
        .map(|l| format!(" of {}", l.saturating_add(1)))
        .unwrap_or_default();
    let when = match secs {
        Some(s) => format!("next attempt not before {}", at_seconds(now, s)),
        None => "next attempt as soon as Kueue requeues the workload".to_string(),
    };
    let capped = match clamped_from {
        Some(asked) => format!(
            "; the delay asked for, {}, is capped at {}",
            crate::retry::human(asked),
            crate::retry::human(ceiling)
        ),
        None => String::new(),
    };
    let message = format!("{message} (attempt {attempt}{of}; {when}{capped})");
    Asked {
        // 0 rather than absent: an earlier delay must not linger on the entry.
        requeue_after_seconds: Some(secs.unwrap_or(0)),
        retry_delay: Some(delay),
        clamped_from,
        ..Asked::only(CheckState::Retry, message)
    }
}

/// A `Retry` with a delay that was never written because Kueue evicted the Workload (or moved
/// it to another attempt) while the check was deciding: the status write carried the old
/// `resourceVersion` and was refused. Writing it on the evicted Workload would strand it, and
/// dropping it would let the next attempt start before the delay the check asked for. So the
/// runtime keeps it and, when the Workload holds quota again, writes a `Retry` for what is left
/// of the delay instead of asking the check again. Kept in memory only: after a restart the
/// check is simply asked again.
#[derive(Clone, Debug, PartialEq)]
pub struct LateRetry {
    /// The check's own message.
    pub message: String,
    /// The attempt it was decided for.
    pub attempt: u32,
    /// The earliest start of the next attempt that the check asked for.
    pub not_before: Timestamp,
}

impl LateRetry {
    /// Shortest remainder still worth a `Retry` of its own; Kueue counts whole seconds.
    pub const MIN_REMAINING: Duration = Duration::from_secs(1);

    /// The `Retry` a refused write stood for, if it was one with a delay; `message` is the
    /// check's own, `decided_at` the time the delay started.
    pub fn from_refused(write: &Write, message: &str, decided_at: Timestamp) -> Option<Self> {
        if write.entry.state != CheckState::Retry {
            return None;
        }
        let delay = write.retry_delay.filter(|d| !d.is_zero())?;
        let not_before = SignedDuration::try_from(delay)
            .ok()
            .and_then(|d| decided_at.checked_add(d).ok())
            .unwrap_or(Timestamp::MAX);
        Some(Self {
            message: message.to_string(),
            attempt: write.attempt,
            not_before,
        })
    }

    /// The decision to write in place of asking the check, or `None` once the delay is over.
    pub fn decision(&self, now: Timestamp) -> Option<Decision> {
        let remaining = self.not_before.duration_since(now);
        let remaining = Duration::try_from(remaining).ok()?;
        if remaining < Self::MIN_REMAINING {
            return None;
        }
        Some(Decision::retry_after(
            format!(
                "{} [decided for attempt {} while Kueue evicted the workload; its delay still applies]",
                self.message, self.attempt
            ),
            remaining,
        ))
    }
}

/// Why `decision` cannot be written on `current`, the entry as read: what Kueue would refuse
/// (podSetUpdates its webhook, its CRD or the job start refuses, see
/// [`crate::api::validation`]) or what makes no sense (a `Ready` entry taken back to `Pending`).
fn validate_decision(
    wl: &Workload,
    current: &AdmissionCheckState,
    decision: &Decision,
    revalidating: bool,
) -> Result<(), String> {
    if revalidating && matches!(decision, Decision::Pending { .. }) {
        return Err("a Ready entry can only stay Ready, or become Retry or Rejected; Pending would leave an admitted \
                    workload undecided"
            .into());
    }
    if let Decision::Ready {
        pod_set_updates, ..
    } = decision
    {
        crate::api::validation::pod_set_updates(&wl.spec.pod_sets, pod_set_updates)?;
        // A new Ready must fit beside the other checks' Ready entries (a Ready entry kept as it
        // is was written first, or by a check that could not know: a later conflicting Ready is
        // the other check's to refuse).
        if current.state != CheckState::Ready {
            let entries = wl
                .status
                .as_ref()
                .map(|s| s.admission_checks.as_slice())
                .unwrap_or_default();
            crate::api::validation::conflicts_with_ready(&current.name, pod_set_updates, entries)?;
        }
        // Kueue's webhook keeps the podSetUpdates of a Ready entry as they are (they may be in
        // the pods already).
        if current.state == CheckState::Ready && current.pod_set_updates != *pod_set_updates {
            return Err(
                "the podSetUpdates of a Ready entry cannot change (Kueue's webhook \
                        refuses it); answer Retry to have the workload admitted again with new \
                        ones"
                    .into(),
            );
        }
    }
    Ok(())
}

/// When Kueue will retry: `now` cut to whole seconds (as stored) plus `secs`, formatted the way
/// Kueue's API shows times (UTC, whole seconds).
fn at_seconds(now: Timestamp, secs: i32) -> String {
    let whole = Timestamp::from_second(now.as_second()).unwrap_or(now);
    let at = whole
        .checked_add(SignedDuration::from_secs(i64::from(secs)))
        .unwrap_or(Timestamp::MAX);
    at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Cuts a message to Kueue's limit on a character boundary, marking the cut.
fn truncate_message(message: String) -> String {
    crate::check::truncate_chars(&message, AdmissionCheckState::MAX_MESSAGE_CHARS)
}

/// The body of the server-side apply that writes one entry: only identity, the
/// `resourceVersion` precondition and the entry. `None` if the Workload has no
/// `resourceVersion` (it was not read from the API server), since an unconditioned write is
/// exactly what strands Workloads.
pub fn status_apply_patch(wl: &Workload, entry: &AdmissionCheckState) -> Option<serde_json::Value> {
    let mut body = conditioned_apply_body(wl)?;
    body["status"] = json!({"admissionChecks": [entry]});
    Some(body)
}

/// The skeleton of every server-side apply the runtime sends to a Workload: identity and the
/// `resourceVersion` of the read the write was decided on, so that a write computed from a
/// stale Workload is refused (409). `None` without a `resourceVersion`.
fn conditioned_apply_body(wl: &Workload) -> Option<serde_json::Value> {
    let resource_version = wl.resource_version()?;
    Some(json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": wl.name_any(),
            "namespace": wl.namespace(),
            "resourceVersion": resource_version,
        },
    }))
}

#[cfg(test)]
mod tests;

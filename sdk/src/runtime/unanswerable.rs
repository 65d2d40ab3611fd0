//! Workloads holding quota for a check that cannot answer them: its AdmissionCheck is inactive
//! (bad parameters, an API not served, its parameters unreadable) or the controller runs in
//! shadow mode. Kueue stops new admissions for an inactive check, but a Workload that already
//! holds quota with the check's entry `Pending` keeps the quota, waiting for an answer that
//! does not come. The runtime writes the reason on the entry (as Kueue's built-in check writes
//! "the check is not active"), keeps the quota for
//! [`super::RuntimeConfig::permanent_failure_hold`] (the check may be fixed meanwhile: it then
//! answers as usual), then answers `Retry` without delay: the quota goes back to the queue, the
//! Workload waits there like every other, and is asked again once it holds quota again. Never
//! `Rejected`: the Workload did nothing wrong.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, PatchParams};
use kube::runtime::events::EventType;
use tracing::{debug, warn};

use super::checks::Inactive;
use super::context::Context;
use super::memory::Hold;
use super::reconcile::{WriteFailure, apply, field_manager_for, written};
use crate::api::{CheckState, Workload};
use crate::check::{AdmissionCheckController, Decision};
use crate::decide::{Eligibility, Plan, PlanInput, eligibility, plan};
use crate::error::Error;
use crate::retry::{Backoff, RetryPolicy};

/// The Event reason of a Workload held for a check that cannot answer.
pub(crate) const CANNOT_ANSWER: &str = "CheckCannotAnswer";

/// What to answer for a Workload whose check cannot answer because of `why`, held since
/// `hold.since` (`hold_for` long): `Pending` with the reason until the hold ends, then `Retry`
/// without delay.
pub(crate) fn decision(why: &str, hold: Hold, hold_for: Duration, now: Timestamp) -> Decision {
    let (left, until) = hold.left(hold_for, now);
    match left {
        Some(left) => Decision::pending_recheck_after(
            format!(
                "{why}. The workload keeps its quota until {}, then gives it back (Retry) and \
                 waits in its queue until the check can answer",
                until.strftime("%Y-%m-%dT%H:%M:%SZ")
            ),
            left,
        ),
        None => Decision::retry_after(
            format!(
                "{why}. Not resolved within {}: the quota is given back; the workload waits in \
                 its queue until the check can answer",
                crate::retry::human(hold_for)
            ),
            Duration::ZERO,
        ),
    }
}

/// Why `check` cannot answer while its AdmissionCheck is inactive for `inactive`.
pub(super) fn inactive(check: &str, inactive: &Inactive) -> String {
    format!(
        "check {check} cannot answer: its AdmissionCheck is not active ({}: {})",
        inactive.reason,
        crate::check::truncate_chars(inactive.message.trim_end_matches('.'), 400)
    )
}

/// Why `check` cannot answer while the controller runs in shadow mode.
pub(super) fn shadowed(check: &str) -> String {
    format!(
        "check {check} cannot answer: its controller runs in shadow mode (--shadow) and writes \
         no answers, while the workload's ClusterQueue lists the check; remove it from the \
         ClusterQueue (Kueue then drops this entry) or run the controller without --shadow"
    )
}

/// A policy that never turns the release into `Rejected`.
fn never_rejects() -> RetryPolicy {
    RetryPolicy {
        backoff: Backoff::Immediate,
        retry_limit: None,
    }
}

/// Holds, then releases, `wl` for `check`, which cannot answer because of `why`; returns when
/// to look again. Nothing is written unless the Workload holds quota with the check's entry
/// `Pending` (the guard of [`crate::decide::plan`]), and every write carries the read's
/// `resourceVersion`.
pub(super) async fn hold_or_release<C: AdmissionCheckController>(
    ctx: &Context<C>,
    wl: &Workload,
    check: &str,
    why: &str,
) -> Result<Option<Duration>, Error> {
    let (Some(uid), Some(namespace)) = (wl.uid(), wl.namespace()) else {
        return Err(Error::MalformedWorkload("no uid or namespace".into()));
    };
    let key = (uid, check.to_string());
    if eligibility(wl, check, false)
        != (Eligibility::Decide {
            revalidating: false,
        })
    {
        ctx.memory.pair(&key, |p| p.unanswerable = None);
        return Ok(None);
    }
    let now = Timestamp::now();
    let evictions = wl.total_evictions();
    let hold = ctx.memory.pair(&key, |p| {
        Hold::of_attempt(&mut p.unanswerable, evictions, now)
    });
    let policy = never_rejects();
    let input = PlanInput {
        workload: wl,
        check,
        decision: decision(why, hold, ctx.permanent_failure_hold, now),
        attempt: crate::attempts::attempt(wl, check),
        policy: &policy,
        max_retry_delay: ctx.max_retry_delay,
        revalidate_ready: false,
        now,
        jitter_sample: 0.0,
    };
    let mut write = match plan(input) {
        Plan::Write(write) => write,
        Plan::Unchanged { recheck_after } => return Ok(recheck_after),
        Plan::Refused(refusal) => {
            debug!(workload = %wl.name_any(), check, ?refusal, "nothing to hold");
            return Ok(None);
        }
    };
    let api: Api<Workload> = Api::namespaced(ctx.client.clone(), &namespace);
    let pp = PatchParams::apply(&field_manager_for(&ctx.field_manager, check)).force();
    let mut result = apply(&api, wl, check, &write, &pp).await;
    if result
        .as_ref()
        .is_err_and(WriteFailure::is_record_refused_for_good)
    {
        // The count is not worth the quota here: Kueue's retryCount counts this Retry anyway.
        write.record = None;
        result = apply(&api, wl, check, &write, &pp).await;
    }
    match result {
        Ok(_) => {}
        // Changed since the read: the watch brings the new version, which is looked at again.
        Err(failure) if failure.is_conflict() => return Ok(Some(Duration::from_secs(1))),
        Err(failure) => return Err(failure.into_error()),
    }
    if write.entry.state == CheckState::Pending {
        let note = format!("check {check}: {}", write.entry.message);
        warn!(workload = %wl.name_any(), namespace, check, %why, "holding a workload for a check that cannot answer");
        ctx.event(wl, EventType::Warning, CANNOT_ANSWER, note).await;
    }
    written(ctx, wl, check, &write, now, false).await;
    Ok(write.recheck_after)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).expect("valid")
    }

    #[test]
    fn held_with_the_reason_then_given_back_never_rejected() {
        let hold = Hold::for_tests(at(0), 0);
        let two_minutes = Duration::from_secs(120);
        match decision("check c cannot answer", hold, two_minutes, at(30)) {
            Decision::Pending {
                message,
                recheck_after,
            } => {
                assert!(
                    message.starts_with("check c cannot answer. The workload keeps its quota until 2027-01-15T08:02:00Z"),
                    "{message}"
                );
                assert_eq!(recheck_after, Some(Duration::from_secs(90)));
            }
            other => panic!("held: {other:?}"),
        }
        assert_eq!(
            decision("x", hold, two_minutes, at(120)),
            Decision::retry_after(
                "x. Not resolved within 2m: the quota is given back; the workload waits in its \
                 queue until the check can answer",
                Duration::ZERO
            )
        );
        assert!(!never_rejects().exhausted(u32::MAX));
    }
}

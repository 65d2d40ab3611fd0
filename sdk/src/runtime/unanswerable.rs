//! Workloads holding quota for a check that cannot answer them: its AdmissionCheck is inactive
//! (bad parameters, an API not served, its parameters unreadable) or the controller runs in
//! shadow mode. Kueue stops new admissions for an inactive check, but a Workload that already
//! holds quota with the check's entry `Pending` keeps the quota, waiting for an answer that
//! does not come. The runtime writes the reason on the entry (as Kueue's built-in check writes
//! "the check is not active"), keeps the quota for
//! [`super::config::RuntimeConfig::permanent_failure_hold`] (the check may be fixed meanwhile: it then
//! answers as usual), then answers `Retry` without delay: the quota goes back to the queue, the
//! Workload waits there like every other, and is asked again once it holds quota again. Never
//! `Rejected`: the Workload did nothing wrong.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, PatchParams};
use kube::runtime::events::EventType;
use tracing::{debug, warn};

use super::check_registry::Inactive;
use super::context::Context;
use super::status_write::{WriteFailure, apply, field_manager_for, written};
use crate::api::{CheckState, Workload};
use crate::check::AdmissionCheckController;
use crate::decide::{Plan, PlanInput, plan};
use crate::error::Error;
use crate::lifecycle;
use crate::retry::{Backoff, RetryPolicy};

/// The Event reason of a Workload held for a check that cannot answer.
pub(crate) const CANNOT_ANSWER: &str = "CheckCannotAnswer";

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
pub(super) fn never_rejects() -> RetryPolicy {
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
    let Some(namespace) = wl.namespace() else {
        return Err(Error::MalformedWorkload("no namespace".into()));
    };
    let now = Timestamp::now();
    let policy = never_rejects();
    let input = PlanInput {
        workload: wl,
        check,
        decision: lifecycle::cannot_answer(wl, check, why, ctx.permanent_failure_hold, now),
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

    #[test]
    fn the_release_is_never_a_rejection() {
        assert!(!never_rejects().exhausted(u32::MAX));
    }
}

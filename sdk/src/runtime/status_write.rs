//! The status write of one check's entry, and what the API server's refusal of it means: the
//! attempt record first (a merge patch of the Workload's metadata), then the entry (a
//! server-side apply of the status subresource with the check's own field manager), both
//! conditioned on the `resourceVersion` of the read the decision was made on. Shared by every
//! path that answers: a decision, a hold for a check that cannot answer.

use std::borrow::Cow;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use sha2::{Digest, Sha256};
use tracing::{info, warn};

use super::context::Context;
use crate::api::{CheckState, Workload};
use crate::attempts;
use crate::check::{AdmissionCheckController, ErrorClass};
use crate::decide::status_apply_patch;
use crate::error::Error;

/// Codes with which the API server refuses a write for good (the request itself, RBAC or a
/// policy): 400, 403, 405, 413, 415, 422.
pub(super) fn refused_for_good(code: u16) -> bool {
    matches!(code, 400 | 403 | 405 | 413 | 415 | 422)
}

/// What the API server said when it refused a write for good (a webhook denial, an invalid
/// field), or `None` when the refusal may pass.
pub(super) fn permanent_refusal(status: &kube::core::Status) -> Option<String> {
    match ErrorClass::of_status(status.code, &status.reason, &status.message) {
        ErrorClass::Permanent { message } => Some(message),
        // A write RBAC refuses cannot be shown on the entry either: tried again.
        ErrorClass::Transient | ErrorClass::NotPermitted { .. } => None,
    }
}

/// Which of the two writes of [`apply`] failed.
pub(super) enum WriteFailure {
    /// The attempt record on the Workload's metadata.
    Record(kube::Error),
    /// The entry on the status subresource.
    Status(kube::Error),
}

impl WriteFailure {
    /// The Workload changed since it was read (409).
    pub(super) fn is_conflict(&self) -> bool {
        let (Self::Record(kube::Error::Api(status)) | Self::Status(kube::Error::Api(status))) =
            self
        else {
            return false;
        };
        status.code == 409
    }

    /// The API server refused the attempt record for good (see [`refused_for_good`]).
    pub(super) fn is_record_refused_for_good(&self) -> bool {
        matches!(self, Self::Record(kube::Error::Api(status)) if refused_for_good(status.code))
    }

    /// The failure as the reconcile's error.
    pub(super) fn into_error(self) -> Error {
        let (Self::Record(e) | Self::Status(e)) = self;
        e.into()
    }
}

/// Writes the attempt record (when the plan has one) and then the entry, both conditioned on
/// the `resourceVersion` the decision was made on; returns the `resourceVersion` of the
/// Workload after the write.
pub(super) async fn apply(
    api: &Api<Workload>,
    wl: &Workload,
    check: &str,
    write: &crate::decide::Write,
    pp: &PatchParams,
) -> Result<Option<String>, WriteFailure> {
    let mut base = Cow::Borrowed(wl);
    if let Some(record) = write.record {
        // Counted before it can land: a Retry never reaches Kueue uncounted.
        let body = attempts::annotation_patch(wl, check, record)
            .ok_or_else(|| WriteFailure::Record(missing_resource_version(wl)))?;
        // `force` belongs to server-side apply only.
        let merge = PatchParams {
            field_manager: pp.field_manager.clone(),
            ..PatchParams::default()
        };
        let updated = api
            .patch(&wl.name_any(), &merge, &Patch::Merge(&body))
            .await
            .map_err(WriteFailure::Record)?;
        base = Cow::Owned(updated);
    }
    let body = status_apply_patch(&base, &write.entry)
        .ok_or_else(|| WriteFailure::Status(missing_resource_version(wl)))?;
    let updated = api
        .patch_status(&wl.name_any(), pp, &Patch::Apply(&body))
        .await
        .map_err(WriteFailure::Status)?;
    Ok(updated.resource_version())
}

fn missing_resource_version(wl: &Workload) -> kube::Error {
    kube::Error::Service(format!("workload {} has no resourceVersion", wl.name_any()).into())
}

/// Logs, counts and announces a state that was written.
pub(super) async fn written<C: AdmissionCheckController>(
    ctx: &Context<C>,
    wl: &Workload,
    check: &str,
    write: &crate::decide::Write,
    now: Timestamp,
    uncounted: bool,
) {
    info!(
        workload = %wl.name_any(), namespace = ?wl.namespace(), check, state = %write.entry.state,
        attempt = write.attempt, message = %write.entry.message, uncounted, "check state written"
    );
    let delay = write.retry_delay.map(|d| d.as_secs_f64());
    ctx.metrics
        .decision(wl, check, write.entry.state, write.attempt, delay, now);
    if let (Some(asked), Some(written)) = (write.clamped_from, write.retry_delay) {
        ctx.metrics.retry_delay_clamped(check);
        let note = format!(
            "check {check}: a retry delay of {} was asked for; written as {}, the ceiling \
             (--max-retry-delay-seconds)",
            crate::retry::human(asked),
            crate::retry::human(written)
        );
        warn!(workload = %wl.name_any(), namespace = ?wl.namespace(), check, %note, "retry delay clamped");
        ctx.event(wl, EventType::Warning, "RetryDelayClamped", note)
            .await;
    }
    if write.state_changed {
        let (type_, reason) = match write.entry.state {
            CheckState::Ready => (EventType::Normal, "CheckReady"),
            CheckState::Pending => (EventType::Normal, "CheckPending"),
            CheckState::Retry => (EventType::Warning, "CheckRetry"),
            CheckState::Rejected => (EventType::Warning, "CheckRejected"),
        };
        if type_ == EventType::Warning || ctx.normal_events {
            let note = format!("check {check}: {}", write.entry.message);
            ctx.event(wl, type_, reason, note).await;
        }
    }
}

/// The server-side apply field manager for one check: its own, so that entries of different
/// checks served by one process never strip each other. At most 128 bytes, the API's limit;
/// long names are shortened with a stable hash so the manager survives restarts and upgrades.
pub(crate) fn field_manager_for(prefix: &str, check: &str) -> String {
    const MAX: usize = 128;
    let full = format!("{prefix}/{check}");
    if full.len() <= MAX {
        return full;
    }
    let digest = Sha256::digest(full.as_bytes());
    let hash: String = digest.iter().take(5).map(|b| format!("{b:02x}")).collect();
    let mut keep = MAX - hash.len() - 1;
    while !full.is_char_boundary(keep) {
        keep -= 1;
    }
    format!("{}-{hash}", &full[..keep])
}

#[cfg(test)]
mod tests {
    use super::field_manager_for;

    #[test]
    fn field_managers_are_per_check_bounded_and_stable() {
        assert_eq!(field_manager_for("sdk", "budget"), "sdk/budget");
        assert_ne!(field_manager_for("sdk", "a"), field_manager_for("sdk", "b"));
        let long_a = "a".repeat(253);
        let long_b = format!("{}b", "a".repeat(252));
        let (ma, mb) = (
            field_manager_for("sdk", &long_a),
            field_manager_for("sdk", &long_b),
        );
        assert_eq!(ma.len(), 128);
        assert_ne!(
            ma, mb,
            "names sharing a long prefix still get distinct managers"
        );
        assert_eq!(ma, field_manager_for("sdk", &long_a), "stable");
    }
}

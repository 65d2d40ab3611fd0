//! One Workload: ask each of our checks that may answer, and apply what the decision layer allows.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Client, Resource, ResourceExt};
use sha2::{Digest, Sha256};
use tracing::{Instrument, debug, info, info_span, warn};

use super::checks::{ActiveCheck, Registry};
use crate::api::CheckState;
use crate::api::Workload;
use crate::check::{AdmissionCheckController, CheckContext, ReleaseContext, ReleaseReason};
use crate::decide::{
    Eligibility, LateRetry, Plan, PlanInput, Refusal, eligibility, plan, status_apply_patch,
};
use crate::error::Error;
use crate::retry::RetryPolicy;

/// How often one decision is recomputed after the API server refused it as stale (409) before
/// the reconcile gives up and waits for the watch to deliver the newer Workload.
const CONFLICT_ATTEMPTS: usize = 3;

pub(crate) struct Context<C: AdmissionCheckController> {
    pub client: Client,
    pub controller: Arc<C>,
    pub registry: Registry<C::Parameters>,
    pub field_manager: String,
    pub recorder: Recorder,
    /// (Workload uid, check) pairs this process asked the check about and has not released,
    /// with where the Workload stood then: those get `release` once it goes idle, or when it
    /// comes back with another attempt or more evictions (evicted and re-admitted in between).
    asked: Mutex<HashMap<PairKey, AskedAt>>,
    /// Retries refused because Kueue evicted the Workload while the check decided; honoured on
    /// the next attempt (see [`LateRetry`]).
    late: Mutex<HashMap<PairKey, LateRetry>>,
    /// Consecutive failed reconciles per Workload uid, for the error backoff.
    failures: Mutex<HashMap<String, u32>>,
    pub metrics: Arc<super::metrics::Metrics>,
}

/// (Workload uid, check name).
type PairKey = (String, String);

/// Every critical section is a single insert, remove or lookup: a poisoned lock is sound.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<C: AdmissionCheckController> Context<C> {
    pub fn new(
        client: Client,
        controller: Arc<C>,
        registry: Registry<C::Parameters>,
        field_manager: String,
        recorder: Recorder,
        metrics: Arc<super::metrics::Metrics>,
    ) -> Self {
        Self {
            client,
            controller,
            registry,
            field_manager,
            recorder,
            asked: Default::default(),
            late: Default::default(),
            failures: Default::default(),
            metrics,
        }
    }

    /// Whether `Ready` entries are asked about again (on a timer, on every change, or both).
    fn revalidates(&self) -> bool {
        self.controller.revalidate_ready_every().is_some()
            || self.controller.revalidate_ready_on_change()
    }

    fn asked(&self) -> std::sync::MutexGuard<'_, HashMap<PairKey, AskedAt>> {
        lock(&self.asked)
    }

    fn late(&self) -> std::sync::MutexGuard<'_, HashMap<PairKey, LateRetry>> {
        lock(&self.late)
    }

    /// Publishes an event on the Workload; a failure to publish is logged, never fatal.
    async fn event(&self, wl: &Workload, type_: EventType, reason: &str, note: String) {
        let note = truncate_note(note);
        let event = Event {
            type_,
            reason: reason.into(),
            action: event_action(&note),
            note: Some(note),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &wl.object_ref(&())).await {
            warn!(workload = %wl.name_any(), error = %e, "publishing an event");
        }
    }
}

/// Where a Workload stood when the check was asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AskedAt {
    attempt: u32,
    evictions: i32,
}

impl AskedAt {
    fn of(wl: &Workload, check: &str) -> Option<Self> {
        let entry = wl.admission_check(check)?;
        Some(Self {
            attempt: crate::check::attempt_of(entry),
            evictions: wl.total_evictions(),
        })
    }
}

/// kube-runtime's `Recorder` merges events by type, action and reason (not by note): a second
/// `CheckRetry` with a new attempt and time would only raise the first one's count, and its
/// message would be lost. A short digest of the note in the action keeps distinct messages
/// apart, while repeats of the same message still merge.
fn event_action(note: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(note.as_bytes());
    let hex: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
    format!("Decide-{hex}")
}

/// Event notes are limited to 1 KiB by the API server.
fn truncate_note(mut note: String) -> String {
    const MAX: usize = 1024;
    if note.len() > MAX {
        let mut cut = MAX - '…'.len_utf8();
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
        note.push('…');
    }
    note
}

pub(crate) async fn reconcile<C: AdmissionCheckController>(
    wl: Arc<Workload>,
    ctx: Arc<Context<C>>,
) -> Result<Action, Error> {
    let started = std::time::Instant::now();
    let result = reconcile_workload(&wl, &ctx).await;
    ctx.metrics.reconciled(started.elapsed(), result.is_ok());
    result
}

async fn reconcile_workload<C: AdmissionCheckController>(
    wl: &Arc<Workload>,
    ctx: &Arc<Context<C>>,
) -> Result<Action, Error> {
    // Checks to decide (active, with an entry on this Workload), and every check of ours (an
    // inactive or removed one may still have something to release).
    let mut ours = Vec::new();
    let mut all_ours = Vec::new();
    {
        let registry = ctx.registry.read().unwrap_or_else(|p| p.into_inner());
        for (name, state) in registry.iter() {
            all_ours.push(name.clone());
            if let (Ok(active), Some(_)) = (state, wl.admission_check(name)) {
                ours.push((name.clone(), active.clone()));
            }
        }
    }
    remember_earlier_answers(ctx, wl, &all_ours);
    release_idle(ctx, wl, &all_ours).await?;
    let mut requeue: Option<Duration> = None;
    for (check, active) in ours {
        // One span per check and reconcile: every log line inside names the Workload and check.
        let span = info_span!(
            "decide",
            workload = %wl.name_any(),
            namespace = %wl.namespace().unwrap_or_default(),
            check = %check,
        );
        let next = decide_one(ctx, wl, &check, &active)
            .instrument(span)
            .await?;
        requeue = match (requeue, next) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    if let Some(uid) = wl.uid() {
        lock(&ctx.failures).remove(&uid);
    }
    Ok(requeue.map_or_else(Action::await_change, Action::requeue))
}

/// A Workload that holds quota with our answer on it was asked by an earlier process (before a
/// restart or a leader change): remember it, so that its release is not missed when it finishes,
/// is evicted or deleted. (One that went idle while no replica ran is never seen holding; a
/// check that holds resources reconciles them itself.)
fn remember_earlier_answers<C: AdmissionCheckController>(
    ctx: &Context<C>,
    wl: &Workload,
    checks: &[String],
) {
    let Some(uid) = wl.uid() else { return };
    let revalidate = ctx.revalidates();
    for check in checks {
        if let Eligibility::Wait(_) | Eligibility::Decide { revalidating: true } =
            eligibility(wl, check, revalidate)
            && let Some(at) = AskedAt::of(wl, check)
        {
            ctx.asked()
                .entry((uid.clone(), check.clone()))
                .or_insert(at);
        }
    }
}

/// Releases what the checks hold for a Workload that was deleted (the reconciler never sees
/// it again) and forgets it. Retried a few times; a check must still tolerate a missed release
/// (e.g. one that happened while no replica was running) by reconciling what it holds.
pub(crate) async fn release_deleted<C: AdmissionCheckController>(ctx: &Context<C>, wl: &Workload) {
    let Some(uid) = wl.uid() else { return };
    let checks: Vec<String> = ctx
        .asked()
        .keys()
        .filter(|(u, _)| *u == uid)
        .map(|(_, c)| c.clone())
        .collect();
    let namespace = wl.namespace().unwrap_or_default();
    let name = wl.name_any();
    for check in checks {
        let release = ReleaseContext {
            namespace: &namespace,
            name: &name,
            workload: Some(wl),
            check_name: &check,
            reason: ReleaseReason::Deleted,
            client: &ctx.client,
            now: Timestamp::now(),
        };
        let mut pause = Duration::from_secs(1);
        for attempt in 1..=3 {
            match ctx.controller.release(&release).await {
                Ok(()) => {
                    info!(workload = %name, namespace, check, reason = "deleted", "released");
                    break;
                }
                Err(e) => {
                    ctx.metrics.error("check");
                    warn!(workload = %name, namespace, check, attempt, error = %e, "releasing a deleted workload");
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
            }
        }
        ctx.asked().remove(&(uid.clone(), check.clone()));
        ctx.late().remove(&(uid.clone(), check));
    }
    lock(&ctx.failures).remove(&uid);
}

/// Calls `release` for every check this process asked about the Workload that it no longer
/// needs. Idempotent: a pair is forgotten only once its release succeeded.
async fn release_idle<C: AdmissionCheckController>(
    ctx: &Context<C>,
    wl: &Workload,
    checks: &[String],
) -> Result<(), Error> {
    let Some(uid) = wl.uid() else { return Ok(()) };
    let revalidate = ctx.revalidates();
    for check in checks {
        let key = (uid.clone(), check.clone());
        let Some(asked_at) = ctx.asked().get(&key).copied() else {
            continue;
        };
        let reason = match eligibility(wl, check, revalidate) {
            Eligibility::Idle(reason) => reason,
            // Evicted and given quota again between two reconciles: the eviction was not seen,
            // but the attempt or Kueue's eviction count moved on.
            _ if AskedAt::of(wl, check).is_some_and(|now| now != asked_at) => {
                ReleaseReason::Evicted
            }
            _ => continue,
        };
        let namespace = wl.namespace().unwrap_or_default();
        let name = wl.name_any();
        let release = ReleaseContext {
            namespace: &namespace,
            name: &name,
            workload: Some(wl),
            check_name: check,
            reason,
            client: &ctx.client,
            now: Timestamp::now(),
        };
        if let Err(e) = ctx.controller.release(&release).await {
            let note = format!("check {check}: releasing after {}: {e}", reason.as_str());
            ctx.event(wl, EventType::Warning, "CheckReleaseFailed", note)
                .await;
            return Err(Error::Check(Box::new(e)));
        }
        info!(workload = %name, namespace, check, reason = reason.as_str(), "released");
        ctx.asked().remove(&key);
        if matches!(
            reason,
            ReleaseReason::Deleted
                | ReleaseReason::Finished
                | ReleaseReason::Deactivated
                | ReleaseReason::CheckRemoved
        ) {
            ctx.late().remove(&key);
        }
    }
    Ok(())
}

/// Decides one check for one Workload; returns when to look again, if the check asked.
async fn decide_one<C: AdmissionCheckController>(
    ctx: &Context<C>,
    cached: &Workload,
    check: &str,
    active: &ActiveCheck<C::Parameters>,
) -> Result<Option<Duration>, Error> {
    let revalidate = ctx.controller.revalidate_ready_every();
    let revalidates = ctx.revalidates();
    // The cached Workload is borrowed; an owned copy exists only after a 409 made us read again.
    let mut wl = Cow::Borrowed(cached);
    let namespace = wl
        .namespace()
        .ok_or_else(|| Error::MalformedWorkload("no namespace".into()))?;
    let uid = wl
        .uid()
        .ok_or_else(|| Error::MalformedWorkload("no uid".into()))?;
    let key: PairKey = (uid, check.to_string());
    let api: Api<Workload> = Api::namespaced(ctx.client.clone(), &namespace);
    for _ in 0..CONFLICT_ATTEMPTS {
        let revalidating = match eligibility(&wl, check, revalidates) {
            Eligibility::Decide { revalidating } => revalidating,
            _ => return Ok(None),
        };
        let Some(entry) = wl.admission_check(check) else {
            return Ok(None);
        };
        let now = Timestamp::now();
        let asked_at = AskedAt::of(&wl, check);
        if let Some(at) = asked_at {
            ctx.asked().insert(key.clone(), at);
        }
        // A Retry refused because Kueue evicted the Workload while the check decided is
        // honoured now, instead of asking the check again.
        let late = ctx.late().get(&key).cloned();
        let carried = late
            .as_ref()
            .filter(|_| !revalidating)
            .and_then(|l| l.decision(now));
        if late.is_some() && carried.is_none() {
            ctx.late().remove(&key);
        }
        let is_carried = carried.is_some();
        let decision = match carried {
            Some(d) => d,
            None => {
                let check_ctx = CheckContext {
                    workload: &wl,
                    entry,
                    parameters: &active.parameters,
                    client: &ctx.client,
                    now,
                };
                match ctx.controller.decide(&check_ctx).await {
                    Ok(d) => d,
                    Err(e) => {
                        let note = format!("check {check}: {e}");
                        ctx.event(&wl, EventType::Warning, "CheckFailed", note)
                            .await;
                        return Err(Error::Check(Box::new(e)));
                    }
                }
            }
        };
        let message = decision.message().to_string();
        let input = PlanInput {
            workload: &wl,
            check,
            decision,
            policy: &active.policy,
            revalidate_ready: revalidates,
            now,
            jitter_sample: rand::random::<f64>(),
        };
        let revalidate_after = revalidate.filter(|_| revalidating);
        let write = match plan(input) {
            Plan::Write(w) => w,
            Plan::Unchanged { recheck_after } => return Ok(recheck_after.or(revalidate_after)),
            Plan::Refused(Refusal::NotEligible(why)) => {
                debug!(workload = %wl.name_any(), check, ?why, "decision not written");
                return Ok(None);
            }
            Plan::Refused(Refusal::InvalidDecision(why)) => {
                let why = format!("check {check}: {why}");
                ctx.event(&wl, EventType::Warning, "InvalidDecision", why.clone())
                    .await;
                return Err(Error::InvalidDecision(why));
            }
        };
        let Some(body) = status_apply_patch(&wl, &write.entry) else {
            return Err(Error::MalformedWorkload("no resourceVersion".into()));
        };
        let pp = PatchParams::apply(&field_manager_for(&ctx.field_manager, check)).force();
        match api
            .patch_status(&wl.name_any(), &pp, &Patch::Apply(&body))
            .await
        {
            Ok(_) => {
                if is_carried {
                    ctx.late().remove(&key);
                }
                written(ctx, &wl, check, &write, now).await;
                return Ok(write.recheck_after.or(revalidate_after));
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                // Decided from a stale Workload: read it again and decide again.
                ctx.metrics.conflict(check);
                debug!(workload = %wl.name_any(), check, "conflict, deciding again on a fresh read");
                let Some(fresh) = api.get_opt(&wl.name_any()).await? else {
                    return Ok(None);
                };
                let moved_on = AskedAt::of(&fresh, check) != asked_at
                    || !matches!(
                        eligibility(&fresh, check, revalidates),
                        Eligibility::Decide { .. }
                    );
                if moved_on
                    && !is_carried
                    && let Some(late) = LateRetry::from_refused(&write, &message, now)
                {
                    let note = format!(
                        "check {check}: Retry decided for attempt {} arrived after Kueue evicted the workload; \
                         the next attempt waits until {}",
                        late.attempt,
                        late.not_before.strftime("%Y-%m-%dT%H:%M:%SZ")
                    );
                    info!(workload = %wl.name_any(), namespace, check, "late Retry kept for the next attempt");
                    ctx.event(&fresh, EventType::Normal, "CheckRetryCarriedOver", note)
                        .await;
                    ctx.late().insert(key.clone(), late);
                }
                wl = Cow::Owned(fresh);
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Some(Duration::from_secs(1)))
}

/// Logs, counts and announces a state that was written.
async fn written<C: AdmissionCheckController>(
    ctx: &Context<C>,
    wl: &Workload,
    check: &str,
    write: &crate::decide::Write,
    now: Timestamp,
) {
    info!(
        workload = %wl.name_any(), namespace = ?wl.namespace(), check, state = %write.entry.state,
        attempt = write.attempt, message = %write.entry.message, "check state written"
    );
    let delay = write.retry_delay.map(|d| d.as_secs_f64());
    ctx.metrics
        .decision(wl, check, write.entry.state, write.attempt, delay, now);
    if write.state_changed {
        let (type_, reason) = match write.entry.state {
            CheckState::Ready => (EventType::Normal, "CheckReady"),
            CheckState::Pending => (EventType::Normal, "CheckPending"),
            CheckState::Retry => (EventType::Warning, "CheckRetry"),
            CheckState::Rejected => (EventType::Warning, "CheckRejected"),
        };
        let note = format!("check {check}: {}", write.entry.message);
        ctx.event(wl, type_, reason, note).await;
    }
}

/// Backoff for a Workload whose reconciles keep failing: 1 s, 2 s, 4 s ... up to 5 min, with
/// 20 % jitter so that many Workloads failing together (an API outage) do not retry in step.
fn error_backoff() -> RetryPolicy {
    RetryPolicy::exponential(Duration::from_secs(1), 2.0, Duration::from_secs(300), 0.2)
}

pub(crate) fn error_policy<C: AdmissionCheckController>(
    wl: Arc<Workload>,
    err: &Error,
    ctx: Arc<Context<C>>,
) -> Action {
    ctx.metrics.error(err.label());
    let failures = {
        let mut failures = lock(&ctx.failures);
        let n = failures.entry(wl.uid().unwrap_or_default()).or_insert(0);
        *n = n.saturating_add(1);
        *n
    };
    let delay = error_backoff().delay(failures, rand::random::<f64>());
    warn!(
        workload = %wl.name_any(), namespace = ?wl.namespace(), error = %err, kind = err.label(),
        failures, retry_in = ?delay, "reconcile failed"
    );
    Action::requeue(delay)
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

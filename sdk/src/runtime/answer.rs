//! Asking a check about one (Workload, check) pair and writing its answer, the step
//! [`crate::lifecycle::Step::Ask`]: the decision planned by [`crate::decide::plan`] and written
//! by `status_write`; a write refused as stale (409) decided again on a fresh read; a refusal
//! for good turned into a hold with the reason on the entry ([`crate::lifecycle`]'s holds); a
//! late `Retry` carried over to the next attempt.

use std::borrow::Cow;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, PatchParams};
use kube::runtime::events::EventType;
use tracing::{debug, info, warn};

use super::check_registry::ActiveCheck;
use super::context::{Context, redact_workload_note};
use super::memory::PairKey;
use super::status_write::{
    WriteFailure, apply, field_manager_for, permanent_refusal, refused_for_good, written,
};
use super::unanswerable::CANNOT_ANSWER;
use crate::api::{CheckState, Workload};
use crate::attempts;
use crate::check::{
    AdmissionCheckController, CheckContext, Decision, ErrorClass, NOT_PERMITTED_RECHECK,
};
use crate::decide::{Eligibility, LateRetry, Plan, PlanInput, Refusal, eligibility, plan};
use crate::error::Error;
use crate::lifecycle::{self, AskedAt, PERMANENT_MARK, sooner};

/// How often one decision is recomputed after the API server refused it as stale (409) before
/// the reconcile gives up and waits for the watch to deliver the newer Workload.
pub(super) const CONFLICT_ATTEMPTS: usize = 3;

/// A decision kept across a conflict: written again on the fresh Workload if that is still
/// the same attempt, instead of asking the check a second time.
struct Decided {
    decision: Decision,
    /// Where the Workload stood when it was decided (its attempt among it).
    at: Option<AskedAt>,
    /// A carried-over late `Retry`, not the check's answer for this attempt.
    carried: bool,
    /// What the check read that Kueue does not change within an attempt.
    inputs: Inputs,
    /// Decided about a `Ready` entry (revalidating) or a `Pending` one.
    revalidating: bool,
    /// The time the check was given: a delay it computed (e.g. until midnight) counts from it,
    /// so the entry written for this decision, even after a conflict, uses it too.
    now: Timestamp,
    /// Written without the attempt record: the API server refuses the record for good, and
    /// the hold for that is over (or the record was only a catch-up with `retryCount`).
    uncounted: bool,
    /// The runtime's answer for a check that cannot answer (its request refused for want of a
    /// permission): written under a policy that never rejects.
    never_rejects: bool,
}

impl Decided {
    /// The delayed `Retry` a refused `write` of this decision leaves for the next attempt; none
    /// for one that is itself carried over (it is kept already).
    fn late_retry(&self, write: &crate::decide::Write) -> Option<LateRetry> {
        if self.carried {
            return None;
        }
        LateRetry::from_refused(write, self.decision.message(), self.now)
    }
}

/// The parts of a Workload a check decides on that Kueue's bookkeeping within an attempt does
/// not change: its spec (by generation), labels and annotations (less the attempt records the
/// runtime writes), and the admission (flavors and counts; quota can be released and reserved
/// again elsewhere without an eviction). A conflict caused by anything else leaves a decision
/// valid.
#[derive(Clone, Debug, PartialEq)]
struct Inputs {
    generation: Option<i64>,
    labels: std::collections::BTreeMap<String, String>,
    annotations: Vec<(String, String)>,
    admission: Option<crate::api::Admission>,
}

impl Inputs {
    fn of(wl: &Workload) -> Self {
        let prefix = format!("{}/", attempts::ANNOTATION_PREFIX);
        Self {
            generation: wl.metadata.generation,
            labels: wl.labels().clone(),
            annotations: wl
                .annotations()
                .iter()
                .filter(|(k, _)| !k.starts_with(&prefix))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            admission: wl.status.as_ref().and_then(|s| s.admission.clone()),
        }
    }
}

/// Decides one check for one Workload; returns when to look again, if the check asked.
///
/// Asks the check (or reuses its answer, see [`Decided`]), plans the write with
/// [`crate::decide::plan`] and applies it; a write refused because the Workload changed is
/// decided again on a fresh read, up to [`CONFLICT_ATTEMPTS`] times. `stands` is where the check
/// stands on the cached Workload; it is worked out again after each fresh read.
pub(super) async fn decide_one<C: AdmissionCheckController>(
    ctx: &Context<C>,
    cached: &Workload,
    check: &str,
    active: &ActiveCheck<C::Parameters>,
    revalidating: bool,
) -> Result<Option<Duration>, Error> {
    let namespace = cached
        .namespace()
        .ok_or_else(|| Error::MalformedWorkload("no namespace".into()))?;
    let uid = cached
        .uid()
        .ok_or_else(|| Error::MalformedWorkload("no uid".into()))?;
    let mut stands = Eligibility::Decide { revalidating };
    let pair = Pair {
        ctx,
        check,
        active,
        key: (uid, check.to_string()),
        api: Api::namespaced(ctx.client.clone(), &namespace),
    };
    // The cached Workload is borrowed; an owned copy exists only after a 409 made us read again.
    let mut wl = Cow::Borrowed(cached);
    let mut kept: Option<Decided> = None;
    for _ in 0..CONFLICT_ATTEMPTS {
        let Eligibility::Decide { revalidating } = stands else {
            return Ok(None);
        };
        let asking = (revalidating, kept.take());
        let Some(decided) = decision_for(&wl, &pair, asking).await? else {
            return Ok(None);
        };
        let (decided, write, failure) = match write_decided(&wl, &pair, decided).await? {
            Attempted::Over(after) => return Ok(after),
            Attempted::Invalid(held) => {
                kept = Some(held);
                continue;
            }
            Attempted::Refused(refused) => *refused,
        };
        match after_refused_write(&wl, &pair, decided, &write, failure).await? {
            Next::Done => return Ok(None),
            Next::Again { fresh, kept: k } => {
                if let Some(fresh) = fresh {
                    stands = eligibility(&fresh, check, ctx.revalidates());
                    wl = Cow::Owned(*fresh);
                }
                kept = k;
            }
        }
    }
    Ok(Some(Duration::from_secs(1)))
}

/// How one write of a decision went.
enum Attempted {
    /// Written, or nothing to write: look again after this long, if set.
    Over(Option<Duration>),
    /// The decision cannot be written: this is held instead, to write next.
    Invalid(Decided),
    /// The API server refused the write of this decision (boxed: the rare path carries the
    /// most).
    Refused(Box<(Decided, crate::decide::Write, WriteFailure)>),
}

/// Plans the write of `decided` on `wl` and applies it.
async fn write_decided<C: AdmissionCheckController>(
    wl: &Workload,
    pair: &Pair<'_, C>,
    decided: Decided,
) -> Result<Attempted, Error> {
    let (ctx, check) = (pair.ctx, pair.check);
    let revalidate_after = ctx
        .controller
        .revalidate()
        .period()
        .filter(|_| decided.revalidating);
    let mut write = match plan_write(wl, pair, &decided).await? {
        Planned::Write(write) => write,
        Planned::Skip(recheck_after) => {
            return Ok(Attempted::Over(recheck_after.or(revalidate_after)));
        }
        Planned::Invalid(why) => {
            return Ok(Attempted::Invalid(
                held_for_invalid(wl, pair, decided, &why).await,
            ));
        }
    };
    if decided.uncounted {
        write.record = None;
    }
    let pp = PatchParams::apply(&field_manager_for(&ctx.field_manager, check)).force();
    match apply(&pair.api, wl, check, &write, &pp).await {
        Ok(written_rv) => {
            landed(wl, pair, &decided, &write, written_rv).await;
            Ok(Attempted::Over(write.recheck_after.or(revalidate_after)))
        }
        Err(failure) => Ok(Attempted::Refused(Box::new((decided, write, failure)))),
    }
}

/// The Workload and check one [`decide_one`] is about, with the runtime deciding it: what its
/// steps share.
struct Pair<'a, C: AdmissionCheckController> {
    ctx: &'a Context<C>,
    check: &'a str,
    /// The check as resolved: its parameters and retry policy.
    active: &'a ActiveCheck<C::Parameters>,
    key: PairKey,
    /// Workloads in the Workload's namespace.
    api: Api<Workload>,
}

/// What to do after a refused write.
enum Next {
    /// Nothing more to write for this reconcile.
    Done,
    /// Decide and write again: on `fresh` (a new read) if given, reusing `kept` if given.
    Again {
        fresh: Option<Box<Workload>>,
        kept: Option<Decided>,
    },
}

/// The decision to write for `wl` as it is (its entry to be decided, `revalidating` a `Ready`
/// one or not): `kept` if it still applies (same attempt, same inputs), else the check's answer.
/// `None` if the check had nothing to say.
async fn decision_for<C: AdmissionCheckController>(
    wl: &Workload,
    pair: &Pair<'_, C>,
    (revalidating, kept): (bool, Option<Decided>),
) -> Result<Option<Decided>, Error> {
    let ctx = pair.ctx;
    let asked_at = AskedAt::of(wl, pair.check);
    if let Some(at) = asked_at {
        ctx.memory.pair(&pair.key, |p| {
            p.asked = Some(at);
            // The entry came: what was started early is now the decision's to carry on.
            p.early = None;
        });
    }
    let still_valid = |d: &Decided| {
        d.at == asked_at && d.revalidating == revalidating && d.inputs == Inputs::of(wl)
    };
    match kept.filter(still_valid) {
        Some(d) => Ok(Some(d)),
        None => ask(wl, pair, revalidating, asked_at).await,
    }
}

/// The write of `decided` landed at `written_rv`: a carried-over `Retry` is done, the write is
/// awaited in the cache, and it is logged, counted and announced.
async fn landed<C: AdmissionCheckController>(
    wl: &Workload,
    pair: &Pair<'_, C>,
    decided: &Decided,
    write: &crate::decide::Write,
    written_rv: Option<String>,
) {
    let (ctx, check) = (pair.ctx, pair.check);
    if decided.carried {
        ctx.memory.pair(&pair.key, |p| p.late = None);
    }
    if let Some(rv) = written_rv {
        let now = tokio::time::Instant::now();
        ctx.own_writes.wrote(&pair.key.0, check, rv, now);
    }
    written(ctx, wl, check, write, decided.now, decided.uncounted).await;
}

/// A decision Kueue would refuse, or that makes no sense (`why`): retrying the same answer
/// cannot help, so the reason goes on the entry instead, the permanent path (held, then
/// `Retry`, then `Rejected` past the limit).
async fn held_for_invalid<C: AdmissionCheckController>(
    wl: &Workload,
    pair: &Pair<'_, C>,
    decided: Decided,
    why: &str,
) -> Decided {
    let message = format!(
        "the {} answer of check {} cannot be written: {why} (the check said: {})",
        decided.decision.state(),
        pair.check,
        crate::check::truncate_chars(decided.decision.message(), 300)
    );
    let decision = permanent_decision(wl, pair, message, decided.now).await;
    Decided {
        decision,
        ..decided
    }
}

/// What [`plan_write`] found.
enum Planned {
    /// Write this.
    Write(crate::decide::Write),
    /// Nothing to write (nothing changes, or not eligible); look again after this long, if set.
    Skip(Option<Duration>),
    /// The decision cannot be written, for this reason.
    Invalid(String),
}

/// The status write for `decided`, when to look again without writing, or why it cannot be
/// written. A decision refused by the rules while revalidating a `Ready` entry is an error
/// (with an Event, tried again with backoff): an admitted answer is not taken back for it.
async fn plan_write<C: AdmissionCheckController>(
    wl: &Workload,
    pair: &Pair<'_, C>,
    decided: &Decided,
) -> Result<Planned, Error> {
    let ctx = pair.ctx;
    let check = pair.check;
    let never_rejects = super::unanswerable::never_rejects();
    let input = PlanInput {
        workload: wl,
        check,
        decision: decided.decision.clone(),
        attempt: decided.at.map_or(1, |a| a.attempt),
        policy: match decided.never_rejects {
            true => &never_rejects,
            false => &pair.active.policy,
        },
        max_retry_delay: ctx.max_retry_delay,
        revalidate_ready: ctx.revalidates(),
        now: decided.now,
        jitter_sample: rand::random::<f64>(),
    };
    match plan(input) {
        Plan::Write(write) => Ok(Planned::Write(write)),
        Plan::Unchanged { recheck_after } => Ok(Planned::Skip(recheck_after)),
        Plan::Refused(Refusal::NotEligible(why)) => {
            debug!(workload = %wl.name_any(), check, ?why, "decision not written");
            Ok(Planned::Skip(None))
        }
        Plan::Refused(Refusal::InvalidDecision(why))
            if !decided.revalidating && !decided.decision.message().starts_with(PERMANENT_MARK) =>
        {
            Ok(Planned::Invalid(why))
        }
        Plan::Refused(Refusal::InvalidDecision(why)) => {
            let why = format!("check {check}: {why}");
            ctx.event(wl, EventType::Warning, "InvalidDecision", why.clone())
                .await;
            Err(Error::InvalidDecision(why))
        }
    }
}

/// What a refused write of `decided` leads to: a read and another try after a conflict, nothing
/// for a Workload deleted meanwhile, the permanent failure written instead of an answer the API
/// server will never take, an error (with backoff) for the rest.
async fn after_refused_write<C: AdmissionCheckController>(
    wl: &Workload,
    pair: &Pair<'_, C>,
    decided: Decided,
    write: &crate::decide::Write,
    failure: WriteFailure,
) -> Result<Next, Error> {
    let ctx = pair.ctx;
    let check = pair.check;
    match failure {
        WriteFailure::Record(kube::Error::Api(status))
        | WriteFailure::Status(kube::Error::Api(status))
            if status.code == 409 =>
        {
            let late = decided.late_retry(write);
            after_conflict(wl, pair, decided, late).await
        }
        WriteFailure::Record(kube::Error::Api(status))
        | WriteFailure::Status(kube::Error::Api(status))
            if status.code == 404 =>
        {
            deleted_meanwhile(wl, pair, status).await
        }
        WriteFailure::Status(kube::Error::Api(status))
            if !decided.decision.message().starts_with(PERMANENT_MARK)
                && permanent_refusal(&status).is_some() =>
        {
            // (An `if let` guard would bind the message once, but the MSRV, 1.89, lacks it.)
            let refused = permanent_refusal(&status).unwrap_or_default();
            Ok(answer_refused(wl, pair, decided, write, &refused).await)
        }
        WriteFailure::Record(kube::Error::Api(status)) if refused_for_good(status.code) => {
            Ok(record_refused(wl, pair, decided, write, &status).await)
        }
        WriteFailure::Record(e) => {
            // A failure that may pass (an outage, a timeout, 5xx, 429): without the record no
            // Retry may be written (it would land uncounted), so it is tried again with backoff
            // and said where the operator looks.
            let note = format!("check {check}: counting the Retry on the Workload failed: {e}");
            let note = redact_workload_note(wl, &note);
            ctx.event(wl, EventType::Warning, "CheckWriteFailed", note)
                .await;
            Err(e.into())
        }
        WriteFailure::Status(e) => Err(e.into()),
    }
}

/// A write answered 404: the Workload was deleted between the read and the write, and nothing
/// is left to answer (not an error to count or back off from). A read confirms it, so that a
/// 404 for another reason (a missing status subresource) is still reported.
async fn deleted_meanwhile<C: AdmissionCheckController>(
    wl: &Workload,
    pair: &Pair<'_, C>,
    status: Box<kube::core::Status>,
) -> Result<Next, Error> {
    if pair.api.get_opt(&wl.name_any()).await?.is_none() {
        debug!(workload = %wl.name_any(), check = pair.check, "deleted before the answer was written");
        return Ok(Next::Done);
    }
    Err(kube::Error::Api(status).into())
}

/// The API server will never take this answer (`refused`: e.g. a podSetUpdate it or a webhook
/// finds invalid): say so on the entry instead, and keep the quota only for the hold.
async fn answer_refused<C: AdmissionCheckController>(
    wl: &Workload,
    pair: &Pair<'_, C>,
    decided: Decided,
    write: &crate::decide::Write,
    refused: &str,
) -> Next {
    let check = pair.check;
    let message = format!(
        "the {} answer of check {check} cannot be written: {refused}",
        write.entry.state,
    );
    warn!(workload = %wl.name_any(), namespace = %wl.namespace().unwrap_or_default(), check, %message, "status write refused");
    let decision = permanent_decision(wl, pair, message, decided.now).await;
    Next::Again {
        fresh: None,
        kept: Some(Decided {
            decision,
            ..decided
        }),
    }
}

/// The API server refuses the attempt record of `write` for good (a 403 for a missing `patch`
/// on workloads, a policy's 400 or 403, a 422 for annotations over their limit). A `Retry`
/// must not reach Kueue uncounted while the operator may still fix it, but neither may the
/// quota be held until someone does: the entry says so (`Pending`, the permanent-failure
/// mark) for [`super::config::RuntimeConfig::permanent_failure_hold`], counted from the first refusal
/// of the attempt, and then the `Retry` (or the `Rejected` it becomes past the limit) is
/// written without the record: Kueue's `retryCount` still counts it. Any other state is
/// written without the record at once (it was only a catch-up with `retryCount`). Each refusal
/// is an Event `AttemptRecordRefused`; the first of an attempt is counted
/// (`kueue_ac_attempt_records_refused_total`) and logged.
async fn record_refused<C: AdmissionCheckController>(
    wl: &Workload,
    pair: &Pair<'_, C>,
    decided: Decided,
    write: &crate::decide::Write,
    status: &kube::core::Status,
) -> Next {
    let (ctx, check) = (pair.ctx, pair.check);
    let why = record_refusal(check, status);
    // News unless the entry already shows this refusal.
    let first = wl
        .admission_check(check)
        .is_none_or(|e| !e.message.contains(&why));
    if first {
        ctx.metrics.attempt_record_refused(check);
        warn!(workload = %wl.name_any(), namespace = ?wl.namespace(), check, %why, "attempt record refused");
    }
    let hold = lifecycle::Hold::on(wl, check, ctx.permanent_failure_hold, Timestamp::now());
    let held = (write.entry.state == CheckState::Retry)
        .then(|| lifecycle::record_refused(check, decided.decision.message(), &why, &hold))
        .flatten();
    let until = hold.until.strftime("%Y-%m-%dT%H:%M:%SZ");
    let plan = match held {
        Some(_) => format!(
            "the Retry is written without it at {until} (Kueue's retryCount still counts it)"
        ),
        None => format!(
            "the {} answer is written without it (Kueue's retryCount still counts retries)",
            write.entry.state
        ),
    };
    let note = format!("check {check}: the attempt record cannot be written: {why}; {plan}");
    ctx.event(wl, EventType::Warning, "AttemptRecordRefused", note)
        .await;
    let decision = held.unwrap_or_else(|| decided.decision.clone());
    Next::Again {
        fresh: None,
        kept: Some(Decided {
            decision,
            uncounted: true,
            ..decided
        }),
    }
}

/// Why the attempt record was refused, for the entry, the Event and the log: RBAC named as a
/// missing grant, anything else with the server's words (quoted values redacted).
fn record_refusal(check: &str, status: &kube::core::Status) -> String {
    let annotation = attempts::annotation_key(check);
    if status.code == 403 && crate::check::admission_denial(&status.message).is_none() {
        return format!(
            "the controller may not patch workloads.kueue.x-k8s.io (grant patch on workloads; \
             it writes annotation {annotation})"
        );
    }
    format!(
        "the API server refused the patch of annotation {annotation} ({} {}): {}",
        status.code,
        status.reason,
        crate::check::redact_quoted(&status.message, &[])
    )
}

/// The write of `decided` was refused because the Workload changed since it was read: reads it
/// again and says whether the same decision still applies to it; `late` is kept for the next
/// attempt if Kueue moved on meanwhile.
async fn after_conflict<C: AdmissionCheckController>(
    wl: &Workload,
    pair: &Pair<'_, C>,
    decided: Decided,
    late: Option<LateRetry>,
) -> Result<Next, Error> {
    let ctx = pair.ctx;
    let check = pair.check;
    ctx.metrics.conflict(check);
    debug!(workload = %wl.name_any(), check, "conflict, reading the workload again");
    let Some(fresh) = pair.api.get_opt(&wl.name_any()).await? else {
        return Ok(Next::Done);
    };
    let same_attempt = AskedAt::of(&fresh, check) == decided.at;
    let kept = match eligibility(&fresh, check, ctx.revalidates()) {
        // Same attempt, still undecided: the same decision is written on the fresh read,
        // unless what the check decided on changed (then it is asked again).
        Eligibility::Decide { revalidating } if same_attempt => {
            if revalidating != decided.revalidating {
                // A Pending entry we decided on turned out Ready (our own earlier answer,
                // which the cache had not shown): already answered.
                debug!(workload = %wl.name_any(), check, "already answered for this attempt");
                return Ok(Next::Done);
            }
            Some(decided)
        }
        // Same attempt, already answered (our own earlier write, which the cache had not
        // shown): nothing is lost, and nothing to carry over.
        Eligibility::Wait(_) if same_attempt => {
            debug!(workload = %wl.name_any(), check, "already answered for this attempt");
            return Ok(Next::Done);
        }
        // Kueue moved on (evicted, another attempt): a delayed Retry still holds.
        _ => {
            if let Some(late) = late {
                carry_over(&fresh, pair, late).await;
            }
            None
        }
    };
    Ok(Next::Again {
        fresh: Some(Box::new(fresh)),
        kept,
    })
}

/// Asks the check (or takes a carried-over late `Retry`); `None` when nothing is to be written.
async fn ask<C: AdmissionCheckController>(
    wl: &Workload,
    pair: &Pair<'_, C>,
    revalidating: bool,
    at: Option<AskedAt>,
) -> Result<Option<Decided>, Error> {
    let now = Timestamp::now();
    let decided = |decision, carried, never_rejects| Decided {
        decision,
        at,
        carried,
        inputs: Inputs::of(wl),
        revalidating,
        now,
        uncounted: false,
        never_rejects,
    };
    if let Some(decision) = carried_retry(pair, revalidating, now) {
        // Counted as this attempt's Retry: usually the refused one was never counted (its
        // attempt record was refused too); if it was, counting it again costs a retry but
        // keeps the stored attempt from ever going back.
        return Ok(Some(decided(decision, true, false)));
    }
    let (decision, never_rejects) = match check_answer(wl, pair, revalidating, now).await? {
        Answered::Check(decision) => (decision, false),
        Answered::CannotAnswer(decision) => (decision, true),
    };
    Ok(Some(decided(decision, false, never_rejects)))
}

/// A `Retry` refused because Kueue evicted the Workload while the check decided, honoured now
/// for what is left of its delay instead of asking the check again; forgotten once over.
fn carried_retry<C: AdmissionCheckController>(
    pair: &Pair<'_, C>,
    revalidating: bool,
    now: Timestamp,
) -> Option<Decision> {
    let late = pair.ctx.memory.pair(&pair.key, |p| p.late.clone())?;
    let decision = late.decision(now).filter(|_| !revalidating);
    if decision.is_none() {
        pair.ctx.memory.pair(&pair.key, |p| p.late = None);
    }
    decision
}

/// What [`check_answer`] found.
enum Answered {
    /// The check's answer, or the runtime's for its permanent failure.
    Check(Decision),
    /// The runtime's answer for a check refused a permission: held, then `Retry`, never
    /// `Rejected`.
    CannotAnswer(Decision),
}

/// The check's answer for `wl`; a permanent failure is turned into its hold
/// ([`permanent_decision`]), a refused permission into the hold of a check that cannot answer
/// ([`not_permitted_decision`]), unless the entry is `Ready` (an admitted answer is not taken
/// back for an error: it is tried again).
async fn check_answer<C: AdmissionCheckController>(
    wl: &Workload,
    pair: &Pair<'_, C>,
    revalidating: bool,
    now: Timestamp,
) -> Result<Answered, Error> {
    let (ctx, check) = (pair.ctx, pair.check);
    let entry = wl
        .admission_check(check)
        .ok_or_else(|| Error::MalformedWorkload("no entry".into()))?;
    let check_ctx = CheckContext {
        workload: wl,
        entry,
        parameters: &pair.active.parameters,
        client: &ctx.client,
        now,
        shadow: None,
    };
    // A permanent failure shown on the entry ends once a real answer is written, not here: an
    // answer that cannot be written is one more failure.
    let e = match ctx.controller.decide(&check_ctx).await {
        Ok(decision) => return Ok(Answered::Check(decision)),
        Err(e) => e,
    };
    match ctx.controller.classify_error(&e) {
        ErrorClass::Transient => Err(ctx.check_failed(wl, format!("check {check}: {e}"), e).await),
        ErrorClass::Permanent { message } | ErrorClass::NotPermitted { message }
            if revalidating =>
        {
            let note = format!("check {check} (revalidating): {message}");
            Err(ctx.check_failed(wl, note, e).await)
        }
        ErrorClass::Permanent { message } => Ok(Answered::Check(
            permanent_decision(wl, pair, message, now).await,
        )),
        ErrorClass::NotPermitted { message } => Ok(Answered::CannotAnswer(
            not_permitted_decision(wl, pair, &message, now).await,
        )),
    }
}

/// What to write when the API server refused the check a permission (`message`): the hold of
/// a check that cannot answer ([`lifecycle::cannot_answer`]), asked again every
/// [`NOT_PERMITTED_RECHECK`] so that a grant is noticed, announced like a permanent failure.
async fn not_permitted_decision<C: AdmissionCheckController>(
    wl: &Workload,
    pair: &Pair<'_, C>,
    message: &str,
    now: Timestamp,
) -> Decision {
    let (ctx, check) = (pair.ctx, pair.check);
    let why = format!("check {check} cannot answer: {message}");
    let decision = match lifecycle::cannot_answer(wl, check, &why, ctx.permanent_failure_hold, now)
    {
        Decision::Pending {
            message,
            recheck_after,
        } => Decision::Pending {
            message,
            recheck_after: sooner(recheck_after, Some(NOT_PERMITTED_RECHECK)),
        },
        other => other,
    };
    let shown = wl
        .admission_check(check)
        .is_some_and(|e| e.message.starts_with(&why));
    if !shown {
        warn!(workload = %wl.name_any(), namespace = ?wl.namespace(), check, %message, "refused a permission");
    }
    let note = crate::check::truncate_chars(&why, MAX_EVENT_REASON);
    ctx.event(wl, EventType::Warning, CANNOT_ANSWER, note).await;
    decision
}

/// What to write for a permanent failure ([`lifecycle::permanent_failure`]: held, then
/// `Retry`), counted and logged when it is news (not shown on the entry yet), and announced
/// every time it is seen (repeats count into the first Event's series, so `kubectl describe`
/// shows it is still failing).
async fn permanent_decision<C: AdmissionCheckController>(
    wl: &Workload,
    pair: &Pair<'_, C>,
    message: String,
    now: Timestamp,
) -> Decision {
    let (ctx, check) = (pair.ctx, pair.check);
    let decision =
        lifecycle::permanent_failure(wl, check, &message, ctx.permanent_failure_hold, now);
    // News unless the entry shows this failure already (also one shown before a restart).
    let head: String = message.chars().take(200).collect();
    let shown = wl
        .admission_check(check)
        .is_some_and(|e| e.message.starts_with(&format!("{PERMANENT_MARK}{head}")));
    if !shown {
        ctx.metrics.permanent_failure(check);
        warn!(workload = %wl.name_any(), namespace = ?wl.namespace(), check, %message, "permanent failure");
    }
    let note = format!(
        "check {check}: {}",
        crate::check::truncate_chars(&message, MAX_EVENT_REASON)
    );
    ctx.event(wl, EventType::Warning, "CheckFailedPermanently", note)
        .await;
    decision
}

/// How much of a permanent failure's reason goes into its Event.
const MAX_EVENT_REASON: usize = 600;

/// Keeps a refused delayed `Retry` for the next attempt and says so.
async fn carry_over<C: AdmissionCheckController>(
    fresh: &Workload,
    pair: &Pair<'_, C>,
    late: LateRetry,
) {
    let ctx = pair.ctx;
    let check = pair.check;
    let note = format!(
        "check {check}: Retry decided for attempt {} arrived after Kueue evicted the workload; \
         the next attempt waits until {}",
        late.attempt,
        late.not_before.strftime("%Y-%m-%dT%H:%M:%SZ")
    );
    info!(workload = %fresh.name_any(), namespace = ?fresh.namespace(), check, "late Retry kept for the next attempt");
    if ctx.normal_events {
        ctx.event(fresh, EventType::Normal, "CheckRetryCarriedOver", note)
            .await;
    }
    ctx.memory.pair(&pair.key, |p| p.late = Some(late));
}

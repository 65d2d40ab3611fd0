//! One Workload: ask each of our checks that may answer, and apply what the decision layer allows.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use sha2::{Digest, Sha256};
use tracing::{Instrument, debug, info, info_span, warn};

use super::checks::ActiveCheck;
use super::context::{Context, redact_workload_note, release};
use super::memory::{AskedAt, EarlyStart, Hold, PairKey, PermanentFailure, lock};
use super::unanswerable;
use crate::api::CheckState;
use crate::api::Workload;
use crate::attempts;
use crate::check::{AdmissionCheckController, CheckContext, Decision, ErrorClass};
use crate::decide::{
    Eligibility, LateRetry, Plan, PlanInput, Refusal, eligibility, plan, standing,
    status_apply_patch,
};
use crate::error::Error;
use crate::release::{ReleaseContext, ReleaseReason};
use crate::retry::RetryPolicy;

/// How often one decision is recomputed after the API server refused it as stale (409) before
/// the reconcile gives up and waits for the watch to deliver the newer Workload.
const CONFLICT_ATTEMPTS: usize = 3;

pub(crate) async fn reconcile<C: AdmissionCheckController>(
    wl: Arc<Workload>,
    ctx: Arc<Context<C>>,
) -> Result<Action, Error> {
    let namespace = wl.namespace().unwrap_or_default();
    let now = tokio::time::Instant::now();
    let Some(_turn) = ctx.turns.ask(&namespace, &wl.name_any(), now) else {
        // Queued: when its turn comes, the Workload is sent to kube again and that reconcile
        // takes the turn (see `turns`). Nothing waits in kube meanwhile.
        return Ok(Action::await_change());
    };
    // Whatever this reconcile finds, it reads the changes that waited for it.
    {
        let (waited, waiting) = ctx.queued.reconciling(&namespace, &wl.name_any(), now);
        if let Some(waited) = waited {
            ctx.metrics.queue_waited(waited);
        }
        ctx.metrics.queue_depth(waiting);
    }
    // The Workload may have changed while this reconcile waited for its turn.
    let wl = match &ctx.cache {
        Some(cache) => match cache.get(&ObjectRef::from_obj(wl.as_ref())) {
            Some(newest) => newest,
            // Deleted meanwhile: its release runs on the deletion.
            None => return Ok(Action::await_change()),
        },
        None => wl,
    };
    // Failed on this very version and still backing off: only a change of the Workload asks
    // again before the backoff ends (kube's requeue for it is already scheduled).
    if let Some(uid) = wl.uid() {
        let backoff = ctx.memory.workload(&uid, |w| w.backing_off.clone());
        if let Some((failed_on, until)) = backoff
            && failed_on.is_some()
            && failed_on == wl.resource_version()
        {
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            if !left.is_zero() {
                debug!(workload = %wl.name_any(), ?left, "backing off after a failure; unchanged since");
                return Ok(Action::requeue(left));
            }
        }
    }
    // Boxed: the decision's (large) future exists only for the reconciles holding a turn; the
    // many that may wait (a reconcile of everything) each keep only this small one.
    let result = Box::pin(reconcile_in_turn(&wl, &ctx)).await;
    if let Some(uid) = wl.uid() {
        // The end of the backoff is set by the error policy, which kube calls next.
        let failed_on = result
            .is_err()
            .then(|| (wl.resource_version(), tokio::time::Instant::now()));
        ctx.memory.workload(&uid, |w| w.backing_off = failed_on);
    }
    result
}

async fn reconcile_in_turn<C: AdmissionCheckController>(
    wl: &Arc<Workload>,
    ctx: &Arc<Context<C>>,
) -> Result<Action, Error> {
    let started = std::time::Instant::now();
    let result = reconcile_workload(wl, ctx).await;
    ctx.metrics.reconciled(started.elapsed(), result.is_ok());
    result
}

async fn reconcile_workload<C: AdmissionCheckController>(
    wl: &Arc<Workload>,
    ctx: &Arc<Context<C>>,
) -> Result<Action, Error> {
    if let Some(scope) = &ctx.shadow {
        let requeue = super::shadow::reconcile_shadowed(ctx, wl, scope).await?;
        if let Some(uid) = wl.uid() {
            ctx.memory.workload(&uid, |w| w.failures = 0);
        }
        return Ok(requeue.map_or_else(Action::await_change, Action::requeue));
    }
    let RegistryView {
        ours,
        early,
        all_ours,
        cannot_answer,
    } = registry_view(ctx, wl);
    // Releases cover the checks gone from the registry too: a check deleted or renamed while
    // Workloads held something for it (Kueue then drops its entries: the check is idle).
    let releasable: Vec<String> = {
        let mut known = lock(&ctx.known_checks);
        for check in &all_ours {
            if !known.contains(check) {
                known.insert(check.clone());
            }
        }
        known.iter().cloned().collect()
    };
    // Where each check stands on this version of the Workload, worked out once.
    let revalidate = ctx.revalidates();
    let starts_early = ctx.controller.starts_early();
    let seen: BTreeMap<String, Eligibility> = releasable
        .into_iter()
        .map(|check| {
            // The queue is looked up only for a check without its entry.
            let applies = starts_early
                && wl.admission_check(&check).is_none()
                && ctx.cluster_queues.check_applies(wl, &check);
            let stands = standing(wl, &check, revalidate, applies);
            (check, stands)
        })
        .collect();
    debug!(
        workload = %wl.name_any(),
        resource_version = wl.resource_version().unwrap_or_default(),
        deciding = ours.len(),
        checks = ?seen,
        "reconciling"
    );
    remember_earlier_answers(ctx, wl, &all_ours, &seen);
    release_idle(ctx, wl, &seen).await?;
    let mut requeue: Option<Duration> = None;
    for (check, why) in cannot_answer {
        let next = unanswerable::hold_or_release(ctx, wl, &check, &why).await?;
        requeue = sooner(requeue, next);
    }
    for (check, active) in ours {
        // One span per check and reconcile: every log line inside names the Workload and check.
        let span = info_span!(
            "decide",
            workload = %wl.name_any(),
            namespace = %wl.namespace().unwrap_or_default(),
            check = %check,
        );
        let stands = seen[&check];
        let next = decide_one(ctx, wl, &check, &active, stands)
            .instrument(span)
            .await?;
        requeue = sooner(requeue, next);
    }
    for (check, active) in early {
        if seen.get(&check) != Some(&Eligibility::Early) {
            continue;
        }
        let span = info_span!(
            "start_early",
            workload = %wl.name_any(),
            namespace = %wl.namespace().unwrap_or_default(),
            check = %check,
        );
        let next = start_early(ctx, wl, &check, &active)
            .instrument(span)
            .await?;
        requeue = sooner(requeue, next);
    }
    if let Some(uid) = wl.uid() {
        ctx.memory.workload(&uid, |w| w.failures = 0);
    }
    Ok(requeue.map_or_else(Action::await_change, Action::requeue))
}

/// Our checks as they concern one Workload.
struct RegistryView<P> {
    /// Checks to decide: active, with an entry on the Workload.
    ours: Vec<(String, Arc<ActiveCheck<P>>)>,
    /// Active checks without an entry on the Workload, when the check starts early: whether
    /// the entry is due is worked out with the ClusterQueue.
    early: Vec<(String, Arc<ActiveCheck<P>>)>,
    /// Every check of ours (an inactive or removed one may still have something to release).
    all_ours: Vec<String>,
    /// Inactive checks with an entry, and why they cannot answer (see `unanswerable`).
    cannot_answer: Vec<(String, String)>,
}

fn registry_view<C: AdmissionCheckController>(
    ctx: &Context<C>,
    wl: &Workload,
) -> RegistryView<C::Parameters> {
    let starts_early = ctx.controller.starts_early();
    let mut view = RegistryView {
        ours: Vec::new(),
        early: Vec::new(),
        all_ours: Vec::new(),
        cannot_answer: Vec::new(),
    };
    let registry = ctx.registry.read().unwrap_or_else(|p| p.into_inner());
    for (name, state) in registry.iter() {
        view.all_ours.push(name.clone());
        match (state, wl.admission_check(name)) {
            (Ok(active), Some(_)) => view.ours.push((name.clone(), active.clone())),
            (Err(inactive), Some(_)) => {
                let why = unanswerable::inactive(name, inactive);
                view.cannot_answer.push((name.clone(), why));
            }
            (Ok(active), None) if starts_early => view.early.push((name.clone(), active.clone())),
            (_, None) => {}
        }
    }
    view
}

/// The sooner of two times to look again.
pub(super) fn sooner(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A Workload that holds quota with our answer on it was asked by an earlier process (before a
/// restart or a leader change): remember it, so that its release is not missed when it finishes,
/// is evicted or deleted. (One that went idle while no replica ran is never seen holding; a
/// check that holds resources reconciles them itself.)
fn remember_earlier_answers<C: AdmissionCheckController>(
    ctx: &Context<C>,
    wl: &Workload,
    checks: &[String],
    seen: &BTreeMap<String, Eligibility>,
) {
    let Some(uid) = wl.uid() else { return };
    for check in checks {
        if let Some(Eligibility::Wait(_) | Eligibility::Decide { revalidating: true }) =
            seen.get(check)
            && let Some(at) = AskedAt::of(wl, check)
        {
            let key = (uid.clone(), check.clone());
            ctx.memory.pair(&key, |p| {
                p.asked.get_or_insert(at);
            });
        }
    }
}

/// Starts `check`'s work for a Workload whose entry Kueue has yet to add (see
/// [`AdmissionCheckController::start_early`]), once per attempt, and releases it if the entry
/// does not come within [`super::RuntimeConfig::early_start_wait`]. Returns when to look again.
async fn start_early<C: AdmissionCheckController>(
    ctx: &Context<C>,
    wl: &Workload,
    check: &str,
    active: &ActiveCheck<C::Parameters>,
) -> Result<Option<Duration>, Error> {
    let Some(uid) = wl.uid() else { return Ok(None) };
    let key: PairKey = (uid, check.to_string());
    let at = AskedAt::expected(wl, check);
    let now = tokio::time::Instant::now();
    let wait = ctx.early_start_wait;
    if let Some(early) = ctx.memory.pair(&key, |p| p.early.filter(|e| e.at == at)) {
        if early.abandoned {
            return Ok(None);
        }
        let waited = now.saturating_duration_since(early.since);
        if waited < wait {
            return Ok(Some(wait - waited));
        }
        release(ctx, wl, check, ReleaseReason::EntryNotAdded).await?;
        ctx.metrics.early_start_abandoned(check);
        let note = format!(
            "check {check}: Kueue did not add the check's entry within {}s of the quota \
             reservation; what the check started for the Workload was released, and starts \
             again when the entry comes",
            wait.as_secs()
        );
        ctx.event(wl, EventType::Warning, "EarlyStartAbandoned", note)
            .await;
        ctx.memory.pair(&key, |p| {
            p.asked = None;
            p.early = Some(EarlyStart {
                abandoned: true,
                ..early
            });
        });
        return Ok(None);
    }
    // A stand-in for the entry Kueue will add: the check reads its name and state.
    let entry = crate::api::AdmissionCheckState {
        name: check.to_string(),
        state: CheckState::Pending,
        ..Default::default()
    };
    let asking = CheckContext {
        workload: wl,
        entry: &entry,
        parameters: &active.parameters,
        client: &ctx.client,
        now: Timestamp::now(),
        shadow: None,
    };
    let started = ctx.controller.start_early(&asking).await;
    // Whatever part of the work exists is released as a decision's would be.
    ctx.memory.pair(&key, |p| {
        p.asked = Some(at);
        if started.is_ok() {
            p.early = Some(EarlyStart {
                at,
                since: now,
                abandoned: false,
            });
        }
    });
    match started {
        Ok(()) => {
            ctx.metrics.early_start(check);
            debug!(workload = %wl.name_any(), check, "started before Kueue added the entry");
            Ok(Some(wait))
        }
        // Nothing to show it on before the entry exists: `decide` meets the same failure then,
        // and says it on the entry.
        Err(e) => match ctx.controller.classify_error(&e) {
            ErrorClass::Transient => Err(Error::Check(Box::new(e))),
            ErrorClass::Permanent { message } => {
                ctx.metrics.error("check");
                warn!(workload = %wl.name_any(), namespace = %wl.namespace().unwrap_or_default(), check, %message, "starting before the entry failed; the check decides once the entry comes");
                Ok(None)
            }
        },
    }
}

/// Releases what the checks hold for a Workload that was deleted (the reconciler never sees
/// it again) and forgets it. Retried a few times; a check must still tolerate a missed release
/// (e.g. one that happened while no replica was running) by reconciling what it holds.
pub(crate) async fn release_deleted<C: AdmissionCheckController>(ctx: &Context<C>, wl: &Workload) {
    let Some(uid) = wl.uid() else { return };
    // In shadow mode what a check took is known from its would-be answers.
    let checks: Vec<String> = ctx
        .memory
        .of(&uid)
        .checks
        .into_iter()
        .filter(|(_, p)| p.asked.is_some() || p.shadowed.is_some())
        .map(|(check, _)| check)
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
    }
    // Everything kept about the Workload goes, also for pairs released earlier (a carried
    // Retry or a permanent failure of a Workload evicted, then deleted while queued).
    ctx.memory.forget(&uid);
    ctx.own_writes.forget(&uid);
}

/// Calls `release` for every check this process asked about the Workload that it no longer
/// needs. Idempotent: a pair is forgotten only once its release succeeded.
async fn release_idle<C: AdmissionCheckController>(
    ctx: &Context<C>,
    wl: &Workload,
    seen: &BTreeMap<String, Eligibility>,
) -> Result<(), Error> {
    let Some(uid) = wl.uid() else { return Ok(()) };
    for (check, stands) in seen {
        let key = (uid.clone(), check.clone());
        let Some(asked_at) = ctx.memory.pair(&key, |p| p.asked) else {
            continue;
        };
        let reason = match *stands {
            Eligibility::Idle(reason) => reason,
            // Started early, then evicted and given quota again before the entry came.
            Eligibility::Early if AskedAt::expected(wl, check) != asked_at => {
                ReleaseReason::Evicted
            }
            // Evicted and given quota again between two reconciles: the eviction was not seen,
            // but the attempt or Kueue's eviction count moved on.
            _ if AskedAt::of(wl, check).is_some_and(|now| now != asked_at) => {
                ReleaseReason::Evicted
            }
            _ => continue,
        };
        release(ctx, wl, check, reason).await?;
        let over = matches!(
            reason,
            ReleaseReason::Deleted
                | ReleaseReason::Finished
                | ReleaseReason::Deactivated
                | ReleaseReason::CheckRemoved
        );
        ctx.memory.pair(&key, |p| {
            p.asked = None;
            // A permanent failure, a refused record and a hold for a check that cannot answer
            // belong to the attempt that saw them; a late Retry waits for the next attempt,
            // unless there is none.
            p.permanent = None;
            p.record_refused = None;
            p.unanswerable = None;
            p.early = None;
            if over {
                p.late = None;
            }
        });
    }
    Ok(())
}

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
async fn decide_one<C: AdmissionCheckController>(
    ctx: &Context<C>,
    cached: &Workload,
    check: &str,
    active: &ActiveCheck<C::Parameters>,
    mut stands: Eligibility,
) -> Result<Option<Duration>, Error> {
    let namespace = cached
        .namespace()
        .ok_or_else(|| Error::MalformedWorkload("no namespace".into()))?;
    let uid = cached
        .uid()
        .ok_or_else(|| Error::MalformedWorkload("no uid".into()))?;
    // Our last write for this check is not in the cache yet: the Workload we have is older than
    // it, and asking the check on it would answer the same attempt twice.
    if let Some(wait) = ctx.own_writes.wait_for(
        &uid,
        check,
        cached.resource_version().as_deref(),
        tokio::time::Instant::now(),
    ) {
        debug!(workload = %cached.name_any(), check, "own write not in the cache yet");
        return Ok(Some(wait));
    }
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
        let revalidate_after = ctx
            .controller
            .revalidate()
            .period()
            .filter(|_| decided.revalidating);
        let mut write = match plan_write(&wl, &pair, &decided).await? {
            Planned::Write(write) => write,
            Planned::Skip(recheck_after) => return Ok(recheck_after.or(revalidate_after)),
            Planned::Invalid(why) => {
                kept = Some(held_for_invalid(&wl, &pair, decided, &why).await);
                continue;
            }
        };
        if decided.uncounted {
            write.record = None;
        }
        let pp = PatchParams::apply(&field_manager_for(&ctx.field_manager, check)).force();
        let failure = match apply(&pair.api, &wl, check, &write, &pp).await {
            Ok(written_rv) => {
                landed(&wl, &pair, &decided, &write, written_rv).await;
                return Ok(write.recheck_after.or(revalidate_after));
            }
            Err(failure) => failure,
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
    if !decided.decision.message().starts_with(PERMANENT_MARK) {
        // The check's own answer landed: a permanent failure shown before is over.
        ctx.memory.pair(&pair.key, |p| p.permanent = None);
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
    let input = PlanInput {
        workload: wl,
        check,
        decision: decided.decision.clone(),
        attempt: decided.at.map_or(1, |a| a.attempt),
        policy: &pair.active.policy,
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
            // Deleted between the read and the write: nothing is left to answer, and it is not
            // an error to count or back off from. A read confirms it, so that a 404 for another
            // reason (a missing status subresource) is still reported.
            if pair.api.get_opt(&wl.name_any()).await?.is_none() {
                debug!(workload = %wl.name_any(), check, "deleted before the answer was written");
                return Ok(Next::Done);
            }
            Err(kube::Error::Api(status).into())
        }
        WriteFailure::Status(kube::Error::Api(status))
            if !decided.decision.message().starts_with(PERMANENT_MARK)
                && permanent_refusal(&status).is_some() =>
        {
            // (An `if let` guard would bind the message once, but the MSRV, 1.89, lacks it.)
            let refused = permanent_refusal(&status).unwrap_or_default();
            // The API server will never take this answer (e.g. a podSetUpdate it or a webhook
            // finds invalid): say so on the entry instead, and keep the quota only for a while.
            let message = format!(
                "the {} answer of check {check} cannot be written: {refused}",
                write.entry.state,
            );
            warn!(workload = %wl.name_any(), namespace = %wl.namespace().unwrap_or_default(), check, %message, "status write refused");
            let decision = permanent_decision(wl, pair, message, decided.now).await;
            let kept = Decided {
                decision,
                ..decided
            };
            Ok(Next::Again {
                fresh: None,
                kept: Some(kept),
            })
        }
        WriteFailure::Record(kube::Error::Api(status)) if refused_for_good(status.code) => {
            Ok(record_refused(wl, pair, decided, write, &status).await)
        }
        WriteFailure::Record(e) => {
            // A failure that may pass (an outage, a timeout, 5xx, 429): without the record no
            // Retry may be written (it would land uncounted), so it is tried again with backoff
            // and said where the operator looks.
            let note = format!("check {check}: counting the Retry on the Workload failed: {e}");
            ctx.event(
                wl,
                EventType::Warning,
                "CheckWriteFailed",
                redact_workload_note(wl, &note),
            )
            .await;
            Err(e.into())
        }
        WriteFailure::Status(e) => Err(e.into()),
    }
}

/// Codes with which the API server refuses a write for good (the request itself, RBAC or a
/// policy): 400, 403, 405, 413, 415, 422.
fn refused_for_good(code: u16) -> bool {
    matches!(code, 400 | 403 | 405 | 413 | 415 | 422)
}

/// The API server refuses the attempt record of `write` for good (a 403 for a missing `patch`
/// on workloads, a policy's 400 or 403, a 422 for annotations over their limit). A `Retry`
/// must not reach Kueue uncounted while the operator may still fix it, but neither may the
/// quota be held until someone does: the entry says so (`Pending`, the permanent-failure
/// mark) for [`super::RuntimeConfig::permanent_failure_hold`], counted from the first refusal
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
    let now = Timestamp::now();
    let evictions = wl.total_evictions();
    let (hold, first) = ctx.memory.pair(&pair.key, |p| {
        let first = p.record_refused.is_none_or(|h| h.evictions != evictions);
        (
            Hold::of_attempt(&mut p.record_refused, evictions, now),
            first,
        )
    });
    if first {
        ctx.metrics.attempt_record_refused(check);
        warn!(workload = %wl.name_any(), namespace = ?wl.namespace(), check, %why, "attempt record refused");
    }
    let (left, until) = hold.left(ctx.permanent_failure_hold, now);
    let held = left.filter(|_| write.entry.state == CheckState::Retry);
    let until = until.strftime("%Y-%m-%dT%H:%M:%SZ");
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
    let Some(left) = held else {
        return Next::Again {
            fresh: None,
            kept: Some(Decided {
                uncounted: true,
                ..decided
            }),
        };
    };
    let decision = Decision::pending_recheck_after(
        format!(
            "{PERMANENT_MARK}check {check} answered Retry ({:?}), but it cannot be counted on \
             the Workload: {why}. The workload keeps its quota until {until}; then the Retry is \
             written without the count (Kueue's retryCount still counts it).",
            crate::check::truncate_chars(decided.decision.message(), 200)
        ),
        left,
    );
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

/// Marks the messages of permanent failures, so a refused write of one is not turned into
/// another.
const PERMANENT_MARK: &str = "Permanent failure: ";

/// Asks the check (or takes a carried-over late `Retry`); `None` when nothing is to be written.
async fn ask<C: AdmissionCheckController>(
    wl: &Workload,
    pair: &Pair<'_, C>,
    revalidating: bool,
    at: Option<AskedAt>,
) -> Result<Option<Decided>, Error> {
    let ctx = pair.ctx;
    let (check, key) = (pair.check, &pair.key);
    let now = Timestamp::now();
    // A Retry refused because Kueue evicted the Workload while the check decided is honoured
    // now, for what is left of its delay, instead of asking the check again.
    let late = ctx.memory.pair(key, |p| p.late.clone());
    if let Some(late) = late {
        match late.decision(now).filter(|_| !revalidating) {
            Some(decision) => {
                // Counted as this attempt's Retry: usually the refused one was never counted
                // (its attempt record was refused too); if it was, counting it again costs a
                // retry but keeps the stored attempt from ever going back.
                return Ok(Some(Decided {
                    decision,
                    at,
                    carried: true,
                    inputs: Inputs::of(wl),
                    revalidating,
                    now,
                    uncounted: false,
                }));
            }
            None => ctx.memory.pair(key, |p| p.late = None),
        }
    }
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
    let decision = match ctx.controller.decide(&check_ctx).await {
        // A permanent failure shown on the entry ends once a real answer is written (see
        // `landed`), not here: an answer that cannot be written is one more failure.
        Ok(d) => d,
        Err(e) => match ctx.controller.classify_error(&e) {
            ErrorClass::Transient => {
                return Err(ctx.check_failed(wl, format!("check {check}: {e}"), e).await);
            }
            ErrorClass::Permanent { message } => {
                if revalidating {
                    // An admitted answer is not taken back for an error; it is tried again.
                    let note = format!("check {check} (revalidating): {message}");
                    return Err(ctx.check_failed(wl, note, e).await);
                }
                permanent_decision(wl, pair, message, now).await
            }
        },
    };
    Ok(Some(Decided {
        decision,
        at,
        carried: false,
        inputs: Inputs::of(wl),
        revalidating,
        now,
        uncounted: false,
    }))
}

/// What the API server said when it refused a write for good (a webhook denial, an invalid
/// field), or `None` when the refusal may pass.
fn permanent_refusal(status: &kube::core::Status) -> Option<String> {
    match ErrorClass::of_status(status.code, &status.reason, &status.message) {
        ErrorClass::Permanent { message } => Some(message),
        ErrorClass::Transient => None,
    }
}

/// What to write for a permanent failure: `Pending` with the reason while the Workload may keep
/// its quota ([`super::RuntimeConfig::permanent_failure_hold`], from the first failure of this
/// attempt), then `Retry` without delay, which gives the quota back (Kueue keeps quota for the
/// whole delay of a delayed `Retry`, so a delay would only hold it longer); past the retry
/// limit that `Retry` becomes `Rejected`. Any change of the Workload (the user's fix) asks the
/// check again meanwhile.
async fn permanent_decision<C: AdmissionCheckController>(
    wl: &Workload,
    pair: &Pair<'_, C>,
    message: String,
    now: Timestamp,
) -> Decision {
    let ctx = pair.ctx;
    let (check, key) = (pair.check, &pair.key);
    let evictions = wl.total_evictions();
    let (since, first) = ctx.memory.pair(key, |p| {
        // Another attempt (eviction count) starts another hold.
        let failure = match &mut p.permanent {
            Some(failure) if failure.evictions == evictions => failure,
            stale => stale.insert(PermanentFailure {
                since: now,
                evictions,
                message: String::new(),
            }),
        };
        let first = failure.message != message;
        failure.message.clone_from(&message);
        (failure.since, first)
    });
    let message = crate::check::truncate_chars(&message, MAX_PERMANENT_MESSAGE);
    if first {
        ctx.metrics.permanent_failure(check);
        warn!(workload = %wl.name_any(), namespace = ?wl.namespace(), check, %message, "permanent failure");
    }
    // Every time it is seen again (the Workload changed, the check was asked again): repeats
    // count into the first event's series, so `kubectl describe` shows it is still failing.
    let note = format!("check {check}: {message}");
    ctx.event(wl, EventType::Warning, "CheckFailedPermanently", note)
        .await;
    let hold = ctx.permanent_failure_hold;
    let held = Duration::try_from(now.duration_since(since)).unwrap_or_default();
    match hold.checked_sub(held).filter(|left| !left.is_zero()) {
        Some(left) => {
            let until = SignedDuration::try_from(hold)
                .ok()
                .and_then(|h| since.checked_add(h).ok())
                .unwrap_or(now);
            Decision::pending_recheck_after(
                format!(
                    "{PERMANENT_MARK}{message}. Retrying will not fix this; once it is fixed \
                     the check answers again. The workload keeps its quota until {} and then \
                     gives it back (Retry).",
                    until.strftime("%Y-%m-%dT%H:%M:%SZ")
                ),
                left,
            )
        }
        None => Decision::retry_after(
            format!(
                "{PERMANENT_MARK}{message}. Not fixed within {}: the quota is given back; the \
                 next attempt asks the check again",
                crate::retry::human(hold)
            ),
            Duration::ZERO,
        ),
    }
}

/// How much of a permanent failure's reason goes on the entry (and into the Event).
const MAX_PERMANENT_MESSAGE: usize = 600;

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

/// Backoff for a Workload whose reconciles keep failing: 1 s, 2 s, 4 s ... up to 5 min, with
/// 20 % jitter so that many Workloads failing together (an API outage) do not retry in step.
fn error_backoff() -> RetryPolicy {
    RetryPolicy::runtime_backoff(Duration::from_secs(300))
}

pub(crate) fn error_policy<C: AdmissionCheckController>(
    wl: Arc<Workload>,
    err: &Error,
    ctx: Arc<Context<C>>,
) -> Action {
    ctx.metrics.error(err.label());
    let uid = wl.uid().unwrap_or_default();
    // One more failure in a row; its backoff is also when a reconcile of the same version may
    // ask again (see `reconcile`).
    let (failures, delay) = ctx.memory.workload(&uid, |w| {
        w.failures = w.failures.saturating_add(1);
        let delay = error_backoff().delay(w.failures, rand::random::<f64>());
        if let Some((_, until)) = &mut w.backing_off {
            *until = tokio::time::Instant::now() + delay;
        }
        (w.failures, delay)
    });
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
#[path = "reconcile_scripted_api.rs"]
mod scripted_api;

#[cfg(test)]
#[path = "reconcile_early_scripted_api.rs"]
mod early_scripted_api;

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

//! One Workload: for each (Workload, check) pair, observe, take the step
//! [`crate::lifecycle::next`] gives, and carry it out (ask the check and apply what the
//! decision layer allows, start early, release, hold).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use tracing::{Instrument, debug, info, info_span, warn};

use super::answer::decide_one;
use super::check_registry::ActiveCheck;
use super::context::{Context, release};
use super::memory::{PairKey, lock};
use super::unanswerable;
use crate::api::{CheckState, Workload};
use crate::check::{AdmissionCheckController, CheckContext, ErrorClass};
use crate::cluster_queues::QueueRule;
use crate::error::Error;
use crate::lifecycle::{self, Answering, AskedAt, EarlyStart, Observed, Step, sooner};
use crate::release::{ReleaseContext, ReleaseReason};
use crate::retry::RetryPolicy;

pub(crate) async fn reconcile<C: AdmissionCheckController>(
    wl: Arc<Workload>,
    ctx: Arc<Context<C>>,
) -> Result<Action, Error> {
    let namespace = wl.namespace().unwrap_or_default();
    let now = tokio::time::Instant::now();
    let begun = ctx
        .line
        .begin(&namespace, &wl.name_any(), ctx.line_class(&wl), now);
    let Some(_turn) = begun.turn else {
        // In line: when its turn comes, the Workload is sent to kube again and that reconcile
        // takes the turn. Nothing waits in kube meanwhile.
        return Ok(Action::await_change());
    };
    // Whatever this reconcile finds, it reads the changes that waited for it.
    if let Some((waited, waiting)) = begun.waited {
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
    let Some(uid) = wl.uid() else {
        return Err(Error::MalformedWorkload("no uid".into()));
    };
    let mut requeue: Option<Duration> = None;
    for (check, answering, active) in pairs(ctx) {
        let after = reconcile_pair(ctx, wl, &uid, &check, answering, active.as_deref()).await?;
        requeue = sooner(requeue, after);
    }
    ctx.memory.workload(&uid, |w| w.failures = 0);
    Ok(requeue.map_or_else(Action::await_change, Action::requeue))
}

/// One (Workload, check) pair: observes it, takes the step [`lifecycle::next`] gives, and
/// carries it out; returns when to look again.
pub(super) async fn reconcile_pair<C: AdmissionCheckController>(
    ctx: &Context<C>,
    wl: &Workload,
    uid: &str,
    check: &str,
    answering: Answering,
    active: Option<&ActiveCheck<C::Parameters>>,
) -> Result<Option<Duration>, Error> {
    let observed = observe(ctx, wl, uid, check, answering);
    let next = lifecycle::next(&observed);
    debug!(
        workload = %wl.name_any(),
        resource_version = wl.resource_version().unwrap_or_default(),
        check,
        ?next,
        "reconciling"
    );
    let key: PairKey = (uid.to_string(), check.to_string());
    if let Some(at) = next.remember {
        ctx.memory.pair(&key, |p| p.asked = Some(at));
    }
    if next.forget_early {
        ctx.memory.pair(&key, |p| p.early = None);
    }
    if let Some(reason) = next.release {
        release_pair(ctx, wl, &key, reason).await?;
    }
    execute(ctx, wl, &key, active, next.step).await
}

/// A check's name, whether the controller can answer it, and its resolved parameters when it
/// can.
type PairOf<P> = (String, Answering, Option<Arc<ActiveCheck<P>>>);

/// Every check of ours that may concern the Workload, whether the controller can answer it,
/// and its resolved parameters when it can. Checks gone from the registry are included: a
/// check deleted or renamed while Workloads held something for it still gets its releases.
fn pairs<C: AdmissionCheckController>(ctx: &Context<C>) -> Vec<PairOf<C::Parameters>> {
    let registry = ctx.registry.read().unwrap_or_else(|p| p.into_inner());
    let mut known = lock(&ctx.known_checks);
    known.extend(registry.keys().cloned());
    known
        .iter()
        .map(|name| match registry.get(name) {
            Some(Ok(active)) => (name.clone(), Answering::Yes, Some(active.clone())),
            Some(Err(inactive)) => {
                let why = unanswerable::inactive(name, inactive);
                (name.clone(), Answering::No(why), None)
            }
            None => (name.clone(), Answering::Gone, None),
        })
        .collect()
}

/// What the step function looks at for one pair, from the Workload, the registry, this
/// process's memory and the clock.
fn observe<'a, C: AdmissionCheckController>(
    ctx: &Context<C>,
    wl: &'a Workload,
    uid: &str,
    check: &'a str,
    answering: Answering,
) -> Observed<'a> {
    let key: PairKey = (uid.to_string(), check.to_string());
    let (asked, early) = ctx.memory.pair(&key, |p| (p.asked, p.early));
    let starts_early = ctx.controller.starts_early();
    // The queue is looked up only for a check without its entry.
    let queue_rule = match starts_early && wl.admission_check(check).is_none() {
        true => ctx.cluster_queues.rule_for(wl, check),
        false => QueueRule::DoesNotApply,
    };
    let own_write_pending = ctx.own_writes.wait_for(
        uid,
        check,
        wl.resource_version().as_deref(),
        tokio::time::Instant::now(),
    );
    Observed {
        workload: wl,
        check,
        answering,
        revalidate: ctx.revalidates(),
        starts_early,
        queue_rule,
        asked,
        early,
        own_write_pending,
        early_start_wait: ctx.early_start_wait,
        now: Timestamp::now(),
    }
}

/// Carries out one step; returns when to look again.
async fn execute<C: AdmissionCheckController>(
    ctx: &Context<C>,
    wl: &Workload,
    key: &PairKey,
    active: Option<&ActiveCheck<C::Parameters>>,
    step: Step,
) -> Result<Option<Duration>, Error> {
    let check = key.1.as_str();
    // One span per pair and step: every log line inside names the Workload and check.
    let span = info_span!(
        "pair",
        workload = %wl.name_any(),
        namespace = %wl.namespace().unwrap_or_default(),
        check = %check,
    );
    match (step, active) {
        (Step::Idle | Step::KueueActs(_), _) => Ok(None),
        (Step::AwaitOwnWrite(wait), _) => {
            debug!(workload = %wl.name_any(), check, "own write not in the cache yet");
            Ok(Some(wait))
        }
        (Step::AwaitEntry(left), _) => Ok(Some(left)),
        (Step::Ask { revalidating }, Some(active)) => {
            decide_one(ctx, wl, check, active, revalidating)
                .instrument(span)
                .await
        }
        (Step::StartEarly, Some(active)) => {
            start_early(ctx, wl, key, active).instrument(span).await
        }
        (Step::AbandonEarly, _) => abandon_early(ctx, wl, key).await.map(|()| None),
        (Step::HoldUnanswered(why), _) => {
            unanswerable::hold_or_release(ctx, wl, check, &why)
                .instrument(span)
                .await
        }
        // The registry changed while the pair was looked at: the next reconcile sees it.
        (Step::Ask { .. } | Step::StartEarly, None) => Ok(Some(Duration::from_secs(1))),
    }
}

/// Starts `check`'s work for a Workload whose entry Kueue has yet to add (see
/// [`AdmissionCheckController::start_early`]); returns when to look again (the end of the
/// wait for the entry).
async fn start_early<C: AdmissionCheckController>(
    ctx: &Context<C>,
    wl: &Workload,
    key: &PairKey,
    active: &ActiveCheck<C::Parameters>,
) -> Result<Option<Duration>, Error> {
    let check = key.1.as_str();
    let at = AskedAt::expected(wl, check);
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
    // Nothing to show a failure on before the entry exists: `decide` meets it again then, and
    // says it on the entry. A transient one is tried again; one for good is not.
    let for_good = match ctx.controller.start_early(&asking).await {
        Ok(()) => {
            ctx.metrics.early_start(check);
            debug!(workload = %wl.name_any(), check, "started before Kueue added the entry");
            None
        }
        Err(e) => match ctx.controller.classify_error(&e) {
            ErrorClass::Transient => {
                ctx.memory.pair(key, |p| p.asked = Some(at));
                return Err(Error::Check(Box::new(e)));
            }
            ErrorClass::Permanent { message } | ErrorClass::NotPermitted { message } => {
                Some(message)
            }
        },
    };
    if let Some(message) = for_good {
        ctx.metrics.error("check");
        warn!(workload = %wl.name_any(), namespace = %wl.namespace().unwrap_or_default(), check, %message, "starting before the entry failed for good; not tried again in this attempt, the check decides once the entry comes");
    }
    // Whatever part of the work exists is released as a decision's would be. Started (or
    // refused for good) once per attempt: the wait for the entry then bounds what was left,
    // counted from the reservation.
    ctx.memory.pair(key, |p| {
        p.asked = Some(at);
        p.early = Some(EarlyStart {
            at,
            abandoned: false,
        });
    });
    let left = lifecycle::entry_wait_left(wl, ctx.early_start_wait, Timestamp::now());
    Ok(Some(left.unwrap_or(Duration::ZERO)))
}

/// The entry did not come within the wait after the quota reservation: releases what was
/// started for it (by this process or an earlier one) once, and says so.
async fn abandon_early<C: AdmissionCheckController>(
    ctx: &Context<C>,
    wl: &Workload,
    key: &PairKey,
) -> Result<(), Error> {
    let check = key.1.as_str();
    release(ctx, wl, check, ReleaseReason::EntryNotAdded).await?;
    ctx.metrics.early_start_abandoned(check);
    let note = format!(
        "check {check}: Kueue did not add the check's entry within {}s of the quota \
         reservation; what the check started for the Workload was released, and starts again \
         when the entry comes",
        ctx.early_start_wait.as_secs()
    );
    ctx.event(wl, EventType::Warning, "EarlyStartAbandoned", note)
        .await;
    let at = AskedAt::expected(wl, check);
    ctx.memory.pair(key, |p| {
        p.asked = None;
        p.early = Some(EarlyStart {
            at,
            abandoned: true,
        });
    });
    Ok(())
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

/// Calls `release` for a pair the Workload no longer needs (or needs for another attempt), and
/// forgets what was asked once it succeeded.
async fn release_pair<C: AdmissionCheckController>(
    ctx: &Context<C>,
    wl: &Workload,
    key: &PairKey,
    reason: ReleaseReason,
) -> Result<(), Error> {
    release(ctx, wl, &key.1, reason).await?;
    let over = matches!(
        reason,
        ReleaseReason::Deleted
            | ReleaseReason::Finished
            | ReleaseReason::Deactivated
            | ReleaseReason::CheckRemoved
    );
    ctx.memory.pair(key, |p| {
        p.asked = None;
        p.early = None;
        // A late Retry waits for the next attempt, unless there is none.
        if over {
            p.late = None;
        }
    });
    Ok(())
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

#[cfg(test)]
#[path = "reconcile_scripted_api.rs"]
mod scripted_api;

#[cfg(test)]
#[path = "reconcile_early_scripted_api.rs"]
mod early_scripted_api;

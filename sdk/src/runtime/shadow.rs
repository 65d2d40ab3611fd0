//! Shadow mode, the I/O part: ask each check about a Workload in scope, publish what it would
//! have answered (an Event, a count, a log line), release what it took once the Workload no
//! longer holds quota in scope. No answer is written on the Workload; only one that holds
//! quota for a check of ours its ClusterQueue lists (and that therefore waits for an answer
//! never written) is held, then given back (`super::unanswerable`). The rules are in
//! [`crate::shadow`].

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::events::EventType;
use tracing::info;

use super::check_registry::ActiveCheck;
use super::context::{Context, release};
use super::memory::{PairKey, lock};
use super::unanswerable;
use crate::api::{AdmissionCheckState, CheckState, Workload};
use crate::check::{AdmissionCheckController, CheckContext, Decision, ErrorClass};
use crate::error::Error;
use crate::lifecycle::sooner;
use crate::release::ReleaseReason;
use crate::shadow::{
    ShadowEligibility, ShadowRecord, ShadowScope, ShadowStep, is_news, shadow_eligibility,
    shadow_step,
};

/// The Event reason of a would-be answer.
pub(crate) const WOULD_ANSWER: &str = "WouldAnswer";

/// Reconciles one Workload in shadow mode; returns when to look again (a `Pending` that asked
/// to be rechecked).
pub(super) async fn reconcile_shadowed<C: AdmissionCheckController>(
    ctx: &Context<C>,
    wl: &Workload,
    scope: &ShadowScope,
) -> Result<Option<Duration>, Error> {
    let Some(uid) = wl.uid() else {
        return Err(Error::MalformedWorkload("no uid".into()));
    };
    let (active, cannot_answer) = {
        let registry = ctx.registry.read().unwrap_or_else(|p| p.into_inner());
        let active: Vec<_> = registry
            .iter()
            .filter_map(|(name, state)| state.as_ref().ok().map(|a| (name.clone(), a.clone())))
            .collect();
        // A ClusterQueue that lists a check of ours, which writes no answers in shadow mode:
        // Workloads already holding quota with its entry would wait for ever.
        let cannot_answer: Vec<(String, String)> = registry
            .iter()
            .filter(|(name, _)| wl.admission_check(name).is_some())
            .map(|(name, state)| {
                let why = match state {
                    Ok(_) => unanswerable::shadowed(name),
                    Err(inactive) => unanswerable::inactive(name, inactive),
                };
                (name.clone(), why)
            })
            .collect();
        (active, cannot_answer)
    };
    let mut requeue: Option<Duration> = None;
    for (check, why) in cannot_answer {
        let next = unanswerable::hold_or_release(ctx, wl, &check, &why).await?;
        requeue = sooner(requeue, next);
    }
    let eligibility = shadow_eligibility(wl, scope);
    release_unneeded(ctx, wl, &uid, &active, &eligibility).await?;
    let ShadowEligibility::Decide { reservation } = eligibility else {
        return Ok(requeue);
    };
    for (check, active) in active {
        let key: PairKey = (uid.clone(), check);
        let after = decide_in_shadow(ctx, wl, scope, &key, &active, &reservation).await?;
        requeue = sooner(requeue, after);
    }
    Ok(requeue)
}

/// Releases what checks took for this Workload and no longer need: it left the scope, or the
/// check is no longer one of ours (deleted, renamed, inactive). Looked up by check name (a
/// handful), not by scanning every Workload's records: this runs on every reconcile.
async fn release_unneeded<C: AdmissionCheckController>(
    ctx: &Context<C>,
    wl: &Workload,
    uid: &str,
    active: &[(String, Arc<ActiveCheck<C::Parameters>>)],
    eligibility: &ShadowEligibility,
) -> Result<(), Error> {
    let known: Vec<String> = {
        let mut known = lock(&ctx.known_checks);
        known.extend(active.iter().map(|(name, _)| name.clone()));
        known.iter().cloned().collect()
    };
    let kept = ctx.memory.of(uid);
    let recorded: Vec<PairKey> = known
        .into_iter()
        .filter(|check| kept.checks.get(check).is_some_and(|p| p.shadowed.is_some()))
        .map(|check| (uid.to_string(), check))
        .collect();
    for key in &recorded {
        let reason = match eligibility {
            ShadowEligibility::Idle(reason) => *reason,
            ShadowEligibility::Decide { .. } if !active.iter().any(|(n, _)| *n == key.1) => {
                ReleaseReason::CheckRemoved
            }
            ShadowEligibility::Decide { .. } => continue,
        };
        release(ctx, wl, &key.1, reason).await?;
        ctx.memory.pair(key, |p| p.shadowed = None);
    }
    Ok(())
}

/// Asks one check, in shadow mode, about a Workload holding quota (`reservation`), unless it
/// already answered for this reservation, and publishes the answer if it is news. Returns when
/// to ask again (a `Pending` that asked to be rechecked).
async fn decide_in_shadow<C: AdmissionCheckController>(
    ctx: &Context<C>,
    wl: &Workload,
    scope: &ShadowScope,
    key: &PairKey,
    active: &ActiveCheck<C::Parameters>,
    reservation: &str,
) -> Result<Option<Duration>, Error> {
    let check = &key.1;
    let last = ctx.memory.pair(key, |p| p.shadowed.clone());
    match shadow_step(last.as_ref(), reservation) {
        ShadowStep::Done => return Ok(None),
        ShadowStep::ReleaseThenAsk => {
            // Evicted and given quota again between two looks.
            release(ctx, wl, check, ReleaseReason::Evicted).await?;
            ctx.memory.pair(key, |p| p.shadowed = None);
        }
        ShadowStep::Ask => {}
    }
    let last = ctx.memory.pair(key, |p| p.shadowed.clone());
    let decision = would_answer(ctx, wl, scope, check, active).await?;
    let recheck_after = match &decision {
        Decision::Pending { recheck_after, .. } => *recheck_after,
        _ => None,
    };
    let answer = ShadowRecord {
        reservation: reservation.to_string(),
        state: decision.state(),
        message: decision.message().to_string(),
    };
    if is_news(last.as_ref(), &answer) {
        publish(ctx, wl, check, &answer).await;
    }
    ctx.memory.pair(key, |p| p.shadowed = Some(answer));
    Ok(recheck_after)
}

/// What `check` would answer for `wl`: asked with the entry it would see (`Pending`, as Kueue
/// writes it when quota is reserved); a permanent failure is what enforcing would show on the
/// entry (held, then retried).
async fn would_answer<C: AdmissionCheckController>(
    ctx: &Context<C>,
    wl: &Workload,
    scope: &ShadowScope,
    check: &str,
    active: &ActiveCheck<C::Parameters>,
) -> Result<Decision, Error> {
    let now = Timestamp::now();
    let entry = AdmissionCheckState {
        name: check.to_string(),
        state: CheckState::Pending,
        last_transition_time: Some(Time(now)),
        message: String::new(),
        requeue_after_seconds: None,
        retry_count: None,
        pod_set_updates: Vec::new(),
    };
    let check_ctx = CheckContext {
        workload: wl,
        entry: &entry,
        parameters: &active.parameters,
        client: &ctx.client,
        now,
        shadow: Some(scope),
    };
    match ctx.controller.decide(&check_ctx).await {
        Ok(decision) => Ok(decision),
        Err(e) => match ctx.controller.classify_error(&e) {
            ErrorClass::Transient => {
                let note = format!("check {check} (shadow mode): {e}");
                Err(ctx.check_failed(wl, note, e).await)
            }
            ErrorClass::Permanent { message } | ErrorClass::NotPermitted { message } => Ok(
                Decision::pending(format!("{}{message}", crate::lifecycle::PERMANENT_MARK)),
            ),
        },
    }
}

/// Publishes a would-be answer: counted, logged, and an Event on the Workload.
async fn publish<C: AdmissionCheckController>(
    ctx: &Context<C>,
    wl: &Workload,
    check: &str,
    answer: &ShadowRecord,
) {
    ctx.metrics.shadow_decision(check, answer.state);
    info!(
        workload = %wl.name_any(),
        namespace = %wl.namespace().unwrap_or_default(),
        check,
        would_answer = %answer.state,
        message = %answer.message,
        "shadow mode: not written"
    );
    let note = format!(
        "shadow mode: check {check} would have answered {}: {} (not written)",
        answer.state, answer.message
    );
    ctx.event(wl, EventType::Normal, WOULD_ANSWER, note).await;
}

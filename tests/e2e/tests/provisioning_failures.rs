//! Failures retrying cannot fix, and absurd retry settings, against the real Kueue with the
//! autoscaler simulator playing cluster-autoscaler.
//!
//! - A Job's `provreq.kueue.x-k8s.io/<key>` annotation longer than a ProvisioningRequest takes:
//!   the entry says so within seconds (annotation, limit, the fix on the Workload), an Event
//!   and a counter record it, the Workload keeps its quota only for the hold, then `Retry`
//!   gives it back, and past the config's `backoffLimitCount` it is `Rejected`. A fix made on
//!   the Workload during the hold, or after a `Retry`, is picked up.
//! - A config with `backoffBaseSeconds: 2147483647, backoffMaxSeconds: 0`: the check stays
//!   `Active` and says its delays are clamped; a failed request is retried after the ceiling,
//!   with an Event and a counter.
//! - The API server's own limit on `spec.parameters` values, which the controller checks
//!   before creating anything, and what its refusal is turned into.
//!
//! The controller runs with a hold of 5 s and a ceiling of 20 s so that each test takes well
//! under a minute.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, ensure};
use autoscaler_simulator::SCRIPT_ANNOTATION;
use e2e::provisioning::{History, World, retry_strategy};
use e2e::{SuspendedJob, TestEnv, dump, wait_for};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::core::Status;
use kueue_admission_sdk::api::{
    AdmissionCheck, AdmissionCheckState, CheckState, ProvisioningRequest, Workload,
    workload_condition as cond,
};
use kueue_provisioning_controller::plan::{
    PARAMETER_ANNOTATION_PREFIX, ParameterSource, PlanError,
};
use kueue_provisioning_controller::refusal::{self, Subject};
use serde_json::{Value, json};

/// How long the controller under test lets a Workload keep its quota after a permanent failure.
const HOLD: Duration = Duration::from_secs(5);
/// The controller's ceiling on retry delays.
const CEILING: Duration = Duration::from_secs(20);
/// The request parameter the tests override from the Job.
const KEY: &str = "ValidUntilSeconds";
/// Longer than the 255 characters a ProvisioningRequest takes.
const TOO_LONG: usize = 300;
/// The counter of permanent failures.
const PERMANENT_FAILURES: &str = "kueue_ac_permanent_failures_total";
/// The counter of retry delays clamped to the ceiling.
const CLAMPED: &str = "kueue_ac_retry_delays_clamped_total";

fn parameter_annotation() -> String {
    format!("{PARAMETER_ANNOTATION_PREFIX}{KEY}")
}

/// The value of the too long annotation: digits, so that a leak into a message is easy to see.
fn too_long_value() -> String {
    "9".repeat(TOO_LONG)
}

/// One test's world: the controller keeps a Workload's quota [`HOLD`] after a permanent failure
/// and waits at most [`CEILING`] between attempts.
async fn setup(test: &str, spec: Value) -> Result<World> {
    World::tuned(test, spec, |c| {
        c.permanent_failure_hold = HOLD;
        c.max_retry_delay = CEILING;
    })
    .await
}

/// What the controller says about the too long annotation on `workload` (see
/// [`refusal::for_plan`]).
fn too_long_reason(t: &World, workload: &str) -> String {
    let subject = Subject {
        namespace: &t.env.ns,
        workload,
        config: &t.p.config,
    };
    let error = PlanError::ParameterTooLong {
        key: KEY.into(),
        len: TOO_LONG,
        from: ParameterSource::WorkloadAnnotation,
    };
    refusal::for_plan(&error, &subject).unwrap_or_default()
}

/// Submits Job `name` with the parameter annotation set to `value`, its requests answered
/// with `script`; returns the Job and its Workload's name.
async fn job_with_parameter(
    t: &World,
    name: &str,
    value: &str,
    script: &str,
) -> Result<(Job, String)> {
    let parameter = parameter_annotation();
    let job = t
        .env
        .create_job(&SuspendedJob {
            annotations: &[(parameter.as_str(), value)],
            pod_annotations: &[(SCRIPT_ANNOTATION, script)],
            ..SuspendedJob::new(name, "lq", "1")
        })
        .await
        .context("creating the Job")?;
    let wl = t.env.workload_for_job(&job).await?.name_any();
    Ok((job, wl))
}

/// Sets the parameter annotation on the Workload, as `kubectl annotate --overwrite` does.
async fn annotate_workload(t: &World, workload: &str, value: &str) -> Result<Workload> {
    let patch = json!({"metadata": {"annotations": {parameter_annotation(): value}}});
    t.env
        .workloads()
        .patch(workload, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .context("annotating the Workload")
}

/// Waits until the entry is `Pending` with a permanent failure's message.
async fn wait_permanent_failure(t: &World, workload: &str) -> Result<Workload> {
    let check = &t.p.check;
    t.env
        .wait_workload(workload, "the permanent failure on the entry", |w| {
            w.admission_check(check).is_some_and(|e| {
                e.state == CheckState::Pending && e.message.starts_with("Permanent failure: ")
            })
        })
        .await
}

/// The distinct entries of `check` on `workload` in `state` the history saw, in order.
fn entries_in(
    h: &History<Workload>,
    workload: &str,
    check: &str,
    state: CheckState,
) -> Vec<AdmissionCheckState> {
    let mut out: Vec<AdmissionCheckState> = Vec::new();
    for wl in h.applied().iter().filter(|w| w.name_any() == workload) {
        if let Some(e) = wl.admission_check(check).filter(|e| e.state == state)
            && !out.iter().any(|o| o.message == e.message)
        {
            out.push(e.clone());
        }
    }
    out
}

/// Waits until the history saw an entry of `check` in `state` on the Workload, and asserts it
/// saw exactly one such entry (by message); returns it.
async fn the_one_entry(
    h: &History<Workload>,
    workload: &str,
    check: &str,
    state: CheckState,
) -> Result<AdmissionCheckState> {
    h.wait_seen(workload, &format!("the {state:?} entry"), |w| {
        w.admission_check(check).is_some_and(|e| e.state == state)
    })
    .await?;
    let mut entries = entries_in(h, workload, check, state);
    assert_eq!(entries.len(), 1, "{entries:#?}");
    Ok(entries.remove(0))
}

fn ltt(e: &AdmissionCheckState) -> Result<Timestamp> {
    e.last_transition_time
        .as_ref()
        .map(|t| t.0)
        .ok_or_else(|| anyhow!("no lastTransitionTime: {e:?}"))
}

/// The retry strategy of the absurd test: a base of 68 years and no maximum.
fn absurd_retry_strategy() -> Value {
    json!({"retryStrategy": {
        "backoffLimitCount": 3,
        "backoffBaseSeconds": 2147483647,
        "backoffMaxSeconds": 0,
    }})
}

/// The parameters a fixed annotation gives the request.
fn fixed_parameters() -> BTreeMap<String, String> {
    BTreeMap::from([(KEY.to_string(), "60".to_string())])
}

/// Why the Workload carries the too long annotation when Kueue creates it.
const COPIED_AS_IS: &str =
    "Kueue copies the Job's annotation to the Workload as it is, whatever its length";
/// Why it still does once the Job's annotation was changed.
const NOT_COPIED_AGAIN: &str = "Kueue did not copy the Job's changed annotation to the Workload";
/// How soon a permanent failure reaches the entry.
const SECONDS: Duration = Duration::from_secs(10);

/// Asserts the Workload still carries the too long annotation as the Job gave it.
fn assert_long_annotation_kept(wl: &Workload, why: &str) {
    assert_eq!(
        wl.annotations().get(&parameter_annotation()),
        Some(&too_long_value()),
        "{why}:\n{}",
        dump(wl)
    );
}

/// Waits for the permanent failure on the entry and asserts it came within `within` of
/// `started`; returns the Workload and the entry.
async fn permanent_failure_within(
    t: &World,
    workload: &str,
    started: Instant,
    within: Duration,
) -> Result<(Workload, AdmissionCheckState)> {
    let failed = wait_permanent_failure(t, workload).await?;
    let took = started.elapsed();
    ensure!(
        took < within,
        "the permanent failure took {took:?} to reach the entry"
    );
    let entry = failed
        .admission_check(&t.p.check)
        .cloned()
        .unwrap_or_default();
    Ok((failed, entry))
}

/// The entry names the annotation, its length and the fix on the Workload (or a new Job),
/// says the quota is kept for now, and does not repeat the value.
fn ensure_explains_the_long_annotation(
    t: &World,
    workload: &str,
    reason: &str,
    entry: &AdmissionCheckState,
) -> Result<()> {
    ensure!(
        entry.message.starts_with(&format!(
            "Permanent failure: {reason}. Retrying will not fix this; once it is fixed the check \
             answers again. The workload keeps its quota until "
        )),
        "{entry:#?}"
    );
    for part in [
        format!(
            "annotation {} on this Workload is {TOO_LONG} characters long",
            parameter_annotation()
        ),
        format!(
            "kubectl annotate workload -n {} {workload} {}=<new value> --overwrite",
            t.env.ns,
            parameter_annotation()
        ),
        "resubmit the Job".to_string(),
    ] {
        ensure!(
            entry.message.contains(&part),
            "{part:?} missing: {entry:#?}"
        );
    }
    ensure!(
        !entry.message.contains("9999999999"),
        "the value must not be repeated: {entry:#?}"
    );
    Ok(())
}

/// The Workload holds its quota and is not evicted.
fn ensure_holds_quota(wl: &Workload) -> Result<()> {
    ensure!(
        wl.condition_is_true(cond::QUOTA_RESERVED) && !wl.condition_is_true(cond::EVICTED),
        "the Workload keeps its quota during the hold:\n{}",
        dump(wl)
    );
    Ok(())
}

/// The permanent failure is announced by an Event giving the reason, and counted once.
async fn assert_failure_announced(t: &World, workload: &str, reason: &str) -> Result<()> {
    let note = t.env.event_note(workload, "CheckFailedPermanently").await?;
    assert_eq!(note, format!("check {}: {reason}", t.p.check));
    t.wait_counter(PERMANENT_FAILURES, 1.0).await?;
    Ok(())
}

/// Sets the parameter annotation on Job `job`: the wrong place, Kueue does not copy it to
/// the Job's existing Workload.
async fn annotate_job(t: &World, job: &str, value: &str) -> Result<()> {
    let patch = json!({"metadata": {"annotations": {parameter_annotation(): value}}});
    t.env
        .jobs()
        .patch(job, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Waits until Kueue evicted the Workload for the check's `Retry` (it stays active).
async fn evicted_by_retry(t: &World, workload: &str) -> Result<Workload> {
    let evicted = t
        .env
        .wait_workload(workload, "evicted by the check's Retry", |w| {
            w.evictions("AdmissionCheck") >= 1
        })
        .await?;
    ensure!(evicted.is_active(), "{}", dump(&evicted));
    Ok(evicted)
}

/// The `Retry` gives the quota back after the hold, attempt 1 of 2, without delay, and was
/// not written before the hold, counted from the first failure (after `submitted`; the
/// stored time is cut to whole seconds).
fn ensure_retried_after_the_hold(
    retry: &AdmissionCheckState,
    reason: &str,
    submitted: Timestamp,
) -> Result<()> {
    ensure!(
        retry.message.starts_with(&format!(
            "Permanent failure: {reason}. Not fixed within 5s: the quota is given back"
        )) && retry
            .message
            .contains("(attempt 1 of 2; next attempt as soon as Kueue requeues"),
        "{retry:#?}"
    );
    assert_eq!(retry.requeue_after_seconds.unwrap_or(0), 0, "{retry:#?}");
    let held = ltt(retry)?.duration_since(submitted);
    ensure!(
        held >= SignedDuration::from_secs(4),
        "Retry written {held:?} after the submission, before the hold of {HOLD:?}"
    );
    Ok(())
}

/// The `Rejected` entry gives the same reason, past the limit of 1 retry.
fn ensure_rejected_past_the_limit(rejected: &AdmissionCheckState, reason: &str) -> Result<()> {
    ensure!(
        rejected
            .message
            .starts_with(&format!("Permanent failure: {reason}. Not fixed within 5s"))
            && rejected
                .message
                .ends_with("(attempt 2: no retries left after 1)"),
        "{rejected:#?}"
    );
    Ok(())
}

/// No ProvisioningRequest or PodTemplate was ever made, and the Job is still suspended.
async fn assert_nothing_made(t: &World, requests: &History<ProvisioningRequest>) -> Result<()> {
    assert!(requests.objects().is_empty(), "{:?}", requests.objects());
    assert!(t.env.our_pod_templates().await?.is_empty());
    assert_eq!(t.env.job_suspend("job").await?, Some(true));
    Ok(())
}

/// The parameters of attempt `attempt`'s request for the Workload.
async fn request_parameters(
    t: &World,
    workload: &str,
    attempt: u32,
) -> Result<BTreeMap<String, String>> {
    let request = t.request(workload, attempt);
    let made: ProvisioningRequest = t.env.provisioning_requests().get(&request).await?;
    Ok(made.spec.parameters)
}

/// Waits until the check is `Active=True` and returns that condition.
async fn active_condition(t: &World) -> Result<Condition> {
    let ac = wait_for(
        Api::<AdmissionCheck>::all(t.env.client.clone()),
        &t.p.check,
        "Active=True",
        |ac: &AdmissionCheck| ac.active_condition().is_some_and(|c| c.status == "True"),
    )
    .await?;
    ac.active_condition()
        .cloned()
        .context("the Active condition")
}

/// Waits until the entry is `Retry` and Kueue has set `requeueAt`; returns the Workload and
/// the entry.
async fn retry_with_requeue_at(
    t: &World,
    workload: &str,
) -> Result<(Workload, AdmissionCheckState)> {
    let check = &t.p.check;
    let retrying = t
        .env
        .wait_workload(workload, "Retry with Kueue's requeueAt set", |w| {
            w.admission_check(check)
                .is_some_and(|e| e.state == CheckState::Retry)
                && w.requeue_at().is_some()
        })
        .await?;
    let entry = retrying.admission_check(check).cloned().unwrap_or_default();
    Ok((retrying, entry))
}

/// The clamp is announced by an Event naming the delay asked for and the ceiling, and
/// counted.
async fn assert_clamp_announced(t: &World, workload: &str) -> Result<()> {
    assert_eq!(
        t.env.event_note(workload, "RetryDelayClamped").await?,
        format!(
            "check {}: a retry delay of 68y was asked for; written as 20s, the ceiling \
             (--max-retry-delay-seconds)",
            t.p.check
        )
    );
    t.wait_counter("kueue_ac_retry_delays_clamped_total", 1.0)
        .await?;
    Ok(())
}

/// Waits until the history saw the check's eviction of the Workload; returns when Kueue
/// evicted it.
async fn eviction_time(h: &History<Workload>, workload: &str) -> Result<Timestamp> {
    h.wait_seen(workload, "the eviction", |w| {
        w.evictions("AdmissionCheck") == 1 && w.condition_is_true(cond::EVICTED)
    })
    .await?;
    h.applied()
        .iter()
        .filter(|w| w.name_any() == workload && w.condition_is_true(cond::EVICTED))
        .find_map(|w| w.condition(cond::EVICTED).map(|c| c.last_transition_time.0))
        .context("the eviction time")
}

/// Kueue evicted the Workload at its `requeueAt` (`due`) or at most `slack` after it.
fn ensure_evicted_within(
    evicted_at: Timestamp,
    due: Timestamp,
    slack: SignedDuration,
) -> Result<()> {
    let late = evicted_at.duration_since(due);
    ensure!(
        late >= SignedDuration::ZERO && late <= slack,
        "evicted at {evicted_at}, {late:?} after requeueAt {due}"
    );
    Ok(())
}

/// Creates a ProvisioningRequest `name` whose parameter [`KEY`] is `value`, with the API
/// server's answer as it is.
async fn create_request(env: &TestEnv, name: &str, value: String) -> Result<ProvisioningRequest> {
    let request: ProvisioningRequest = serde_json::from_value(json!({
        "apiVersion": "autoscaling.x-k8s.io/v1",
        "kind": "ProvisioningRequest",
        "metadata": {"name": name, "namespace": env.ns},
        "spec": {
            "provisioningClassName": env.provisioning_class(),
            "parameters": {KEY: value},
            "podSets": [{"podTemplateRef": {"name": "ppt-none"}, "count": 1}],
        },
    }))?;
    Ok(env
        .provisioning_requests()
        .create(&PostParams::default(), &request)
        .await?)
}

/// Creates request `name` with `value`, expecting the API server to refuse it; returns the
/// refusal.
async fn refused_request(env: &TestEnv, name: &str, value: String) -> Result<Box<Status>> {
    let status = match create_request(env, name, value).await {
        Err(e) => match e.downcast::<kube::Error>() {
            Ok(kube::Error::Api(status)) => status,
            other => anyhow::bail!("{name}: expected a refusal, got {other:?}"),
        },
        other => anyhow::bail!("{name}: expected a refusal, got {other:?}"),
    };
    eprintln!("{name}: {status:?}");
    Ok(status)
}

/// What the controller would write for the refusal of request `name`, had its parameter
/// come from an annotation of Workload `job-x` (config `prc`).
fn controller_message(env: &TestEnv, name: &str, status: &Status) -> Result<String> {
    let subject = Subject {
        namespace: &env.ns,
        workload: "job-x",
        config: "prc",
    };
    let message = refusal::for_api(
        refusal::Kind::ProvisioningRequest,
        name,
        status,
        &[KEY.to_string()],
        &subject,
    )
    .context("a permanent refusal")?;
    eprintln!("{name}: the controller would write: {message}");
    Ok(message)
}

/// The message names the request, the field, the annotation and the fix, without the
/// value or the server's note on skipped rules.
fn ensure_names_field_annotation_and_fix(env: &TestEnv, name: &str, message: &str) -> Result<()> {
    ensure!(
        message.starts_with(&format!(
            "the API server refused to create ProvisioningRequest {}/{name} (Invalid, 422): spec.parameters",
            env.ns
        )),
        "{message}"
    );
    ensure!(
        !message.contains("<nil>"),
        "the server's note on skipped rules: {message}"
    );
    for part in [
        format!(
            "comes from annotation {} on this Workload",
            parameter_annotation()
        ),
        format!("kubectl annotate workload -n {} job-x", env.ns),
    ] {
        ensure!(message.contains(&part), "{part:?} missing: {message}");
    }
    ensure!(
        !message.contains("xxxxxxxxxx") && !message.contains("éééééééééé"),
        "{message}"
    );
    Ok(())
}

/// A Job whose annotation is too long: within seconds the entry says which annotation, the
/// limit and the fix, while the Workload keeps its quota; an Event says the same and the counter
/// counts it. Changing the annotation on the Job (the wrong place) changes nothing. After the
/// hold the check answers `Retry` and Kueue evicts the Workload (quota given back); the next
/// attempt fails the same way and, past `backoffLimitCount` 1, is `Rejected`: the Workload is
/// deactivated. No ProvisioningRequest is ever created.
#[tokio::test]
async fn a_too_long_annotation_is_shown_on_the_entry_then_retried_and_rejected_past_the_limit()
-> Result<()> {
    let t = setup("provfail-rejected", retry_strategy(1, 1)).await?;
    let (env, check) = (&t.env, &t.p.check);
    let (wls, requests) = (env.workload_history(), env.request_history());
    let (submitted, started) = (Timestamp::now(), Instant::now());
    let (_, wl) = job_with_parameter(&t, "job", &too_long_value(), "provision").await?;
    assert_long_annotation_kept(&env.workloads().get(&wl).await?, COPIED_AS_IS);

    // Within seconds: the reason on the entry, the quota still held.
    let (failed, entry) = permanent_failure_within(&t, &wl, started, SECONDS).await?;
    let reason = too_long_reason(&t, &wl);
    ensure_explains_the_long_annotation(&t, &wl, &reason, &entry)?;
    ensure_holds_quota(&failed)?;
    assert_failure_announced(&t, &wl, &reason).await?;
    // The wrong place: Kueue does not copy a Job's annotations to its existing Workload.
    annotate_job(&t, "job", "60").await?;

    // After the hold: Retry without delay, and Kueue evicts (the quota is given back).
    evicted_by_retry(&t, &wl).await?;
    let retry = the_one_entry(&wls, &wl, check, CheckState::Retry).await?;
    ensure_retried_after_the_hold(&retry, &reason, submitted)?;

    // The next attempt fails the same way (the Workload still has the long value) and is past
    // the limit: Rejected, deactivated.
    let deactivated = t.env.wait_deactivated(&wl).await?;
    assert_long_annotation_kept(&deactivated, NOT_COPIED_AGAIN);
    let rejected = the_one_entry(&wls, &wl, check, CheckState::Rejected).await?;
    ensure_rejected_past_the_limit(&rejected, &reason)?;
    assert_eq!(deactivated.evictions("AdmissionCheck"), 1);
    // Each attempt's failure was counted; nothing was ever created.
    t.wait_counter(PERMANENT_FAILURES, 2.0).await?;
    assert_nothing_made(&t, &requests).await?;
    t.stop().await
}

/// The user fixes the annotation on the Workload while it still holds its quota: the check is
/// asked again at once, creates the request with the new value and the Workload is admitted on
/// its first attempt, never evicted.
#[tokio::test]
async fn a_fix_on_the_workload_during_the_hold_admits_it_without_an_eviction() -> Result<()> {
    let t = setup("provfail-fix-hold", retry_strategy(1, 1)).await?;
    let (env, check) = (&t.env, &t.p.check);
    let wls = env.workload_history();
    let (_, wl) = job_with_parameter(&t, "job", &too_long_value(), "provision").await?;
    let failed = wait_permanent_failure(&t, &wl).await?;
    ensure!(failed.condition_is_true(cond::QUOTA_RESERVED));

    let annotated = annotate_workload(&t, &wl, "60").await?;
    ensure!(
        annotated.resource_version() != failed.resource_version(),
        "Kueue accepts the change of a Workload that holds quota"
    );
    let (admitted, entry) = t.admitted_on_attempt(&wl, 1).await?;
    assert_eq!(entry.state, CheckState::Ready, "{entry:#?}");
    assert_eq!(entry.retry_count, None, "{entry:#?}");
    assert_eq!(request_parameters(&t, &wl, 1).await?, fixed_parameters());
    assert_eq!(admitted.total_evictions(), 0, "{}", dump(&admitted));
    let admission = |w: &Workload| w.condition_is_true(cond::ADMITTED);
    wls.wait_seen(&wl, "the admission", admission).await?;
    assert!(entries_in(&wls, &wl, check, CheckState::Retry).is_empty());
    t.wait_counter(PERMANENT_FAILURES, 1.0).await?;
    t.stop().await
}

/// The user fixes the annotation on the Workload only after the hold ended with a `Retry`:
/// the next attempt uses the fixed value and the Workload is admitted on it.
#[tokio::test]
async fn a_fix_on_the_workload_after_a_retry_is_picked_up_by_the_next_attempt() -> Result<()> {
    let t = setup("provfail-fix-retry", retry_strategy(2, 1)).await?;
    let env = &t.env;
    let (_, wl) = job_with_parameter(&t, "job", &too_long_value(), "provision").await?;
    wait_permanent_failure(&t, &wl).await?;
    env.wait_workload(&wl, "evicted by the check's Retry", |w| {
        w.evictions("AdmissionCheck") == 1
    })
    .await?;
    annotate_workload(&t, &wl, "60").await?;

    let (admitted, entry) = t.admitted_on_attempt(&wl, 2).await?;
    assert_eq!(entry.retry_count, Some(1), "{entry:#?}");
    assert_eq!(admitted.evictions("AdmissionCheck"), 1);
    assert_eq!(request_parameters(&t, &wl, 2).await?, fixed_parameters());
    assert_eq!(env.our_requests().await?, [t.request(&wl, 2)]);
    t.stop().await
}

/// `backoffBaseSeconds: 2147483647, backoffMaxSeconds: 0` (accepted by the CRD): the check is
/// `Active` and its message names the clamp; a failed request is answered with `Retry` after the
/// ceiling (20 s) instead of 68 years, announced by an Event and counted once; Kueue honours the
/// 20 s and the next attempt admits.
#[tokio::test]
async fn an_absurd_retry_strategy_is_clamped_to_the_ceiling_and_reported() -> Result<()> {
    let t = setup("provfail-absurd", absurd_retry_strategy()).await?;
    let env = &t.env;
    let active = active_condition(&t).await?;
    let says = |part: &str| active.message.contains(part);
    let over = "would wait up to 68y before an attempt, more than the ceiling of 20s";
    let written = "such delays are written as 20s";
    ensure!(says(over) && says(written), "{active:#?}");

    let wls = env.workload_history();
    let wl = env.job_with_script("job", "fail,provision").await?;
    let (retrying, entry) = retry_with_requeue_at(&t, &wl).await?;
    assert_eq!(entry.requeue_after_seconds, Some(20), "{entry:#?}");
    let capped = "the delay asked for, 68y, is capped at 20s";
    ensure!(entry.message.contains(capped), "{entry:#?}");
    // Kueue keeps the quota for the delay and takes requeueAfterSeconds as it is.
    ensure!(retrying.condition_is_true(cond::QUOTA_RESERVED));
    let due = ltt(&entry)?.checked_add(SignedDuration::from_secs(20))?;
    assert_eq!(retrying.requeue_at(), Some(due), "{}", dump(&retrying));
    assert_clamp_announced(&t, &wl).await?;

    // After the 20 s, Kueue evicts and the second attempt is provisioned.
    t.admitted_on_attempt(&wl, 2).await?;
    let evicted_at = eviction_time(&wls, &wl).await?;
    ensure_evicted_within(evicted_at, due, SignedDuration::from_secs(5))?;
    let m = t.wait_counter(CLAMPED, 1.0).await?;
    let count = e2e::metric_sample(&m, &t.series(CLAMPED));
    assert_eq!(count, Some(1.0), "one clamped delay, one count");
    t.stop().await
}

/// The limit the controller checks before creating a request is the API server's own: a
/// `spec.parameters` value of 255 characters (two bytes each) is accepted, 256 are refused with
/// 422. The refusal, as the controller would report it for a value from a Workload annotation,
/// names the field, the annotation and the fix, without the value.
#[tokio::test]
async fn the_api_server_refuses_parameters_over_255_characters_as_the_check_does() -> Result<()> {
    let env = TestEnv::new("provfail-crd-limit").await?;
    create_request(&env, "at-limit", "é".repeat(255))
        .await
        .context("255 characters (510 bytes) are accepted")?;
    for (name, value) in [
        ("over-ascii", "x".repeat(256)),
        ("over-wide", "é".repeat(256)),
    ] {
        let status = refused_request(&env, name, value).await?;
        assert_eq!(status.code, 422, "{status:?}");
        let message = controller_message(&env, name, &status)?;
        ensure_names_field_annotation_and_fix(&env, name, &message)?;
    }
    Ok(())
}

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
use e2e::provisioning::{History, World};
use e2e::{SuspendedJob, TestEnv, dump, wait_for};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
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

/// The retry strategy of the tests: `backoffLimitCount` `limit`, delays of 1 s.
fn retry_strategy(limit: i32) -> Value {
    json!({"retryStrategy": {
        "backoffLimitCount": limit,
        "backoffBaseSeconds": 1,
        "backoffMaxSeconds": 10,
    }})
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
    let t = setup("provfail-rejected", retry_strategy(1)).await?;
    let (env, check) = (&t.env, &t.p.check);
    let wls = env.workload_history();
    let requests = env.request_history();
    let submitted = Timestamp::now();
    let started = Instant::now();
    let (_, wl) = job_with_parameter(&t, "job", &too_long_value(), "provision").await?;
    let created = env.workloads().get(&wl).await?;
    assert_eq!(
        created.annotations().get(&parameter_annotation()),
        Some(&too_long_value()),
        "Kueue copies the Job's annotation to the Workload as it is, whatever its length"
    );

    // Within seconds: the reason on the entry, the quota still held.
    let failed = wait_permanent_failure(&t, &wl).await?;
    let took = started.elapsed();
    ensure!(
        took < Duration::from_secs(10),
        "the permanent failure took {took:?} to reach the entry"
    );
    let reason = too_long_reason(&t, &wl);
    let entry = failed.admission_check(check).cloned().unwrap_or_default();
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
            "kubectl annotate workload -n {} {wl} {}=<new value> --overwrite",
            env.ns,
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
    ensure!(
        failed.condition_is_true(cond::QUOTA_RESERVED) && !failed.condition_is_true(cond::EVICTED),
        "the Workload keeps its quota during the hold:\n{}",
        dump(&failed)
    );
    assert_eq!(
        env.event_note(&wl, "CheckFailedPermanently").await?,
        format!("check {check}: {reason}")
    );
    t.wait_counter("kueue_ac_permanent_failures_total", 1.0)
        .await?;

    // The wrong place: Kueue does not copy a Job's annotations to its existing Workload.
    let patch = json!({"metadata": {"annotations": {parameter_annotation(): "60"}}});
    env.jobs()
        .patch("job", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;

    // After the hold: Retry without delay, and Kueue evicts (the quota is given back).
    let evicted = env
        .wait_workload(&wl, "evicted by the check's Retry", |w| {
            w.evictions("AdmissionCheck") >= 1
        })
        .await?;
    ensure!(evicted.is_active(), "{}", dump(&evicted));
    let retry = the_one_entry(&wls, &wl, check, CheckState::Retry).await?;
    ensure!(
        retry.message.starts_with(&format!(
            "Permanent failure: {reason}. Not fixed within 5s: the quota is given back"
        )) && retry
            .message
            .contains("(attempt 1 of 2; next attempt as soon as Kueue requeues"),
        "{retry:#?}"
    );
    assert_eq!(retry.requeue_after_seconds.unwrap_or(0), 0, "{retry:#?}");
    // Not before the hold, counted from the first failure (after the submission; the stored
    // time is cut to whole seconds).
    let held = ltt(&retry)?.duration_since(submitted);
    ensure!(
        held >= SignedDuration::from_secs(4),
        "Retry written {held:?} after the submission, before the hold of {HOLD:?}"
    );

    // The next attempt fails the same way (the Workload still has the long value) and is past
    // the limit: Rejected, deactivated.
    let deactivated = env
        .wait_workload(&wl, "deactivated (spec.active=false)", |w| !w.is_active())
        .await?;
    assert_eq!(
        deactivated.annotations().get(&parameter_annotation()),
        Some(&too_long_value()),
        "Kueue did not copy the Job's changed annotation to the Workload:\n{}",
        dump(&deactivated)
    );
    let rejected = the_one_entry(&wls, &wl, check, CheckState::Rejected).await?;
    ensure!(
        rejected
            .message
            .starts_with(&format!("Permanent failure: {reason}. Not fixed within 5s"))
            && rejected
                .message
                .ends_with("(attempt 2: no retries left after 1)"),
        "{rejected:#?}"
    );
    assert_eq!(deactivated.evictions("AdmissionCheck"), 1);
    // Each attempt's failure was counted; nothing was ever created.
    t.wait_counter("kueue_ac_permanent_failures_total", 2.0)
        .await?;
    assert!(requests.objects().is_empty(), "{:?}", requests.objects());
    assert!(env.our_pod_templates().await?.is_empty());
    let job = env.jobs().get("job").await?;
    assert_eq!(job.spec.and_then(|s| s.suspend), Some(true));
    t.stop().await
}

/// The user fixes the annotation on the Workload while it still holds its quota: the check is
/// asked again at once, creates the request with the new value and the Workload is admitted on
/// its first attempt, never evicted.
#[tokio::test]
async fn a_fix_on_the_workload_during_the_hold_admits_it_without_an_eviction() -> Result<()> {
    let t = setup("provfail-fix-hold", retry_strategy(1)).await?;
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
    let admitted = env.wait_admitted(&wl).await?;
    let request = format!("{wl}-{check}-1");
    let entry = admitted.admission_check(check).cloned().unwrap_or_default();
    assert_eq!(entry.state, CheckState::Ready, "{entry:#?}");
    assert_eq!(
        entry.message,
        format!("ProvisioningRequest {}/{request} provisioned", env.ns)
    );
    assert_eq!(entry.retry_count, None, "{entry:#?}");
    let made: ProvisioningRequest = env.provisioning_requests().get(&request).await?;
    assert_eq!(
        made.spec.parameters,
        BTreeMap::from([(KEY.to_string(), "60".to_string())])
    );
    assert_eq!(admitted.total_evictions(), 0, "{}", dump(&admitted));
    wls.wait_seen(&wl, "the admission", |w| {
        w.condition_is_true(cond::ADMITTED)
    })
    .await?;
    assert!(entries_in(&wls, &wl, check, CheckState::Retry).is_empty());
    t.wait_counter("kueue_ac_permanent_failures_total", 1.0)
        .await?;
    t.stop().await
}

/// The user fixes the annotation on the Workload only after the hold ended with a `Retry`:
/// the next attempt uses the fixed value and the Workload is admitted on it.
#[tokio::test]
async fn a_fix_on_the_workload_after_a_retry_is_picked_up_by_the_next_attempt() -> Result<()> {
    let t = setup("provfail-fix-retry", retry_strategy(2)).await?;
    let (env, check) = (&t.env, &t.p.check);
    let (_, wl) = job_with_parameter(&t, "job", &too_long_value(), "provision").await?;
    wait_permanent_failure(&t, &wl).await?;
    env.wait_workload(&wl, "evicted by the check's Retry", |w| {
        w.evictions("AdmissionCheck") == 1
    })
    .await?;
    annotate_workload(&t, &wl, "60").await?;

    let admitted = env.wait_admitted(&wl).await?;
    let request = format!("{wl}-{check}-2");
    let entry = admitted.admission_check(check).cloned().unwrap_or_default();
    assert_eq!(
        entry.message,
        format!("ProvisioningRequest {}/{request} provisioned", env.ns),
        "{entry:#?}"
    );
    assert_eq!(entry.retry_count, Some(1), "{entry:#?}");
    assert_eq!(admitted.evictions("AdmissionCheck"), 1);
    let made: ProvisioningRequest = env.provisioning_requests().get(&request).await?;
    assert_eq!(
        made.spec.parameters,
        BTreeMap::from([(KEY.to_string(), "60".to_string())])
    );
    assert_eq!(env.our_requests().await?, [request]);
    t.stop().await
}

/// `backoffBaseSeconds: 2147483647, backoffMaxSeconds: 0` (accepted by the CRD): the check is
/// `Active` and its message names the clamp; a failed request is answered with `Retry` after the
/// ceiling (20 s) instead of 68 years, announced by an Event and counted once; Kueue honours the
/// 20 s and the next attempt admits.
#[tokio::test]
async fn an_absurd_retry_strategy_is_clamped_to_the_ceiling_and_reported() -> Result<()> {
    let t = setup(
        "provfail-absurd",
        json!({"retryStrategy": {
            "backoffLimitCount": 3,
            "backoffBaseSeconds": 2147483647,
            "backoffMaxSeconds": 0,
        }}),
    )
    .await?;
    let (env, check) = (&t.env, &t.p.check);
    let ac = wait_for(
        Api::<AdmissionCheck>::all(env.client.clone()),
        check,
        "Active=True",
        |ac: &AdmissionCheck| ac.active_condition().is_some_and(|c| c.status == "True"),
    )
    .await?;
    let active = ac
        .active_condition()
        .cloned()
        .context("the Active condition")?;
    ensure!(
        active
            .message
            .contains("would wait up to 68y before an attempt, more than the ceiling of 20s")
            && active.message.contains("such delays are written as 20s"),
        "{active:#?}"
    );

    let wls = env.workload_history();
    let wl = env.job_with_script("job", "fail,provision").await?;
    let retrying = env
        .wait_workload(&wl, "Retry with Kueue's requeueAt set", |w| {
            w.admission_check(check)
                .is_some_and(|e| e.state == CheckState::Retry)
                && w.requeue_at().is_some()
        })
        .await?;
    let entry = retrying.admission_check(check).cloned().unwrap_or_default();
    assert_eq!(entry.requeue_after_seconds, Some(20), "{entry:#?}");
    ensure!(
        entry
            .message
            .contains("the delay asked for, 68y, is capped at 20s"),
        "{entry:#?}"
    );
    // Kueue keeps the quota for the delay and takes requeueAfterSeconds as it is.
    ensure!(retrying.condition_is_true(cond::QUOTA_RESERVED));
    let due = ltt(&entry)?.checked_add(SignedDuration::from_secs(20))?;
    let requeue_at = retrying.requeue_at();
    assert_eq!(requeue_at, Some(due), "{}", dump(&retrying));
    assert_eq!(
        env.event_note(&wl, "RetryDelayClamped").await?,
        format!(
            "check {check}: a retry delay of 68y was asked for; written as 20s, the ceiling \
             (--max-retry-delay-seconds)"
        )
    );
    t.wait_counter("kueue_ac_retry_delays_clamped_total", 1.0)
        .await?;

    // After the 20 s, Kueue evicts and the second attempt is provisioned.
    let admitted = env.wait_admitted(&wl).await?;
    let entry = admitted.admission_check(check).cloned().unwrap_or_default();
    assert_eq!(
        entry.message,
        format!("ProvisioningRequest {}/{wl}-{check}-2 provisioned", env.ns)
    );
    wls.wait_seen(&wl, "the eviction", |w| {
        w.evictions("AdmissionCheck") == 1 && w.condition_is_true(cond::EVICTED)
    })
    .await?;
    let evicted_at = wls
        .applied()
        .iter()
        .filter(|w| w.name_any() == wl && w.condition_is_true(cond::EVICTED))
        .find_map(|w| w.condition(cond::EVICTED).map(|c| c.last_transition_time.0))
        .context("the eviction time")?;
    let late = evicted_at.duration_since(due);
    ensure!(
        late >= SignedDuration::ZERO && late <= SignedDuration::from_secs(5),
        "evicted at {evicted_at}, {late:?} after requeueAt {due}"
    );
    let m = t
        .wait_counter("kueue_ac_retry_delays_clamped_total", 1.0)
        .await?;
    assert_eq!(
        e2e::metric_sample(&m, &t.series("kueue_ac_retry_delays_clamped_total")),
        Some(1.0),
        "one clamped delay, one count"
    );
    t.stop().await
}

/// The limit the controller checks before creating a request is the API server's own: a
/// `spec.parameters` value of 255 characters (two bytes each) is accepted, 256 are refused with
/// 422. The refusal, as the controller would report it for a value from a Workload annotation,
/// names the field, the annotation and the fix, without the value.
#[tokio::test]
async fn the_api_server_refuses_parameters_over_255_characters_as_the_check_does() -> Result<()> {
    let env = TestEnv::new("provfail-crd-limit").await?;
    let requests = env.provisioning_requests();
    let request = |name: &str, value: String| -> Result<ProvisioningRequest> {
        Ok(serde_json::from_value(json!({
            "apiVersion": "autoscaling.x-k8s.io/v1",
            "kind": "ProvisioningRequest",
            "metadata": {"name": name, "namespace": env.ns},
            "spec": {
                "provisioningClassName": env.provisioning_class(),
                "parameters": {KEY: value},
                "podSets": [{"podTemplateRef": {"name": "ppt-none"}, "count": 1}],
            },
        }))?)
    };
    requests
        .create(
            &PostParams::default(),
            &request("at-limit", "é".repeat(255))?,
        )
        .await
        .context("255 characters (510 bytes) are accepted")?;
    for (name, value) in [
        ("over-ascii", "x".repeat(256)),
        ("over-wide", "é".repeat(256)),
    ] {
        let refused = requests
            .create(&PostParams::default(), &request(name, value)?)
            .await;
        let status = match refused {
            Err(kube::Error::Api(status)) => status,
            other => anyhow::bail!("{name}: expected a refusal, got {other:?}"),
        };
        eprintln!("{name}: {status:?}");
        assert_eq!(status.code, 422, "{status:?}");
        let subject = Subject {
            namespace: &env.ns,
            workload: "job-x",
            config: "prc",
        };
        let message = refusal::for_api(
            refusal::Kind::ProvisioningRequest,
            name,
            &status,
            &[KEY.to_string()],
            &subject,
        )
        .context("a permanent refusal")?;
        eprintln!("{name}: the controller would write: {message}");
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
    }
    Ok(())
}

//! `kueue-ac explain` against the real Kueue: a Workload in each situation a user asks about
//! (no quota, a check pending, a delayed retry, a failed ProvisioningRequest, admitted,
//! rejected), each read through the CLI's own fetch and report, and asserted on what it tells.

use anyhow::{Result, ensure};
use e2e::{GuardedQueue, TestEnv};
use kube::ResourceExt;
use kueue_ac::fetch::Target;
use kueue_ac::report::{Phase, Report};
use kueue_admission_sdk::api::{CheckState, workload_condition as cond};
use serde_json::json;

async fn explain(env: &TestEnv, target: &str) -> Result<Report> {
    let target: Target = target.parse().map_err(|e: String| anyhow::anyhow!(e))?;
    Ok(kueue_ac::explain(&env.client, &env.ns, &target).await?)
}

/// A test's queues guarded by an active check `gate` that the test answers itself.
async fn gated(test: &str) -> Result<(TestEnv, GuardedQueue)> {
    let env = TestEnv::new(test).await?;
    let controller = env.own_controller_name("explain");
    let q = env.guarded_queue("gate", &controller, "4").await?;
    env.set_admission_check_active(&q.check, true).await?;
    Ok((env, q))
}

#[tokio::test]
async fn a_workload_without_quota_quotes_kueues_reason() -> Result<()> {
    let env = TestEnv::new("explain-quota").await?;
    let flavor = env.resource_flavor("default").await?.name_any();
    let cq = env.queues_on(&flavor, "1", &[]).await?;
    let wl = env.submit_job("big", "lq", "4").await?;
    env.wait_workload(&wl, "QuotaReserved=False with a reason", |wl| {
        wl.condition(cond::QUOTA_RESERVED)
            .is_some_and(|c| c.status == "False" && !c.message.is_empty())
    })
    .await?;
    // Asked by the Job's name, as a user would.
    let r = explain(&env, "job/big").await?;
    assert_eq!(r.workload, wl);
    assert_eq!(r.owner.as_deref(), Some("Job/big"));
    assert_eq!(r.phase, Phase::WaitingForQuota);
    assert_eq!(r.cluster_queue.as_deref(), Some(cq.as_str()));
    assert!(!r.quota.reserved);
    let reason = r.quota.waiting_reason.clone().unwrap_or_default();
    assert!(
        r.advice == format!("Waiting for quota on ClusterQueue {cq}: {reason}")
            && reason.contains("cpu"),
        "{}",
        kueue_ac::render::text(&r)
    );
    Ok(())
}

#[tokio::test]
async fn a_pending_then_retried_then_admitted_workload() -> Result<()> {
    let (env, q) = gated("explain-check").await?;
    let wl = env.submit_job("job", "lq", "1").await?;
    env.wait_check_pending_with_quota(&wl, &q.check).await?;

    let r = explain(&env, &wl).await?;
    assert_eq!(r.phase, Phase::WaitingForChecks);
    assert!(
        r.quota.reserved
            && r.quota
                .flavors
                .values()
                .any(|f| f.values().any(|v| *v == q.flavor))
    );
    assert_eq!(r.checks.len(), 1);
    assert_eq!(
        (r.checks[0].state, r.checks[0].attempt),
        (CheckState::Pending, 1)
    );
    assert_eq!(r.checks[0].active, Some(true));
    assert_eq!(
        r.advice,
        format!(
            "Waiting for check {} (controller {}): no answer yet",
            q.check, q.controller_name
        )
    );

    // A Retry with a delay: Kueue holds the quota until the delay ends.
    env.answer_check_with_delay(
        &wl,
        &q.check,
        CheckState::Retry,
        "license server down",
        Some(600),
    )
    .await?;
    let r = explain(&env, &wl).await?;
    let c = &r.checks[0];
    ensure!(
        c.state == CheckState::Retry,
        "{}",
        kueue_ac::render::text(&r)
    );
    let since = c
        .since
        .ok_or_else(|| anyhow::anyhow!("no lastTransitionTime"))?;
    assert_eq!(
        c.next_attempt_at,
        since
            .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(600))
            .ok()
    );
    assert!(c.quota_held_until_retry, "{}", kueue_ac::render::text(&r));
    assert!(
        r.advice.starts_with(&format!(
            "Check {} answered Retry: license server down. Kueue keeps the quota until ",
            q.check
        )),
        "{}",
        r.advice
    );
    let text = kueue_ac::render::text(&r);
    assert!(text.contains("quota held until then"), "{text}");
    Ok(())
}

#[tokio::test]
async fn admitted_and_rejected_workloads_say_so() -> Result<()> {
    let (env, q) = gated("explain-ends").await?;
    let ok = env.submit_job("ok", "lq", "1").await?;
    let no = env.submit_job("no", "lq", "1").await?;
    for wl in [&ok, &no] {
        env.wait_check_pending_with_quota(wl, &q.check).await?;
    }
    env.answer_check(&ok, &q.check, CheckState::Ready, "fine")
        .await?;
    env.wait_admitted(&ok).await?;
    let r = explain(&env, &ok).await?;
    assert_eq!(r.phase, Phase::Admitted);
    assert_eq!(
        r.advice,
        format!(
            "Admitted on ClusterQueue {}: its pods may start.",
            q.cluster_queue
        )
    );

    env.answer_check(
        &no,
        &q.check,
        CheckState::Rejected,
        "needs 4 licenses, the pool has 2",
    )
    .await?;
    env.wait_workload(&no, "deactivated", |wl| !wl.is_active())
        .await?;
    let r = explain(&env, &no).await?;
    assert_eq!(r.phase, Phase::Deactivated);
    // Kueue may have reset the entry after the deactivation; the advice names the check either
    // way, from the entry or from Kueue's deactivation message, and what brings it back:
    // not spec.active: true (Kueue does not requeue a Workload a check deactivated), but a
    // resubmitted Job or `kueue-ac reactivate` (tests/e2e/tests/reactivate.rs runs it).
    assert!(
        r.advice.contains(&q.check)
            && r.advice.contains("Setting spec.active: true is not enough")
            && r.advice
                .contains(&format!("kueue-ac reactivate -n {} workload/{no}", env.ns)),
        "{}",
        kueue_ac::render::text(&r)
    );
    // The JSON form carries the same report.
    let json = serde_json::to_value(&r)?;
    assert_eq!(json["phase"], json!("deactivated"));
    assert_eq!(json["checks"][0]["name"], json!(q.check));
    Ok(())
}

#[tokio::test]
async fn a_failed_provisioning_request_is_shown_with_the_autoscalers_words() -> Result<()> {
    let env = TestEnv::new("explain-prov").await?;
    // A long backoff: the Retry holds the quota long enough to look at it.
    let spec = json!({"retryStrategy": {
        "backoffLimitCount": 2, "backoffBaseSeconds": 600, "backoffMaxSeconds": 1200,
    }});
    let p = env.provisioning(spec, "4").await?;
    let _controller = env.start_provisioning_controller(None)?;
    let _simulator = env.start_simulator()?;
    let wl = env.job_with_script("job", "fail,provision").await?;
    env.wait_workload(&wl, "the provisioning check answers Retry", |wl| {
        wl.admission_check(&p.check)
            .is_some_and(|e| e.state == CheckState::Retry)
    })
    .await?;
    // The Event comes beside the write (the SDK publishes Events off the reconcile).
    env.wait_event_count(&wl, "CheckRetry", 1).await?;
    let r = explain(&env, "job").await?;
    let text = kueue_ac::render::text(&r);
    let c = &r.checks[0];
    assert_eq!((c.attempt, c.retry_limit), (1, Some(2)), "{text}");
    assert!(c.quota_held_until_retry, "{text}");
    ensure!(r.provisioning_requests.len() == 1, "{text}");
    let request = &r.provisioning_requests[0];
    assert_eq!(request.check.as_deref(), Some(p.check.as_str()), "{text}");
    assert!(
        request
            .outcome
            .as_deref()
            .is_some_and(|o| o.starts_with("Failed=True") && o.contains("simulated: no capacity")),
        "{text}"
    );
    assert!(!r.pod_templates.is_empty(), "{text}");
    assert!(
        r.advice.starts_with(&format!(
            "Check {} answered Retry: ProvisioningRequest",
            p.check
        )) && r.advice.contains("simulated: no capacity"),
        "{text}"
    );
    // The controller's Events are in the report too.
    assert!(
        r.events
            .iter()
            .any(|e| e.reason == "CheckRetry" || e.reason.contains("Retry")),
        "{text}"
    );
    Ok(())
}

/// Two checks answer `Retry` with delays of different lengths, the first entry with the shorter:
/// Kueue keeps the quota until the longer one ends, and so does the report (it used to take the
/// first entry's).
#[tokio::test]
async fn two_delayed_retries_hold_the_quota_until_the_longer_one_ends() -> Result<()> {
    use k8s_openapi::jiff::SignedDuration;
    let env = TestEnv::new("explain-two-retries").await?;
    let controller = env.own_controller_name("explain");
    let flavor = env.resource_flavor("default").await?.name_any();
    let short = env
        .admission_check("a-short", &controller)
        .await?
        .name_any();
    let long = env.admission_check("b-long", &controller).await?.name_any();
    env.queues_on(&flavor, "4", &[&short, &long]).await?;
    env.set_admission_check_active(&short, true).await?;
    env.set_admission_check_active(&long, true).await?;
    let wl = env.submit_job("job", "lq", "1").await?;
    env.wait_check_pending_with_quota(&wl, &short).await?;
    env.answer_check_with_delay(
        &wl,
        &short,
        CheckState::Retry,
        "license server down",
        Some(600),
    )
    .await?;
    let answered = env
        .answer_check_with_delay(&wl, &long, CheckState::Retry, "budget spent", Some(1800))
        .await?;
    let since = answered
        .admission_check(&long)
        .and_then(|e| e.last_transition_time.as_ref())
        .map(|t| t.0)
        .ok_or_else(|| anyhow::anyhow!("no lastTransitionTime"))?;
    let longest = since.checked_add(SignedDuration::from_secs(1800))?;
    // Kueue's own bookkeeping agrees: requeueAt moves to the longest delay's end.
    env.wait_workload(&wl, "requeueAt at the longer delay's end", |w| {
        w.requeue_at() == Some(longest)
    })
    .await?;

    let r = explain(&env, &wl).await?;
    let text = kueue_ac::render::text(&r);
    ensure!(r.checks.len() == 2 && r.checks[0].name == short, "{text}");
    for c in &r.checks {
        assert_eq!(c.state, CheckState::Retry, "{text}");
        assert_eq!(c.next_attempt_at, Some(longest), "{}: {text}", c.name);
        assert!(c.quota_held_until_retry, "{}: {text}", c.name);
    }
    assert!(r.checks[0].delay_ends_at < Some(longest), "{text}");
    assert!(
        r.advice.starts_with(&format!(
            "Check {short} answered Retry: license server down. Kueue keeps the quota until {} \
             (check {long}'s delay, the longest)",
            kueue_ac::report::format_time(longest)
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "Requeue: at {}",
            kueue_ac::report::format_time(longest)
        )),
        "{text}"
    );
    assert!(!text.contains("time(s), next at"), "{text}");
    Ok(())
}

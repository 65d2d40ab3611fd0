//! `kueue-ac explain` against the real Kueue: a Workload in each situation a user asks about
//! (no quota, a check pending, a delayed retry, a failed ProvisioningRequest, admitted,
//! rejected), each read through the CLI's own fetch and report, and asserted on what it tells.

use anyhow::{Result, ensure};
use e2e::provisioning::Provisioning;
use e2e::{GuardedQueue, TestEnv};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use kueue_ac::fetch::Target;
use kueue_ac::report::{Phase, Report, RequestReport, format_time};
use kueue_admission_sdk::api::{CheckState, Workload, workload_condition as cond};
use serde_json::json;

/// What `kueue-ac explain` reports on `target` (`job/NAME`, `workload/NAME` or a name) in the
/// test's namespace.
async fn explain(env: &TestEnv, target: &str) -> Result<Report> {
    let target: Target = target.parse().map_err(|e: String| anyhow::anyhow!(e))?;
    Ok(kueue_ac::explain(&env.client, &env.ns, &target).await?)
}

/// The report as a user reads it: the failure message of every assertion on a report.
fn text(r: &Report) -> String {
    kueue_ac::render::text(r)
}

/// A test's queues guarded by an active check `gate` that the test answers itself.
async fn gated(test: &str) -> Result<(TestEnv, GuardedQueue)> {
    let env = TestEnv::new(test).await?;
    let controller = env.own_controller_name("explain");
    let q = env.guarded_queue("gate", &controller, "4").await?;
    env.set_admission_check_active(&q.check, true).await?;
    Ok((env, q))
}

/// A ClusterQueue (4 cpu, LocalQueue `lq`) guarded by two active checks the test answers;
/// returns their names.
async fn gated_twice(env: &TestEnv, [a, b]: [&str; 2]) -> Result<[String; 2]> {
    let controller = env.own_controller_name("explain");
    let flavor = env.resource_flavor("default").await?.name_any();
    let a = env.admission_check(a, &controller).await?.name_any();
    let b = env.admission_check(b, &controller).await?.name_any();
    env.queues_on(&flavor, "4", &[&a, &b]).await?;
    env.set_admission_check_active(&a, true).await?;
    env.set_admission_check_active(&b, true).await?;
    Ok([a, b])
}

/// Submits the Jobs (one pod of 1 cpu each, LocalQueue `lq`), then waits until each Workload
/// holds quota with the check asked; returns the Workloads' names.
async fn asked<const N: usize>(env: &TestEnv, jobs: [&str; N], check: &str) -> Result<[String; N]> {
    let mut names = Vec::new();
    for job in jobs {
        names.push(env.submit_job(job, "lq", "1").await?);
    }
    for wl in &names {
        env.wait_check_pending_with_quota(wl, check).await?;
    }
    names
        .try_into()
        .map_err(|_| anyhow::anyhow!("one name per job"))
}

/// The check answers `state`; waits until Kueue has acted on it (deactivated the Workload on
/// `Rejected`, admitted it otherwise) and returns what `explain` says then.
async fn explained_after(
    env: &TestEnv,
    wl: &str,
    check: &str,
    state: CheckState,
    message: &str,
) -> Result<Report> {
    env.answer_check(wl, check, state, message).await?;
    if state == CheckState::Rejected {
        env.wait_deactivated(wl).await?;
    } else {
        env.wait_admitted(wl).await?;
    }
    explain(env, wl).await
}

/// The check answers `Retry` with a delay of `secs`; returns the Workload as written.
async fn retry_after(
    env: &TestEnv,
    wl: &str,
    check: &str,
    message: &str,
    secs: i32,
) -> Result<Workload> {
    env.answer_check_with_delay(wl, check, CheckState::Retry, message, Some(secs))
        .await
}

/// When a delay of `secs` from `since` (an entry's lastTransitionTime) ends.
fn delay_end(since: Option<Timestamp>, secs: i64) -> Result<Timestamp> {
    let since = since.ok_or_else(|| anyhow::anyhow!("no lastTransitionTime"))?;
    Ok(since.checked_add(SignedDuration::from_secs(secs))?)
}

/// When the check's entry last changed state (its lastTransitionTime).
fn entry_since(wl: &Workload, check: &str) -> Option<Timestamp> {
    wl.admission_check(check)
        .and_then(|e| e.last_transition_time.as_ref())
        .map(|t| t.0)
}

/// Waits until the check's entry is `state` (`what` says which answer).
async fn entry_in(
    env: &TestEnv,
    wl: &str,
    check: &str,
    state: CheckState,
    what: &str,
) -> Result<()> {
    env.wait_workload(wl, what, |wl| {
        wl.admission_check(check).is_some_and(|e| e.state == state)
    })
    .await?;
    Ok(())
}

/// The provisioning check (its queues of 4 cpu, its controller and the autoscaler simulator)
/// with a long backoff (limit 2, from 600 s): a Retry holds the quota long enough to look at it.
async fn provisioning_with_long_backoff(
    env: &TestEnv,
) -> Result<(Provisioning, e2e::Running, e2e::Running)> {
    let spec = json!({"retryStrategy": {
        "backoffLimitCount": 2, "backoffBaseSeconds": 600, "backoffMaxSeconds": 1200,
    }});
    let p = env.provisioning(spec, "4").await?;
    let controller = env.start_provisioning_controller(None)?;
    let simulator = env.start_simulator()?;
    Ok((p, controller, simulator))
}

/// Waits until Kueue's `requeueAt` for the Workload is `at`.
async fn requeue_at(env: &TestEnv, wl: &str, at: Timestamp, what: &str) -> Result<()> {
    env.wait_workload(wl, what, |w| w.requeue_at() == Some(at))
        .await?;
    Ok(())
}

/// Whether the report says the Workload holds quota of `flavor`.
fn holds_quota_of(r: &Report, flavor: &str) -> bool {
    r.quota.reserved
        && r.quota
            .flavors
            .values()
            .any(|f| f.values().any(|v| *v == flavor))
}

/// Whether the request's outcome is `Failed=True` with the simulator's words.
fn failed_for_want_of_capacity(request: &RequestReport) -> bool {
    request
        .outcome
        .as_deref()
        .is_some_and(|o| o.starts_with("Failed=True") && o.contains("simulated: no capacity"))
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
        text(&r)
    );
    Ok(())
}

#[tokio::test]
async fn a_pending_then_retried_then_admitted_workload() -> Result<()> {
    let (env, q) = gated("explain-check").await?;
    let [wl] = asked(&env, ["job"], &q.check).await?;

    let r = explain(&env, &wl).await?;
    assert_eq!(r.phase, Phase::WaitingForChecks);
    assert!(holds_quota_of(&r, &q.flavor));
    assert_eq!(r.checks.len(), 1);
    let c = &r.checks[0];
    assert_eq!((c.state, c.attempt), (CheckState::Pending, 1));
    assert_eq!(c.active, Some(true));
    let (check, controller) = (&q.check, &q.controller_name);
    let waiting = format!("Waiting for check {check} (controller {controller}): no answer yet");
    assert_eq!(r.advice, waiting);

    // A Retry with a delay: Kueue holds the quota until the delay ends.
    retry_after(&env, &wl, &q.check, "license server down", 600).await?;
    let r = explain(&env, &wl).await?;
    let c = &r.checks[0];
    ensure!(c.state == CheckState::Retry, "{}", text(&r));
    assert_eq!(c.next_attempt_at, Some(delay_end(c.since, 600)?));
    assert!(c.quota_held_until_retry, "{}", text(&r));
    let retried =
        format!("Check {check} answered Retry: license server down. Kueue keeps the quota until ");
    assert!(r.advice.starts_with(&retried), "{}", r.advice);
    let text = text(&r);
    assert!(text.contains("quota held until then"), "{text}");
    Ok(())
}

#[tokio::test]
async fn admitted_and_rejected_workloads_say_so() -> Result<()> {
    let (env, q) = gated("explain-ends").await?;
    let [ok, no] = asked(&env, ["ok", "no"], &q.check).await?;
    let r = explained_after(&env, &ok, &q.check, CheckState::Ready, "fine").await?;
    assert_eq!(r.phase, Phase::Admitted);
    let cq = &q.cluster_queue;
    let admitted = format!("Admitted on ClusterQueue {cq}: its pods may start.");
    assert_eq!(r.advice, admitted);

    let refusal = "needs 4 licenses, the pool has 2";
    let r = explained_after(&env, &no, &q.check, CheckState::Rejected, refusal).await?;
    assert_eq!(r.phase, Phase::Deactivated);
    // Kueue may have reset the entry after the deactivation; the advice names the check either
    // way, from the entry or from Kueue's deactivation message, and what brings it back:
    // not spec.active: true (Kueue does not requeue a Workload a check deactivated), but a
    // resubmitted Job or `kueue-ac reactivate` (tests/e2e/tests/reactivate.rs runs it).
    let reactivate = format!("kueue-ac reactivate -n {} workload/{no}", env.ns);
    let says = |words: &str| r.advice.contains(words);
    let not_enough = "Setting spec.active: true is not enough";
    let names_the_ways_back = says(&q.check) && says(not_enough) && says(&reactivate);
    assert!(names_the_ways_back, "{}", text(&r));
    // The JSON form carries the same report.
    let json = serde_json::to_value(&r)?;
    assert_eq!(json["phase"], json!("deactivated"));
    assert_eq!(json["checks"][0]["name"], json!(q.check));
    Ok(())
}

#[tokio::test]
async fn a_failed_provisioning_request_is_shown_with_the_autoscalers_words() -> Result<()> {
    let env = TestEnv::new("explain-prov").await?;
    let (p, _controller, _simulator) = provisioning_with_long_backoff(&env).await?;
    let wl = env.job_with_script("job", "fail,provision").await?;
    let retried = "the provisioning check answers Retry";
    entry_in(&env, &wl, &p.check, CheckState::Retry, retried).await?;
    // The Event comes beside the write (the SDK publishes Events off the reconcile).
    env.wait_event_count(&wl, "CheckRetry", 1).await?;

    let r = explain(&env, "job").await?;
    let text = text(&r);
    let c = &r.checks[0];
    assert_eq!((c.attempt, c.retry_limit), (1, Some(2)), "{text}");
    assert!(c.quota_held_until_retry, "{text}");
    ensure!(r.provisioning_requests.len() == 1, "{text}");
    let request = &r.provisioning_requests[0];
    assert_eq!(request.check.as_deref(), Some(p.check.as_str()), "{text}");
    assert!(failed_for_want_of_capacity(request), "{text}");
    assert!(!r.pod_templates.is_empty(), "{text}");
    let advice = format!("Check {} answered Retry: ProvisioningRequest", p.check);
    let words = r.advice.contains("simulated: no capacity");
    assert!(r.advice.starts_with(&advice) && words, "{text}");
    // The controller's Events are in the report too.
    let retry = |reason: &str| reason == "CheckRetry" || reason.contains("Retry");
    assert!(r.events.iter().any(|e| retry(&e.reason)), "{text}");
    Ok(())
}

/// Two checks answer `Retry` with delays of different lengths, the first entry with the shorter:
/// Kueue keeps the quota until the longer one ends, and so does the report (it used to take the
/// first entry's).
#[tokio::test]
async fn two_delayed_retries_hold_the_quota_until_the_longer_one_ends() -> Result<()> {
    let env = TestEnv::new("explain-two-retries").await?;
    let [short, long] = gated_twice(&env, ["a-short", "b-long"]).await?;
    let [wl] = asked(&env, ["job"], &short).await?;
    retry_after(&env, &wl, &short, "license server down", 600).await?;
    let answered = retry_after(&env, &wl, &long, "budget spent", 1800).await?;
    let longest = delay_end(entry_since(&answered, &long), 1800)?;
    // Kueue's own bookkeeping agrees: requeueAt moves to the longest delay's end.
    requeue_at(&env, &wl, longest, "requeueAt at the longer delay's end").await?;

    let r = explain(&env, &wl).await?;
    let text = text(&r);
    ensure!(r.checks.len() == 2 && r.checks[0].name == short, "{text}");
    for c in &r.checks {
        assert_eq!(c.state, CheckState::Retry, "{text}");
        assert_eq!(c.next_attempt_at, Some(longest), "{}: {text}", c.name);
        assert!(c.quota_held_until_retry, "{}: {text}", c.name);
    }
    assert!(r.checks[0].delay_ends_at < Some(longest), "{text}");
    let until = format_time(longest);
    let advice = format!(
        "Check {short} answered Retry: license server down. Kueue keeps the quota until {until} \
         (check {long}'s delay, the longest)"
    );
    assert!(r.advice.starts_with(&advice), "{text}");
    assert!(text.contains(&format!("Requeue: at {until}")), "{text}");
    assert!(!text.contains("time(s), next at"), "{text}");
    Ok(())
}

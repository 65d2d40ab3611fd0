//! Bringing back a Workload a check rejected, against the real Kueue: `spec.active: true` alone
//! does not (pinned in `kueue_contract::a_workload_a_check_rejected_is_not_queued_again_by_spec_active_true`);
//! what `kueue-ac explain` advises instead does: `kueue-ac reactivate` (with or without the
//! spent retries) and resubmitting the Job.

use anyhow::{Result, ensure};
use std::sync::Arc;

use e2e::probe::{Probe, ProbeScript};
use e2e::{GuardedQueue, TestEnv};
use kube::ResourceExt;
use kube::api::DeleteParams;
use kueue_ac::fetch::Target;
use kueue_ac::report::{Phase, Report};
use kueue_admission_sdk::api::{Workload, workload_condition as cond};
use kueue_admission_sdk::retry::Backoff;
use kueue_admission_sdk::{Decision, RetryPolicy};

/// Waits until Kueue has deactivated the Workload, evicted it and released its quota.
async fn deactivated(env: &TestEnv, wl: &str) -> Result<Workload> {
    env.wait_workload(wl, "deactivated, evicted, quota released", |w| {
        !w.is_active()
            && w.condition_is_true(cond::EVICTED)
            && !w.condition_is_true(cond::QUOTA_RESERVED)
            && w.condition(cond::REQUEUED)
                .is_some_and(|c| c.status == "False")
    })
    .await
}

/// The CLI's target for the Workload `wl`.
fn target(wl: &str) -> Result<Target> {
    format!("workload/{wl}")
        .parse()
        .map_err(|e: String| anyhow::anyhow!(e))
}

/// One test's queue guarded by a check that a probe answers from `script` with `policy`,
/// answering the Job `job` with `first` until told otherwise.
struct Probed {
    q: GuardedQueue,
    script: Arc<ProbeScript>,
    _probe: e2e::Running,
}

/// The queue (4 cpu) and its check's probe, the controller named after `prefix` and the test.
async fn probed(
    env: &TestEnv,
    prefix: &str,
    first: Decision,
    policy: RetryPolicy,
) -> Result<Probed> {
    let q = env
        .guarded_queue("check", &env.own_controller_name(prefix), "4")
        .await?;
    let script = ProbeScript::new();
    script.answer("job", first);
    let probe = Probe::new(&q.controller_name, script.clone())
        .policy(policy)
        .run(env, env.client.clone(), |c| c);
    Ok(Probed {
        q,
        script,
        _probe: probe,
    })
}

/// One retry, at once: the second attempt is past the limit.
fn one_immediate_retry() -> RetryPolicy {
    RetryPolicy {
        backoff: Backoff::Immediate,
        retry_limit: Some(1),
    }
}

/// Fails unless the attempts the probe was asked about for `job` end with `last`.
fn last_attempts_were(script: &ProbeScript, last: &[u32]) -> Result<()> {
    let attempts: Vec<u32> = script.calls_for("job").iter().map(|(_, a)| *a).collect();
    ensure!(attempts.ends_with(last), "{attempts:?}");
    Ok(())
}

/// What `kueue-ac explain` reports on the Workload, and the report as text.
async fn explained(env: &TestEnv, wl: &str) -> Result<(Report, String)> {
    let report = kueue_ac::explain(&env.client, &env.ns, &target(wl)?).await?;
    let text = kueue_ac::render::text(&report);
    Ok((report, text))
}

/// Runs `kueue-ac reactivate` on the Workload, keeping its spent retries or not, and asserts
/// that what it says it did contains `expected`.
async fn reactivate_saying(
    env: &TestEnv,
    wl: &str,
    keep_retries: bool,
    expected: &str,
) -> Result<()> {
    let said = kueue_ac::reactivate(&env.client, &env.ns, &target(wl)?, keep_retries).await?;
    assert!(said.contains(expected), "{said}");
    Ok(())
}

/// Asserts that `kueue-ac reactivate` refuses a Workload that holds quota: nothing to do.
async fn assert_reactivate_refused_while_it_holds_quota(env: &TestEnv, wl: &str) -> Result<()> {
    let again = kueue_ac::reactivate(&env.client, &env.ns, &target(wl)?, false).await;
    assert!(
        matches!(&again, Err(kueue_ac::Error::Refused(m)) if m.contains("holds quota")),
        "{again:?}"
    );
    Ok(())
}

/// Waits until a reactivated Workload was deactivated again (its second deactivation's
/// eviction counted) and Kueue has released its quota.
async fn deactivated_again(env: &TestEnv, wl: &str) -> Result<Workload> {
    env.wait_workload(wl, "active again and evicted a second time", |w| {
        w.evictions("Deactivated") == 2 && !w.is_active()
    })
    .await?;
    deactivated(env, wl).await
}

/// Whether the Workload's `Requeued` condition is `True` with reason `Reactivated`.
fn requeued_as_reactivated(wl: &Workload) -> bool {
    wl.condition(cond::REQUEUED)
        .is_some_and(|c| c.status == "True" && c.reason == "Reactivated")
}

/// Deletes the Job and waits until it is gone.
async fn delete_job(env: &TestEnv, job: &str) -> Result<()> {
    env.jobs().delete(job, &DeleteParams::background()).await?;
    e2e::wait_gone(env.jobs(), job).await
}

#[tokio::test]
async fn kueue_ac_reactivate_queues_a_rejected_workload_again_with_or_without_its_retries()
-> Result<()> {
    let env = TestEnv::new("reactivate").await?;
    let retry = Decision::retry("no capacity");
    let p = probed(&env, "reactivate", retry, one_immediate_retry()).await?;
    let wl = env.submit_job("job", "lq", "1").await?;
    // Attempt 1 retries, attempt 2 is past the limit: Rejected, deactivated.
    deactivated(&env, &wl).await?;
    last_attempts_were(&p.script, &[1, 2])?;

    // What explain advises.
    let (report, text) = explained(&env, &wl).await?;
    let command = format!("kueue-ac reactivate -n {} workload/{wl}", env.ns);
    let advises = report.advice.contains(&command);
    assert!(report.phase == Phase::Deactivated && advises, "{text}");

    // With the spent retries kept, the attempt record still counts them: the next Retry is
    // past the limit at once.
    let requeued = "DeactivatedDueToAdmissionCheck -> Deactivated";
    reactivate_saying(&env, &wl, true, requeued).await?;
    deactivated_again(&env, &wl).await?;
    last_attempts_were(&p.script, &[2])?;

    // Without them (the default), attempt 1 again, now answered Ready.
    p.script.answer("job", Decision::ready("granted"));
    reactivate_saying(&env, &wl, false, "attempt records removed").await?;
    let (admitted, _) = env.wait_admitted_ready(&wl, &p.q.check).await?;
    last_attempts_were(&p.script, &[1])?;
    let reactivated = requeued_as_reactivated(&admitted);
    assert!(reactivated, "{}", e2e::dump(&admitted));
    // Nothing left to do for it.
    assert_reactivate_refused_while_it_holds_quota(&env, &wl).await?;
    Ok(())
}

#[tokio::test]
async fn resubmitting_the_job_of_a_rejected_workload_admits_a_fresh_one() -> Result<()> {
    let env = TestEnv::new("resubmit").await?;
    let rejected = Decision::rejected("needs 4 licenses, the pool has 2");
    let p = probed(&env, "resubmit", rejected, RetryPolicy::default()).await?;
    let first = env.submit_job("job", "lq", "1").await?;
    let old = deactivated(&env, &first).await?;

    p.script.answer("job", Decision::ready("granted"));
    delete_job(&env, "job").await?;
    let fresh = env.submit_job("job", "lq", "1").await?;
    let (admitted, _) = env.wait_admitted_ready(&fresh, &p.q.check).await?;
    assert_ne!(admitted.uid(), old.uid(), "a new Workload");
    let calls = p.script.calls_for("job");
    assert_eq!(calls.last().map(|(_, a)| *a), Some(1), "{calls:?}");
    Ok(())
}

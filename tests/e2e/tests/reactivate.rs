//! Bringing back a Workload a check rejected, against the real Kueue: `spec.active: true` alone
//! does not (pinned in `kueue_contract::a_workload_a_check_rejected_is_not_queued_again_by_spec_active_true`);
//! what `kueue-ac explain` advises instead does: `kueue-ac reactivate` (with or without the
//! spent retries) and resubmitting the Job.

use anyhow::{Result, ensure};
use e2e::TestEnv;
use e2e::probe::{Probe, ProbeScript};
use kube::ResourceExt;
use kube::api::DeleteParams;
use kueue_ac::fetch::Target;
use kueue_ac::report::Phase;
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

fn target(wl: &str) -> Result<Target> {
    format!("workload/{wl}")
        .parse()
        .map_err(|e: String| anyhow::anyhow!(e))
}

#[tokio::test]
async fn kueue_ac_reactivate_queues_a_rejected_workload_again_with_or_without_its_retries()
-> Result<()> {
    let env = TestEnv::new("reactivate").await?;
    let q = env
        .guarded_queue("check", &env.own_controller_name("reactivate"), "4")
        .await?;
    let script = ProbeScript::new();
    script.answer("job", Decision::retry("no capacity"));
    let policy = RetryPolicy {
        backoff: Backoff::Immediate,
        retry_limit: Some(1),
    };
    let _probe = Probe::new(&q.controller_name, script.clone())
        .policy(policy)
        .run(&env, env.client.clone(), |c| c);
    let wl = env.submit_job("job", "lq", "1").await?;
    // Attempt 1 retries, attempt 2 is past the limit: Rejected, deactivated.
    deactivated(&env, &wl).await?;
    let attempts = |script: &ProbeScript| -> Vec<u32> {
        script.calls_for("job").iter().map(|(_, a)| *a).collect()
    };
    ensure!(
        attempts(&script).ends_with(&[1, 2]),
        "{:?}",
        attempts(&script)
    );

    // What explain advises.
    let report = kueue_ac::explain(&env.client, &env.ns, &target(&wl)?).await?;
    let command = format!("kueue-ac reactivate -n {} workload/{wl}", env.ns);
    assert!(
        report.phase == Phase::Deactivated && report.advice.contains(&command),
        "{}",
        kueue_ac::render::text(&report)
    );

    // With the spent retries kept, the attempt record still counts them: the next Retry is
    // past the limit at once.
    let said = kueue_ac::reactivate(&env.client, &env.ns, &target(&wl)?, true).await?;
    assert!(
        said.contains("DeactivatedDueToAdmissionCheck -> Deactivated"),
        "{said}"
    );
    env.wait_workload(&wl, "active again and evicted a second time", |w| {
        w.evictions("Deactivated") == 2 && !w.is_active()
    })
    .await?;
    deactivated(&env, &wl).await?;
    ensure!(attempts(&script).ends_with(&[2]), "{:?}", attempts(&script));

    // Without them (the default), attempt 1 again, now answered Ready.
    script.answer("job", Decision::ready("granted"));
    let said = kueue_ac::reactivate(&env.client, &env.ns, &target(&wl)?, false).await?;
    assert!(said.contains("attempt records removed"), "{said}");
    let (admitted, _) = env.wait_admitted_ready(&wl, &q.check).await?;
    ensure!(attempts(&script).ends_with(&[1]), "{:?}", attempts(&script));
    assert!(
        admitted
            .condition(cond::REQUEUED)
            .is_some_and(|c| c.status == "True" && c.reason == "Reactivated"),
        "{}",
        e2e::dump(&admitted)
    );
    // Nothing left to do for it.
    let again = kueue_ac::reactivate(&env.client, &env.ns, &target(&wl)?, false).await;
    assert!(
        matches!(&again, Err(kueue_ac::Error::Refused(m)) if m.contains("holds quota")),
        "{again:?}"
    );
    Ok(())
}

#[tokio::test]
async fn resubmitting_the_job_of_a_rejected_workload_admits_a_fresh_one() -> Result<()> {
    let env = TestEnv::new("resubmit").await?;
    let q = env
        .guarded_queue("check", &env.own_controller_name("resubmit"), "4")
        .await?;
    let script = ProbeScript::new();
    script.answer(
        "job",
        Decision::rejected("needs 4 licenses, the pool has 2"),
    );
    let _probe =
        Probe::new(&q.controller_name, script.clone()).run(&env, env.client.clone(), |c| c);
    let first = env.submit_job("job", "lq", "1").await?;
    let old = deactivated(&env, &first).await?;

    script.answer("job", Decision::ready("granted"));
    env.jobs()
        .delete("job", &DeleteParams::background())
        .await?;
    e2e::wait_gone(env.jobs(), "job").await?;
    let fresh = env.submit_job("job", "lq", "1").await?;
    let (admitted, _) = env.wait_admitted_ready(&fresh, &q.check).await?;
    assert_ne!(admitted.uid(), old.uid(), "a new Workload");
    let calls = script.calls_for("job");
    assert_eq!(calls.last().map(|(_, a)| *a), Some(1), "{calls:?}");
    Ok(())
}

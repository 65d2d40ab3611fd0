//! How many API requests the provisioning controller makes per admitted Workload, read from the
//! API server's audit log: the controller runs as the chart's ServiceAccount (whose requests
//! the control plane audits), Workloads are admitted through it, and every request of that
//! user is counted, start-up lists and watches included. A regression of the requests per
//! Workload fails here (the smoke of the performance issue; `docs/benchmark.md`).

use std::collections::BTreeMap;

use anyhow::Result;
use e2e::TestEnv;
use e2e::chart;
use e2e::provisioning::Provisioning;
use serde_json::json;

/// Workloads admitted in the run: enough that the controller's fixed start-up requests
/// (lists and watches) weigh little per Workload.
const WORKLOADS: usize = 30;

/// The most requests per admitted Workload the test accepts. On the provisioning path the
/// controller itself sends a PodTemplate create and a request create (the template's owner, its
/// Workload, is in the create); the SDK adds the status writes (Pending, Ready), an Event, and
/// now and then a 409 with a fresh read before its retry. Measured at 7.3 with start-up
/// included (`docs/benchmark.md`); reading flavors or requests from the API server on every
/// decision again would add 2 or more, an owner patch per template 1.
const MAX_PER_WORKLOAD: f64 = 9.0;

#[tokio::test]
async fn an_admitted_workload_costs_few_api_requests() -> Result<()> {
    let env = TestEnv::new("prov-request-budget").await?;
    let p = env.provisioning(json!({}), "40").await?;
    let (service_account, controller) = controller_as_chart_account(&env, &p).await?;
    let simulator = env.start_simulator()?;
    controller.wait_ready().await?;

    admit_jobs(&env, WORKLOADS).await?;
    e2e::Running::stop_all([controller, simulator]).await?;

    let (total, by_call) = audited_calls(&env, &service_account)?;
    let per_workload = total as f64 / WORKLOADS as f64;
    println!("{total} requests for {WORKLOADS} Workloads, {per_workload:.2} each:");
    for (call, n) in &by_call {
        println!("  {n:>4}  {call}");
    }
    assert!(
        per_workload <= MAX_PER_WORKLOAD,
        "{per_workload:.2} requests per admitted Workload, more than {MAX_PER_WORKLOAD}: {by_call:#?}"
    );
    Ok(())
}

/// The chart's ServiceAccount for this test's controller, and the controller started as it:
/// the user whose requests the control plane audits.
async fn controller_as_chart_account(
    env: &TestEnv,
    p: &Provisioning,
) -> Result<(String, e2e::Running)> {
    let service_account = chart::provisioning_service_account(
        &env.client,
        &env.ns,
        &p.controller_name,
        "e2e-request-budget",
    )
    .await?;
    let client = e2e::service_account_client(&env.ns, &service_account).await?;
    let controller = env.start_provisioning_controller_as(client, None)?;
    Ok((service_account, controller))
}

/// Submits `count` Jobs the simulator provisions, then waits until every one is admitted.
async fn admit_jobs(env: &TestEnv, count: usize) -> Result<()> {
    let mut workloads = Vec::new();
    for i in 0..count {
        workloads.push(
            env.job_with_script(&format!("job-{i}"), "provision")
                .await?,
        );
    }
    for wl in &workloads {
        env.wait_admitted(wl).await?;
    }
    Ok(())
}

/// Every audited request of the ServiceAccount: how many in all, and how many of each call
/// (verb, resource, group and response code).
fn audited_calls(env: &TestEnv, service_account: &str) -> Result<(usize, BTreeMap<String, usize>)> {
    let user = format!("system:serviceaccount:{}:{service_account}", env.ns);
    let requests = e2e::audited_requests(&user)?;
    let mut by_call: BTreeMap<String, usize> = BTreeMap::new();
    for r in &requests {
        let call = format!(
            "{} {} ({}) {}",
            r.verb,
            r.resource,
            e2e::group_name(&r.group),
            r.code
        );
        *by_call.entry(call).or_default() += 1;
    }
    Ok((requests.len(), by_call))
}

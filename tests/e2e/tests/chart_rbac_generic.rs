//! The generic chart (charts/kueue-admission-check) under the API server's real RBAC, deployed
//! for the budget example as its CI values file does (`ci/budget-check-values.yaml`): the
//! ServiceAccount, ClusterRole, Role and bindings are rendered and applied as they are, and the
//! budget check runs in-process as the rendered Deployment runs it (its container's arguments,
//! leader election on the Lease the Role names, a token of the ServiceAccount).
//!
//! Sufficient: the check goes `Active`, charges and admits a Job, settles the charge when the
//! Workload goes, hands the Lease back, and the API server's audit log shows not one request of
//! the ServiceAccount refused. Minimal: the same log shows every verb the chart grants used
//! successfully at least once, or the verb is in [`UNUSED_HERE`] with the reason.

use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};
use clap::Parser;
use e2e::TestEnv;
use e2e::chart::{self, Grant};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kueue_admission_sdk::api::{AdmissionCheck, CheckState};
use kueue_admission_sdk::{Options, RuntimeConfig};
use serde_json::Value;

const CHART: &str = "charts/kueue-admission-check";
const FIELD_MANAGER: &str = "e2e-chart-rbac-generic";

/// Granted by the chart but not exercised by this scenario, with the reason.
const UNUSED_HERE: &[(&str, &str, &str, &str)] = &[(
    "events.k8s.io",
    "events",
    "patch",
    "an Event repeated within its series window is patched; this scenario repeats none \
         (the provisioning chart's proof has a step that does)",
)];

/// The budget example's command line, as its binary parses it (the flags this test needs).
#[derive(Debug, Parser)]
struct BudgetArgs {
    #[arg(long)]
    controller_name: String,
    #[arg(long)]
    namespace: String,
    #[arg(long)]
    budgets_configmap: String,
    #[arg(long)]
    prices: String,
    #[command(flatten)]
    runtime: Options,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_generic_chart_runs_the_budget_example_with_exactly_the_rules_it_needs() -> Result<()> {
    let env = TestEnv::new("chart-kac-budget").await?;
    let controller_name = env.own_controller_name("kac");
    let (objects, service_account, granted) = chart_applied(&env, &controller_name).await?;
    // The Deployment's arguments, with what Kubernetes would expand in the pod.
    let parsed = deployment_args(&objects, &env.ns)?;
    ensure!(parsed.controller_name == controller_name);
    let (runtime, lease) = runtime_of(&parsed)?;

    // What the operator provides: a budget for the namespace, a queue guarded by the check.
    env.put_config_map(&parsed.budgets_configmap, &[(&env.ns, "10/day")])
        .await?;
    let queue = env.guarded_queue("budget", &controller_name, "4").await?;
    let controller = start_as(&env, &service_account, &parsed, runtime).await?;
    let outcome = charge_refuse_and_settle(&env, &queue.check, &lease).await;
    // Scraped as Prometheus does, with a token: the check has it reviewed (tokenreviews and
    // subjectaccessreviews create) before it answers with the metrics.
    let scraped = controller.metrics().await;
    let stopped = controller.stop().await;
    outcome?;
    stopped.context("stopping the controller")?;
    let scraped = scraped.context("scraping the check's authenticated /metrics")?;
    ensure!(
        e2e::metric_sample(&scraped, "kueue_ac_leader") == Some(1.0),
        "the scraped metrics do not show the leader:\n{scraped}"
    );

    // Read after the stop, so the Lease's release is in the log too.
    let (user, requests) = chart::requests_of(&env, &service_account)?;
    let refused = chart::refused(&requests);
    let not_enough = "the chart's rules are not enough; the API server refused";
    ensure!(refused.is_empty(), "{not_enough}: {}", refused.join("; "));
    let (used_by_grant, unused) = chart::uses_per_grant(&granted, &requests, UNUSED_HERE);
    let count = requests.len();
    println!("{count} requests of {user}, none refused; uses per grant: {used_by_grant:#?}");
    ensure!(unused.is_empty(), "{}", unused.join("\n"));
    Ok(())
}

/// The chart rendered for the budget example ([`render_for_budget`]) with its ServiceAccount
/// and RBAC applied and in force ([`chart::apply_rbac`]); returns the rendered objects, the
/// ServiceAccount's name and what its roles grant.
async fn chart_applied(
    env: &TestEnv,
    controller_name: &str,
) -> Result<(Vec<Value>, String, Vec<Grant>)> {
    let objects = render_for_budget(env, controller_name)?;
    let (service_account, granted) =
        chart::apply_rbac(&env.client, &env.ns, &objects, FIELD_MANAGER, &[]).await?;
    Ok((objects, service_account, granted))
}

/// The generic chart rendered as a release in the test's namespace with the budget example's
/// CI values and this `controller_name`.
fn render_for_budget(env: &TestEnv, controller_name: &str) -> Result<Vec<Value>> {
    let values = chart::repo_root()
        .join(CHART)
        .join("ci/budget-check-values.yaml");
    let set = format!("controllerName={controller_name}");
    chart::render(
        CHART,
        &env.ns,
        &env.ns,
        &[
            "-f",
            values.to_str().context("a UTF-8 path")?,
            "--set-string",
            &set,
        ],
    )
}

/// The rendered Deployment's container arguments, with `$(POD_NAMESPACE)` expanded to
/// `namespace` as in the pod, parsed as the budget example's binary parses them.
fn deployment_args(objects: &[Value], namespace: &str) -> Result<BudgetArgs> {
    let args = chart::container_args(objects, namespace)?;
    BudgetArgs::try_parse_from(std::iter::once("budget-check".to_string()).chain(args.clone()))
        .map_err(|e| anyhow!("the Deployment's args {args:?} do not parse: {e}"))
}

/// The runtime settings the arguments give (metrics on a free local port: the container's is
/// a fixed one), and the Lease its leader election holds.
fn runtime_of(parsed: &BudgetArgs) -> Result<(RuntimeConfig, String)> {
    let mut runtime = parsed
        .runtime
        .runtime_config(&parsed.controller_name, &parsed.namespace);
    // The container's port is a fixed one; in this process any free one does.
    let (metrics, health) = e2e::free_local_addresses()?;
    runtime.metrics_address = Some(metrics);
    runtime.health_address = Some(health);
    let lease = runtime
        .leader_election
        .as_ref()
        .map(|e| e.lease_name.clone())
        .context("the chart enables leader election")?;
    Ok((runtime, lease))
}

/// The budget check as the arguments configure it: their prices, the default hour, a budget
/// recheck every second, no sweep during the test.
fn budget_check_of(parsed: &BudgetArgs) -> Result<budget_check::BudgetCheck> {
    Ok(budget_check::BudgetCheck::new(
        budget_check::Settings {
            controller_name: parsed.controller_name.clone(),
            prices: parsed.prices.parse().map_err(|e: String| anyhow!(e))?,
            default_runtime: Duration::from_secs(3600),
            budget_recheck: Duration::from_secs(1),
            max_wait: None,
            sweep_interval: Duration::from_secs(3600),
        },
        budget_check::ConfigMapBackend {
            namespace: parsed.namespace.clone(),
            budgets: parsed.budgets_configmap.clone(),
            ledger_prefix: budget_check::DEFAULT_LEDGER_PREFIX.into(),
        },
    ))
}

/// Starts the budget check as the arguments configure it ([`budget_check_of`]), with the
/// runtime settings they give, on a token of the chart's ServiceAccount.
async fn start_as(
    env: &TestEnv,
    service_account: &str,
    parsed: &BudgetArgs,
    runtime: RuntimeConfig,
) -> Result<e2e::Running> {
    let client = e2e::service_account_client(&env.ns, service_account).await?;
    Ok(e2e::Running::check(
        client,
        budget_check_of(parsed)?,
        runtime,
    ))
}

/// What the running check is made to do, so that it uses what the chart grants: it takes the
/// Lease and goes `Active`, charges and admits a Job, makes an over-budget one retry, and
/// settles the first one's charge once its Workload is gone.
async fn charge_refuse_and_settle(env: &TestEnv, check: &str, lease: &str) -> Result<()> {
    lease_held(env, lease).await?;
    e2e::wait_for(
        Api::<AdmissionCheck>::all(env.client.clone()),
        check,
        "Active=True",
        |ac: &AdmissionCheck| ac.active_condition().is_some_and(|c| c.status == "True"),
    )
    .await?;
    // 1 core for the default hour at 1 credit per core-hour: within 10/day.
    let wl = env.admitted_job("job").await?;
    ledger_with_charge(env, true, "a charge").await?;
    // 1 core for 10 hours does not fit the 9 credits left: before making it wait the check
    // reads the first Workload to settle what ended unnoticed (get), and its Retry is
    // counted on the Workload first (patch).
    over_budget_retries(env, check).await?;
    // Gone without finishing (no pods run here): the charge is settled.
    env.delete_workload(&wl).await?;
    ledger_with_charge(env, false, "the charge settled").await?;
    Ok(())
}

/// Waits until the Lease has a holder.
async fn lease_held(env: &TestEnv, lease: &str) -> Result<()> {
    env.wait_lease_holder(lease, "a holder", |h| h.is_some())
        .await?;
    Ok(())
}

/// Waits until the namespace's ledger has an open charge (`charged`) or none (`what` says
/// which moment).
async fn ledger_with_charge(env: &TestEnv, charged: bool, what: &str) -> Result<ConfigMap> {
    let budgets = env.config_maps();
    let ledger_name = format!("budget-ledger-{}", env.ns);
    e2e::wait_for(budgets, &ledger_name, what, |cm: &ConfigMap| {
        cm.data
            .as_ref()
            .is_some_and(|d| d.keys().any(|k| k.starts_with("charge.")) == charged)
    })
    .await
}

/// Submits the Job `big` (1 core for 10 hours) and waits until the check answers it `Retry`.
async fn over_budget_retries(env: &TestEnv, check: &str) -> Result<()> {
    let labels = [("kueue.x-k8s.io/max-exec-time-seconds", "36000")];
    let big = env
        .submit(&e2e::SuspendedJob {
            labels: &labels,
            ..e2e::SuspendedJob::new("big", "lq", "1")
        })
        .await?;
    env.wait_workload(&big, "over budget: Retry", |w| {
        w.admission_check(check)
            .is_some_and(|e| e.state == CheckState::Retry)
    })
    .await?;
    Ok(())
}

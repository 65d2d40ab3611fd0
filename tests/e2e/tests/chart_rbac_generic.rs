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

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};
use clap::Parser;
use e2e::TestEnv;
use e2e::chart::{self};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kueue_admission_sdk::Options;
use kueue_admission_sdk::api::AdmissionCheck;

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
    let values = chart::repo_root()
        .join(CHART)
        .join("ci/budget-check-values.yaml");
    let set = format!("controllerName={controller_name}");
    let objects = chart::render(
        CHART,
        &env.ns,
        &env.ns,
        &[
            "-f",
            values.to_str().context("a UTF-8 path")?,
            "--set-string",
            &set,
        ],
    )?;
    let (service_account, granted) =
        chart::apply_rbac(&env.client, &env.ns, &objects, FIELD_MANAGER, &[]).await?;

    // The Deployment's arguments, with what Kubernetes would expand in the pod.
    let deployment = chart::the(&objects, "Deployment")?;
    let args: Vec<String> = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .context("the container's args")?
        .iter()
        .filter_map(|a| a.as_str())
        .map(|a| a.replace("$(POD_NAMESPACE)", &env.ns))
        .collect();
    let parsed =
        BudgetArgs::try_parse_from(std::iter::once("budget-check".to_string()).chain(args.clone()))
            .map_err(|e| anyhow!("the Deployment's args {args:?} do not parse: {e}"))?;
    ensure!(parsed.controller_name == controller_name);
    let mut runtime = parsed
        .runtime
        .runtime_config(&parsed.controller_name, &parsed.namespace);
    // The container's port is a fixed one; in this process any free one does.
    runtime.metrics_address = Some(e2e::free_local_address()?);
    let lease = runtime
        .leader_election
        .as_ref()
        .map(|e| e.lease_name.clone())
        .context("the chart enables leader election")?;

    // What the operator provides: a budget for the namespace, a queue guarded by the check.
    env.put_config_map(&parsed.budgets_configmap, &[(&env.ns, "10/day")])
        .await?;
    let budgets: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.ns);
    let queue = env.guarded_queue("budget", &controller_name, "4").await?;

    let check = budget_check::BudgetCheck::new(
        budget_check::Settings {
            controller_name: controller_name.clone(),
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
    );
    let client = e2e::service_account_client(&env.ns, &service_account).await?;
    let controller = e2e::Running::check(client, check, runtime);

    let scenario = async {
        let leases: Api<Lease> = Api::namespaced(env.client.clone(), &env.ns);
        e2e::wait_for(leases.clone(), &lease, "a holder", |l: &Lease| {
            l.spec
                .as_ref()
                .and_then(|s| s.holder_identity.as_ref())
                .is_some()
        })
        .await?;
        e2e::wait_for(
            Api::<AdmissionCheck>::all(env.client.clone()),
            &queue.check,
            "Active=True",
            |ac: &AdmissionCheck| ac.active_condition().is_some_and(|c| c.status == "True"),
        )
        .await?;
        // 1 core for the default hour at 1 credit per core-hour: within 10/day.
        let wl = env.admitted_job("job").await?;
        let ledger_name = format!("budget-ledger-{}", env.ns);
        let charged = e2e::wait_for(
            budgets.clone(),
            &ledger_name,
            "a charge",
            |cm: &ConfigMap| {
                cm.data
                    .as_ref()
                    .is_some_and(|d| d.keys().any(|k| k.starts_with("charge.")))
            },
        )
        .await?;
        // 1 core for 10 hours does not fit the 9 credits left: before making it wait the check
        // reads the first Workload to settle what ended unnoticed (get), and its Retry is
        // counted on the Workload first (patch).
        let labels = [("kueue.x-k8s.io/max-exec-time-seconds", "36000")];
        let big = env
            .submit(&e2e::SuspendedJob {
                labels: &labels,
                ..e2e::SuspendedJob::new("big", "lq", "1")
            })
            .await?;
        env.wait_workload(&big, "over budget: Retry", |w| {
            w.admission_check(&queue.check)
                .is_some_and(|e| e.state == kueue_admission_sdk::api::CheckState::Retry)
        })
        .await?;
        // Gone without finishing (no pods run here): the charge is settled.
        env.delete_workload(&wl).await?;
        e2e::wait_for(
            budgets.clone(),
            &ledger_name,
            "the charge settled",
            |cm: &ConfigMap| {
                cm.data
                    .as_ref()
                    .is_some_and(|d| !d.keys().any(|k| k.starts_with("charge.")))
            },
        )
        .await?;
        anyhow::Ok(charged)
    };
    let outcome = scenario.await;
    let stopped = controller.stop().await;
    outcome?;
    stopped.context("stopping the controller")?;

    // Read after the stop, so the Lease's release is in the log too.
    let user = format!("system:serviceaccount:{}:{service_account}", env.ns);
    let requests = e2e::audited_requests(&user)?;
    ensure!(
        !requests.is_empty(),
        "the audit log has no request of {user}"
    );
    let refused: Vec<String> = requests
        .iter()
        .filter(|r| r.code == 403)
        .map(ToString::to_string)
        .collect();
    ensure!(
        refused.is_empty(),
        "the chart's rules are not enough; the API server refused: {}",
        refused.join("; ")
    );
    let mut unused = Vec::new();
    let mut used_by_grant = BTreeMap::new();
    for g in &granted {
        let uses = requests
            .iter()
            .filter(|r| {
                r.code < 400 && r.verb == g.verb && r.group == g.group && r.resource == g.resource
            })
            .count();
        used_by_grant.insert(g.to_string(), uses);
        let excused = UNUSED_HERE.iter().any(|(group, resource, verb, _)| {
            *group == g.group && *resource == g.resource && *verb == g.verb
        });
        match (uses, excused) {
            (0, false) => unused.push(format!("{g}: granted, never used")),
            (n, true) if n > 0 => unused.push(format!(
                "{g}: listed in UNUSED_HERE but used {n} times; take it off the list"
            )),
            _ => {}
        }
    }
    println!(
        "{} requests of {user}, none refused; uses per grant: {used_by_grant:#?}",
        requests.len()
    );
    ensure!(unused.is_empty(), "{}", unused.join("\n"));
    Ok(())
}

//! The capacity-buffer check deployed with its chart (`charts/kueue-capacity-buffer-controller`,
//! the generic chart under `controller:`) under the API server's real RBAC, against the real
//! Karpenter: the chart's ServiceAccount,
//! ClusterRole, Role and bindings applied as rendered, and the check run in-process as the
//! rendered Deployment runs it (its arguments, leader election, a token of the ServiceAccount).
//!
//! Sufficient: a Job is admitted on the capacity Karpenter launched for it, its Nodes are
//! protected then released, its buffer goes when it is done, and the audit log shows not one
//! request of the ServiceAccount refused. Minimal: every verb the chart grants is used
//! successfully at least once, or is in [`UNUSED_HERE`] with the reason.

use anyhow::{Context, Result, anyhow, ensure};
use clap::Parser;
use e2e::TestEnv;
use e2e::chart;
use kube::ResourceExt;
use kube::api::ListParams;
use kueue_admission_sdk::Options;
use kueue_capacity_buffer_controller::names::MANAGED_BY_LABEL;
use kueue_capacity_buffer_controller::{CapacityBufferCheck, Settings};
use serde_json::{Value, json};

const CHART: &str = "charts/kueue-capacity-buffer-controller";
const FIELD_MANAGER: &str = "e2e-chart-rbac-capacity-buffer";

/// Granted by the chart but not exercised by this scenario, with the reason.
const UNUSED_HERE: &[(&str, &str, &str, &str)] = &[
    (
        "events.k8s.io",
        "events",
        "patch",
        "an Event repeated within its series window is patched; this scenario repeats none",
    ),
    (
        "autoscaling.x-k8s.io",
        "capacitybuffers",
        "get",
        "read only when a create finds the name taken (a restart between the create and the \
         cache): the restart suite goes through it",
    ),
    (
        "",
        "podtemplates",
        "get",
        "read only when a create finds the name taken, as for the buffers",
    ),
    (
        "kueue.x-k8s.io",
        "workloads",
        "get",
        "the SDK runtime's fresh read after a write conflict; none here (chart_rbac_generic \
         and the provisioning chart's proof have one)",
    ),
    (
        "kueue.x-k8s.io",
        "workloads",
        "patch",
        "the SDK runtime's attempt annotation before a Retry; this scenario retries nothing \
         (chart_rbac_generic's does)",
    ),
];

/// The binary's command line, as it parses it (the flags this test needs).
#[derive(Debug, Parser)]
struct Args {
    #[arg(long)]
    controller_name: String,
    #[command(flatten)]
    runtime: Options,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_runs_the_capacity_buffer_check_with_exactly_the_rules_it_needs() -> Result<()> {
    let env = TestEnv::new("chart-kac-cb").await?;
    let world = env
        .buffer_world("32", "10", json!({"protectionSeconds": 300}))
        .await?;
    // The generic chart, a file:// dependency, into the chart's charts/ (as a user would).
    let built = std::process::Command::new(chart::helm()?)
        .args(["dependency", "build"])
        .arg(chart::repo_root().join(CHART))
        .output()?;
    ensure!(
        built.status.success(),
        "helm dependency build: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let objects = chart::render(
        CHART,
        &env.ns,
        &env.ns,
        &[
            "--set-string",
            "controller.image.repository=registry.example.com/kueue/capacity-buffer-controller",
            "--set-string",
            "controller.image.tag=0.1.0",
            "--set-string",
            &format!("controller.controllerName={}", world.controller_name),
        ],
    )?;
    let (service_account, granted) =
        chart::apply_rbac(&env.client, &env.ns, &objects, FIELD_MANAGER, &[]).await?;
    let parsed = deployment_args(&objects, &env.ns)?;
    ensure!(parsed.controller_name == world.controller_name);
    let mut runtime = parsed
        .runtime
        .runtime_config(&parsed.controller_name, &env.ns);
    let (metrics, health) = e2e::free_local_addresses()?;
    runtime.metrics_address = Some(metrics);
    runtime.health_address = Some(health);
    let client = e2e::service_account_client(&env.ns, &service_account).await?;
    let check = CapacityBufferCheck::new(Settings {
        controller_name: parsed.controller_name.clone(),
        start_early: true,
    });
    let controller = e2e::Running::check(client, check, runtime);

    let outcome = async {
        let name = env
            .submit(&e2e::SuspendedJob {
                parallelism: Some(2),
                ..e2e::SuspendedJob::new("train", "lq", "1")
            })
            .await?;
        let (admitted, _) = env.wait_admitted_ready(&name, &world.check).await?;
        let uid = admitted.uid().unwrap_or_default();
        env.wait_job_pods_running("train", 2).await?;
        e2e::eventually_async("the protection to end", || async {
            let nodes = env.labelled_nodes(&world.node_label, &uid).await?;
            Ok(nodes.iter().all(|n| {
                !n.annotations()
                    .contains_key(kueue_capacity_buffer_controller::api::DO_NOT_DISRUPT)
            }))
        })
        .await?;
        env.complete_job("train", &name).await?;
        e2e::eventually_async("the buffer deleted", || async {
            let ours = ListParams::default().labels(MANAGED_BY_LABEL);
            Ok(env.capacity_buffers().list(&ours).await?.items.is_empty())
        })
        .await?;
        anyhow::Ok(())
    }
    .await;
    // Scraped as Prometheus does, with a token: reviewed (tokenreviews, subjectaccessreviews).
    let scraped = controller.metrics().await;
    let stopped = controller.stop().await;
    outcome?;
    let scraped = scraped.context("scraping the check's authenticated /metrics")?;
    ensure!(
        scraped.contains("kueue_capacity_buffer_buffers_created_total{"),
        "the scrape lacks the check's own metrics:\n{scraped}"
    );
    stopped.context("stopping the controller")?;

    let (user, requests) = chart::requests_of(&env, &service_account)?;
    let refused = chart::refused(&requests);
    ensure!(
        refused.is_empty(),
        "the chart's rules are not enough; the API server refused: {}",
        refused.join("; ")
    );
    let (used_by_grant, unused) = chart::uses_per_grant(&granted, &requests, UNUSED_HERE);
    println!(
        "{} requests of {user}, none refused; uses per grant: {used_by_grant:#?}",
        requests.len()
    );
    ensure!(unused.is_empty(), "{}", unused.join("\n"));
    Ok(())
}

/// The rendered Deployment's container arguments, with `$(POD_NAMESPACE)` expanded as in the
/// pod, parsed as the binary parses them.
fn deployment_args(objects: &[Value], namespace: &str) -> Result<Args> {
    let args = chart::container_args(objects, namespace)?;
    Args::try_parse_from(
        std::iter::once("kueue-capacity-buffer-controller".to_string()).chain(args.clone()),
    )
    .map_err(|e| anyhow!("the Deployment's args {args:?} do not parse: {e}"))
}

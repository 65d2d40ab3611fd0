//! The demo behind `make demo-karpenter`: a batch/v1 Job admitted by the real Kueue through the
//! capacity-buffer check, on Nodes the real Karpenter v1.14.1 (kwok provider, `CapacityBuffer`
//! gate on) launches for the Workload's CapacityBuffer; kube-scheduler places the pods, kwok runs
//! them, Karpenter consolidates the Nodes once the Job is done.
//!
//! `tests/demo-karpenter.sh` starts the control plane, Karpenter and
//! `kueue-capacity-buffer-controller`; this program creates a NodePool, the check's config,
//! the AdmissionCheck and the queues, submits the Job and narrates, with
//! `kubectl get pods,nodes,nodeclaims` tables, until its Nodes are gone. Its own namespace, so
//! it can run any number of times.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use demo::{Narrator, age, columns};
use e2e::{RUN_FOR_ANNOTATION, SuspendedJob, TestEnv};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Resource, ResourceExt};
use kueue_admission_sdk::api::{
    AdmissionCheck, AdmissionCheckParametersReference, AdmissionCheckSpec, ResourceFlavor,
    Workload, workload_condition as cond,
};
use kueue_capacity_buffer_controller::api::{CapacityBuffer, DO_NOT_DISRUPT, NodeClaim};
use kueue_capacity_buffer_controller::config::GROUP;
use serde_json::json;

#[derive(Parser)]
struct Cli {
    /// The controllerName the running kueue-capacity-buffer-controller serves.
    #[arg(long)]
    controller_name: String,
    /// Where the controller serves /metrics.
    #[arg(long)]
    metrics_address: std::net::SocketAddr,
}

/// The Job: pods of 1 cpu, how long each runs.
const PODS: i32 = 4;
const RUNS_FOR: &str = "20s";

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    let mut narrator = Narrator::new();
    let env = TestEnv::new("demo-karpenter").await?;
    narrator.say(&format!(
        "namespace {}. Real: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, Kueue, \
         Karpenter v1.14.1 (its kwok provider, CapacityBuffer gate on); kwok plays the kubelets",
        env.ns
    ));
    let (label, check) = set_up(&cli, &env, &narrator).await?;
    let job = format!("train-{}", &env.ns[env.ns.len().saturating_sub(5)..]);
    let workload = env
        .submit(&SuspendedJob {
            parallelism: Some(PODS),
            pod_annotations: &[(RUN_FOR_ANNOTATION, RUNS_FOR)],
            ..SuspendedJob::new(&job, "lq", "1")
        })
        .await?;
    narrator.say(&format!(
        "submitted Job {job}: {PODS} pods of 1 cpu, {RUNS_FOR} each (Workload {workload}); no Node \
         of the NodePool exists yet"
    ));
    narrate(&env, &label, &check, &workload, &mut narrator).await?;
    print_metrics(&cli, &check).await?;
    println!(
        "\ninspect it: eval \"$(bash tests/control-plane/control-plane.sh env)\"; kubectl -n {} get jobs,pods,workloads,capacitybuffers",
        env.ns
    );
    Ok(())
}

/// A NodePool that lets Karpenter label Nodes for one Workload, the check's config naming that
/// label, the AdmissionCheck (its name is returned with the label), a flavor and the queues.
async fn set_up(cli: &Cli, env: &TestEnv, narrator: &Narrator) -> Result<(String, String)> {
    e2e::karpenter::install_config_crd(env).await?;
    let label = env.buffer_node_label();
    let pool = env.node_pool("pool", &label, "16").await?;
    let config = env.cluster_name("config");
    let object = json!({
        "apiVersion": format!("{GROUP}/v1alpha1"),
        "kind": "CapacityBufferCheckConfig",
        "metadata": {"name": config},
        "spec": {"nodeLabel": label, "protectionSeconds": 120},
    });
    e2e::chart::apply(&env.client, &object, "demo").await?;
    let spec = AdmissionCheckSpec {
        controller_name: cli.controller_name.clone(),
        parameters: Some(AdmissionCheckParametersReference {
            api_group: GROUP.into(),
            kind: "CapacityBufferCheckConfig".into(),
            name: config.clone(),
        }),
    };
    let check = Api::<AdmissionCheck>::all(env.client.clone())
        .create(
            &PostParams::default(),
            &AdmissionCheck::new(&env.cluster_name("capacity"), spec),
        )
        .await
        .context("creating the AdmissionCheck")?
        .name_any();
    let flavor = Api::<ResourceFlavor>::all(env.client.clone())
        .create(
            &PostParams::default(),
            &ResourceFlavor::new(&env.cluster_name("karpenter"), Default::default()),
        )
        .await
        .context("creating the ResourceFlavor")?
        .name_any();
    let cq = env.queues_on(&flavor, "8", &[&check]).await?;
    narrator.say(&format!(
        "NodePool {pool} (requires {label} Exists: Karpenter may label a Node with any value), \
         CapacityBufferCheckConfig {config} (nodeLabel {label}), AdmissionCheck {check} ({}), \
         ResourceFlavor {flavor}, ClusterQueue {cq} (8 cpu), LocalQueue lq",
        cli.controller_name
    ));
    Ok((label, check))
}

/// Watches the Workload, its buffers, pods, NodeClaims and Nodes; says what changes and shows
/// the tables, until the Job is done and Karpenter has removed its Nodes.
async fn narrate(
    env: &TestEnv,
    label: &str,
    check: &str,
    workload: &str,
    narrator: &mut Narrator,
) -> Result<()> {
    let ns = env.ns.as_str();
    let (workloads, w1) = reflector::store::<Workload>();
    let (buffers, w2) = reflector::store::<CapacityBuffer>();
    let (pods, w3) = reflector::store::<Pod>();
    let (claims, w4) = reflector::store::<NodeClaim>();
    let (nodes, w5) = reflector::store::<Node>();
    let by_label = watcher::Config::default().labels(label);
    let client = &env.client;
    let changes = futures::stream::select_all([
        reflector(
            w1,
            watcher(
                Api::<Workload>::namespaced(client.clone(), ns),
                Default::default(),
            ),
        )
        .default_backoff()
        .map(|_| ())
        .boxed(),
        reflector(
            w2,
            watcher(
                Api::<CapacityBuffer>::namespaced(client.clone(), ns),
                Default::default(),
            ),
        )
        .default_backoff()
        .map(|_| ())
        .boxed(),
        reflector(
            w3,
            watcher(
                Api::<Pod>::namespaced(client.clone(), ns),
                Default::default(),
            ),
        )
        .default_backoff()
        .map(|_| ())
        .boxed(),
        reflector(
            w4,
            watcher(Api::<NodeClaim>::all(client.clone()), by_label.clone()),
        )
        .default_backoff()
        .map(|_| ())
        .boxed(),
        reflector(w5, watcher(Api::<Node>::all(client.clone()), by_label))
            .default_backoff()
            .map(|_| ())
            .boxed(),
    ]);
    let mut changes = std::pin::pin!(changes);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    let mut shown = String::new();
    let mut finished = false;
    loop {
        let next = tokio::time::timeout_at(deadline, changes.next()).await;
        match next {
            Err(_) => bail!(
                "the demo did not end within 5 minutes; the tables above show where it stopped"
            ),
            Ok(None) => bail!("the watches ended"),
            Ok(Some(())) => {}
        }
        if let Some(wl) = workloads.state().iter().find(|w| w.name_any() == workload) {
            tell_workload(wl, check, narrator);
            finished |= wl.condition_is_true(cond::FINISHED);
        }
        for b in buffers.state() {
            let replicas = b.spec.replicas.unwrap_or_default();
            let state = b
                .status
                .iter()
                .flat_map(|s| s.conditions.iter())
                .map(|c| format!("{}={} ({})", c.type_, c.status, c.reason))
                .collect::<Vec<_>>()
                .join(", ");
            narrator.say_if_changed(
                format!("buffer/{}", b.name_any()),
                &format!("{replicas} {state}"),
                &format!(
                    "CapacityBuffer {}: replicas {replicas}; {}",
                    b.name_any(),
                    if state.is_empty() {
                        "not looked at yet".to_string()
                    } else {
                        state
                    }
                ),
            );
        }
        show_tables(
            &pods.state(),
            &nodes.state(),
            &claims.state(),
            label,
            &mut shown,
            narrator,
        );
        if finished && claims.state().is_empty() && nodes.state().is_empty() {
            narrator.say("the Job is done, its buffer deleted, and Karpenter has consolidated its Nodes: nothing is left");
            return Ok(());
        }
    }
}

fn tell_workload(wl: &Workload, check: &str, narrator: &mut Narrator) {
    let entry = wl.admission_check(check);
    let state = entry
        .map(|e| format!("{:?}: {}", e.state, e.message))
        .unwrap_or_else(|| "no entry yet".into());
    let admitted = wl.condition_is_true(cond::ADMITTED);
    let reserved = wl.condition_is_true(cond::QUOTA_RESERVED);
    let finished = wl.condition_is_true(cond::FINISHED);
    let line = format!("{reserved} {admitted} {finished} {state}");
    let phase = if finished {
        "finished"
    } else if admitted {
        "admitted"
    } else if reserved {
        "holds quota, waits for the check"
    } else {
        "waits for quota"
    };
    narrator.say_if_changed(
        format!("wl/{}", wl.name_any()),
        &line,
        &format!("Workload {} {phase}; check {check}: {state}", wl.name_any()),
    );
}

/// Prints `kubectl get pods,nodes,nodeclaims` as it would read now, unless it reads as last
/// time but for the ages.
fn show_tables(
    pods: &[std::sync::Arc<Pod>],
    nodes: &[std::sync::Arc<Node>],
    claims: &[std::sync::Arc<NodeClaim>],
    label: &str,
    shown: &mut String,
    narrator: &Narrator,
) {
    let now = Timestamp::now();
    let mut pod_rows: Vec<Vec<String>> = pods
        .iter()
        .map(|p| {
            let phase = p
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_default();
            let node = p
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_else(|| "<none>".into());
            vec![
                format!("pod/{}", p.name_any()),
                phase,
                node,
                age(p.meta().creation_timestamp.as_ref(), now),
            ]
        })
        .collect();
    pod_rows.sort();
    let mut node_rows: Vec<Vec<String>> = nodes
        .iter()
        .map(|n| {
            let ready = n
                .status
                .iter()
                .flat_map(|s| s.conditions.iter().flatten())
                .any(|c| c.type_ == "Ready" && c.status == "True");
            let for_uid = n.labels().get(label).cloned().unwrap_or_default();
            let kept = if n.annotations().contains_key(DO_NOT_DISRUPT) {
                "do-not-disrupt"
            } else {
                "-"
            };
            let short_uid: String = for_uid.chars().take(8).collect();
            vec![
                format!("node/{}", n.name_any()),
                if ready { "Ready" } else { "NotReady" }.into(),
                n.labels()
                    .get("node.kubernetes.io/instance-type")
                    .cloned()
                    .unwrap_or_default(),
                short_uid,
                kept.into(),
                age(n.meta().creation_timestamp.as_ref(), now),
            ]
        })
        .collect();
    node_rows.sort();
    let mut claim_rows: Vec<Vec<String>> = claims
        .iter()
        .map(|c| {
            let conditions = c
                .status
                .as_ref()
                .map(|s| s.conditions.as_slice())
                .unwrap_or_default();
            let ready = conditions
                .iter()
                .any(|k| k.type_ == "Ready" && k.status == "True");
            let node = c
                .status
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default();
            vec![
                format!("nodeclaim/{}", c.name_any()),
                c.labels()
                    .get("node.kubernetes.io/instance-type")
                    .cloned()
                    .unwrap_or_default(),
                if ready { "True" } else { "False" }.into(),
                node,
                age(c.meta().creation_timestamp.as_ref(), now),
            ]
        })
        .collect();
    claim_rows.sort();
    let without_age = |rows: &[Vec<String>]| {
        rows.iter()
            .map(|r| r[..r.len() - 1].join(" "))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let key = format!(
        "{}\n{}\n{}",
        without_age(&pod_rows),
        without_age(&node_rows),
        without_age(&claim_rows)
    );
    if &key == shown {
        return;
    }
    *shown = key;
    narrator.say("kubectl get pods,nodes,nodeclaims");
    let tables = [
        columns(&["NAME", "STATUS", "NODE", "AGE"], pod_rows),
        columns(
            &[
                "NAME",
                "STATUS",
                "INSTANCE-TYPE",
                "FOR-WORKLOAD",
                "KEPT",
                "AGE",
            ],
            node_rows,
        ),
        columns(&["NAME", "TYPE", "READY", "NODE", "AGE"], claim_rows),
    ];
    for table in tables {
        for line in table {
            println!("    {line}");
        }
        println!();
    }
}

/// The controller's metrics for the check.
async fn print_metrics(cli: &Cli, check: &str) -> Result<()> {
    let (_, metrics) = e2e::http_get(cli.metrics_address, "/metrics").await?;
    println!(
        "\nthe controller's metrics (http://{}/metrics):",
        cli.metrics_address
    );
    for line in metrics.lines().filter(|l| {
        (l.starts_with("kueue_capacity_buffer_")
            && !l.starts_with("kueue_capacity_buffer_time_to_capacity_seconds_bucket"))
            && (l.contains(check)
                || l.contains("why=")
                || l.starts_with("kueue_capacity_buffer_nodes_protected"))
            || (l.starts_with("kueue_ac_decisions_total") && l.contains(check))
    }) {
        println!("  {line}");
    }
    Ok(())
}

//! The demo behind `make demo`: batch/v1 Jobs admitted by the real Kueue through the
//! provisioning controller, their pods placed by the real kube-scheduler on kwok Nodes that the
//! autoscaler simulator (playing cluster-autoscaler 1.36.1 with its kwok provider) adds for
//! their ProvisioningRequest.
//!
//! `tests/demo.sh` starts the control plane and the two binaries (`kueue-provisioning-controller`
//! and `autoscaler-simulator`, the latter scaling the node group of
//! `tests/demo-node-groups.yaml`: Nodes of 4 cpu, at most 2); this program creates the queues
//! and the check, submits two Jobs and narrates, with `kubectl get pods,nodes -o wide` tables,
//! what happens until both have finished and the Nodes are gone. It creates its own namespace,
//! so it can run any number of times.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use demo::{Narrator, age, columns};
use e2e::capacity::{BEST_EFFORT, CONSUME_ANNOTATION, GROUP_LABEL, PROVIDER_TAINT};
use e2e::{RUN_FOR_ANNOTATION, START_AFTER_ANNOTATION, SuspendedJob, TestEnv};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use kueue_admission_sdk::api::{
    ProvisioningRequest, ResourceFlavor, Workload, workload_condition as cond,
};
use serde_json::json;

#[derive(Parser)]
struct Cli {
    /// The controllerName the running kueue-provisioning-controller serves.
    #[arg(long)]
    controller_name: String,
    /// The node group the running autoscaler-simulator scales (its `kwok-nodegroup` label).
    #[arg(long)]
    node_group: String,
    /// Where the controller serves /metrics.
    #[arg(long)]
    metrics_address: std::net::SocketAddr,
}

/// The two Jobs: name, pods (1 cpu each), how long each pod runs, what to expect. The second
/// is submitted once the first one's request is provisioned.
const JOBS: [(&str, i32, &str, &str); 2] = [
    (
        "train",
        4,
        "15s",
        "its request makes the autoscaler add 2 Nodes at once",
    ),
    (
        "burst",
        4,
        "5s",
        "the group is at its max and train's room is booked: it waits for train",
    ),
];

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    let mut narrator = Narrator::new();
    let env = TestEnv::new("demo").await?;
    narrator.say(&format!(
        "namespace {}. Real: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, Kueue; \
         kwok plays the kubelets; autoscaler-simulator plays cluster-autoscaler 1.36.1 (kwok \
         provider, node group {}: Nodes of 4 cpu, at most 2)",
        env.ns, cli.node_group
    ));
    let check = set_up_queue(&cli, &env, &narrator).await?;
    narrate(&env, &cli.node_group, &check, &mut narrator).await?;
    print_metrics(&cli, &check).await?;
    println!(
        "\ninspect it: eval \"$(bash tests/control-plane/control-plane.sh env)\"; kubectl -n {} get jobs,pods,workloads",
        env.ns
    );
    Ok(())
}

/// The ProvisioningRequestConfig, the AdmissionCheck (returned), the flavor of the node group
/// and the queues.
async fn set_up_queue(cli: &Cli, env: &TestEnv, narrator: &Narrator) -> Result<String> {
    let config = env
        .provisioning_config(
            "prc",
            json!({
                "provisioningClassName": BEST_EFFORT,
                "retryStrategy": {"backoffLimitCount": 3, "backoffBaseSeconds": 5, "backoffMaxSeconds": 60},
            }),
        )
        .await?;
    let check = env
        .provisioning_check("capacity", &cli.controller_name, &config)
        .await?;
    let (key, value) = PROVIDER_TAINT;
    let flavor: ResourceFlavor = serde_json::from_value(json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": env.cluster_name("demo-pool")},
        "spec": {
            "nodeLabels": {GROUP_LABEL: cli.node_group},
            "tolerations": [{"key": key, "operator": "Equal", "value": value, "effect": "NoSchedule"}],
        },
    }))?;
    let flavor = Api::<ResourceFlavor>::all(env.client.clone())
        .create(&PostParams::default(), &flavor)
        .await
        .context("creating the ResourceFlavor")?
        .name_any();
    let cq = env.queues_on(&flavor, "8", &[&check]).await?;
    narrator.say(&format!(
        "ProvisioningRequestConfig {config} (class {BEST_EFFORT}), AdmissionCheck {check} ({}), \
         ResourceFlavor {flavor} ({GROUP_LABEL}={}, tolerates {key}={value}), ClusterQueue {cq} \
         (8 cpu), LocalQueue lq",
        cli.controller_name, cli.node_group
    ));
    Ok(check)
}

/// Submits Job `index` of [`JOBS`]; returns its Workload's name.
async fn submit_job(env: &TestEnv, index: usize, narrator: &Narrator) -> Result<String> {
    let (name, pods, run_for, what) = JOBS[index];
    // Each pod starts 2 s after it is bound, as a kubelet pulling its image would.
    let annotations = [
        (RUN_FOR_ANNOTATION, run_for),
        (START_AFTER_ANNOTATION, "2s"),
    ];
    let wl = env
        .submit(&SuspendedJob {
            parallelism: Some(pods),
            pod_annotations: &annotations,
            ..SuspendedJob::new(name, "lq", "1")
        })
        .await?;
    narrator.say(&format!(
        "submitted Job {name} ({pods} pods of 1 cpu, each running {run_for}; {what}): Workload \
         {wl}; Kueue keeps the Job suspended, so it has no pod until admitted"
    ));
    Ok(wl)
}

/// What the demo watches, as it changes.
enum Seen {
    Workload(watcher::Event<Workload>),
    Request(watcher::Event<ProvisioningRequest>),
    Pod(Box<watcher::Event<Pod>>),
    Node(Box<watcher::Event<Node>>),
}

/// The objects seen so far, by name.
#[derive(Default)]
struct Cluster {
    pods: BTreeMap<String, Pod>,
    nodes: BTreeMap<String, Node>,
    finished: BTreeMap<String, bool>,
    /// Whether a request has been provisioned yet.
    provisioned: bool,
}

/// Submits the Jobs (the second once the first one's request is provisioned) and narrates the
/// Workloads' check entries, the requests, the Nodes, and the pods (a line per Job, and tables
/// once a burst of changes settles) until every Workload has finished and the node group is
/// empty again.
async fn narrate(env: &TestEnv, group: &str, check: &str, narrator: &mut Narrator) -> Result<()> {
    let mut events = std::pin::pin!(all_changes(env, group));
    let mut cluster = Cluster::default();
    let mut workloads = vec![submit_job(env, 0, narrator).await?];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(240);
    let mut settle: Option<tokio::time::Instant> = None;
    let mut tables_shown = String::new();
    loop {
        let done = workloads.len() == JOBS.len()
            && workloads
                .iter()
                .all(|w| cluster.finished.get(w) == Some(&true))
            && cluster.nodes.is_empty()
            && settle.is_none();
        if done {
            narrator.say("both Jobs finished, their requests deleted, the added Nodes removed");
            return Ok(());
        }
        let wake = settle.unwrap_or(deadline).min(deadline);
        let event = tokio::select! {
            e = events.next() => e,
            () = tokio::time::sleep_until(wake) => {
                if tokio::time::Instant::now() >= deadline {
                    bail!("the demo did not end within 4 minutes; see the controller's and the simulator's logs");
                }
                settle = None;
                let jobs: std::collections::BTreeSet<String> = cluster
                    .pods
                    .values()
                    .filter_map(|p| p.labels().get(e2e::JOB_NAME_LABEL).cloned())
                    .collect();
                for job in jobs {
                    tell_job_pods(&job, &cluster, narrator);
                }
                show_tables(&cluster, &mut tables_shown, narrator);
                continue;
            }
        };
        let Some(event) = event else {
            bail!("a watch ended");
        };
        if tell(event?, check, &mut cluster, narrator) {
            settle = Some(tokio::time::Instant::now() + Duration::from_millis(150));
        }
        if workloads.len() < JOBS.len() && cluster.provisioned {
            workloads.push(submit_job(env, 1, narrator).await?);
        }
    }
}

/// Takes one change in: says what changed of Workloads and requests; returns whether the pods
/// or Nodes changed (their tables are shown once changes settle).
fn tell(seen: Seen, check: &str, cluster: &mut Cluster, narrator: &mut Narrator) -> bool {
    match seen {
        Seen::Workload(e) => {
            for wl in applied(e) {
                tell_workload(&wl, check, cluster, narrator);
            }
            false
        }
        Seen::Request(watcher::Event::Delete(r)) => {
            narrator.say(&format!("ProvisioningRequest {}: deleted", r.name_any()));
            false
        }
        Seen::Request(e) => {
            for r in applied(e) {
                cluster.provisioned |= request_state(&r).contains("Provisioned=True");
                let line = request_state(&r);
                let msg = format!("ProvisioningRequest {}: {line}", r.name_any());
                narrator.say_if_changed(format!("pr/{}", r.name_any()), &line, &msg);
            }
            false
        }
        Seen::Pod(e) => {
            if let watcher::Event::Apply(p) | watcher::Event::InitApply(p) = e.as_ref() {
                tell_consumer(p, narrator);
            }
            keep(&mut cluster.pods, *e)
        }
        Seen::Node(e) => {
            tell_node(&e, narrator);
            keep(&mut cluster.nodes, *e)
        }
    }
}

/// Says what changed of a Workload's entry for `check`, its admission and its end.
fn tell_workload(wl: &Workload, check: &str, cluster: &mut Cluster, narrator: &mut Narrator) {
    let name = wl.name_any();
    if let Some(e) = wl.admission_check(check) {
        // Kueue adds the entry Pending with an empty message before anything answers it.
        let message = match (
            e.message.is_empty(),
            wl.condition_is_true(cond::QUOTA_RESERVED),
        ) {
            (false, _) => e.message.as_str(),
            (true, false) => {
                "entry added by Kueue; no quota reserved yet, so the check is not asked"
            }
            (true, true) => {
                "quota reserved; the check has not answered yet (it makes the \
                 ProvisioningRequest as soon as it sees the reservation)"
            }
        };
        let line = format!("{:?}: {message}", e.state);
        narrator.say_if_changed(
            format!("wl/{name}"),
            &line,
            &format!("Workload {name}: check {line}"),
        );
    }
    if wl.condition_is_true(cond::ADMITTED) {
        let msg = format!("Workload {name} admitted: Kueue starts its Job, with the podSetUpdates");
        narrator.say_if_changed(format!("admitted/{name}"), "yes", &msg);
    }
    if wl.condition_is_true(cond::FINISHED) {
        let msg = format!("Workload {name} finished: its Job's pods all succeeded");
        narrator.say_if_changed(format!("finished/{name}"), "yes", &msg);
        cluster.finished.insert(name, true);
    }
}

/// Says how a Job's pods stand: how many are in each state, and where they run.
fn tell_job_pods(job: &str, cluster: &Cluster, narrator: &mut Narrator) {
    let mut states: BTreeMap<String, usize> = BTreeMap::new();
    let mut nodes: std::collections::BTreeSet<String> = Default::default();
    for p in cluster
        .pods
        .values()
        .filter(|p| p.labels().get(e2e::JOB_NAME_LABEL).map(String::as_str) == Some(job))
    {
        let row = pod_rows(std::iter::once(p), Timestamp::now()).remove(0);
        let state = if row[6] == "<none>" && row[2] == "Pending" {
            "Pending (not scheduled yet)".to_string()
        } else {
            row[2].clone()
        };
        *states.entry(state).or_default() += 1;
        if row[6] != "<none>" {
            nodes.insert(row[6].clone());
        }
    }
    let counts: Vec<String> = states.iter().map(|(s, n)| format!("{n} {s}")).collect();
    let mut line = counts.join(", ");
    if !nodes.is_empty() {
        line.push_str(&format!(
            ", on {}",
            nodes.into_iter().collect::<Vec<_>>().join(" and ")
        ));
    }
    narrator.say_if_changed(
        format!("pods/{job}"),
        &line,
        &format!("pods of Job {job}: {line}"),
    );
}

/// Says when a Node of the group comes, becomes Ready, or goes.
fn tell_node(event: &watcher::Event<Node>, narrator: &mut Narrator) {
    let (node, line) = match event {
        watcher::Event::Apply(n) | watcher::Event::InitApply(n) => {
            let ready = n
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
                .is_some_and(|c| c.status == "True");
            let line = if ready {
                "Ready (kwok runs it)"
            } else {
                "added by the autoscaler for the request"
            };
            (n.name_any(), line)
        }
        watcher::Event::Delete(n) => (
            n.name_any(),
            "removed by the autoscaler: idle, booked by no request",
        ),
        _ => return,
    };
    narrator.say_if_changed(
        format!("node/{node}"),
        line,
        &format!("Node {node}: {line}"),
    );
}

/// Says, once per Job, which request its pods consume and which Nodes they select.
fn tell_consumer(pod: &Pod, narrator: &mut Narrator) {
    let Some(job) = pod.labels().get(e2e::JOB_NAME_LABEL) else {
        return;
    };
    let consumes = pod
        .annotations()
        .get(CONSUME_ANNOTATION)
        .map_or("nothing", String::as_str);
    let selects = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_selector.as_ref())
        .and_then(|s| s.get(GROUP_LABEL))
        .map_or("any Node", String::as_str);
    let msg = format!(
        "Job {job}'s pods carry {CONSUME_ANNOTATION}={consumes} and nodeSelector {GROUP_LABEL}={selects} (Kueue's podSetUpdates and the flavor's node labels)"
    );
    narrator.say_if_changed(format!("consumer/{job}"), consumes, &msg);
}

/// The objects an event brings (none for a deletion).
fn applied<K>(event: watcher::Event<K>) -> Vec<K> {
    match event {
        watcher::Event::Apply(k) | watcher::Event::InitApply(k) => vec![k],
        _ => Vec::new(),
    }
}

/// Keeps `objects` as the watch says; returns whether anything changed.
fn keep<K: ResourceExt>(objects: &mut BTreeMap<String, K>, event: watcher::Event<K>) -> bool {
    match event {
        watcher::Event::Apply(k) | watcher::Event::InitApply(k) => {
            objects.insert(k.name_any(), k);
            true
        }
        watcher::Event::Delete(k) => objects.remove(&k.name_any()).is_some(),
        _ => false,
    }
}

/// Prints `kubectl get pods,nodes -o wide` as it would read now, unless it reads as last time
/// but for the ages.
fn show_tables(cluster: &Cluster, shown: &mut String, narrator: &Narrator) {
    let now = Timestamp::now();
    let pods = pod_rows(cluster.pods.values(), now);
    let nodes = node_rows(cluster.nodes.values(), now);
    let without_age = |rows: &[Vec<String>], age_column: usize| -> String {
        let rows = rows.iter().map(|r| {
            let kept: Vec<&str> = r
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != age_column)
                .map(|(_, c)| c.as_str())
                .collect();
            kept.join(" ")
        });
        rows.collect::<Vec<_>>().join("\n")
    };
    let key = format!("{}\n{}", without_age(&pods, 4), without_age(&nodes, 3));
    if &key == shown {
        return;
    }
    *shown = key;
    narrator.say("kubectl get pods,nodes -o wide");
    let lines = columns(&POD_COLUMNS, pods)
        .into_iter()
        .chain([String::new()])
        .chain(columns(&NODE_COLUMNS, nodes));
    for line in lines {
        println!("          {line}");
    }
}

/// The columns of `kubectl get pods -o wide`.
const POD_COLUMNS: [&str; 9] = [
    "NAME",
    "READY",
    "STATUS",
    "RESTARTS",
    "AGE",
    "IP",
    "NODE",
    "NOMINATED NODE",
    "READINESS GATES",
];

/// The columns of `kubectl get nodes -o wide`.
const NODE_COLUMNS: [&str; 10] = [
    "NAME",
    "STATUS",
    "ROLES",
    "AGE",
    "VERSION",
    "INTERNAL-IP",
    "EXTERNAL-IP",
    "OS-IMAGE",
    "KERNEL-VERSION",
    "CONTAINER-RUNTIME",
];

/// The rows of `kubectl get pods -o wide` (pod/ prefixed, as for several kinds at once).
fn pod_rows<'a>(pods: impl Iterator<Item = &'a Pod>, now: Timestamp) -> Vec<Vec<String>> {
    pods.map(|p| {
        let status = p.status.as_ref();
        let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
        let ready = status
            .and_then(|s| s.container_statuses.as_ref())
            .map_or(0, |c| c.iter().filter(|c| c.ready).count());
        let containers = p.spec.as_ref().map_or(0, |s| s.containers.len());
        let shown_status = if p.metadata.deletion_timestamp.is_some() {
            "Terminating"
        } else if phase == "Succeeded" {
            "Completed"
        } else {
            phase
        };
        vec![
            format!("pod/{}", p.name_any()),
            format!("{ready}/{containers}"),
            shown_status.to_string(),
            "0".to_string(),
            age(p.metadata.creation_timestamp.as_ref(), now),
            status
                .and_then(|s| s.pod_ip.clone())
                .unwrap_or_else(|| "<none>".into()),
            p.spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_else(|| "<none>".into()),
            "<none>".to_string(),
            "<none>".to_string(),
        ]
    })
    .collect()
}

/// The rows of `kubectl get nodes -o wide` (node/ prefixed).
fn node_rows<'a>(nodes: impl Iterator<Item = &'a Node>, now: Timestamp) -> Vec<Vec<String>> {
    nodes
        .map(|n| {
            let status = n.status.as_ref();
            let ready = status
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
                .is_some_and(|c| c.status == "True");
            let info = status.and_then(|s| s.node_info.as_ref());
            let or_unknown = |v: Option<&String>| {
                v.filter(|v| !v.is_empty())
                    .cloned()
                    .unwrap_or_else(|| "<unknown>".into())
            };
            let ip = status
                .and_then(|s| s.addresses.as_ref())
                .and_then(|a| a.iter().find(|a| a.type_ == "InternalIP"))
                .map_or_else(|| "<none>".into(), |a| a.address.clone());
            let kernel = info.map(|i| format!("{} ({})", i.kernel_version, i.architecture));
            vec![
                format!("node/{}", n.name_any()),
                if ready { "Ready" } else { "NotReady" }.to_string(),
                "<none>".to_string(),
                age(n.metadata.creation_timestamp.as_ref(), now),
                or_unknown(info.map(|i| &i.kubelet_version)),
                ip,
                "<none>".to_string(),
                or_unknown(info.map(|i| &i.os_image)),
                or_unknown(kernel.as_ref()),
                or_unknown(info.map(|i| &i.container_runtime_version)),
            ]
        })
        .collect()
}

/// A request's conditions that are set, with their reasons, or `created` while it has none.
fn request_state(r: &ProvisioningRequest) -> String {
    let conditions: Vec<String> = r
        .status
        .iter()
        .flat_map(|s| s.conditions.iter())
        .map(|c| format!("{}={} ({})", c.type_, c.status, c.reason))
        .collect();
    if conditions.is_empty() {
        "created (its PodTemplate first)".to_string()
    } else {
        conditions.join(", ")
    }
}

/// Every change of the demo's Workloads, requests and pods, and of the node group's Nodes.
fn all_changes(env: &TestEnv, group: &str) -> impl Stream<Item = Result<Seen, watcher::Error>> {
    let ns = |k| watcher::Config::default().labels(k);
    let workloads = events(
        Api::<Workload>::namespaced(env.client.clone(), &env.ns),
        watcher::Config::default(),
    )
    .map(|e| e.map(Seen::Workload));
    let requests = events(
        Api::<ProvisioningRequest>::namespaced(env.client.clone(), &env.ns),
        watcher::Config::default(),
    )
    .map(|e| e.map(Seen::Request));
    let pods = events(
        Api::<Pod>::namespaced(env.client.clone(), &env.ns),
        watcher::Config::default(),
    )
    .map(|e| e.map(|e| Seen::Pod(Box::new(e))));
    let nodes = events(
        Api::<Node>::all(env.client.clone()),
        ns(&format!("{GROUP_LABEL}={group}")),
    )
    .map(|e| e.map(|e| Seen::Node(Box::new(e))));
    futures::stream::select_all([
        workloads.boxed(),
        requests.boxed(),
        pods.boxed(),
        nodes.boxed(),
    ])
}

fn events<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>>
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
{
    watcher(api, config).default_backoff()
}

/// The controller's metrics for the check.
async fn print_metrics(cli: &Cli, check: &str) -> Result<()> {
    let (_, metrics) = e2e::http_get(cli.metrics_address, "/metrics").await?;
    println!(
        "\nthe controller's metrics (http://{}/metrics):",
        cli.metrics_address
    );
    for line in metrics.lines().filter(|l| {
        (l.starts_with("kueue_provisioning_requests_") || l.starts_with("kueue_ac_decisions_total"))
            && l.contains(check)
    }) {
        println!("  {line}");
    }
    Ok(())
}

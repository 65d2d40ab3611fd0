//! The demo behind `make demo`: batch/v1 Jobs admitted by the real Kueue through the
//! provisioning controller, with the autoscaler simulator playing cluster-autoscaler.
//!
//! `tests/demo.sh` starts the control plane and the two binaries (`kueue-provisioning-controller`
//! and `autoscaler-simulator`); this program creates the queues and the check, submits two Jobs
//! and narrates what Kueue, the controller and the simulator do until both are admitted. It
//! creates its own namespace, so it can run any number of times.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use autoscaler_simulator::SCRIPT_ANNOTATION;
use clap::Parser;
use e2e::TestEnv;
use futures::StreamExt;
use k8s_openapi::NamespaceResourceScope;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use kueue_admission_sdk::api::{ProvisioningRequest, Workload, workload_condition as cond};
use serde_json::json;

#[derive(Parser)]
struct Cli {
    /// The controllerName the running kueue-provisioning-controller serves.
    #[arg(long)]
    controller_name: String,
    /// The provisioning class the running autoscaler-simulator serves.
    #[arg(long)]
    class: String,
    /// Where the controller serves /metrics.
    #[arg(long)]
    metrics_address: std::net::SocketAddr,
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    let mut narrator = Narrator::new();
    let env = TestEnv::new("demo").await?;
    narrator.say(&format!("namespace {}", env.ns));
    let check = set_up_queue(&cli, &env, &narrator).await?;
    let waiting = submit_jobs(&env, &narrator).await?;
    narrate_until_admitted(&env, &check, waiting, &mut narrator).await?;
    for job in ["train", "burst"] {
        let j = env.jobs().get(job).await?;
        let annotations = j
            .spec
            .and_then(|s| s.template.metadata)
            .and_then(|m| m.annotations)
            .unwrap_or_default();
        narrator.say(&format!(
            "Job {job}: suspend=false, pod template annotated consume-provisioning-request={}",
            annotations
                .get("autoscaling.x-k8s.io/consume-provisioning-request")
                .map(String::as_str)
                .unwrap_or("?")
        ));
    }
    let (_, metrics) = e2e::http_get(cli.metrics_address, "/metrics").await?;
    println!(
        "\nthe controller's metrics (http://{}/metrics):",
        cli.metrics_address
    );
    for line in metrics.lines().filter(|l| {
        (l.starts_with("kueue_provisioning_requests_") || l.starts_with("kueue_ac_decisions_total"))
            && l.contains(&check)
    }) {
        println!("  {line}");
    }
    println!(
        "\ninspect it: eval \"$(bash tests/control-plane/control-plane.sh env)\"; namespace {}",
        env.ns
    );
    Ok(())
}

/// Prints lines stamped with the time since the demo started, and remembers what it last said
/// about each object so that it speaks only of changes.
struct Narrator {
    started: Instant,
    said: BTreeMap<String, String>,
}

impl Narrator {
    fn new() -> Self {
        Self {
            started: Instant::now(),
            said: BTreeMap::new(),
        }
    }

    fn say(&self, msg: &str) {
        println!("[{:>5.1}s] {msg}", self.started.elapsed().as_secs_f32());
    }

    /// Says `msg` unless `line` is what was last said about `key`.
    fn say_if_changed(&mut self, key: String, line: &str, msg: &str) {
        if self.said.insert(key, line.to_string()).as_deref() != Some(line) {
            self.say(msg);
        }
    }
}

/// The ProvisioningRequestConfig, the AdmissionCheck (returned) and the queues.
async fn set_up_queue(cli: &Cli, env: &TestEnv, narrator: &Narrator) -> Result<String> {
    let config = env
        .provisioning_config(
            "prc",
            json!({
                "provisioningClassName": cli.class,
                "retryStrategy": {"backoffLimitCount": 3, "backoffBaseSeconds": 5, "backoffMaxSeconds": 60},
            }),
        )
        .await?;
    let check = env
        .provisioning_check("capacity", &cli.controller_name, &config)
        .await?;
    let (_, cq) = env.pool_queues("8", &[&check]).await?;
    narrator.say(&format!(
        "ProvisioningRequestConfig {config} (class {}, retries after 5 s, 10 s, 20 s), \
         AdmissionCheck {check} ({}), ClusterQueue {}, LocalQueue lq",
        cli.class, cli.controller_name, cq
    ));
    Ok(check)
}

/// Submits the two Jobs; returns their Workloads' names.
async fn submit_jobs(env: &TestEnv, narrator: &Narrator) -> Result<Vec<String>> {
    let jobs = [
        ("train", "provision", "the simulator provisions at once"),
        (
            "burst",
            "fail,provision",
            "the simulator fails the first request, then provisions",
        ),
    ];
    let mut workloads = Vec::new();
    for (name, script, what) in jobs {
        let job = env
            .job_with_pod_annotations(name, "lq", "1", 2, &[(SCRIPT_ANNOTATION, script)])
            .await?;
        let wl = env.workload_for_job(&job).await?.name_any();
        narrator.say(&format!(
            "submitted Job {name} (2 pods, 1 cpu each; {what}): Workload {wl}"
        ));
        workloads.push(wl);
    }
    Ok(workloads)
}

/// Narrates every change of the Workloads' check entries and of the requests, until every
/// Workload of `waiting` is admitted.
async fn narrate_until_admitted(
    env: &TestEnv,
    check: &str,
    mut waiting: Vec<String>,
    narrator: &mut Narrator,
) -> Result<()> {
    let workloads = changes(env, Seen::Workload);
    let requests = changes(env, Seen::Request);
    let mut events = std::pin::pin!(futures::stream::select(workloads, requests));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    while !waiting.is_empty() {
        let event = tokio::time::timeout_at(deadline, events.next())
            .await
            .context("the Jobs were not admitted within 3 minutes; see the controller's log")?;
        let Some(event) = event else {
            bail!("the watch ended");
        };
        match event? {
            Seen::Workload(wl) => {
                let name = wl.name_any();
                if let Some(line) = check_entry(&wl, check) {
                    let msg = format!("Workload {name}: check {line}");
                    narrator.say_if_changed(format!("wl/{name}"), &line, &msg);
                }
                if wl.condition_is_true(cond::ADMITTED) && waiting.contains(&name) {
                    narrator.say(&format!(
                        "Workload {name} admitted: Kueue unsuspends its Job with the podSetUpdates"
                    ));
                    waiting.retain(|w| w != &name);
                }
            }
            Seen::Request(r) => {
                let line = request_state(&r);
                let msg = format!("ProvisioningRequest {}: {line}", r.name_any());
                narrator.say_if_changed(format!("pr/{}", r.name_any()), &line, &msg);
            }
        }
    }
    Ok(())
}

/// The Workload's entry for `check`, as the narrator tells it. Kueue adds the entry `Pending`
/// with an empty message before anything answers it: then the line says what is going on
/// (no quota yet, so the check is not asked; or quota reserved, the check's first answer,
/// which makes the ProvisioningRequest, not written yet) instead of printing nothing.
fn check_entry(wl: &Workload, check: &str) -> Option<String> {
    let e = wl.admission_check(check)?;
    let message = match (
        e.message.is_empty(),
        wl.condition_is_true(cond::QUOTA_RESERVED),
    ) {
        (false, _) => e.message.clone(),
        (true, false) => "entry added by Kueue; no quota reserved yet, so the check is not \
                          asked"
            .to_string(),
        (true, true) => "quota reserved; the check has not answered yet (its first answer \
                         creates the ProvisioningRequest)"
            .to_string(),
    };
    let mut line = format!("{:?}: {message}", e.state);
    if let Some(d) = e.requeue_after_seconds {
        line.push_str(&format!(" (requeueAfterSeconds {d})"));
    }
    if let Some(n) = e.retry_count {
        line.push_str(&format!(" (retryCount {n})"));
    }
    Some(line)
}

/// A request's true conditions, or `created` while it has none.
fn request_state(r: &ProvisioningRequest) -> String {
    let conditions: Vec<String> = r
        .status
        .iter()
        .flat_map(|s| s.conditions.iter())
        .filter(|c| c.status == "True")
        .map(|c| c.type_.clone())
        .collect();
    if conditions.is_empty() {
        "created".to_string()
    } else {
        conditions.join(", ")
    }
}

/// Every object of kind `K` in the demo's namespace, as it is created or changed.
fn changes<K>(
    env: &TestEnv,
    seen: fn(K) -> Seen,
) -> impl futures::Stream<Item = Result<Seen, watcher::Error>> + use<K>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    watcher(
        Api::<K>::namespaced(env.client.clone(), &env.ns),
        watcher::Config::default(),
    )
    .default_backoff()
    .applied_objects()
    .map(move |r| r.map(seen))
}

enum Seen {
    Workload(Workload),
    Request(ProvisioningRequest),
}

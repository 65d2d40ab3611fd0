//! The chaos soak: a seeded load of Workloads through the provisioning, license, budget and
//! capacity-buffer checks, each served by two replicas running as real processes with leader
//! election, while leaders are killed with `kill -9`, the apiserver, Kueue and Karpenter
//! restart, the autoscaler simulator pauses, a check leaves its ClusterQueue and comes back, a
//! config changes and a second writer causes conflicts; an independent [`recorder`] and its
//! witnesses check the invariants on everything they see.
//!
//! Run by `make soak` (full size) and, short, by `tests/run-all.sh` after the end-to-end suite
//! (it restarts the shared control plane's apiserver, so nothing else may run beside it).
//! Figures and the invariants are in `docs/reliability.md`.

pub mod buffers;
pub mod plan;
pub mod pods;
pub mod recorder;
pub mod replicas;
pub mod witness;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use autoscaler_simulator::SCRIPT_ANNOTATION;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, PodTemplate};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kueue_admission_sdk::api::{
    ClusterQueue, ProvisioningRequest, ProvisioningRequestConfig, Workload,
};
use kueue_capacity_buffer_controller::api::{CapacityBuffer, NodeClaim};
use kueue_provisioning_controller::identity::{INSTANCE_LABEL, instance_label};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use buffers::{BufferSide, BufferWitness};
use e2e::TestEnv;
use plan::{End, Fault, FaultKind, Plan, Queue, Shape, WorkloadPlan};
use pods::Capacity;
use recorder::{Invariant, Recorder};
use replicas::{Spec, Supervisor};

/// A soak's settings.
#[derive(Clone, Debug)]
pub struct SoakConfig {
    /// The seed of the plan.
    pub seed: u64,
    /// Workloads in all.
    pub workloads: usize,
    /// Workloads under way at once at most (submission waits beyond).
    pub in_flight: usize,
    /// Where the results, the logs and the timelines go.
    pub out: PathBuf,
    /// Where the controllers' executables are.
    pub bin_dir: PathBuf,
}

/// The license check's ledger ConfigMap.
const LEDGER: &str = "license-ledger";
/// Field manager of the driver's own writes.
const DRIVER: &str = "soak-driver";
/// The controllers' client budget in the soak (requests per second, burst).
pub const CLIENT_QPS: u32 = 50;
/// See [`CLIENT_QPS`].
pub const CLIENT_BURST: u32 = 100;
/// Annotation the second writer touches.
const TOUCHED: &str = "soak.kueue-admission-checks.dev/touched";

/// The names a run uses.
#[derive(Clone, Debug)]
struct Names {
    ns: String,
    prov_controller: String,
    license_controller: String,
    budget_controller: String,
    buffer_controller: String,
    class: String,
    prc_split: String,
    check_split: String,
    check_merge: String,
    check_license: String,
    check_budget: String,
    check_buffer: String,
    /// The label key that dedicates Karpenter's Nodes to a Workload.
    buffer_label: String,
    cq: BTreeMap<Queue, String>,
}

impl Names {
    /// (short name, AdmissionCheck name) of the checks whose entries the recorder checks.
    fn checks(&self) -> Vec<(String, String)> {
        vec![
            ("prov".to_string(), self.check_split.clone()),
            ("prov-merge".to_string(), self.check_merge.clone()),
            ("license".to_string(), self.check_license.clone()),
            ("budget".to_string(), self.check_budget.clone()),
            ("buffer".to_string(), self.check_buffer.clone()),
        ]
    }

    /// What the capacity-buffer witness needs.
    fn buffer_side(&self) -> BufferSide {
        BufferSide {
            check: self.check_buffer.clone(),
            node_label: self.buffer_label.clone(),
            instance: kueue_capacity_buffer_controller::names::instance(&self.buffer_controller),
        }
    }
}

/// What a run saw; [`Report::check`] fails it.
#[derive(Debug)]
pub struct Report {
    /// The results file.
    pub results: PathBuf,
    /// The text written there.
    pub text: String,
    /// Whether every invariant held.
    pub passed: bool,
    /// The first violations, a line each: repeated last, so that the tail of a CI log names them.
    pub broken: Vec<String>,
}

/// Runs the soak on the shared control plane in a namespace of its own: plan, start the
/// controllers, play the load with its faults, drain, judge, report.
pub async fn run(config: SoakConfig) -> Result<Report> {
    let plan = Arc::new(Plan::generate(config.seed, config.workloads));
    std::fs::create_dir_all(&config.out)?;
    announce(&config, &plan);
    let soak = Soak::start(&config, plan).await?;
    let faults = soak.schedule_faults();
    let stalls = soak.sweep_stalls();
    let took = soak.play_load(config.in_flight, faults).await;
    let leaks = soak.drain().await;
    stalls.abort();
    soak.judge_leaks(&leaks);
    soak.buffers.judge_claims();
    let metrics = check_metrics(&soak.env, &soak.supervisor, &soak.recorder).await;
    let exits = soak.supervisor.exits();
    let processes = soak.supervisor.slots.len();
    soak.judge_exits(&exits);
    let pods = soak.judge_pods();
    let buffer_counts = soak.buffers.counts();
    let recorder = soak.recorder.clone();
    let plan = soak.plan.clone();
    let faults = soak.stop().await;
    let seen = Seen {
        faults,
        exits,
        leaks,
        metrics,
        pods,
        buffers: buffer_counts,
        took,
        processes,
    };
    let text = report(&config, &plan, &recorder, &seen);
    let results = config.out.join("results.md");
    std::fs::write(&results, &text)?;
    let violations = recorder.violations();
    let passed = violations.is_empty();
    let broken = violations.iter().take(10).map(|v| v.line(&plan)).collect();
    Ok(Report {
        results,
        text,
        passed,
        broken,
    })
}

/// The plan and where the results go, first thing (the seed replays the run).
fn announce(config: &SoakConfig, plan: &Plan) {
    println!(
        "soak: seed {} — {} Workloads over {:.0?} ({:?}), {} faults: {:?}",
        config.seed,
        plan.workloads.len(),
        plan.load_duration,
        plan.ends(),
        plan.faults.len(),
        plan.fault_counts()
    );
    println!(
        "soak: results, logs and timelines in {} (commit {})",
        config.out.display(),
        commit()
    );
}

/// A fault as it went: when it began and ended (since the load began), its kind's label and
/// what it did or why it was skipped.
#[derive(Clone, Debug)]
struct FaultDone {
    began: Duration,
    at: Duration,
    label: String,
    outcome: String,
}

/// What the run saw besides the recorder, for the report.
#[derive(Debug)]
struct Seen {
    faults: Vec<FaultDone>,
    exits: Vec<replicas::Exit>,
    leaks: Vec<(String, usize)>,
    metrics: Vec<String>,
    /// What the pod witness judged.
    pods: pods::PodVerdict,
    /// What the capacity-buffer witness checked.
    buffers: buffers::BufferCounts,
    /// The load phase and its drain.
    took: Duration,
    processes: usize,
}

/// A soak under way: the namespace, the witness, the controllers' processes and the tasks
/// beside them.
struct Soak {
    plan: Arc<Plan>,
    env: TestEnv,
    names: Names,
    recorder: Arc<Recorder>,
    supervisor: Arc<Supervisor>,
    /// The recorder's watches, and the pod witness's.
    watches: Vec<tokio::task::JoinHandle<()>>,
    /// Where the Jobs' pods ran.
    pods: pods::PodWitness,
    /// The capacity-buffer check's buffers, NodeClaims and protections.
    buffers: BufferWitness,
    /// [`play_the_owner`].
    owner: tokio::task::JoinHandle<()>,
    /// When the load began: faults and submissions are timed from here.
    started: Instant,
    faults_done: Arc<std::sync::Mutex<Vec<FaultDone>>>,
}

impl Soak {
    /// Sets the namespace up, starts the recorder and the controllers, and waits until each
    /// controller has a leader.
    async fn start(config: &SoakConfig, plan: Arc<Plan>) -> Result<Self> {
        let env = TestEnv::new("soak").await?;
        let names = setup(&env).await?;
        let recorder = Arc::new(Recorder::new(
            plan.clone(),
            names.checks(),
            names.check_license.clone(),
        ));
        let (evicted_tx, evicted_rx) = tokio::sync::mpsc::unbounded_channel();
        recorder.on_evicted_plain(evicted_tx);
        let owner = tokio::spawn(play_the_owner(env.clone(), evicted_rx));
        let mut watches = recorder::start(recorder.clone(), &env.client, &env.ns, LEDGER).await?;
        let pods = pods::PodWitness::default();
        watches.extend(pods::start(pods.clone(), &env.client, &env.ns).await?);
        let buffers = BufferWitness::new(names.buffer_side(), recorder.clone());
        watches.extend(buffers::start(buffers.clone(), &env.client, &env.ns).await?);
        let supervisor = Arc::new(Supervisor::start(
            specs(config, &names),
            &config.out.join("logs"),
        )?);
        wait_for_leaders(&env, &supervisor).await?;
        Ok(Self {
            plan,
            env,
            names,
            recorder,
            supervisor,
            watches,
            pods,
            buffers,
            owner,
            started: Instant::now(),
            faults_done: Arc::default(),
        })
    }

    /// One task per planned fault: each waits for its time, injects it and notes the outcome.
    fn schedule_faults(&self) -> Vec<tokio::task::JoinHandle<()>> {
        let started = self.started;
        self.plan
            .faults
            .iter()
            .cloned()
            .map(|fault| {
                let (env, names, supervisor, recorder, done) = (
                    self.env.clone(),
                    self.names.clone(),
                    self.supervisor.clone(),
                    self.recorder.clone(),
                    self.faults_done.clone(),
                );
                tokio::spawn(async move {
                    tokio::time::sleep_until((started + fault.at).into()).await;
                    let began = started.elapsed();
                    let outcome = inject(&env, &names, &supervisor, &recorder, &fault).await;
                    let outcome = match outcome {
                        Ok(s) => s,
                        Err(e) => format!("skipped: {e:#}"),
                    };
                    println!(
                        "soak: {:>6.1}s {}: {outcome}",
                        started.elapsed().as_secs_f64(),
                        fault.kind
                    );
                    lock(&done).push(FaultDone {
                        began,
                        at: started.elapsed(),
                        label: fault.kind.label().to_string(),
                        outcome,
                    });
                })
            })
            .collect()
    }

    /// Every 5 s, the recorder looks for Workloads holding quota without progress, and the
    /// capacity-buffer witness for Nodes protected past their bound.
    fn sweep_stalls(&self) -> tokio::task::JoinHandle<()> {
        let (recorder, buffers) = (self.recorder.clone(), self.buffers.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                recorder.check_stalls();
                buffers.sweep_protections(recorder.calm_since());
            }
        })
    }

    /// Drives every planned Workload (at most `in_flight` at once) while `faults` play, and
    /// returns once all are done (or past a bound): how long that took.
    async fn play_load(
        &self,
        in_flight: usize,
        faults: Vec<tokio::task::JoinHandle<()>>,
    ) -> Duration {
        let drivers = self.schedule_workloads(in_flight);
        let progress = self.report_progress();
        // Every driver ends by itself (each wait is bounded); the whole is bounded too.
        let deadline = self.plan.load_duration + recorder::END_BOUND + Duration::from_secs(180);
        let all = futures::future::join_all(drivers);
        if tokio::time::timeout(deadline, all).await.is_err() {
            println!("soak: the drivers did not finish within {deadline:?}");
        }
        for t in faults {
            let _ = t.await;
        }
        let took = self.started.elapsed();
        progress.abort();
        took
    }

    /// One task per planned Workload: each waits for its time and a place in flight, then
    /// drives the Workload's life.
    fn schedule_workloads(&self, in_flight: usize) -> Vec<tokio::task::JoinHandle<()>> {
        let started = self.started;
        let gate = Arc::new(Semaphore::new(in_flight));
        self.plan
            .workloads
            .iter()
            .cloned()
            .map(|w| {
                let (env, recorder, gate) = (self.env.clone(), self.recorder.clone(), gate.clone());
                tokio::spawn(async move {
                    tokio::time::sleep_until((started + w.submit_at).into()).await;
                    let Ok(_permit) = gate.acquire_owned().await else {
                        return;
                    };
                    if let Err(e) = drive(&env, &recorder, &w).await {
                        recorder.driver_note(w.index, &format!("gave up: {e:#}"));
                    }
                })
            })
            .collect()
    }

    /// Every 30 s, a line of how far the load is.
    fn report_progress(&self) -> tokio::task::JoinHandle<()> {
        let (recorder, plan, started) = (self.recorder.clone(), self.plan.clone(), self.started);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(30)).await;
                let ended = (0..plan.workloads.len())
                    .filter(|i| recorder.ended(*i))
                    .count();
                let c = recorder.counts();
                println!(
                    "soak: {:>6.1}s {ended}/{} at their end state, {} versions, {} admissions, {} violations",
                    started.elapsed().as_secs_f64(),
                    plan.workloads.len(),
                    c.versions,
                    c.admissions,
                    recorder.violations().len()
                );
            }
        })
    }

    /// Ends what the load left and waits for the controllers to clean up: what is left by kind.
    async fn drain(&self) -> Vec<(String, usize)> {
        let unfinished = self.recorder.give_up_on_unfinished();
        if unfinished > 0 {
            println!("soak: {unfinished} Workloads never reached their end state");
        }
        // Whatever the drivers left (a Workload they gave up on) goes now, so that the leak check
        // sees what the controllers clean up, not what the run abandoned.
        delete_everything(&self.env).await;
        wait_for_no_leaks(&self.env, &self.names).await
    }

    fn judge_leaks(&self, leaks: &[(String, usize)]) {
        for (what, n) in leaks {
            if *n > 0 {
                self.recorder
                    .record(Invariant::NoLeaks, None, format!("{n} {what} left"));
            }
        }
    }

    /// Holds every pod of a Job seen to [`Invariant::PodsOnTheirCapacity`]. The simulator is
    /// scripted here (fault injection), so the capacity a request provisions is the flavor's
    /// standing Node: a pod must consume a request provisioned for its own Workload by its
    /// queue's provisioning check, and run on a Node of the flavor's label. Karpenter is real:
    /// a pod of the capacity-buffer queue runs on a Node made for its own Workload.
    fn judge_pods(&self) -> pods::PodVerdict {
        let n = &self.names;
        let pool = vec![("pool".to_string(), "pool".to_string())];
        let standing = |check: Option<&String>| Capacity::Standing {
            labels: pool.clone(),
            check: check.cloned(),
        };
        let capacity = BTreeMap::from([
            (Queue::Provisioning, standing(Some(&n.check_split))),
            (Queue::Merged, standing(Some(&n.check_merge))),
            (Queue::Licensed, standing(Some(&n.check_split))),
            (Queue::Budgeted, standing(None)),
            (
                Queue::Buffered,
                Capacity::Dedicated {
                    label: n.buffer_label.clone(),
                    check: n.check_buffer.clone(),
                },
            ),
        ]);
        let verdict = self.pods.judge(&self.plan, &capacity);
        for v in &verdict.violations {
            self.recorder
                .record(Invariant::PodsOnTheirCapacity, None, v.clone());
        }
        let admitted_jobs =
            self.plan.workloads.iter().enumerate().any(|(i, w)| {
                matches!(w.shape, Shape::Job { .. }) && self.recorder.was_admitted(i)
            });
        if admitted_jobs && verdict.pods == 0 {
            self.recorder.record(
                Invariant::PodsOnTheirCapacity,
                None,
                "Jobs were admitted, yet no pod of theirs was seen bound to a Node".into(),
            );
        }
        verdict
    }

    /// A process that exited unless the soak killed it or a restart of the control plane
    /// stopped it, or a panic in any log, breaks [`Invariant::NoPanics`].
    fn judge_exits(&self, exits: &[replicas::Exit]) {
        let restarts = lock(&self.faults_done)
            .iter()
            .filter(|f| f.label.contains("restarted"))
            .map(|f| (f.began, f.at))
            .collect::<Vec<_>>();
        let unexpected: Vec<&replicas::Exit> = exits
            .iter()
            .filter(|e| !e.killed && !near_restart(e.at, &restarts))
            .collect();
        for e in &unexpected {
            self.recorder.record(
                Invariant::NoPanics,
                None,
                format!(
                    "{} generation {} exited ({}) at {:.0?}",
                    e.slot, e.generation, e.status, e.at
                ),
            );
        }
        for p in self.supervisor.panics() {
            self.recorder.record(Invariant::NoPanics, None, p);
        }
    }

    /// Stops the controllers and the tasks beside them; returns the faults as they went.
    async fn stop(self) -> Vec<FaultDone> {
        let faults = lock(&self.faults_done).clone();
        let supervisor = Arc::try_unwrap(self.supervisor).ok();
        if let Some(s) = supervisor {
            s.stop().await;
        }
        for w in self.watches {
            w.abort();
        }
        self.owner.abort();
        faults
    }
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The last lines of Kueue's log (the control plane's, beside its kubeconfig) that name the
/// Workload `name`, and each restart of Kueue among them.
fn kueue_log_of(name: &str) -> Vec<String> {
    let Some(path) = e2e::kubeconfig_path()
        .parent()
        .map(|d| d.join("logs/kueue.log"))
    else {
        return vec!["(no log directory beside the kubeconfig)".into()];
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => return vec![format!("(reading {}: {e})", path.display())],
    };
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(name) || l.contains("\"msg\":\"Starting manager\""))
        .collect();
    let from = lines.len().saturating_sub(30);
    lines[from..]
        .iter()
        .map(|l| l.chars().take(400).collect())
        .collect()
}

/// An exit during a restart of the apiserver or Kueue (`(began, ended)`), or within 60 s after
/// it ended: a leader that could not renew its Lease stops, as it must, and is started again.
/// Timed from the restart's beginning: on a slow machine the apiserver can take 50 s to come
/// back, and a leader gives up 10-15 s into the outage.
fn near_restart(at: Duration, restarts: &[(Duration, Duration)]) -> bool {
    restarts
        .iter()
        .any(|&(began, ended)| at >= began && at <= ended + Duration::from_secs(60))
}

impl Report {
    /// Fails unless every invariant held.
    pub fn check(&self) -> Result<()> {
        if !self.passed {
            bail!(
                "the soak broke invariants; see {} (timelines of the Workloads concerned are at \
                 its end). The first:\n  {}",
                self.results.display(),
                self.broken.join("\n  ")
            );
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Setup

async fn setup(env: &TestEnv) -> Result<Names> {
    let ns = env.ns.clone();
    let prov_controller = format!("soak.kueue-admission-checks.dev/prov-{ns}");
    let license_controller = format!("soak.kueue-admission-checks.dev/license-{ns}");
    let budget_controller = format!("soak.kueue-admission-checks.dev/budget-{ns}");
    let retry = json!({"retryStrategy": {
        "backoffLimitCount": plan::PROVISIONING_RETRIES,
        "backoffBaseSeconds": 1,
        "backoffMaxSeconds": 8,
    }});
    let prc_split = env.provisioning_config("prc-split", retry.clone()).await?;
    let mut merge = retry;
    merge["podSetMergePolicy"] = "IdenticalPodTemplates".into();
    let prc_merge = env.provisioning_config("prc-merge", merge).await?;
    let check_split = env
        .provisioning_check("prov-split", &prov_controller, &prc_split)
        .await?;
    let check_merge = env
        .provisioning_check("prov-merge", &prov_controller, &prc_merge)
        .await?;
    let check_license = env
        .admission_check("license", &license_controller)
        .await?
        .name_any();
    let check_budget = env
        .admission_check("budget", &budget_controller)
        .await?
        .name_any();
    let flavor = env.provisioning_flavor("pool").await?;
    let mut cq = BTreeMap::new();
    for (queue, checks) in [
        (Queue::Provisioning, vec![check_split.as_str()]),
        (Queue::Merged, vec![check_merge.as_str()]),
        (
            Queue::Licensed,
            vec![check_license.as_str(), check_split.as_str()],
        ),
        (Queue::Budgeted, vec![check_budget.as_str()]),
    ] {
        let name = env
            .cluster_queue(queue.name(), &flavor, "40", &checks)
            .await?
            .name_any();
        env.local_queue(queue.name(), &name).await?;
        cq.insert(queue, name);
    }
    let buffer = setup_buffered(env).await?;
    cq.insert(Queue::Buffered, buffer.cluster_queue.clone());
    let maps: Api<ConfigMap> = Api::namespaced(env.client.clone(), &ns);
    for (name, data) in [
        (
            "license-pool",
            json!({"solver": plan::LICENSE_POOL.to_string()}),
        ),
        ("budgets", json!({ns.clone(): "100000/day"})),
    ] {
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns},
            "data": data,
        }))?;
        maps.create(&PostParams::default(), &cm)
            .await
            .with_context(|| format!("creating ConfigMap {name}"))?;
    }
    Ok(Names {
        class: env.provisioning_class(),
        ns,
        prov_controller,
        license_controller,
        budget_controller,
        buffer_controller: buffer.controller_name,
        prc_split,
        check_split,
        check_merge,
        check_license,
        check_budget,
        check_buffer: buffer.check,
        buffer_label: buffer.node_label,
        cq,
    })
}

/// The capacity-buffer queue: Karpenter's NodePool for the run's dedication label (room for
/// every buffered Workload under way at once), the check's config (a short grace for pods
/// Karpenter cannot place, a short protection so that the protections of Workloads without pods
/// end during the run, the retries of [`plan::BUFFER_RETRIES`]), its AdmissionCheck and queue.
async fn setup_buffered(env: &TestEnv) -> Result<e2e::karpenter::BufferWorld> {
    let spec = json!({
        "provisioningTimeoutSeconds": plan::BUFFER_TIMEOUT.as_secs(),
        "unprovisionableGraceSeconds": 2,
        "protectionSeconds": plan::BUFFER_PROTECTION.as_secs(),
        "retryStrategy": {
            "backoffLimitCount": plan::BUFFER_RETRIES,
            "backoffBaseSeconds": 1,
            "backoffMaxSeconds": 4,
        },
    });
    let name = Queue::Buffered.name();
    env.buffer_world_on("400", "40", spec, (name, name), &[])
        .await
        .context("setting up the capacity-buffer queue (Karpenter must run: `control-plane.sh start-karpenter`)")
}

/// Two replicas of each controller with leader election (a 6 s Lease, so that a killed
/// leader's successor takes over within seconds), one simulator.
fn specs(config: &SoakConfig, names: &Names) -> Vec<Spec> {
    let kubeconfig = e2e::kubeconfig_path().display().to_string();
    let common = |controller: &str| {
        vec![
            format!("--kubeconfig={kubeconfig}"),
            "--metrics-address={metrics}".to_string(),
            // Metrics and probes plain on one address, read without a token.
            "--metrics-secure=false".to_string(),
            "--health-address={metrics}".to_string(),
            format!("--leader-election-namespace={}", names.ns),
            format!("--leader-election-id=soak-{controller}"),
            "--lease-duration-seconds=6".to_string(),
            // At the default budget (20/s, burst 30) a provisioning leader makes about 2.5 status
            // writes a second; killed every 20 s, it falls behind the soak's arrival rate and the
            // run measures the backlog, not the invariants (docs/reliability.md).
            format!("--kube-api-qps={CLIENT_QPS}"),
            format!("--kube-api-burst={CLIENT_BURST}"),
            format!("--field-manager=soak-{controller}"),
        ]
    };
    // (controller, binary, its own flags)
    let controllers: [(&'static str, &str, Vec<String>); 4] = [
        (
            "prov",
            "kueue-provisioning-controller",
            vec![
                format!("--controller-name={}", names.prov_controller),
                format!(
                    "--provisioning-timeout-seconds={}",
                    plan::PROVISIONING_TIMEOUT.as_secs()
                ),
            ],
        ),
        (
            "license",
            "license-check",
            vec![
                format!("--controller-name={}", names.license_controller),
                format!("--namespace={}", names.ns),
                format!("--ledger-configmap={LEDGER}"),
                "--backoff-base-seconds=1".into(),
                "--backoff-max-seconds=4".into(),
                "--sweep-interval-seconds=10".into(),
            ],
        ),
        (
            "budget",
            "budget-check",
            vec![
                format!("--controller-name={}", names.budget_controller),
                format!("--namespace={}", names.ns),
                "--sweep-interval-seconds=10".into(),
            ],
        ),
        (
            "buffer",
            "kueue-capacity-buffer-controller",
            vec![
                format!("--controller-name={}", names.buffer_controller),
                // Pods Karpenter cannot place hold the quota this long before it goes back.
                "--permanent-failure-hold-seconds=4".into(),
            ],
        ),
    ];
    let mut specs = Vec::new();
    for replica in 0..2 {
        for (controller, binary, own) in &controllers {
            let mut args = common(controller);
            args.extend(own.iter().cloned());
            specs.push(Spec {
                slot: format!("{controller}-{replica}"),
                controller,
                program: config.bin_dir.join(binary),
                args,
            });
        }
    }
    specs.push(Spec {
        slot: "simulator".into(),
        controller: "simulator",
        program: config.bin_dir.join("autoscaler-simulator"),
        args: vec![
            format!("--kubeconfig={kubeconfig}"),
            // Scripted (fault injection), and only in the soak's namespace.
            format!("--scripted-class={}", names.class),
            format!("--namespace={}", names.ns),
        ],
    });
    specs
}

/// The Lease of `controller` and the `POD_NAME` of its holder, if it is held and not expired.
async fn leader(env: &TestEnv, controller: &str) -> Result<Option<String>> {
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), &env.ns);
    let Some(lease) = leases.get_opt(&format!("soak-{controller}")).await? else {
        return Ok(None);
    };
    let Some(spec) = lease.spec else {
        return Ok(None);
    };
    let (Some(holder), Some(renewed), Some(duration)) = (
        spec.holder_identity,
        spec.renew_time,
        spec.lease_duration_seconds,
    ) else {
        return Ok(None);
    };
    let expires = renewed.0 + k8s_openapi::jiff::SignedDuration::from_secs(duration.into());
    if holder.is_empty() || expires < k8s_openapi::jiff::Timestamp::now() {
        return Ok(None);
    }
    Ok(holder.rsplit_once('_').map(|(pod, _)| pod.to_string()))
}

async fn wait_for_leaders(env: &TestEnv, supervisor: &Supervisor) -> Result<()> {
    let deadline = Instant::now() + e2e::DEFAULT_TIMEOUT;
    for controller in plan::CONTROLLERS {
        loop {
            if let Some(pod) = leader(env, controller).await?
                && supervisor.by_pod_name(&pod).is_some()
            {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "no {controller} replica took the lead within {:?}; logs in {}",
                    e2e::DEFAULT_TIMEOUT,
                    supervisor.log_dir.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The load

/// Retries `f` while the API is away (the apiserver or Kueue's webhook restarting), for at most
/// three minutes; `ok_if` turns an error into success (already exists, not found).
async fn retrying<T, F, Fut>(
    what: &str,
    ok_if: impl Fn(&kube::Error) -> Option<T>,
    f: F,
) -> Result<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = std::result::Result<T, kube::Error>>,
{
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) => {
                if let Some(v) = ok_if(&e) {
                    return Ok(v);
                }
                if !transient(&e) {
                    return Err(e).with_context(|| what.to_string());
                }
                if Instant::now() > deadline {
                    return Err(e).with_context(|| format!("{what} (retried for 180 s)"));
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

/// An error that a later try may not meet: the API away (connection, 5xx, e.g. Kueue's webhook
/// restarting), throttled, or a conflict.
fn transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code >= 500 || s.code == 429 || s.code == 409,
        _ => true,
    }
}

fn code_is(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

fn pod_template(w: &WorkloadPlan, per_pod_licenses: bool) -> Value {
    let mut annotations = serde_json::Map::new();
    if w.queue.provisions() {
        annotations.insert(SCRIPT_ANNOTATION.into(), w.script.clone().into());
    }
    if per_pod_licenses && w.licenses > 0 {
        annotations.insert(
            license_check::request::LICENSES_ANNOTATION.into(),
            format!("solver={}", w.licenses).into(),
        );
    }
    let mut template = e2e::pod_template(annotations.into(), "1");
    if w.unplaceable {
        // The run's NodePool offers amd64 Nodes only: Karpenter can place none of these pods.
        template["spec"]["nodeSelector"] = json!({"kubernetes.io/arch": "arm64"});
    }
    template
}

async fn submit(env: &TestEnv, w: &WorkloadPlan) -> Result<()> {
    let name = w.name();
    match &w.shape {
        Shape::Job { parallelism } => {
            let job: Job = serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": w.queue.name()}},
                "spec": {
                    "suspend": true,
                    "parallelism": parallelism,
                    "completions": parallelism,
                    "template": pod_template(w, true),
                },
            }))?;
            create_once(&env.jobs(), &job).await
        }
        Shape::Plain { counts } => {
            let mut annotations = serde_json::Map::new();
            if w.licenses > 0 {
                annotations.insert(
                    license_check::request::LICENSES_ANNOTATION.into(),
                    format!("solver={}", w.licenses).into(),
                );
            }
            let pod_sets: Vec<Value> = counts
                .iter()
                .enumerate()
                .map(|(i, c)| json!({"name": format!("ps{i}"), "count": c, "template": pod_template(w, false)}))
                .collect();
            let wl: Workload = serde_json::from_value(json!({
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "Workload",
                "metadata": {"name": name, "namespace": env.ns, "annotations": annotations},
                "spec": {"queueName": w.queue.name(), "podSets": pod_sets},
            }))?;
            create_once(&env.workloads(), &wl).await
        }
    }
}

/// Creates `object`, retrying on errors; one that exists already (a retried create that went
/// through) is created.
async fn create_once<K>(api: &Api<K>, object: &K) -> Result<()>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::Serialize + serde::de::DeserializeOwned,
    K: std::fmt::Debug,
{
    retrying(
        &format!(
            "creating {} {}",
            K::kind(&Default::default()),
            object.name_any()
        ),
        |e| code_is(e, 409).then_some(()),
        || async { api.create(&PostParams::default(), object).await.map(|_| ()) },
    )
    .await
}

/// Deletes the Job (if any) and the Workload of `w`.
async fn remove(env: &TestEnv, w: &WorkloadPlan, workload: Option<&str>) -> Result<()> {
    let gone = |e: &kube::Error| code_is(e, 404).then_some(());
    if matches!(w.shape, Shape::Job { .. }) {
        let jobs = env.jobs();
        let name = w.name();
        retrying(&format!("deleting Job {name}"), gone, || async {
            jobs.delete(&name, &DeleteParams::background())
                .await
                .map(|_| ())
        })
        .await?;
    }
    if let Some(wl) = workload {
        let api = env.workloads();
        retrying(&format!("deleting Workload {wl}"), gone, || async {
            api.delete(wl, &DeleteParams::default()).await.map(|_| ())
        })
        .await?;
    }
    Ok(())
}

/// What a job integration does once Kueue evicted its Workload (Kueue's batch/v1 Job
/// integration does it after suspending the Job): give the quota back, so that Kueue requeues
/// the Workload. Kueue leaves a Workload without an owner `QuotaReserved` and `Evicted` forever
/// otherwise. Each name is handled once per announcement, with a fresh read.
async fn play_the_owner(env: TestEnv, mut evicted: tokio::sync::mpsc::UnboundedReceiver<String>) {
    let mut under_way = tokio::task::JoinSet::new();
    while let Some(name) = evicted.recv().await {
        let env = env.clone();
        under_way.spawn(async move {
            if let Err(e) = e2e::release_quota(&env, &name).await {
                eprintln!("soak: releasing the quota of evicted Workload {name}: {e:#}");
            }
        });
        while under_way.try_join_next().is_some() {}
    }
}

/// Marks a directly created Workload finished, as its owner would once its pods completed.
async fn finish_plain(env: &TestEnv, name: &str) -> Result<()> {
    let api = env.workloads();
    let patch = json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "status": {"conditions": [{
            "type": "Finished",
            "status": "True",
            "reason": "Succeeded",
            "message": "finished by the soak driver",
            "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string(),
        }]},
    });
    retrying(
        &format!("finishing Workload {name}"),
        |e| code_is(e, 404).then_some(()),
        || async {
            api.patch_status(
                name,
                &PatchParams::apply(DRIVER).force(),
                &Patch::Apply(&patch),
            )
            .await
            .map(|_| ())
        },
    )
    .await
}

/// One Workload's life as the plan has it: submitted, then deleted mid-flight, or admitted and
/// finished after its hold, or rejected; then removed. Every wait is bounded.
async fn drive(env: &TestEnv, recorder: &Recorder, w: &WorkloadPlan) -> Result<()> {
    let mut seen = recorder.subscribe(w.index);
    recorder.submitted(w.index);
    submit(env, w).await?;
    let bound = recorder::END_BOUND + Duration::from_secs(30);
    if let Some(after) = w.delete_after {
        tokio::time::sleep(after).await;
        let name = seen.borrow().name.clone();
        remove(env, w, name.as_deref()).await?;
        recorder.driver_note(w.index, "deleted mid-flight");
        if name.is_none() {
            // A Job deleted before Kueue made its Workload: give Kueue a moment to show one.
            match wait(&mut seen, Duration::from_secs(10), |o| o.name.is_some()).await {
                Some(o) => remove(env, w, o.name.as_deref()).await?,
                None => recorder.never_created(w.index),
            }
        }
        wait(&mut seen, bound, |o| o.deleted).await;
        return Ok(());
    }
    let Some(observed) = wait(&mut seen, bound, |o| o.admitted || o.rejected || o.deleted).await
    else {
        let name = seen.borrow().name.clone();
        recorder.driver_note(w.index, "no end state in time; removing it");
        remove(env, w, name.as_deref()).await?;
        return Ok(());
    };
    if observed.admitted && w.end == End::Revoked {
        // Kept admitted until the revoked capacity deactivates it.
        wait(&mut seen, bound, |o| o.rejected || o.deleted).await;
        let name = seen.borrow().name.clone();
        remove(env, w, name.as_deref()).await?;
    } else if observed.admitted {
        // Held, then finished while admitted (it may be evicted meanwhile: finished once
        // admitted again).
        let first = observed.first_admitted.unwrap_or_else(Instant::now);
        tokio::time::sleep_until((first + w.hold).into()).await;
        wait(&mut seen, bound, |o| o.admitted || o.deleted).await;
        let name = seen
            .borrow()
            .name
            .clone()
            .context("an admitted Workload has a name")?;
        match w.shape {
            Shape::Job { .. } => {
                // Kueue marks the Workload of a vanished Job Finished.
                remove(env, w, None).await?;
            }
            Shape::Plain { .. } => finish_plain(env, &name).await?,
        }
        recorder.driver_note(w.index, "finished");
        wait(&mut seen, bound, |o| o.finished || o.deleted).await;
        remove(env, w, Some(&name)).await?;
    } else {
        let name = seen.borrow().name.clone();
        remove(env, w, name.as_deref()).await?;
    }
    wait(&mut seen, bound, |o| o.deleted).await;
    Ok(())
}

/// What the recorder observed of a Workload once `until` holds, or `None` after `bound`.
async fn wait(
    seen: &mut tokio::sync::watch::Receiver<recorder::Observed>,
    bound: Duration,
    until: impl FnMut(&recorder::Observed) -> bool,
) -> Option<recorder::Observed> {
    match tokio::time::timeout(bound, seen.wait_for(until)).await {
        Ok(Ok(o)) => Some(o.clone()),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------
// Faults

/// The local control plane's script, which restarts its components.
fn control_plane_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/control-plane/control-plane.sh")
}

async fn control_plane(what: &str, component: &str) -> Result<String> {
    let script = control_plane_script();
    let began = Instant::now();
    let out = tokio::process::Command::new("bash")
        .arg(&script)
        .args([what, component])
        .output()
        .await
        .context("running control-plane.sh")?;
    anyhow::ensure!(
        out.status.success(),
        "control-plane.sh {what} {component} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(format!("{component} back after {:.1?}", began.elapsed()))
}

/// Injects `fault`: what it did, or why it could not.
async fn inject(
    env: &TestEnv,
    names: &Names,
    supervisor: &Supervisor,
    recorder: &Recorder,
    fault: &Fault,
) -> Result<String> {
    match &fault.kind {
        FaultKind::KillLeader(controller) => kill_leader(env, supervisor, controller).await,
        FaultKind::RestartApiserver => restart(recorder, "kube-apiserver").await,
        FaultKind::RestartKueue => restart(recorder, "kueue").await,
        FaultKind::RestartKarpenter => restart(recorder, "karpenter").await,
        FaultKind::PauseSimulator(d) => pause_simulator(supervisor, recorder, *d).await,
        FaultKind::RemoveCheck(d) => remove_check(env, names, *d).await,
        FaultKind::ChangeConfig(d) => change_config(env, names, *d).await,
        FaultKind::ConflictBurst(d) => conflict_burst(env, *d).await,
    }
}

/// `kill -9` of the replica the Lease of `controller` names.
async fn kill_leader(env: &TestEnv, supervisor: &Supervisor, controller: &str) -> Result<String> {
    let Some(pod) = leader(env, controller).await? else {
        bail!("no live leader to kill (a takeover under way)");
    };
    let slot = supervisor
        .by_pod_name(&pod)
        .with_context(|| format!("the Lease names {pod}, which no slot runs"))?;
    let pid = slot.signal("KILL")?;
    Ok(format!("killed {pod} (pid {pid})"))
}

/// Restarts a component of the control plane: an outage for the recorder meanwhile.
async fn restart(recorder: &Recorder, component: &str) -> Result<String> {
    recorder.outage_begins();
    let result = control_plane("restart", component).await;
    recorder.outage_ends();
    result
}

/// Stops the autoscaler simulator for `d` (`SIGSTOP`, then `SIGCONT`): an outage meanwhile.
async fn pause_simulator(
    supervisor: &Supervisor,
    recorder: &Recorder,
    d: Duration,
) -> Result<String> {
    let slot = supervisor
        .of("simulator")
        .pop()
        .context("no simulator slot")?;
    recorder.outage_begins();
    let paused = slot.signal("STOP");
    tokio::time::sleep(d).await;
    let resumed = slot.signal("CONT");
    recorder.outage_ends();
    paused?;
    resumed?;
    Ok(format!("paused for {d:?}"))
}

/// Takes the merge check off its ClusterQueue for `d`, then puts it back.
async fn remove_check(env: &TestEnv, names: &Names, d: Duration) -> Result<String> {
    let cqs: Api<ClusterQueue> = Api::all(env.client.clone());
    let cq = &names.cq[&Queue::Merged];
    let set = |checks: Value| {
        let cqs = cqs.clone();
        async move {
            retrying(
                &format!("updating ClusterQueue {cq}"),
                |_| None,
                || async {
                    cqs.patch(
                        cq,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"spec": {"admissionChecksStrategy": checks.clone()}})),
                    )
                    .await
                    .map(|_| ())
                },
            )
            .await
        }
    };
    // The list may not be empty: the strategy goes as a whole.
    set(Value::Null).await?;
    tokio::time::sleep(d).await;
    set(json!({"admissionChecks": [{"name": names.check_merge}]})).await?;
    Ok(format!("{} off {cq} for {d:?}", names.check_merge))
}

/// Doubles the split ProvisioningRequestConfig's backoff for `d`, then sets it back.
async fn change_config(env: &TestEnv, names: &Names, d: Duration) -> Result<String> {
    let prcs: Api<ProvisioningRequestConfig> = Api::all(env.client.clone());
    let set = |base: u32| {
        let prcs = prcs.clone();
        let name = names.prc_split.clone();
        async move {
            retrying(&format!("updating {name}"), |_| None, || async {
                prcs.patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"retryStrategy": {"backoffBaseSeconds": base, "backoffMaxSeconds": 4 * base}}})),
                )
                .await
                .map(|_| ())
            })
            .await
        }
    };
    set(2).await?;
    tokio::time::sleep(d).await;
    set(1).await?;
    Ok(format!("{}: backoff base 1 s → 2 s → 1 s", names.prc_split))
}

/// A second writer: for `d`, touches an annotation of every Workload, round after round, so
/// that the controllers' writes meet conflicts.
async fn conflict_burst(env: &TestEnv, d: Duration) -> Result<String> {
    let api = env.workloads();
    let touches = AtomicU64::new(0);
    let end = Instant::now() + d;
    let mut round = 0u64;
    while Instant::now() < end {
        round += 1;
        let Ok(list) = api.list_metadata(&ListParams::default()).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        for wl in list.items {
            let patch = json!({"metadata": {"annotations": {TOUCHED: round.to_string()}}});
            if api
                .patch(
                    &wl.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
                .is_ok()
            {
                touches.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    Ok(format!(
        "{} Workload updates in {round} rounds",
        touches.load(Ordering::Relaxed)
    ))
}

// ---------------------------------------------------------------------------------------------
// The end

async fn delete_everything(env: &TestEnv) {
    let jobs = env.jobs();
    let _ = jobs
        .delete_collection(&DeleteParams::background(), &ListParams::default())
        .await;
    let wls = env.workloads();
    let _ = wls
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await;
}

/// Waits (up to three minutes: orphaned templates are swept a minute after their creation, and
/// Karpenter consolidates an empty Node within two) until nothing of ours is left; returns what
/// is left by kind.
async fn wait_for_no_leaks(env: &TestEnv, names: &Names) -> Vec<(String, usize)> {
    let ours = ListParams::default().labels(&format!(
        "{INSTANCE_LABEL}={}",
        instance_label(&names.prov_controller)
    ));
    let buffer_instance = names.buffer_side().instance;
    let buffer_ours = ListParams::default().labels(&format!(
        "{}={buffer_instance}",
        kueue_capacity_buffer_controller::names::INSTANCE_LABEL
    ));
    let buffers: Api<CapacityBuffer> = Api::namespaced(env.client.clone(), &env.ns);
    let nodes: Api<Node> = Api::all(env.client.clone());
    let node_claims: Api<NodeClaim> = Api::all(env.client.clone());
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let requests: Api<ProvisioningRequest> = Api::namespaced(env.client.clone(), &env.ns);
        let templates: Api<PodTemplate> = Api::namespaced(env.client.clone(), &env.ns);
        let maps: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.ns);
        let counted = async {
            let r = requests
                .list_metadata(&ListParams::default())
                .await?
                .items
                .len();
            let t = templates.list_metadata(&ours).await?.items.len();
            let w = env
                .workloads()
                .list_metadata(&ListParams::default())
                .await?
                .items
                .len();
            let holdings = match maps.get_opt(LEDGER).await? {
                Some(cm) => license_check::ledger::Ledger::from_config_map_data(
                    &cm.data.unwrap_or_default(),
                )
                .map(|l| l.holdings().len())
                .unwrap_or(usize::MAX),
                None => 0,
            };
            let b = buffers
                .list_metadata(&ListParams::default())
                .await?
                .items
                .len();
            let bt = templates.list_metadata(&buffer_ours).await?.items.len();
            let protected = nodes
                .list_metadata(&ListParams::default())
                .await?
                .items
                .iter()
                .filter(|n| {
                    n.annotations()
                        .get(kueue_capacity_buffer_controller::names::PROTECTED_BY_ANNOTATION)
                        == Some(&buffer_instance)
                })
                .count();
            let claims = node_claims
                .list_metadata(&ListParams::default().labels(&names.buffer_label))
                .await?
                .items
                .len();
            Ok::<_, kube::Error>(vec![
                ("ProvisioningRequests".to_string(), r),
                ("PodTemplates".to_string(), t),
                ("license holdings".to_string(), holdings),
                ("Workloads (not deleted)".to_string(), w),
                ("CapacityBuffers".to_string(), b),
                ("PodTemplates of the capacity-buffer check".to_string(), bt),
                (
                    "Nodes protected by the capacity-buffer check".to_string(),
                    protected,
                ),
                (
                    "NodeClaims of the run's Workloads (Karpenter consolidates them)".to_string(),
                    claims,
                ),
            ])
        }
        .await;
        match counted {
            Ok(left) if left.iter().all(|(_, n)| *n == 0) || Instant::now() > deadline => {
                return left;
            }
            Err(e) if Instant::now() > deadline => {
                return vec![(format!("(could not list: {e})"), 1)];
            }
            _ => tokio::time::sleep(Duration::from_secs(2)).await,
        }
    }
}

/// Each controller's leader, by its metrics, is the Lease holder; no other replica says it
/// leads; the leader counts the checks it serves active and as many waiting Workloads as the
/// recorder sees (none, at the end).
async fn check_metrics(env: &TestEnv, supervisor: &Supervisor, recorder: &Recorder) -> Vec<String> {
    let mut lines = Vec::new();
    for controller in plan::CONTROLLERS {
        let holder = leader(env, controller).await.ok().flatten();
        let mut leading = Vec::new();
        for slot in supervisor.of(controller) {
            let (Some(addr), Some((_, pod))) = (slot.metrics(), slot.current()) else {
                continue;
            };
            let body = match e2e::http_get(addr, "/metrics").await {
                Ok((200, body)) => body,
                other => {
                    recorder.record(
                        Invariant::MetricsAgree,
                        None,
                        format!("{pod}: /metrics answered {other:?}"),
                    );
                    continue;
                }
            };
            if e2e::metric_sample(&body, "kueue_ac_leader") == Some(1.0) {
                leading.push(pod.clone());
                let active: f64 = body
                    .lines()
                    .filter(|l| l.starts_with("kueue_ac_check_active{"))
                    .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                    .sum();
                let waiting: f64 = body
                    .lines()
                    .filter(|l| l.starts_with("kueue_ac_workloads_waiting{"))
                    .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                    .sum();
                let want_active = if controller == "prov" { 2.0 } else { 1.0 };
                if active != want_active || waiting != 0.0 {
                    recorder.record(
                        Invariant::MetricsAgree,
                        None,
                        format!(
                            "{pod} reports {active} active checks (want {want_active}) and {waiting} \
                             waiting Workloads (the recorder sees 0)"
                        ),
                    );
                }
                let protected = (controller == "buffer")
                    .then(|| e2e::metric_sample(&body, "kueue_capacity_buffer_nodes_protected"));
                if let Some(protected) = protected.filter(|p| *p != Some(0.0)) {
                    recorder.record(
                        Invariant::MetricsAgree,
                        None,
                        format!(
                            "{pod} reports {protected:?} Nodes protected (the leak check found none)"
                        ),
                    );
                }
                lines.push(format!(
                    "{controller}: {pod} leads by its metrics and the Lease; {active} checks active, {waiting} waiting"
                ));
            }
        }
        if leading.len() != 1 || holder.as_ref() != leading.first() {
            recorder.record(
                Invariant::MetricsAgree,
                None,
                format!("{controller}: replicas reporting leader=1: {leading:?}; the Lease holder: {holder:?}"),
            );
        }
    }
    lines
}

/// The results file: a verdict, the figures, then what a failure needs to be traced.
fn report(config: &SoakConfig, plan: &Plan, recorder: &Recorder, seen: &Seen) -> String {
    let results = Results {
        config,
        plan,
        recorder,
        seen,
        counts: recorder.counts(),
        violations: recorder.violations(),
    };
    let mut out = String::new();
    results.heading(&mut out);
    results.times_to_end(&mut out);
    results.faults_injected(&mut out);
    results.invariants(&mut out);
    results.fault_schedule(&mut out);
    results.process_exits(&mut out);
    results.traces(&mut out);
    out
}

/// What [`report`] writes from.
struct Results<'a> {
    config: &'a SoakConfig,
    plan: &'a Plan,
    recorder: &'a Recorder,
    seen: &'a Seen,
    counts: recorder::Counts,
    violations: Vec<recorder::Violation>,
}

impl Results<'_> {
    fn heading(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "# Soak {} — seed {}, {} Workloads, commit {}, {} UTC\n",
            if self.violations.is_empty() {
                "passed"
            } else {
                "FAILED"
            },
            self.config.seed,
            self.plan.workloads.len(),
            commit(),
            k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%d %H:%M"),
        );
        let _ = writeln!(
            out,
            "Load phase and drain: {:.0?}; Workloads by planned end: {:?}; by queue: {:?}.\n",
            self.seen.took,
            self.plan.ends(),
            self.plan
                .workloads
                .iter()
                .fold(BTreeMap::<&str, usize>::new(), |mut m, w| {
                    *m.entry(w.queue.name()).or_default() += 1;
                    m
                })
        );
    }

    fn times_to_end(&self, out: &mut String) {
        let _ = writeln!(out, "## Time to end state (s)\n");
        let _ = writeln!(
            out,
            "| End | Workloads | p50 | p95 | max |\n|---|---|---|---|---|"
        );
        for (end, times) in self.recorder.times_to_end() {
            quantile_row(out, &end.to_string(), &times);
        }
        let held = self.recorder.quota_held_to_end();
        if !held.is_empty() {
            quantile_row(out, "quota held before the end (every end)", &held);
        }
    }

    /// Per kind, how many faults were done and how many skipped; then the driver's own.
    fn faults_injected(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "\n## Faults injected\n\n| Kind | Done | Skipped |\n|---|---|---|"
        );
        let mut by_kind: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
        for f in &self.seen.faults {
            let e = by_kind.entry(&f.label).or_default();
            if f.outcome.starts_with("skipped") {
                e.1 += 1;
            } else {
                e.0 += 1;
            }
        }
        for (label, (done, skipped)) in &by_kind {
            let _ = writeln!(out, "| {label} | {done} | {skipped} |");
        }
        let _ = writeln!(
            out,
            "| Job finished (deleted) or Workload finished by the driver | {} | 0 |",
            self.recorder.finished_count()
        );
        let _ = writeln!(
            out,
            "| Workload deleted mid-flight | {} | 0 |",
            self.plan.ends().get(&End::Deleted).copied().unwrap_or(0)
        );
    }

    /// The table of the invariants, then the recorder's own figures.
    fn invariants(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "\n## Invariants\n\n| Invariant | Checked | Violations |\n|---|---|---|"
        );
        for inv in Invariant::ALL {
            let n = self
                .violations
                .iter()
                .filter(|v| v.invariant == inv)
                .count();
            let _ = writeln!(out, "| {} | {} | {n} |", inv.describe(), self.checked(inv));
        }
        let c = &self.counts;
        let _ = writeln!(
            out,
            "\nRecorder: {} Workload versions, {} admissions ({} after a revoked capacity, {} by \
             Kueue without an entry of a check guarding the queue), {} rejections, {} watch \
             errors, {} Workloads found deleted by a new list.",
            c.versions,
            c.admissions,
            c.readmissions,
            c.admitted_without_entry,
            c.rejections,
            c.watch_errors,
            c.deleted_while_away
        );
    }

    /// How much `inv` was checked: a table of zeros must still say something.
    fn checked(&self, inv: Invariant) -> String {
        let (c, seen) = (&self.counts, self.seen);
        match inv {
            Invariant::EndStateInTime => format!("{} Workloads", self.plan.workloads.len()),
            Invariant::NotStuck => format!(
                "{} sweeps, longest wait with quota {:.0?}{}",
                c.stall_checks,
                c.longest_stall,
                c.longest_stall_workload
                    .map(|i| format!(" ({})", self.plan.workloads[i].name()))
                    .unwrap_or_default()
            ),
            Invariant::NoAnswerWithoutQuota => format!("{} entries", c.entries),
            Invariant::AttemptsNeverDecrease => format!("{} attempts", c.attempts),
            Invariant::NoDuplicateRequests => format!(
                "{} request versions, {} requests; {} buffer versions, {} buffers",
                c.requests, c.distinct_requests, seen.buffers.buffer_versions, seen.buffers.buffers
            ),
            Invariant::NoDoubleBooking => format!(
                "{} ledger versions, {} Workload versions (peak {} of {})",
                c.ledger_versions,
                c.license_checks,
                c.peak_licenses,
                plan::LICENSE_POOL
            ),
            Invariant::NoLeaks => seen
                .leaks
                .iter()
                .map(|(k, n)| format!("{n} {k}"))
                .collect::<Vec<_>>()
                .join(", "),
            Invariant::NoPanics => format!(
                "{} slots' logs, {} exits ({} killed by the soak)",
                seen.processes,
                seen.exits.len(),
                seen.exits.iter().filter(|e| e.killed).count()
            ),
            Invariant::MetricsAgree => format!("{} leaders", seen.metrics.len()),
            Invariant::PodsOnTheirCapacity => format!(
                "{} pods of Jobs, {} consuming a request",
                seen.pods.pods, seen.pods.consuming
            ),
            Invariant::NoCapacityTwice => format!(
                "{} NodeClaims against {} Ready spans",
                seen.buffers.claims, seen.buffers.ready_spans
            ),
            Invariant::ProtectionWithinBound => format!(
                "{} Nodes protected; {} judgements ({} sweeps, and each protection as it ended)",
                seen.buffers.protected_nodes, seen.buffers.protections_judged, seen.buffers.sweeps
            ),
        }
    }

    /// Kueue's admissions without an entry of a check guarding the queue: not an answer of
    /// ours, so not judged as one, but shown with their timelines and what Kueue's log says of
    /// them (also on the console, which is all CI keeps).
    fn admitted_without_entry(&self, out: &mut String) {
        let bypassed = self.recorder.admitted_without_entry();
        if bypassed.is_empty() {
            return;
        }
        let _ = writeln!(
            out,
            "\n## Admitted by Kueue without a check's entry\n\nKueue admitted these Workloads \
             while a check guarding their queue had no entry on them: none of our checks \
             answered (docs/kueue-behaviour.md). Their end states are not judged.\n"
        );
        for (i, missing) in bypassed.iter().take(10) {
            let name = self.recorder.subscribe(*i).borrow().name.clone();
            let log = name.as_deref().map(kueue_log_of).unwrap_or_default();
            println!(
                "soak: {} admitted by Kueue without {}; Kueue's log of it:\n  {}",
                self.plan.workloads[*i].name(),
                missing.join(", "),
                log.join("\n  ")
            );
            let _ = writeln!(
                out,
                "```\n{}```\nKueue's log of it:\n```\n{}\n```",
                self.recorder.timeline(*i),
                log.join("\n")
            );
        }
    }

    fn fault_schedule(&self, out: &mut String) {
        let _ = writeln!(out, "\n## Fault schedule (seed {})\n", self.plan.seed);
        for FaultDone {
            at, label, outcome, ..
        } in &self.seen.faults
        {
            let _ = writeln!(out, "- {:>6.1}s {label}: {outcome}", at.as_secs_f64());
        }
    }

    /// Every exit of a controller's process, then what the leaders' metrics said.
    fn process_exits(&self, out: &mut String) {
        let _ = writeln!(out, "\n## Process exits\n");
        for e in &self.seen.exits {
            let _ = writeln!(
                out,
                "- {:>6.1}s {} generation {}: {}{}",
                e.at.as_secs_f64(),
                e.slot,
                e.generation,
                e.status,
                if e.killed {
                    " (killed by the soak)"
                } else {
                    ""
                }
            );
        }
        for line in &self.seen.metrics {
            let _ = writeln!(out, "- metrics: {line}");
        }
    }

    /// The longest wait's timeline; then the violations, with the timelines of the first ten
    /// Workloads concerned.
    fn traces(&self, out: &mut String) {
        if let Some(i) = self.counts.longest_stall_workload {
            // Even in a passing run, the one that came closest to the bound is worth a look.
            let _ = writeln!(
                out,
                "\n## The longest wait with quota\n\n```\n{}```",
                self.recorder.timeline(i)
            );
        }
        self.admitted_without_entry(out);
        if self.violations.is_empty() {
            return;
        }
        let _ = writeln!(out, "\n## Violations\n");
        for v in self.violations.iter().take(50) {
            let _ = writeln!(out, "- {}", v.line(self.plan));
        }
        let mut shown = std::collections::BTreeSet::new();
        let _ = writeln!(out, "\n## Timelines\n");
        // The Workloads concerned, then those that explain them (the holders of a pool).
        let concerned = self.violations.iter().flat_map(|v| v.workload);
        let explaining = self
            .violations
            .iter()
            .flat_map(|v| v.others.iter().copied());
        for (i, limit) in concerned
            .map(|i| (i, 10))
            .chain(explaining.map(|i| (i, 18)))
        {
            if shown.len() < limit && shown.insert(i) {
                let _ = writeln!(out, "```\n{}```", self.recorder.timeline(i));
            }
        }
    }
}

/// The commit the soak's binaries were built from: read once, when the soak starts (the tree may
/// move on during a run), with `-dirty` if tracked files differ from it.
fn commit() -> &'static str {
    static COMMIT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    COMMIT.get_or_init(|| {
        let git = |args: &[&str]| {
            std::process::Command::new("git")
                .args(args)
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
                .unwrap_or_default()
        };
        let head = git(&["rev-parse", "--short", "HEAD"]);
        let dirty = !git(&["status", "--porcelain", "--untracked-files=no"]).is_empty();
        if dirty { format!("{head}-dirty") } else { head }
    })
}

/// One row of the time-to-end table: `label`, how many, p50, p95 and max of `sorted` (seconds,
/// ascending, not empty).
fn quantile_row(out: &mut String, label: &str, sorted: &[f64]) {
    let q = |p: f64| sorted[((sorted.len() - 1) as f64 * p) as usize];
    let _ = writeln!(
        out,
        "| {label} | {} | {:.1} | {:.1} | {:.1} |",
        sorted.len(),
        q(0.5),
        q(0.95),
        q(1.0)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The apiserver and Kueue restarts run this script: moved away, they would only be
    /// skipped (as they were for a while after the soak moved to tools/).
    #[test]
    fn the_control_plane_script_is_where_the_restarts_look_for_it() {
        let script = control_plane_script();
        assert!(script.is_file(), "{} is missing", script.display());
    }

    #[test]
    fn an_exit_counts_as_caused_by_a_restart_from_its_beginning_to_a_minute_after_its_end() {
        let s = Duration::from_secs;
        // An apiserver restart from 27 s to 77 s (a slow machine).
        let restarts = [(s(27), s(77))];
        assert!(!near_restart(s(26), &restarts), "before it began");
        assert!(
            near_restart(s(40), &restarts),
            "early in the outage, 37 s before its end"
        );
        assert!(near_restart(s(137), &restarts), "a minute after its end");
        assert!(!near_restart(s(138), &restarts), "later");
        assert!(!near_restart(s(40), &[]), "no restart at all");
    }
}

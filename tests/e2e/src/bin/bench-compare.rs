//! `bench-compare`: Kueue's built-in ProvisioningRequest check and ours, on the same work, one
//! after the other, against the local control plane (docs/benchmark.md).
//!
//! For each controller, number of Workloads and number of podsets it sets up a fresh namespace
//! (a ProvisioningRequestConfig of its own class, an AdmissionCheck answered by the controller
//! under test, a ClusterQueue with quota for every Workload), starts the autoscaler simulator
//! (serving that class only, provisioning every request at once) and, for ours, the provisioning
//! controller as the Helm chart's ServiceAccount with Kueue's own client budget and concurrency;
//! then creates the Workloads as fast as it can and watches them and their requests. It reports
//! the latencies its own watch saw, the API requests each actor sent per admitted Workload (from
//! the API server's audit log: Kueue, the simulator and our controller each authenticate as a
//! user of their own), the CPU seconds of every process and our controller's peak RSS.
//!
//! It fails unless every Workload is admitted exactly once with exactly one live request, and,
//! with `--max-requests-per-workload`, when our controller sends more than that per Workload.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use clap::{Parser, ValueEnum};
use e2e::bench::{self, Creating, Mark, Marks, Process, RunQueue, Seen, Stage, quantile};
use e2e::{AuditMark, TestEnv, chart};
use k8s_openapi::api::core::v1::{Namespace, PodTemplate};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};
use kueue_admission_sdk::api::{
    AdmissionCheck, ClusterQueue, ProvisioningRequest, find_condition,
    provisioning_condition as pr, workload_condition as cond,
};
use kueue_provisioning_controller::identity::KUEUE_CONTROLLER_NAME;
use kueue_provisioning_controller::identity::WORKLOAD_ANNOTATION;
use serde_json::json;
use tokio::time::Instant;

/// The users the control plane gives Kueue and the simulator (tests/control-plane).
const KUEUE_USER: &str = "kueue-controller-manager";
const SIMULATOR_USER: &str = "autoscaler-simulator";

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
enum Controller {
    /// Kueue's built-in check (controllerName kueue.x-k8s.io/provisioning-request).
    Kueue,
    /// This project's kueue-provisioning-controller.
    Ours,
}

impl Controller {
    fn label(self) -> &'static str {
        match self {
            Controller::Kueue => "Kueue built-in",
            Controller::Ours => "ours",
        }
    }
}

#[derive(Debug, Parser)]
#[command(
    name = "bench-compare",
    about = "Kueue's built-in ProvisioningRequest check and ours, side by side, on the local control plane"
)]
struct Cli {
    /// Workloads per run (comma-separated: one run per value).
    #[arg(long, value_delimiter = ',', default_values_t = [300u32, 1000])]
    workloads: Vec<u32>,
    /// Podsets per Workload, one pod of 100m cpu each (comma-separated: one run per value).
    #[arg(long, value_delimiter = ',', default_values_t = [1u32, 3])]
    podsets: Vec<u32>,
    /// The controllers to run, in this order for each size.
    #[arg(long, value_delimiter = ',', value_enum, default_values_t = [Controller::Kueue, Controller::Ours])]
    controllers: Vec<Controller>,
    /// Our controller's client QPS (Kueue v0.19.2 ships 300).
    #[arg(long, default_value_t = 300)]
    kube_api_qps: u32,
    /// Our controller's client burst (Kueue v0.19.2 ships 500).
    #[arg(long, default_value_t = 500)]
    kube_api_burst: u32,
    /// Our controller's Workloads decided at once (Kueue v0.19.2 reconciles 10 Workloads at once).
    #[arg(long, default_value_t = 10)]
    concurrency: u32,
    /// Our controller makes its request at the quota reservation (its default); false waits
    /// for Kueue to add the check's entry, as the built-in check does.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    start_early: bool,
    /// Workloads the benchmark creates at once.
    #[arg(long, default_value_t = 32)]
    create_concurrency: usize,
    /// Give up on a run after this many seconds.
    #[arg(long, default_value_t = 900)]
    timeout_seconds: u64,
    /// Workloads kept in the cluster through the runs, in a namespace of their own and in no
    /// queue (Kueue never admits them): what every controller's cache holds besides the runs'
    /// Workloads, to measure memory and start-up at scale.
    #[arg(long, default_value_t = 0)]
    idle_workloads: u32,
    /// Fail when our controller sends more API requests than this per admitted Workload.
    #[arg(long)]
    max_requests_per_workload: Option<f64>,
    /// Also write the results (Markdown) to this file.
    #[arg(long)]
    results: Option<PathBuf>,
    /// Where to draw each size's plot (`<workloads>x<podsets>.svg`: reserved → Ready per
    /// controller, and the median Workload's stages).
    #[arg(long, default_value = "target/bench-compare")]
    plots: PathBuf,
}

/// One run: a controller, a number of Workloads, podsets per Workload.
#[derive(Clone, Copy, Debug)]
struct Run {
    controller: Controller,
    workloads: u32,
    podsets: u32,
}

impl Run {
    /// The prefix of its namespace: which controller and what size.
    fn namespace_prefix(self) -> String {
        let controller = match self.controller {
            Controller::Kueue => "kueue",
            Controller::Ours => "ours",
        };
        format!("cmp-{controller}-{}x{}", self.workloads, self.podsets)
    }
}

/// What one run measured.
#[derive(Debug)]
struct Measured {
    run: Run,
    /// First create → last admitted.
    wall: Duration,
    marks: Vec<Marks>,
    /// Requests by actor, then by call (`verb resource`).
    requests: BTreeMap<&'static str, BTreeMap<String, usize>>,
    /// CPU seconds during the run, by process.
    cpu: BTreeMap<&'static str, f64>,
    /// Our controller's peak resident memory, KiB.
    peak_rss_kib: Option<u64>,
    /// Our controller's reconcile queue: the waits of Workload changes for their reconcile.
    queue_wait: Option<QueueWait>,
    /// Our controller's start: from its process start to ready (its caches listed), and its
    /// resident memory then, KiB.
    startup: Option<(Duration, u64)>,
}

#[tokio::main]
async fn main() -> ExitCode {
    bench::exit_code("bench-compare", run_all(&Cli::parse()).await)
}

async fn run_all(cli: &Cli) -> Result<()> {
    let idle = match cli.idle_workloads {
        0 => None,
        n => Some(create_idle(cli, n).await?),
    };
    let mut results = Vec::new();
    for &workloads in &cli.workloads {
        for &podsets in &cli.podsets {
            for &controller in &cli.controllers {
                let run = Run {
                    controller,
                    workloads,
                    podsets,
                };
                eprintln!(
                    "bench-compare: {} with {workloads} Workloads of {podsets} podset(s)",
                    controller.label()
                );
                let measured = measure(cli, run).await?;
                eprint!("{}", details(&measured));
                results.push(measured);
            }
        }
    }
    let report = report(cli, &results);
    print!("{report}");
    for path in draw_plots(cli, &results)? {
        eprintln!("bench-compare: drew {}", path.display());
    }
    if let Some(path) = &cli.results {
        std::fs::write(path, &report).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(env) = idle {
        // The namespace controller deletes the Workloads, server-side: one request instead of a
        // collection delete, which at 10,000 Workloads outlasts the request's timeout.
        Api::<Namespace>::all(env.client.clone())
            .delete(&env.ns, &DeleteParams::background())
            .await
            .with_context(|| format!("deleting the idle Workloads' namespace {}", env.ns))?;
    }
    if let Some(max) = cli.max_requests_per_workload {
        for m in results
            .iter()
            .filter(|m| m.run.controller == Controller::Ours)
        {
            let per = per_workload(m, "check");
            ensure!(
                per <= max,
                "our controller sent {per:.2} API requests per admitted Workload ({} Workloads of \
                 {} podsets), more than {max}:\n{}",
                m.run.workloads,
                m.run.podsets,
                details(m)
            );
        }
    }
    Ok(())
}

/// Creates `n` Workloads that stay in the cluster through the runs, in no queue.
async fn create_idle(cli: &Cli, n: u32) -> Result<TestEnv> {
    let env = TestEnv::new("cmp-idle").await?;
    let started = Instant::now();
    let creating = Creating {
        prefix: "idle",
        count: n,
        podsets: 1,
        concurrency: cli.create_concurrency,
    };
    bench::create_workloads(&env, creating, None).await?;
    eprintln!(
        "bench-compare: {n} idle Workloads created in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(env)
}

/// A binary built beside this one (`make bench-compare` builds them).
fn sibling(name: &str) -> Result<PathBuf> {
    bench::sibling(
        name,
        "cargo build -p kueue-provisioning-controller -p autoscaler-simulator --bins with the \
         same profile (make bench-compare does)",
    )
}

/// The control plane's run directory (beside its admin kubeconfig).
fn run_dir() -> Result<PathBuf> {
    Ok(e2e::kubeconfig_path()
        .parent()
        .context("the kubeconfig has no directory")?
        .to_path_buf())
}

/// The pid of a control-plane component, from its pid file.
fn component_pid(component: &str) -> Result<u32> {
    let path = run_dir()?.join("pids").join(format!("{component}.pid"));
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let pid = text.split_whitespace().next().unwrap_or_default();
    pid.parse()
        .with_context(|| format!("{} holds no pid", path.display()))
}

/// CPU seconds (user and system) a process has used so far.
fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The fields after the command name (which may hold spaces) start at the state, field 3.
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| -> Result<f64> {
        Ok(fields
            .get(i)
            .context("a short /proc stat line")?
            .parse::<f64>()?)
    };
    // utime and stime are fields 14 and 15, 11 and 12 after the state.
    Ok((ticks(11)? + ticks(12)?) / clock_ticks_per_second())
}

fn clock_ticks_per_second() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// A memory figure of a process from `/proc/<pid>/status`, KiB: `VmRSS` (resident now) or
/// `VmHWM` (the peak so far).
fn memory_kib(pid: u32, field: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| {
            l.strip_prefix(field)
                .is_some_and(|rest| rest.starts_with(':'))
        })
        .with_context(|| format!("no {field} in /proc/{pid}/status"))?;
    Ok(line
        .split_whitespace()
        .nth(1)
        .with_context(|| format!("an empty {field}"))?
        .parse()?)
}

/// The processes whose CPU the run accounts for, with their pids.
fn processes(simulator: &Process, ours: Option<&Process>) -> Result<Vec<(&'static str, u32)>> {
    let mut all = vec![
        ("kueue", component_pid("kueue")?),
        ("kube-apiserver", component_pid("kube-apiserver")?),
        ("etcd", component_pid("etcd")?),
        ("simulator", simulator.pid()),
    ];
    if let Some(p) = ours {
        all.push(("check", p.pid()));
    }
    Ok(all)
}

/// CPU seconds each of `pids` has used so far.
fn cpu_of(pids: &[(&'static str, u32)]) -> Result<Vec<f64>> {
    pids.iter().map(|(_, pid)| cpu_seconds(*pid)).collect()
}

async fn measure(cli: &Cli, run: Run) -> Result<Measured> {
    let env = TestEnv::new(&run.namespace_prefix()).await?;
    let controller_name = match run.controller {
        Controller::Kueue => KUEUE_CONTROLLER_NAME.to_string(),
        Controller::Ours => env.provisioning_controller_name(),
    };
    let queue = set_up_queue(&env, run, &controller_name).await?;
    let mut simulator = start_simulator(&env)?;
    let mut ours = match run.controller {
        Controller::Kueue => None,
        Controller::Ours => Some(start_ours(cli, &env, &controller_name).await?),
    };
    env.wait_active::<AdmissionCheck>(&queue.check, "True", None)
        .await?;
    env.wait_active::<ClusterQueue>(&queue.cluster_queue, "True", None)
        .await?;

    // The measurement: from here to the last admission.
    let audit_from = e2e::audit_log_mark()?;
    let pids = processes(&simulator, ours.as_ref().map(|o| &o.process))?;
    let cpu_before = cpu_of(&pids)?;
    let seen = Seen::default();
    let watches = watch_run(&env, &queue, &seen);
    let started = Instant::now();
    let creating = Creating {
        prefix: "wl",
        count: run.workloads,
        podsets: run.podsets,
        concurrency: cli.create_concurrency,
    };
    bench::create_workloads(&env, creating, Some(&seen)).await?;
    let timeout = Duration::from_secs(cli.timeout_seconds);
    bench::wait_all_admitted(&seen, run.workloads, timeout, started, || {
        simulator.alive()?;
        ours.as_mut().map_or(Ok(()), |o| o.process.alive())
    })
    .await?;
    let cpu_after = cpu_of(&pids)?;
    let (peak_rss_kib, queue_wait) = match &ours {
        Some(o) => (
            Some(memory_kib(o.process.pid(), "VmHWM")?),
            Some(QueueWait::scrape(o.http, &queue.check).await?),
        ),
        None => (None, None),
    };
    for w in watches {
        w.abort();
    }
    let marks = seen.marks();
    let wall = bench::until_last_admitted(&marks, started);
    verify(&env, run, &marks).await?;
    // Both stopped before the audit log is read.
    let (service_account, startup) = ours.map(|o| (o.service_account, o.startup)).unzip();
    drop(simulator);

    let check_user = service_account.map(|sa| format!("system:serviceaccount:{}:{sa}", env.ns));
    let requests = requests_by_actor(&audit_from, check_user.as_deref())?;
    let cpu = pids
        .iter()
        .zip(cpu_before.iter().zip(&cpu_after))
        .map(|((name, _), (before, after))| (*name, after - before))
        .collect();
    bench::clean_up(&env, &queue).await?;
    Ok(Measured {
        run,
        wall,
        marks,
        requests,
        cpu,
        peak_rss_kib,
        queue_wait,
        startup,
    })
}

/// Watches the run's Workloads and requests into `seen`.
fn watch_run(env: &TestEnv, queue: &RunQueue, seen: &Seen) -> [tokio::task::JoinHandle<()>; 2] {
    [
        tokio::spawn(bench::watch_workloads(
            env.workloads(),
            queue.check.clone(),
            seen.clone(),
        )),
        tokio::spawn(watch_requests(
            Api::namespaced(env.client.clone(), &env.ns),
            seen.clone(),
        )),
    ]
}

/// How long Workload changes waited in our controller for the reconcile that read them.
#[derive(Debug)]
struct QueueWait {
    changes: f64,
    mean: f64,
    /// The 99th percentile, rounded up to a bucket of the histogram.
    p99_at_most: f64,
    /// Kueue's reservation → our watch delivering it: median and 99th percentile, each
    /// rounded up to a bucket.
    reserved_seen_at_most: (f64, f64),
    /// Reconciles that succeeded, and their mean duration.
    reconciles: (f64, f64),
    /// Kueue's reservation → our ProvisioningRequest created (control-plane stamps): median
    /// and 99th percentile, each rounded up to a bucket.
    reserved_to_request_at_most: (f64, f64),
}

impl QueueWait {
    async fn scrape(http: std::net::SocketAddr, check: &str) -> Result<Self> {
        const WAIT: &str = "kueue_ac_reconcile_queue_wait_seconds";
        const SEEN: &str = "kueue_ac_quota_reserved_seen_seconds";
        let to_request = format!("kueue_provisioning_time_to_request_seconds{{check=\"{check}\"}}");
        let (_, metrics) = e2e::http_get(http, "/metrics").await?;
        let sample = |suffix: &str| e2e::metric_sample(&metrics, &format!("{WAIT}_{suffix}"));
        let (Some(changes), Some(sum)) = (sample("count"), sample("sum")) else {
            bail!("no {WAIT} in our controller's metrics:\n{metrics}");
        };
        let ok = |part: &str| {
            let series = format!("kueue_ac_reconcile_duration_seconds_{part}{{result=\"ok\"}}");
            e2e::metric_sample(&metrics, &series).unwrap_or(f64::NAN)
        };
        let (reconciles, reconciling) = (ok("count"), ok("sum"));
        Ok(Self {
            changes,
            mean: sum / changes.max(1.0),
            p99_at_most: e2e::histogram_bound(&metrics, WAIT, 0.99).unwrap_or(f64::NAN),
            reserved_seen_at_most: (
                e2e::histogram_bound(&metrics, SEEN, 0.5).unwrap_or(f64::NAN),
                e2e::histogram_bound(&metrics, SEEN, 0.99).unwrap_or(f64::NAN),
            ),
            reconciles: (reconciles, reconciling / reconciles.max(1.0)),
            reserved_to_request_at_most: (
                e2e::histogram_bound(&metrics, &to_request, 0.5).unwrap_or(f64::NAN),
                e2e::histogram_bound(&metrics, &to_request, 0.99).unwrap_or(f64::NAN),
            ),
        })
    }
}

/// A run's queue: a ProvisioningRequestConfig of its own class, an AdmissionCheck answered by
/// `controller_name` and a ClusterQueue with room for every Workload.
async fn set_up_queue(env: &TestEnv, run: Run, controller_name: &str) -> Result<RunQueue> {
    let config = env.provisioning_config("prc", json!({})).await?;
    let check = env
        .provisioning_check("prov", controller_name, &config)
        .await?;
    // 100m per pod: room for every Workload at once, so none waits for quota.
    let quota = format!("{}", run.workloads * run.podsets / 10 + 1);
    let (flavor, cluster_queue) = env.pool_queues(&quota, &[&check]).await?;
    Ok(RunQueue {
        flavor,
        check,
        cluster_queue,
        provisioning_config: Some(config),
    })
}

/// The autoscaler simulator, serving the run's class only and provisioning every request at
/// once.
fn start_simulator(env: &TestEnv) -> Result<Process> {
    Process::spawn(
        "autoscaler-simulator",
        Command::new(sibling("autoscaler-simulator")?)
            .arg("--kubeconfig")
            .arg(run_dir()?.join("autoscaler-simulator.kubeconfig"))
            // Scripted: every request provisioned at once, as in every run before; watching
            // only the run's namespace.
            .args(["--scripted-class", &env.provisioning_class()])
            .args(["--namespace", &env.ns])
            .args(["--log-level", "warn"])
            // Never the bottleneck, for either controller.
            .env("KUEUE_AC_KUBE_API_QPS", "2000")
            .env("KUEUE_AC_KUBE_API_BURST", "4000"),
        std::env::temp_dir().join(format!("{}-simulator.log", env.ns)),
    )
}

/// The API requests each actor sent since `from`, by call (`verb resource`); our controller
/// is `check_user`.
fn requests_by_actor(
    from: &AuditMark,
    check_user: Option<&str>,
) -> Result<BTreeMap<&'static str, BTreeMap<String, usize>>> {
    let mut requests: BTreeMap<&'static str, BTreeMap<String, usize>> = BTreeMap::new();
    for (user, r) in e2e::audited_since(from)? {
        let actor = match user.as_str() {
            KUEUE_USER => "kueue",
            SIMULATOR_USER => "simulator",
            u if Some(u) == check_user => "check",
            _ => continue,
        };
        let call = format!("{} {}", r.verb, r.resource);
        *requests.entry(actor).or_default().entry(call).or_default() += 1;
    }
    Ok(requests)
}

/// Our controller, started for a run.
struct Ours {
    process: Process,
    /// Where it serves `/metrics`.
    http: std::net::SocketAddr,
    /// The chart's ServiceAccount it runs as.
    service_account: String,
    /// From its process start to ready, and its resident memory then (KiB).
    startup: (Duration, u64),
}

/// Starts our controller as the chart's ServiceAccount (its RBAC applied in the run's
/// namespace), with Kueue's client budget and concurrency, and waits until it is ready.
async fn start_ours(cli: &Cli, env: &TestEnv, controller_name: &str) -> Result<Ours> {
    let service_account =
        chart::provisioning_service_account(&env.client, &env.ns, controller_name, "bench-compare")
            .await?;
    let kubeconfig = e2e::service_account_kubeconfig(&env.ns, &service_account).await?;
    let path = std::env::temp_dir().join(format!("{}-check.kubeconfig", env.ns));
    write_private(&path, &serde_json::to_string(&kubeconfig)?)?;
    let http = e2e::free_local_address()?;
    let spawned = Instant::now();
    let mut process = Process::spawn(
        "kueue-provisioning-controller",
        Command::new(sibling("kueue-provisioning-controller")?)
            .arg("--kubeconfig")
            .arg(&path)
            .args(["--controller-name", controller_name])
            .args(["--metrics-address", &http.to_string()])
            .args(["--leader-elect", "false"])
            .args(["--kube-api-qps", &cli.kube_api_qps.to_string()])
            .args(["--kube-api-burst", &cli.kube_api_burst.to_string()])
            .args(["--concurrency", &cli.concurrency.to_string()])
            .arg(format!("--start-early={}", cli.start_early))
            .env("KUEUE_AC_LOG_LEVEL", "warn"),
        std::env::temp_dir().join(format!("{}-check.log", env.ns)),
    )?;
    process.wait_ready(http).await?;
    let startup = (spawned.elapsed(), memory_kib(process.pid(), "VmRSS")?);
    Ok(Ours {
        process,
        http,
        service_account,
        startup,
    })
}

/// Writes a file only its owner can read (it holds a token).
fn write_private(path: &Path, text: &str) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    std::io::Write::write_all(&mut file, text.as_bytes())?;
    Ok(())
}

/// The Workload a request was made for: Kueue's built-in check makes the Workload its owner,
/// ours names it in an annotation.
fn workload_of(r: &ProvisioningRequest) -> Option<String> {
    let owner = r.owner_references().iter().find(|o| o.kind == "Workload");
    owner
        .map(|o| o.name.clone())
        .or_else(|| r.annotations().get(WORKLOAD_ANNOTATION).cloned())
}

/// Records when each Workload's request was first seen, and first seen provisioned.
async fn watch_requests(api: Api<ProvisioningRequest>, seen: Seen) {
    bench::watch(api, |r: ProvisioningRequest, now| {
        let Some(workload) = workload_of(&r) else {
            return;
        };
        let provisioned = r
            .status
            .as_ref()
            .and_then(|s| find_condition(&s.conditions, pr::PROVISIONED))
            .is_some_and(|c| c.status == "True");
        seen.of(workload, |m| {
            m.first(Mark::Request, now);
            if provisioned {
                m.first(Mark::Provisioned, now);
            }
        });
    })
    .await;
}

/// Every Workload admitted exactly once, none evicted, each with exactly one live request.
async fn verify(env: &TestEnv, run: Run, marks: &[Marks]) -> Result<()> {
    let n = run.workloads as usize;
    let twice = marks.iter().filter(|m| m.admissions > 1).count();
    ensure!(twice == 0, "{twice} Workloads were admitted more than once");
    let workloads = env.workloads().list(&ListParams::default()).await?.items;
    ensure!(
        workloads.len() == n,
        "{} Workloads, not {n}",
        workloads.len()
    );
    let evicted: Vec<String> = workloads
        .iter()
        .filter(|w| w.total_evictions() > 0 || !w.condition_is_true(cond::ADMITTED))
        .map(|w| w.name_any())
        .collect();
    ensure!(evicted.is_empty(), "evicted or not admitted: {evicted:?}");
    let requests: Api<ProvisioningRequest> = Api::namespaced(env.client.clone(), &env.ns);
    let mut live: BTreeMap<String, usize> = BTreeMap::new();
    for r in requests.list(&ListParams::default()).await?.items {
        if r.metadata.deletion_timestamp.is_none()
            && let Some(w) = workload_of(&r)
        {
            *live.entry(w).or_default() += 1;
        }
    }
    let wrong: Vec<String> = workloads
        .iter()
        .map(|w| (w.name_any(), live.get(&w.name_any()).copied().unwrap_or(0)))
        .filter(|(_, count)| *count != 1)
        .map(|(w, count)| format!("{w}: {count}"))
        .collect();
    ensure!(
        wrong.is_empty(),
        "Workloads without exactly one live ProvisioningRequest: {wrong:?}"
    );
    verify_templates(env).await
}

/// Every PodTemplate of the run belongs to a live request, and every live request has its
/// templates: nothing made for a Workload (also before Kueue added its entry) is left over.
async fn verify_templates(env: &TestEnv) -> Result<()> {
    let requests: Api<ProvisioningRequest> = Api::namespaced(env.client.clone(), &env.ns);
    let templates: Api<PodTemplate> = Api::namespaced(env.client.clone(), &env.ns);
    let referenced: std::collections::BTreeSet<String> = requests
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|r| r.metadata.deletion_timestamp.is_none())
        .flat_map(|r| {
            r.spec
                .pod_sets
                .iter()
                .map(|p| p.pod_template_ref.name.clone())
        })
        .collect();
    let existing: std::collections::BTreeSet<String> = templates
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|t| t.metadata.deletion_timestamp.is_none())
        .map(|t| t.name_any())
        .collect();
    let left: Vec<&String> = existing.difference(&referenced).collect();
    ensure!(left.is_empty(), "PodTemplates of no live request: {left:?}");
    let missing: Vec<&String> = referenced.difference(&existing).collect();
    ensure!(
        missing.is_empty(),
        "PodTemplates live requests name but that do not exist: {missing:?}"
    );
    Ok(())
}

/// The stages reported, each as the benchmark's watches saw it; the summary shows the first
/// two.
const STAGES: [Stage; 7] = [
    Stage::new("quota reserved → check Ready", Mark::Reserved, Mark::Ready),
    Stage::new("created → admitted", Mark::Created, Mark::Admitted),
    Stage::new(
        "quota reserved → request seen",
        Mark::Reserved,
        Mark::Request,
    ),
    Stage::new(
        "quota reserved → check's entry there too (Kueue)",
        Mark::Reserved,
        Mark::Askable,
    ),
    Stage::new(
        "check's entry with quota → request seen (the check)",
        Mark::Askable,
        Mark::Request,
    ),
    Stage::new(
        "request seen → provisioned",
        Mark::Request,
        Mark::Provisioned,
    ),
    Stage::new("provisioned → check Ready", Mark::Provisioned, Mark::Ready),
];

fn secs(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64())
}

/// API requests of `actor` per admitted Workload.
fn per_workload(m: &Measured, actor: &str) -> f64 {
    let total: usize = m
        .requests
        .get(actor)
        .map_or(0, |calls| calls.values().sum());
    total as f64 / f64::from(m.run.workloads)
}

/// One run's stages and requests in detail.
fn details(m: &Measured) -> String {
    let mut out = String::new();
    let Run {
        controller,
        workloads,
        podsets,
    } = m.run;
    let _ = writeln!(
        out,
        "\n### {}: {workloads} Workloads × {podsets} podset(s), all admitted in {} s\n",
        controller.label(),
        secs(m.wall)
    );
    let _ = writeln!(
        out,
        "| stage (the benchmark's watch) | p50 | p90 | p99 | max |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|");
    for stage in STAGES {
        let d = stage.durations(&m.marks);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            stage.label,
            secs(quantile(&d, 0.5)),
            secs(quantile(&d, 0.9)),
            secs(quantile(&d, 0.99)),
            secs(quantile(&d, 1.0)),
        );
    }
    let _ = writeln!(out, "\n| actor | call | per Workload |");
    let _ = writeln!(out, "|---|---|---|");
    for (actor, calls) in &m.requests {
        for (call, n) in calls {
            let per = *n as f64 / f64::from(workloads);
            let _ = writeln!(out, "| {actor} | {call} | {per:.2} |");
        }
    }
    let cpu: Vec<String> = m.cpu.iter().map(|(p, s)| format!("{p} {s:.1} s")).collect();
    let _ = writeln!(out, "\nCPU during the run: {}", cpu.join(", "));
    if let Some(q) = &m.queue_wait {
        let _ = writeln!(
            out,
            "our reconcile queue: {:.0} Workload changes read, waited {:.3} s on average, \
             99 % at most {} s; quota reservations reached our watch within {} s (p50), {} s \
             (p99); {:.0} reconciles took {:.3} s on average; our requests were created within \
             {} s (p50), {} s (p99) of the reservation",
            q.changes,
            q.mean,
            q.p99_at_most,
            q.reserved_seen_at_most.0,
            q.reserved_seen_at_most.1,
            q.reconciles.0,
            q.reconciles.1,
            q.reserved_to_request_at_most.0,
            q.reserved_to_request_at_most.1
        );
    }
    if let Some((ready, rss)) = m.startup {
        let _ = writeln!(
            out,
            "our controller: ready {:.1} s after its start (every cache listed), {:.0} MiB \
             resident then; peak {:.0} MiB",
            ready.as_secs_f64(),
            rss as f64 / 1024.0,
            m.peak_rss_kib.unwrap_or(0) as f64 / 1024.0
        );
    }
    out
}

/// One SVG per size, with every controller run at that size; returns their paths.
fn draw_plots(cli: &Cli, results: &[Measured]) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(&cli.plots)
        .with_context(|| format!("creating {}", cli.plots.display()))?;
    let mut drawn = Vec::new();
    for &workloads in &cli.workloads {
        for &podsets in &cli.podsets {
            let runs: Vec<e2e::bench_plot::Drawn<'_>> = results
                .iter()
                .filter(|m| m.run.workloads == workloads && m.run.podsets == podsets)
                .map(|m| e2e::bench_plot::Drawn {
                    label: m.run.controller.label(),
                    marks: &m.marks,
                })
                .collect();
            if runs.is_empty() {
                continue;
            }
            let path = cli.plots.join(format!("{workloads}x{podsets}.svg"));
            let title = format!(
                "{workloads} Workloads × {podsets} podset(s), ours --start-early={}",
                cli.start_early
            );
            e2e::bench_plot::draw(&path, &title, &runs)?;
            drawn.push(path);
        }
    }
    Ok(drawn)
}

/// The summary table over all runs, with the ratios of ours to the built-in's.
fn report(cli: &Cli, results: &[Measured]) -> String {
    let mut out = String::new();
    let commit = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let _ = writeln!(
        out,
        "\n## bench-compare, commit {commit}, {cores} cores; ours at --kube-api-qps {} \
         --kube-api-burst {} --concurrency {} --start-early={}; {} idle Workloads kept in the \
         cluster\n",
        cli.kube_api_qps, cli.kube_api_burst, cli.concurrency, cli.start_early, cli.idle_workloads
    );
    let _ = writeln!(
        out,
        "| controller | Workloads × podsets | all admitted | reserved → Ready p50 / p90 / p99 (s) \
         | created → admitted p50 / p90 / p99 (s) | requests per Workload: check / Kueue / \
         simulator | CPU s: check / Kueue / apiserver + etcd | check's peak RSS |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
    for m in results {
        out.push_str(&summary_row(m));
    }
    // Ours against the built-in on the same size.
    let pairs = results
        .iter()
        .filter(|m| m.run.controller == Controller::Ours);
    for ours in pairs {
        let kueue = results.iter().find(|k| {
            k.run.controller == Controller::Kueue
                && k.run.workloads == ours.run.workloads
                && k.run.podsets == ours.run.podsets
        });
        if let Some(kueue) = kueue {
            out.push_str(&comparison(ours, kueue));
        }
    }
    out
}

/// One run's row of the summary table.
fn summary_row(m: &Measured) -> String {
    let q = |stage: &Stage| {
        let d = stage.durations(&m.marks);
        format!(
            "{} / {} / {}",
            secs(quantile(&d, 0.5)),
            secs(quantile(&d, 0.9)),
            secs(quantile(&d, 0.99))
        )
    };
    let check_requests = match m.run.controller {
        Controller::Kueue => "(in Kueue)".to_string(),
        Controller::Ours => format!("{:.2}", per_workload(m, "check")),
    };
    let cpu = |p: &str| m.cpu.get(p).copied().unwrap_or(0.0);
    let check_cpu = match m.run.controller {
        Controller::Kueue => "(in Kueue)".to_string(),
        Controller::Ours => format!("{:.1}", cpu("check")),
    };
    let rss = m.peak_rss_kib.map_or("–".to_string(), |k| {
        format!("{:.0} MiB", k as f64 / 1024.0)
    });
    format!(
        "| {} | {} × {} | {} s | {} | {} | {check_requests} / {:.2} / {:.2} | {check_cpu} / \
         {:.1} / {:.1} | {rss} |\n",
        m.run.controller.label(),
        m.run.workloads,
        m.run.podsets,
        secs(m.wall),
        q(&STAGES[0]),
        q(&STAGES[1]),
        per_workload(m, "kueue"),
        per_workload(m, "simulator"),
        cpu("kueue"),
        cpu("kube-apiserver") + cpu("etcd"),
    )
}

/// Ours against the built-in on the same size: the p99 ratio (P1) and the check's requests,
/// the built-in's counted as what Kueue sent beyond what it sent beside ours.
fn comparison(ours: &Measured, kueue: &Measured) -> String {
    let p99 = |m: &Measured| quantile(&STAGES[0].durations(&m.marks), 0.99).as_secs_f64();
    let builtin_check = per_workload(kueue, "kueue") - per_workload(ours, "kueue");
    let per_thousand = |m: &Measured, cpu: f64| 1000.0 * cpu / f64::from(m.run.workloads);
    let kueue_cpu = |m: &Measured| m.cpu.get("kueue").copied().unwrap_or(0.0);
    format!(
        "\n{} × {}: reserved → Ready p99, ours / built-in = {:.2}. The check's API requests \
         per Workload: ours {:.2}, built-in {builtin_check:.2}; its CPU seconds per 1,000 \
         Workloads: ours {:.1}, built-in {:.1} (the built-in's: what Kueue used in its run \
         beyond what it used in ours). All actors' requests per Workload: ours {:.2}, \
         built-in {:.2}.\n",
        ours.run.workloads,
        ours.run.podsets,
        p99(ours) / p99(kueue).max(f64::EPSILON),
        per_workload(ours, "check"),
        per_thousand(ours, ours.cpu.get("check").copied().unwrap_or(0.0)),
        per_thousand(kueue, kueue_cpu(kueue) - kueue_cpu(ours)),
        ["check", "kueue", "simulator"]
            .iter()
            .map(|a| per_workload(ours, a))
            .sum::<f64>(),
        ["kueue", "simulator"]
            .iter()
            .map(|a| per_workload(kueue, a))
            .sum::<f64>(),
    )
}

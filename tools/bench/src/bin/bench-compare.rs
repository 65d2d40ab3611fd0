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
//!
//! What keeps the runs on equal terms. `--budget` says which client budget each side has
//! (`shipped`: each as it ships, which is not equal; `fair`: no client limit binds either), and
//! every row says it again. `--repeat` runs the sides in pairs, in ABBA order, and ratios are
//! only taken within a pair. Every run starts once no earlier run's namespace is left (the
//! control plane's namespace controller empties a deleted one) and says what the cluster
//! held; Workloads left by an interrupted earlier run (namespaces `e2e-cmp-*`) are deleted
//! first, and the idle Workloads at the end. With `--idle-workloads`, Kueue writes each idle
//! Workload's status once after its creation; the benchmark waits until it has done so for
//! every one and gone quiet before the first run, or that run alone would pay for it. With
//! `--churn-per-second`, every run carries the same background stream of other Workloads
//! through a ClusterQueue of their own, each deleted once admitted. `none` and `floor` in
//! `--controllers` add the references: no check, and the SDK's always-ready check.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use bench::{Creating, Mark, Marks, Process, RunQueue, Seen, Stage, lock, quantile};
use clap::{Parser, ValueEnum};
use e2e::{AuditMark, TestEnv, chart};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, PodTemplate};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kueue_admission_sdk::api::{
    AdmissionCheck, ClusterQueue, LocalQueue, ProvisioningRequest, ResourceFlavor, Workload,
    find_condition, provisioning_condition as pr, workload_condition as cond,
};
use kueue_provisioning_controller::identity::KUEUE_CONTROLLER_NAME;
use kueue_provisioning_controller::identity::WORKLOAD_ANNOTATION;
use serde_json::json;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

/// The users the control plane gives Kueue and the simulator (tests/control-plane).
const KUEUE_USER: &str = "kueue-controller-manager";
const SIMULATOR_USER: &str = "autoscaler-simulator";

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
enum Controller {
    /// A reference: the ClusterQueue has no check; Kueue admits at the reservation.
    None,
    /// A reference: the SDK's always-ready check, answering `Ready` as soon as Kueue adds its
    /// entry (the floor any check that waits for the entry can reach), with our controller's
    /// budget and concurrency.
    Floor,
    /// Kueue's built-in check (controllerName kueue.x-k8s.io/provisioning-request).
    Kueue,
    /// This project's kueue-provisioning-controller.
    Ours,
}

impl Controller {
    fn label(self) -> &'static str {
        match self {
            Controller::None => "no check",
            Controller::Floor => "always-ready floor",
            Controller::Kueue => "Kueue built-in",
            Controller::Ours => "ours",
        }
    }

    /// Whether the run provisions (a ProvisioningRequest per Workload, the simulator).
    fn provisions(self) -> bool {
        matches!(self, Controller::Kueue | Controller::Ours)
    }

    /// Whether the run starts a check process of its own (with our budget).
    fn runs_a_process(self) -> bool {
        matches!(self, Controller::Floor | Controller::Ours)
    }
}

/// The client budgets of a set of runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Budget {
    /// As each ships: Kueue 300 QPS / 500 burst for everything it sends, its Events included;
    /// ours `--kube-api-qps`/`--kube-api-burst`, and as much again for its Events.
    Shipped,
    /// No client limit binds either side: Kueue restarted with its limiter off (a negative QPS,
    /// `cmd/kueue/main.go`), ours (and the floor) at 100,000 QPS and burst.
    Fair,
}

/// What our controller (and the floor) get under [`Budget::Fair`]: more than a run can send.
const UNBOUNDED_QPS: u32 = 100_000;

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
    /// The controllers to run, in this order for each size (reversed in every second pair);
    /// `none` and `floor` are the references.
    #[arg(long, value_delimiter = ',', value_enum, default_values_t = [Controller::Kueue, Controller::Ours])]
    controllers: Vec<Controller>,
    /// Pairs of runs per size, in ABBA order: pair 1 runs --controllers in order, pair 2 in
    /// reverse, and so on. Ratios are taken within a pair; their median and range are reported.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=50))]
    repeat: u32,
    /// The client budgets: `shipped` (each side as it ships) or `fair` (no client limit binds
    /// either side). Every row says which.
    #[arg(long, value_enum, default_value_t = Budget::Shipped)]
    budget: Budget,
    /// After each size's bursts, paced runs: Workloads arriving at these fractions of the
    /// built-in's throughput in that size's first burst (Workloads ÷ all admitted), for
    /// --paced-seconds each, in the same ABBA pairs (comma-separated, e.g. 0.5,0.8). Needs
    /// `kueue` among --controllers.
    #[arg(long, value_delimiter = ',')]
    paced: Vec<f64>,
    /// How long each paced run's arrivals last.
    #[arg(long, default_value_t = 120)]
    paced_seconds: u64,
    /// Our controller's client QPS (Kueue v0.19.2 ships 300).
    #[arg(long, default_value_t = 300)]
    kube_api_qps: u32,
    /// Our controller's client burst (Kueue v0.19.2 ships 500).
    #[arg(long, default_value_t = 500)]
    kube_api_burst: u32,
    /// Our controller's Workloads decided at once (Kueue v0.19.2 reconciles 10 Workloads at once).
    #[arg(long, default_value_t = 10)]
    concurrency: u32,
    /// Our controller's turns kept for early starts, beside --concurrency (its default: 10;
    /// 0 shares the main turns). Used only with --start-early=true.
    #[arg(long, default_value_t = 10)]
    early_start_concurrency: u32,
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
    /// Workloads, to measure memory and start-up at scale. The first run starts once Kueue has
    /// marked every one and gone quiet (bounded by --timeout-seconds).
    #[arg(long, default_value_t = 0)]
    idle_workloads: u32,
    /// Background churn: during each run, this many other Workloads per second (1 pod of 100m
    /// each) flow through a ClusterQueue of their own without checks, each deleted once
    /// admitted; the same stream for every run. 0: none.
    #[arg(long, default_value_t = 0)]
    churn_per_second: u32,
    /// Fail when our controller sends more API requests than this per admitted Workload, plus
    /// --max-requests-per-podset for each of its podsets.
    #[arg(long)]
    max_requests_per_workload: Option<f64>,
    /// Added to --max-requests-per-workload for each podset of a run's Workloads (a PodTemplate
    /// each).
    #[arg(long, default_value_t = 0.0, requires = "max_requests_per_workload")]
    max_requests_per_podset: f64,
    /// Also write the results (Markdown) to this file.
    #[arg(long)]
    results: Option<PathBuf>,
    /// Where to draw each size's plot (`<workloads>x<podsets>.svg`: reserved → Ready per
    /// controller, and the median Workload's stages).
    #[arg(long, default_value = "target/bench-compare")]
    plots: PathBuf,
}

/// One run: a controller, a number of Workloads, podsets per Workload, and the pair it is in.
#[derive(Clone, Copy, Debug)]
struct Run {
    controller: Controller,
    workloads: u32,
    podsets: u32,
    /// The pair of runs it belongs to (from 1; see `--repeat`).
    pair: u32,
    /// Paced arrivals instead of a burst: the fraction of the built-in's burst throughput, in
    /// percent, and the Workloads a second that makes.
    paced: Option<(u32, f64)>,
}

impl Run {
    /// The prefix of its namespace: which controller and what size.
    fn namespace_prefix(self) -> String {
        let controller = match self.controller {
            Controller::None => "none",
            Controller::Floor => "floor",
            Controller::Kueue => "kueue",
            Controller::Ours => "ours",
        };
        match self.paced {
            None => format!("cmp-{controller}-{}x{}", self.workloads, self.podsets),
            Some((percent, _)) => format!("cmp-{controller}-p{percent}-{}", self.podsets),
        }
    }

    /// The controller, and the pace if the run is paced.
    fn label(self) -> String {
        match self.paced {
            None => self.controller.label().to_string(),
            Some((percent, per_second)) => format!(
                "{}, paced at {percent} % ({per_second:.1}/s)",
                self.controller.label()
            ),
        }
    }

    /// Whether `other` is of the same set: the same size, burst or pace.
    fn same_set(self, other: Run) -> bool {
        self.workloads == other.workloads
            && self.podsets == other.podsets
            && self.paced.map(|p| p.0) == other.paced.map(|p| p.0)
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
    requests: BTreeMap<&'static str, BTreeMap<String, Calls>>,
    /// CPU seconds during the run, by process.
    cpu: BTreeMap<&'static str, f64>,
    /// Our controller's peak resident memory, KiB.
    peak_rss_kib: Option<u64>,
    /// Our controller's reconcile queue: the waits of Workload changes for their reconcile.
    queue_wait: Option<QueueWait>,
    /// Our controller's start: from its process start to ready (its caches listed), and its
    /// resident memory then, KiB.
    startup: Option<(Duration, u64)>,
    /// What the background churn did during the run, if it flowed.
    churn: Option<Churned>,
    /// The whole machine's CPU during the run (every process, the benchmark's own included).
    machine: bench::machine::MachineCpu,
    /// Kueue's requests against its client limiter, when it had one.
    kueue_limiter: Option<bench::limiter::LimiterUse>,
    /// What the cluster held when the run started.
    cluster_at_start: String,
    /// The benchmark's own watches: errors and lists after the first (re-lists).
    watch_trouble: (usize, usize),
}

#[tokio::main]
async fn main() -> ExitCode {
    bench::exit_code("bench-compare", run_all(&Cli::parse()).await)
}

async fn run_all(cli: &Cli) -> Result<()> {
    // The tree the binaries were built from (make builds them just before): read now, not when
    // the report is written minutes later, after other commits; "-dirty" for uncommitted
    // changes.
    let commit = Command::new("git")
        .args(["describe", "--always", "--dirty", "--abbrev=7"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    // Figures anyone may quote come from a tree anyone can check out.
    if let Some(path) = &cli.results {
        ensure!(
            from_a_clean_tree(&commit),
            "refusing to write results to {} from a tree with uncommitted changes (commit \
             {commit:?}): commit or stash them first, or leave out --results",
            path.display()
        );
    }
    if cli.budget == Budget::Fair {
        set_kueue_limit(false)?;
    }
    let outcome = run_all_on(cli, &commit).await;
    if cli.budget == Budget::Fair {
        // Kueue as shipped again, whatever happened: the tests and later runs expect it.
        set_kueue_limit(true)?;
    }
    outcome
}

/// Whether `git describe --dirty` said `commit` of a tree without uncommitted changes.
fn from_a_clean_tree(commit: &str) -> bool {
    !commit.is_empty() && !commit.ends_with("-dirty")
}

/// Restarts Kueue with its client limiter as shipped (300/500), or with none.
fn set_kueue_limit(shipped: bool) -> Result<()> {
    let script = chart::repo_root().join("tests/control-plane/control-plane.sh");
    let qps = if shipped { "300" } else { "-1" };
    let status = Command::new("bash")
        .arg(&script)
        .args(["restart", "kueue"])
        .env("KUEUE_CLIENT_QPS", qps)
        .env("KUEUE_CLIENT_BURST", "500")
        .status()
        .with_context(|| format!("running {}", script.display()))?;
    ensure!(
        status.success(),
        "restarting Kueue with client QPS {qps} failed ({status}); see its log under the control \
         plane's run directory"
    );
    eprintln!("bench-compare: Kueue restarted with client QPS {qps} (burst 500)");
    Ok(())
}

async fn run_all_on(cli: &Cli, commit: &str) -> Result<()> {
    // Every Workload in the cluster is in Kueue's cache and ours: an earlier run's must be gone.
    let client = e2e::admin_client().await?;
    let earlier = |ns: &str| ns.starts_with(BENCH_NAMESPACE_PREFIX);
    if let Some((n, took)) = delete_workloads_where(&client, earlier).await? {
        eprintln!(
            "bench-compare: deleted {n} Workloads left by earlier runs in {:.0} s (a run that \
             was interrupted, or a namespace the namespace controller has not emptied yet)",
            took.as_secs_f64()
        );
    }
    // Its queue first: setting it up is work for Kueue too, done before the idle Workloads'
    // settle, which is the last thing before the first run.
    let churn = match cli.churn_per_second {
        0 => None,
        per_second => Some(ChurnQueue::create(cli, per_second).await?),
    };
    let idle = match cli.idle_workloads {
        0 => None,
        n => Some(create_idle(cli, n).await?),
    };
    ensure!(
        cli.paced.is_empty() || cli.controllers.contains(&Controller::Kueue),
        "--paced takes its pace from the built-in's burst: add kueue to --controllers"
    );
    ensure!(
        cli.paced.iter().all(|f| *f > 0.0 && *f <= 2.0),
        "--paced fractions must be above 0 and at most 2: {:?}",
        cli.paced
    );
    let mut results = Vec::new();
    for &workloads in &cli.workloads {
        for &podsets in &cli.podsets {
            let burst = Run {
                controller: Controller::Kueue,
                workloads,
                podsets,
                pair: 1,
                paced: None,
            };
            for (pair, controller) in bench::pairs::abba(&cli.controllers, cli.repeat) {
                let run = Run {
                    controller,
                    pair,
                    ..burst
                };
                results.push(run_one(cli, &client, run, churn.as_ref()).await?);
            }
            // The built-in's throughput in this size's first burst sets the paces.
            let Some(kueue) = results
                .iter()
                .find(|m| m.run.same_set(burst) && m.run.controller == Controller::Kueue)
            else {
                continue;
            };
            let throughput = f64::from(workloads) / kueue.wall.as_secs_f64().max(0.001);
            for &fraction in &cli.paced {
                let per_second = fraction * throughput;
                let count = (per_second * cli.paced_seconds as f64).round().max(1.0) as u32;
                let percent = (fraction * 100.0).round() as u32;
                for (pair, controller) in bench::pairs::abba(&cli.controllers, cli.repeat) {
                    let run = Run {
                        controller,
                        workloads: count,
                        podsets,
                        pair,
                        paced: Some((percent, per_second)),
                    };
                    results.push(run_one(cli, &client, run, churn.as_ref()).await?);
                }
            }
        }
    }
    let report = report(
        cli,
        commit,
        &results,
        idle.as_ref().map(|(_, settled)| settled),
    );
    print!("{report}");
    for path in draw_plots(cli, &results)? {
        eprintln!("bench-compare: drew {}", path.display());
    }
    if let Some(path) = &cli.results {
        std::fs::write(path, &report).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(churn) = churn {
        churn.delete().await?;
    }
    if let Some((env, _)) = idle {
        // One by one and waited for, before the namespace goes: a collection delete of 10,000
        // Workloads outlasts the request's timeout, and Kueue's finalizer work would otherwise
        // run under whatever comes next.
        if let Some((n, took)) = delete_workloads_where(&client, |ns| ns == env.ns).await? {
            eprintln!(
                "bench-compare: deleted the {n} idle Workloads in {:.0} s",
                took.as_secs_f64()
            );
        }
        Api::<Namespace>::all(env.client.clone())
            .delete(&env.ns, &DeleteParams::background())
            .await
            .with_context(|| format!("deleting the idle Workloads' namespace {}", env.ns))?;
    }
    if let Some(base) = cli.max_requests_per_workload {
        for m in results
            .iter()
            .filter(|m| m.run.controller == Controller::Ours)
        {
            let max = base + cli.max_requests_per_podset * f64::from(m.run.podsets);
            let per = per_workload_caused(m, "check");
            ensure!(
                per <= max,
                "our controller sent {per:.2} API requests per admitted Workload, its watches and \
                 lists left out ({} Workloads of {} podsets), more than {max}:\n{}",
                m.run.workloads,
                m.run.podsets,
                details(m, turns_of(cli, m.run.controller))
            );
        }
    }
    Ok(())
}

/// The namespaces of this tool's runs (`TestEnv` names them `e2e-<test>-<suffix>`; every test
/// of this tool starts with `cmp-`).
const BENCH_NAMESPACE_PREFIX: &str = "e2e-cmp-";

/// Run namespaces (not the idle Workloads' or the churn's, which last the whole benchmark).
fn is_run_namespace(ns: &str) -> bool {
    ns.starts_with(BENCH_NAMESPACE_PREFIX)
        && !ns.starts_with("e2e-cmp-idle")
        && !ns.starts_with("e2e-cmp-churn")
}

/// Waits until no earlier run's namespace is left (the namespace controller empties and
/// removes a deleted one, its Events included), so that every run starts from a clean cluster.
async fn wait_earlier_namespaces_gone(client: &kube::Client) -> Result<()> {
    let api = Api::<Namespace>::all(client.clone());
    let started = Instant::now();
    loop {
        let left: Vec<String> = api
            .list_metadata(&ListParams::default())
            .await
            .context("listing namespaces")?
            .items
            .iter()
            .map(ResourceExt::name_any)
            .filter(|ns| is_run_namespace(ns))
            .collect();
        if left.is_empty() {
            return Ok(());
        }
        for ns in &left {
            // Deleting a namespace already terminating changes nothing.
            let _ = api.delete(ns, &DeleteParams::background()).await;
        }
        ensure!(
            started.elapsed() < DELETE_WORKLOADS_TIMEOUT,
            "earlier runs' namespaces still there after {DELETE_WORKLOADS_TIMEOUT:?}: {left:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// One run, from a clean cluster: measured, its figures printed at once, then cleaned up (a
/// failed clean-up is a warning: the next run waits for the namespace to be gone anyway).
async fn run_one(
    cli: &Cli,
    client: &kube::Client,
    run: Run,
    churn: Option<&ChurnQueue>,
) -> Result<Measured> {
    wait_earlier_namespaces_gone(client).await?;
    eprintln!(
        "bench-compare: pair {}: {} with {} Workloads of {} podset(s), {}",
        run.pair,
        run.label(),
        run.workloads,
        run.podsets,
        budget_of(cli, run.controller)
    );
    let done = measure(cli, run, churn).await?;
    // The figures first: a clean-up that fails loses nothing.
    eprint!(
        "{}",
        details(&done.measured, turns_of(cli, done.measured.run.controller))
    );
    match bench::clean_up(&done.env, &done.queue).await {
        Ok(took) => eprintln!(
            "bench-compare: the run's Workloads, requests and templates gone {:.1} s after \
             their deletion (the next run starts only then)",
            took.as_secs_f64()
        ),
        Err(e) => eprintln!(
            "bench-compare: cleaning up after the run failed ({e:#}); the next run waits for \
             its namespace to be gone and says what the cluster holds"
        ),
    }
    Ok(done.measured)
}

/// The client budget `controller` runs with, said for a row.
fn budget_of(cli: &Cli, controller: Controller) -> String {
    let kueue = match cli.budget {
        Budget::Shipped => "Kueue 300/500 for all it sends",
        Budget::Fair => "Kueue without a client limit",
    };
    let check = match (cli.budget, controller) {
        (_, Controller::None | Controller::Kueue) => String::new(),
        (Budget::Shipped, _) => format!(
            ", the check {}/{} and as much again for its Events",
            cli.kube_api_qps, cli.kube_api_burst
        ),
        (Budget::Fair, _) => format!(", the check {UNBOUNDED_QPS}/{UNBOUNDED_QPS}"),
    };
    format!("{kueue}{check}")
}

/// How long the Workloads deleted by [`delete_workloads_where`] may take to be gone.
const DELETE_WORKLOADS_TIMEOUT: Duration = Duration::from_secs(600);

/// Deletes every Workload of the namespaces `namespaces` accepts, 32 at a time, and waits until
/// a list shows none of them. `None` if there were none; else how many and how long it took.
async fn delete_workloads_where(
    client: &kube::Client,
    namespaces: impl Fn(&str) -> bool,
) -> Result<Option<(usize, Duration)>> {
    let started = Instant::now();
    let listed = list_workloads_where(client, &namespaces).await?;
    if listed.is_empty() {
        return Ok(None);
    }
    let count = listed.len();
    futures::stream::iter(listed)
        .map(|(ns, name)| async move {
            let api = Api::<Workload>::namespaced(client.clone(), &ns);
            match api.delete(&name, &DeleteParams::background()).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
                Err(e) => {
                    Err(anyhow::Error::new(e).context(format!("deleting Workload {ns}/{name}")))
                }
            }
        })
        .buffer_unordered(32)
        .try_collect::<()>()
        .await?;
    loop {
        let left = list_workloads_where(client, &namespaces).await?.len();
        if left == 0 {
            return Ok(Some((count, started.elapsed())));
        }
        ensure!(
            started.elapsed() < DELETE_WORKLOADS_TIMEOUT,
            "{left} of {count} deleted Workloads were still there after {DELETE_WORKLOADS_TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Namespace and name of every Workload in the namespaces `namespaces` accepts, listed in pages.
async fn list_workloads_where(
    client: &kube::Client,
    namespaces: &impl Fn(&str) -> bool,
) -> Result<Vec<(String, String)>> {
    let api = Api::<Workload>::all(client.clone());
    let mut found = Vec::new();
    let mut page = ListParams::default().limit(500);
    loop {
        let list = api
            .list_metadata(&page)
            .await
            .context("listing the Workloads of the cluster")?;
        found.extend(list.items.iter().filter_map(|w| {
            let ns = w.namespace()?;
            namespaces(&ns).then(|| (ns, w.name_any()))
        }));
        match list.metadata.continue_ {
            Some(token) if !token.is_empty() => page = page.continue_token(&token),
            _ => return Ok(found),
        }
    }
}

/// Creates `n` Workloads that stay in the cluster through the runs, in no queue, and waits
/// until Kueue is done with them.
async fn create_idle(cli: &Cli, n: u32) -> Result<(TestEnv, Settled)> {
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
    let settled = wait_settled(cli, &env, n).await?;
    let reasons: Vec<String> = settled
        .reasons
        .iter()
        .map(|(reason, count)| format!("{reason} ×{count}"))
        .collect();
    let kueue_cpu = settled
        .kueue_cpu_quiet
        .map_or(String::new(), |s| format!(" and used {s:.2} CPU s"));
    eprintln!(
        "bench-compare: Kueue settled on {n} idle Workloads after {:.0} s: every one has \
         {}=False ({}; {:?}), none changed in the last {} s (their watch and a list agree), \
         and Kueue sent no write to their namespace in that time (audit log){kueue_cpu}; {} \
         changes seen after the watch's first sight of each",
        settled.took.as_secs_f64(),
        cond::QUOTA_RESERVED,
        reasons.join(", "),
        settled.message,
        SETTLE_QUIET.as_secs(),
        settled.changes,
    );
    Ok((env, settled))
}

/// How long none of the idle Workloads may change before Kueue counts as done with them.
const SETTLE_QUIET: Duration = Duration::from_secs(5);

/// How Kueue came to rest on the idle Workloads.
#[derive(Debug)]
struct Settled {
    /// From the end of their creation to the rest.
    took: Duration,
    /// The reasons of their `QuotaReserved=False`, with how many carry each.
    reasons: BTreeMap<String, usize>,
    /// The message of one of them.
    message: String,
    /// Changes of an idle Workload the watch saw after its first sight of it.
    changes: u64,
    /// Kueue's CPU seconds in the quiet window (none if its pid is unknown).
    kueue_cpu_quiet: Option<f64>,
}

/// One idle Workload as the settle wait last saw it.
#[derive(Debug)]
struct IdleSeen {
    resource_version: Option<String>,
    /// The reason and message of its `QuotaReserved=False`, once Kueue wrote it.
    unqueued: Option<(String, String)>,
}

impl IdleSeen {
    /// What Kueue's Workload reconciler writes on a Workload whose LocalQueue does not exist,
    /// once it has processed it: `QuotaReserved=False` (Kueue v0.15 to v0.19: reason
    /// `Inadmissible`, or `Misconfigured` with the `UnadmittedWorkloadsObservability` gate;
    /// message "LocalQueue lq doesn't exist"). Before that reconcile the Workload has no
    /// conditions.
    fn of(wl: &Workload) -> Self {
        let unqueued = wl
            .condition(cond::QUOTA_RESERVED)
            .filter(|c| c.status == "False")
            .map(|c| (c.reason.clone(), c.message.clone()));
        Self {
            resource_version: wl.resource_version(),
            unqueued,
        }
    }
}

/// The start of a window in which nothing may happen to the idle Workloads.
struct Quiet {
    since: Instant,
    /// The audit log's end then: Kueue's writes since are read from here.
    audit: AuditMark,
    /// Kueue's CPU seconds then, if its pid is known.
    kueue_cpu: Option<f64>,
}

impl Quiet {
    fn from_now(kueue_pid: Option<u32>) -> Result<Self> {
        Ok(Self {
            since: Instant::now(),
            audit: e2e::audit_log_mark()?,
            kueue_cpu: kueue_pid.and_then(|pid| cpu_seconds(pid).ok()),
        })
    }
}

/// Waits until Kueue is done with the `count` idle Workloads of `env`: every one carries
/// Kueue's mark of a Workload without a LocalQueue ([`IdleSeen::of`]) and none has changed for
/// [`SETTLE_QUIET`] by a watch of their namespace, confirmed at the end by a list (the watch
/// may lag behind the API server under load) and by the audit log (Kueue sent no write to
/// their namespace in the window, also none that changed nothing). Fails after
/// `--timeout-seconds`.
async fn wait_settled(cli: &Cli, env: &TestEnv, count: u32) -> Result<Settled> {
    let started = Instant::now();
    let timeout = Duration::from_secs(cli.timeout_seconds);
    let kueue_pid = component_pid("kueue").ok();
    let mut idle: BTreeMap<String, IdleSeen> = BTreeMap::new();
    let mut changes = 0u64;
    // Whether anything happened since the last look (the first list, to begin with).
    let mut changed = true;
    let mut quiet = Quiet::from_now(kueue_pid)?;
    let mut doubt = "the watch has not listed them yet".to_string();
    let events = watcher::watcher(env.workloads(), watcher::Config::default()).default_backoff();
    let mut events = std::pin::pin!(events);
    let mut looks = tokio::time::interval(Duration::from_millis(250));
    looks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(watcher::Event::Apply(wl) | watcher::Event::InitApply(wl))) => {
                    let seen = IdleSeen::of(&wl);
                    let version = seen.resource_version.clone();
                    match idle.insert(wl.name_any(), seen) {
                        // A re-list of what the watch had: no change.
                        Some(before) if before.resource_version == version => {}
                        Some(_) => {
                            changes += 1;
                            changed = true;
                        }
                        None => changed = true,
                    }
                }
                Some(Ok(watcher::Event::Delete(wl))) => {
                    idle.remove(&wl.name_any());
                    changed = true;
                }
                Some(Ok(watcher::Event::Init | watcher::Event::InitDone)) => {}
                // The watcher retries by itself; what happened meanwhile is unknown.
                Some(Err(e)) => {
                    doubt = format!("their watch failed ({e}) and restarts");
                    changed = true;
                }
                None => bail!("the watch of the idle Workloads ended"),
            },
            _ = looks.tick() => {
                let unqueued = idle.values().filter(|s| s.unqueued.is_some()).count();
                if std::mem::take(&mut changed) {
                    quiet = Quiet::from_now(kueue_pid)?;
                    doubt = format!("{unqueued} of {count} marked, changes still coming");
                } else if unqueued == count as usize
                    && idle.len() == count as usize
                    && quiet.since.elapsed() >= SETTLE_QUIET
                {
                    match quiet_doubt(env, &idle, &quiet).await? {
                        None => return Ok(settled(&idle, &quiet, started, changes, kueue_pid)),
                        Some(why) => {
                            quiet = Quiet::from_now(kueue_pid)?;
                            doubt = why;
                        }
                    }
                }
                ensure!(
                    started.elapsed() < timeout,
                    "Kueue did not settle on the {count} idle Workloads within {} s (the \
                     --timeout-seconds): {unqueued} of {} seen carry {}=False, none changed in \
                     the last {:.1} s (at least {} s needed); last: {doubt}",
                    timeout.as_secs(),
                    idle.len(),
                    cond::QUOTA_RESERVED,
                    quiet.since.elapsed().as_secs_f64(),
                    SETTLE_QUIET.as_secs(),
                );
            }
        }
    }
}

/// Why a list or the audit log says something happened to the idle Workloads since `quiet`
/// began, when the watch saw nothing; none if both agree with it.
async fn quiet_doubt(
    env: &TestEnv,
    idle: &BTreeMap<String, IdleSeen>,
    quiet: &Quiet,
) -> Result<Option<String>> {
    let listed = env
        .workloads()
        .list_metadata(&ListParams::default())
        .await
        .context("listing the idle Workloads")?
        .items;
    let newer = listed
        .iter()
        .filter(|w| {
            idle.get(&w.name_any())
                .is_none_or(|s| s.resource_version != w.resource_version())
        })
        .count();
    if newer > 0 || listed.len() != idle.len() {
        return Ok(Some(format!(
            "a list found {} Workloads, {newer} of them not as the watch last saw them",
            listed.len()
        )));
    }
    // A write that changes nothing leaves the object as it was, but still loads the server.
    let writes = e2e::audited_since(&quiet.audit)?
        .into_iter()
        .filter(|(user, r)| {
            user == KUEUE_USER
                && r.namespace.as_deref() == Some(env.ns.as_str())
                && !matches!(r.verb.as_str(), "get" | "list" | "watch")
        })
        .count();
    if writes > 0 {
        return Ok(Some(format!(
            "Kueue sent {writes} writes to their namespace in the quiet window (audit log)"
        )));
    }
    Ok(None)
}

/// What the settle wait reports once it ends.
fn settled(
    idle: &BTreeMap<String, IdleSeen>,
    quiet: &Quiet,
    started: Instant,
    changes: u64,
    kueue_pid: Option<u32>,
) -> Settled {
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    for (reason, _) in idle.values().filter_map(|s| s.unqueued.as_ref()) {
        *reasons.entry(reason.clone()).or_default() += 1;
    }
    let message = idle
        .values()
        .find_map(|s| s.unqueued.as_ref())
        .map(|(_, message)| message.clone())
        .unwrap_or_default();
    let kueue_cpu_now = kueue_pid.and_then(|pid| cpu_seconds(pid).ok());
    Settled {
        took: started.elapsed(),
        reasons,
        message,
        changes,
        kueue_cpu_quiet: kueue_cpu_now
            .zip(quiet.kueue_cpu)
            .map(|(now, then)| now - then),
    }
}

/// A binary built beside this one (`make bench-compare` builds them).
fn sibling(name: &str) -> Result<PathBuf> {
    bench::sibling(
        name,
        "cargo build -p kueue-provisioning-controller -p autoscaler-simulator -p e2e --bins \
         with the same profile (make bench-compare does)",
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

/// The processes whose CPU the run accounts for, with their pids: the control plane's, the
/// simulator and the check (when the run has them) and the benchmark itself.
fn processes(
    simulator: Option<&Process>,
    ours: Option<&Process>,
) -> Result<Vec<(&'static str, u32)>> {
    let mut all = vec![
        ("kueue", component_pid("kueue")?),
        ("kube-apiserver", component_pid("kube-apiserver")?),
        ("etcd", component_pid("etcd")?),
        (
            "kube-controller-manager",
            component_pid("kube-controller-manager")?,
        ),
        ("kube-scheduler", component_pid("kube-scheduler")?),
        ("kwok", component_pid("kwok")?),
        ("bench-compare", std::process::id()),
    ];
    if let Some(p) = simulator {
        all.push(("simulator", p.pid()));
    }
    if let Some(p) = ours {
        all.push(("check", p.pid()));
    }
    Ok(all)
}

/// CPU seconds each of `pids` has used so far.
fn cpu_of(pids: &[(&'static str, u32)]) -> Result<Vec<f64>> {
    pids.iter().map(|(_, pid)| cpu_seconds(*pid)).collect()
}

/// A run measured, with what the next run needs to start from a clean cluster.
struct Done {
    measured: Measured,
    env: TestEnv,
    queue: RunQueue,
}

async fn measure(cli: &Cli, run: Run, churn: Option<&ChurnQueue>) -> Result<Done> {
    let cluster_at_start = cluster_contents(&e2e::admin_client().await?).await?;
    let env = TestEnv::new(&run.namespace_prefix()).await?;
    let controller_name = match run.controller {
        Controller::Kueue => KUEUE_CONTROLLER_NAME.to_string(),
        Controller::Ours => env.provisioning_controller_name(),
        Controller::Floor | Controller::None => env.own_controller_name("floor"),
    };
    let queue = set_up_queue(&env, run, &controller_name).await?;
    let mut simulator = match run.controller.provisions() {
        true => Some(start_simulator(&env)?),
        false => None,
    };
    let mut ours = match run.controller.runs_a_process() {
        true => Some(start_ours(cli, &env, run.controller, &controller_name).await?),
        false => None,
    };
    if run.controller != Controller::None {
        env.wait_active::<AdmissionCheck>(&queue.check, "True", None)
            .await?;
    }
    env.wait_active::<ClusterQueue>(&queue.cluster_queue, "True", None)
        .await?;

    let timeout = Duration::from_secs(cli.timeout_seconds);
    // The background stream flows from before the burst, in the same way for every run.
    let churning = match churn {
        Some(q) => Some(q.start(run, timeout).await?),
        None => None,
    };

    // The measurement: from here to the last admission.
    let audit_from = e2e::audit_log_mark()?;
    let pids = processes(simulator.as_ref(), ours.as_ref().map(|o| &o.process))?;
    let cpu_before = cpu_of(&pids)?;
    let machine_before = bench::machine::read()?;
    let seen = Seen::default();
    let trouble = bench::WatchTrouble::default();
    let watches = watch_run(&env, &queue, &seen, &trouble);
    let started = Instant::now();
    let started_at = k8s_openapi::jiff::Timestamp::now();
    let creating = Creating {
        prefix: "wl",
        count: run.workloads,
        podsets: run.podsets,
        concurrency: cli.create_concurrency,
    };
    match run.paced {
        None => bench::create_workloads(&env, creating, Some(&seen)).await?,
        Some((_, per_second)) => {
            bench::create_paced(&env, creating, per_second, &seen).await?;
        }
    }
    bench::wait_all_admitted(&seen, run.workloads, timeout, started, || {
        simulator.as_mut().map_or(Ok(()), Process::alive)?;
        churning.as_ref().map_or(Ok(()), ChurnStream::alive)?;
        ours.as_mut().map_or(Ok(()), |o| o.process.alive())
    })
    .await?;
    let cpu_after = cpu_of(&pids)?;
    let machine = bench::machine::between(
        &machine_before,
        &bench::machine::read()?,
        clock_ticks_per_second(),
    );
    // The stream stops at the run's last admission.
    let mut churned = match churning {
        Some(stream) => Some(stream.stop(started).await?),
        None => None,
    };
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
    let churn_namespace = churn.map(|q| q.env.ns.as_str());
    let audited = e2e::audited_since(&audit_from)?;
    let requests = requests_by_actor(&audited, check_user.as_deref(), churn_namespace);
    let kueue_limiter = match cli.budget {
        Budget::Shipped => Some(kueue_limiter_use(&audited, started_at, wall)),
        Budget::Fair => None,
    };
    let cpu = pids
        .iter()
        .zip(cpu_before.iter().zip(&cpu_after))
        .map(|((name, _), (before, after))| (*name, after - before))
        .collect();
    // None of the stream is left to run under the next run.
    if let (Some(q), Some(c)) = (churn, churned.as_mut()) {
        c.gone_after = q.clear(timeout).await?;
    }
    let measured = Measured {
        run,
        wall,
        marks,
        requests,
        cpu,
        peak_rss_kib,
        queue_wait,
        startup,
        churn: churned,
        machine,
        kueue_limiter,
        cluster_at_start,
        watch_trouble: trouble.counts(),
    };
    Ok(Done {
        measured,
        env,
        queue,
    })
}

/// Kueue's requests received from `started_at` over `wall`, against its shipped limiter.
fn kueue_limiter_use(
    audited: &[(String, e2e::Audited)],
    started_at: k8s_openapi::jiff::Timestamp,
    wall: Duration,
) -> bench::limiter::LimiterUse {
    let received: Vec<f64> = audited
        .iter()
        .filter(|(user, _)| user == KUEUE_USER)
        .filter_map(|(_, r)| r.received)
        .map(|t| t.duration_since(started_at).as_secs_f64())
        .collect();
    bench::limiter::limiter_use(
        &received,
        wall.as_secs_f64(),
        KUEUE_SHIPPED_QPS,
        KUEUE_SHIPPED_BURST,
    )
}

/// Kueue v0.19.2's shipped client limit (`clientConnection`), which the control plane keeps.
const KUEUE_SHIPPED_QPS: f64 = 300.0;
const KUEUE_SHIPPED_BURST: f64 = 500.0;

/// What the cluster holds now, counted from one-item lists (the API server's
/// `remainingItemCount`): what every run carries into its measurement.
async fn cluster_contents(client: &kube::Client) -> Result<String> {
    async fn count<K>(api: Api<K>) -> Result<u64>
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let list = api.list_metadata(&ListParams::default().limit(1)).await?;
        let remaining = list.metadata.remaining_item_count.unwrap_or(0);
        Ok(list.items.len() as u64 + u64::try_from(remaining).unwrap_or(0))
    }
    let c = client.clone();
    let metrics = http::Request::get("/metrics")
        .body(Vec::new())
        .context("the request for the API server's metrics")?;
    // Never fails the run: the figure is context, not a measurement.
    let etcd = match client.request_text(metrics).await {
        Ok(text) => bench::storage::storage_size_bytes(&text).map_or_else(
            || "etcd's database: not in the API server's metrics".to_string(),
            |bytes| format!("etcd's database {:.0} MiB", bytes / 1_048_576.0),
        ),
        Err(e) => format!("etcd's database: the API server's metrics not read ({e})"),
    };
    Ok(format!(
        "{} namespaces, {} Workloads, {} ProvisioningRequests, {} PodTemplates, {} pods, {} \
         Events, {} Nodes; {etcd}",
        count(Api::<Namespace>::all(c.clone())).await?,
        count(Api::<Workload>::all(c.clone())).await?,
        count(Api::<ProvisioningRequest>::all(c.clone())).await?,
        count(Api::<PodTemplate>::all(c.clone())).await?,
        count(Api::<k8s_openapi::api::core::v1::Pod>::all(c.clone())).await?,
        count(Api::<k8s_openapi::api::events::v1::Event>::all(c.clone())).await?,
        count(Api::<k8s_openapi::api::core::v1::Node>::all(c)).await?,
    ))
}

/// Watches the run's Workloads and requests into `seen`.
fn watch_run(
    env: &TestEnv,
    queue: &RunQueue,
    seen: &Seen,
    trouble: &bench::WatchTrouble,
) -> [tokio::task::JoinHandle<()>; 2] {
    let (workloads, check, seen_w, trouble_w) = (
        env.workloads(),
        queue.check.clone(),
        seen.clone(),
        trouble.clone(),
    );
    let (requests, seen_r, trouble_r) = (
        Api::namespaced(env.client.clone(), &env.ns),
        seen.clone(),
        trouble.clone(),
    );
    [
        tokio::spawn(async move {
            bench::watch_workloads_noting(workloads, check, seen_w, &trouble_w).await;
        }),
        tokio::spawn(async move { watch_requests(requests, seen_r, &trouble_r).await }),
    ]
}

/// The background stream's queue, made once for the whole benchmark: a namespace of its own
/// with LocalQueue `lq`, feeding a ClusterQueue without admission checks.
struct ChurnQueue {
    env: TestEnv,
    flavor: String,
    cluster_queue: String,
    per_second: u32,
}

/// When the benchmark saw one churn Workload's create sent and answered, its admission and its
/// deletion answered.
#[derive(Clone, Copy, Debug)]
struct ChurnTimes {
    sent: Instant,
    created: Option<Instant>,
    admitted: Option<Instant>,
    deleted: Option<Instant>,
}

/// The times of a run's churn Workloads, by name, shared by the stream's tasks.
type ChurnTimesByName = Arc<Mutex<BTreeMap<String, ChurnTimes>>>;

/// The first error of one of the stream's tasks.
type ChurnFailure = Arc<Mutex<Option<String>>>;

impl ChurnQueue {
    async fn create(cli: &Cli, per_second: u32) -> Result<Self> {
        let env = TestEnv::new("cmp-churn").await?;
        let flavor = env.resource_flavor("churn").await?.name_any();
        // 100m per Workload: room for twice what the stream creates in a run that lasts the
        // whole timeout, so that it never waits for quota, even with its deletes behind.
        let cpu = (u64::from(per_second) * cli.timeout_seconds / 5 + 1).to_string();
        let cluster_queue = env.queues_on(&flavor, &cpu, &[]).await?;
        env.wait_active::<ClusterQueue>(&cluster_queue, "True", None)
            .await?;
        eprintln!(
            "bench-compare: background churn of {per_second} Workloads/s through ClusterQueue \
             {cluster_queue} during each run"
        );
        Ok(Self {
            env,
            flavor,
            cluster_queue,
            per_second,
        })
    }

    /// Starts the stream of `run` and returns once it flows (its first Workload admitted).
    async fn start(&self, run: Run, timeout: Duration) -> Result<ChurnStream> {
        let times = ChurnTimesByName::default();
        let failure = ChurnFailure::default();
        let (admitted_tx, admitted_rx) = mpsc::unbounded_channel();
        let (stop, stopped) = oneshot::channel();
        // Two seconds of the stream in flight before it falls behind its rate, within bounds
        // that neither starve a slow stream nor flood the server.
        let in_flight = (2 * self.per_second as usize).clamp(8, 64);
        let started = Instant::now();
        let watching = tokio::spawn(watch_churn(
            self.env.workloads(),
            times.clone(),
            admitted_tx,
        ));
        let deleting = spawn_churn_task(
            &failure,
            "deleting",
            delete_admitted(self.env.workloads(), admitted_rx, in_flight, times.clone()),
        );
        let pacing = ChurnPacing {
            api: self.env.workloads(),
            namespace: self.env.ns.clone(),
            prefix: format!("churn-{}", run.namespace_prefix()),
            per_second: self.per_second,
            in_flight,
        };
        let creating = spawn_churn_task(
            &failure,
            "creating",
            create_paced(pacing, times.clone(), stopped),
        );
        let stream = ChurnStream {
            per_second: self.per_second,
            started,
            times,
            failure,
            stop: Some(stop),
            creating,
            deleting,
            watching,
        };
        while !lock(&stream.times).values().any(|t| t.admitted.is_some()) {
            stream.alive()?;
            ensure!(
                started.elapsed() < timeout,
                "no churn Workload admitted within {timeout:?} of the stream's start"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(stream)
    }

    /// Deletes what is left of a run's stream and waits until it is gone; returns how long
    /// that took.
    async fn clear(&self, timeout: Duration) -> Result<Duration> {
        let began = Instant::now();
        let api = self.env.workloads();
        bench::delete_in_pages(&api)
            .await
            .context("deleting the churn Workloads left")?;
        loop {
            let left = api
                .list_metadata(&ListParams::default().limit(1))
                .await
                .context("listing the churn Workloads left")?
                .items;
            let Some(one) = left.first() else {
                return Ok(began.elapsed());
            };
            ensure!(
                began.elapsed() < timeout,
                "churn Workloads still there {timeout:?} after their deletion, {} among them",
                one.name_any()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Deletes the stream's queue and namespace, at the end of the benchmark.
    async fn delete(self) -> Result<()> {
        let (client, dp) = (&self.env.client, DeleteParams::background());
        Api::<LocalQueue>::namespaced(client.clone(), &self.env.ns)
            .delete("lq", &dp)
            .await
            .context("deleting the churn LocalQueue")?;
        Api::<ClusterQueue>::all(client.clone())
            .delete(&self.cluster_queue, &dp)
            .await
            .context("deleting the churn ClusterQueue")?;
        Api::<ResourceFlavor>::all(client.clone())
            .delete(&self.flavor, &dp)
            .await
            .context("deleting the churn ResourceFlavor")?;
        Api::<Namespace>::all(client.clone())
            .delete(&self.env.ns, &dp)
            .await
            .with_context(|| format!("deleting the churn namespace {}", self.env.ns))?;
        Ok(())
    }
}

/// Spawns one of the stream's tasks; its error, if it fails, goes to `failure` (the first
/// one is kept), where [`ChurnStream::alive`] finds it while the run goes on.
fn spawn_churn_task(
    failure: &ChurnFailure,
    what: &'static str,
    task: impl std::future::Future<Output = Result<()>> + Send + 'static,
) -> JoinHandle<()> {
    let failure = failure.clone();
    tokio::spawn(async move {
        if let Err(e) = task.await {
            lock(&failure).get_or_insert(format!("{what}: {e:#}"));
        }
    })
}

/// How the stream creates its Workloads.
struct ChurnPacing {
    api: Api<Workload>,
    namespace: String,
    /// Names are `<prefix>-000000` ...
    prefix: String,
    per_second: u32,
    /// Creates in flight at once.
    in_flight: usize,
}

/// Creates one Workload (1 podset, 1 pod of 100m, as a run's) per tick of `1 / per_second` until
/// `stop`, then waits for the creates in flight.
async fn create_paced(
    pacing: ChurnPacing,
    times: ChurnTimesByName,
    stop: oneshot::Receiver<()>,
) -> Result<()> {
    let ChurnPacing {
        api,
        namespace,
        prefix,
        per_second,
        in_flight,
    } = pacing;
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(per_second)));
    // Skip, not Burst (tokio's default): after a stall (the server slow to answer, the creates
    // in flight at their bound) Burst would send every missed create at once, adding load just
    // when the run is slowest, so a slower run would carry more background. Skip drops the
    // missed ticks and keeps the rest on the schedule's grid (Delay would shift it); the count
    // created against the rate's shows what was dropped.
    ticks.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let ticks = futures::stream::unfold(ticks, |mut ticks| async move {
        ticks.tick().await;
        Some(((), ticks))
    });
    ticks
        .take_until(stop)
        .enumerate()
        .map(|(i, ())| {
            let (api, times) = (api.clone(), times.clone());
            let name = format!("{prefix}-{i:06}");
            let workload = bench::workload(&namespace, &name, 1);
            async move {
                let sent = Instant::now();
                // Before the create: the watch may see it admitted before the answer comes.
                lock(&times).insert(
                    name.clone(),
                    ChurnTimes {
                        sent,
                        created: None,
                        admitted: None,
                        deleted: None,
                    },
                );
                api.create(&PostParams::default(), &workload?)
                    .await
                    .with_context(|| format!("creating churn Workload {name}"))?;
                let created = Instant::now();
                if let Some(t) = lock(&times).get_mut(&name) {
                    t.created = Some(created);
                }
                anyhow::Ok(())
            }
        })
        .buffer_unordered(in_flight)
        .try_collect::<()>()
        .await
}

/// Marks each churn Workload of the run admitted when the watch first sees it so, and hands it
/// to the deletes.
async fn watch_churn(
    api: Api<Workload>,
    times: ChurnTimesByName,
    admitted: mpsc::UnboundedSender<String>,
) {
    bench::watch(api, |wl: Workload, now| {
        if !wl.condition_is_true(cond::ADMITTED) {
            return;
        }
        let name = wl.name_any();
        let first = match lock(&times).get_mut(&name) {
            Some(t) if t.admitted.is_none() => {
                t.admitted = Some(now);
                true
            }
            // Seen before, or not the run's.
            _ => false,
        };
        if first {
            // Fails only once the deletes stopped, with the stream.
            let _ = admitted.send(name);
        }
    })
    .await;
}

/// Deletes each admitted churn Workload, `in_flight` at once, until the watch stops.
async fn delete_admitted(
    api: Api<Workload>,
    admitted: mpsc::UnboundedReceiver<String>,
    in_flight: usize,
    times: ChurnTimesByName,
) -> Result<()> {
    let names = futures::stream::unfold(admitted, |mut admitted| async move {
        admitted.recv().await.map(|name| (name, admitted))
    });
    names
        .map(|name| {
            let (api, times) = (api.clone(), times.clone());
            async move {
                match api.delete(&name, &DeleteParams::background()).await {
                    // Gone already is what the delete wants.
                    Ok(_) => {}
                    Err(kube::Error::Api(status)) if status.is_not_found() => {}
                    Err(e) => {
                        return Err(e).with_context(|| format!("deleting churn Workload {name}"));
                    }
                }
                let deleted = Instant::now();
                if let Some(t) = lock(&times).get_mut(&name) {
                    t.deleted = Some(deleted);
                }
                anyhow::Ok(())
            }
        })
        .buffer_unordered(in_flight)
        .try_collect::<()>()
        .await
}

/// One run's stream, flowing until stopped; its tasks end with it on every way out.
struct ChurnStream {
    per_second: u32,
    started: Instant,
    times: ChurnTimesByName,
    failure: ChurnFailure,
    stop: Option<oneshot::Sender<()>>,
    creating: JoinHandle<()>,
    deleting: JoinHandle<()>,
    watching: JoinHandle<()>,
}

impl Drop for ChurnStream {
    fn drop(&mut self) {
        for task in [&self.creating, &self.deleting, &self.watching] {
            task.abort();
        }
    }
}

impl ChurnStream {
    /// Fails if one of its tasks failed.
    fn alive(&self) -> Result<()> {
        match lock(&self.failure).as_deref() {
            Some(e) => bail!("the background churn failed: {e}"),
            None => Ok(()),
        }
    }

    /// Stops the stream and counts what it did until now; `burst_started` is the run's first
    /// create. The creates in flight land first (one landing later would outlive the
    /// clean-up); the deletes stop at once, [`ChurnQueue::clear`] deletes the rest.
    async fn stop(mut self, burst_started: Instant) -> Result<Churned> {
        let stopped = Instant::now();
        if let Some(stop) = self.stop.take() {
            // Fails only if the create task has ended already (with an error, kept by alive).
            let _ = stop.send(());
        }
        (&mut self.creating)
            .await
            .context("the churn's create task panicked")?;
        self.watching.abort();
        self.deleting.abort();
        self.alive()?;
        let times = lock(&self.times);
        let by_stop = |at: Option<Instant>| at.is_some_and(|at| at <= stopped);
        let count = |at: fn(&ChurnTimes) -> Option<Instant>| {
            times.values().filter(|t| by_stop(at(t))).count()
        };
        let mut created_to_admitted: Vec<Duration> = times
            .values()
            .filter(|t| by_stop(t.admitted))
            .filter_map(|t| Some(t.admitted? - t.sent))
            .collect();
        created_to_admitted.sort();
        Ok(Churned {
            per_second: self.per_second,
            flowed: stopped - self.started,
            lead: burst_started.saturating_duration_since(self.started),
            created: count(|t| t.created),
            admitted: count(|t| t.admitted),
            deleted: count(|t| t.deleted),
            created_to_admitted,
            left: times
                .values()
                .filter(|t| t.created.is_some() && t.deleted.is_none())
                .count(),
            gone_after: Duration::ZERO,
        })
    }
}

/// What the background stream did in one run, from its start to the run's last admission: the
/// same in every run, as far as the cluster let it.
#[derive(Debug)]
struct Churned {
    per_second: u32,
    /// From its start to its stop.
    flowed: Duration,
    /// From its start to the run's first create.
    lead: Duration,
    /// Creates answered, admissions seen and deletes answered while it flowed.
    created: usize,
    admitted: usize,
    deleted: usize,
    /// Create sent → admitted, sorted, of those admitted while it flowed.
    created_to_admitted: Vec<Duration>,
    /// Its Workloads still there when it stopped, and how long they took to go once deleted
    /// (filled in by [`ChurnQueue::clear`]).
    left: usize,
    gone_after: Duration,
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
    // 100m per pod: room for every Workload at once, so none waits for quota.
    let quota = format!("{}", run.workloads * run.podsets / 10 + 1);
    let (check, provisioning_config) = match run.controller {
        Controller::None => (String::new(), None),
        Controller::Floor => {
            let check = env.admission_check("floor", controller_name).await?;
            (check.name_any(), None)
        }
        Controller::Kueue | Controller::Ours => {
            let config = env.provisioning_config("prc", json!({})).await?;
            let check = env
                .provisioning_check("prov", controller_name, &config)
                .await?;
            (check, Some(config))
        }
    };
    let checks: Vec<&str> = [check.as_str()]
        .into_iter()
        .filter(|c| !c.is_empty())
        .collect();
    let (flavor, cluster_queue) = env.pool_queues(&quota, &checks).await?;
    Ok(RunQueue {
        flavor,
        check,
        cluster_queue,
        provisioning_config,
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

/// The requests of one kind an actor sent in a run.
#[derive(Clone, Copy, Debug, Default)]
struct Calls {
    count: usize,
    /// The API server's time on them, summed (see [`e2e::Audited::server_time`]).
    server_time: Duration,
}

impl Calls {
    /// The API server's mean time on one of them.
    fn mean_server_time(&self) -> Duration {
        self.server_time / u32::try_from(self.count.max(1)).unwrap_or(u32::MAX)
    }
}

/// The API requests each actor sent since `from`, by call (`verb resource`); our controller
/// is `check_user`. Requests in `churn_namespace` are the background stream's, not the run's,
/// and left out; Kueue's status writes to the stream's ClusterQueue (cluster-scoped, the
/// audit log's lines here carry no object name) stay in, the same in every run.
fn requests_by_actor(
    audited: &[(String, e2e::Audited)],
    check_user: Option<&str>,
    churn_namespace: Option<&str>,
) -> BTreeMap<&'static str, BTreeMap<String, Calls>> {
    let mut requests: BTreeMap<&'static str, BTreeMap<String, Calls>> = BTreeMap::new();
    for (user, r) in audited {
        if churn_namespace.is_some() && r.namespace.as_deref() == churn_namespace {
            continue;
        }
        let actor = match user.as_str() {
            KUEUE_USER => "kueue",
            SIMULATOR_USER => "simulator",
            u if Some(u) == check_user => "check",
            _ => continue,
        };
        let call = format!("{} {}", r.verb, r.resource);
        let calls = requests.entry(actor).or_default().entry(call).or_default();
        calls.count += 1;
        calls.server_time += r.server_time.unwrap_or_default();
    }
    requests
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

/// Starts our controller (or, for the floor, the always-ready check) as the provisioning
/// chart's ServiceAccount (its RBAC applied in the run's namespace), with the budget of
/// `cli.budget` and Kueue's concurrency, and waits until it is ready.
async fn start_ours(
    cli: &Cli,
    env: &TestEnv,
    controller: Controller,
    controller_name: &str,
) -> Result<Ours> {
    let service_account =
        chart::provisioning_service_account(&env.client, &env.ns, controller_name, "bench-compare")
            .await?;
    let kubeconfig = e2e::service_account_kubeconfig(&env.ns, &service_account).await?;
    let path = std::env::temp_dir().join(format!("{}-check.kubeconfig", env.ns));
    write_private(&path, &serde_json::to_string(&kubeconfig)?)?;
    let http = e2e::free_local_address()?;
    let (qps, burst) = match cli.budget {
        Budget::Shipped => (cli.kube_api_qps, cli.kube_api_burst),
        Budget::Fair => (UNBOUNDED_QPS, UNBOUNDED_QPS),
    };
    let (binary, mut command) = match controller {
        Controller::Floor => ("always-ready", Command::new(sibling("always-ready")?)),
        _ => {
            let mut c = Command::new(sibling("kueue-provisioning-controller")?);
            c.arg(format!("--start-early={}", cli.start_early));
            c.args([
                "--early-start-concurrency",
                &cli.early_start_concurrency.to_string(),
            ]);
            ("kueue-provisioning-controller", c)
        }
    };
    let spawned = Instant::now();
    let mut process = Process::spawn(
        binary,
        command
            .arg("--kubeconfig")
            .arg(&path)
            .args(["--controller-name", controller_name])
            .args(["--metrics-address", &http.to_string()])
            // Metrics and probes plain on one address, read without a token; as variables, which
            // a binary from before those flags ignores.
            .env("KUEUE_AC_METRICS_SECURE", "false")
            .env("KUEUE_AC_HEALTH_ADDRESS", http.to_string())
            .args(["--leader-elect", "false"])
            .args(["--kube-api-qps", &qps.to_string()])
            .args(["--kube-api-burst", &burst.to_string()])
            .args(["--concurrency", &cli.concurrency.to_string()])
            // BENCH_CHECK_LOG_LEVEL, e.g. "warn,kueue_admission_sdk=debug", to see why it
            // reconciled; it costs CPU, so the figures of such a run are not comparable.
            .env(
                "KUEUE_AC_LOG_LEVEL",
                std::env::var("BENCH_CHECK_LOG_LEVEL").unwrap_or_else(|_| "warn".into()),
            ),
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
async fn watch_requests(api: Api<ProvisioningRequest>, seen: Seen, trouble: &bench::WatchTrouble) {
    bench::watch_noting(api, trouble, |r: ProvisioningRequest, now| {
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
    if !run.controller.provisions() {
        return Ok(());
    }
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
const STAGES: [Stage; 8] = [
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
    Stage::new(
        "check's entry there too → check Ready",
        Mark::Askable,
        Mark::Ready,
    ),
];

/// The wait after Kueue's entry: what any check that answers at the entry adds to admission.
const ENTRY_TO_READY: &Stage = &STAGES[7];

fn secs(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64())
}

/// API requests of `actor` per admitted Workload.
fn per_workload(m: &Measured, actor: &str) -> f64 {
    per_workload_counting(m, actor, |_| true)
}

/// The API requests of `actor` per admitted Workload that Workloads cause: all but its
/// watches and lists, which a controller opens once at its start and again on a watch's
/// timeout (0.22 per Workload at 40 Workloads, under 0.01 at 1,000), whatever the Workloads.
/// What the request budget (`--max-requests-per-workload`) holds our controller to.
fn per_workload_caused(m: &Measured, actor: &str) -> f64 {
    per_workload_counting(m, actor, |call| {
        !(call.starts_with("watch ") || call.starts_with("list "))
    })
}

/// The API requests of `actor` per admitted Workload, counting the calls (`verb resource`)
/// `counts` keeps.
fn per_workload_counting(m: &Measured, actor: &str, counts: impl Fn(&str) -> bool) -> f64 {
    let total: usize = m.requests.get(actor).map_or(0, |calls| {
        calls
            .iter()
            .filter(|(call, _)| counts(call))
            .map(|(_, c)| c.count)
            .sum()
    });
    total as f64 / f64::from(m.run.workloads)
}

/// How many Workloads `controller` (an SDK check of ours) reconciles at once: its main turns,
/// and for ours when it starts early, those kept for early starts.
fn turns_of(cli: &Cli, controller: Controller) -> u32 {
    match controller {
        Controller::Ours if cli.start_early => cli.concurrency + cli.early_start_concurrency,
        _ => cli.concurrency,
    }
}

/// One run's stages and requests in detail; `concurrency`: the SDK check's turns.
fn details(m: &Measured, concurrency: u32) -> String {
    let mut out = String::new();
    let Run {
        controller,
        workloads,
        podsets,
        pair,
        ..
    } = m.run;
    let _ = writeln!(
        out,
        "\n### {}: {workloads} Workloads × {podsets} podset(s), pair {pair}, all admitted in {} s\n",
        m.run.label(),
        secs(m.wall)
    );
    let _ = writeln!(out, "the cluster at the start: {}\n", m.cluster_at_start);
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
    // How spread out each mark came bounds how soon the last Workload can get it.
    let windows: Vec<String> = [
        ("quota reserved", Mark::Reserved),
        ("check's entry there too", Mark::Askable),
        ("request seen", Mark::Request),
        ("check Ready", Mark::Ready),
    ]
    .into_iter()
    .filter_map(|(label, mark)| {
        let (first, last) = bench::window(&m.marks, mark)?;
        Some(format!(
            "{label} {:.1} to {:.1}",
            first.as_secs_f64(),
            last.as_secs_f64()
        ))
    })
    .collect();
    let _ = writeln!(
        out,
        "\nfirst and last, in s after the first create: {}",
        windows.join("; ")
    );
    let _ = writeln!(
        out,
        "\n| actor | call | per Workload | the API server's time on one, mean (ms) |"
    );
    let _ = writeln!(out, "|---|---|---|---|");
    for (actor, calls) in &m.requests {
        for (call, c) in calls {
            let per = c.count as f64 / f64::from(workloads);
            // A watch's time is how long it stayed open.
            let server = if call.starts_with("watch ") {
                "–".to_string()
            } else {
                format!("{:.0}", c.mean_server_time().as_secs_f64() * 1000.0)
            };
            let _ = writeln!(out, "| {actor} | {call} | {per:.2} | {server} |");
        }
    }
    let cpu: Vec<String> = m.cpu.iter().map(|(p, s)| format!("{p} {s:.1} s")).collect();
    let _ = writeln!(out, "\nCPU during the run: {}", cpu.join(", "));
    let cores: Vec<String> = m
        .machine
        .cores
        .iter()
        .map(|u| format!("{:.0} %", 100.0 * u))
        .collect();
    let _ = writeln!(
        out,
        "the whole machine: {:.1} CPU seconds, {:.0} % of its cores' time (each core: {})",
        m.machine.busy_seconds,
        100.0 * m.machine.utilization,
        cores.join(", ")
    );
    if let Some(l) = &m.kueue_limiter {
        let _ = writeln!(
            out,
            "Kueue's client limiter (300/s, burst 500): it sent {} requests in {:.1} s, {:.1} % of \
             the {:.0} the limiter allows (500 + 300·T); busiest second {}, {} of {} whole \
             seconds at 95 % of 300 or more{}",
            l.sent,
            l.seconds,
            100.0 * l.share(),
            l.allowed,
            l.busiest_second,
            l.seconds_near_qps,
            l.whole_seconds,
            if l.share() >= 0.9 {
                ": held by its limiter"
            } else {
                ""
            }
        );
    }
    let (errors, relists) = m.watch_trouble;
    let _ = writeln!(
        out,
        "the benchmark's own watches: {errors} errors, {relists} re-lists{}",
        if errors + relists > 0 {
            " (a stage may look later than it was)"
        } else {
            ""
        }
    );
    if let Some(q) = &m.queue_wait {
        // The floor makes no request; its queue is the SDK's all the same.
        let (whose, requests) = match controller {
            Controller::Floor => ("the floor's", String::new()),
            _ => (
                "our",
                format!(
                    "; our requests were created within {} s (p50), {} s (p99) of the \
                     reservation",
                    q.reserved_to_request_at_most.0, q.reserved_to_request_at_most.1
                ),
            ),
        };
        let _ = writeln!(
            out,
            "{whose} reconcile queue: {:.0} Workload changes read, waited {:.3} s on average, \
             99 % at most {} s; quota reservations reached its watch within {} s (p50), {} s \
             (p99); {:.0} reconciles took {:.3} s on average{requests}",
            q.changes,
            q.mean,
            q.p99_at_most,
            q.reserved_seen_at_most.0,
            q.reserved_seen_at_most.1,
            q.reconciles.0,
            q.reconciles.1,
        );
        // Reconciles hold a turn through their API calls: turns busy most of a run bound it.
        let _ = writeln!(
            out,
            "{whose} {concurrency} turns were busy for {:.1} s of the run's {:.1} s (reconciles × \
             mean ÷ turns)",
            q.reconciles.0 * q.reconciles.1 / f64::from(concurrency.max(1)),
            m.wall.as_secs_f64()
        );
    }
    if let Some(c) = &m.churn {
        let _ = writeln!(
            out,
            "background churn: {} Workloads/s through a ClusterQueue of their own for {:.1} s \
             (from {:.1} s before the first create to the last admission): {} created (the \
             rate's {:.0}), {} admitted, {} deleted; created → admitted p50 {} s, p99 {} s; the \
             {} left gone {:.1} s after their deletion (before the next run)",
            c.per_second,
            c.flowed.as_secs_f64(),
            c.lead.as_secs_f64(),
            c.created,
            c.flowed.as_secs_f64() * f64::from(c.per_second),
            c.admitted,
            c.deleted,
            secs(quantile(&c.created_to_admitted, 0.5)),
            secs(quantile(&c.created_to_admitted, 0.99)),
            c.left,
            c.gone_after.as_secs_f64()
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
            let runs: Vec<bench::plot::Drawn<'_>> = results
                .iter()
                // Pair 1 only, and only runs with a check: one curve per controller.
                .filter(|m| m.run.workloads == workloads && m.run.podsets == podsets)
                .filter(|m| m.run.pair == 1 && m.run.paced.is_none())
                .filter(|m| m.run.controller != Controller::None)
                .map(|m| bench::plot::Drawn {
                    label: m.run.controller.label(),
                    marks: &m.marks,
                })
                .collect();
            if runs.is_empty() {
                continue;
            }
            let path = cli.plots.join(format!("{workloads}x{podsets}.svg"));
            let title = format!(
                "{workloads} Workloads × {podsets} podset(s), pair 1, ours --start-early={}",
                cli.start_early
            );
            bench::plot::draw(&path, &title, &runs)?;
            drawn.push(path);
        }
    }
    Ok(drawn)
}

/// The summary table over all runs, with the ratios of ours to the built-in's; `commit`: the
/// tree measured; `settled` is how Kueue came to rest on the idle Workloads, if any.
fn report(cli: &Cli, commit: &str, results: &[Measured], settled: Option<&Settled>) -> String {
    let mut out = String::new();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let settle = settled.map_or(String::new(), |s| {
        format!(
            " (the first run started once Kueue had settled on them, {:.0} s after their \
             creation)",
            s.took.as_secs_f64()
        )
    });
    let churn = match cli.churn_per_second {
        0 => "no background churn".to_string(),
        r => format!(
            "background churn of {r} Workloads/s through a ClusterQueue of their own during \
             each run, each deleted once admitted"
        ),
    };
    let _ = writeln!(
        out,
        "\n## bench-compare, commit {commit}, {cores} cores; budget {:?} ({}); ours at \
         --concurrency {} --early-start-concurrency {} --start-early={}; {} pair(s) per size in \
         ABBA order; {} idle Workloads kept in the cluster{settle}; {churn}\n",
        cli.budget,
        budget_of(cli, Controller::Ours),
        cli.concurrency,
        cli.early_start_concurrency,
        cli.start_early,
        cli.repeat,
        cli.idle_workloads
    );
    let churn_column = if cli.churn_per_second > 0 {
        format!(
            " churn at {} Workloads/s: created / admitted / deleted, created → admitted p50 (s) |",
            cli.churn_per_second
        )
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "| controller | Workloads × podsets | all admitted | reserved → Ready p50 / p90 / p99 (s) \
         | created → admitted p50 / p90 / p99 (s) | requests per Workload: check / Kueue / \
         simulator | CPU s: check / Kueue / apiserver + etcd / whole machine (busy %) | check's \
         peak RSS | pair | budget |{churn_column}"
    );
    let columns = if churn_column.is_empty() { 10 } else { 11 };
    let _ = writeln!(out, "|{}", "---|".repeat(columns));
    for m in results {
        out.push_str(&summary_row(cli, m));
    }
    let mut sets: Vec<Run> = Vec::new();
    for m in results {
        if !sets.iter().any(|r| r.same_set(m.run)) {
            sets.push(m.run);
        }
    }
    for set in sets {
        out.push_str(&comparisons(results, set));
    }
    out
}

/// One run's row of the summary table.
fn summary_row(cli: &Cli, m: &Measured) -> String {
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
        Controller::None => "–".to_string(),
        Controller::Ours | Controller::Floor => format!("{:.2}", per_workload(m, "check")),
    };
    let cpu = |p: &str| m.cpu.get(p).copied().unwrap_or(0.0);
    let check_cpu = match m.run.controller {
        Controller::Kueue => "(in Kueue)".to_string(),
        Controller::None => "–".to_string(),
        Controller::Ours | Controller::Floor => format!("{:.1}", cpu("check")),
    };
    let rss = m.peak_rss_kib.map_or("–".to_string(), |k| {
        format!("{:.0} MiB", k as f64 / 1024.0)
    });
    let churn = m.churn.as_ref().map_or(String::new(), |c| {
        format!(
            " {} / {} / {}, {} |",
            c.created,
            c.admitted,
            c.deleted,
            secs(quantile(&c.created_to_admitted, 0.5))
        )
    });
    let ready = match m.run.controller {
        Controller::None => "– (no check)".to_string(),
        _ => q(&STAGES[0]),
    };
    format!(
        "| {} | {} × {} | {} s | {ready} | {} | {check_requests} / {:.2} / {:.2} | {check_cpu} / \
         {:.1} / {:.1} / {:.1} ({:.0} %) | {rss} | {} | {} |{churn}\n",
        m.run.label(),
        m.run.workloads,
        m.run.podsets,
        secs(m.wall),
        q(&STAGES[1]),
        per_workload(m, "kueue"),
        per_workload(m, "simulator"),
        cpu("kueue"),
        cpu("kube-apiserver") + cpu("etcd"),
        m.machine.busy_seconds,
        100.0 * m.machine.utilization,
        m.run.pair,
        budget_of(cli, m.run.controller),
    )
}

/// p99 of `stage` in a run, seconds.
fn p99(m: &Measured, stage: &Stage) -> f64 {
    quantile(&stage.durations(&m.marks), 0.99).as_secs_f64()
}

/// p50 of `stage` in a run, seconds.
fn p50(m: &Measured, stage: &Stage) -> f64 {
    quantile(&stage.durations(&m.marks), 0.5).as_secs_f64()
}

/// For one size: in every pair, ours against the built-in and against the floor, each ratio
/// beside the seconds it was taken from, then the median and range of each ratio over the
/// pairs. A ratio is only ever taken within one pair.
fn comparisons(results: &[Measured], set: Run) -> String {
    let mut out = String::new();
    let (workloads, podsets) = (set.workloads, set.podsets);
    let of_size: Vec<&Measured> = results.iter().filter(|m| m.run.same_set(set)).collect();
    let set_name = match set.paced {
        None => format!("{workloads} × {podsets}"),
        Some((percent, per_second)) => {
            format!("{workloads} × {podsets} paced at {percent} % ({per_second:.1}/s)")
        }
    };
    let pairs: std::collections::BTreeSet<u32> = of_size.iter().map(|m| m.run.pair).collect();
    let mut ratios: BTreeMap<&'static str, Vec<f64>> = BTreeMap::new();
    for pair in pairs {
        let run = |c: Controller| {
            of_size
                .iter()
                .copied()
                .find(|m| m.run.pair == pair && m.run.controller == c)
        };
        let Some(ours) = run(Controller::Ours) else {
            continue;
        };
        // CPU seconds per 1,000 Workloads of a run (ms per Workload).
        let per_thousand = |m: &Measured, cpu: f64| 1000.0 * cpu / f64::from(m.run.workloads);
        let kueue_cpu = |m: &Measured| m.cpu.get("kueue").copied().unwrap_or(0.0);
        let check_cpu = |m: &Measured| m.cpu.get("check").copied().unwrap_or(0.0);
        // Figures of each pair's run of ours alone, their spread over the pairs below.
        ratios
            .entry("our CPU per Workload, ms")
            .or_default()
            .push(per_thousand(ours, check_cpu(ours)));
        ratios
            .entry("our requests per Workload, watches and lists left out")
            .or_default()
            .push(per_workload_caused(ours, "check"));
        ratios
            .entry("entry → our Ready p50, s")
            .or_default()
            .push(p50(ours, ENTRY_TO_READY));
        if let Some(peak) = ours.peak_rss_kib {
            ratios
                .entry("our peak RSS, MiB")
                .or_default()
                .push(peak as f64 / 1024.0);
        }
        if let Some((_, ready)) = ours.startup {
            ratios
                .entry("our RSS when ready, MiB")
                .or_default()
                .push(ready as f64 / 1024.0);
        }
        let mut ratio = |name: &'static str, a: f64, b: f64| {
            let r = a / b.max(f64::EPSILON);
            ratios.entry(name).or_default().push(r);
            format!("{r:.2} ({a:.2} s / {b:.2} s)")
        };
        if let Some(kueue) = run(Controller::Kueue) {
            let ready = ratio(
                "reserved → Ready p99, ours / built-in",
                p99(ours, &STAGES[0]),
                p99(kueue, &STAGES[0]),
            );
            let ready_p50 = ratio(
                "reserved → Ready p50, ours / built-in",
                p50(ours, &STAGES[0]),
                p50(kueue, &STAGES[0]),
            );
            let admitted = ratio(
                "created → admitted p99, ours / built-in",
                p99(ours, &STAGES[1]),
                p99(kueue, &STAGES[1]),
            );
            let admitted_p50 = ratio(
                "created → admitted p50, ours / built-in",
                p50(ours, &STAGES[1]),
                p50(kueue, &STAGES[1]),
            );
            let builtin_check = per_workload(kueue, "kueue") - per_workload(ours, "kueue");
            let _ = writeln!(
                out,
                "\n{set_name}, pair {pair}: reserved → Ready p99, ours / built-in = \
                 {ready}, p50 {ready_p50}; created → admitted p99 {admitted}, p50 {admitted_p50}. \
                 The check's API \
                 requests per Workload: ours {:.2}, built-in {builtin_check:.2}; its CPU seconds \
                 per 1,000 Workloads: ours {:.1}, built-in {:.1} (the built-in's: what Kueue \
                 used in its run beyond what it used in ours). All actors' requests per \
                 Workload: ours {:.2}, built-in {:.2}.",
                per_workload(ours, "check"),
                per_thousand(ours, check_cpu(ours)),
                per_thousand(kueue, kueue_cpu(kueue) - kueue_cpu(ours)),
                ["check", "kueue", "simulator"]
                    .iter()
                    .map(|a| per_workload(ours, a))
                    .sum::<f64>(),
                ["kueue", "simulator"]
                    .iter()
                    .map(|a| per_workload(kueue, a))
                    .sum::<f64>(),
            );
        }
        if let Some(floor) = run(Controller::Floor) {
            let ready = ratio(
                "reserved → Ready p99, ours / floor",
                p99(ours, &STAGES[0]),
                p99(floor, &STAGES[0]),
            );
            let _ = writeln!(
                out,
                "\n{set_name}, pair {pair}: reserved → Ready p99, ours / floor = \
                 {ready}."
            );
        }
        if let Some(none) = run(Controller::None) {
            let machine = |m: &Measured| m.machine.busy_seconds;
            let extra = |m: &Measured| 1000.0 * (machine(m) - machine(none)) / f64::from(workloads);
            let builtin = run(Controller::Kueue).map_or("no built-in run".to_string(), |k| {
                format!("built-in {:.1} s", extra(k))
            });
            let _ = writeln!(
                out,
                "\n{set_name}, pair {pair}: whole-machine CPU per 1,000 Workloads \
                 beyond the no-check run's: ours {:.1} s, {builtin}.",
                extra(ours)
            );
            if let Some(kueue) = run(Controller::Kueue) {
                let _ = ratio(
                    "whole-machine CPU beyond no check, ours / built-in",
                    extra(ours),
                    extra(kueue),
                );
                // What a check that only answers costs: the bound under any check's own work.
                if let Some(floor) = run(Controller::Floor) {
                    let _ = ratio(
                        "whole-machine CPU beyond no check, floor / built-in",
                        extra(floor),
                        extra(kueue),
                    );
                }
            }
        }
    }
    for (name, values) in ratios {
        if let Some(spread) = bench::pairs::Spread::of(&values) {
            let _ = writeln!(out, "\n{set_name}: {name}: {spread}.");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_come_only_from_a_described_clean_tree() {
        assert!(from_a_clean_tree("a1b2c3d"));
        assert!(!from_a_clean_tree("a1b2c3d-dirty"));
        // Not a git checkout: nobody could check the figures out.
        assert!(!from_a_clean_tree(""));
    }

    #[test]
    fn only_the_runs_namespaces_wait_to_be_gone() {
        assert!(is_run_namespace("e2e-cmp-ours-1000x1-a1b2c"));
        assert!(is_run_namespace("e2e-cmp-leftover-a1b2c"));
        assert!(!is_run_namespace("e2e-cmp-idle-a1b2c"));
        assert!(!is_run_namespace("e2e-cmp-churn-a1b2c"));
        assert!(!is_run_namespace("e2e-provisioning-a1b2c"));
    }
}

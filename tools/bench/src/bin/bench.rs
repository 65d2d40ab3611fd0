//! `bench`: how long an SDK check takes to answer, and how many Workloads it answers per second,
//! against the local control plane (etcd, kube-apiserver, Kueue), beside a raw baseline.
//!
//! Two passes on the same number of Workloads, each in a fresh namespace. The **raw baseline**:
//! a bare client, built as the SDK builds its client from the same flags (so with the same rate
//! limit), watches the Workloads and server-side-applies `Ready` to each one's entry as soon as
//! Kueue reserves quota, as many at once as `--concurrency` says; nothing else. The **SDK
//! pass**: the `always-ready` binary (the smallest check built on the SDK, answering `Ready` at
//! once) as a real process with the flags given after `--`. Each Workload is watched through
//! Kueue's stages: quota reserved, the check's `Ready` written, admitted. The ratio of the two
//! throughputs is what the SDK runtime costs over the least any controller must do. It fails
//! (exit 1) unless every Workload is admitted with exactly one `Ready` written by the SDK for
//! it. See docs/benchmark.md.

use std::process::{Command, ExitCode};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use bench::{Creating, Mark, Process, RunQueue, Seen, Stage, lock, quantile};
use clap::Parser;
use e2e::TestEnv;
use futures::StreamExt;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kueue_admission_sdk::Options;
use kueue_admission_sdk::api::{
    AdmissionCheck, CheckState, ClusterQueue, Workload, workload_condition as cond,
};
use serde_json::json;
use tokio::time::Instant;

#[derive(Debug, Parser)]
#[command(
    about = "Measures an SDK check's answer latency and throughput against the local control plane"
)]
struct Cli {
    /// Workloads to create.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=20_000))]
    workloads: u32,
    /// Workloads created at once by the benchmark.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=256))]
    create_concurrency: u16,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout_seconds: u64,
    /// Leave what the run created in place (by default it is deleted after a successful run).
    #[arg(long)]
    keep: bool,
    /// Flags for the always-ready binary, e.g. `-- --concurrency 16 --kube-api-qps 50`.
    #[arg(last = true)]
    check_args: Vec<String>,
}

/// The stages each pass reports, as the benchmark's watch saw them.
const STAGES: [Stage; 4] = [
    Stage::new(
        "created → quota reserved (Kueue)",
        Mark::Created,
        Mark::Reserved,
    ),
    Stage::new(
        "quota reserved → Ready written (the check)",
        Mark::Reserved,
        Mark::Ready,
    ),
    Stage::new(
        "Ready written → admitted (Kueue)",
        Mark::Ready,
        Mark::Admitted,
    ),
    Stage::new("created → admitted", Mark::Created, Mark::Admitted),
];

#[tokio::main]
async fn main() -> ExitCode {
    bench::exit_code("bench", run(&Cli::parse()).await)
}

async fn run(cli: &Cli) -> Result<()> {
    let raw = raw_pass(cli).await?;
    let (sdk, metrics, check) = sdk_pass(cli).await?;
    let n = sdk.marks.len();
    let settings = if cli.check_args.is_empty() {
        "defaults".to_string()
    } else {
        cli.check_args.join(" ")
    };
    println!("{n} Workloads; always-ready and the raw baseline with {settings}");
    for pass in [&raw, &sdk] {
        pass.print()?;
    }
    let ratio = sdk.throughput() / raw.throughput().max(f64::EPSILON);
    println!();
    println!(
        "the SDK check's throughput is {:.0} % of the raw baseline's",
        100.0 * ratio
    );
    let ready = print_runtime(&metrics, &check);
    ensure!(
        ready == n as f64,
        "expected exactly one Ready written per Workload, got {ready}"
    );
    Ok(())
}

/// Prints what the check's runtime reports about itself; returns the `Ready` decisions written.
fn print_runtime(metrics: &str, check: &str) -> f64 {
    let sample = |series: &str| e2e::metric_sample(metrics, series).unwrap_or(0.0);
    let c = format!("check=\"{check}\"");
    let ready = sample(&format!("kueue_ac_decisions_total{{{c},state=\"Ready\"}}"));
    let pending = sample(&format!(
        "kueue_ac_decisions_total{{{c},state=\"Pending\"}}"
    ));
    let conflicts = sample(&format!("kueue_ac_write_conflicts_total{{{c}}}"));
    let reconciles = sample("kueue_ac_reconcile_duration_seconds_count{result=\"ok\"}");
    let reconcile_time = sample("kueue_ac_reconcile_duration_seconds_sum{result=\"ok\"}");
    let errors: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("kueue_ac_reconcile_errors_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    println!(
        "the runtime: {ready} Ready and {pending} Pending written, {conflicts} write conflicts, \
         {errors} errors; {reconciles} reconciles, {:.1} ms each on average",
        1000.0 * reconcile_time / reconciles.max(1.0)
    );
    ready
}

/// What one pass saw.
struct Pass {
    what: &'static str,
    marks: Vec<bench::Marks>,
    created_in: Duration,
    /// From the first create to the last admission.
    total: Duration,
}

impl Pass {
    fn throughput(&self) -> f64 {
        self.marks.len() as f64 / self.total.as_secs_f64().max(f64::EPSILON)
    }

    fn print(&self) -> Result<()> {
        let n = self.marks.len();
        println!();
        println!("{}:", self.what);
        println!();
        println!("| stage (as the benchmark's watch saw it) | p50 | p95 | max |");
        println!("|---|---|---|---|");
        for stage in STAGES {
            let took = stage.durations(&self.marks);
            ensure!(
                took.len() == n,
                "{}: seen for {} of {n} Workloads",
                stage.label,
                took.len()
            );
            println!(
                "| {} | {} | {} | {} |",
                stage.label,
                ms(quantile(&took, 0.5)),
                ms(quantile(&took, 0.95)),
                ms(took[n - 1]),
            );
        }
        println!();
        println!(
            "created in {:.1} s; all admitted {:.1} s after the first was created: {:.1} \
             Workloads/s",
            self.created_in.as_secs_f64(),
            self.total.as_secs_f64(),
            self.throughput()
        );
        Ok(())
    }
}

/// The SDK pass: the always-ready binary answers. Returns what it saw, the binary's metrics at
/// the end and the check's name.
async fn sdk_pass(cli: &Cli) -> Result<(Pass, String, String)> {
    let env = TestEnv::new("bench").await?;
    let controller = format!("bench.kueue-admission-checks.dev/{}", env.ns);
    let queue = env.guarded_queue("check", &controller, &quota(cli)).await?;
    let check = queue.check.clone();
    let http = e2e::free_local_address()?;
    let always_ready = bench::sibling(
        "always-ready",
        "cargo build --release -p e2e -p bench --bins (or make bench)",
    )?;
    let mut process = Process::spawn(
        "always-ready",
        Command::new(always_ready)
            .arg("--kubeconfig")
            .arg(e2e::kubeconfig_path())
            .args(["--controller-name", &controller])
            .args(["--metrics-address", &http.to_string()])
            // Metrics and probes plain on one address, read without a token.
            .args([
                "--metrics-secure=false",
                "--health-address",
                &http.to_string(),
            ])
            .args(["--leader-elect", "false"])
            .args(&cli.check_args)
            // Quiet unless the flags say otherwise (a flag wins over the environment).
            .env("KUEUE_AC_LOG_LEVEL", "warn"),
        std::env::temp_dir().join(format!("{}.log", env.ns)),
    )?;
    process.wait_ready(http).await?;
    env.wait_active::<AdmissionCheck>(&check, "True", None)
        .await?;
    let pass = drive(cli, &env, &check, "the SDK (always-ready)").await?;
    let (_, metrics) = e2e::http_get(http, "/metrics").await?;
    drop(process);
    if !cli.keep {
        bench::clean_up(&env, &RunQueue::from(&queue)).await?;
    }
    Ok((pass, metrics, check))
}

/// The raw baseline: a bare client answers, with the SDK's client built from the same flags.
async fn raw_pass(cli: &Cli) -> Result<Pass> {
    use clap::{Args, FromArgMatches};
    let command = Options::augment_args(clap::Command::new("raw")).ignore_errors(true);
    let args = std::iter::once("raw".to_string()).chain(cli.check_args.iter().cloned());
    let mut options = Options::from_arg_matches(&command.try_get_matches_from(args)?)?;
    options.kubeconfig = Some(e2e::kubeconfig_path().to_path_buf());
    let client = options.client().await?;
    let env = TestEnv::new("bench-raw").await?;
    let controller = format!("raw.kueue-admission-checks.dev/{}", env.ns);
    let queue = env.guarded_queue("check", &controller, &quota(cli)).await?;
    env.set_admission_check_active(&queue.check, true).await?;
    env.wait_active::<ClusterQueue>(&queue.cluster_queue, "True", None)
        .await?;
    let answering = tokio::spawn(answer_raw(
        Api::namespaced(client, &env.ns),
        queue.check.clone(),
        usize::from(options.concurrency),
    ));
    let pass = drive(
        cli,
        &env,
        &queue.check,
        "the raw baseline (server-side apply only)",
    )
    .await;
    answering.abort();
    let pass = pass?;
    if !cli.keep {
        bench::clean_up(&env, &RunQueue::from(&queue)).await?;
    }
    Ok(pass)
}

/// Answers `Ready` for every Workload of `api` holding quota with `check` `Pending`: one
/// server-side apply of the entry each, `concurrency` at once, nothing else.
async fn answer_raw(api: Api<Workload>, check: String, concurrency: usize) {
    let answered = Arc::new(Mutex::new(std::collections::HashSet::<String>::new()));
    let events = watcher::watcher(api.clone(), watcher::Config::default())
        .default_backoff()
        .applied_objects();
    let wanted = events.filter_map(|event| {
        let answered = answered.clone();
        let check = check.clone();
        async move {
            let wl = event.ok()?;
            let pending = wl
                .admission_check(&check)
                .is_some_and(|e| e.state == CheckState::Pending);
            let due = pending && wl.condition_is_true(cond::QUOTA_RESERVED);
            (due && lock(&answered).insert(wl.name_any())).then(|| wl.name_any())
        }
    });
    wanted
        .for_each_concurrent(concurrency, |name| {
            let (api, check, answered) = (api.clone(), check.clone(), answered.clone());
            async move {
                let body = json!({
                    "apiVersion": "kueue.x-k8s.io/v1beta2",
                    "kind": "Workload",
                    "status": {"admissionChecks": [{
                        "name": check,
                        "state": "Ready",
                        "message": "raw baseline",
                        "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string(),
                    }]},
                });
                let params = PatchParams::apply("bench-raw").force();
                if api
                    .patch_status(&name, &params, &Patch::Apply(&body))
                    .await
                    .is_err()
                {
                    // Answered again on its next event.
                    lock(&answered).remove(&name);
                }
            }
        })
        .await;
}

/// Room for every Workload (100m each) at once: quota is never what they wait for.
fn quota(cli: &Cli) -> String {
    format!("{}", cli.workloads / 10 + 1)
}

/// Creates the Workloads and waits until every one is admitted, watching their stages.
async fn drive(cli: &Cli, env: &TestEnv, check: &str, what: &'static str) -> Result<Pass> {
    let seen = Seen::default();
    let watch = tokio::spawn(bench::watch_workloads(
        env.workloads(),
        check.to_string(),
        seen.clone(),
    ));
    let started = Instant::now();
    let creating = Creating {
        prefix: "wl",
        count: cli.workloads,
        podsets: 1,
        concurrency: usize::from(cli.create_concurrency),
    };
    bench::create_workloads(env, creating, Some(&seen)).await?;
    let created_in = started.elapsed();
    let timeout = Duration::from_secs(cli.timeout_seconds);
    bench::wait_all_admitted(&seen, cli.workloads, timeout, started, || Ok(()))
        .await
        .context(what)?;
    watch.abort();
    let marks = seen.marks();
    let total = bench::until_last_admitted(&marks, started);
    Ok(Pass {
        what,
        marks,
        created_in,
        total,
    })
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

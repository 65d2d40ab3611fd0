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

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use clap::Parser;
use e2e::{GuardedQueue, TestEnv};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kueue_admission_sdk::Options;
use kueue_admission_sdk::api::{
    AdmissionCheck, CheckState, ClusterQueue, LocalQueue, ResourceFlavor, Workload,
    workload_condition as cond,
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

/// When the benchmark saw each stage of one Workload.
#[derive(Clone, Copy, Debug, Default)]
struct Marks {
    created: Option<Instant>,
    reserved: Option<Instant>,
    ready: Option<Instant>,
    admitted: Option<Instant>,
}

type Seen = Arc<Mutex<BTreeMap<String, Marks>>>;

/// Where one stage of a Workload began and ended.
type Stage = fn(&Marks) -> Option<(Instant, Instant)>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match bench(&cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The always-ready binary, built beside this one.
fn always_ready() -> Result<PathBuf> {
    let path = std::env::current_exe()?.with_file_name("always-ready");
    ensure!(
        path.exists(),
        "{} is not built: cargo build --release -p e2e --bins (or make bench)",
        path.display()
    );
    Ok(path)
}

/// Stops the check process on every way out.
struct CheckProcess(Child);

impl Drop for CheckProcess {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let _ = self.0.wait();
    }
}

async fn bench(cli: &Cli) -> Result<()> {
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

    let sample = |series: &str| e2e::metric_sample(&metrics, series).unwrap_or(0.0);
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
    ensure!(
        ready == n as f64,
        "expected exactly one Ready written per Workload, got {ready}"
    );
    Ok(())
}

/// What one pass saw.
struct Pass {
    what: &'static str,
    marks: Vec<Marks>,
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
        let stages: [(&str, Stage); 4] = [
            ("created → quota reserved (Kueue)", |m| {
                Some((m.created?, m.reserved?))
            }),
            ("quota reserved → Ready written (the check)", |m| {
                Some((m.reserved?, m.ready?))
            }),
            ("Ready written → admitted (Kueue)", |m| {
                Some((m.ready?, m.admitted?))
            }),
            ("created → admitted", |m| Some((m.created?, m.admitted?))),
        ];
        for (what, span) in stages {
            let mut took: Vec<Duration> = self
                .marks
                .iter()
                .filter_map(span)
                .map(|(a, b)| b.saturating_duration_since(a))
                .collect();
            ensure!(
                took.len() == n,
                "{what}: seen for {} of {n} Workloads",
                took.len()
            );
            took.sort();
            println!(
                "| {what} | {} | {} | {} |",
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
    let log = std::env::temp_dir().join(format!("{}.log", env.ns));
    let mut process = CheckProcess(
        Command::new(always_ready()?)
            .arg("--kubeconfig")
            .arg(e2e::kubeconfig_path())
            .args(["--controller-name", &controller])
            .args(["--metrics-address", &http.to_string()])
            .args(["--leader-elect", "false"])
            .args(&cli.check_args)
            // Quiet unless the flags say otherwise (a flag wins over the environment).
            .env("KUEUE_AC_LOG_LEVEL", "warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .context("starting always-ready")?,
    );
    let deadline = Instant::now() + e2e::DEFAULT_TIMEOUT;
    while e2e::http_get(http, "/readyz")
        .await
        .map_or(true, |(code, _)| code != 200)
    {
        if let Some(status) = process.0.try_wait()? {
            bail!("always-ready exited ({status}); its log: {}", log.display());
        }
        ensure!(
            Instant::now() < deadline,
            "always-ready never became ready; its log: {}",
            log.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    env.wait_check_active(&check, "True", None).await?;
    let pass = drive(cli, &env, &check, "the SDK (always-ready)").await?;
    let (_, metrics) = e2e::http_get(http, "/metrics").await?;
    drop(process);
    if !cli.keep {
        clean_up(&env, &queue).await?;
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
    env.wait_cluster_queue_active(&queue.cluster_queue, "True", None)
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
        clean_up(&env, &queue).await?;
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
    let n = cli.workloads as usize;
    let seen: Seen = Arc::default();
    let watch = tokio::spawn(watch_stages(
        env.workloads(),
        check.to_string(),
        seen.clone(),
    ));
    let started = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let (api, seen, ns) = (env.workloads(), seen.clone(), env.ns.clone());
            async move {
                let name = format!("wl-{i:05}");
                let before = Instant::now();
                api.create(&PostParams::default(), &workload(&ns, &name)?)
                    .await
                    .with_context(|| format!("creating {name}"))?;
                lock(&seen).entry(name).or_default().created = Some(before);
                anyhow::Ok(())
            }
        })
        .buffer_unordered(usize::from(cli.create_concurrency))
        .try_collect::<()>()
        .await?;
    let created_in = started.elapsed();
    let deadline = Instant::now() + Duration::from_secs(cli.timeout_seconds);
    loop {
        let admitted = lock(&seen)
            .values()
            .filter(|m| m.admitted.is_some())
            .count();
        if admitted == n {
            break;
        }
        if Instant::now() >= deadline {
            bail!(
                "{what}: {admitted} of {n} admitted after {:?}",
                started.elapsed()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    watch.abort();
    let marks: Vec<Marks> = lock(&seen).values().copied().collect();
    let last_admitted = marks.iter().filter_map(|m| m.admitted).max();
    Ok(Pass {
        what,
        marks,
        created_in,
        total: last_admitted.map_or(Duration::ZERO, |t| t - started),
    })
}

/// Deletes what the run created, so that the next run starts on the same cluster state (Kueue
/// removes its finalizers; with no namespace controller here, the namespace itself stays).
async fn clean_up(env: &TestEnv, queue: &GuardedQueue) -> Result<()> {
    let dp = DeleteParams::background();
    env.workloads()
        .delete_collection(&dp, &ListParams::default())
        .await
        .context("deleting the Workloads")?;
    Api::<LocalQueue>::namespaced(env.client.clone(), &env.ns)
        .delete("lq", &dp)
        .await?;
    Api::<ClusterQueue>::all(env.client.clone())
        .delete(&queue.cluster_queue, &dp)
        .await?;
    Api::<AdmissionCheck>::all(env.client.clone())
        .delete(&queue.check, &dp)
        .await?;
    Api::<ResourceFlavor>::all(env.client.clone())
        .delete(&queue.flavor, &dp)
        .await?;
    Api::<Namespace>::all(env.client.clone())
        .delete(&env.ns, &dp)
        .await?;
    Ok(())
}

/// Records when each Workload first reached each stage.
async fn watch_stages(api: Api<Workload>, check: String, seen: Seen) {
    let events = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .applied_objects();
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        // The watcher retries by itself (with backoff); a re-list may make a stage look later.
        let Ok(wl) = event else { continue };
        let now = Instant::now();
        let mut seen = lock(&seen);
        let m = seen.entry(wl.name_any()).or_default();
        let is_true = |c: &str| wl.condition(c).is_some_and(|c| c.status == "True");
        if m.reserved.is_none() && is_true(cond::QUOTA_RESERVED) {
            m.reserved = Some(now);
        }
        if m.ready.is_none()
            && wl
                .admission_check(&check)
                .is_some_and(|e| e.state == CheckState::Ready)
        {
            m.ready = Some(now);
        }
        if m.admitted.is_none() && is_true(cond::ADMITTED) {
            m.admitted = Some(now);
        }
    }
}

fn workload(namespace: &str, name: &str) -> Result<Workload> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "queueName": "lq",
            "podSets": [{
                "name": "main",
                "count": 1,
                "template": {"spec": {
                    "restartPolicy": "Never",
                    "containers": [{
                        "name": "main",
                        "image": "registry.invalid/no-pod-runs-here:1",
                        "resources": {"requests": {"cpu": "100m"}},
                    }],
                }},
            }],
        },
    }))?)
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

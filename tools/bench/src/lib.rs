//! What the two benchmarks share (`bench` and `bench-compare`, docs/benchmark.md): the
//! processes they start beside themselves, the Workloads they create, the watch that marks
//! when each Workload reached each stage, the wait for every admission, the quantiles they
//! report and the clean-up after a run.

pub mod limiter;
pub mod machine;
pub mod pairs;
pub mod plot;
pub mod storage;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, PodTemplate};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kueue_admission_sdk::api::{
    AdmissionCheck, CheckState, ClusterQueue, LocalQueue, ProvisioningRequest,
    ProvisioningRequestConfig, ResourceFlavor, Workload, workload_condition as cond,
};
use serde_json::json;
use tokio::time::Instant;

use e2e::{GuardedQueue, TestEnv};

/// The exit code of a benchmark binary, its error (if any) on stderr.
pub fn exit_code(program: &str, outcome: Result<()>) -> ExitCode {
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{program} failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// A binary built beside the running one; `how_to_build` goes into the error when it is not.
pub fn sibling(name: &str, how_to_build: &str) -> Result<PathBuf> {
    let path = std::env::current_exe()?.with_file_name(name);
    ensure!(
        path.exists(),
        "{} is not built: {how_to_build}",
        path.display()
    );
    Ok(path)
}

/// A process a benchmark started, its stderr in a log file, stopped (SIGTERM) on every way out.
#[derive(Debug)]
pub struct Process {
    child: Child,
    name: &'static str,
    log: PathBuf,
}

impl Process {
    /// Starts `command` with its stdout discarded and its stderr written to `log`.
    pub fn spawn(name: &'static str, command: &mut Command, log: PathBuf) -> Result<Self> {
        let child = command
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        Ok(Self { child, name, log })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Where its stderr goes.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Fails if the process has exited.
    pub fn alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "{} exited ({status}); its log: {}",
                self.name,
                self.log.display()
            );
        }
        Ok(())
    }

    /// Waits until its `/readyz` at `http` answers 200 (its caches listed), failing if it
    /// exits first or takes longer than [`e2e::DEFAULT_TIMEOUT`].
    pub async fn wait_ready(&mut self, http: std::net::SocketAddr) -> Result<()> {
        let deadline = Instant::now() + e2e::DEFAULT_TIMEOUT;
        while e2e::http_get(http, "/readyz")
            .await
            .map_or(true, |(code, _)| code != 200)
        {
            self.alive()?;
            ensure!(
                Instant::now() < deadline,
                "{} never became ready; its log: {}",
                self.name,
                self.log.display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

/// A stage boundary in a Workload's life, as the benchmark's watches see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    /// The benchmark sent its create.
    Created,
    /// Kueue reserved quota.
    Reserved,
    /// Quota reserved and the check's entry in `status.admissionChecks`: the check can act.
    /// Kueue's scheduler reserves quota and its Workload reconciler adds the entries, each on its
    /// own, so under load the entry can come well after the reservation.
    Askable,
    /// Its ProvisioningRequest appeared.
    Request,
    /// Its ProvisioningRequest turned Provisioned.
    Provisioned,
    /// The check under test wrote `Ready`.
    Ready,
    /// Kueue admitted it.
    Admitted,
}

const MARKS: usize = Mark::Admitted as usize + 1;

/// When the benchmark first saw each [`Mark`] of one Workload, and how often it was admitted.
#[derive(Clone, Copy, Debug, Default)]
pub struct Marks {
    at: [Option<Instant>; MARKS],
    /// Times Admitted turned true.
    pub admissions: u32,
    was_admitted: bool,
}

impl Marks {
    pub fn at(&self, mark: Mark) -> Option<Instant> {
        self.at[mark as usize]
    }

    /// Records `mark` at `now` unless it was seen before.
    pub fn first(&mut self, mark: Mark, now: Instant) {
        self.at[mark as usize].get_or_insert(now);
    }
}

/// A span of a Workload's life between two marks, named for the report.
#[derive(Clone, Copy, Debug)]
pub struct Stage {
    pub label: &'static str,
    pub from: Mark,
    pub to: Mark,
}

impl Stage {
    pub const fn new(label: &'static str, from: Mark, to: Mark) -> Self {
        Self { label, from, to }
    }

    /// Its sorted durations over the Workloads that went through it.
    pub fn durations(&self, marks: &[Marks]) -> Vec<Duration> {
        let mut took: Vec<Duration> = marks
            .iter()
            .filter_map(|m| Some(m.at(self.to)?.saturating_duration_since(m.at(self.from)?)))
            .collect();
        took.sort();
        took
    }
}

/// When `mark` came first and last over a run's Workloads, after the run's first create: how
/// spread out, e.g., Kueue's reservations were, which bounds how soon a check can answer the
/// last of them. `None` when no Workload was created or reached `mark`.
pub fn window(marks: &[Marks], mark: Mark) -> Option<(Duration, Duration)> {
    let start = marks.iter().filter_map(|m| m.at(Mark::Created)).min()?;
    let seen = marks.iter().filter_map(|m| m.at(mark));
    let (first, last) = seen.fold(None, |span: Option<(Instant, Instant)>, at| match span {
        None => Some((at, at)),
        Some((first, last)) => Some((first.min(at), last.max(at))),
    })?;
    Some((
        first.saturating_duration_since(start),
        last.saturating_duration_since(start),
    ))
}

/// The `q` quantile of sorted durations (zero for none).
pub fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// The marks of every Workload of a run by name, shared by its watches and its create loop.
#[derive(Clone, Debug, Default)]
pub struct Seen(Arc<Mutex<BTreeMap<String, Marks>>>);

impl Seen {
    /// The marks of `workload`, to update.
    pub fn of(&self, workload: String, update: impl FnOnce(&mut Marks)) {
        update(lock(&self.0).entry(workload).or_default());
    }

    /// How many have been admitted.
    pub fn admitted(&self) -> usize {
        lock(&self.0)
            .values()
            .filter(|m| m.at(Mark::Admitted).is_some())
            .count()
    }

    /// Every Workload's marks, by name.
    pub fn marks(&self) -> Vec<Marks> {
        lock(&self.0).values().copied().collect()
    }
}

pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Calls `seen` with every object the watch of `api` sees created or changed, and when.
pub async fn watch<K>(api: Api<K>, seen: impl FnMut(K, Instant))
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    watch_noting(api, &WatchTrouble::default(), seen).await;
}

/// What went wrong with a benchmark's own watches: a watch error or a re-list may make a stage
/// look later than it was, so a run reports them.
#[derive(Clone, Debug, Default)]
pub struct WatchTrouble {
    errors: Arc<std::sync::atomic::AtomicUsize>,
    lists: Arc<std::sync::atomic::AtomicUsize>,
    watches: Arc<std::sync::atomic::AtomicUsize>,
}

impl WatchTrouble {
    /// `(errors, re-lists)`: the watches' errors, and their lists beyond each one's first.
    pub fn counts(&self) -> (usize, usize) {
        use std::sync::atomic::Ordering::Relaxed;
        let (lists, watches) = (self.lists.load(Relaxed), self.watches.load(Relaxed));
        (self.errors.load(Relaxed), lists.saturating_sub(watches))
    }
}

/// [`watch`], counting its errors and lists into `trouble`.
pub async fn watch_noting<K>(api: Api<K>, trouble: &WatchTrouble, mut seen: impl FnMut(K, Instant))
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    use std::sync::atomic::Ordering::Relaxed;
    trouble.watches.fetch_add(1, Relaxed);
    let events = watcher::watcher(api, watcher::Config::default()).default_backoff();
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        // The watcher retries by itself (with backoff); a re-list may make a stage look later.
        match event {
            Ok(watcher::Event::Init) => {
                trouble.lists.fetch_add(1, Relaxed);
            }
            Ok(watcher::Event::InitApply(object) | watcher::Event::Apply(object)) => {
                seen(object, Instant::now());
            }
            Ok(watcher::Event::InitDone | watcher::Event::Delete(_)) => {}
            Err(_) => {
                trouble.errors.fetch_add(1, Relaxed);
            }
        }
    }
}

/// Records when each Workload of `api` first reached quota reservation, quota with an entry of
/// `check`, `Ready` of `check` and admission, and counts its admissions.
pub async fn watch_workloads(api: Api<Workload>, check: String, seen: Seen) {
    watch_workloads_noting(api, check, seen, &WatchTrouble::default()).await;
}

/// [`watch_workloads`], counting its errors and lists into `trouble`.
pub async fn watch_workloads_noting(
    api: Api<Workload>,
    check: String,
    seen: Seen,
    trouble: &WatchTrouble,
) {
    watch_noting(api, trouble, |wl: Workload, now| {
        let ready = wl
            .admission_check(&check)
            .is_some_and(|e| e.state == CheckState::Ready);
        let admitted = wl.condition_is_true(cond::ADMITTED);
        let reserved = wl.condition_is_true(cond::QUOTA_RESERVED);
        let entry = wl.admission_check(&check).is_some();
        seen.of(wl.name_any(), |m| {
            if reserved {
                m.first(Mark::Reserved, now);
            }
            if reserved && entry {
                m.first(Mark::Askable, now);
            }
            if ready {
                m.first(Mark::Ready, now);
            }
            if admitted && !m.was_admitted {
                m.admissions += 1;
                m.first(Mark::Admitted, now);
            }
            m.was_admitted = admitted;
        });
    })
    .await;
}

/// A Workload in LocalQueue `lq` of `podsets` podsets, one pod of 100m cpu each, that never
/// runs a pod.
pub fn workload(namespace: &str, name: &str, podsets: u32) -> Result<Workload> {
    // Null: no annotations.
    let template = e2e::pod_template(serde_json::Value::Null, "100m");
    let pod_sets: Vec<_> = (0..podsets)
        .map(|i| json!({"name": format!("ps{i}"), "count": 1, "template": template}))
        .collect();
    Ok(serde_json::from_value(json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"queueName": "lq", "podSets": pod_sets},
    }))?)
}

/// How a run creates its Workloads.
#[derive(Clone, Copy, Debug)]
pub struct Creating<'a> {
    /// Names are `<prefix>-00000` ...
    pub prefix: &'a str,
    pub count: u32,
    pub podsets: u32,
    /// Creates in flight at once.
    pub concurrency: usize,
}

/// Creates the Workloads; records when each create was sent in `seen`, if given.
pub async fn create_workloads(
    env: &TestEnv,
    creating: Creating<'_>,
    seen: Option<&Seen>,
) -> Result<()> {
    let Creating {
        prefix,
        count,
        podsets,
        concurrency,
    } = creating;
    futures::stream::iter(0..count)
        .map(|i| create_one(env, prefix, i, podsets, seen))
        .buffer_unordered(concurrency)
        .try_collect::<()>()
        .await
}

/// Creates Workload `<prefix>-<i>` of `podsets` podsets; records when the create was sent in
/// `seen`, if given.
async fn create_one(
    env: &TestEnv,
    prefix: &str,
    i: u32,
    podsets: u32,
    seen: Option<&Seen>,
) -> Result<()> {
    let name = format!("{prefix}-{i:05}");
    let before = Instant::now();
    env.workloads()
        .create(&PostParams::default(), &workload(&env.ns, &name, podsets)?)
        .await
        .with_context(|| format!("creating {name}"))?;
    if let Some(seen) = seen {
        seen.of(name, |m| m.first(Mark::Created, before));
    }
    Ok(())
}

/// Creates Workloads at `per_second` for `seconds` (the `i`-th sent at `i / per_second` s
/// after the start, at most `concurrency` in flight: a slow API server delays later arrivals,
/// it never bunches them); records when each create was sent in `seen`. Returns how many.
pub async fn create_paced(
    env: &TestEnv,
    creating: Creating<'_>,
    per_second: f64,
    seen: &Seen,
) -> Result<u32> {
    let Creating {
        prefix,
        count,
        podsets,
        concurrency,
    } = creating;
    ensure!(
        per_second > 0.0,
        "a pace of {per_second} Workloads a second"
    );
    let period = Duration::from_secs_f64(1.0 / per_second);
    let start = Instant::now();
    futures::stream::iter(0..count)
        .then(|i| async move {
            tokio::time::sleep_until(start + period * i).await;
            i
        })
        .map(|i| create_one(env, prefix, i, podsets, Some(seen)))
        .buffer_unordered(concurrency)
        .try_collect::<()>()
        .await?;
    Ok(count)
}

/// Waits until `count` Workloads are admitted, calling `alive` (which fails when a process
/// the run needs has exited) between looks; gives up `timeout` from now.
pub async fn wait_all_admitted(
    seen: &Seen,
    count: u32,
    timeout: Duration,
    started: Instant,
    mut alive: impl FnMut() -> Result<()>,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let admitted = seen.admitted();
        if admitted == count as usize {
            return Ok(());
        }
        alive()?;
        if Instant::now() >= deadline {
            bail!(
                "{admitted} of {count} admitted after {:?}",
                started.elapsed()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// From `started` to the last admission.
pub fn until_last_admitted(marks: &[Marks], started: Instant) -> Duration {
    let last = marks.iter().filter_map(|m| m.at(Mark::Admitted)).max();
    last.map_or(Duration::ZERO, |t| t - started)
}

/// The cluster-scoped objects a run created for its queue (the LocalQueue is `lq`).
#[derive(Clone, Debug)]
pub struct RunQueue {
    pub flavor: String,
    pub check: String,
    pub cluster_queue: String,
    /// The check's ProvisioningRequestConfig, for a provisioning run.
    pub provisioning_config: Option<String>,
}

impl From<&GuardedQueue> for RunQueue {
    fn from(q: &GuardedQueue) -> Self {
        Self {
            flavor: q.flavor.clone(),
            check: q.check.clone(),
            cluster_queue: q.cluster_queue.clone(),
            provisioning_config: None,
        }
    }
}

/// How long a clean-up waits for the run's objects to be gone.
const CLEAN_UP_TIMEOUT: Duration = Duration::from_secs(600);

/// Deletes what a run created, and waits until its Workloads, requests and templates are gone,
/// so that the next run starts from the same cluster state: Kueue takes its finalizer off each
/// deleted Workload, and that work ran under the next run's measurement (whichever controller
/// ran second paid for the first one's clean-up). A provisioning run's requests and templates
/// are deleted explicitly rather than left to the garbage collector. Returns how long the wait
/// took.
pub async fn clean_up(env: &TestEnv, queue: &RunQueue) -> Result<Duration> {
    let started = Instant::now();
    delete_run_objects(env, queue).await?;
    let one = ListParams::default().limit(1);
    let client = &env.client;
    let left = || async {
        let workloads = env.workloads().list_metadata(&one).await?.items.len();
        let requests = match queue.provisioning_config {
            Some(_) => (Api::<ProvisioningRequest>::namespaced(client.clone(), &env.ns))
                .list_metadata(&one)
                .await?
                .items
                .len(),
            None => 0,
        };
        let templates = (Api::<PodTemplate>::namespaced(client.clone(), &env.ns))
            .list_metadata(&one)
            .await?
            .items
            .len();
        anyhow::Ok(workloads + requests + templates)
    };
    while left().await? > 0 {
        ensure!(
            started.elapsed() < CLEAN_UP_TIMEOUT,
            "the Workloads, requests or templates of namespace {} were not gone within {:?}",
            env.ns,
            CLEAN_UP_TIMEOUT
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(started.elapsed())
}

async fn delete_run_objects(env: &TestEnv, queue: &RunQueue) -> Result<()> {
    let client = &env.client;
    delete_in_pages(&env.workloads())
        .await
        .context("deleting the Workloads")?;
    if queue.provisioning_config.is_some() {
        delete_in_pages(&Api::<ProvisioningRequest>::namespaced(
            client.clone(),
            &env.ns,
        ))
        .await
        .context("deleting the ProvisioningRequests")?;
        delete_in_pages(&Api::<PodTemplate>::namespaced(client.clone(), &env.ns))
            .await
            .context("deleting the PodTemplates")?;
    }
    delete(Api::<LocalQueue>::namespaced(client.clone(), &env.ns), "lq").await?;
    delete(
        Api::<ClusterQueue>::all(client.clone()),
        &queue.cluster_queue,
    )
    .await?;
    // A run without a check (bench-compare's reference) has none to delete.
    if !queue.check.is_empty() {
        delete(Api::<AdmissionCheck>::all(client.clone()), &queue.check).await?;
    }
    if let Some(config) = &queue.provisioning_config {
        delete(
            Api::<ProvisioningRequestConfig>::all(client.clone()),
            config,
        )
        .await?;
    }
    delete(Api::<ResourceFlavor>::all(client.clone()), &queue.flavor).await?;
    delete(Api::<Namespace>::all(client.clone()), &env.ns).await
}

/// Deletes one object in the background.
async fn delete<K>(api: Api<K>, name: &str) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.delete(name, &DeleteParams::background()).await?;
    Ok(())
}

/// Names listed a page at a time by [`delete_in_pages`].
const DELETE_PAGE: u32 = 500;
/// Deletes sent at once by [`delete_in_pages`].
const DELETE_CONCURRENCY: usize = 32;
/// Tries of one delete (or one page's list) before [`delete_in_pages`] gives up.
const DELETE_TRIES: u32 = 5;

/// Deletes every object `api` lists, in the background, and returns how many it deleted. One
/// collection delete of thousands of objects outlasts the API server's 60 s request timeout
/// (the connection closes before an answer), so the names are listed a page at a time and
/// deleted one by one, 32 at once; a delete or a list that fails for a reason that may pass (a
/// timeout, a closed connection, 429, 5xx) is tried again, up to 5 times with a growing wait;
/// an object already gone counts as deleted.
/// Objects with finalizers stay until their owners remove them: waiting for that is the
/// caller's.
pub async fn delete_in_pages<K>(api: &Api<K>) -> Result<usize>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut page = ListParams::default().limit(DELETE_PAGE);
    let mut deleted = 0;
    loop {
        let list = retried("listing what to delete", || api.list_metadata(&page)).await?;
        let names: Vec<String> = list.items.iter().map(ResourceExt::name_any).collect();
        deleted += names.len();
        let background = DeleteParams::background();
        let background = &background;
        futures::stream::iter(names)
            .map(|name| async move {
                let what = format!("deleting {name}");
                match retried(&what, || api.delete(&name, background)).await {
                    Err(e) if is_not_found(&e) => Ok(()),
                    other => other.map(|_| ()),
                }
            })
            .buffer_unordered(DELETE_CONCURRENCY)
            .try_collect::<()>()
            .await?;
        match list.metadata.continue_ {
            Some(token) if !token.is_empty() => page = page.continue_token(&token),
            _ => return Ok(deleted),
        }
    }
}

/// Whether `e` is the API server's 404.
fn is_not_found(e: &anyhow::Error) -> bool {
    matches!(e.downcast_ref::<kube::Error>(), Some(kube::Error::Api(s)) if s.code == 404)
}

/// Whether a failed request may succeed if sent again: no answer (a timeout, a closed
/// connection), or the API server's 429 or 5xx.
fn may_pass(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code == 429 || s.code >= 500,
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

/// `call`'s answer, tried up to [`DELETE_TRIES`] times while its failure [`may_pass`] (1 s, 2 s,
/// 4 s... between tries).
async fn retried<T, F, Fut>(what: &str, mut call: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = kube::Result<T>>,
{
    let (mut wait, mut tries) = (Duration::from_secs(1), 1);
    loop {
        match call().await {
            Ok(answer) => return Ok(answer),
            Err(e) if tries < DELETE_TRIES && may_pass(&e) => {
                eprintln!("{what}: {e}; trying again in {wait:?}");
                tokio::time::sleep(wait).await;
                (wait, tries) = (wait * 2, tries + 1);
            }
            Err(e) => return Err(anyhow::Error::new(e).context(what.to_string())),
        }
    }
}

//! Harness for end-to-end tests against a real etcd, kube-apiserver and Kueue controller manager.
//!
//! The first test that needs the cluster starts the local control plane
//! (`tests/control-plane/control-plane.sh start`, a no-op when it already runs); every test of
//! the run then shares it. It is a real cluster short of kubelets and a cloud: the Job
//! controller makes a Job's pods, kube-scheduler binds them, kwok runs them on fake nodes (one
//! standing node, more from the autoscaler simulator) and the garbage collector removes what
//! owners left behind. Each test gets its own namespace ([`TestEnv::new`]) and prefixes its
//! cluster-scoped objects with that namespace, and leaves them: a fresh control plane starts
//! on empty data, so nothing is cleaned up, and nothing needs to be.
//!
//! Set `E2E_KUBECONFIG` to run against a control plane managed elsewhere. If the control plane
//! cannot start, the tests fail with its reason: they never skip.

pub mod capacity;
pub mod chart;
pub mod entry_hold;
pub mod karpenter;
pub mod probe;
pub mod provisioning;
pub mod running;
pub mod scripted;

pub use running::Running;

use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Config, Resource, ResourceExt};
use kueue_admission_sdk::api::{
    AdmissionCheck, AdmissionCheckSpec, AdmissionCheckState, AdmissionCheckStrategyRule,
    AdmissionChecksStrategy, CheckState, ClusterQueue, ClusterQueueSpec, FlavorQuotas, LocalQueue,
    LocalQueueSpec, ResourceFlavor, ResourceFlavorSpec, ResourceGroup, ResourceQuota, Workload,
    workload_condition,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

/// How long a test waits for Kueue to react before it fails. Kueue reacts in well under a
/// second on an idle control plane; the margin absorbs a loaded 2-core CI machine.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// How much later than its configured time a timer-driven thing (a timeout, the end of a retry
/// delay, an eviction at `requeueAt`) may happen on a loaded machine before a test calls it
/// wrong. Never earlier is the property; "at most a second late" is not one a 2-core machine
/// running the suite in parallel can keep.
pub const LATE_SLACK: Duration = Duration::from_secs(20);

/// Field manager (prefix) the tests use when they play an admission check controller.
pub const TEST_FIELD_MANAGER: &str = "e2e-test-check-controller";

/// The admin kubeconfig of the shared control plane (started if needed), for processes the
/// tests spawn.
pub fn kubeconfig_path() -> &'static Path {
    control_plane_kubeconfig()
}

/// The API server's audit log (requests of ServiceAccounts, see control-plane.sh): beside the
/// admin kubeconfig in the control plane's run directory, or `E2E_AUDIT_LOG` for a cluster
/// managed elsewhere. An error, never an empty answer, when there is none: a proof that reads
/// it must not pass for want of it.
pub fn audit_log_path() -> Result<PathBuf> {
    let path = match std::env::var_os("E2E_AUDIT_LOG") {
        Some(p) => PathBuf::from(p),
        None => kubeconfig_path()
            .parent()
            .context("the kubeconfig has no directory")?
            .join("logs/audit.log"),
    };
    anyhow::ensure!(
        path.is_file(),
        "no API server audit log at {} (control-plane.sh start writes it; for another cluster \
         set E2E_AUDIT_LOG to a JSON audit log of ServiceAccount requests)",
        path.display()
    );
    Ok(path)
}

/// Every version of every Workload of a namespace, in order (see [`TestEnv::record_workloads`]).
pub struct WorkloadRecorder {
    events: futures::stream::BoxStream<
        'static,
        std::result::Result<kube::runtime::watcher::Event<Workload>, kube::runtime::watcher::Error>,
    >,
}

impl std::fmt::Debug for WorkloadRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WorkloadRecorder")
    }
}

impl WorkloadRecorder {
    /// The versions of Workload `name` seen from where the recorder is up to until one
    /// satisfies `until` (included); other Workloads' versions are passed over.
    pub async fn until(
        &mut self,
        name: &str,
        what: &str,
        until: impl Fn(&Workload) -> bool,
    ) -> Result<Vec<Workload>> {
        self.collect(name, what, |wl, deleted| !deleted && until(wl))
            .await
    }

    /// The versions of Workload `name` seen from where the recorder is up to until its
    /// deletion (the last one: the object as deleted).
    pub async fn until_deleted(&mut self, name: &str) -> Result<Vec<Workload>> {
        self.collect(name, "deleted", |_, deleted| deleted).await
    }

    /// Versions of `name` (a deletion with `true`) until `stop` says so.
    async fn collect(
        &mut self,
        name: &str,
        what: &str,
        stop: impl Fn(&Workload, bool) -> bool,
    ) -> Result<Vec<Workload>> {
        use futures::StreamExt;
        use kube::runtime::watcher::Event;
        let deadline = tokio::time::Instant::now() + DEFAULT_TIMEOUT + LATE_SLACK;
        let mut versions: Vec<Workload> = Vec::new();
        loop {
            let event = match tokio::time::timeout_at(deadline, self.events.next()).await {
                Err(_) => bail!(
                    "timed out waiting for Workload {name}: {what}; {} versions seen, the last:\n{}",
                    versions.len(),
                    versions.last().map(dump).unwrap_or_default()
                ),
                Ok(None) => bail!("the Workload recorder's watch ended"),
                Ok(Some(e)) => e.context("the Workload recorder's watch")?,
            };
            let (wl, deleted) = match event {
                Event::Apply(wl) | Event::InitApply(wl) => (wl, false),
                Event::Delete(wl) => (wl, true),
                _ => continue,
            };
            if wl.name_any() == name {
                let done = stop(&wl, deleted);
                versions.push(wl);
                if done {
                    return Ok(versions);
                }
            }
        }
    }
}

/// A request of a ServiceAccount, as the API server's audit log recorded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Audited {
    /// The request verb (`get`, `list`, `watch`, `create`, `patch`, `delete`, ...).
    pub verb: String,
    /// API group (`""` for the core group).
    pub group: String,
    /// Resource, with `/subresource` if any.
    pub resource: String,
    /// The object's namespace, if namespaced.
    pub namespace: Option<String>,
    /// The response code.
    pub code: u16,
    /// From the API server's receipt of the request to its response (its audit stages'
    /// timestamps): the server's time, without the client's or the network's.
    pub server_time: Option<std::time::Duration>,
    /// When the API server received it (`requestReceivedTimestamp`).
    pub received: Option<k8s_openapi::jiff::Timestamp>,
}

/// A request the API server refused with 403.
pub type Forbidden = Audited;

/// An API group as people name it: `core` for the empty group.
pub fn group_name(group: &str) -> &str {
    if group.is_empty() { "core" } else { group }
}

impl std::fmt::Display for Audited {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let group = group_name(&self.group);
        write!(f, "{} {} ({group})", self.verb, self.resource)?;
        if let Some(ns) = &self.namespace {
            write!(f, " in {ns}")?;
        }
        if self.code >= 400 {
            write!(f, ": {}", self.code)?;
        }
        Ok(())
    }
}

/// Every request of `user` (`system:serviceaccount:<ns>:<name>`) the API server answered,
/// from its audit log.
pub fn audited_requests(user: &str) -> Result<Vec<Audited>> {
    let path = audit_log_path()?;
    // The rotated files too: a long suite may rotate the log under a test.
    let mut text = String::new();
    for file in rotated_audit_logs(&path)?
        .iter()
        .chain(std::iter::once(&path))
    {
        text.push_str(
            &std::fs::read_to_string(file)
                .with_context(|| format!("reading the audit log {}", file.display()))?,
        );
        text.push('\n');
    }
    Ok(text
        .lines()
        // A cheap filter first: the log holds every audited request of the suite.
        .filter(|line| line.contains(user))
        .filter_map(parse_audit_line)
        .filter(|(by, _, _)| by == user)
        .map(|(_, _, audited)| audited)
        .collect())
}

/// A place in the audit log, which survives its rotation: see [`audit_log_mark`].
#[derive(Clone, Debug)]
pub struct AuditMark {
    /// The current file's length when marked.
    offset: u64,
    /// The rotated files that existed when marked.
    rotated: std::collections::BTreeSet<PathBuf>,
}

/// The rotated files of the audit log (`audit-<time>.log` beside it), oldest first.
fn rotated_audit_logs(current: &Path) -> Result<Vec<PathBuf>> {
    let dir = current.parent().context("the audit log has no directory")?;
    let stem = current
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("audit");
    let mut rotated: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{stem}-")) && n.ends_with(".log"))
        })
        .collect();
    // The names carry the rotation time: in name order is in time order.
    rotated.sort();
    Ok(rotated)
}

/// The audit log's end now: where [`audited_since`] starts reading later.
pub fn audit_log_mark() -> Result<AuditMark> {
    let path = audit_log_path()?;
    let offset = std::fs::metadata(&path)
        .with_context(|| format!("reading the audit log {}", path.display()))?
        .len();
    let rotated = rotated_audit_logs(&path)?.into_iter().collect();
    Ok(AuditMark { offset, rotated })
}

/// Every request answered since `mark`, once each (a watch is logged when it starts and when it
/// ends), with the user who sent it. A rotation meanwhile is followed: the file that was current
/// at the mark is the oldest rotated file that is new since.
pub fn audited_since(mark: &AuditMark) -> Result<Vec<(String, Audited)>> {
    audited_lines_since(mark, |_| true)
}

/// Every 403 the API server answered `user` since `mark` (only what was logged since is read,
/// so a test may ask while it runs).
pub fn forbidden_since(mark: &AuditMark, user: &str) -> Result<Vec<Forbidden>> {
    Ok(audited_lines_since(mark, |line| line.contains(user))?
        .into_iter()
        .filter(|(by, audited)| by == user && audited.code == 403)
        .map(|(_, audited)| audited)
        .collect())
}

/// [`audited_since`] of the lines `keep` passes (a cheap text filter before the JSON is read).
fn audited_lines_since(
    mark: &AuditMark,
    keep: impl Fn(&str) -> bool,
) -> Result<Vec<(String, Audited)>> {
    use std::io::{Read, Seek, SeekFrom};
    let path = audit_log_path()?;
    let new_rotated: Vec<PathBuf> = rotated_audit_logs(&path)?
        .into_iter()
        .filter(|p| !mark.rotated.contains(p))
        .collect();
    let mut text = String::new();
    for (i, file) in new_rotated.iter().chain(std::iter::once(&path)).enumerate() {
        let mut f =
            std::fs::File::open(file).with_context(|| format!("opening {}", file.display()))?;
        if i == 0 {
            f.seek(SeekFrom::Start(mark.offset))?;
        }
        f.read_to_string(&mut text)
            .with_context(|| format!("reading {}", file.display()))?;
        text.push('\n');
    }
    let mut seen = std::collections::HashSet::new();
    Ok(text
        .lines()
        .filter(|line| keep(line))
        .filter_map(parse_audit_line)
        .filter(|(_, id, _)| seen.insert(id.clone()))
        .map(|(user, _, audited)| (user, audited))
        .collect())
}

/// One line of the audit log: the user, the audit id and the request, if it was answered.
fn parse_audit_line(line: &str) -> Option<(String, String, Audited)> {
    let event = serde_json::from_str::<serde_json::Value>(line).ok()?;
    let code = event["responseStatus"]["code"].as_u64()?;
    let object = &event["objectRef"];
    let mut resource = object["resource"].as_str().unwrap_or_default().to_string();
    if let Some(sub) = object["subresource"].as_str() {
        resource = format!("{resource}/{sub}");
    }
    let audited = Audited {
        verb: event["verb"].as_str().unwrap_or_default().to_string(),
        group: object["apiGroup"].as_str().unwrap_or_default().to_string(),
        resource,
        namespace: object["namespace"].as_str().map(String::from),
        code: u16::try_from(code).unwrap_or(u16::MAX),
        server_time: server_time(&event),
        received: event["requestReceivedTimestamp"]
            .as_str()
            .and_then(|t| t.parse().ok()),
    };
    let user = event["user"]["username"].as_str()?.to_string();
    let id = event["auditID"].as_str().unwrap_or_default().to_string();
    Some((user, id, audited))
}

/// An audit event's `stageTimestamp` (its response) less its `requestReceivedTimestamp`.
fn server_time(event: &serde_json::Value) -> Option<std::time::Duration> {
    let at = |field: &str| {
        event[field]
            .as_str()?
            .parse::<k8s_openapi::jiff::Timestamp>()
            .ok()
    };
    let took = at("stageTimestamp")?.duration_since(at("requestReceivedTimestamp")?);
    std::time::Duration::try_from(took).ok()
}

/// The Kueue version under test, as `(minor, patch)` of `v0.<minor>.<patch>`: `KUEUE_VERSION`
/// when set (the control plane script builds and starts that one; set it too for a cluster of
/// your own through `E2E_KUBECONFIG`), else the default in `tests/control-plane/versions.env`.
/// For the few behaviours that differ between the supported versions.
pub fn kueue_version() -> (u32, u32) {
    let configured = std::env::var("KUEUE_VERSION").ok().unwrap_or_else(|| {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../control-plane/versions.env");
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        text.lines()
            .find_map(|l| l.strip_prefix("KUEUE_VERSION=\"${KUEUE_VERSION:-"))
            .and_then(|rest| rest.split('}').next())
            .unwrap_or_else(|| panic!("no KUEUE_VERSION default in {}", file.display()))
            .to_string()
    });
    let parts: Vec<u32> = configured
        .trim_start_matches('v')
        .split('.')
        .map(|n| n.parse().ok())
        .collect::<Option<_>>()
        .unwrap_or_else(|| panic!("KUEUE_VERSION {configured:?} is not v<major>.<minor>.<patch>"));
    match parts[..] {
        [0, minor, patch] => (minor, patch),
        _ => panic!("KUEUE_VERSION {configured:?} is not a v0.x.y release"),
    }
}

/// Starts the shared control plane once per test process and returns its admin kubeconfig.
fn control_plane_kubeconfig() -> &'static Path {
    static KUBECONFIG: OnceLock<PathBuf> = OnceLock::new();
    KUBECONFIG.get_or_init(|| {
        if let Some(path) = std::env::var_os("E2E_KUBECONFIG") {
            return PathBuf::from(path);
        }
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../control-plane/control-plane.sh");
        let out = Command::new("bash")
            .arg(&script)
            .arg("start")
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
        if !out.status.success() {
            panic!(
                "the local control plane did not start ({}); end-to-end tests cannot run.\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let env = Command::new("bash")
            .arg(&script)
            .arg("env")
            .output()
            .expect("control-plane.sh env");
        let env = String::from_utf8_lossy(&env.stdout);
        let path = env
            .lines()
            .find_map(|l| l.strip_prefix("export KUBECONFIG="))
            .expect("control-plane.sh env prints KUBECONFIG");
        PathBuf::from(path.trim_matches('\''))
    })
}

/// A client for the shared control plane, authenticated as cluster admin.
pub async fn admin_client() -> Result<Client> {
    let path = control_plane_kubeconfig();
    let kubeconfig =
        Kubeconfig::read_from(path).with_context(|| format!("reading {}", path.display()))?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

/// A client that authenticates as a ServiceAccount, with a token from the TokenRequest API, so
/// the apiserver's RBAC authorizer decides what it may do (least-privilege tests).
pub async fn service_account_client(namespace: &str, service_account: &str) -> Result<Client> {
    let kubeconfig = service_account_kubeconfig(namespace, service_account).await?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

/// The admin kubeconfig with a ServiceAccount's token (from the TokenRequest API, valid an
/// hour) in place of the admin's certificate: for a process that must act as that account.
pub async fn service_account_kubeconfig(
    namespace: &str,
    service_account: &str,
) -> Result<Kubeconfig> {
    let admin = admin_client().await?;
    let token = service_account_token(&admin, namespace, service_account).await?;
    // Same cluster and CA as the admin kubeconfig, token instead of the client certificate.
    let mut kubeconfig = Kubeconfig::read_from(control_plane_kubeconfig())?;
    for named in &mut kubeconfig.auth_infos {
        named.auth_info = Some(serde_json::from_value(json!({"token": token}))?);
    }
    Ok(kubeconfig)
}

/// A short suffix that makes names unique across tests and runs against the same cluster.
fn unique_suffix() -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{:05x}", (nanos ^ (std::process::id() << 8) ^ n) & 0xfffff)
}

/// A suspended batch/v1 Job for [`TestEnv::create_job`]: one container requesting `cpu` per
/// pod, submitted to `local_queue`. Once Kueue starts it, its pods are made, scheduled and run
/// (on a kwok node its flavor selects), until they are annotated to succeed
/// ([`TestEnv::complete_job`]) or their template says for how long ([`RUN_FOR_ANNOTATION`]).
#[derive(Clone, Copy, Debug)]
pub struct SuspendedJob<'a> {
    /// The Job's name.
    pub name: &'a str,
    /// The LocalQueue (label `kueue.x-k8s.io/queue-name`).
    pub local_queue: &'a str,
    /// cpu request of each pod.
    pub cpu: &'a str,
    /// Pods (parallelism and completions); unset leaves both to the API's defaults.
    pub parallelism: Option<i32>,
    /// More labels on the Job.
    pub labels: &'a [(&'a str, &'a str)],
    /// Annotations on the Job (Kueue copies some to its Workload, e.g.
    /// `provreq.kueue.x-k8s.io/*`).
    pub annotations: &'a [(&'a str, &'a str)],
    /// Annotations on its pod template.
    pub pod_annotations: &'a [(&'a str, &'a str)],
}

impl<'a> SuspendedJob<'a> {
    /// One pod requesting `cpu`, nothing else set.
    pub fn new(name: &'a str, local_queue: &'a str, cpu: &'a str) -> Self {
        Self {
            name,
            local_queue,
            cpu,
            parallelism: None,
            labels: &[],
            annotations: &[],
            pod_annotations: &[],
        }
    }
}

/// What [`TestEnv::guarded_queue`] created (cluster-scoped names); the LocalQueue is `lq`.
#[derive(Debug)]
pub struct GuardedQueue {
    /// The ResourceFlavor.
    pub flavor: String,
    /// The AdmissionCheck.
    pub check: String,
    /// The controllerName the AdmissionCheck names.
    pub controller_name: String,
    /// The ClusterQueue.
    pub cluster_queue: String,
}

/// One test's slice of the cluster: its namespace and a prefix for cluster-scoped names.
#[derive(Clone)]
pub struct TestEnv {
    /// Admin client.
    pub client: Client,
    /// The test's own namespace.
    pub ns: String,
}

impl Debug for TestEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestEnv")
            .field("ns", &self.ns)
            .finish_non_exhaustive()
    }
}

/// Sends the logs of everything this test binary runs in process (the SDK runtime, the
/// provisioning controller, the autoscaler simulator) to `e2e-logs/<binary>.log` beside the
/// binary's directory (`target/debug/e2e-logs/`), so that a failure can be read after the
/// fact. `E2E_LOG` sets the filter (default `info`). Once per process; a subscriber set
/// before wins.
fn log_to_file() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let Ok(exe) = std::env::current_exe() else {
            return;
        };
        let (Some(deps), Some(stem)) = (exe.parent(), exe.file_stem()) else {
            return;
        };
        // `<binary>-<hash>`: the name without the hash.
        let stem = stem.to_string_lossy();
        let name = stem
            .rsplit_once('-')
            .map_or(stem.as_ref(), |(name, _)| name);
        let dir = deps.parent().unwrap_or(deps).join("e2e-logs");
        let file = std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::File::create(dir.join(format!("{name}.log"))));
        let Ok(file) = file else {
            return;
        };
        let filter = std::env::var("E2E_LOG").unwrap_or_else(|_| "info".into());
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_ansi(false)
            .with_writer(std::sync::Mutex::new(file))
            .try_init();
    });
}

impl TestEnv {
    /// The runtime settings of a controller this test runs in process: its own field manager,
    /// four Workloads at once, no leader election, no HTTP endpoints (set `metrics_address` and
    /// `health_address` to serve them). Metrics are plain HTTP, so that a test reads them with
    /// [`http_get`]; one address for both serves metrics and probes on one listener. The
    /// authenticated default is tested by the metrics_auth suite.
    pub fn runtime_config(&self) -> kueue_admission_sdk::RuntimeConfig {
        kueue_admission_sdk::RuntimeConfig {
            metrics_address: None,
            metrics_security: kueue_admission_sdk::MetricsSecurity::Plain,
            health_address: None,
            field_manager: format!("e2e-{}", self.ns),
            concurrency: 4,
            leader_election: None,
            ..Default::default()
        }
    }

    /// Creates a fresh namespace named after the test.
    pub async fn new(test: &str) -> Result<Self> {
        log_to_file();
        let client = admin_client().await?;
        let slug: String = test
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '-'
                }
            })
            .take(40)
            .collect();
        let ns = format!("e2e-{slug}-{}", unique_suffix());
        let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .with_context(|| format!("creating namespace {ns}"))?;
        Ok(Self { client, ns })
    }

    /// A cluster-scoped name that belongs to this test.
    pub fn cluster_name(&self, name: &str) -> String {
        format!("{}-{name}", self.ns)
    }

    /// Creates a ServiceAccount in the test namespace and returns a client acting as it.
    pub async fn service_account(&self, name: &str) -> Result<Client> {
        let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": name}}))?;
        create(Api::namespaced(self.client.clone(), &self.ns), &sa).await?;
        service_account_client(&self.ns, name).await
    }

    /// Grants ServiceAccount `service_account` of the test namespace exactly `rules`
    /// (ClusterRole rules, cluster-wide) through a ClusterRole and ClusterRoleBinding named after
    /// it; applying again replaces the rules. The authorizer may take a moment to follow: see
    /// [`chart::wait_for_authorizer`].
    pub async fn grant_cluster_rules(
        &self,
        service_account: &str,
        rules: serde_json::Value,
    ) -> Result<()> {
        let name = self.cluster_name(service_account);
        let role = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": rules,
        });
        let binding = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": self.ns}],
        });
        for object in [&role, &binding] {
            chart::apply(&self.client, object, "e2e-rbac").await?;
        }
        Ok(())
    }

    /// Workloads of this test's namespace.
    pub fn workloads(&self) -> Api<Workload> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Creates this Workload in the test's namespace.
    pub async fn create_workload(&self, wl: &Workload) -> Result<Workload> {
        create(self.workloads(), wl).await
    }

    /// Jobs of this test's namespace.
    pub fn jobs(&self) -> Api<Job> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// ConfigMaps of this test's namespace.
    pub fn config_maps(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Leases of this test's namespace.
    pub fn leases(&self) -> Api<Lease> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Who holds the Lease `name` of this test's namespace now, if anyone.
    pub async fn lease_holder(&self, name: &str) -> Result<Option<String>> {
        let lease = self.leases().get(name).await?;
        Ok(lease_holder(&lease).map(String::from))
    }

    /// Waits until the holder of the Lease `name` (`None`: unheld) satisfies `cond` (`what`).
    pub async fn wait_lease_holder(
        &self,
        name: &str,
        what: &str,
        cond: impl Fn(Option<&str>) -> bool,
    ) -> Result<Lease> {
        wait_for(self.leases(), name, what, |l: &Lease| cond(lease_holder(l))).await
    }

    /// Creates a ResourceFlavor with no node labels.
    pub async fn resource_flavor(&self, name: &str) -> Result<ResourceFlavor> {
        let rf = ResourceFlavor::new(&self.cluster_name(name), ResourceFlavorSpec::default());
        create(Api::all(self.client.clone()), &rf).await
    }

    /// Creates an AdmissionCheck answered by `controller_name`. Nothing marks it Active.
    pub async fn admission_check(
        &self,
        name: &str,
        controller_name: &str,
    ) -> Result<AdmissionCheck> {
        let spec = AdmissionCheckSpec {
            controller_name: controller_name.into(),
            parameters: None,
        };
        create(
            Api::all(self.client.clone()),
            &AdmissionCheck::new(&self.cluster_name(name), spec),
        )
        .await
    }

    /// Sets the AdmissionCheck's `Active` condition, as the controller owning the check would.
    pub async fn set_admission_check_active(&self, check: &str, active: bool) -> Result<()> {
        let (status, reason) = if active {
            ("True", "Active")
        } else {
            ("False", "TestInactive")
        };
        let body = json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "AdmissionCheck",
            "metadata": {"name": check},
            "status": {"conditions": [{
                "type": "Active",
                "status": status,
                "reason": reason,
                "message": "set by the end-to-end test",
                "lastTransitionTime": Time(Timestamp::now()),
            }]},
        });
        Api::<AdmissionCheck>::all(self.client.clone())
            .patch_status(
                check,
                &PatchParams::apply(TEST_FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
            .with_context(|| format!("setting Active={status} on AdmissionCheck {check}"))?;
        Ok(())
    }

    /// Creates a ClusterQueue for all namespaces with `cpu` quota in one flavor and the given
    /// admission checks (applying to every flavor).
    pub async fn cluster_queue(
        &self,
        name: &str,
        flavor: &str,
        cpu: &str,
        checks: &[&str],
    ) -> Result<ClusterQueue> {
        let spec = ClusterQueueSpec {
            namespace_selector: Some(Default::default()),
            resource_groups: vec![ResourceGroup {
                covered_resources: vec!["cpu".into()],
                flavors: vec![FlavorQuotas {
                    name: flavor.into(),
                    resources: vec![ResourceQuota {
                        name: "cpu".into(),
                        nominal_quota: quantity(cpu),
                    }],
                }],
            }],
            // The API refuses an empty list: a queue without checks has no strategy.
            admission_checks_strategy: (!checks.is_empty()).then(|| AdmissionChecksStrategy {
                admission_checks: checks
                    .iter()
                    .map(|c| AdmissionCheckStrategyRule {
                        name: (*c).into(),
                        on_flavors: vec![],
                    })
                    .collect(),
            }),
        };
        create(
            Api::all(self.client.clone()),
            &ClusterQueue::new(&self.cluster_name(name), spec),
        )
        .await
    }

    /// Merge-patches the AdmissionCheck's `spec.parameters` (`null` removes them).
    pub async fn set_check_parameters(
        &self,
        check: &str,
        parameters: serde_json::Value,
    ) -> Result<()> {
        let body = json!({"spec": {"parameters": parameters}});
        self.merge_patch_cluster::<AdmissionCheck>(check, &body)
            .await
            .with_context(|| format!("setting the parameters of AdmissionCheck {check}"))
    }

    /// Takes every admission check off the ClusterQueue (removes its `admissionChecksStrategy`).
    pub async fn remove_queue_checks(&self, cluster_queue: &str) -> Result<()> {
        let body = json!({"spec": {"admissionChecksStrategy": null}});
        self.merge_patch_cluster::<ClusterQueue>(cluster_queue, &body)
            .await
            .with_context(|| format!("removing the checks of ClusterQueue {cluster_queue}"))
    }

    /// Merge-patches the cluster-scoped object `name` of kind `K` with `body`.
    async fn merge_patch_cluster<K>(&self, name: &str, body: &serde_json::Value) -> Result<()>
    where
        K: Resource + Clone + Debug + DeserializeOwned,
        K::DynamicType: Default,
    {
        Api::<K>::all(self.client.clone())
            .patch(name, &PatchParams::default(), &Patch::Merge(body))
            .await?;
        Ok(())
    }

    /// A controllerName no other test uses (so parallel tests' controllers never answer each
    /// other's checks): `e2e.kueue-admission-checks.dev/<prefix>-<namespace>`.
    pub fn own_controller_name(&self, prefix: &str) -> String {
        format!("e2e.kueue-admission-checks.dev/{prefix}-{}", self.ns)
    }

    /// The usual setup of a test of one check: ResourceFlavor `default`, AdmissionCheck `check`
    /// answered by `controller_name`, ClusterQueue `cq` with `cpu` quota guarded by it, and
    /// LocalQueue `lq`.
    pub async fn guarded_queue(
        &self,
        check: &str,
        controller_name: &str,
        cpu: &str,
    ) -> Result<GuardedQueue> {
        let flavor = self.resource_flavor("default").await?.name_any();
        let check = self
            .admission_check(check, controller_name)
            .await?
            .name_any();
        let cluster_queue = self.queues_on(&flavor, cpu, &[&check]).await?;
        Ok(GuardedQueue {
            flavor,
            check,
            controller_name: controller_name.into(),
            cluster_queue,
        })
    }

    /// ClusterQueue `cq` with `cpu` of `flavor` guarded by `checks`, and LocalQueue `lq` feeding
    /// it: the queues of most tests. Returns the ClusterQueue's cluster-scoped name.
    pub async fn queues_on(&self, flavor: &str, cpu: &str, checks: &[&str]) -> Result<String> {
        self.named_queues("cq", "lq", flavor, cpu, checks).await
    }

    /// [`queues_on`](Self::queues_on) with these queue names; returns the ClusterQueue's name.
    pub async fn named_queues(
        &self,
        cluster_queue: &str,
        local_queue: &str,
        flavor: &str,
        cpu: &str,
        checks: &[&str],
    ) -> Result<String> {
        let cq = self
            .cluster_queue(cluster_queue, flavor, cpu, checks)
            .await?
            .name_any();
        self.local_queue(local_queue, &cq).await?;
        Ok(cq)
    }

    /// Creates or replaces the ConfigMap `name` in the test namespace with exactly `data`.
    pub async fn put_config_map(&self, name: &str, data: &[(&str, &str)]) -> Result<ConfigMap> {
        let api = self.config_maps();
        let mut cm = ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                namespace: Some(self.ns.clone()),
                ..Default::default()
            },
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        };
        Ok(match api.get_opt(name).await? {
            None => api.create(&PostParams::default(), &cm).await?,
            Some(old) => {
                cm.metadata.resource_version = old.resource_version();
                api.replace(name, &PostParams::default(), &cm).await?
            }
        })
    }

    /// Creates a LocalQueue in the test namespace feeding `cluster_queue`.
    pub async fn local_queue(&self, name: &str, cluster_queue: &str) -> Result<LocalQueue> {
        let mut lq = LocalQueue::new(
            name,
            LocalQueueSpec {
                cluster_queue: cluster_queue.into(),
            },
        );
        lq.metadata.namespace = Some(self.ns.clone());
        create(Api::namespaced(self.client.clone(), &self.ns), &lq).await
    }

    /// Creates a suspended batch/v1 Job of one pod requesting `cpu`, submitted to `local_queue`.
    /// Kueue still manages the Job; its pods run on the standing node once it is started.
    pub async fn suspended_job(&self, name: &str, local_queue: &str, cpu: &str) -> Result<Job> {
        self.create_job(&SuspendedJob::new(name, local_queue, cpu))
            .await
    }

    /// Creates the Job `job` describes.
    pub async fn create_job(&self, job: &SuspendedJob<'_>) -> Result<Job> {
        let mut labels = serde_json::Map::new();
        labels.insert("kueue.x-k8s.io/queue-name".into(), job.local_queue.into());
        for (k, v) in job.labels {
            labels.insert((*k).into(), (*v).into());
        }
        let map = |pairs: &[(&str, &str)]| -> serde_json::Map<String, serde_json::Value> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect()
        };
        let mut spec = json!({
            "suspend": true,
            "template": pod_template(map(job.pod_annotations).into(), job.cpu),
        });
        if let Some(n) = job.parallelism {
            spec["parallelism"] = n.into();
            spec["completions"] = n.into();
        }
        let job: Job = serde_json::from_value(json!({
            "metadata": {
                "name": job.name,
                "labels": labels,
                "annotations": map(job.annotations),
            },
            "spec": spec,
        }))?;
        create(self.jobs(), &job).await
    }

    /// Submits a suspended Job (see [`suspended_job`](Self::suspended_job)) and returns the name
    /// of the Workload Kueue creates for it.
    pub async fn submit_job(&self, name: &str, local_queue: &str, cpu: &str) -> Result<String> {
        self.submit(&SuspendedJob::new(name, local_queue, cpu))
            .await
    }

    /// Creates the Job `job` describes and returns the name of the Workload Kueue creates for it.
    pub async fn submit(&self, job: &SuspendedJob<'_>) -> Result<String> {
        let job = self.create_job(job).await?;
        Ok(self.workload_for_job(&job).await?.name_any())
    }

    /// Waits until Kueue has created the Workload of a Job and returns it.
    pub async fn workload_for_job(&self, job: &Job) -> Result<Workload> {
        let uid = job.uid().ok_or_else(|| anyhow!("job has no uid"))?;
        wait_for_any(
            self.workloads(),
            &format!("a Workload owned by Job {}", job.name_any()),
            |wl: &Workload| wl.owner_references().iter().any(|o| o.uid == uid),
        )
        .await
    }

    /// Waits until the named Workload satisfies `cond`; on timeout, fails with the Workload dumped.
    pub async fn wait_workload(
        &self,
        name: &str,
        what: &str,
        cond: impl Fn(&Workload) -> bool,
    ) -> Result<Workload> {
        wait_for(self.workloads(), name, what, cond).await
    }

    /// A recorder of every version of every Workload in the namespace, from now on: its
    /// initial list is done when this returns, so nothing that happens afterwards is missed
    /// (a watch stream only starts when polled).
    pub async fn record_workloads(&self) -> Result<WorkloadRecorder> {
        use futures::StreamExt;
        use kube::runtime::watcher::{Config, Event, watcher};
        let mut events = watcher(self.workloads(), Config::default()).boxed();
        let deadline = tokio::time::Instant::now() + DEFAULT_TIMEOUT;
        loop {
            match tokio::time::timeout_at(deadline, events.next()).await {
                Err(_) => bail!("the Workload recorder's initial list did not end in time"),
                Ok(None) => bail!("the Workload recorder's watch ended"),
                Ok(Some(Ok(Event::InitDone))) => break,
                Ok(Some(Ok(_))) => {}
                Ok(Some(Err(e))) => return Err(e).context("the Workload recorder's watch"),
            }
        }
        Ok(WorkloadRecorder { events })
    }

    /// Every version of the Workload from now until one satisfies `until` (included), as a
    /// watch delivers them: for asserting that something held at every step on the way, not
    /// at one moment picked by a sleep.
    pub async fn versions_until(
        &self,
        name: &str,
        what: &str,
        until: impl Fn(&Workload) -> bool,
    ) -> Result<Vec<Workload>> {
        use futures::StreamExt;
        use kube::runtime::watcher::{Config, Event, watcher};
        let mut events = watcher(
            self.workloads(),
            Config::default().fields(&format!("metadata.name={name}")),
        )
        .boxed();
        let deadline = tokio::time::Instant::now() + DEFAULT_TIMEOUT + LATE_SLACK;
        let mut versions: Vec<Workload> = Vec::new();
        loop {
            let next = tokio::time::timeout_at(deadline, events.next()).await;
            let event = match next {
                Err(_) => bail!(
                    "timed out waiting for Workload {name}: {what}; {} versions seen, the last:\n{}",
                    versions.len(),
                    versions.last().map(dump).unwrap_or_default()
                ),
                Ok(None) => bail!("the watch of Workload {name} ended"),
                Ok(Some(e)) => e.with_context(|| format!("watching Workload {name}"))?,
            };
            if let Event::Apply(wl) | Event::InitApply(wl) = event {
                let done = until(&wl);
                versions.push(wl);
                if done {
                    return Ok(versions);
                }
            }
        }
    }

    /// Waits until the Workload holds quota with the check's entry `Pending`: the moment a
    /// check controller is asked to decide.
    pub async fn wait_check_pending_with_quota(
        &self,
        workload: &str,
        check: &str,
    ) -> Result<Workload> {
        let what = format!("QuotaReserved=True, not Evicted, with check {check} Pending");
        // Kueue resets the entry to Pending while the evicted Workload still holds quota for a
        // moment; answering then races the release, so wait for a reservation that is not ending.
        self.wait_workload(workload, &what, |wl| {
            wl.condition_is_true(workload_condition::QUOTA_RESERVED)
                && !wl.condition_is_true(workload_condition::EVICTED)
                && wl
                    .admission_check(check)
                    .is_some_and(|e| e.state == CheckState::Pending)
        })
        .await
    }

    /// Submits a Job of one pod of 1 cpu to LocalQueue `lq` (see [`Self::submit_job`]), waits
    /// until its Workload is admitted and returns the Workload's name.
    pub async fn admitted_job(&self, name: &str) -> Result<String> {
        let wl = self.submit_job(name, "lq", "1").await?;
        self.wait_admitted(&wl).await?;
        Ok(wl)
    }

    /// Deletes the Workload `name` of the test namespace.
    pub async fn delete_workload(&self, name: &str) -> Result<()> {
        self.workloads()
            .delete(name, &kube::api::DeleteParams::default())
            .await?;
        Ok(())
    }

    /// Waits until `check`'s entry on the Workload is in `state`; returns the Workload and the
    /// entry. The story helper most tests need: "the check answered X".
    pub async fn wait_entry(
        &self,
        workload: &str,
        check: &str,
        state: CheckState,
    ) -> Result<(Workload, AdmissionCheckState)> {
        let what = format!("check {check} {state}");
        let wl = self
            .wait_workload(workload, &what, |w| {
                w.admission_check(check).is_some_and(|e| e.state == state)
            })
            .await?;
        let entry = entry_of(&wl, check)?;
        Ok((wl, entry))
    }

    /// Waits until `check`'s entry on the Workload says `message`; returns the Workload.
    pub async fn wait_entry_message(
        &self,
        workload: &str,
        check: &str,
        message: &str,
    ) -> Result<Workload> {
        let what = format!("check {check}'s entry saying {message:?}");
        self.wait_workload(workload, &what, |w| {
            w.admission_check(check)
                .is_some_and(|e| e.message == message)
        })
        .await
    }

    /// Waits until the Workload, once evicted, holds quota again, not `Evicted`: its next attempt.
    pub async fn wait_next_attempt(&self, workload: &str) -> Result<Workload> {
        let what = "evicted and holding quota again (the next attempt)";
        self.wait_workload(workload, what, |w| {
            w.total_evictions() >= 1
                && w.condition_is_true(workload_condition::QUOTA_RESERVED)
                && !w.condition_is_true(workload_condition::EVICTED)
        })
        .await
    }

    /// Changes a label of the Workload and nothing else: a change that wakes every watcher of
    /// it (a controller is asked again) without meaning anything to Kueue.
    pub async fn touch_workload(&self, workload: &str, value: &str) -> Result<Workload> {
        let body =
            json!({"metadata": {"labels": {"e2e.kueue-admission-checks.dev/touched": value}}});
        self.workloads()
            .patch(workload, &PatchParams::default(), &Patch::Merge(&body))
            .await
            .with_context(|| format!("touching Workload {workload}"))
    }

    /// Sets the Workload's `spec.active`, as a user stopping (`false`) or letting it in would.
    pub async fn set_workload_active(&self, workload: &str, active: bool) -> Result<Workload> {
        let body = json!({"spec": {"active": active}});
        self.workloads()
            .patch(workload, &PatchParams::default(), &Patch::Merge(&body))
            .await
            .with_context(|| format!("setting spec.active={active} on Workload {workload}"))
    }

    /// Waits until the Workload is inactive (`spec.active: false`, by Kueue or a user).
    pub async fn wait_deactivated(&self, workload: &str) -> Result<Workload> {
        self.wait_workload(workload, "deactivated (spec.active=false)", |w| {
            !w.is_active()
        })
        .await
    }

    /// Waits until the Workload is `Admitted`.
    pub async fn wait_admitted(&self, workload: &str) -> Result<Workload> {
        self.wait_workload(workload, "Admitted=True", |wl| {
            wl.condition_is_true(workload_condition::ADMITTED)
        })
        .await
    }

    /// Waits until the Workload is admitted with `check`'s entry `Ready`; returns both.
    pub async fn wait_admitted_ready(
        &self,
        workload: &str,
        check: &str,
    ) -> Result<(Workload, AdmissionCheckState)> {
        let what = format!("Admitted=True with {check} Ready");
        let wl = self
            .wait_workload(workload, &what, |w| {
                w.condition_is_true(workload_condition::ADMITTED)
                    && w.admission_check(check)
                        .is_some_and(|e| e.state == CheckState::Ready)
            })
            .await?;
        let entry = wl
            .admission_check(check)
            .cloned()
            .with_context(|| format!("no entry for {check}"))?;
        Ok((wl, entry))
    }

    /// Ends a Job the way its work ending would: once Kueue has started it and its pods run,
    /// each pod is annotated to succeed now ([`RUN_FOR_ANNOTATION`]); kwok ends them, the Job
    /// controller completes the Job, and Kueue marks the Workload `Finished` (reason
    /// `Succeeded`) and releases its quota. Nothing writes the Job's status by hand. Waits for
    /// `Finished=True` and returns the Workload; fails, naming each pod's state, if the pods do
    /// not run (no node their flavor selects, say).
    pub async fn complete_job(&self, job: &str, workload: &str) -> Result<Workload> {
        let current = self.wait_job_unsuspended(job).await?;
        let pods = current
            .spec
            .as_ref()
            .and_then(|s| s.parallelism)
            .unwrap_or(1);
        let running = self.wait_job_pods_running(job, pods).await?;
        let annotate = json!({"metadata": {"annotations": {RUN_FOR_ANNOTATION: "0s"}}});
        for pod in &running {
            Api::<Pod>::namespaced(self.client.clone(), &self.ns)
                .patch(
                    &pod.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&annotate),
                )
                .await
                .with_context(|| format!("annotating pod {} to succeed", pod.name_any()))?;
        }
        self.wait_workload(workload, "Finished=True", |wl| {
            wl.condition_is_true(workload_condition::FINISHED)
        })
        .await
    }

    /// The pods of a Job (by the Job controller's label), in name order.
    pub async fn job_pods(&self, job: &str) -> Result<Vec<Pod>> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &self.ns);
        let selector = format!("{JOB_NAME_LABEL}={job}");
        let mut pods = api
            .list(&ListParams::default().labels(&selector))
            .await
            .with_context(|| format!("listing the pods of Job {job}"))?
            .items;
        pods.sort_by_key(|p| p.name_any());
        Ok(pods)
    }

    /// Waits until `count` pods of the Job are `Running` (scheduled, and started by kwok) and
    /// returns them; on timeout, fails with each pod's phase and scheduling condition.
    pub async fn wait_job_pods_running(&self, job: &str, count: i32) -> Result<Vec<Pod>> {
        let deadline = tokio::time::Instant::now() + DEFAULT_TIMEOUT;
        let wanted = usize::try_from(count).unwrap_or(0);
        loop {
            let pods = self.job_pods(job).await?;
            let running: Vec<Pod> = pods
                .iter()
                .filter(|p| pod_phase(p) == "Running")
                .cloned()
                .collect();
            if running.len() >= wanted {
                return Ok(running);
            }
            if tokio::time::Instant::now() >= deadline {
                let states: Vec<String> = pods.iter().map(describe_pod).collect();
                bail!(
                    "{} of {count} pods of Job {job} running after {DEFAULT_TIMEOUT:?}: [{}]",
                    running.len(),
                    states.join("; ")
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The Job's `spec.suspend` now.
    pub async fn job_suspend(&self, job: &str) -> Result<Option<bool>> {
        Ok(self.jobs().get(job).await?.spec.and_then(|s| s.suspend))
    }

    /// Waits until Kueue has unsuspended the Job.
    pub async fn wait_job_unsuspended(&self, job: &str) -> Result<Job> {
        self.wait_job_suspend(job, false).await
    }

    /// Waits until the Job's `spec.suspend` is `suspend` (Kueue suspends it again on eviction).
    pub async fn wait_job_suspend(&self, job: &str, suspend: bool) -> Result<Job> {
        wait_for(
            self.jobs(),
            job,
            &format!("spec.suspend={suspend}"),
            |j: &Job| j.spec.as_ref().and_then(|s| s.suspend) == Some(suspend),
        )
        .await
    }

    /// Answers a check as a correct controller does: read the Workload, decide only while it
    /// holds quota with our entry `Pending`, apply with its `resourceVersion`, and on 409 (Kueue
    /// wrote the Workload meanwhile, which it does several times right after reserving quota)
    /// read it again and decide again.
    pub async fn answer_check(
        &self,
        workload: &str,
        check: &str,
        state: CheckState,
        message: &str,
    ) -> Result<Workload> {
        self.answer_check_with_delay(workload, check, state, message, None)
            .await
    }

    /// [`answer_check`](Self::answer_check) with `requeueAfterSeconds` on the entry.
    pub async fn answer_check_with_delay(
        &self,
        workload: &str,
        check: &str,
        state: CheckState,
        message: &str,
        requeue_after_seconds: Option<i32>,
    ) -> Result<Workload> {
        for _ in 0..10 {
            let wl = self.workloads().get(workload).await?;
            let pending = wl
                .admission_check(check)
                .is_some_and(|e| e.state == CheckState::Pending);
            if !wl.condition_is_true(workload_condition::QUOTA_RESERVED) || !pending {
                bail!(
                    "Workload {workload} no longer holds quota with check {check} Pending:\n{}",
                    dump(&wl)
                );
            }
            match self
                .apply_entry(&wl, check, state, message, requeue_after_seconds)
                .await
            {
                Ok(wl) => return Ok(wl),
                Err(e) if is_conflict(&e) => continue,
                Err(e) => return Err(e),
            }
        }
        bail!("Workload {workload} changed under every one of 10 attempts to answer {state}")
    }

    /// Writes one check entry the way a correct check controller does: a server-side apply of
    /// only that entry on the status subresource, with every required field, a fresh
    /// `lastTransitionTime`, and the `resourceVersion` the decision was made from, so that a
    /// decision based on a stale Workload is refused (409) instead of landing.
    pub async fn apply_check_state(
        &self,
        wl: &Workload,
        check: &str,
        state: CheckState,
        message: &str,
    ) -> Result<Workload> {
        self.apply_entry(wl, check, state, message, None).await
    }

    async fn apply_entry(
        &self,
        wl: &Workload,
        check: &str,
        state: CheckState,
        message: &str,
        requeue_after_seconds: Option<i32>,
    ) -> Result<Workload> {
        let mut entry = json!({
            "name": check,
            "state": state,
            "message": message,
            "lastTransitionTime": Time(Timestamp::now()),
        });
        if let Some(secs) = requeue_after_seconds {
            entry["requeueAfterSeconds"] = secs.into();
        }
        let body = json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "metadata": {
                "name": wl.name_any(),
                "namespace": self.ns,
                "resourceVersion": wl.resource_version(),
            },
            "status": {"admissionChecks": [entry]},
        });
        // One field manager per check: server-side apply drops what a manager applied before
        // and leaves out now, so one manager for two checks would strip the other's entry
        // (observed: the API server then rejects the husk with 422).
        let pp = PatchParams::apply(&format!("{TEST_FIELD_MANAGER}-{check}")).force();
        self.workloads()
            .patch_status(&wl.name_any(), &pp, &Patch::Apply(&body))
            .await
            .with_context(|| {
                format!(
                    "applying {state} for check {check} to Workload {}",
                    wl.name_any()
                )
            })
    }
}

/// Who holds the Lease, if anyone.
pub fn lease_holder(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
}

/// The state of `check`'s entry on the Workload, if it has one.
pub fn entry_state(wl: &Workload, check: &str) -> Option<CheckState> {
    wl.admission_check(check).map(|e| e.state)
}

/// The Workload's entry for `check`, or an error that shows the Workload.
pub fn entry_of(wl: &Workload, check: &str) -> Result<AdmissionCheckState> {
    wl.admission_check(check)
        .cloned()
        .with_context(|| format!("no entry for check {check}:\n{}", dump(wl)))
}

/// Whether an error is the apiserver's 409 Conflict (a failed `resourceVersion` precondition).
pub fn is_conflict(err: &anyhow::Error) -> bool {
    matches!(err.downcast_ref::<kube::Error>(), Some(kube::Error::Api(s)) if s.code == 409)
}

fn quantity(s: &str) -> k8s_openapi::apimachinery::pkg::api::resource::Quantity {
    k8s_openapi::apimachinery::pkg::api::resource::Quantity(s.into())
}

pub(crate) async fn create<K>(api: Api<K>, obj: &K) -> Result<K>
where
    K: Resource + Clone + Debug + Serialize + DeserializeOwned,
    K::DynamicType: Default,
{
    api.create(&PostParams::default(), obj)
        .await
        .with_context(|| {
            format!(
                "creating {} {}",
                K::kind(&Default::default()),
                obj.meta().name.as_deref().unwrap_or("?")
            )
        })
}

/// Renders an object for a failure message, without the noise of managedFields.
pub fn dump<K: Resource + Serialize + Clone>(obj: &K) -> String {
    let mut obj = obj.clone();
    obj.meta_mut().managed_fields = None;
    serde_json::to_string_pretty(&obj).unwrap_or_else(|e| format!("<unprintable: {e}>"))
}

/// Watches one object until `cond` holds, for at most [`DEFAULT_TIMEOUT`].
pub async fn wait_for<K>(
    api: Api<K>,
    name: &str,
    what: &str,
    cond: impl Fn(&K) -> bool,
) -> Result<K>
where
    K: Resource + Clone + Debug + Serialize + DeserializeOwned + Send + 'static,
    K::DynamicType: Default,
{
    let kind = K::kind(&Default::default()).to_string();
    let watch = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let stream = watcher(api.clone(), watch).applied_objects();
    let found = tokio::time::timeout(DEFAULT_TIMEOUT, async {
        let mut stream = std::pin::pin!(stream);
        while let Some(obj) = stream.try_next().await? {
            if cond(&obj) {
                return Ok::<_, anyhow::Error>(Some(obj));
            }
        }
        Ok(None)
    })
    .await;
    match found {
        Ok(Ok(Some(obj))) => Ok(obj),
        Ok(Ok(None)) => bail!("watch of {kind} {name} ended before: {what}"),
        Ok(Err(e)) => Err(e.context(format!("watching {kind} {name} for: {what}"))),
        Err(_) => {
            let current = match api.get_opt(name).await {
                Ok(Some(obj)) => dump(&obj),
                Ok(None) => "<does not exist>".into(),
                Err(e) => format!("<cannot read it: {e}>"),
            };
            bail!(
                "timed out after {DEFAULT_TIMEOUT:?} waiting for {kind} {name}: {what}\ncurrent object:\n{current}"
            )
        }
    }
}

/// Watches a collection until one object satisfies `cond`, for at most [`DEFAULT_TIMEOUT`].
pub async fn wait_for_any<K>(api: Api<K>, what: &str, cond: impl Fn(&K) -> bool) -> Result<K>
where
    K: Resource + Clone + Debug + Serialize + DeserializeOwned + Send + 'static,
    K::DynamicType: Default,
{
    let stream = watcher(api.clone(), watcher::Config::default()).applied_objects();
    let found = tokio::time::timeout(DEFAULT_TIMEOUT, async {
        let mut stream = std::pin::pin!(stream);
        while let Some(obj) = stream.next().await {
            let obj = obj?;
            if cond(&obj) {
                return Ok::<_, anyhow::Error>(obj);
            }
        }
        bail!("watch ended")
    })
    .await;
    match found {
        Ok(res) => res.with_context(|| format!("waiting for {what}")),
        Err(_) => {
            let existing = api.list(&ListParams::default()).await.map(|l| l.items);
            let existing = match existing {
                Ok(items) => items.iter().map(dump).collect::<Vec<_>>().join("\n"),
                Err(e) => format!("<cannot list: {e}>"),
            };
            bail!(
                "timed out after {DEFAULT_TIMEOUT:?} waiting for {what}\nexisting objects:\n{existing}"
            )
        }
    }
}

/// GETs a path from a local HTTP endpoint (the runtime's metrics and probes); returns the status
/// code and body.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> Result<(u16, String)> {
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    http_exchange(addr, &request).await
}

/// GETs a path from a local HTTPS endpoint (the runtime's authenticated `/metrics`), with
/// `token` as its bearer token if given; the certificate is not verified (the runtime's is
/// self-signed). Returns the status code and body.
pub async fn https_get(
    addr: std::net::SocketAddr,
    path: &str,
    token: Option<&str>,
) -> Result<(u16, String)> {
    let authorization = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: localhost\r\n{authorization}Connection: close\r\n\r\n"
    );
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = rustls::pki_types::ServerName::try_from("localhost")?;
    let tls = tokio_rustls::TlsConnector::from(unverified_tls()?)
        .connect(name, tcp)
        .await
        .with_context(|| format!("TLS handshake with {addr}"))?;
    exchange(tls, &request).await
}

/// A TLS client configuration that accepts any server certificate (it still checks the
/// handshake's signatures): for the runtime's self-signed certificate, in tests only.
fn unverified_tls() -> Result<std::sync::Arc<rustls::ClientConfig>> {
    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::{DigitallySignedStruct, SignatureScheme};

    #[derive(Debug)]
    struct AnyCertificate(std::sync::Arc<rustls::crypto::CryptoProvider>);

    impl ServerCertVerifier for AnyCertificate {
        fn verify_server_cert(
            &self,
            _: &CertificateDer<'_>,
            _: &[CertificateDer<'_>],
            _: &ServerName<'_>,
            _: &[u8],
            _: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            Ok(ServerCertVerified::assertion())
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            let algorithms = &self.0.signature_verification_algorithms;
            rustls::crypto::verify_tls12_signature(message, cert, dss, algorithms)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            let algorithms = &self.0.signature_verification_algorithms;
            rustls::crypto::verify_tls13_signature(message, cert, dss, algorithms)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }

    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(std::sync::Arc::new(AnyCertificate(provider)))
        .with_no_client_auth();
    Ok(std::sync::Arc::new(config))
}

/// A token allowed to read the in-process controllers' authenticated `/metrics`: of
/// ServiceAccount `default/e2e-metrics-scraper`, bound to a ClusterRole that grants `get` on
/// `/metrics` and nothing else. Made once per test process (valid an hour).
pub async fn scraper_token() -> Result<String> {
    static TOKEN: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();
    TOKEN
        .get_or_try_init(|| async {
            const NAME: &str = "e2e-metrics-scraper";
            const NAMESPACE: &str = "default";
            let admin = admin_client().await?;
            let objects = [
                json!({
                    "apiVersion": "v1", "kind": "ServiceAccount",
                    "metadata": {"name": NAME, "namespace": NAMESPACE},
                }),
                json!({
                    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                    "metadata": {"name": NAME},
                    "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}],
                }),
                json!({
                    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                    "metadata": {"name": NAME},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
                    "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}],
                }),
            ];
            for object in &objects {
                chart::apply(&admin, object, "e2e-metrics-scraper").await?;
            }
            wait_until_may_read_metrics(&admin, NAMESPACE, NAME).await?;
            service_account_token(&admin, NAMESPACE, NAME).await
        })
        .await
        .cloned()
}

/// Waits (at most 30 s: the authorizer learns of bindings through its informers) until
/// ServiceAccount `namespace/name` may `get` `/metrics`.
pub async fn wait_until_may_read_metrics(
    admin: &Client,
    namespace: &str,
    name: &str,
) -> Result<()> {
    use k8s_openapi::api::authorization::v1::SubjectAccessReview;
    let review: SubjectAccessReview = serde_json::from_value(json!({
        "spec": {
            "user": format!("system:serviceaccount:{namespace}:{name}"),
            "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{namespace}"), "system:authenticated"],
            "nonResourceAttributes": {"path": "/metrics", "verb": "get"},
        },
    }))?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let answer = Api::<SubjectAccessReview>::all(admin.clone())
            .create(&PostParams::default(), &review)
            .await
            .context("SubjectAccessReview of get /metrics")?;
        if answer.status.is_some_and(|s| s.allowed) {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("ServiceAccount {namespace}/{name} may not get /metrics 30 s after its binding");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A token of ServiceAccount `namespace/name` from the TokenRequest API, valid an hour.
pub async fn service_account_token(admin: &Client, namespace: &str, name: &str) -> Result<String> {
    let request: TokenRequest =
        serde_json::from_value(json!({"spec": {"audiences": [], "expirationSeconds": 3600}}))?;
    Api::<ServiceAccount>::namespaced(admin.clone(), namespace)
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .with_context(|| format!("TokenRequest for ServiceAccount {namespace}/{name}"))?
        .status
        .and_then(|s| s.token)
        .ok_or_else(|| anyhow!("TokenRequest answered without a token"))
}

/// Sends one plain HTTP/1.1 request (`Connection: close`) and returns the status and body.
async fn http_exchange(addr: std::net::SocketAddr, request: &str) -> Result<(u16, String)> {
    exchange(tokio::net::TcpStream::connect(addr).await?, request).await
}

/// Sends one HTTP/1.1 request (`Connection: close`) on `stream` and returns the status and body.
async fn exchange<S>(mut stream: S, request: &str) -> Result<(u16, String)>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    stream.write_all(request.as_bytes()).await?;
    let mut bytes = Vec::new();
    match stream.read_to_end(&mut bytes).await {
        Ok(_) => {}
        // A TLS peer that closes without close_notify: the response is complete all the same.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !bytes.is_empty() => {}
        Err(e) => return Err(e.into()),
    }
    let response = String::from_utf8_lossy(&bytes).into_owned();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((status, body.to_string()))
}

/// The smallest bucket bound of the histogram `series` (`name`, or `name{labels}` for one of a
/// family) at or below which a share `quantile` of its observations lie: the quantile, rounded
/// up to a bucket.
pub fn histogram_bound(metrics: &str, series: &str, quantile: f64) -> Option<f64> {
    let (name, labels) = match series.split_once('{') {
        Some((name, labels)) => (name, labels.trim_end_matches('}')),
        None => (series, ""),
    };
    // prometheus-client writes `le` first: `name_bucket{le="1.0",check="x"} 3`.
    let (count, rest) = if labels.is_empty() {
        (format!("{name}_count"), "} ".to_string())
    } else {
        (format!("{name}_count{{{labels}}}"), format!(",{labels}}} "))
    };
    let count = metric_sample(metrics, &count)?;
    let prefix = format!("{name}_bucket{{le=\"");
    metrics.lines().find_map(|l| {
        let (bound, after) = l.strip_prefix(&prefix)?.split_once('"')?;
        let below: f64 = after.strip_prefix(&rest)?.parse().ok()?;
        (below >= quantile * count).then(|| bound.parse().unwrap_or(f64::INFINITY))
    })
}

/// The value of one series in a Prometheus text exposition, e.g. `name{check="x"}`.
pub fn metric_sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .split(' ')
            .next()?
            .parse()
            .ok()
    })
}

/// Scrapes `/metrics` at `addr` until `series` has the value `expected` (a write is seen by a
/// watch before the runtime has counted it), for at most [`DEFAULT_TIMEOUT`]; returns the
/// exposition that had it.
pub async fn wait_metric(
    addr: std::net::SocketAddr,
    series: &str,
    expected: f64,
) -> Result<String> {
    wait_metric_where(addr, series, &format!("{expected}"), |v| v == expected).await
}

/// [`wait_metric`] for a value that satisfies `cond` (described by `what`).
pub async fn wait_metric_where(
    addr: std::net::SocketAddr,
    series: &str,
    what: &str,
    cond: impl Fn(f64) -> bool,
) -> Result<String> {
    let deadline = tokio::time::Instant::now() + DEFAULT_TIMEOUT;
    loop {
        let (_, metrics) = http_get(addr, "/metrics").await?;
        let value = metric_sample(&metrics, series);
        if value.is_some_and(&cond) {
            return Ok(metrics);
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("{series} is {value:?} after {DEFAULT_TIMEOUT:?}, expected {what}:\n{metrics}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// POSTs `body` as JSON to `path` at `addr` (HTTP/1.1, plain); returns the status and body.
pub async fn http_post_json(
    addr: std::net::SocketAddr,
    path: &str,
    body: &serde_json::Value,
) -> Result<(u16, String)> {
    let body = serde_json::to_string(body)?;
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    http_exchange(addr, &request).await
}

/// A free loopback address for a runtime's HTTP endpoints.
pub fn free_local_address() -> Result<std::net::SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// Two free local addresses, told apart (one for metrics, one for probes): both are bound at
/// once before either is released, so the system cannot hand out the same port twice.
pub fn free_local_addresses() -> Result<(std::net::SocketAddr, std::net::SocketAddr)> {
    let first = std::net::TcpListener::bind("127.0.0.1:0")?;
    let second = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok((first.local_addr()?, second.local_addr()?))
}

/// A free local address other than `taken` (which the caller has already been given).
pub fn free_local_address_besides(taken: std::net::SocketAddr) -> Result<std::net::SocketAddr> {
    for _ in 0..10 {
        let addr = free_local_address()?;
        if addr != taken {
            return Ok(addr);
        }
    }
    bail!("no free local address other than {taken} after 10 tries")
}

/// [`eventually`] for a condition read from the cluster: polls `check` every 200 ms until it
/// answers `true`; an error ends the wait with that error.
pub async fn eventually_async(what: &str, check: impl AsyncFn() -> Result<bool>) -> Result<()> {
    eventually_within(what, DEFAULT_TIMEOUT, check).await
}

/// [`eventually_async`] with a bound of its own, for what takes longer than Kueue's reactions
/// (an autoscaler's consolidation, say).
pub async fn eventually_within(
    what: &str,
    within: Duration,
    check: impl AsyncFn() -> Result<bool>,
) -> Result<()> {
    let deadline = tokio::time::Instant::now() + within;
    while !check().await? {
        if tokio::time::Instant::now() >= deadline {
            bail!("timed out after {within:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// Applies the CustomResourceDefinition of `K` (as its binary's `--print-crd` prints it) and
/// waits until it is `Established`.
pub async fn install_crd<K: kube::CustomResourceExt>(env: &TestEnv) -> Result<()> {
    let crd = serde_json::to_value(K::crd())?;
    chart::apply(&env.client, &crd, "e2e").await?;
    wait_for(
        Api::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>::all(
            env.client.clone(),
        ),
        K::crd_name(),
        "Established",
        |crd| {
            crd.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            })
        },
    )
    .await?;
    Ok(())
}

/// Waits, for at most [`DEFAULT_TIMEOUT`], until `cond` holds for state kept in this test
/// process (what a test check recorded); the cluster is waited on with watches instead.
pub async fn eventually(what: &str, cond: impl Fn() -> bool) -> Result<()> {
    let deadline = tokio::time::Instant::now() + DEFAULT_TIMEOUT;
    while !cond() {
        if tokio::time::Instant::now() >= deadline {
            bail!("timed out after {DEFAULT_TIMEOUT:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// The annotation of a pod (or of a Job's pod template) that makes kwok end it successfully
/// this long after it started running (a Go duration, "30s"; see
/// `tests/control-plane/kwok-stages.yaml`). A pod of a Job without it runs until deleted.
pub const RUN_FOR_ANNOTATION: &str = "pod-complete.stage.kwok.x-k8s.io/delay";

/// The annotation of a pod (or of a Job's pod template) that makes kwok start it this long after
/// it was bound to its node (a Go duration), as a kubelet pulling an image would; without it a
/// pod starts at once.
pub const START_AFTER_ANNOTATION: &str = "kueue-admission-checks.dev/start-after";

/// The label the Job controller puts on a Job's pods, naming the Job.
pub const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";

/// Creates the kwok node `name` unless it exists: these labels, this `key=value:NoSchedule`
/// taint if any, and room for thousands of pods. kwok (started with the control plane) runs it
/// and the pods bound to it. Several tests may ask for it at once; the first create wins.
pub async fn ensure_standing_node(
    client: &Client,
    name: &str,
    labels: &[(&str, &str)],
    taint: Option<(&str, &str)>,
) -> Result<()> {
    let mut all_labels: serde_json::Map<String, serde_json::Value> = labels
        .iter()
        .map(|(k, v)| ((*k).into(), (*v).into()))
        .collect();
    all_labels.insert("kubernetes.io/hostname".into(), name.into());
    let taints: Vec<_> = taint
        .map(|(k, v)| json!({"key": k, "value": v, "effect": "NoSchedule"}))
        .into_iter()
        .collect();
    let room = json!({"cpu": "1000", "memory": "4Ti", "pods": "5000"});
    let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "labels": all_labels,
            "annotations": {"kwok.x-k8s.io/node": "fake"},
        },
        "spec": {"taints": taints},
        "status": {"allocatable": room, "capacity": room},
    }))?;
    match Api::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e).with_context(|| format!("creating the standing node {name}")),
    }
}

/// A pod's phase (`Pending` when it has none yet).
pub fn pod_phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

/// A pod in a few words: name, phase, node, and why it is not scheduled (if it is not).
pub fn describe_pod(pod: &Pod) -> String {
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or("no node");
    let unscheduled = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| {
            c.iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "False")
        })
        .map(|c| format!(" ({})", c.message.as_deref().unwrap_or_default()))
        .unwrap_or_default();
    format!(
        "{} {} on {node}{unscheduled}",
        pod.name_any(),
        pod_phase(pod)
    )
}

/// The pod template of every test workload: pods with these annotations, each one container
/// asking for `cpu`, run by kwok (the image is never pulled).
pub fn pod_template(annotations: serde_json::Value, cpu: &str) -> serde_json::Value {
    json!({
        "metadata": {"annotations": annotations},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "main",
                "image": "registry.invalid/kwok-runs-it:1",
                "resources": {"requests": {"cpu": cpu}},
            }],
        },
    })
}

/// A Workload owned by no Job (so it can be deleted without Kueue making it again) in
/// LocalQueue `lq`: one podset `main` of one pod of `template`, with these annotations.
pub fn standalone_workload(
    namespace: &str,
    name: &str,
    annotations: serde_json::Value,
    template: serde_json::Value,
) -> Result<Workload> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": {
            "queueName": "lq",
            "podSets": [{"name": "main", "count": 1, "template": template}],
        },
    }))?)
}

/// A client that can be cut like a crashed process's connection: once the flag is set every
/// new request fails, so nothing left of an aborted controller instance (its runtime's
/// background tasks outlive an aborted future) can still write.
pub fn severable_client(client: Client) -> (Client, std::sync::Arc<std::sync::atomic::AtomicBool>) {
    let cut = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = cut.clone();
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let (client, flag) = (client.clone(), flag.clone());
        async move {
            if flag.load(Ordering::SeqCst) {
                return Err(tower::BoxError::from(
                    "connection cut: this instance is dead",
                ));
            }
            client.send(req).await.map_err(tower::BoxError::from)
        }
    });
    (Client::new(service, "default"), cut)
}

/// Asserts the samples of a `/metrics` text: each `(name, extra labels, value)` is the series
/// `name{labels,extra}` (or `name{labels}` without extra labels).
pub fn assert_samples(metrics: &str, labels: &str, expected: &[(&str, &str, f64)]) {
    let series = |name: &str, extra: &str| match extra {
        "" => format!("{name}{{{labels}}}"),
        _ => format!("{name}{{{labels},{extra}}}"),
    };
    let seen: Vec<(String, Option<f64>)> = expected
        .iter()
        .map(|(name, extra, _)| {
            let s = series(name, extra);
            let value = metric_sample(metrics, &s);
            (s, value)
        })
        .collect();
    let want: Vec<(String, Option<f64>)> = expected
        .iter()
        .map(|(name, extra, value)| (series(name, extra), Some(*value)))
        .collect();
    assert_eq!(seen, want, "{metrics}");
}

/// Waits (bounded) until the object `name` no longer exists.
pub async fn wait_gone<K>(api: Api<K>, name: &str) -> Result<()>
where
    K: Resource + Clone + Debug + DeserializeOwned,
{
    let deadline = tokio::time::Instant::now() + DEFAULT_TIMEOUT;
    while let Some(obj) = api.get_opt(name).await? {
        if tokio::time::Instant::now() > deadline {
            bail!("{name} was not deleted: {:?}", obj.meta());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// Waits (bounded) until `read` returns `expected`; on a timeout the error shows the last
/// value read.
pub async fn eventually_equal<T: PartialEq + Debug>(
    what: &str,
    read: impl Fn() -> T,
    expected: T,
) -> Result<()> {
    let deadline = tokio::time::Instant::now() + DEFAULT_TIMEOUT;
    loop {
        let seen = read();
        if seen == expected {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "timed out after {DEFAULT_TIMEOUT:?} waiting for {what}: {seen:?}, expected {expected:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether `event` has this reason and is about the named object.
fn is_event_on(event: &k8s_openapi::api::events::v1::Event, name: &str, reason: &str) -> bool {
    event.reason.as_deref() == Some(reason)
        && event.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
}

/// A cluster-scoped Kueue object whose `Active` condition a test waits for.
pub trait HasActiveCondition:
    Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned + Send + Sync + 'static
{
    /// Its `Active` condition, if any controller wrote one.
    fn active(&self) -> Option<&Condition>;
}

impl HasActiveCondition for AdmissionCheck {
    fn active(&self) -> Option<&Condition> {
        self.active_condition()
    }
}

impl HasActiveCondition for ClusterQueue {
    fn active(&self) -> Option<&Condition> {
        let conditions = self.status.as_ref().map(|s| s.conditions.as_slice());
        kueue_admission_sdk::api::find_condition(conditions.unwrap_or_default(), "Active")
    }
}

impl TestEnv {
    /// Waits until the `Active` condition of the AdmissionCheck or ClusterQueue `name` has
    /// `status` and, if given, `reason`; returns the condition.
    pub async fn wait_active<K: HasActiveCondition>(
        &self,
        name: &str,
        status: &str,
        reason: Option<&str>,
    ) -> Result<Condition> {
        let matches = |c: &Condition| c.status == status && reason.is_none_or(|r| c.reason == r);
        let what = format!("Active={status} (reason {reason:?})");
        let api = Api::<K>::all(self.client.clone());
        let object = wait_for(api, name, &what, |k| k.active().is_some_and(matches)).await?;
        object.active().cloned().context("no Active condition")
    }

    /// Waits for an event with this reason on the Workload and returns its note.
    pub async fn event_note(&self, workload: &str, reason: &str) -> Result<String> {
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(self.client.clone(), &self.ns);
        let what = format!("event {reason} on Workload {workload}");
        let event = wait_for_any(events, &what, |e| is_event_on(e, workload, reason)).await?;
        Ok(event.note.unwrap_or_default())
    }

    /// Waits until at least `at_least` events with this reason are on the Workload (the SDK
    /// publishes Events beside its reconciles, so one may land just after the write it tells
    /// of); returns how many there are then.
    pub async fn wait_event_count(
        &self,
        workload: &str,
        reason: &str,
        at_least: u32,
    ) -> Result<u32> {
        let what = format!("{at_least} event(s) {reason} on Workload {workload}");
        eventually_async(&what, || async {
            Ok(self.event_count(workload, reason).await? >= at_least)
        })
        .await?;
        self.event_count(workload, reason).await
    }

    /// Events with this reason on the Workload so far (each counted with its series count).
    pub async fn event_count(&self, workload: &str, reason: &str) -> Result<u32> {
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(self.client.clone(), &self.ns);
        Ok(events
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|e| is_event_on(e, workload, reason))
            .map(|e| e.series.as_ref().map_or(1, |s| s.count.max(1) as u32))
            .sum())
    }
}

/// Gives back the quota Kueue still reserves for an evicted Workload `name` that nothing owns,
/// as its owner would (no-op once it holds none).
pub async fn release_quota(env: &TestEnv, name: &str) -> Result<()> {
    use kueue_admission_sdk::api::workload_condition as cond;
    let api = env.workloads();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let Some(mut wl) = api.get_opt(name).await.ok().flatten() else {
            if std::time::Instant::now() > deadline {
                bail!("cannot read it");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        if !(wl.condition_is_true(cond::EVICTED) && wl.condition_is_true(cond::QUOTA_RESERVED))
            || wl.condition_is_true(cond::FINISHED)
        {
            return Ok(());
        }
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        );
        let generation = wl.metadata.generation;
        if let Some(status) = wl.status.as_mut() {
            status.admission = None;
            for c in &mut status.conditions {
                let (reason, message) = match c.type_.as_str() {
                    cond::QUOTA_RESERVED => ("Pending", "the owner stopped after the eviction"),
                    cond::ADMITTED if c.status == "True" => {
                        ("NoReservation", "the quota was released")
                    }
                    _ => continue,
                };
                c.status = "False".into();
                c.reason = reason.into();
                c.message = message.into();
                c.last_transition_time = now.clone();
                c.observed_generation = generation;
            }
        }
        match api.replace_status(name, &PostParams::default(), &wl).await {
            Ok(_) => return Ok(()),
            Err(e) if matches!(&e, kube::Error::Api(s) if s.code == 404) => return Ok(()),
            Err(e) if std::time::Instant::now() > deadline => return Err(e.into()),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

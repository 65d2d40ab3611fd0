//! Test a check's decisions without a cluster.
//!
//! Build a Workload as Kueue would show it to the check, call the check, assert the decision:
//!
//! ```
//! use kueue_admission_sdk::api::CheckState;
//! use kueue_admission_sdk::testing::{WorkloadBuilder, decide_once};
//! use kueue_admission_sdk::{AdmissionCheckController, CheckContext, Decision, NoParameters};
//!
//! /// Admits workloads of at most 4 pods.
//! struct SmallJobsOnly;
//!
//! impl AdmissionCheckController for SmallJobsOnly {
//!     type Parameters = NoParameters;
//!     type Error = std::convert::Infallible;
//!     fn controller_name(&self) -> &str {
//!         "example.com/small-jobs-only"
//!     }
//!     async fn decide(&self, ctx: &CheckContext<'_, NoParameters>) -> Result<Decision, Self::Error> {
//!         let pods: i32 = ctx.workload.spec.pod_sets.iter().map(|p| p.count).sum();
//!         Ok(if pods <= 4 { Decision::ready("small enough") } else { Decision::rejected("too many pods") })
//!     }
//! }
//!
//! # tokio_test::block_on(async {
//! let wl = WorkloadBuilder::new("team-a", "job-1")
//!     .pod_set("main", 8, "1")
//!     .check("small", CheckState::Pending)
//!     .quota_reserved("cq", "default-flavor")
//!     .build();
//! let decision = decide_once(&SmallJobsOnly, &wl, "small", &NoParameters).await.unwrap();
//! assert_eq!(decision, Decision::rejected("too many pods"));
//! # });
//! ```
//!
//! To see what the runtime would write for a decision (the retry delay, the attempt in the
//! message, or a refusal), pass it to [`plan_once`] with the same Workload.
//!
//! A check that reads or writes through the API server (a ledger ConfigMap, a fresh Workload
//! read) runs against [`MemoryApi`], an API server in memory with the real one's versions and
//! conflicts, through [`decide_with_client`]; [`ScriptedApi`] answers each call as a test
//! scripts it, for the errors a real server rarely gives on cue.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use crate::api::{
    Admission, AdmissionCheckState, CheckState, PodSet, PodSetAssignment, Workload, WorkloadSpec,
    WorkloadStatus, workload_condition as cond,
};
use crate::check::{AdmissionCheckController, CheckContext, Decision};
use crate::decide::{Eligibility, Plan, PlanInput, Refusal, plan, status_apply_patch};
use crate::release::ReleaseReason;
use crate::retry::RetryPolicy;

mod memory_api;
pub use memory_api::MemoryApi;

/// Builds Workloads in the shapes Kueue gives them. Starts with no podsets, no checks, no quota
/// and `resourceVersion` "1".
#[derive(Clone, Debug)]
pub struct WorkloadBuilder {
    wl: Workload,
    now: Timestamp,
}

impl WorkloadBuilder {
    /// A Workload named `name` in `namespace`.
    pub fn new(namespace: &str, name: &str) -> Self {
        let mut wl = Workload::new(name, WorkloadSpec::default());
        wl.metadata.namespace = Some(namespace.into());
        wl.metadata.uid = Some(format!("uid-{namespace}-{name}"));
        wl.metadata.resource_version = Some("1".into());
        wl.status = Some(WorkloadStatus::default());
        Self {
            wl,
            now: Timestamp::UNIX_EPOCH,
        }
    }

    /// The time used for conditions and entries this builder adds (default: the Unix epoch).
    pub fn at(mut self, now: Timestamp) -> Self {
        self.now = now;
        self
    }

    fn status(&mut self) -> &mut WorkloadStatus {
        self.wl.status.get_or_insert_with(Default::default)
    }

    fn set_condition(&mut self, type_: &str, status: bool, reason: &str) {
        let now = self.now;
        let conditions = &mut self.status().conditions;
        conditions.retain(|c| c.type_ != type_);
        conditions.push(Condition {
            type_: type_.into(),
            status: if status { "True" } else { "False" }.into(),
            reason: reason.into(),
            message: String::new(),
            last_transition_time: Time(now),
            observed_generation: None,
        });
    }

    /// Adds a podset of `count` pods, each with one container requesting `cpu`.
    pub fn pod_set(mut self, name: &str, count: i32, cpu: &str) -> Self {
        let requests = BTreeMap::from([("cpu".to_string(), Quantity(cpu.into()))]);
        let container = Container {
            name: "main".into(),
            resources: Some(ResourceRequirements {
                requests: Some(requests),
                ..Default::default()
            }),
            ..Default::default()
        };
        let template = PodTemplateSpec {
            spec: Some(PodSpec {
                containers: vec![container],
                ..Default::default()
            }),
            ..Default::default()
        };
        self.wl.spec.pod_sets.push(PodSet {
            name: name.into(),
            template,
            count,
            min_count: None,
        });
        self
    }

    /// Adds (or replaces) the entry of a check in the given state, with an empty message.
    pub fn check(self, name: &str, state: CheckState) -> Self {
        let entry = AdmissionCheckState {
            name: name.into(),
            state,
            last_transition_time: Some(Time(self.now)),
            ..Default::default()
        };
        self.check_entry(entry)
    }

    /// Adds (or replaces) a check entry exactly as given.
    pub fn check_entry(mut self, entry: AdmissionCheckState) -> Self {
        let checks = &mut self.status().admission_checks;
        checks.retain(|c| c.name != entry.name);
        checks.push(entry);
        self
    }

    /// Sets Kueue's `retryCount` of a check's entry: the attempt decided is this plus one.
    pub fn retry_count(mut self, check: &str, count: i32) -> Self {
        if let Some(entry) = self
            .status()
            .admission_checks
            .iter_mut()
            .find(|c| c.name == check)
        {
            entry.retry_count = Some(count);
        }
        self
    }

    /// Quota reserved in `cluster_queue`, every podset's resources assigned to `flavor`.
    pub fn quota_reserved(mut self, cluster_queue: &str, flavor: &str) -> Self {
        let assignments = self
            .wl
            .spec
            .pod_sets
            .iter()
            .map(|ps| PodSetAssignment {
                name: ps.name.clone(),
                flavors: BTreeMap::from([("cpu".to_string(), flavor.to_string())]),
                resource_usage: BTreeMap::new(),
                count: Some(ps.count),
            })
            .collect();
        self.status().admission = Some(Admission {
            cluster_queue: cluster_queue.into(),
            pod_set_assignments: assignments,
        });
        self.set_condition(cond::QUOTA_RESERVED, true, "QuotaReserved");
        self
    }

    /// Admitted (quota reserved and every check Ready, as far as Kueue is concerned).
    pub fn admitted(mut self) -> Self {
        self.set_condition(cond::ADMITTED, true, "Admitted");
        self
    }

    /// Evicted for `reason` (e.g. `AdmissionCheck`, `Preempted`), quota still reserved: the
    /// moment between Kueue's eviction and the job integration releasing the quota.
    pub fn evicted(mut self, reason: &str) -> Self {
        self.set_condition(cond::EVICTED, true, reason);
        self
    }

    /// The job finished.
    pub fn finished(mut self) -> Self {
        self.set_condition(cond::FINISHED, true, "Succeeded");
        self
    }

    /// `spec.active: false`.
    pub fn deactivated(mut self) -> Self {
        self.wl.spec.active = Some(false);
        self
    }

    /// `metadata.resourceVersion` (default: `1`): what the runtime sends as the precondition of
    /// its writes and compares with what its cache holds.
    pub fn resource_version(mut self, version: &str) -> Self {
        self.wl.metadata.resource_version = Some(version.into());
        self
    }

    /// `metadata.uid` (default: derived from namespace and name).
    pub fn uid(mut self, uid: &str) -> Self {
        self.wl.metadata.uid = Some(uid.into());
        self
    }

    /// Adds an annotation (e.g. one the check reads its request from).
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        insert(&mut self.wl.metadata.annotations, key, value);
        self
    }

    /// Adds a label.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        insert(&mut self.wl.metadata.labels, key, value);
        self
    }

    /// Kueue counted `count` evictions for `reason` in `status.schedulingStats`.
    pub fn eviction_count(mut self, reason: &str, count: i32) -> Self {
        let stats = self
            .status()
            .scheduling_stats
            .get_or_insert_with(Default::default);
        stats.evictions.retain(|e| e.reason != reason);
        stats.evictions.push(crate::api::EvictionCount {
            reason: reason.into(),
            underlying_cause: String::new(),
            count,
        });
        self
    }

    /// `spec.maximumExecutionTimeSeconds`.
    pub fn maximum_execution_time_seconds(mut self, seconds: i32) -> Self {
        self.wl.spec.maximum_execution_time_seconds = Some(seconds);
        self
    }

    /// Any other change, for fields this builder has no method for.
    pub fn with(mut self, change: impl FnOnce(&mut Workload)) -> Self {
        change(&mut self.wl);
        self
    }

    /// The Workload.
    pub fn build(self) -> Workload {
        self.wl
    }
}

/// Sets `key` in a map of labels or annotations, which metadata leaves absent when empty.
fn insert(map: &mut Option<BTreeMap<String, String>>, key: &str, value: &str) {
    map.get_or_insert_with(Default::default)
        .insert(key.into(), value.into());
}

/// A check binary's flags `F` parsed from no arguments (its defaults), after asserting that
/// each argument of `refused` alone is refused. For a binary's own unit test of its flags:
///
/// ```
/// # #[derive(clap::Parser)] struct Flags { #[arg(long, default_value_t = 1,
/// #   value_parser = clap::value_parser!(u8).range(1..))] tries: u8 }
/// let defaults: Flags = kueue_admission_sdk::testing::defaults_refusing(&["--tries=0"]);
/// assert_eq!(defaults.tries, 1);
/// ```
pub fn defaults_refusing<F: clap::Parser>(refused: &[&str]) -> F {
    let accepted: Vec<&str> = refused
        .iter()
        .copied()
        .filter(|arg| F::try_parse_from(["binary", arg]).is_ok())
        .collect();
    assert!(
        accepted.is_empty(),
        "accepted, should be refused: {accepted:?}"
    );
    F::try_parse_from(["binary"]).unwrap_or_else(|e| panic!("the defaults do not parse: {e}"))
}

/// A ClusterQueue `name` with one resource group of `flavors` (cpu, no quota to speak of)
/// whose `admissionChecksStrategy` has one rule per `(check, onFlavors)` (an empty
/// `onFlavors`: every flavor of the queue): what decides which checks a Workload gets, for
/// tests of checks that start early.
pub fn cluster_queue(
    name: &str,
    flavors: &[&str],
    rules: &[(&str, &[&str])],
) -> crate::api::ClusterQueue {
    let resource_groups = vec![crate::api::ResourceGroup {
        covered_resources: vec!["cpu".into()],
        flavors: flavors
            .iter()
            .map(|f| crate::api::FlavorQuotas {
                name: (*f).into(),
                resources: vec![crate::api::ResourceQuota {
                    name: "cpu".into(),
                    nominal_quota: k8s_openapi::apimachinery::pkg::api::resource::Quantity(
                        "100".into(),
                    ),
                }],
            })
            .collect(),
    }];
    let rules = rules
        .iter()
        .map(|(check, flavors)| crate::api::AdmissionCheckStrategyRule {
            name: (*check).into(),
            on_flavors: flavors.iter().map(|f| (*f).into()).collect(),
        })
        .collect();
    crate::api::ClusterQueue::new(
        name,
        crate::api::ClusterQueueSpec {
            admission_checks_strategy: Some(crate::api::AdmissionChecksStrategy {
                admission_checks: rules,
            }),
            resource_groups,
            ..Default::default()
        },
    )
}

/// A client for unit tests: every request fails at once with an error saying there is no API
/// server, so a check that unexpectedly calls the API fails its test instead of hanging.
pub fn offline_client() -> kube::Client {
    let service = tower::service_fn(|_: http::Request<kube::client::Body>| async {
        Err::<http::Response<kube::client::Body>, _>(std::io::Error::other(
            "offline_client: unit tests have no API server",
        ))
    });
    kube::Client::new(service, "default")
}

/// An API server played from a script, for testing the code that talks to it (a check's
/// `release`, a backend, the runtime's writes) against every error it can answer with.
///
/// Each request gets the next scripted answer in order (a status code and a body, or a dropped
/// connection); a request with nothing scripted gets a 500 saying so. Events are accepted
/// without using an answer. Every request is recorded, so a test asserts what was sent, in which
/// order, with which body.
///
/// ```
/// use kueue_admission_sdk::testing::ScriptedApi;
/// use k8s_openapi::api::core::v1::ConfigMap;
///
/// # tokio_test::block_on(async {
/// let api = ScriptedApi::new();
/// api.fail(409, "AlreadyExists", "configmaps \"ledger\" already exists");
/// let maps: kube::Api<ConfigMap> = kube::Api::namespaced(api.client(), "team-a");
/// let err = maps.create(&Default::default(), &ConfigMap::default()).await.unwrap_err();
/// assert!(matches!(err, kube::Error::Api(s) if s.code == 409));
/// assert_eq!(api.calls(), ["POST /api/v1/namespaces/team-a/configmaps"]);
/// # });
/// ```
#[derive(Clone, Debug, Default)]
pub struct ScriptedApi {
    answers: std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<ScriptedAnswer>>>,
    seen: std::sync::Arc<std::sync::Mutex<Vec<SeenRequest>>>,
    /// Requests still to hold at the barrier set by [`ScriptedApi::together`], and the barrier.
    together: std::sync::Arc<std::sync::Mutex<Option<HeldTogether>>>,
}

/// Requests still to hold at a barrier, and the barrier.
type HeldTogether = (usize, std::sync::Arc<tokio::sync::Barrier>);

/// What the scripted server does with a request.
#[derive(Clone, Debug)]
enum ScriptedAnswer {
    Respond(u16, serde_json::Value),
    Drop,
}

/// A request as the scripted server saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct SeenRequest {
    /// `GET`, `POST`, `PATCH`, ...
    pub method: String,
    /// The URL path, without the query.
    pub path: String,
    /// The query string, if any (`fieldManager=...`, `labelSelector=...`).
    pub query: Option<String>,
    /// The body as JSON (`Null` when empty or not JSON).
    pub body: serde_json::Value,
    /// The `Content-Type` header: which kind of patch a `PATCH` is.
    pub content_type: Option<String>,
}

impl SeenRequest {
    fn is_event(&self) -> bool {
        self.path.contains("/events")
    }
}

/// An answer of an API server: `code` with `body` as JSON.
fn json_response(
    code: u16,
    body: &serde_json::Value,
) -> Result<http::Response<kube::client::Body>, kube::Error> {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    http::Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(kube::client::Body::from(bytes))
        .map_err(|e| kube::Error::Service(e.into()))
}

/// A `Status` body as the API server sends with an error.
pub fn status_body(code: u16, reason: &str, message: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Status", "status": "Failure",
        "code": code, "reason": reason, "message": message,
    })
}

impl ScriptedApi {
    /// A server with nothing scripted yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A client whose every request goes to this script.
    pub fn client(&self) -> kube::Client {
        use http_body_util::BodyExt;
        let (answers, seen, together) = (
            self.answers.clone(),
            self.seen.clone(),
            self.together.clone(),
        );
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let (answers, seen, together) = (answers.clone(), seen.clone(), together.clone());
            async move {
                let method = req.method().to_string();
                let path = req.uri().path().to_string();
                let query = req.uri().query().map(String::from);
                let content_type = req
                    .headers()
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .map(String::from);
                let bytes = req.into_body().collect().await?.to_bytes();
                let body = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
                let request = SeenRequest {
                    method,
                    path,
                    query,
                    body,
                    content_type,
                };
                let answer = if request.is_event() {
                    ScriptedAnswer::Respond(201, request.body.clone())
                } else {
                    let barrier = {
                        let mut held = together.lock().unwrap_or_else(|p| p.into_inner());
                        let barrier = held.as_ref().map(|(_, b)| b.clone());
                        if let Some((left, _)) = held.as_mut() {
                            *left -= 1;
                            if *left == 0 {
                                *held = None;
                            }
                        }
                        barrier
                    };
                    if let Some(barrier) = barrier {
                        barrier.wait().await;
                    }
                    let next = answers
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .pop_front();
                    next.unwrap_or_else(|| {
                        ScriptedAnswer::Respond(
                            500,
                            status_body(
                                500,
                                "InternalError",
                                "no answer scripted for this request",
                            ),
                        )
                    })
                };
                seen.lock().unwrap_or_else(|p| p.into_inner()).push(request);
                let (code, body) = match answer {
                    ScriptedAnswer::Respond(code, body) => (code, body),
                    ScriptedAnswer::Drop => {
                        return Err(kube::Error::Service(
                            "connection reset by the scripted server".into(),
                        ));
                    }
                };
                json_response(code, &body)
            }
        });
        kube::Client::new(service, "default")
    }

    /// The next `n` requests (Events aside) are answered only once all `n` have arrived, each
    /// then taking the next scripted answer. Code that sends them one after another never gets
    /// past the first: bounded by a timeout, a test shows they were sent at once.
    pub fn together(&self, n: usize) {
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(n));
        *self.together.lock().unwrap_or_else(|p| p.into_inner()) = (n > 0).then_some((n, barrier));
    }

    /// The next request gets `code` with `body` (an object, for a success).
    pub fn answer(&self, code: u16, body: impl serde::Serialize) {
        let body = serde_json::to_value(body).unwrap_or(serde_json::Value::Null);
        self.push(ScriptedAnswer::Respond(code, body));
    }

    /// The next request fails with `code`, a [`status_body`] of `reason` and `message`.
    pub fn fail(&self, code: u16, reason: &str, message: &str) {
        self.push(ScriptedAnswer::Respond(
            code,
            status_body(code, reason, message),
        ));
    }

    /// The next request gets no answer: the connection drops.
    pub fn drop_connection(&self) {
        self.push(ScriptedAnswer::Drop);
    }

    fn push(&self, answer: ScriptedAnswer) {
        self.answers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(answer);
    }

    /// Answers scripted but not used yet.
    pub fn unused(&self) -> usize {
        self.answers.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Every request but Events, in order.
    pub fn requests(&self) -> Vec<SeenRequest> {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.iter().filter(|r| !r.is_event()).cloned().collect()
    }

    /// The Events sent, in order.
    pub fn events(&self) -> Vec<SeenRequest> {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.iter().filter(|r| r.is_event()).cloned().collect()
    }

    /// The `reason` of every Event sent.
    pub fn event_reasons(&self) -> Vec<String> {
        self.events()
            .iter()
            .map(|e| e.body["reason"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    /// Every request but Events, as `METHOD path`.
    pub fn calls(&self) -> Vec<String> {
        self.requests()
            .iter()
            .map(|r| format!("{} {}", r.method, r.path))
            .collect()
    }
}

/// Calls `controller.decide` once for the entry of `check` on `workload`, at the time of the
/// Workload's newest condition (or the epoch), with an [`offline_client`].
///
/// # Panics
/// If the Workload has no entry for `check`: a test setup error.
pub async fn decide_once<C: AdmissionCheckController>(
    controller: &C,
    workload: &Workload,
    check: &str,
    parameters: &C::Parameters,
) -> Result<Decision, C::Error> {
    decide_with_client(controller, &offline_client(), workload, check, parameters).await
}

/// [`decide_once`] with `client` as the check's client: a [`MemoryApi`]'s, for a check that
/// reads or writes through the API server.
///
/// # Panics
/// If the Workload has no entry for `check`: a test setup error.
pub async fn decide_with_client<C: AdmissionCheckController>(
    controller: &C,
    client: &kube::Client,
    workload: &Workload,
    check: &str,
    parameters: &C::Parameters,
) -> Result<Decision, C::Error> {
    #[allow(clippy::expect_used)] // documented: a broken test setup
    let entry = workload
        .admission_check(check)
        .expect("the workload has an entry for the check");
    let ctx = CheckContext {
        workload,
        entry,
        parameters,
        client,
        now: decision_time(workload),
        shadow: None,
    };
    controller.decide(&ctx).await
}

/// The time [`decide_once`] and [`plan_once`] decide at: the Workload's newest condition, or the
/// epoch.
fn decision_time(workload: &Workload) -> Timestamp {
    workload
        .conditions()
        .iter()
        .map(|c| c.last_transition_time.0)
        .max()
        .unwrap_or(Timestamp::UNIX_EPOCH)
}

/// What the runtime knows besides the Workload and the decision when it plans a write, for
/// [`plan_once`]. The default is the runtime's: Kueue's retry policy, a delay ceiling of a day,
/// no revalidation, the time [`decide_once`] decides at, no jitter.
#[derive(Clone, Debug)]
pub struct PlanSettings {
    /// The check's retry policy ([`AdmissionCheckController::retry_policy`]).
    pub policy: RetryPolicy,
    /// The longest retry delay written (`--max-retry-delay-seconds`).
    pub max_retry_delay: Duration,
    /// Whether the check revalidates `Ready` entries ([`AdmissionCheckController::revalidate`]).
    pub revalidate_ready: bool,
    /// The time of the decision; `None`: the Workload's newest condition, as in [`decide_once`].
    pub now: Option<Timestamp>,
    /// A sample in `[0, 1)` for the policy's jitter; the runtime draws one at random.
    pub jitter_sample: f64,
}

impl Default for PlanSettings {
    fn default() -> Self {
        Self {
            policy: RetryPolicy::default(),
            max_retry_delay: crate::retry::DEFAULT_MAX_RETRY_DELAY,
            revalidate_ready: false,
            now: None,
            jitter_sample: 0.0,
        }
    }
}

/// What the runtime does with a decision, from [`plan_once`].
#[derive(Clone, Debug, PartialEq)]
pub enum Planned {
    /// It writes this.
    Write(PlannedWrite),
    /// The entry already says this: nothing is written.
    Unchanged {
        /// The check is asked again after this long (a `Pending` that asked for it).
        recheck_after: Option<Duration>,
    },
    /// The Workload, as read, does not need the check now (it does not hold quota, is evicted,
    /// finished, deactivated or deleted, or has no entry for it): nothing is written, and what
    /// the check gave it is released for this reason.
    NotNeeded(ReleaseReason),
    /// The entry holds an answer Kueue has yet to act on (`Retry`, `Rejected`, or `Ready`
    /// without revalidation): nothing is written.
    AlreadyAnswered(CheckState),
    /// Kueue would not take the decision (a podSetUpdate for a podset the Workload does not
    /// have, a node selector value that is no label value, say): it is not written; the
    /// runtime writes the reason on the entry instead, as for a permanent failure (held, then
    /// `Retry`, `Rejected` past the limit). While revalidating a `Ready` entry it reports the
    /// reason in an `InvalidDecision` Event and asks again with backoff.
    Invalid(String),
}

/// A status write the runtime would send, from [`plan_once`].
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedWrite {
    /// The whole entry: state, message (for a `Retry`, with the attempt and the time of the
    /// next one), `lastTransitionTime`, `requeueAfterSeconds`, `podSetUpdates`; never Kueue's
    /// `retryCount`.
    pub entry: AdmissionCheckState,
    /// The attempt answered, 1 for the first ([`crate::attempts::attempt`] of the Workload).
    pub attempt: u32,
    /// The check answered `Retry` past the policy's retry limit, so `Rejected` is written.
    pub gave_up: bool,
    /// For a `Retry` whose delay was cut to the ceiling: the delay asked for.
    pub clamped_from: Option<Duration>,
    /// The check is asked again after this long (a `Pending` that asked for it).
    pub recheck_after: Option<Duration>,
    /// The server-side apply sent to the Workload's status: its identity, the
    /// `resourceVersion` it was read at (so the API server refuses the write if the Workload
    /// changed since) and this entry alone. `None` for a Workload without a
    /// `resourceVersion`: the runtime never writes unconditionally.
    pub status_apply: Option<serde_json::Value>,
}

/// What the runtime would write for `decision` of `check` on `workload` (as read), with the
/// attempt counted from the Workload as the runtime counts it: the retry delay and message, the
/// retry limit turning `Retry` into `Rejected`, or why nothing is written.
///
/// ```
/// use std::time::Duration;
/// use kueue_admission_sdk::Decision;
/// use kueue_admission_sdk::api::CheckState;
/// use kueue_admission_sdk::testing::{PlanSettings, Planned, WorkloadBuilder, plan_once};
///
/// let wl = WorkloadBuilder::new("team-a", "job-1")
///     .at("2026-11-22T12:00:00Z".parse().unwrap())
///     .pod_set("main", 2, "1")
///     .check("budget", CheckState::Pending)
///     .quota_reserved("cq", "default-flavor")
///     .build();
/// let retry = Decision::retry_after("over budget", Duration::from_secs(90));
/// let Planned::Write(w) = plan_once(&wl, "budget", retry, &PlanSettings::default()) else {
///     panic!("a Workload holding quota with a Pending entry is answered");
/// };
/// assert_eq!(w.entry.state, CheckState::Retry);
/// assert_eq!(w.entry.requeue_after_seconds, Some(90));
/// assert_eq!(
///     w.entry.message,
///     "over budget (attempt 1 of 4; next attempt not before 2026-11-22T12:01:30Z)"
/// );
/// ```
pub fn plan_once(
    workload: &Workload,
    check: &str,
    decision: Decision,
    settings: &PlanSettings,
) -> Planned {
    let planned = plan(PlanInput {
        workload,
        check,
        decision,
        attempt: crate::attempts::attempt(workload, check),
        policy: &settings.policy,
        max_retry_delay: settings.max_retry_delay,
        revalidate_ready: settings.revalidate_ready,
        now: settings.now.unwrap_or_else(|| decision_time(workload)),
        jitter_sample: settings.jitter_sample,
    });
    match planned {
        Plan::Write(w) => Planned::Write(PlannedWrite {
            status_apply: status_apply_patch(workload, &w.entry),
            entry: w.entry,
            attempt: w.attempt,
            gave_up: w.gave_up,
            clamped_from: w.clamped_from,
            recheck_after: w.recheck_after,
        }),
        Plan::Unchanged { recheck_after } => Planned::Unchanged { recheck_after },
        Plan::Refused(Refusal::NotEligible(Eligibility::Idle(reason))) => {
            Planned::NotNeeded(reason)
        }
        Plan::Refused(Refusal::NotEligible(Eligibility::Wait(state))) => {
            Planned::AlreadyAnswered(state)
        }
        // `plan` refuses only a Workload that may not be answered, and judges one without the
        // entry idle (it knows no ClusterQueue).
        Plan::Refused(Refusal::NotEligible(Eligibility::Decide { .. } | Eligibility::Early)) => {
            unreachable!("plan refused an eligible Workload")
        }
        Plan::Refused(Refusal::InvalidDecision(why)) => Planned::Invalid(why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::ResourceExt;

    fn noon() -> Timestamp {
        "2026-11-22T12:00:00Z".parse().expect("timestamp")
    }

    /// Holds quota with the entry of check `c` Pending, every condition at [`noon`].
    fn deciding() -> WorkloadBuilder {
        WorkloadBuilder::new("team-a", "wl")
            .at(noon())
            .pod_set("main", 1, "1")
            .check("c", CheckState::Pending)
            .quota_reserved("cq", "f")
    }

    fn planned_write(planned: Planned) -> PlannedWrite {
        match planned {
            Planned::Write(w) => w,
            other => panic!("expected a write, got {other:?}"),
        }
    }

    #[test]
    fn plan_once_gives_the_write_the_runtime_would_send() {
        let defaults = PlanSettings::default();
        let wl = deciding().build();
        let w = planned_write(plan_once(&wl, "c", Decision::ready("ok"), &defaults));
        assert_eq!(w.entry.state, CheckState::Ready);
        assert_eq!(
            w.entry.last_transition_time,
            Some(Time(noon())),
            "decided at the newest condition, as decide_once"
        );
        assert_eq!(w.attempt, 1);
        let body = w.status_apply.expect("read from the API server");
        assert_eq!(body["metadata"]["resourceVersion"], "1");
        assert_eq!(body["status"]["admissionChecks"][0]["message"], "ok");
        let unread = deciding().with(|wl| wl.metadata.resource_version = None);
        let w = planned_write(plan_once(
            &unread.build(),
            "c",
            Decision::ready("ok"),
            &defaults,
        ));
        assert_eq!(w.status_apply, None, "never an unconditioned write");

        let last = deciding().retry_count("c", 3).build();
        let w = planned_write(plan_once(&last, "c", Decision::retry("again"), &defaults));
        assert_eq!(
            (w.entry.state, w.attempt, w.gave_up),
            (CheckState::Rejected, 4, true)
        );

        let short_ceiling = PlanSettings {
            max_retry_delay: Duration::from_secs(60),
            now: Some(noon()),
            ..PlanSettings::default()
        };
        let two_hours = Decision::retry_after("later", Duration::from_secs(7200));
        let w = planned_write(plan_once(&wl, "c", two_hours, &short_ceiling));
        assert_eq!(w.entry.requeue_after_seconds, Some(60));
        assert_eq!(w.clamped_from, Some(Duration::from_secs(7200)));
    }

    #[test]
    fn plan_once_says_why_nothing_is_written() {
        let defaults = PlanSettings::default();
        let again = Decision::pending_recheck_after("", Duration::from_secs(30));
        assert_eq!(
            plan_once(&deciding().build(), "c", again, &defaults),
            Planned::Unchanged {
                recheck_after: Some(Duration::from_secs(30))
            }
        );
        let evicted = deciding().evicted("Preempted").build();
        assert_eq!(
            plan_once(&evicted, "c", Decision::ready("ok"), &defaults),
            Planned::NotNeeded(ReleaseReason::Evicted)
        );
        let answered = deciding().check("c", CheckState::Retry).build();
        assert_eq!(
            plan_once(&answered, "c", Decision::ready("ok"), &defaults),
            Planned::AlreadyAnswered(CheckState::Retry)
        );
        let unknown_pod_set = crate::api::PodSetUpdate {
            name: "nope".into(),
            ..Default::default()
        };
        let invalid = Decision::ready_with_updates("ok", vec![unknown_pod_set]);
        match plan_once(&deciding().build(), "c", invalid, &defaults) {
            Planned::Invalid(why) => assert!(why.contains("\"nope\""), "{why}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn setters_shape_the_workload_the_way_the_api_helpers_read_it() {
        let wl = WorkloadBuilder::new("team", "wl")
            .uid("u-1")
            .annotation("example.com/licenses", "matlab=1")
            .label("team", "a")
            .eviction_count("AdmissionCheck", 2)
            .eviction_count("Preempted", 1)
            .eviction_count("AdmissionCheck", 3)
            .maximum_execution_time_seconds(600)
            .with(|wl| wl.spec.priority = Some(7))
            .build();
        assert_eq!(wl.uid().as_deref(), Some("u-1"));
        assert_eq!(wl.annotations()["example.com/licenses"], "matlab=1");
        assert_eq!(wl.labels()["team"], "a");
        assert_eq!(wl.evictions("AdmissionCheck"), 3);
        assert_eq!(wl.total_evictions(), 4);
        assert_eq!(wl.spec.maximum_execution_time_seconds, Some(600));
        assert_eq!(wl.spec.priority, Some(7));
    }

    #[test]
    fn eviction_counts_saturate_instead_of_overflowing() {
        // Found by fuzzing: the sums panicked in debug builds and wrapped in release builds.
        let wl = WorkloadBuilder::new("ns", "wl")
            .eviction_count("AdmissionCheck", i32::MAX)
            .eviction_count("Preempted", i32::MAX)
            .with(|wl| {
                let stats = wl.status.as_mut().and_then(|s| s.scheduling_stats.as_mut());
                stats
                    .expect("stats")
                    .evictions
                    .push(crate::api::EvictionCount {
                        reason: "AdmissionCheck".into(),
                        underlying_cause: "Other".into(),
                        count: 5,
                    });
            })
            .build();
        assert_eq!(wl.total_evictions(), i32::MAX);
        assert_eq!(wl.evictions("AdmissionCheck"), i32::MAX);
    }
}

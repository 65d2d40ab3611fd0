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
//! message, or a refusal), pass it to [`crate::decide::plan`] with the same Workload.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use crate::api::{
    Admission, AdmissionCheckState, CheckState, PodSet, PodSetAssignment, Workload, WorkloadSpec,
    WorkloadStatus, workload_condition as cond,
};
use crate::check::{AdmissionCheckController, CheckContext};

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
        self.wl
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(key.into(), value.into());
        self
    }

    /// Adds a label.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.wl
            .metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(key.into(), value.into());
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
}

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
        let (answers, seen) = (self.answers.clone(), self.seen.clone());
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let (answers, seen) = (answers.clone(), seen.clone());
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
                http::Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(
                        serde_json::to_vec(&body).unwrap_or_default(),
                    ))
                    .map_err(|e| kube::Error::Service(e.into()))
            }
        });
        kube::Client::new(service, "default")
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
) -> Result<crate::check::Decision, C::Error> {
    #[allow(clippy::expect_used)] // documented: a broken test setup
    let entry = workload
        .admission_check(check)
        .expect("the workload has an entry for the check");
    let conditions = workload
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let now = conditions
        .iter()
        .map(|c| c.last_transition_time.0)
        .max()
        .unwrap_or(Timestamp::UNIX_EPOCH);
    let client = offline_client();
    let ctx = CheckContext {
        workload,
        entry,
        parameters,
        client: &client,
        now,
        shadow: None,
    };
    controller.decide(&ctx).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::ResourceExt;

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

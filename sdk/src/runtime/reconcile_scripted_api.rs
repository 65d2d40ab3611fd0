//! The reconcile's write path against a scripted API server: every request the runtime sends is
//! answered the way a test says (a status, a body), and recorded. Deterministic, in
//! milliseconds: the races of a loaded machine (a cache behind the runtime's own write, a 409
//! whose fresh read shows that write, Kueue moving on meanwhile) are set up exactly.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::reflector;

use crate::runtime::check_registry::ActiveCheck;
use crate::runtime::line::Class;
use crate::runtime::own_writes::OwnWrites;
use crate::runtime::{config::RuntimeConfig, metrics::Metrics};
use kube::runtime::controller::Action;

use super::{Context, reconcile_pair};
use crate::api::{AdmissionCheckState, CheckState, Workload};
use crate::check::{
    AdmissionCheckController, CheckContext, Decision, NoParameters, ReleaseContext, ReleaseReason,
};
use crate::retry::RetryPolicy;
use crate::testing::{ScriptedApi, SeenRequest, WorkloadBuilder};

const CHECK: &str = "probe";

/// The scripted "status" of a request the server drops without an answer.
const DROP: u16 = 0;

/// A check that answers `answer`, counts how often it was asked and records its releases.
struct Probe {
    answer: Decision,
    asked: AtomicU32,
    revalidate: bool,
    released: std::sync::Mutex<Vec<(String, ReleaseReason)>>,
    /// How many of the next releases fail (the backend the check keeps holdings in is down).
    failing_releases: AtomicU32,
}

/// The answer of [`Probe`] that stands for "retry at the next whole minute": computed from
/// `ctx.now`, as a budget check computes "until midnight".
const UNTIL_NEXT_MINUTE: &str = "until the next minute";

/// The answer of [`Probe`] that stands for "fail transiently, quoting values back", as an API
/// error quotes the value it refused.
const FAIL_QUOTING: &str = "fail quoting";

/// The answer of [`Probe`] that stands for "the API server refused this controller a request
/// it needs" (RBAC's 403).
const NOT_PERMITTED: &str = "fail not permitted";

/// What the API server says when RBAC refuses the request.
const RBAC_SAYS: &str = r#"provisioningrequests.autoscaling.x-k8s.io is forbidden: User "system:serviceaccount:ns:sa" cannot create resource "provisioningrequests" in API group "autoscaling.x-k8s.io" in the namespace "ns""#;

impl Probe {
    /// How often the check was asked.
    fn asked(&self) -> u32 {
        self.asked.load(Ordering::SeqCst)
    }

    /// The releases so far: check and reason.
    fn released(&self) -> Vec<(String, ReleaseReason)> {
        self.released
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl AdmissionCheckController for Probe {
    type Parameters = NoParameters;
    type Error = std::io::Error;

    fn controller_name(&self) -> &str {
        "example.com/probe"
    }

    fn revalidate(&self) -> crate::check::Revalidate {
        if self.revalidate {
            crate::check::Revalidate::OnChange
        } else {
            crate::check::Revalidate::Never
        }
    }

    async fn decide(
        &self,
        ctx: &CheckContext<'_, NoParameters>,
    ) -> Result<Decision, std::io::Error> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        if self.answer.message() == NOT_PERMITTED {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                RBAC_SAYS,
            ));
        }
        if self.answer.message() == FAIL_QUOTING {
            return Err(std::io::Error::other(
                "the ledger said \"hunter2\" and 'swordfish' for workload \"wl\"",
            ));
        }
        if self.answer.message() == UNTIL_NEXT_MINUTE {
            let minute = (ctx.now.as_second() / 60 + 1) * 60;
            let next = k8s_openapi::jiff::Timestamp::from_second(minute).unwrap_or(ctx.now);
            let left = Duration::try_from(next.duration_since(ctx.now)).unwrap_or_default();
            return Ok(Decision::retry_after(UNTIL_NEXT_MINUTE, left));
        }
        Ok(self.answer.clone())
    }

    fn classify_error(&self, error: &std::io::Error) -> crate::check::ErrorClass {
        match error.kind() {
            std::io::ErrorKind::PermissionDenied => {
                crate::check::ErrorClass::of_status(403, "Forbidden", &error.to_string())
            }
            _ => crate::check::ErrorClass::of(error),
        }
    }

    async fn release(&self, ctx: &ReleaseContext<'_>) -> Result<(), std::io::Error> {
        let failing = self.failing_releases.load(Ordering::SeqCst);
        if failing > 0 {
            self.failing_releases.store(failing - 1, Ordering::SeqCst);
            return Err(std::io::Error::other("the ledger is unreachable"));
        }
        self.released
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((ctx.check_name.to_string(), ctx.reason));
        Ok(())
    }
}

struct Harness {
    ctx: Context<Probe>,
    active: ActiveCheck<NoParameters>,
    api: ScriptedApi,
}

impl Harness {
    fn new(answer: Decision) -> Self {
        Self::with(answer, false)
    }

    fn with(answer: Decision, revalidate: bool) -> Self {
        Self::configured(answer, revalidate, |_| {})
    }

    /// A harness whose runtime configuration `tune` changes.
    fn configured(
        answer: Decision,
        revalidate: bool,
        tune: impl FnOnce(&mut RuntimeConfig),
    ) -> Self {
        let api = ScriptedApi::new();
        let client = api.client();
        let (store, _writer) = reflector::store::<Workload>();
        let names: Arc<dyn Fn() -> Vec<String> + Send + Sync> =
            Arc::new(|| vec![CHECK.to_string()]);
        let metrics = Arc::new(Metrics::new(
            &mut prometheus_client::registry::Registry::default(),
            store,
            names,
        ));
        metrics.check_active(CHECK, true);
        let mut config = RuntimeConfig {
            field_manager: "test".into(),
            ..Default::default()
        };
        tune(&mut config);
        let ctx = Context::new(
            client.clone(),
            Arc::new(Probe {
                answer,
                asked: AtomicU32::new(0),
                revalidate,
                released: Default::default(),
                failing_releases: AtomicU32::new(0),
            }),
            Arc::default(),
            &config,
            metrics,
            Arc::new(OwnWrites::default()),
        );
        let active = ActiveCheck {
            parameters: NoParameters,
            policy: RetryPolicy::default(),
            message: String::new(),
        };
        Self { ctx, active, api }
    }

    /// The harness's context with its check registered and `cache` as the runtime's Workload
    /// cache, for whole reconciles; and its scripted API.
    fn reconciling(
        answer: Decision,
        cache: reflector::Store<Workload>,
    ) -> (Arc<Context<Probe>>, ScriptedApi) {
        let h = Self::new(answer);
        h.register();
        let Self { ctx, api, .. } = h;
        (Arc::new(ctx.with_cache(cache)), api)
    }

    /// Puts the harness's check in its context's registry, as the AdmissionCheck loop would.
    fn register(&self) {
        self.ctx
            .registry
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(CHECK.to_string(), Ok(Arc::new(self.active.clone())));
    }

    fn answer(&self, code: u16, body: serde_json::Value) {
        if code == DROP {
            self.api.drop_connection();
        } else {
            self.api.answer(code, body);
        }
    }

    /// The next request fails with `code`, a `Status` of `reason` and `message`.
    fn fail(&self, code: u16, reason: &str, message: &str) {
        self.api.fail(code, reason, message);
    }

    /// The next request finds the Workload deleted.
    fn workload_gone(&self) {
        self.fail(404, "NotFound", "workloads \"wl\" not found");
    }

    /// The next request is a 404 although the Workload exists (a missing subresource, say).
    fn resource_not_found(&self) {
        self.fail(
            404,
            "NotFound",
            "the server could not find the requested resource",
        );
    }

    /// The next request is refused as invalid at `field`, as a podSetUpdate the API server
    /// does not accept.
    fn invalid(&self, field: &str) {
        self.fail(422, "Invalid", &format!("{field}: Invalid value"));
    }

    fn conflict(&self) {
        self.fail(409, "Conflict", "the object has been modified");
    }

    fn asked(&self) -> u32 {
        self.ctx.controller.asked()
    }

    /// Every request, Events included.
    fn requests(&self) -> Vec<SeenRequest> {
        let mut all = self.api.requests();
        all.extend(self.api.events());
        all
    }

    /// Requests other than Events.
    fn api_requests(&self) -> Vec<SeenRequest> {
        self.api.requests()
    }

    /// The `resourceVersion` the write at `index` of [`Self::api_requests`] was conditioned on.
    fn conditioned_on(&self, index: usize) -> String {
        let request = &self.api_requests()[index];
        let version = request.body["metadata"]["resourceVersion"].as_str();
        version.unwrap_or_default().to_string()
    }

    /// Requests other than Events, as `METHOD status|workload`.
    fn calls(&self) -> Vec<String> {
        self.api
            .requests()
            .iter()
            .map(|s| {
                let end = if s.path.ends_with("/status") {
                    "status"
                } else {
                    "workload"
                };
                format!("{} {end}", s.method)
            })
            .collect()
    }

    fn events(&self) -> Vec<String> {
        self.api.event_reasons()
    }

    /// Whether an Event of `reason` was sent.
    fn sent_event(&self, reason: &str) -> bool {
        self.events().iter().any(|r| r == reason)
    }

    async fn decide(&self, wl: &Workload) -> Result<Option<Duration>, crate::error::Error> {
        let uid = wl.uid().expect("a uid");
        let answering = crate::lifecycle::Answering::Yes;
        reconcile_pair(&self.ctx, wl, &uid, CHECK, answering, Some(&self.active)).await
    }
}

fn at(rv: &str, b: WorkloadBuilder) -> Workload {
    b.resource_version(rv).build()
}

fn deciding() -> WorkloadBuilder {
    WorkloadBuilder::new("ns", "wl")
        .pod_set("main", 1, "1")
        .check(CHECK, CheckState::Pending)
        .quota_reserved("cq", "flavor")
}

/// Kueue touched only its own status fields (`requeueState`): same attempt, same inputs.
fn with_kueues_bookkeeping(b: WorkloadBuilder) -> WorkloadBuilder {
    b.with(|w| {
        if let Some(s) = w.status.as_mut() {
            s.requeue_state = Some(Default::default());
        }
    })
}

fn json(wl: &Workload) -> serde_json::Value {
    serde_json::to_value(wl).unwrap_or_default()
}

#[tokio::test]
async fn a_cache_behind_the_runtimes_own_write_does_not_ask_the_check_again() {
    let h = Harness::new(Decision::ready("fine"));
    let t0 = tokio::time::Instant::now();
    // The runtime wrote at rv 11; the cache still has rv 10, where the entry is Pending.
    h.ctx.own_writes.wrote("uid-ns-wl", CHECK, "11".into(), t0);
    let wait = h.decide(&at("10", deciding())).await.expect("no error");
    assert!(wait.is_some(), "looks again once the write is due");
    assert_eq!(h.asked(), 0, "the check was asked about a stale Workload");
    assert!(h.calls().is_empty(), "{:?}", h.calls());

    // The watch delivers rv 11 (and Kueue's rv 12 after it): now the check is asked.
    h.ctx.own_writes.seen("uid-ns-wl", "11", t0);
    h.answer(200, json(&at("13", deciding())));
    h.decide(&at("12", deciding())).await.expect("no error");
    assert_eq!(h.asked(), 1);
    assert_eq!(h.calls(), ["PATCH status"]);
    assert!(
        h.ctx
            .own_writes
            .wait_for("uid-ns-wl", CHECK, Some("12"), t0)
            .is_some(),
        "the new write (rv 13) is awaited in its turn"
    );
}

#[tokio::test]
async fn without_normal_events_an_answer_publishes_only_warnings() {
    for (answer, state, published) in [
        (Decision::ready("fine"), CheckState::Ready, None),
        (
            Decision::rejected("never"),
            CheckState::Rejected,
            Some("CheckRejected"),
        ),
    ] {
        let h = Harness::configured(answer, false, |c| c.normal_events = false);
        let written = deciding().with(|w| {
            if let Some(s) = w.status.as_mut() {
                s.admission_checks = vec![our_entry(state, "written")];
            }
        });
        h.answer(200, json(&at("11", written)));
        h.decide(&at("10", deciding())).await.expect("no error");
        assert_eq!(h.calls(), ["PATCH status"], "{state:?}");
        let expected: Vec<String> = published.into_iter().map(String::from).collect();
        assert_eq!(h.events(), expected, "{state:?}");
    }
    // By default the Ready is announced too.
    let h = Harness::new(Decision::ready("fine"));
    h.answer(200, json(&at("11", deciding())));
    h.decide(&at("10", deciding())).await.expect("no error");
    assert_eq!(h.events(), ["CheckReady"]);
}

/// Our check's entry in `state` with `message`.
fn our_entry(state: CheckState, message: &str) -> AdmissionCheckState {
    AdmissionCheckState {
        name: CHECK.into(),
        state,
        message: message.into(),
        ..Default::default()
    }
}

fn with_record(b: WorkloadBuilder, value: &str) -> WorkloadBuilder {
    b.annotation(&crate::attempts::annotation_key(CHECK), value)
}

#[tokio::test]
async fn a_conflict_whose_fresh_read_shows_our_own_answer_is_already_written() {
    let h = Harness::new(Decision::retry_after("busy", Duration::from_secs(40)));
    // The cache is behind our own earlier Retry (its remembered write expired): the attempt
    // record, carrying the stale resourceVersion, is refused, and the fresh read shows this
    // attempt already answered.
    h.conflict();
    let answered = with_record(deciding(), "retries=1,evictions=0")
        .check_entry(our_entry(CheckState::Retry, "busy (attempt 1 of 4; ...)"));
    h.answer(200, json(&at("12", answered)));
    let next = h.decide(&at("10", deciding())).await.expect("no error");
    assert_eq!(next, None);
    assert_eq!(h.asked(), 1);
    assert_eq!(h.calls(), ["PATCH workload", "GET workload"]);
    let kept = h.ctx.memory.of("uid-ns-wl");
    assert!(
        kept.checks.values().all(|p| p.late.is_none()),
        "our own Retry was taken for a late one"
    );
    assert!(!h.sent_event("CheckRetryCarriedOver"), "{:?}", h.events());
}

#[tokio::test]
async fn a_pending_decided_on_a_stale_read_of_our_own_ready_is_not_written() {
    // With revalidation a Ready entry is decidable too: the fresh read showing our own Ready
    // for this attempt must not get the Pending decided for the stale Pending entry.
    let h = Harness::with(Decision::pending("waiting"), true);
    h.conflict();
    let ready = deciding().check_entry(our_entry(CheckState::Ready, "fine"));
    h.answer(200, json(&at("11", ready)));
    let next = h.decide(&at("10", deciding())).await.expect("no error");
    assert_eq!(next, None);
    assert_eq!(h.calls(), ["PATCH status", "GET workload"]);
    assert!(!h.sent_event("InvalidDecision"), "{:?}", h.events());
}

#[tokio::test]
async fn a_conflict_after_kueue_moved_on_carries_a_delayed_retry_over_once() {
    let h = Harness::new(Decision::retry_after("busy", Duration::from_secs(40)));
    // Another check's Retry evicted the Workload while ours was decided: the attempt record,
    // carrying the old resourceVersion, is refused; the Workload holds quota again.
    h.conflict();
    let moved_on = at("14", deciding().eviction_count("AdmissionCheck", 1));
    h.answer(200, json(&moved_on));
    // The carried Retry: its attempt record, then its entry.
    h.answer(
        200,
        json(&at("15", deciding().eviction_count("AdmissionCheck", 1))),
    );
    h.answer(
        200,
        json(&at("16", deciding().eviction_count("AdmissionCheck", 1))),
    );
    h.decide(&at("10", deciding())).await.expect("no error");
    assert_eq!(h.asked(), 1, "the carried Retry is not a new question");
    assert_eq!(
        h.calls(),
        [
            "PATCH workload",
            "GET workload",
            "PATCH workload",
            "PATCH status"
        ]
    );
    let requests = h.api_requests();
    let record = &requests[2].body["metadata"]["annotations"];
    assert_eq!(
        record[crate::attempts::annotation_key(CHECK)],
        "retries=1,evictions=1",
        "counted once, at the attempt it lands on"
    );
    assert_eq!(h.conditioned_on(2), "14");
    let entry = &requests[3].body["status"]["admissionChecks"][0];
    assert_eq!(entry["state"], "Retry");
    assert!(
        entry["message"]
            .as_str()
            .is_some_and(|m| m.contains("decided for attempt 1")),
        "{entry}"
    );
    assert_eq!(h.conditioned_on(3), "15");
    assert!(h.sent_event("CheckRetryCarriedOver"));
}

#[tokio::test]
async fn a_carried_retry_whose_first_record_landed_is_counted_twice_never_backwards() {
    // The documented narrow window: the first record landed, then Kueue evicted before the
    // entry write. The carried Retry is counted at the attempt it lands on (2), so the stored
    // attempt never goes back; one retry of the limit is spent twice.
    let h = Harness::new(Decision::retry_after("busy", Duration::from_secs(40)));
    h.answer(
        200,
        json(&at("11", with_record(deciding(), "retries=1,evictions=0"))),
    );
    h.conflict();
    let moved_on =
        with_record(deciding(), "retries=1,evictions=0").eviction_count("AdmissionCheck", 1);
    h.answer(200, json(&at("14", moved_on.clone())));
    h.answer(200, json(&at("15", moved_on.clone())));
    h.answer(200, json(&at("16", moved_on)));
    h.decide(&at("10", deciding())).await.expect("no error");
    let requests = h.api_requests();
    assert_eq!(
        requests[3].body["metadata"]["annotations"][crate::attempts::annotation_key(CHECK)],
        "retries=2,evictions=1"
    );
}

#[tokio::test]
async fn the_same_answer_written_again_after_a_conflict_is_counted_once() {
    let h = Harness::new(Decision::retry_after("busy", Duration::from_secs(40)));
    // The record lands, the entry meets Kueue's bookkeeping: same attempt, same inputs.
    let recorded = || with_record(deciding(), "retries=1,evictions=0");
    h.answer(200, json(&at("11", recorded())));
    h.conflict();
    h.answer(200, json(&at("12", with_kueues_bookkeeping(recorded()))));
    h.answer(200, json(&at("13", recorded())));
    h.decide(&at("10", deciding())).await.expect("no error");
    assert_eq!(h.asked(), 1);
    assert_eq!(
        h.calls(),
        [
            "PATCH workload",
            "PATCH status",
            "GET workload",
            "PATCH status"
        ],
        "one attempt record only"
    );
    assert_eq!(h.conditioned_on(3), "12");
}

#[tokio::test]
async fn a_conflict_from_kueues_bookkeeping_writes_the_same_answer_without_asking_again() {
    let h = Harness::new(Decision::ready("fine"));
    h.conflict();
    h.answer(200, json(&at("11", with_kueues_bookkeeping(deciding()))));
    h.answer(200, json(&at("12", deciding())));
    h.decide(&at("10", deciding())).await.expect("no error");
    assert_eq!(h.asked(), 1);
    assert_eq!(h.calls(), ["PATCH status", "GET workload", "PATCH status"]);
    assert_eq!(h.conditioned_on(2), "11");
}

#[tokio::test]
async fn a_conflict_from_a_changed_label_asks_the_check_again() {
    let h = Harness::new(Decision::ready("fine"));
    h.conflict();
    let relabelled = deciding().label("team", "b");
    h.answer(200, json(&at("11", relabelled)));
    h.answer(200, json(&at("12", deciding())));
    h.decide(&at("10", deciding())).await.expect("no error");
    assert_eq!(h.asked(), 2, "the check decided on a label that changed");
}

#[tokio::test]
async fn a_write_the_api_server_refuses_as_invalid_becomes_a_permanent_failure_on_the_entry() {
    let h = Harness::new(Decision::ready("fine"));
    h.invalid("status.admissionChecks[0].podSetUpdates[0].labels");
    h.answer(200, json(&at("11", deciding())));
    let next = h.decide(&at("10", deciding())).await.expect("no error");
    assert_eq!(h.asked(), 1);
    assert_eq!(h.calls(), ["PATCH status", "PATCH status"]);
    let entry = &h.api_requests()[1].body["status"]["admissionChecks"][0];
    assert_eq!(entry["state"], "Pending");
    let message = entry["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("Permanent failure: ") && message.contains("Invalid value"),
        "{message}"
    );
    assert!(next.is_some(), "looked at again when the hold ends");
    assert!(h.sent_event("CheckFailedPermanently"));
}

#[tokio::test]
async fn a_delay_computed_by_the_check_still_ends_when_it_said_after_a_conflict() {
    // The check says "until the next whole minute", from the time it was given. Written again
    // after a conflict, the entry must still name that minute, not one second later.
    let h = Harness::new(Decision::retry(UNTIL_NEXT_MINUTE));
    let recorded = || with_record(deciding(), "retries=1,evictions=0");
    h.answer(200, json(&at("11", recorded())));
    h.conflict();
    h.answer(200, json(&at("12", recorded())));
    tokio::time::sleep(Duration::from_millis(30)).await;
    h.answer(200, json(&at("13", recorded())));
    h.decide(&at("10", deciding())).await.expect("no error");
    let requests = h.api_requests();
    let entry = &requests[3].body["status"]["admissionChecks"][0];
    let message = entry["message"].as_str().unwrap_or_default();
    let at = message
        .rsplit_once("next attempt not before ")
        .and_then(|(_, t)| t.strip_suffix(')'))
        .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
        .expect("a time in the message");
    assert_eq!(at.as_second() % 60, 0, "{message}");
    let written = entry["lastTransitionTime"]
        .as_str()
        .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
        .expect("lastTransitionTime");
    let delay = entry["requeueAfterSeconds"].as_i64().unwrap_or_default();
    assert_eq!(written.as_second() + delay, at.as_second(), "{entry}");
}

// The fault tier: every way the API server can fail the write path, answered deterministically.

/// `answer` decided for a Workload deleted before the write: the write and the read that
/// confirms the deletion find nothing, which is no error and ends the reconcile.
async fn decided_for_a_workload_deleted_since_the_read(answer: Decision) -> Harness {
    let h = Harness::new(answer);
    h.workload_gone();
    h.workload_gone();
    let next = h
        .decide(&at("10", deciding()))
        .await
        .expect("a deletion is not an error");
    assert_eq!(next, None);
    h
}

#[tokio::test]
async fn a_workload_deleted_before_the_write_is_no_error() {
    let h = decided_for_a_workload_deleted_since_the_read(Decision::ready("fine")).await;
    assert_eq!(h.calls(), ["PATCH status", "GET workload"]);
    assert!(h.events().is_empty(), "{:?}", h.events());
}

#[tokio::test]
async fn a_404_for_a_workload_that_still_exists_is_an_error() {
    let h = Harness::new(Decision::ready("fine"));
    h.resource_not_found();
    h.answer(200, json(&at("10", deciding())));
    let err = h.decide(&at("10", deciding())).await.expect_err("reported");
    assert_eq!(err.label(), "api");
    assert_eq!(h.calls(), ["PATCH status", "GET workload"]);
}

/// Transient failures: the answer is not turned into a permanent failure, nothing else is
/// written, and the error goes back to the controller, which retries with backoff.
async fn transient(code: u16, reason: &str) -> Harness {
    let h = Harness::new(Decision::ready("fine"));
    h.fail(code, reason, "try again later");
    let err = h
        .decide(&at("10", deciding()))
        .await
        .expect_err("transient");
    assert_eq!(err.label(), "api", "{code}: {err}");
    assert_eq!(h.calls(), ["PATCH status"], "{code}");
    assert_eq!(h.asked(), 1);
    assert!(
        !h.sent_event("CheckFailedPermanently"),
        "{code}: {:?}",
        h.events()
    );
    h
}

#[tokio::test]
async fn a_500_429_503_or_504_on_the_status_write_is_retried_not_made_permanent() {
    transient(500, "InternalError").await;
    transient(429, "TooManyRequests").await;
    transient(503, "ServiceUnavailable").await;
    transient(504, "Timeout").await;
}

#[tokio::test]
async fn a_dropped_connection_is_retried_and_the_next_reconcile_writes() {
    let h = Harness::new(Decision::ready("fine"));
    h.answer(DROP, serde_json::Value::Null);
    let err = h.decide(&at("10", deciding())).await.expect_err("dropped");
    assert_eq!(err.label(), "api");
    // The next reconcile (the controller's backoff) asks again and writes.
    h.answer(200, json(&at("11", deciding())));
    assert_eq!(
        h.decide(&at("10", deciding())).await.expect("written"),
        None
    );
    assert_eq!(h.calls(), ["PATCH status", "PATCH status"]);
    assert_eq!(h.asked(), 2);
}

/// A harness answering `answer` whose permanent-failure hold is `hold`.
fn holding(answer: Decision, hold: Duration) -> Harness {
    Harness::configured(answer, false, |c| c.permanent_failure_hold = hold)
}

/// The entry the status write at `index` of the API requests carried.
fn written_entry(h: &Harness, index: usize) -> serde_json::Value {
    h.api_requests()[index].body["status"]["admissionChecks"][0].clone()
}

/// The note of the first Event of `reason`.
fn event_note(h: &Harness, reason: &str) -> String {
    h.requests()
        .iter()
        .find(|s| s.path.contains("/events") && s.body["reason"] == reason)
        .and_then(|s| s.body["note"].as_str().map(String::from))
        .unwrap_or_default()
}

/// The ways the API server refuses an attempt record for good: RBAC without `patch` on
/// workloads, a policy webhook's 400, annotations over their limit (422).
const RECORD_REFUSALS: [(u16, &str, &str, &str); 3] = [
    (
        403,
        "Forbidden",
        "workloads.kueue.x-k8s.io \"wl\" is forbidden: User \"system:serviceaccount:ns:sa\" cannot patch resource \"workloads\"",
        "grant patch on workloads",
    ),
    (
        400,
        "BadRequest",
        "admission webhook \"policy.example.com\" denied the request: annotation 'attempts' is not allowed",
        "admission webhook <18 characters> denied the request: annotation <8 characters> is not allowed",
    ),
    (
        422,
        "Invalid",
        "metadata.annotations: Too long: must have at most 262144 bytes",
        "(422 Invalid): metadata.annotations: Too long",
    ),
];

#[tokio::test]
async fn a_retry_whose_attempt_record_is_refused_for_good_holds_the_quota_then_goes_uncounted() {
    for (code, reason, server_says, we_say) in RECORD_REFUSALS {
        // During the hold: the entry says why, the quota is kept, nothing uncounted lands.
        let h = holding(Decision::retry("busy"), Duration::from_secs(120));
        h.fail(code, reason, server_says);
        h.answer(200, json(&at("11", deciding())));
        let next = h.decide(&at("10", deciding())).await.expect("no error");
        assert!(
            next.is_some_and(|d| d <= Duration::from_secs(120)),
            "{code}: looked at again when the hold ends: {next:?}"
        );
        assert_eq!(h.calls(), ["PATCH workload", "PATCH status"], "{code}");
        let entry = written_entry(&h, 1);
        let message = entry["message"].as_str().unwrap_or_default();
        assert_eq!(entry["state"], "Pending", "{code}: {message}");
        assert!(
            message.starts_with("Permanent failure: check probe answered Retry")
                && message.contains(we_say)
                && message.contains("then the Retry is written without the count"),
            "{code}: {message}"
        );
        assert!(
            h.api_requests()[1].body["metadata"]["annotations"].is_null(),
            "{code}: the Pending carries no record"
        );
        assert!(
            event_note(&h, "AttemptRecordRefused").contains(we_say),
            "{code}"
        );
        assert_eq!(h.asked(), 1);

        // Once the hold is over (none here): the Retry is written without its record, and
        // Kueue's retryCount counts it.
        let h = holding(Decision::retry("busy"), Duration::ZERO);
        h.fail(code, reason, server_says);
        h.answer(200, json(&at("11", deciding())));
        h.decide(&at("10", deciding())).await.expect("no error");
        assert_eq!(h.calls(), ["PATCH workload", "PATCH status"], "{code}");
        let entry = written_entry(&h, 1);
        assert_eq!(entry["state"], "Retry", "{code}: {entry}");
        assert!(
            entry["message"]
                .as_str()
                .unwrap_or_default()
                .starts_with("busy (attempt 1 of 4"),
            "{code}: {entry}"
        );
        assert!(
            event_note(&h, "AttemptRecordRefused")
                .contains("the Retry answer is written without it"),
            "{code}"
        );
    }
}

#[tokio::test]
async fn a_refused_permission_is_shown_asked_again_soon_then_retried_never_rejected() {
    // During the hold: the reason on the entry, the quota kept, the check asked again soon
    // (a grant sends no event), an Event.
    let h = holding(Decision::pending(NOT_PERMITTED), Duration::from_secs(120));
    h.answer(200, json(&at("11", deciding())));
    let next = h.decide(&at("10", deciding())).await.expect("no error");
    assert_eq!(next, Some(crate::check::NOT_PERMITTED_RECHECK));
    assert_eq!(h.calls(), ["PATCH status"]);
    let entry = written_entry(&h, 0);
    let message = entry["message"].as_str().unwrap_or_default();
    assert_eq!(entry["state"], "Pending", "{message}");
    assert!(
        message.starts_with(
            "check probe cannot answer: the API server refuses this controller a request it \
             needs (403)"
        ) && message.contains(r#"cannot create resource "provisioningrequests""#)
            && message.contains(crate::hold::HOLD_MARK),
        "{message}"
    );
    assert!(h.sent_event("CheckCannotAnswer"), "{:?}", h.events());

    // Once the hold is over: Retry without delay, even past the retry limit (never Rejected:
    // the operator's to fix, not the Workload's).
    let mut h = holding(Decision::pending(NOT_PERMITTED), Duration::ZERO);
    h.active.policy.retry_limit = Some(0);
    h.answer(200, json(&at("11", deciding())));
    h.answer(200, json(&at("12", deciding())));
    h.decide(&at("10", deciding())).await.expect("no error");
    let states: Vec<serde_json::Value> = (0..h.api_requests().len())
        .filter(|i| h.api_requests()[*i].path.ends_with("/status"))
        .map(|i| written_entry(&h, i)["state"].clone())
        .collect();
    assert_eq!(states, ["Retry"], "{:?}", h.calls());
}

#[tokio::test]
async fn a_refused_record_is_counted_once_per_attempt_and_its_hold_survives_a_new_answer() {
    let h = holding(Decision::retry("busy"), Duration::from_secs(120));
    let (code, reason, server_says, _) = RECORD_REFUSALS[0];
    h.fail(code, reason, server_says);
    h.answer(200, json(&at("11", deciding())));
    h.decide(&at("10", deciding())).await.expect("no error");
    // Asked again (a change of the Workload, here the watch delivering our own Pending): the
    // same refusal, the same hold (the entry already says it: nothing to write), one count.
    let held = written_entry(&h, 1);
    let shown = deciding().check_entry(serde_json::from_value(held).expect("an entry"));
    h.fail(code, reason, server_says);
    h.decide(&at("11", shown)).await.expect("no error");
    assert_eq!(h.asked(), 2);
    assert_eq!(
        h.calls(),
        ["PATCH workload", "PATCH status", "PATCH workload"]
    );
    assert_eq!(h.ctx.metrics.attempt_records_refused_of(CHECK), 1);
}

#[tokio::test]
async fn a_refused_catch_up_record_is_dropped_at_once_and_a_rejection_past_the_limit_lands() {
    // Kueue's retryCount says 4 retries, no record: the record only catches up, so the
    // Rejected the exhausted Retry becomes is written without it at once, hold or not.
    let exhausted = || deciding().retry_count(CHECK, 4);
    let h = holding(Decision::retry("busy"), Duration::from_secs(120));
    let (code, reason, server_says, _) = RECORD_REFUSALS[2];
    h.fail(code, reason, server_says);
    h.answer(200, json(&at("11", exhausted())));
    h.decide(&at("10", exhausted())).await.expect("no error");
    assert_eq!(h.calls(), ["PATCH workload", "PATCH status"]);
    assert_eq!(written_entry(&h, 1)["state"], "Rejected");
    assert!(h.sent_event("AttemptRecordRefused"));
}

#[tokio::test]
async fn a_record_write_that_may_pass_is_retried_with_backoff_never_uncounted() {
    let h = holding(Decision::retry("busy"), Duration::ZERO);
    h.fail(503, "ServiceUnavailable", "etcd leader changed");
    let err = h
        .decide(&at("10", deciding()))
        .await
        .expect_err("transient");
    assert_eq!(err.label(), "api");
    assert_eq!(h.calls(), ["PATCH workload"]);
    assert_eq!(h.events(), ["CheckWriteFailed"]);
}

#[tokio::test]
async fn an_invalid_decision_is_held_on_the_entry_then_retried_then_rejected() {
    let mut bad = crate::api::PodSetUpdate {
        name: "main".into(),
        ..Default::default()
    };
    bad.node_selector
        .insert(format!("example.com/{}", "z".repeat(70)), "a".into());
    let answer = Decision::ready_with_updates("capacity ready", vec![bad]);
    // The hold: the reason on the entry, no error, no retry of the same answer forever.
    let h = holding(answer.clone(), Duration::from_secs(120));
    h.answer(200, json(&at("11", deciding())));
    let next = h.decide(&at("10", deciding())).await.expect("no error");
    assert!(next.is_some());
    assert_eq!(h.calls(), ["PATCH status"]);
    let entry = written_entry(&h, 0);
    let message = entry["message"].as_str().unwrap_or_default();
    assert_eq!(entry["state"], "Pending");
    assert!(
        message.starts_with("Permanent failure: the Ready answer of check probe cannot be written: the podSetUpdate for podset \"main\": nodeSelector key")
            && message.contains("70 characters")
            && message.contains("capacity ready"),
        "{message}"
    );
    assert!(entry["podSetUpdates"].is_null(), "{entry}");
    assert!(h.sent_event("CheckFailedPermanently"), "{:?}", h.events());
    // Asked again (the watch delivers our Pending): the check answers the same, the hold goes
    // on from where it started, read from the entry (its lastTransitionTime): the same
    // message, nothing to write. A hold that started again at every answer would never end.
    let shown = deciding().check_entry(serde_json::from_value(entry.clone()).expect("an entry"));
    assert!(crate::lifecycle::hold_started(&at("11", shown.clone()), CHECK).is_some());
    h.decide(&at("11", shown.clone())).await.expect("no error");
    assert_eq!(h.asked(), 2);
    assert_eq!(h.calls(), ["PATCH status"]);
    assert_eq!(
        h.ctx.metrics.permanent_failures_of(CHECK),
        1,
        "counted once, not at every look"
    );
    // Nor after a restart: a new process, with nothing in memory, reads the same start.
    let restarted = holding(answer.clone(), Duration::from_secs(120));
    restarted.decide(&at("11", shown)).await.expect("no error");
    assert_eq!(restarted.asked(), 1);
    assert!(restarted.calls().is_empty(), "{:?}", restarted.calls());
    assert_eq!(restarted.ctx.metrics.permanent_failures_of(CHECK), 0);
    // After the hold: Retry without delay, counted...
    let h = holding(answer.clone(), Duration::ZERO);
    h.answer(200, json(&at("11", deciding())));
    h.answer(200, json(&at("12", deciding())));
    h.decide(&at("10", deciding())).await.expect("no error");
    assert_eq!(h.calls(), ["PATCH workload", "PATCH status"]);
    let entry = written_entry(&h, 1);
    assert_eq!(
        (entry["state"].clone(), entry["requeueAfterSeconds"].clone()),
        ("Retry".into(), 0.into())
    );
    // ... and Rejected past the retry limit (Kueue's default of 3 retries).
    let h = holding(answer, Duration::ZERO);
    let spent = || {
        with_record(deciding(), "retries=3,evictions=0").with(|w| {
            if let Some(s) = w.status.as_mut() {
                s.scheduling_stats = Some(crate::api::SchedulingStats {
                    evictions: vec![crate::api::EvictionCount {
                        reason: "AdmissionCheck".into(),
                        underlying_cause: String::new(),
                        count: 3,
                    }],
                });
            }
        })
    };
    h.answer(200, json(&at("11", spent())));
    h.decide(&at("10", spent())).await.expect("no error");
    assert_eq!(written_entry(&h, 0)["state"], "Rejected");
}

#[tokio::test]
async fn a_webhooks_denial_of_the_answer_is_permanent_not_rbac() {
    let h = Harness::new(Decision::ready("fine"));
    h.fail(
        403,
        "Forbidden",
        "admission webhook \"vworkload.kb.io\" denied the request: status.admissionChecks[0].podSetUpdates[0].nodeSelector: Invalid value: \"example.com/zzz\": name part must be no more than 63 bytes",
    );
    h.answer(200, json(&at("11", deciding())));
    let next = h.decide(&at("10", deciding())).await.expect("no error");
    assert!(next.is_some(), "looked at again when the hold ends");
    let entry = written_entry(&h, 1);
    let message = entry["message"].as_str().unwrap_or_default();
    assert_eq!(entry["state"], "Pending");
    assert!(
        message.starts_with("Permanent failure: the Ready answer of check probe cannot be written: admission webhook vworkload.kb.io refused a request (403)")
            && !message.contains("example.com/zzz"),
        "{message}"
    );
    assert!(h.sent_event("CheckFailedPermanently"));
}

/// The record is a merge patch conditioned on the read's `resourceVersion`: for a Workload
/// deleted since the read the API server answers 404. A server-side apply there would create a
/// Workload of nothing but the annotation (the chaos soak found one, which failed every typed
/// list of Workloads in the cluster).
#[tokio::test]
async fn a_retry_for_a_workload_deleted_since_the_read_creates_nothing() {
    let h = decided_for_a_workload_deleted_since_the_read(Decision::retry("busy")).await;
    assert_eq!(h.calls(), ["PATCH workload", "GET workload"]);
    let record = &h.requests()[0];
    assert_eq!(
        record.content_type.as_deref(),
        Some("application/merge-patch+json"),
        "{record:?}"
    );
    assert_eq!(record.body["metadata"]["resourceVersion"], "10");
    assert!(
        record.body.get("spec").is_none() && record.body.get("apiVersion").is_none(),
        "{record:?}"
    );
    assert!(
        !record
            .query
            .as_deref()
            .unwrap_or_default()
            .contains("force"),
        "{record:?}"
    );
}

#[tokio::test]
async fn a_storm_of_conflicts_ends_after_a_bounded_number_of_tries() {
    let h = Harness::new(Decision::ready("fine"));
    for _ in 0..crate::runtime::answer::CONFLICT_ATTEMPTS {
        h.conflict();
        // Each fresh read shows yet another change by someone else (a new resourceVersion).
        h.answer(200, json(&at("20", deciding())));
    }
    let next = h.decide(&at("10", deciding())).await.expect("no error");
    assert_eq!(
        next,
        Some(Duration::from_secs(1)),
        "looked at again soon, not in a loop"
    );
    assert_eq!(
        h.calls().len(),
        2 * crate::runtime::answer::CONFLICT_ATTEMPTS,
        "{:?}",
        h.calls()
    );
    assert_eq!(
        h.asked(),
        1,
        "the same answer is written again, not asked again"
    );
}

/// kube hands the reconcile the Workload as it was when the reconcile was queued; one that
/// waited for a turn behind many others must decide on what the cache holds now.
#[tokio::test]
async fn a_reconcile_that_waited_for_its_turn_decides_on_the_newest_version() {
    use kube::runtime::watcher::Event;
    let (cache, mut writer) = reflector::store::<Workload>();
    let queued = at(
        "10",
        WorkloadBuilder::new("ns", "wl")
            .pod_set("main", 1, "1")
            .check(CHECK, CheckState::Pending),
    );
    // Meanwhile Kueue reserved quota (rv 11): that is what must be decided.
    writer.apply_watcher_event(&Event::Apply(at("11", deciding())));
    let (ctx, api) = Harness::reconciling(Decision::ready("fine"), cache.clone());
    api.answer(200, json(&at("12", deciding())));
    super::reconcile(Arc::new(queued), ctx.clone())
        .await
        .expect("no error");
    let written: Vec<String> = api.requests().iter().map(|r| r.method.clone()).collect();
    assert_eq!(written, ["PATCH"], "one status write");
    assert_eq!(
        ctx.controller.asked(),
        1,
        "the check was not asked: the reconcile judged the queued version (no quota)"
    );
}

/// A reconcile that failed (here the status write: 500) backs off: a trigger that is no change
/// of the Workload (a reconcile of everything) does not ask the check again before the backoff
/// ends; a new version of the Workload does (found by the suite under load: a check's
/// activation reconciled everything 80 ms after a failure, and asked the failing backend again).
#[tokio::test]
async fn a_failed_reconcile_backs_off_unless_the_workload_changes() {
    use kube::runtime::watcher::Event;
    let (cache, mut writer) = reflector::store::<Workload>();
    writer.apply_watcher_event(&Event::Apply(at("10", deciding())));
    let (ctx, api) = Harness::reconciling(Decision::ready("fine"), cache.clone());
    api.fail(500, "InternalError", "try again later");
    let failed = Arc::new(at("10", deciding()));
    super::reconcile(failed.clone(), ctx.clone())
        .await
        .expect_err("the write failed");
    // What kube hands the error policy next (its kind only labels a counter).
    let err = crate::error::Error::MalformedWorkload("the write failed".into());
    let _ = super::error_policy(failed.clone(), &err, ctx.clone());
    assert_eq!(ctx.controller.asked(), 1);

    // The same version again (a reconcile of everything): not asked, looked at after the backoff.
    let again = super::reconcile(failed.clone(), ctx.clone())
        .await
        .expect("no error");
    assert_eq!(ctx.controller.asked(), 1, "asked during the backoff");
    assert!(api.requests().len() == 1, "{:?}", api.requests());
    assert_ne!(
        again,
        Action::await_change(),
        "a requeue at the backoff's end"
    );

    // A new version of the Workload is asked about at once, and success clears the backoff.
    writer.apply_watcher_event(&Event::Apply(at("11", deciding())));
    api.answer(200, json(&at("12", deciding())));
    super::reconcile(Arc::new(at("11", deciding())), ctx.clone())
        .await
        .expect("written");
    assert_eq!(ctx.controller.asked(), 2);
    assert!(ctx.memory.of("uid-ns-wl").backing_off.is_none());
}

/// A Workload deleted while its reconcile waited is not decided (its release runs on the
/// deletion).
#[tokio::test]
async fn a_reconcile_of_a_workload_deleted_while_it_waited_decides_nothing() {
    let (cache, _writer) = reflector::store::<Workload>();
    let (ctx, api) = Harness::reconciling(Decision::ready("fine"), cache);
    super::reconcile(Arc::new(at("10", deciding())), ctx.clone())
        .await
        .expect("no error");
    assert_eq!(ctx.controller.asked(), 0);
    assert!(api.requests().is_empty());
}

/// A reconcile reads the change that waited for it, also when it finds the Workload deleted
/// meanwhile: nothing is left counted as waiting.
#[tokio::test]
async fn a_reconcile_reads_the_changes_that_waited_for_it() {
    use kube::runtime::watcher::Event;
    let (cache, mut writer) = reflector::store::<Workload>();
    writer.apply_watcher_event(&Event::Apply(at("10", deciding())));
    let (ctx, api) = Harness::reconciling(Decision::ready("fine"), cache);
    let taken = tokio::time::Instant::now();
    assert_eq!(ctx.line.change("ns", "wl", Class::Other, taken), (true, 1));
    assert_eq!(
        ctx.line.change("ns", "gone", Class::Other, taken),
        (true, 2)
    );
    api.answer(200, json(&at("11", deciding())));
    super::reconcile(Arc::new(at("10", deciding())), ctx.clone())
        .await
        .expect("no error");
    let gone = WorkloadBuilder::new("ns", "gone").build();
    super::reconcile(Arc::new(gone), ctx.clone())
        .await
        .expect("no error");
    let later = tokio::time::Instant::now();
    assert_eq!(
        ctx.line.begin("ns", "wl", Class::Other, later).waited,
        Some((None, 0))
    );
    assert_eq!(
        ctx.line.begin("ns", "gone", Class::Other, later).waited,
        Some((None, 0))
    );
}

/// A reconcile waiting for its turn is small: with every cached Workload queued at once (a new
/// leader, a re-list), memory grows by this much per Workload, not by a whole decision.
#[tokio::test]
async fn a_reconcile_waiting_for_its_turn_is_small() {
    let (cache, _writer) = reflector::store::<Workload>();
    let (ctx, _api) = Harness::reconciling(Decision::ready("fine"), cache);
    let waiting = super::reconcile(Arc::new(at("10", deciding())), ctx);
    let size = std::mem::size_of_val(&waiting);
    assert!(size <= 256, "a queued reconcile takes {size} bytes");
}

/// A whole reconcile in which the check answers `Ready` for the Workload (rv 11, written as
/// rv 12): the context, its scripted API and the writer of its Workload cache.
async fn decided_ready_once() -> (
    Arc<Context<Probe>>,
    ScriptedApi,
    reflector::store::Writer<Workload>,
) {
    use kube::runtime::watcher::Event;
    let (cache, mut writer) = reflector::store::<Workload>();
    writer.apply_watcher_event(&Event::Apply(at("11", deciding())));
    let (ctx, api) = Harness::reconciling(Decision::ready("fine"), cache);
    api.answer(200, json(&at("12", deciding())));
    super::reconcile(Arc::new(at("11", deciding())), ctx.clone())
        .await
        .expect("decided");
    (ctx, api, writer)
}

/// A check deleted or renamed while a Workload held something for it: Kueue drops its entry
/// (the Workload keeps its quota, admitted or not) and the check leaves the registry. What the
/// Workload holds for it is still released (found by an end-to-end test: the old check's
/// ProvisioningRequests leaked when only the registry's checks were released).
#[tokio::test]
async fn a_check_gone_from_the_registry_still_releases_what_its_workloads_hold() {
    let (ctx, api, mut writer) = decided_ready_once().await;
    assert_eq!(ctx.controller.asked(), 1);

    // The check is renamed: its AdmissionCheck goes, the ClusterQueue names another check.
    ctx.registry
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .remove(CHECK);
    let renamed = at(
        "13",
        WorkloadBuilder::new("ns", "wl")
            .pod_set("main", 1, "1")
            .check("probe-renamed", CheckState::Pending)
            .quota_reserved("cq", "flavor"),
    );
    writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(renamed.clone()));
    super::reconcile(Arc::new(renamed), ctx.clone())
        .await
        .expect("released");
    assert_eq!(
        ctx.controller.released(),
        [(CHECK.to_string(), ReleaseReason::CheckRemoved)]
    );
    assert_eq!(ctx.controller.asked(), 1, "not asked again");
    assert_eq!(
        api.requests().len(),
        1,
        "nothing written for the gone check"
    );
}

/// A release that fails is an Event on the Workload and an error (the reconcile backs off and
/// comes again); the pair stays remembered until a release succeeds, then is forgotten, so the
/// check is told exactly once that the Workload finished.
#[tokio::test]
async fn a_failed_release_is_said_and_tried_again_until_it_succeeds_then_never_again() {
    let (ctx, api, mut writer) = decided_ready_once().await;
    let finished = at(
        "13",
        deciding()
            .check(CHECK, CheckState::Ready)
            .admitted()
            .finished(),
    );
    writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(finished.clone()));

    ctx.controller.failing_releases.store(1, Ordering::SeqCst);
    let err = super::reconcile(Arc::new(finished.clone()), ctx.clone())
        .await
        .expect_err("the release failed");
    assert_eq!(err.label(), "check");
    assert!(
        api.event_reasons()
            .contains(&"CheckReleaseFailed".to_string())
    );
    assert!(ctx.controller.released().is_empty());
    assert!(
        ctx.memory.of("uid-ns-wl").checks[CHECK].asked.is_some(),
        "still to release"
    );

    for _ in 0..2 {
        super::reconcile(Arc::new(finished.clone()), ctx.clone())
            .await
            .expect("released");
    }
    assert_eq!(
        ctx.controller.released(),
        [(CHECK.to_string(), ReleaseReason::Finished)]
    );
    assert!(ctx.memory.of("uid-ns-wl").checks.is_empty(), "forgotten");
    assert_eq!(ctx.controller.asked(), 1, "never asked again");
}

/// A whole-reconcile setup whose check is in the registry as `state`, with the configuration
/// `tune` gives, and `wl` in the cache.
fn reconciling_as(
    state: Result<ActiveCheck<NoParameters>, crate::runtime::check_registry::Inactive>,
    tune: impl FnOnce(&mut RuntimeConfig),
    wl: &Workload,
) -> (Arc<Context<Probe>>, ScriptedApi) {
    let (cache, mut writer) = reflector::store::<Workload>();
    writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(wl.clone()));
    let Harness { ctx, api, .. } = Harness::configured(Decision::ready("fine"), false, tune);
    ctx.registry
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .insert(CHECK.to_string(), state.map(Arc::new));
    // The cache keeps what it was given once its writer is gone.
    drop(writer);
    (Arc::new(ctx.with_cache(cache)), api)
}

fn inactive() -> crate::runtime::check_registry::Inactive {
    crate::runtime::check_registry::Inactive {
        reason: crate::runtime::check_registry::Reason::BadParametersRef,
        message: "ProvisioningRequestConfig prc not found.".into(),
    }
}

fn active() -> ActiveCheck<NoParameters> {
    ActiveCheck {
        parameters: NoParameters,
        policy: RetryPolicy::default(),
        message: String::new(),
    }
}

/// The state and message of the entry the status write at `index` of `api`'s requests carried.
fn entry_of(api: &ScriptedApi, index: usize) -> (String, String) {
    let entry = &api.requests()[index].body["status"]["admissionChecks"][0];
    (
        entry["state"].as_str().unwrap_or_default().to_string(),
        entry["message"].as_str().unwrap_or_default().to_string(),
    )
}

fn calls_of(api: &ScriptedApi) -> Vec<String> {
    api.requests()
        .iter()
        .map(|s| {
            let end = if s.path.ends_with("/status") {
                "status"
            } else {
                "workload"
            };
            format!("{} {end}", s.method)
        })
        .collect()
}

#[tokio::test]
async fn an_inactive_check_holds_its_workloads_with_the_reason_then_gives_the_quota_back() {
    // Held: the reason on the entry, the quota kept, the check never asked.
    let wl = at("11", deciding());
    let (ctx, api) = reconciling_as(Err(inactive()), |_| {}, &wl);
    api.answer(200, json(&at("12", deciding())));
    super::reconcile(Arc::new(wl.clone()), ctx.clone())
        .await
        .expect("held");
    assert_eq!(calls_of(&api), ["PATCH status"]);
    let (state, message) = entry_of(&api, 0);
    assert_eq!(state, "Pending");
    assert!(
        message.starts_with(
            "check probe cannot answer: its AdmissionCheck is not active (BadParametersRef: \
             ProvisioningRequestConfig prc not found). The workload keeps its quota until "
        ),
        "{message}"
    );
    assert_eq!(ctx.controller.asked(), 0);
    assert!(
        api.event_reasons()
            .contains(&"CheckCannotAnswer".to_string())
    );

    // Once the hold is over: Retry without delay, never Rejected (its retries are spent here).
    let spent = || {
        with_record(deciding(), "retries=3,evictions=0").with(|w| {
            if let Some(s) = w.status.as_mut() {
                s.scheduling_stats = Some(crate::api::SchedulingStats {
                    evictions: vec![crate::api::EvictionCount {
                        reason: "AdmissionCheck".into(),
                        underlying_cause: String::new(),
                        count: 3,
                    }],
                });
            }
        })
    };
    let wl = at("11", spent());
    let (ctx, api) = reconciling_as(
        Err(inactive()),
        |c| c.permanent_failure_hold = Duration::ZERO,
        &wl,
    );
    api.answer(200, json(&at("12", spent())));
    api.answer(200, json(&at("13", spent())));
    super::reconcile(Arc::new(wl), ctx.clone())
        .await
        .expect("released");
    assert_eq!(calls_of(&api), ["PATCH workload", "PATCH status"]);
    let (state, message) = entry_of(&api, 1);
    assert_eq!(state, "Retry", "{message}");
    assert!(message.contains("the quota is given back"), "{message}");
    assert_eq!(
        api.requests()[1].body["status"]["admissionChecks"][0]["requeueAfterSeconds"],
        0
    );

    // An admitted Workload keeps its Ready: nothing to hold.
    let admitted = at(
        "11",
        deciding()
            .check_entry(our_entry(CheckState::Ready, "fine"))
            .admitted(),
    );
    let (ctx, api) = reconciling_as(Err(inactive()), |_| {}, &admitted);
    super::reconcile(Arc::new(admitted), ctx)
        .await
        .expect("nothing");
    assert!(api.requests().is_empty());
}

#[tokio::test]
async fn in_shadow_mode_a_workload_holding_quota_for_a_listed_check_is_answered_then_released() {
    let shadow = |hold: Duration| {
        move |c: &mut RuntimeConfig| {
            c.shadow = Some(crate::shadow::ShadowScope::AllClusterQueues);
            c.permanent_failure_hold = hold;
        }
    };
    let wl = at("11", deciding());
    let (ctx, api) = reconciling_as(Ok(active()), shadow(Duration::from_secs(120)), &wl);
    api.answer(200, json(&at("12", deciding())));
    super::reconcile(Arc::new(wl.clone()), ctx.clone())
        .await
        .expect("held");
    assert_eq!(calls_of(&api), ["PATCH status"]);
    let (state, message) = entry_of(&api, 0);
    assert_eq!(state, "Pending");
    assert!(
        message.starts_with("check probe cannot answer: its controller runs in shadow mode"),
        "{message}"
    );
    // The would-be answer is still published, and nothing of it written.
    assert!(
        api.event_reasons().contains(&"WouldAnswer".to_string()),
        "{:?}",
        api.event_reasons()
    );

    let (ctx, api) = reconciling_as(Ok(active()), shadow(Duration::ZERO), &wl);
    api.answer(200, json(&at("12", deciding())));
    api.answer(200, json(&at("13", deciding())));
    super::reconcile(Arc::new(wl), ctx).await.expect("released");
    assert_eq!(calls_of(&api), ["PATCH workload", "PATCH status"]);
    assert_eq!(entry_of(&api, 1).0, "Retry");
}

#[tokio::test]
async fn a_transient_failure_is_announced_with_its_quoted_values_redacted() {
    let h = Harness::new(Decision::pending(FAIL_QUOTING));
    let err = h
        .decide(&at("10", deciding()))
        .await
        .expect_err("transient");
    assert_eq!(err.label(), "check");
    assert!(
        h.api_requests().is_empty(),
        "nothing written on the Workload"
    );
    let note = event_note(&h, "CheckFailed");
    assert_eq!(
        note,
        "check probe: the ledger said <7 characters> and <9 characters> for workload \"wl\""
    );
}

#[tokio::test]
async fn an_inactive_checks_release_goes_uncounted_when_its_record_is_refused() {
    let wl = at("11", deciding());
    let (ctx, api) = reconciling_as(
        Err(inactive()),
        |c| c.permanent_failure_hold = Duration::ZERO,
        &wl,
    );
    let (code, reason, server_says, _) = RECORD_REFUSALS[0];
    api.fail(code, reason, server_says);
    api.answer(200, json(&at("12", deciding())));
    super::reconcile(Arc::new(wl), ctx).await.expect("released");
    assert_eq!(calls_of(&api), ["PATCH workload", "PATCH status"]);
    assert_eq!(entry_of(&api, 1).0, "Retry");
}

/// Events handed to the background lanes are all published by a flush, each Workload's in the
/// order they were decided, and after the flush an Event is published in the reconcile again.
#[tokio::test]
async fn events_in_the_background_keep_each_workloads_order_and_a_flush_publishes_them_all() {
    use kube::runtime::events::EventType;
    let Harness { ctx, api, .. } = Harness::new(Decision::ready(""));
    let ctx = ctx.with_events_in_background();
    let workloads: Vec<Workload> = (0..3)
        .map(|w| WorkloadBuilder::new("ns", &format!("w{w}")).build())
        .collect();
    for i in 0..30 {
        let w = i % 3;
        let reason = format!("W{w}E{:02}", i / 3);
        ctx.event(&workloads[w], EventType::Normal, &reason, reason.clone())
            .await;
    }
    ctx.flush_events(Duration::from_secs(10)).await;
    let published = api.event_reasons();
    assert_eq!(published.len(), 30, "{published:?}");
    for w in 0..3 {
        let own: Vec<&String> = published
            .iter()
            .filter(|r| r.starts_with(&format!("W{w}")))
            .collect();
        let mut sorted = own.clone();
        sorted.sort();
        assert_eq!(own, sorted, "w{w}'s Events in the order decided");
    }
    ctx.event(&workloads[0], EventType::Normal, "After", "after".into())
        .await;
    assert_eq!(
        api.event_reasons().last().map(String::as_str),
        Some("After")
    );
}

/// A reconcile that finds every turn held ends at once, its Workload known to wait; once the
/// turn ends, the Workload's next reconcile has it.
#[tokio::test]
async fn a_workload_waits_for_a_turn_until_it_has_one() {
    let h = Harness::configured(Decision::ready(""), false, |c| {
        c.concurrency = 1;
    });
    let ctx = h.ctx;
    let now = tokio::time::Instant::now();
    let held = ctx
        .line
        .begin("ns", "a", Class::Other, now)
        .turn
        .expect("a turn");
    assert!(!ctx.line.waits("ns", "a"), "has its turn");
    assert!(ctx.line.begin("ns", "b", Class::Other, now).turn.is_none());
    assert!(ctx.line.waits("ns", "b"));
    assert!(!ctx.line.wake("ns", "b"), "a wake of it needs no reconcile");
    drop(held);
    let turn = ctx
        .line
        .begin("ns", "b", Class::Other, now)
        .turn
        .expect("b's turn");
    assert!(!ctx.line.waits("ns", "b"), "has its turn");
    drop(turn);
}

/// A Workload whose entry of one of our checks waits for its answer is served first, and moves
/// up when the change that adds the entry comes while it waits for other work.
#[tokio::test]
async fn an_entry_of_ours_awaiting_its_answer_moves_its_workload_up_the_line() {
    let h = Harness::configured(Decision::ready(""), false, |c| {
        c.concurrency = 1;
    });
    h.register();
    let ctx = h.ctx;
    let waiting = deciding().build();
    assert_eq!(ctx.line_class(&waiting), Class::Answer);
    let early = WorkloadBuilder::new("ns", "wl")
        .pod_set("main", 1, "1")
        .quota_reserved("cq", "flavor")
        .build();
    assert_eq!(ctx.line_class(&early), Class::Other, "no entry yet");
    let theirs = WorkloadBuilder::new("ns", "wl")
        .check("someone-elses", CheckState::Pending)
        .quota_reserved("cq", "flavor")
        .build();
    assert_eq!(ctx.line_class(&theirs), Class::Other, "not our check");
    let answered = WorkloadBuilder::new("ns", "wl")
        .check(CHECK, CheckState::Ready)
        .quota_reserved("cq", "flavor")
        .build();
    assert_eq!(ctx.line_class(&answered), Class::Other, "answered");

    // Queued for an early start behind another; the entry comes while both wait.
    let now = tokio::time::Instant::now();
    let held = ctx
        .line
        .begin("ns", "a", Class::Other, now)
        .turn
        .expect("a turn");
    assert!(ctx.line.begin("ns", "b", Class::Other, now).turn.is_none());
    assert!(ctx.line.begin("ns", "wl", Class::Other, now).turn.is_none());
    let (needed, _) = ctx.line.change("ns", "wl", ctx.line_class(&waiting), now);
    assert!(!needed, "it waits: its reconcile reads the change");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    ctx.line.connect(tx);
    drop(held);
    let granted = rx.try_recv().expect("a grant");
    assert_eq!(
        granted.name, "wl",
        "the answer goes before b, queued earlier"
    );
}

//! The provisioning controller against the real Kueue, with the autoscaler simulator playing
//! cluster-autoscaler.
//!
//! Retry delays: the config's `backoffBaseSeconds` 1 gives delays of 1 s then 2 s (times Kueue's
//! jitter of at most 0.01 %). The SDK writes `requeueAfterSeconds` rounded up after adding the
//! fraction of a second that Kueue's whole-second `lastTransitionTime` drops, so the entries
//! carry 2 then 3 (see docs/kueue-behaviour.md); the exact delays are in
//! `kueue_ac_retry_delay_seconds`.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use autoscaler_simulator::{CLASS_DETAILS_ANNOTATION, SCRIPT_ANNOTATION};
use e2e::TestEnv;
use e2e::provisioning::{History, World, request_condition_is_true};
use k8s_openapi::api::core::v1::PodTemplate;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kueue_admission_sdk::api::{
    AdmissionCheckState, CheckState, Workload, find_condition, provisioning_condition as pr,
    workload_condition as cond,
};
use kueue_provisioning_controller::config::TIMEOUT_ANNOTATION;
use serde_json::{Value, json};

/// A config spec with this retry strategy (`backoffMaxSeconds` 10).
fn retry_strategy(limit: i32, base: i32) -> Value {
    json!({"retryStrategy": {
        "backoffLimitCount": limit,
        "backoffBaseSeconds": base,
        "backoffMaxSeconds": 10,
    }})
}

/// One test's setup: config `spec`, 4 cpu of quota, `annotations` on the config and
/// `extra_checks` beside ours on the ClusterQueue, the controller with `default_timeout`.
async fn setup_with(
    test: &str,
    spec: Value,
    annotations: &[(&str, &str)],
    default_timeout: Option<Duration>,
    extra_checks: &[&str],
) -> Result<World> {
    let env = TestEnv::new(test).await?;
    let extra: Vec<String> = extra_checks.iter().map(|c| env.cluster_name(c)).collect();
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let p = env
        .provisioning_with(spec, annotations, "4", &extra)
        .await?;
    let controller = env.start_provisioning_controller(default_timeout)?;
    World::around(env, p, controller)
}

/// The usual setup with retry strategy (2, 1) and a second AdmissionCheck on the
/// ClusterQueue, `gate`, active and answered by the test; returns its name too.
async fn with_gate(test: &str) -> Result<(World, String)> {
    let t = setup_with(test, retry_strategy(2, 1), &[], None, &["gate"]).await?;
    let gate = t.env.cluster_name("gate");
    let controller = t.env.own_controller_name("gate");
    t.env.admission_check("gate", &controller).await?;
    t.env.set_admission_check_active(&gate, true).await?;
    Ok((t, gate))
}

/// The controller's metrics, and a reader of one of its series for this test's check.
async fn metrics(t: &World) -> Result<Metrics> {
    Ok(Metrics {
        text: t.controller()?.metrics().await?,
        check: t.p.check.clone(),
    })
}

/// A `/metrics` text and the check whose series are read.
struct Metrics {
    text: String,
    check: String,
}

impl Metrics {
    /// `name{check="<check>"}`, `None` when the series was never written.
    fn get(&self, name: &str) -> Option<f64> {
        e2e::metric_sample(&self.text, &format!("{name}{{check=\"{}\"}}", self.check))
    }

    /// `name{check="<check>",<extra>}`.
    fn get_with(&self, name: &str, extra: &str) -> Option<f64> {
        e2e::metric_sample(
            &self.text,
            &format!("{name}{{check=\"{}\",{extra}}}", self.check),
        )
    }

    /// A counter of ours: `kueue_provisioning_<name>_total`, 0 when never incremented.
    fn counter(&self, name: &str) -> f64 {
        self.get(&format!("kueue_provisioning_{name}_total"))
            .unwrap_or(0.0)
    }

    /// Asserts that our counters `(name, value)` read these values.
    fn assert_counters(&self, expected: &[(&str, f64)]) {
        let seen: Vec<(&str, f64)> = expected
            .iter()
            .map(|(n, _)| (*n, self.counter(n)))
            .collect();
        assert_eq!(seen, expected, "{}", self.text);
    }
}

/// The time a Retry message names: `... next attempt not before <RFC 3339>)`.
fn next_try(message: &str) -> Option<Timestamp> {
    let (_, at) = message.rsplit_once("next attempt not before ")?;
    at.strip_suffix(')')?.parse().ok()
}

/// The distinct `Retry` entries of `check` on `workload` the history saw, in order, each with
/// the `requeueState.requeueAt` Kueue set while it stood.
fn retry_entries(
    h: &History<Workload>,
    workload: &str,
    check: &str,
) -> Vec<(AdmissionCheckState, Option<Timestamp>)> {
    let mut out: Vec<(AdmissionCheckState, Option<Timestamp>)> = Vec::new();
    for wl in h.applied().iter().filter(|w| w.name_any() == workload) {
        let Some(e) = wl
            .admission_check(check)
            .filter(|e| e.state == CheckState::Retry)
        else {
            continue;
        };
        let requeue_at = wl.requeue_at();
        match out.iter_mut().find(|(o, _)| {
            o.last_transition_time == e.last_transition_time && o.message == e.message
        }) {
            Some(slot) => slot.1 = slot.1.or(requeue_at),
            None => out.push((e.clone(), requeue_at)),
        }
    }
    out
}

/// Checks one delayed Retry entry: the delay Kueue got (`requeueAfterSeconds`) is the policy's
/// `delay` seconds rounded up past the dropped fraction (so `delay + 1`, or `delay + 2` when
/// the jitter crosses a second), the message's next-try time and Kueue's `requeueAt` are both
/// `lastTransitionTime + requeueAfterSeconds`, and the message starts with `prefix`.
fn assert_retry(
    (entry, requeue_at): &(AdmissionCheckState, Option<Timestamp>),
    delay: i32,
    prefix: &str,
) {
    let secs = entry.requeue_after_seconds.unwrap_or_default();
    assert!(
        secs == delay + 1 || secs == delay + 2,
        "requeueAfterSeconds for a {delay} s delay: {entry:#?}"
    );
    let ltt = entry
        .last_transition_time
        .as_ref()
        .map(|t| t.0)
        .expect("a Retry entry has a lastTransitionTime");
    let due = ltt
        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(i64::from(
            secs,
        )))
        .expect("in range");
    assert!(
        entry.message.starts_with(prefix),
        "expected the message to start with {prefix:?}: {entry:#?}"
    );
    assert_eq!(next_try(&entry.message), Some(due), "{entry:#?}");
    assert_eq!(*requeue_at, Some(due), "Kueue's requeueAt: {entry:#?}");
}

#[tokio::test]
async fn provisioned_admits_and_the_job_gets_the_pod_set_updates() -> Result<()> {
    let t = World::new(
        "prov-provisioned",
        json!({"podSetUpdates": {"nodeSelector": [{"key": "zone", "valueFromProvisioningClassDetail": "zone"}]}}),
    )
    .await?;
    let (env, p) = (&t.env, &t.p);
    let job = env
        .job_with_pod_annotations(
            "job",
            "lq",
            "1",
            2,
            &[
                (SCRIPT_ANNOTATION, "provision"),
                (CLASS_DETAILS_ANNOTATION, "zone=zone-b"),
            ],
        )
        .await?;
    let wl = env.workload_for_job(&job).await?;
    let wl_name = wl.name_any();
    let admitted = env.wait_admitted(&wl_name).await?;
    let request = t.request(&wl_name, 1);
    let entry = admitted
        .admission_check(&p.check)
        .cloned()
        .unwrap_or_default();
    assert_eq!(entry.state, CheckState::Ready, "{entry:?}");
    assert_eq!(
        entry.message,
        format!(
            "ProvisioningRequest {} provisioned",
            t.qualified(&wl_name, 1)
        )
    );
    let updates: Vec<_> = entry
        .pod_set_updates
        .iter()
        .map(|u| (u.name.as_str(), &u.annotations, &u.node_selector))
        .collect();
    let annotations = BTreeMap::from([
        (
            "autoscaling.x-k8s.io/consume-provisioning-request".to_string(),
            request.clone(),
        ),
        (
            "autoscaling.x-k8s.io/provisioning-class-name".to_string(),
            p.class.clone(),
        ),
    ]);
    let zone = BTreeMap::from([("zone".to_string(), "zone-b".to_string())]);
    assert_eq!(updates, [("main", &annotations, &zone)], "{entry:#?}");

    // Kueue merged the updates into the Job's pod template, beside the flavor's node labels and
    // tolerations it adds itself.
    let job = env.wait_job_unsuspended("job").await?;
    let template = job.spec.map(|s| s.template).unwrap_or_default();
    let job_annotations = template
        .metadata
        .and_then(|m| m.annotations)
        .unwrap_or_default();
    for (k, v) in &annotations {
        assert_eq!(job_annotations.get(k), Some(v), "{job_annotations:?}");
    }
    let pod_spec = template.spec.unwrap_or_default();
    assert_eq!(
        pod_spec.node_selector,
        Some(BTreeMap::from([
            ("pool".to_string(), "pool".to_string()),
            ("zone".to_string(), "zone-b".to_string()),
        ])),
        "the Job's nodeSelector"
    );

    // One request for the two pods, and its PodTemplate asks for the flavor's nodes.
    assert_eq!(env.our_requests().await?, std::slice::from_ref(&request));
    let r = env.provisioning_requests().get(&request).await?;
    let template_name = format!("ppt-{request}-main");
    assert_eq!(r.spec.provisioning_class_name, p.class);
    assert_eq!(r.spec.pod_sets.len(), 1);
    assert_eq!(r.spec.pod_sets[0].count, 2);
    assert_eq!(r.spec.pod_sets[0].pod_template_ref.name, template_name);
    assert_eq!(
        env.our_pod_templates().await?,
        std::slice::from_ref(&template_name)
    );
    let pt = Api::<PodTemplate>::namespaced(env.client.clone(), &env.ns)
        .get(&template_name)
        .await?;
    let spec = pt
        .template
        .and_then(|t| t.spec)
        .context("the PodTemplate has a pod spec")?;
    assert_eq!(
        spec.node_selector,
        Some(BTreeMap::from([("pool".to_string(), "pool".to_string())])),
        "the PodTemplate's nodeSelector"
    );
    assert_eq!(spec.tolerations, Some(vec![TestEnv::pool_toleration()]));
    let requests = spec.containers[0]
        .resources
        .as_ref()
        .and_then(|r| r.requests.clone())
        .unwrap_or_default();
    assert_eq!(requests.get("cpu").map(|q| q.0.as_str()), Some("1"));
    t.stop().await
}

#[tokio::test]
async fn two_failures_retry_with_growing_delays_then_the_third_attempt_admits() -> Result<()> {
    let t = World::new("prov-fail-twice", retry_strategy(2, 1)).await?;
    let (env, check) = (&t.env, &t.p.check);
    let wls = env.workload_history();
    let requests = env.request_history();
    let wl = env.job_with_script("job", "fail,fail,provision").await?;
    let admitted = env.wait_admitted(&wl).await?;
    wls.wait_seen(&wl, "the history saw the admission", |w| {
        w.condition_is_true(cond::ADMITTED)
    })
    .await?;

    let entry = admitted.admission_check(check).cloned().unwrap_or_default();
    assert_eq!(entry.state, CheckState::Ready, "{entry:#?}");
    assert_eq!(entry.retry_count, Some(2), "{entry:#?}");
    assert_eq!(
        entry.message,
        format!("ProvisioningRequest {} provisioned", t.qualified(&wl, 3))
    );
    assert_eq!(admitted.evictions("AdmissionCheck"), 2);

    let retries = retry_entries(&wls, &wl, check);
    assert_eq!(retries.len(), 2, "{retries:#?}");
    for (n, retry) in retries.iter().enumerate() {
        let attempt = n as u32 + 1;
        let prefix = format!(
            "ProvisioningRequest {} failed: simulated: no capacity (attempt {attempt} of 3; \
             next attempt not before ",
            t.qualified(&wl, attempt)
        );
        assert_retry(retry, 1 << n, &prefix);
        assert_eq!(retry.0.retry_count, (n > 0).then_some(n as i32));
        // Kueue held the Workload until the delay was over, then evicted it.
        let due = retry.1.context("requeueAt")?;
        let evicted_at = wls
            .applied()
            .iter()
            .find(|w| {
                w.name_any() == wl
                    && w.admission_check(check)
                        .is_some_and(|e| e.retry_count == Some(n as i32 + 1))
            })
            .and_then(|w| w.condition(cond::EVICTED).map(|c| c.last_transition_time.0))
            .context("the eviction that ended the delay")?;
        let late = evicted_at.duration_since(due).as_secs_f64();
        // Never before requeueAt; late only by what a loaded machine adds.
        assert!(
            (0.0..=e2e::LATE_SLACK.as_secs_f64()).contains(&late),
            "evicted at {evicted_at}, {late} s after requeueAt {due}"
        );
    }

    // The attempts' requests, each made once; only the last one is left.
    let last = t.request(&wl, 3);
    e2e::eventually("the request history saw attempt 3", || {
        requests.objects().iter().any(|(n, _)| *n == last)
    })
    .await?;
    let made: Vec<String> = requests.objects().into_iter().map(|(n, _)| n).collect();
    assert_eq!(made, [1, 2, 3].map(|a| t.request(&wl, a)));
    assert_eq!(env.our_requests().await?, [t.request(&wl, 3)]);
    assert_eq!(
        env.our_pod_templates().await?,
        [format!("ppt-{}-main", t.request(&wl, 3))]
    );

    // The SDK's histogram has the exact delays: 1 s and 2 s, times the jitter.
    let m = metrics(&t).await?;
    assert_eq!(
        m.get("kueue_ac_retry_delay_seconds_count"),
        Some(2.0),
        "{}",
        m.text
    );
    let sum = m
        .get("kueue_ac_retry_delay_seconds_sum")
        .unwrap_or_default();
    assert!((3.0..3.001).contains(&sum), "delays 1 s + 2 s: {}", m.text);
    assert_eq!(
        m.get_with("kueue_ac_decisions_total", "state=\"Retry\""),
        Some(2.0),
        "{}",
        m.text
    );
    // Two Retry events (their notes: `every_retry_event_names_its_own_request`).
    assert_eq!(env.wait_event_count(&wl, "CheckRetry", 2).await?, 2);
    t.stop().await
}

/// Each `CheckRetry` event must tell its own attempt's story: which request failed and when
/// the next attempt comes.
///
/// Pins the SDK's work-around for kube-runtime's `Recorder`, which deduplicates by (type,
/// action, reason, reporter, regarding, related) but not by note: without a digest of the note
/// in the action, the second `CheckRetry` only bumped the first event's `series.count` and
/// attempt 2's message never reached the events.
#[tokio::test]
async fn every_retry_event_names_its_own_request() -> Result<()> {
    let t = World::new("prov-retry-events", retry_strategy(2, 1)).await?;
    let (env, check) = (&t.env, &t.p.check);
    let wls = env.workload_history();
    let wl = env.job_with_script("job", "fail,fail,provision").await?;
    env.wait_admitted(&wl).await?;
    wls.wait_seen(&wl, "the history saw the admission", |w| {
        w.condition_is_true(cond::ADMITTED)
    })
    .await?;
    let retries = retry_entries(&wls, &wl, check);
    assert_eq!(retries.len(), 2, "{retries:#?}");
    let want: Vec<String> = retries
        .iter()
        .map(|(e, _)| format!("check {check}: {}", e.message))
        .collect();
    let events = env.wait_event_count(&wl, "CheckRetry", 2).await?;
    let notes = env.event_notes(&wl, "CheckRetry").await?;
    t.stop().await?;
    assert_eq!(
        notes, want,
        "{events} CheckRetry events were published, but the notes of attempts after the first \
         are lost (kube-runtime's Recorder folds events of the same reason into one series, \
         keeping the first note)"
    );
    Ok(())
}

#[tokio::test]
async fn failing_past_the_backoff_limit_rejects_deactivates_and_leaves_nothing() -> Result<()> {
    let t = World::new("prov-fail-limit", retry_strategy(1, 1)).await?;
    let (env, check) = (&t.env, &t.p.check);
    let wls = env.workload_history();
    let wl = env.job_with_script("job", "fail").await?;
    let deactivated = env
        .wait_workload(&wl, "deactivated (spec.active=false)", |w| !w.is_active())
        .await?;
    assert!(!deactivated.condition_is_true(cond::ADMITTED));
    let rejected = format!(
        "ProvisioningRequest {} failed: simulated: no capacity (attempt 2: no retries left after 1)",
        t.qualified(&wl, 2)
    );
    wls.wait_seen(&wl, "the Rejected entry", |w| {
        w.admission_check(check)
            .is_some_and(|e| e.state == CheckState::Rejected)
    })
    .await?;
    let entry = wls
        .applied()
        .iter()
        .filter_map(|w| w.admission_check(check).cloned())
        .find(|e| e.state == CheckState::Rejected)
        .unwrap_or_default();
    assert_eq!(entry.message, rejected, "{entry:#?}");
    assert_eq!(entry.retry_count, Some(1), "{entry:#?}");
    let retries = retry_entries(&wls, &wl, check);
    assert_eq!(retries.len(), 1, "{retries:#?}");
    assert_retry(
        &retries[0],
        1,
        &format!(
            "ProvisioningRequest {} failed: simulated: no capacity (attempt 1 of 2; ",
            t.qualified(&wl, 1)
        ),
    );
    assert_eq!(
        env.event_notes(&wl, "CheckRejected").await?,
        [format!("check {check}: {rejected}")]
    );

    let evicted = env
        .wait_workload(&wl, "Evicted after the deactivation", |w| {
            w.condition_is_true(cond::EVICTED) || !w.condition_is_true(cond::QUOTA_RESERVED)
        })
        .await?;
    assert!(!evicted.condition_is_true(cond::ADMITTED));
    let job = env.jobs().get("job").await?;
    assert_eq!(job.spec.and_then(|s| s.suspend), Some(true));
    env.wait_nothing_left().await?;
    let m = metrics(&t).await?;
    m.assert_counters(&[("requests_created", 2.0), ("requests_failed", 2.0)]);
    t.stop().await
}

#[tokio::test]
async fn an_expired_booking_before_admission_retries_and_the_next_attempt_admits() -> Result<()> {
    let (t, gate) = with_gate("prov-expired-before").await?;
    let (env, check) = (&t.env, &t.p.check);
    let wls = env.workload_history();
    let wl = env.job_with_script("job", "expire:2,provision").await?;

    // Provisioned, but the gate holds the Workload back while the booking runs out.
    let ready = env
        .wait_workload(&wl, "our check Ready on attempt 1", |w| {
            w.admission_check(check)
                .is_some_and(|e| e.state == CheckState::Ready && e.retry_count.is_none())
        })
        .await?;
    assert!(!ready.condition_is_true(cond::ADMITTED));
    let ready = env
        .wait_workload(&wl, "our check Ready again on attempt 2", |w| {
            w.condition_is_true(cond::QUOTA_RESERVED)
                && !w.condition_is_true(cond::EVICTED)
                && w.admission_check(check)
                    .is_some_and(|e| e.state == CheckState::Ready && e.retry_count == Some(1))
        })
        .await?;
    assert!(!ready.condition_is_true(cond::ADMITTED));
    let retries = retry_entries(&wls, &wl, check);
    assert_eq!(retries.len(), 1, "{retries:#?}");
    assert_retry(
        &retries[0],
        1,
        &format!(
            "ProvisioningRequest {}: the booking expired before admission: simulated: the \
             booking expired (attempt 1 of 3; next attempt not before ",
            t.qualified(&wl, 1)
        ),
    );
    assert_eq!(env.our_requests().await?, [t.request(&wl, 2)]);

    env.answer_check(&wl, &gate, CheckState::Ready, "the gate opens")
        .await?;
    let admitted = env.wait_admitted(&wl).await?;
    let entry = admitted.admission_check(check).cloned().unwrap_or_default();
    assert_eq!(entry.state, CheckState::Ready);
    assert_eq!(
        entry.message,
        format!("ProvisioningRequest {} provisioned", t.qualified(&wl, 2))
    );
    let job = env.wait_job_unsuspended("job").await?;
    let annotations = job
        .spec
        .and_then(|s| s.template.metadata)
        .and_then(|m| m.annotations)
        .unwrap_or_default();
    assert_eq!(
        annotations.get("autoscaling.x-k8s.io/consume-provisioning-request"),
        Some(&t.request(&wl, 2))
    );
    let m = metrics(&t).await?;
    m.assert_counters(&[
        ("requests_booking_expired", 1.0),
        ("requests_provisioned", 2.0),
    ]);
    t.stop().await
}

/// Another check's `Retry` evicts the Workload while our entry is `Ready` on attempt 2: Kueue
/// resets our entry without its `retryCount`, but our attempt stays 2, so the next request is
/// attempt 2's again (the simulator provisions it), not a second attempt 1 (which the script
/// would fail, spending a retry).
#[tokio::test]
async fn another_checks_eviction_keeps_our_attempt_and_its_request_name() -> Result<()> {
    let (t, gate) = with_gate("prov-other-evicts").await?;
    let (env, check) = (&t.env, &t.p.check);
    let requests = env.request_history();
    let wl = env.job_with_script("job", "fail,provision").await?;
    env.wait_workload(&wl, "our check Ready on attempt 2", |w| {
        w.admission_check(check)
            .is_some_and(|e| e.state == CheckState::Ready && e.retry_count == Some(1))
    })
    .await?;

    let before = env.workloads().get(&wl).await?.total_evictions();
    env.answer_check(&wl, &gate, CheckState::Retry, "the gate says later")
        .await?;
    let reset = env
        .wait_workload(&wl, "evicted by the gate, our entry reset", |w| {
            w.total_evictions() > before
                && w.admission_check(check)
                    .is_some_and(|e| e.state == CheckState::Pending && e.retry_count.is_none())
        })
        .await?;
    assert_eq!(
        kueue_admission_sdk::attempts::attempt(&reset, check),
        2,
        "{}",
        e2e::dump(&reset)
    );
    env.wait_check_pending_with_quota(&wl, &gate).await?;
    env.answer_check(&wl, &gate, CheckState::Ready, "the gate opens")
        .await?;
    let admitted = env.wait_admitted(&wl).await?;
    let entry = admitted.admission_check(check).cloned().unwrap_or_default();
    assert_eq!(
        entry.message,
        format!("ProvisioningRequest {} provisioned", t.qualified(&wl, 2)),
        "{}",
        e2e::dump(&admitted)
    );
    // Attempt 1's request, attempt 2's, and attempt 2's again after the eviction released it.
    let second = t.request(&wl, 2);
    e2e::eventually("the request history saw attempt 2's second request", || {
        requests
            .objects()
            .iter()
            .filter(|(n, _)| *n == second)
            .count()
            >= 2
    })
    .await?;
    let made: Vec<String> = requests
        .objects()
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    assert_eq!(
        made,
        [t.request(&wl, 1), second.clone(), second],
        "{made:?}"
    );
    assert_eq!(env.our_requests().await?, [t.request(&wl, 2)]);
    let m = metrics(&t).await?;
    m.assert_counters(&[("requests_failed", 1.0)]);
    t.stop().await
}

#[tokio::test]
async fn an_expired_booking_after_admission_is_ignored() -> Result<()> {
    let t = World::new("prov-expired-after", retry_strategy(2, 1)).await?;
    let (env, check) = (&t.env, &t.p.check);
    let wl = env.job_with_script("job", "expire:2").await?;
    let admitted = env.wait_admitted(&wl).await?;
    let entry = admitted.admission_check(check).cloned().unwrap_or_default();
    assert_eq!(entry.state, CheckState::Ready);
    let request = t.request(&wl, 1);
    env.wait_request(&request, pr::BOOKING_EXPIRED).await?;
    // The controller's request watch sees the expiry (counted) and wakes the Workload: wait for
    // that cause, then give the woken reconcile time to (wrongly) act. (No marker tells when a
    // reconcile that writes nothing is over; this quiet window can only pass falsely, never
    // fail falsely, on a loaded machine.)
    t.wait_counter("kueue_provisioning_requests_booking_expired_total", 1.0)
        .await
        .context("the controller never saw the booking expire")?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let now = env.workloads().get(&wl).await?;
    assert!(now.condition_is_true(cond::ADMITTED), "{}", e2e::dump(&now));
    assert_eq!(now.total_evictions(), 0, "{}", e2e::dump(&now));
    assert_eq!(
        now.admission_check(check),
        Some(&entry),
        "{}",
        e2e::dump(&now)
    );
    assert_eq!(env.event_count(&wl, "CheckRetry").await?, 0);
    let job = env.jobs().get("job").await?;
    assert_eq!(job.spec.and_then(|s| s.suspend), Some(false));
    // The pods may still consume the request: it stays.
    assert_eq!(env.our_requests().await?, [request]);
    let m = metrics(&t).await?;
    m.assert_counters(&[("requests_booking_expired", 1.0)]);
    t.stop().await
}

#[tokio::test]
async fn revoked_capacity_rejects_the_admitted_workload_and_leaves_nothing() -> Result<()> {
    let t = World::new("prov-revoked", retry_strategy(2, 1)).await?;
    let (env, check) = (&t.env, &t.p.check);
    let wl = env.job_with_script("job", "revoke:2").await?;
    env.wait_admitted(&wl).await?;
    env.wait_job_unsuspended("job").await?;
    let evicted = env
        .wait_workload(&wl, "deactivated, evicted and without quota", |w| {
            !w.is_active()
                && w.condition_is_true(cond::EVICTED)
                && !w.condition_is_true(cond::QUOTA_RESERVED)
        })
        .await?;
    assert!(!evicted.condition_is_true(cond::ADMITTED));
    assert_eq!(
        evicted.evictions("AdmissionCheck"),
        0,
        "no Retry on the way"
    );
    env.wait_job_suspend("job", true).await?;
    let note = env.event_note(&wl, "CheckRejected").await?;
    assert_eq!(
        note,
        format!(
            "check {check}: ProvisioningRequest {}: capacity revoked: simulated: the capacity was revoked",
            t.qualified(&wl, 1)
        )
    );
    env.wait_nothing_left().await?;
    let m = metrics(&t).await?;
    m.assert_counters(&[("requests_capacity_revoked", 1.0)]);
    assert_eq!(
        m.get_with("kueue_ac_decisions_total", "state=\"Rejected\""),
        Some(1.0),
        "{}",
        m.text
    );
    t.stop().await
}

#[tokio::test]
async fn a_request_never_provisioned_times_out_per_the_config_annotation_and_is_retried()
-> Result<()> {
    // The controller's default (60 s) would not fire within the test; the annotation's 3 s does.
    let t = setup_with(
        "prov-timeout",
        retry_strategy(1, 1),
        &[(TIMEOUT_ANNOTATION, "3")],
        Some(Duration::from_secs(60)),
        &[],
    )
    .await?;
    let (env, check) = (&t.env, &t.p.check);
    let wls = env.workload_history();
    let requests = env.request_history();
    let wl = env.job_with_script("job", "accept,provision").await?;
    let admitted = env.wait_admitted(&wl).await?;
    let entry = admitted.admission_check(check).cloned().unwrap_or_default();
    assert_eq!(entry.retry_count, Some(1), "{entry:#?}");
    assert_eq!(
        entry.message,
        format!("ProvisioningRequest {} provisioned", t.qualified(&wl, 2))
    );
    wls.wait_seen(&wl, "the history saw the admission", |w| {
        w.condition_is_true(cond::ADMITTED)
    })
    .await?;

    // While it waited, the entry said what for.
    let waiting = format!(
        "waiting for ProvisioningRequest {} (attempt 1) to be provisioned: simulated: the \
         autoscaler took the request",
        t.qualified(&wl, 1)
    );
    let messages: Vec<String> = wls
        .applied()
        .iter()
        .filter_map(|w| w.admission_check(check).map(|e| e.message.clone()))
        .collect();
    assert!(messages.contains(&waiting), "{messages:#?}");

    let retries = retry_entries(&wls, &wl, check);
    assert_eq!(retries.len(), 1, "{retries:#?}");
    assert_retry(
        &retries[0],
        1,
        &format!(
            "ProvisioningRequest {} was not provisioned within 3s (attempt 1 of 2; next attempt \
             not before ",
            t.qualified(&wl, 1)
        ),
    );
    // Timed out when the 3 s were up, not earlier, and not much later.
    let first = requests
        .applied()
        .into_iter()
        .find(|r| r.name_any() == t.request(&wl, 1))
        .context("attempt 1's request")?;
    assert!(
        !request_condition_is_true(&first, pr::PROVISIONED),
        "the first attempt was never provisioned"
    );
    let created = first
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0)
        .context("creationTimestamp")?;
    let retried = retries[0]
        .0
        .last_transition_time
        .as_ref()
        .map(|t| t.0)
        .context("lastTransitionTime")?;
    let after = retried.duration_since(created).as_secs();
    // The configured 3 s, never sooner; later only by what a loaded machine adds.
    assert!(
        (3..=3 + e2e::LATE_SLACK.as_secs() as i64).contains(&after),
        "timed out after {after} s"
    );

    let m = metrics(&t).await?;
    m.assert_counters(&[
        ("requests_timed_out", 1.0),
        ("requests_failed", 0.0),
        ("requests_created", 2.0),
    ]);
    assert_eq!(env.our_requests().await?, [t.request(&wl, 2)]);
    t.stop().await
}

#[tokio::test]
async fn the_controller_default_timeout_applies_without_the_annotation_and_0_turns_it_off()
-> Result<()> {
    // Two configs of one controller whose default timeout is 2 s: one without the annotation,
    // with no retries left after the first attempt; one whose annotation turns the timeout off.
    let t = setup_with(
        "prov-timeout-default",
        retry_strategy(0, 1),
        &[],
        Some(Duration::from_secs(2)),
        &[],
    )
    .await?;
    let (env, check) = (&t.env, &t.p.check);
    let config = env
        .provisioning_config_with_annotations(
            "prc-no-timeout",
            retry_strategy(0, 1),
            &[(TIMEOUT_ANNOTATION, "0")],
        )
        .await?;
    let patient = env
        .provisioning_check(
            "prov-no-timeout",
            &env.provisioning_controller_name(),
            &config,
        )
        .await?;
    let cq = env
        .cluster_queue("cq-no-timeout", &t.p.flavor, "4", &[&patient])
        .await?
        .name_any();
    env.local_queue("lq-no-timeout", &cq).await?;

    let stuck = env.job_with_script("stuck", "accept").await?;
    let slow = env
        .job_with_pod_annotations(
            "slow",
            "lq-no-timeout",
            "1",
            1,
            &[(SCRIPT_ANNOTATION, "provision:4")],
        )
        .await?;
    let slow = env.workload_for_job(&slow).await?.name_any();

    let rejected = env
        .wait_workload(&stuck, "deactivated", |w| !w.is_active())
        .await?;
    assert!(!rejected.condition_is_true(cond::ADMITTED));
    assert_eq!(
        env.event_notes(&stuck, "CheckRejected").await?,
        [format!(
            "check {check}: ProvisioningRequest {} was not provisioned within 2s (attempt 1: no \
             retries left after 0)",
            t.qualified(&stuck, 1)
        )]
    );

    let admitted = env.wait_admitted(&slow).await?;
    let entry = admitted
        .admission_check(&patient)
        .cloned()
        .unwrap_or_default();
    assert_eq!(entry.retry_count, None, "{entry:#?}");
    assert_eq!(admitted.total_evictions(), 0, "{}", e2e::dump(&admitted));
    let r = env
        .provisioning_requests()
        .get(&format!("{slow}-{patient}-1"))
        .await?;
    let conditions = r.status.map(|s| s.conditions).unwrap_or_default();
    let at = |t: &str| find_condition(&conditions, t).map(|c| c.last_transition_time.0);
    let (accepted, provisioned) = (at(pr::ACCEPTED), at(pr::PROVISIONED));
    let took = provisioned
        .zip(accepted)
        .map(|(p, a)| p.duration_since(a).as_secs());
    assert_eq!(took, Some(4), "{conditions:#?}");

    env.wait_only_left(&[format!("{slow}-{patient}-1")]).await?;
    let m = metrics(&t).await?;
    m.assert_counters(&[("requests_timed_out", 1.0)]);
    let patient_series =
        format!("kueue_provisioning_requests_timed_out_total{{check=\"{patient}\"}}");
    assert_eq!(
        e2e::metric_sample(&m.text, &patient_series),
        None,
        "{}",
        m.text
    );
    t.stop().await
}

#[tokio::test]
async fn a_restart_mid_provisioning_creates_no_second_request() -> Result<()> {
    let mut t = World::new("prov-restart", retry_strategy(2, 1)).await?;
    let requests = t.env.request_history();
    // Provisioned 10 s after it is accepted: the new controller must have listed the request
    // before, or it counts no transition (a restart counts only what changes after it). 4 s
    // were too few once, under the full suite.
    let wl = t.env.job_with_script("job", "provision:10").await?;
    let name = t.request(&wl, 1);
    let before = t.env.wait_request(&name, pr::ACCEPTED).await?;
    ensure!(
        !request_condition_is_true(&before, pr::PROVISIONED),
        "killed too late: {}",
        e2e::dump(&before)
    );
    t.controller.take().context("running")?.kill().await;
    let second = t.env.start_provisioning_controller(None)?;
    t.controller = Some(second);

    let admitted = t.env.wait_admitted(&wl).await?;
    let entry = admitted
        .admission_check(&t.p.check)
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        entry.message,
        format!("ProvisioningRequest {} provisioned", t.qualified(&wl, 1))
    );
    assert_eq!(entry.retry_count, None);
    let after = t.env.provisioning_requests().get(&name).await?;
    assert_eq!(after.uid(), before.uid(), "the request was made again");
    assert_eq!(t.env.our_requests().await?, std::slice::from_ref(&name));
    assert_eq!(
        requests.objects(),
        [(name, before.uid().unwrap_or_default())],
        "every request ever seen"
    );
    let m = metrics(&t).await?;
    assert_eq!(
        m.get("kueue_provisioning_requests_created_total"),
        None,
        "{}",
        m.text
    );
    m.assert_counters(&[("requests_provisioned", 1.0)]);
    t.stop().await
}

#[tokio::test]
async fn finishing_evicting_or_deleting_the_workload_leaves_nothing() -> Result<()> {
    let t = World::new("prov-cleanup", retry_strategy(2, 1)).await?;
    let env = &t.env;
    let finished = env.job_with_script("finished", "provision").await?;
    let deactivated = env.job_with_script("deactivated", "provision").await?;
    let waiting = env.job_with_script("waiting", "accept").await?;
    let deleted = env
        .standalone_workload("deleted", "provision")
        .await?
        .name_any();
    for wl in [&finished, &deactivated, &deleted] {
        env.wait_admitted(wl).await?;
    }
    env.wait_workload(&waiting, "waiting on the accepted request", |w| {
        w.admission_check(&t.p.check)
            .is_some_and(|e| e.message.starts_with("waiting for ProvisioningRequest"))
    })
    .await?;
    let all: Vec<String> = [&deactivated, &deleted, &finished, &waiting]
        .iter()
        .map(|wl| t.request(wl, 1))
        .collect();
    let mut sorted = all.clone();
    sorted.sort();
    assert_eq!(env.our_requests().await?, sorted);
    assert_eq!(env.our_pod_templates().await?.len(), 4);

    // Finished: Kueue marks the Workload Finished once its Job completed.
    let done = env.complete_job("finished", &finished).await?;
    assert_eq!(
        done.condition(cond::FINISHED).map(|c| c.reason.as_str()),
        Some("Succeeded")
    );
    // Evicted: deactivated, admitted or still waiting for capacity.
    let off = json!({"spec": {"active": false}});
    for wl in [&deactivated, &waiting] {
        env.workloads()
            .patch(wl, &PatchParams::default(), &Patch::Merge(&off))
            .await?;
    }
    // Deleted.
    env.delete_workload(&deleted).await?;

    env.wait_nothing_left().await?;
    e2e::wait_gone(env.workloads(), &deleted).await?;
    t.stop().await
}

/// Issue 25: the garbage collector removes a deleted Workload's request and templates with no
/// controller of ours running (the Workload owns the templates, the templates the request).
#[tokio::test]
async fn a_workload_deleted_while_the_controller_is_down_leaves_nothing_through_the_garbage_collector()
-> Result<()> {
    let mut t = World::new("prov-deleted-down", retry_strategy(2, 1)).await?;
    let env = t.env.clone();
    let wl = env.standalone_workload("wl", "provision").await?.name_any();
    env.wait_admitted(&wl).await?;
    let request = t.request(&wl, 1);
    assert_eq!(env.our_requests().await?, std::slice::from_ref(&request));
    let r = env.provisioning_requests().get(&request).await?;
    assert!(
        e2e::provisioning::owned_by_its_templates(&r),
        "{}",
        e2e::dump(&r)
    );

    t.controller.take().context("running")?.kill().await;
    env.delete_workload(&wl).await?;
    e2e::wait_gone(env.workloads(), &wl).await?;
    // No controller of ours runs: only the garbage collector can remove them.
    env.wait_nothing_left().await?;
    t.stop().await
}

/// A Workload that finished while no controller of ours ran still exists, so the garbage
/// collector keeps its request and templates: the next controller's sweep deletes them.
#[tokio::test]
async fn a_workload_finished_while_the_controller_is_down_is_cleaned_up_by_the_next() -> Result<()>
{
    let mut t = World::new("prov-finished-down", retry_strategy(2, 1)).await?;
    let env = t.env.clone();
    let wl = env.standalone_workload("wl", "provision").await?.name_any();
    env.wait_admitted(&wl).await?;
    let request = t.request(&wl, 1);

    t.controller.take().context("running")?.kill().await;
    env.finish_standalone_workload(&wl).await?;
    env.wait_workload(&wl, "Finished=True", |w| {
        w.condition_is_true(cond::FINISHED)
    })
    .await?;
    assert_eq!(env.our_requests().await?, std::slice::from_ref(&request));
    assert_eq!(
        env.our_pod_templates().await?,
        [format!("ppt-{request}-main")]
    );

    t.controller = Some(env.start_provisioning_controller(None)?);
    env.wait_nothing_left().await?;
    t.stop().await
}

#[tokio::test]
async fn metrics_and_events_account_for_every_request() -> Result<()> {
    let t = World::new("prov-metrics", retry_strategy(1, 1)).await?;
    let (env, check) = (&t.env, &t.p.check);
    let wl = env.job_with_script("job", "fail,provision").await?;
    env.wait_admitted(&wl).await?;

    let m = metrics(&t).await?;
    m.assert_counters(&[
        ("requests_created", 2.0),
        ("requests_failed", 1.0),
        ("requests_provisioned", 1.0),
    ]);
    for zero in [
        "requests_booking_expired",
        "requests_capacity_revoked",
        "requests_timed_out",
    ] {
        assert_eq!(m.counter(zero), 0.0, "{zero}: {}", m.text);
    }
    assert_eq!(
        m.get("kueue_provisioning_time_to_provisioned_seconds_count"),
        Some(1.0),
        "{}",
        m.text
    );
    let took = m
        .get("kueue_provisioning_time_to_provisioned_seconds_sum")
        .unwrap_or(f64::NAN);
    // Provisioned at once by the simulator: the time is the machine's, never negative.
    assert!(
        (0.0..=e2e::LATE_SLACK.as_secs_f64()).contains(&took),
        "{}",
        m.text
    );
    // Each request was made under a reservation: both are timed from it.
    assert_eq!(
        m.get("kueue_provisioning_time_to_request_seconds_count"),
        Some(2.0),
        "{}",
        m.text
    );
    // Attempts 1 and 2 were created.
    assert_eq!(
        m.get("kueue_provisioning_request_attempt_count"),
        Some(2.0),
        "{}",
        m.text
    );
    assert_eq!(
        m.get("kueue_provisioning_request_attempt_sum"),
        Some(3.0),
        "{}",
        m.text
    );
    assert_eq!(
        m.get_with("kueue_ac_decisions_total", "state=\"Retry\""),
        Some(1.0),
        "{}",
        m.text
    );
    assert_eq!(
        m.get_with("kueue_ac_decisions_total", "state=\"Ready\""),
        Some(1.0),
        "{}",
        m.text
    );

    // The events on the Workload name the requests.
    let retry = env.event_notes(&wl, "CheckRetry").await?;
    assert_eq!(retry.len(), 1, "{retry:?}");
    let prefix = format!(
        "check {check}: ProvisioningRequest {} failed: simulated: no capacity (attempt 1 of 2; \
         next attempt not before ",
        t.qualified(&wl, 1)
    );
    assert!(retry[0].starts_with(&prefix), "{retry:?}");
    assert_eq!(
        env.event_notes(&wl, "CheckReady").await?,
        [format!(
            "check {check}: ProvisioningRequest {} provisioned",
            t.qualified(&wl, 2)
        )]
    );
    assert_eq!(env.event_count(&wl, "CheckRejected").await?, 0);
    t.stop().await
}

/// Kueue names a Job's Workload after the Job, so deleting the Workload of a live Job makes
/// Kueue create another one under the same name (another uid). The new Workload must not be
/// admitted on the old one's request.
#[tokio::test]
async fn a_workload_recreated_under_the_same_name_gets_its_own_request() -> Result<()> {
    let t = World::new("prov-recreated", retry_strategy(2, 1)).await?;
    let env = &t.env;
    let requests = env.request_history();
    let wl = env.job_with_script("job", "provision").await?;
    let first = env.wait_admitted(&wl).await?;
    let old_uid = first.uid().unwrap_or_default();
    env.delete_workload(&wl).await?;
    let second = env
        .wait_workload(&wl, "re-created with another uid and admitted", |w| {
            w.uid().as_deref() != Some(old_uid.as_str()) && w.condition_is_true(cond::ADMITTED)
        })
        .await?;
    let new_uid = second.uid().unwrap_or_default();
    let name = t.request(&wl, 1);
    let r = env.provisioning_requests().get(&name).await?;
    // The old request went first; the new one was made for the new Workload.
    let made = requests.objects();
    assert_eq!(made.len(), 2, "{made:?}");
    assert!(made.iter().all(|(n, _)| *n == name), "{made:?}");
    assert_eq!(r.uid().as_ref(), Some(&made[1].1));
    assert_eq!(requests.deleted(), std::slice::from_ref(&name));
    assert_eq!(
        r.labels().get("kueue-admission-checks.dev/workload-uid"),
        Some(&new_uid),
        "{}",
        e2e::dump(&r)
    );
    // Its PodTemplate (same name as the old request's) is the new one, and stays.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let template = format!("ppt-{name}-main");
    let pt = Api::<PodTemplate>::namespaced(env.client.clone(), &env.ns)
        .get_opt(&template)
        .await?;
    let pt = pt.with_context(|| format!("PodTemplate {template} of the new request is gone"))?;
    assert_eq!(
        pt.labels().get("kueue-admission-checks.dev/workload-uid"),
        Some(&new_uid),
        "{}",
        e2e::dump(&pt)
    );
    // Owned by the new Workload (for the garbage collector), set in its create.
    let owners: Vec<_> = pt
        .owner_references()
        .iter()
        .map(|o| (o.kind.as_str(), o.uid.as_str()))
        .collect();
    assert_eq!(
        owners,
        [("Workload", new_uid.as_str())],
        "{}",
        e2e::dump(&pt)
    );
    t.stop().await
}

/// As above, with the controller down while Kueue replaces the Workloads: the next controller
/// finds each old Workload's request (and PodTemplate) under the names its successor's first
/// attempt needs. It must delete the old ones and make the successor its own, and leave the new
/// ones alone.
///
/// This pinned two fixed bugs, racing (six Workloads are replaced at once: the start-up sweep
/// handles the old requests one by one while the reconciler decides four Workloads at a time):
/// a successor answered Ready on its predecessor's request (now: a request with another
/// Workload's uid is deleted, never adopted), and a successor's new request or PodTemplate
/// deleted by the clean-up of the old one, which deleted by name from a stale copy (now: uid
/// preconditions, and templates only of the same Workload).
#[tokio::test]
async fn workloads_recreated_while_the_controller_is_down_get_their_own_requests() -> Result<()> {
    const JOBS: usize = 6;
    let mut t = World::new("prov-recreated-down", retry_strategy(2, 1)).await?;
    let env = t.env.clone();
    let check = t.p.check.clone();
    let requests = env.request_history();
    let mut workloads = Vec::new();
    for i in 0..JOBS {
        // The autoscaler takes 2 s, reading the PodTemplate again when it provisions.
        let job = env
            .job_with_pod_annotations(
                &format!("job-{i}"),
                "lq",
                "500m",
                1,
                &[(SCRIPT_ANNOTATION, "provision:2")],
            )
            .await?;
        workloads.push(env.workload_for_job(&job).await?.name_any());
    }
    let mut old = BTreeMap::new();
    for wl in &workloads {
        old.insert(
            wl.clone(),
            env.wait_admitted(wl).await?.uid().unwrap_or_default(),
        );
    }
    t.controller.take().context("running")?.kill().await;
    for wl in &workloads {
        env.delete_workload(wl).await?;
    }
    for wl in &workloads {
        let old_uid = old[wl].clone();
        env.wait_workload(wl, "re-created with another uid, holding quota", |w| {
            w.uid().as_deref() != Some(old_uid.as_str())
                && w.condition_is_true(cond::QUOTA_RESERVED)
                && w.admission_check(&check).is_some()
        })
        .await?;
    }
    t.controller = Some(env.start_provisioning_controller(None)?);

    // Each successor is admitted, its pods consume a request that exists and is its own, and
    // that request's PodTemplate exists and is its own.
    let templates = Api::<PodTemplate>::namespaced(env.client.clone(), &env.ns);
    let uid_label = "kueue-admission-checks.dev/workload-uid";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(12);
    loop {
        let mut wrong = Vec::new();
        for wl in &workloads {
            let w = env.workloads().get(wl).await?;
            let uid = w.uid().unwrap_or_default();
            let name = t.request(wl, 1);
            let entry = w.admission_check(&check);
            let consumed = entry
                .and_then(|e| e.pod_set_updates.first())
                .and_then(|u| {
                    u.annotations
                        .get("autoscaling.x-k8s.io/consume-provisioning-request")
                })
                .cloned();
            let r = env.provisioning_requests().get_opt(&name).await?;
            let r_owner = r.as_ref().and_then(|r| r.labels().get(uid_label).cloned());
            let pt = templates.get_opt(&format!("ppt-{name}-main")).await?;
            let pt_owner = pt.as_ref().and_then(|p| p.labels().get(uid_label).cloned());
            let good = w.condition_is_true(cond::ADMITTED)
                && consumed.as_ref() == Some(&name)
                && r_owner.as_ref() == Some(&uid)
                && pt_owner.as_ref() == Some(&uid);
            if !good {
                wrong.push(format!(
                    "Workload {wl} (uid {uid}, predecessor {}): Admitted={}, check {:?} {:?}, \
                     pods consume {consumed:?}; request {name}: workload-uid {r_owner:?}, \
                     conditions {:?}; its PodTemplate: workload-uid {pt_owner:?}{}",
                    old[wl],
                    w.condition_is_true(cond::ADMITTED),
                    entry.map(|e| e.state),
                    entry.map(|e| e.message.as_str()),
                    r.as_ref().and_then(|r| r.status.as_ref()).map(|s| s
                        .conditions
                        .iter()
                        .map(|c| c.type_.as_str())
                        .collect::<Vec<_>>()),
                    if pt.is_none() {
                        " (does not exist)"
                    } else {
                        ""
                    },
                ));
            }
        }
        if wrong.is_empty() {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            let made = requests.objects();
            let deleted = requests.deleted();
            t.stop().await?;
            bail!(
                "successors admitted on their predecessors' requests, or \
                 their new request's PodTemplate deleted by the old request's clean-up:\n{}\n\
                 requests ever seen (name, uid): {made:#?}\ndeleted: {deleted:?}",
                wrong.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    t.stop().await
}

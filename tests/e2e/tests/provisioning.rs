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
use e2e::provisioning::{History, World, request_condition_is_true, retry_strategy};
use k8s_openapi::api::core::v1::{PodSpec, PodTemplate};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kueue_admission_sdk::api::{
    AdmissionCheckState, CheckState, ProvisioningRequest, Workload, find_condition,
    provisioning_condition as pr, workload_condition as cond,
};
use kueue_provisioning_controller::config::TIMEOUT_ANNOTATION;
use serde_json::{Value, json};

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

/// The setup of a timeout test: config `spec` with the timeout annotation if `annotation`, and
/// the controller with a default timeout of `default_secs`.
async fn with_timeouts(
    test: &str,
    spec: Value,
    annotation: Option<&str>,
    default_secs: u64,
) -> Result<World> {
    let annotations: Vec<(&str, &str)> = annotation
        .map(|a| (TIMEOUT_ANNOTATION, a))
        .into_iter()
        .collect();
    let default_timeout = Some(Duration::from_secs(default_secs));
    setup_with(test, spec, &annotations, default_timeout, &[]).await
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

    /// A counter of ours: `kueue_provisioning_<name>_total`, 0 when never incremented.
    fn counter(&self, name: &str) -> f64 {
        self.get(&format!("kueue_provisioning_{name}_total"))
            .unwrap_or(0.0)
    }

    /// The histogram `name`'s sum for our check (`name_sum`), NaN when never written.
    fn sum(&self, name: &str) -> f64 {
        self.get(&format!("{name}_sum")).unwrap_or(f64::NAN)
    }

    /// Asserts that our series `(name, value)` read these values.
    fn assert_series(&self, expected: &[(&str, f64)]) {
        let expected: Vec<_> = expected.iter().map(|(n, v)| (*n, "", *v)).collect();
        e2e::assert_samples(&self.text, &self.labels(), &expected);
    }

    /// Asserts that the SDK counted these decisions `(state, count)` for our check.
    fn assert_decisions(&self, expected: &[(&str, f64)]) {
        let states: Vec<String> = expected
            .iter()
            .map(|(s, _)| format!("state=\"{s}\""))
            .collect();
        let expected: Vec<_> = (expected.iter().zip(&states))
            .map(|((_, v), state)| ("kueue_ac_decisions_total", state.as_str(), *v))
            .collect();
        e2e::assert_samples(&self.text, &self.labels(), &expected);
    }

    /// `check="<check>"`.
    fn labels(&self) -> String {
        format!("check=\"{}\"", self.check)
    }

    /// `name{check="<check>"}` of another check than ours.
    fn of_check(&self, check: &str, name: &str) -> Option<f64> {
        e2e::metric_sample(&self.text, &format!("{name}{{check=\"{check}\"}}"))
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

/// The label by which our requests and PodTemplates name the Workload (by uid) they are for.
const UID_LABEL: &str = "kueue-admission-checks.dev/workload-uid";

/// The pod annotation that names the request the pods consume.
const CONSUME_ANNOTATION: &str = "autoscaling.x-k8s.io/consume-provisioning-request";

/// Submits a Job of one pod of 1 cpu to `queue`, whose requests the simulator answers with
/// `script`; returns its Workload (for a queue other than `lq`).
async fn scripted_job(env: &TestEnv, name: &str, queue: &str, script: &str) -> Result<String> {
    let job = env
        .job_with_pod_annotations(name, queue, "1", 1, &[(SCRIPT_ANNOTATION, script)])
        .await?;
    Ok(env.workload_for_job(&job).await?.name_any())
}

/// Waits until the Workload is admitted; returns it and the entry of `check` (default when
/// there is none, which the test's asserts then show).
async fn admitted(env: &TestEnv, wl: &str, check: &str) -> Result<(Workload, AdmissionCheckState)> {
    let admitted = env.wait_admitted(wl).await?;
    let entry = admitted.admission_check(check).cloned().unwrap_or_default();
    Ok((admitted, entry))
}

/// [`admitted`] for our check, once the Workload history too has seen the admission (so it
/// holds every version on the way).
async fn admitted_and_recorded(
    t: &World,
    wls: &History<Workload>,
    wl: &str,
) -> Result<(Workload, AdmissionCheckState)> {
    let found = admitted(&t.env, wl, &t.p.check).await?;
    wls.wait_seen(wl, "the history saw the admission", |w| {
        w.condition_is_true(cond::ADMITTED)
    })
    .await?;
    Ok(found)
}

/// Waits until our entry is `Ready` on attempt `attempt` (`retryCount` none on the first,
/// `attempt - 1` after).
async fn ready_on_attempt(env: &TestEnv, wl: &str, check: &str, attempt: u32) -> Result<Workload> {
    let retries = (attempt > 1).then(|| attempt as i32 - 1);
    let what = format!("our check Ready on attempt {attempt}");
    env.wait_workload(wl, &what, |w| {
        w.admission_check(check)
            .is_some_and(|e| e.state == CheckState::Ready && e.retry_count == retries)
    })
    .await
}

/// Waits until our entry is `Ready` again on attempt 2 while the Workload holds quota and is
/// not being evicted (the gate still holds admission back).
async fn ready_again_holding_quota(env: &TestEnv, wl: &str, check: &str) -> Result<Workload> {
    env.wait_workload(wl, "our check Ready again on attempt 2", |w| {
        w.condition_is_true(cond::QUOTA_RESERVED)
            && !w.condition_is_true(cond::EVICTED)
            && w.admission_check(check)
                .is_some_and(|e| e.state == CheckState::Ready && e.retry_count == Some(1))
    })
    .await
}

/// Waits until the Workload is evicted or no longer holds quota (after its deactivation).
async fn wait_evicted_or_released(env: &TestEnv, wl: &str) -> Result<Workload> {
    env.wait_workload(wl, "Evicted after the deactivation", |w| {
        w.condition_is_true(cond::EVICTED) || !w.condition_is_true(cond::QUOTA_RESERVED)
    })
    .await
}

/// The gate answers `Retry`: waits until Kueue evicted the Workload for it and reset our entry
/// to `Pending` without a `retryCount`; returns that Workload.
async fn evicted_by_the_gate(env: &TestEnv, wl: &str, gate: &str, check: &str) -> Result<Workload> {
    let before = env.workloads().get(wl).await?.total_evictions();
    env.answer_check(wl, gate, CheckState::Retry, "the gate says later")
        .await?;
    env.wait_workload(wl, "evicted by the gate, our entry reset", |w| {
        w.total_evictions() > before
            && w.admission_check(check)
                .is_some_and(|e| e.state == CheckState::Pending && e.retry_count.is_none())
    })
    .await
}

/// Waits until our entry says the Workload waits on its accepted request.
async fn waiting_on_the_accepted_request(env: &TestEnv, wl: &str, check: &str) -> Result<()> {
    env.wait_workload(wl, "waiting on the accepted request", |w| {
        w.admission_check(check)
            .is_some_and(|e| e.message.starts_with("waiting for ProvisioningRequest"))
    })
    .await?;
    Ok(())
}

/// Whether the Workload holds quota and has an entry for `check`.
fn holds_quota_with(w: &Workload, check: &str) -> bool {
    w.condition_is_true(cond::QUOTA_RESERVED) && w.admission_check(check).is_some()
}

/// Our entry's message when attempt `attempt`'s booking expired before admission, `rest` after
/// the attempt's number.
fn expired_before_admission(t: &World, wl: &str, attempt: u32, rest: &str) -> String {
    format!(
        "ProvisioningRequest {}: the booking expired before admission: simulated: the booking \
         expired (attempt {attempt}{rest}",
        t.qualified(wl, attempt)
    )
}

/// The note of an event about our check: `check <check>: <message>`.
fn note(check: &str, message: &str) -> String {
    format!("check {check}: {message}")
}

/// Whether `secs` is never early and late only by what a loaded machine adds.
fn within_late_slack(secs: f64) -> bool {
    (0.0..=e2e::LATE_SLACK.as_secs_f64()).contains(&secs)
}

/// Our entry's message when the script failed attempt `attempt`, `rest` after the attempt's
/// number: `... failed: simulated: no capacity (attempt <n><rest>`.
fn failed(t: &World, wl: &str, attempt: u32, rest: &str) -> String {
    format!(
        "ProvisioningRequest {} failed: simulated: no capacity (attempt {attempt}{rest}",
        t.qualified(wl, attempt)
    )
}

/// Our entry's message when attempt `attempt` timed out after `secs`, `rest` after the
/// attempt's number.
fn timed_out(t: &World, wl: &str, secs: u32, attempt: u32, rest: &str) -> String {
    format!(
        "ProvisioningRequest {} was not provisioned within {secs}s (attempt {attempt}{rest}",
        t.qualified(wl, attempt)
    )
}

/// Our entry's message while attempt `attempt`'s request waits, accepted by the simulator.
fn waiting(t: &World, wl: &str, attempt: u32) -> String {
    format!(
        "waiting for ProvisioningRequest {} (attempt {attempt}) to be provisioned: simulated: \
         the autoscaler took the request",
        t.qualified(wl, attempt)
    )
}

/// The config of a test of podSetUpdates: the pods' `zone` node selector from the provisioning
/// class detail `zone`.
fn zone_from_class_details() -> Value {
    json!({"podSetUpdates": {"nodeSelector": [{"key": "zone", "valueFromProvisioningClassDetail": "zone"}]}})
}

/// Submits a Job of `pods` pods of 1 cpu to `lq`, whose request the simulator provisions with
/// these class `details` (`key=value`); returns its Workload.
async fn job_with_class_details(
    env: &TestEnv,
    name: &str,
    pods: i32,
    details: &str,
) -> Result<String> {
    let annotations = [
        (SCRIPT_ANNOTATION, "provision"),
        (CLASS_DETAILS_ANNOTATION, details),
    ];
    let job = env
        .job_with_pod_annotations(name, "lq", "1", pods, &annotations)
        .await?;
    Ok(env.workload_for_job(&job).await?.name_any())
}

/// The annotations that make pods consume `request` of `class`.
fn consume_annotations(request: &str, class: &str) -> BTreeMap<String, String> {
    strings(&[
        (CONSUME_ANNOTATION, request),
        ("autoscaling.x-k8s.io/provisioning-class-name", class),
    ])
}

/// Labels, annotations, a nodeSelector.
type Strings = BTreeMap<String, String>;

/// `(podset, annotations, nodeSelector)` of each of the entry's podSetUpdates.
fn pod_set_updates(entry: &AdmissionCheckState) -> Vec<(&str, &Strings, &Strings)> {
    let updates = entry.pod_set_updates.iter();
    updates
        .map(|u| (u.name.as_str(), &u.annotations, &u.node_selector))
        .collect()
}

/// The first entry of `check` in `state` the history saw on the Workload, once it has.
async fn seen_entry(
    wls: &History<Workload>,
    wl: &str,
    check: &str,
    state: CheckState,
) -> Result<AdmissionCheckState> {
    let is_it = |e: &AdmissionCheckState| e.state == state;
    let what = format!("the {state} entry");
    wls.wait_seen(wl, &what, |w| w.admission_check(check).is_some_and(is_it))
        .await?;
    Ok(wls
        .applied()
        .iter()
        .filter(|w| w.name_any() == wl)
        .filter_map(|w| w.admission_check(check).cloned())
        .find(is_it)
        .unwrap_or_default())
}

/// Every message the entry of `check` had, as the history saw them.
fn entry_messages(wls: &History<Workload>, check: &str) -> Vec<String> {
    wls.applied()
        .iter()
        .filter_map(|w| w.admission_check(check).map(|e| e.message.clone()))
        .collect()
}

/// The end of the delay of Retry number `n` (from 0): how many seconds after the `requeueAt`
/// Kueue set while the Retry stood it evicted the Workload (the eviction of the version whose
/// entry has `retryCount` `n + 1`), and both times in words.
fn eviction_after_delay(
    wls: &History<Workload>,
    wl: &str,
    check: &str,
    (_, requeue_at): &(AdmissionCheckState, Option<Timestamp>),
    n: usize,
) -> Result<(f64, String)> {
    let due = requeue_at.context("requeueAt")?;
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
    let when = format!("evicted at {evicted_at}, {late} s after requeueAt {due}");
    Ok((late, when))
}

/// The names of every request the history saw (each once, in order), once it has seen `name`
/// made `times` times (`what` says which).
async fn requests_made(
    requests: &History<ProvisioningRequest>,
    name: &str,
    times: usize,
    what: &str,
) -> Result<Vec<String>> {
    e2e::eventually(what, || {
        requests.objects().iter().filter(|(n, _)| n == name).count() >= times
    })
    .await?;
    Ok(requests.objects().into_iter().map(|(n, _)| n).collect())
}

/// The first version the history saw of request `name`, attempt 1's.
fn first_version(
    requests: &History<ProvisioningRequest>,
    name: &str,
) -> Result<ProvisioningRequest> {
    requests
        .applied()
        .into_iter()
        .find(|r| r.name_any() == name)
        .context("attempt 1's request")
}

/// Whole seconds from the request's creation to the entry's `lastTransitionTime`.
fn seconds_from_creation(
    request: &ProvisioningRequest,
    entry: &AdmissionCheckState,
) -> Result<i64> {
    let created = request.metadata.creation_timestamp.as_ref();
    let created = created.map(|t| t.0).context("creationTimestamp")?;
    let at = entry.last_transition_time.as_ref();
    let at = at.map(|t| t.0).context("lastTransitionTime")?;
    Ok(at.duration_since(created).as_secs())
}

/// How long the request took from `Accepted` to `Provisioned` in whole seconds (by its
/// conditions' times), and its conditions.
async fn accepted_to_provisioned(
    env: &TestEnv,
    request: &str,
) -> Result<(Option<i64>, Vec<Condition>)> {
    let r = env.provisioning_requests().get(request).await?;
    let conditions = r.status.map(|s| s.conditions).unwrap_or_default();
    let at = |t: &str| find_condition(&conditions, t).map(|c| c.last_transition_time.0);
    let took =
        (at(pr::PROVISIONED).zip(at(pr::ACCEPTED))).map(|(p, a)| p.duration_since(a).as_secs());
    Ok((took, conditions))
}

/// The Job's pod template once Kueue started it: its annotations and its pod spec.
async fn started_template(env: &TestEnv, job: &str) -> Result<(BTreeMap<String, String>, PodSpec)> {
    let job = env.wait_job_unsuspended(job).await?;
    let template = job.spec.map(|s| s.template).unwrap_or_default();
    let annotations = template.metadata.and_then(|m| m.annotations);
    Ok((
        annotations.unwrap_or_default(),
        template.spec.unwrap_or_default(),
    ))
}

/// `(count, PodTemplate name)` of each podset of the request.
fn pod_sets(r: &ProvisioningRequest) -> Vec<(i32, &str)> {
    let sets = r.spec.pod_sets.iter();
    sets.map(|s| (s.count, s.pod_template_ref.name.as_str()))
        .collect()
}

/// The PodTemplate `name`, or an error saying it is gone.
async fn pod_template(env: &TestEnv, name: &str) -> Result<PodTemplate> {
    let templates = env.pod_templates();
    let pt = templates.get_opt(name).await?;
    pt.with_context(|| format!("PodTemplate {name} of the new request is gone"))
}

/// The pod spec of the PodTemplate `name`.
async fn template_pod_spec(env: &TestEnv, name: &str) -> Result<PodSpec> {
    let pt = env.pod_templates().get(name).await?;
    pt.template
        .and_then(|t| t.spec)
        .context("the PodTemplate has a pod spec")
}

/// The cpu request of the pod spec's first container.
fn cpu_request(spec: &PodSpec) -> Option<String> {
    let resources = spec.containers[0].resources.as_ref();
    let requests = resources
        .and_then(|r| r.requests.clone())
        .unwrap_or_default();
    requests.get("cpu").map(|q| q.0.clone())
}

/// A map of strings (labels, annotations, a nodeSelector).
fn strings(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// `(kind, uid)` of each owner of the object.
fn owners<K: ResourceExt>(k: &K) -> Vec<(&str, &str)> {
    let refs = k.owner_references().iter();
    refs.map(|o| (o.kind.as_str(), o.uid.as_str())).collect()
}

/// Waits until Kueue has made the Workload `wl` again (a uid other than `old_uid`) and the new
/// one satisfies `cond` (`what`).
async fn wait_successor(
    env: &TestEnv,
    wl: &str,
    old_uid: &str,
    what: &str,
    cond: impl Fn(&Workload) -> bool,
) -> Result<Workload> {
    env.wait_workload(wl, what, |w| w.uid().as_deref() != Some(old_uid) && cond(w))
        .await
}

/// Kills the controller as a crash would.
async fn crash_controller(t: &mut World) -> Result<()> {
    t.controller.take().context("running")?.kill().await;
    Ok(())
}

/// Starts the next controller (no default timeout) in place of the one that crashed.
fn start_next_controller(t: &mut World) -> Result<()> {
    t.controller = Some(t.env.start_provisioning_controller(None)?);
    Ok(())
}

/// After a booking expired: waits until the controller counted the expiry (its request watch
/// saw it and woke the Workload), then gives the woken reconcile time to (wrongly) act. (No
/// marker tells when a reconcile that writes nothing is over; this quiet window can only pass
/// falsely, never fail falsely, on a loaded machine.)
async fn quiet_after_the_expiry_is_seen(t: &World) -> Result<()> {
    t.wait_counter("kueue_provisioning_requests_booking_expired_total", 1.0)
        .await
        .context("the controller never saw the booking expire")?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    Ok(())
}

/// A second config, check and queue of the same controller (`lq-no-timeout`), whose config's
/// annotation turns the timeout off; returns the check's name.
async fn check_without_timeout(t: &World) -> Result<String> {
    let env = &t.env;
    let config = env
        .provisioning_config_with_annotations(
            "prc-no-timeout",
            retry_strategy(0, 1),
            &[(TIMEOUT_ANNOTATION, "0")],
        )
        .await?;
    let controller = env.provisioning_controller_name();
    let patient = env
        .provisioning_check("prov-no-timeout", &controller, &config)
        .await?;
    env.named_queues(
        "cq-no-timeout",
        "lq-no-timeout",
        &t.p.flavor,
        "4",
        &[&patient],
    )
    .await?;
    Ok(patient)
}

/// Submits `count` Jobs of one pod of 500m, whose requests the autoscaler provisions after
/// 2 s, reading the PodTemplate again when it does; returns their Workloads.
async fn slow_jobs(env: &TestEnv, count: usize) -> Result<Vec<String>> {
    let mut workloads = Vec::new();
    for i in 0..count {
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
    Ok(workloads)
}

/// Waits until each Workload is admitted; returns each one's uid.
async fn admitted_uids(env: &TestEnv, workloads: &[String]) -> Result<BTreeMap<String, String>> {
    let mut uids = BTreeMap::new();
    for wl in workloads {
        let uid = env.wait_admitted(wl).await?.uid().unwrap_or_default();
        uids.insert(wl.clone(), uid);
    }
    Ok(uids)
}

/// Polls, for at most `within`, until each successor is admitted, its pods consume a request
/// that exists and is its own, and that request's PodTemplate exists and is its own; returns
/// what is still wrong then (nothing when all are right).
async fn successors_not_on_their_own(
    t: &World,
    predecessors: &BTreeMap<String, String>,
    within: Duration,
) -> Result<Vec<String>> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let mut wrong = Vec::new();
        for (wl, old_uid) in predecessors {
            wrong.extend(successor_fault(t, wl, old_uid).await?);
        }
        if wrong.is_empty() || tokio::time::Instant::now() > deadline {
            return Ok(wrong);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Why the test fails when `wrong` is not empty: what is wrong with each successor, and every
/// request the history saw.
fn not_on_their_own(wrong: &[String], requests: &History<ProvisioningRequest>) -> String {
    let (made, deleted) = (requests.objects(), requests.deleted());
    format!(
        "successors admitted on their predecessors' requests, or \
         their new request's PodTemplate deleted by the old request's clean-up:\n{}\n\
         requests ever seen (name, uid): {made:#?}\ndeleted: {deleted:?}",
        wrong.join("\n")
    )
}

/// What is wrong with the successor `wl` (of a predecessor with uid `old_uid`), if anything:
/// not admitted, its pods consuming another request than its attempt 1's, or that request or
/// its PodTemplate not labelled with its uid.
async fn successor_fault(t: &World, wl: &str, old_uid: &str) -> Result<Option<String>> {
    let env = &t.env;
    let w = env.workloads().get(wl).await?;
    let uid = w.uid().unwrap_or_default();
    let name = t.request(wl, 1);
    let entry = w.admission_check(&t.p.check);
    let consumed = entry
        .and_then(|e| e.pod_set_updates.first())
        .and_then(|u| u.annotations.get(CONSUME_ANNOTATION))
        .cloned();
    let r = env.provisioning_requests().get_opt(&name).await?;
    let r_owner = r.as_ref().and_then(|r| r.labels().get(UID_LABEL).cloned());
    let templates = env.pod_templates();
    let pt = templates.get_opt(&format!("ppt-{name}-main")).await?;
    let pt_owner = pt.as_ref().and_then(|p| p.labels().get(UID_LABEL).cloned());
    let good = w.condition_is_true(cond::ADMITTED)
        && consumed.as_ref() == Some(&name)
        && r_owner.as_ref() == Some(&uid)
        && pt_owner.as_ref() == Some(&uid);
    if good {
        return Ok(None);
    }
    Ok(Some(format!(
        "Workload {wl} (uid {uid}, predecessor {old_uid}): Admitted={}, check {:?} {:?}, \
         pods consume {consumed:?}; request {name}: workload-uid {r_owner:?}, \
         conditions {:?}; its PodTemplate: workload-uid {pt_owner:?}{}",
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
    )))
}

#[tokio::test]
async fn provisioned_admits_and_the_job_gets_the_pod_set_updates() -> Result<()> {
    let t = World::new("prov-provisioned", zone_from_class_details()).await?;
    let (env, p) = (&t.env, &t.p);
    let wl = job_with_class_details(env, "job", 2, "zone=zone-b").await?;
    let (_, entry) = admitted(env, &wl, &p.check).await?;
    let request = t.request(&wl, 1);
    assert_eq!(entry.state, CheckState::Ready, "{entry:?}");
    assert_eq!(entry.message, t.provisioned(&wl, 1));
    let annotations = consume_annotations(&request, &p.class);
    let zone = strings(&[("zone", "zone-b")]);
    let updates = pod_set_updates(&entry);
    assert_eq!(updates, [("main", &annotations, &zone)], "{entry:#?}");
    // Kueue merged the updates into the Job's pod template, beside the flavor's node labels and
    // tolerations it adds itself.
    let (job_annotations, pod_spec) = started_template(env, "job").await?;
    for (k, v) in &annotations {
        assert_eq!(job_annotations.get(k), Some(v), "{job_annotations:?}");
    }
    let selector = Some(strings(&[("pool", "pool"), ("zone", "zone-b")]));
    assert_eq!(pod_spec.node_selector, selector, "the Job's nodeSelector");
    // One request for the two pods, and its PodTemplate asks for the flavor's nodes.
    assert_eq!(env.our_requests().await?, std::slice::from_ref(&request));
    let r = env.provisioning_requests().get(&request).await?;
    let template = format!("ppt-{request}-main");
    assert_eq!(r.spec.provisioning_class_name, p.class);
    assert_eq!(pod_sets(&r), [(2, template.as_str())]);
    assert_eq!(env.our_pod_templates().await?, [template.as_str()]);
    let spec = template_pod_spec(env, &template).await?;
    let pool = Some(strings(&[("pool", "pool")]));
    assert_eq!(spec.node_selector, pool, "the PodTemplate's nodeSelector");
    assert_eq!(spec.tolerations, Some(vec![TestEnv::pool_toleration()]));
    assert_eq!(cpu_request(&spec).as_deref(), Some("1"));
    t.stop().await
}

#[tokio::test]
async fn two_failures_retry_with_growing_delays_then_the_third_attempt_admits() -> Result<()> {
    let t = World::new("prov-fail-twice", retry_strategy(2, 1)).await?;
    let (env, check) = (&t.env, &t.p.check);
    let (wls, requests) = (env.workload_history(), env.request_history());
    let wl = env.job_with_script("job", "fail,fail,provision").await?;
    let (admitted, entry) = admitted_and_recorded(&t, &wls, &wl).await?;
    assert_eq!(entry.state, CheckState::Ready, "{entry:#?}");
    assert_eq!(entry.retry_count, Some(2), "{entry:#?}");
    assert_eq!(entry.message, t.provisioned(&wl, 3));
    assert_eq!(admitted.evictions("AdmissionCheck"), 2);
    let retries = retry_entries(&wls, &wl, check);
    assert_eq!(retries.len(), 2, "{retries:#?}");
    for (n, retry) in retries.iter().enumerate() {
        let prefix = failed(&t, &wl, n as u32 + 1, " of 3; next attempt not before ");
        assert_retry(retry, 1 << n, &prefix);
        assert_eq!(retry.0.retry_count, (n > 0).then_some(n as i32));
        // Kueue held the Workload until the delay was over, then evicted it: never before
        // requeueAt; late only by what a loaded machine adds.
        let (late, when) = eviction_after_delay(&wls, &wl, check, retry, n)?;
        assert!(within_late_slack(late), "{when}");
    }
    // The attempts' requests, each made once; only the last one is left.
    let last = t.request(&wl, 3);
    let made = requests_made(&requests, &last, 1, "the request history saw attempt 3").await?;
    assert_eq!(made, [1, 2, 3].map(|a| t.request(&wl, a)));
    assert_eq!(env.our_requests().await?, std::slice::from_ref(&last));
    assert_eq!(env.our_pod_templates().await?, [format!("ppt-{last}-main")]);
    // The SDK's histogram has the exact delays: 1 s and 2 s, times the jitter.
    let m = metrics(&t).await?;
    m.assert_series(&[("kueue_ac_retry_delay_seconds_count", 2.0)]);
    let sum = m.sum("kueue_ac_retry_delay_seconds");
    assert!((3.0..3.001).contains(&sum), "delays 1 s + 2 s: {}", m.text);
    m.assert_decisions(&[("Retry", 2.0)]);
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
    admitted_and_recorded(&t, &wls, &wl).await?;
    let retries = retry_entries(&wls, &wl, check);
    assert_eq!(retries.len(), 2, "{retries:#?}");
    let want: Vec<String> = retries
        .iter()
        .map(|(e, _)| note(check, &e.message))
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
    let deactivated = env.wait_deactivated(&wl).await?;
    assert!(!deactivated.condition_is_true(cond::ADMITTED));
    let rejected = failed(&t, &wl, 2, ": no retries left after 1)");
    let entry = seen_entry(&wls, &wl, check, CheckState::Rejected).await?;
    assert_eq!(entry.message, rejected, "{entry:#?}");
    assert_eq!(entry.retry_count, Some(1), "{entry:#?}");
    let retries = retry_entries(&wls, &wl, check);
    assert_eq!(retries.len(), 1, "{retries:#?}");
    assert_retry(&retries[0], 1, &failed(&t, &wl, 1, " of 2; "));
    let notes = env.event_notes(&wl, "CheckRejected").await?;
    assert_eq!(notes, [note(check, &rejected)]);
    let evicted = wait_evicted_or_released(env, &wl).await?;
    assert!(!evicted.condition_is_true(cond::ADMITTED));
    assert_eq!(env.job_suspend("job").await?, Some(true));
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
    let ready = ready_on_attempt(env, &wl, check, 1).await?;
    assert!(!ready.condition_is_true(cond::ADMITTED));
    let ready = ready_again_holding_quota(env, &wl, check).await?;
    assert!(!ready.condition_is_true(cond::ADMITTED));
    let retries = retry_entries(&wls, &wl, check);
    assert_eq!(retries.len(), 1, "{retries:#?}");
    let expired = expired_before_admission(&t, &wl, 1, " of 3; next attempt not before ");
    assert_retry(&retries[0], 1, &expired);
    assert_eq!(env.our_requests().await?, [t.request(&wl, 2)]);
    env.answer_check(&wl, &gate, CheckState::Ready, "the gate opens")
        .await?;
    let (_, entry) = admitted(env, &wl, check).await?;
    assert_eq!(entry.state, CheckState::Ready);
    assert_eq!(entry.message, t.provisioned(&wl, 2));
    let (annotations, _) = started_template(env, "job").await?;
    let consumed = annotations.get(CONSUME_ANNOTATION);
    assert_eq!(consumed, Some(&t.request(&wl, 2)));
    let m = metrics(&t).await?;
    m.assert_counters(&[("requests_booking_expired", 1.0)]);
    m.assert_counters(&[("requests_provisioned", 2.0)]);
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
    ready_on_attempt(env, &wl, check, 2).await?;

    let reset = evicted_by_the_gate(env, &wl, &gate, check).await?;
    let attempt = kueue_admission_sdk::attempts::attempt(&reset, check);
    assert_eq!(attempt, 2, "{}", e2e::dump(&reset));
    env.wait_check_pending_with_quota(&wl, &gate).await?;
    env.answer_check(&wl, &gate, CheckState::Ready, "the gate opens")
        .await?;
    let (admitted, entry) = admitted(env, &wl, check).await?;
    let want = t.provisioned(&wl, 2);
    assert_eq!(entry.message, want, "{}", e2e::dump(&admitted));
    // Attempt 1's request, attempt 2's, and attempt 2's again after the eviction released it.
    let second = t.request(&wl, 2);
    let saw = "the request history saw attempt 2's second request";
    let made = requests_made(&requests, &second, 2, saw).await?;
    let want = [t.request(&wl, 1), second.clone(), second];
    assert_eq!(made, want, "{made:?}");
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
    let (_, entry) = admitted(env, &wl, check).await?;
    assert_eq!(entry.state, CheckState::Ready);
    let request = t.request(&wl, 1);
    env.wait_request(&request, pr::BOOKING_EXPIRED).await?;
    quiet_after_the_expiry_is_seen(&t).await?;
    let now = env.workloads().get(&wl).await?;
    assert!(now.condition_is_true(cond::ADMITTED), "{}", e2e::dump(&now));
    assert_eq!(now.total_evictions(), 0, "{}", e2e::dump(&now));
    let now_entry = now.admission_check(check);
    assert_eq!(now_entry, Some(&entry), "{}", e2e::dump(&now));
    assert_eq!(env.event_count(&wl, "CheckRetry").await?, 0);
    assert_eq!(env.job_suspend("job").await?, Some(false));
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
    let evictions = evicted.evictions("AdmissionCheck");
    assert_eq!(evictions, 0, "no Retry on the way");
    env.wait_job_suspend("job", true).await?;
    let rejected = env.event_note(&wl, "CheckRejected").await?;
    let revoked = format!(
        "check {check}: ProvisioningRequest {}: capacity revoked: simulated: the capacity was revoked",
        t.qualified(&wl, 1)
    );
    assert_eq!(rejected, revoked);
    env.wait_nothing_left().await?;
    let m = metrics(&t).await?;
    m.assert_counters(&[("requests_capacity_revoked", 1.0)]);
    m.assert_decisions(&[("Rejected", 1.0)]);
    t.stop().await
}

#[tokio::test]
async fn a_request_never_provisioned_times_out_per_the_config_annotation_and_is_retried()
-> Result<()> {
    // The controller's default (60 s) would not fire within the test; the annotation's 3 s does.
    let t = with_timeouts("prov-timeout", retry_strategy(1, 1), Some("3"), 60).await?;
    let (env, check) = (&t.env, &t.p.check);
    let (wls, requests) = (env.workload_history(), env.request_history());
    let wl = env.job_with_script("job", "accept,provision").await?;
    let (_, entry) = admitted_and_recorded(&t, &wls, &wl).await?;
    assert_eq!(entry.retry_count, Some(1), "{entry:#?}");
    assert_eq!(entry.message, t.provisioned(&wl, 2));
    // While it waited, the entry said what for.
    let messages = entry_messages(&wls, check);
    assert!(messages.contains(&waiting(&t, &wl, 1)), "{messages:#?}");
    let retries = retry_entries(&wls, &wl, check);
    assert_eq!(retries.len(), 1, "{retries:#?}");
    let prefix = timed_out(&t, &wl, 3, 1, " of 2; next attempt not before ");
    assert_retry(&retries[0], 1, &prefix);
    // Timed out when the 3 s were up, not earlier, and not much later.
    let first = first_version(&requests, &t.request(&wl, 1))?;
    let never = !request_condition_is_true(&first, pr::PROVISIONED);
    assert!(never, "the first attempt was never provisioned");
    let after = seconds_from_creation(&first, &retries[0].0)?;
    // The configured 3 s, never sooner; later only by what a loaded machine adds.
    let slack = 3..=3 + e2e::LATE_SLACK.as_secs() as i64;
    assert!(slack.contains(&after), "timed out after {after} s");
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
    let t = with_timeouts("prov-timeout-default", retry_strategy(0, 1), None, 2).await?;
    let (env, check) = (&t.env, &t.p.check);
    let patient = check_without_timeout(&t).await?;
    let stuck = env.job_with_script("stuck", "accept").await?;
    let slow = scripted_job(env, "slow", "lq-no-timeout", "provision:4").await?;
    let rejected = env.wait_deactivated(&stuck).await?;
    assert!(!rejected.condition_is_true(cond::ADMITTED));
    let why = timed_out(&t, &stuck, 2, 1, ": no retries left after 0)");
    let notes = env.event_notes(&stuck, "CheckRejected").await?;
    assert_eq!(notes, [note(check, &why)]);
    let (admitted, entry) = admitted(env, &slow, &patient).await?;
    assert_eq!(entry.retry_count, None, "{entry:#?}");
    assert_eq!(admitted.total_evictions(), 0, "{}", e2e::dump(&admitted));
    let request = format!("{slow}-{patient}-1");
    let (took, conditions) = accepted_to_provisioned(env, &request).await?;
    assert_eq!(took, Some(4), "{conditions:#?}");
    env.wait_only_left(&[request]).await?;
    let m = metrics(&t).await?;
    m.assert_counters(&[("requests_timed_out", 1.0)]);
    let patients = m.of_check(&patient, "kueue_provisioning_requests_timed_out_total");
    assert_eq!(patients, None, "{}", m.text);
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
    let too_late = request_condition_is_true(&before, pr::PROVISIONED);
    ensure!(!too_late, "killed too late: {}", e2e::dump(&before));
    crash_controller(&mut t).await?;
    start_next_controller(&mut t)?;

    let (_, entry) = admitted(&t.env, &wl, &t.p.check).await?;
    assert_eq!(entry.message, t.provisioned(&wl, 1));
    assert_eq!(entry.retry_count, None);
    let after = t.env.provisioning_requests().get(&name).await?;
    assert_eq!(after.uid(), before.uid(), "the request was made again");
    assert_eq!(t.env.our_requests().await?, std::slice::from_ref(&name));
    let ever = [(name, before.uid().unwrap_or_default())];
    assert_eq!(requests.objects(), ever, "every request ever seen");
    let m = metrics(&t).await?;
    let created = m.get("kueue_provisioning_requests_created_total");
    assert_eq!(created, None, "{}", m.text);
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
    let deleted = env.standalone_workload("deleted", "provision").await?;
    let deleted = deleted.name_any();
    for wl in [&finished, &deactivated, &deleted] {
        env.wait_admitted(wl).await?;
    }
    waiting_on_the_accepted_request(env, &waiting, &t.p.check).await?;
    let mut all = [&deactivated, &deleted, &finished, &waiting].map(|wl| t.request(wl, 1));
    all.sort();
    assert_eq!(env.our_requests().await?, all);
    assert_eq!(env.our_pod_templates().await?.len(), 4);
    // Finished: Kueue marks the Workload Finished once its Job completed.
    let done = env.complete_job("finished", &finished).await?;
    let reason = done.condition(cond::FINISHED).map(|c| c.reason.as_str());
    assert_eq!(reason, Some("Succeeded"));
    // Evicted: deactivated, admitted or still waiting for capacity.
    env.set_workload_active(&deactivated, false).await?;
    env.set_workload_active(&waiting, false).await?;
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
    let owned = e2e::provisioning::owned_by_its_templates(&r);
    assert!(owned, "{}", e2e::dump(&r));

    crash_controller(&mut t).await?;
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

    crash_controller(&mut t).await?;
    env.finish_standalone_workload(&wl).await?;
    env.wait_workload(&wl, "Finished=True", |w| {
        w.condition_is_true(cond::FINISHED)
    })
    .await?;
    assert_eq!(env.our_requests().await?, std::slice::from_ref(&request));
    let templates = env.our_pod_templates().await?;
    assert_eq!(templates, [format!("ppt-{request}-main")]);

    start_next_controller(&mut t)?;
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
    m.assert_counters(&[("requests_created", 2.0), ("requests_failed", 1.0)]);
    m.assert_counters(&[("requests_provisioned", 1.0), ("requests_timed_out", 0.0)]);
    m.assert_counters(&[("requests_booking_expired", 0.0)]);
    m.assert_counters(&[("requests_capacity_revoked", 0.0)]);
    // Each request was made under a reservation: both are timed from it. Attempts 1 and 2 were
    // created.
    m.assert_series(&[
        ("kueue_provisioning_time_to_provisioned_seconds_count", 1.0),
        ("kueue_provisioning_time_to_request_seconds_count", 2.0),
        ("kueue_provisioning_request_attempt_count", 2.0),
        ("kueue_provisioning_request_attempt_sum", 3.0),
    ]);
    m.assert_decisions(&[("Retry", 1.0), ("Ready", 1.0)]);
    // Provisioned at once by the simulator: the time is the machine's, never negative.
    let took = m.sum("kueue_provisioning_time_to_provisioned_seconds");
    assert!(within_late_slack(took), "{}", m.text);
    // The events on the Workload name the requests.
    let retry = env.event_notes(&wl, "CheckRetry").await?;
    assert_eq!(retry.len(), 1, "{retry:?}");
    let retried = note(
        check,
        &failed(&t, &wl, 1, " of 2; next attempt not before "),
    );
    assert!(retry[0].starts_with(&retried), "{retry:?}");
    let ready = env.event_notes(&wl, "CheckReady").await?;
    assert_eq!(ready, [note(check, &t.provisioned(&wl, 2))]);
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
    let old_uid = env.wait_admitted(&wl).await?.uid().unwrap_or_default();
    env.delete_workload(&wl).await?;
    let is_admitted = |w: &Workload| w.condition_is_true(cond::ADMITTED);
    let what = "re-created with another uid and admitted";
    let second = wait_successor(env, &wl, &old_uid, what, is_admitted).await?;
    let new_uid = second.uid().unwrap_or_default();
    let name = t.request(&wl, 1);
    let r = env.provisioning_requests().get(&name).await?;
    // The old request went first; the new one was made for the new Workload.
    let made = requests.objects();
    assert_eq!(made.len(), 2, "{made:?}");
    assert!(made.iter().all(|(n, _)| *n == name), "{made:?}");
    assert_eq!(r.uid().as_ref(), Some(&made[1].1));
    assert_eq!(requests.deleted(), std::slice::from_ref(&name));
    let made_for = r.labels().get(UID_LABEL);
    assert_eq!(made_for, Some(&new_uid), "{}", e2e::dump(&r));
    // Its PodTemplate (same name as the old request's) is the new one, and stays.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pt = pod_template(env, &format!("ppt-{name}-main")).await?;
    let made_for = pt.labels().get(UID_LABEL);
    assert_eq!(made_for, Some(&new_uid), "{}", e2e::dump(&pt));
    // Owned by the new Workload (for the garbage collector), set in its create.
    let new_owner = [("Workload", new_uid.as_str())];
    assert_eq!(owners(&pt), new_owner, "{}", e2e::dump(&pt));
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
    let (env, check) = (t.env.clone(), t.p.check.clone());
    let requests = env.request_history();
    let workloads = slow_jobs(&env, JOBS).await?;
    let old = admitted_uids(&env, &workloads).await?;
    crash_controller(&mut t).await?;
    for wl in &workloads {
        env.delete_workload(wl).await?;
    }
    for wl in &workloads {
        let what = "re-created with another uid, holding quota";
        wait_successor(&env, wl, &old[wl], what, |w| holds_quota_with(w, &check)).await?;
    }
    start_next_controller(&mut t)?;
    // Each successor is admitted, its pods consume a request that exists and is its own, and
    // that request's PodTemplate exists and is its own.
    let wrong = successors_not_on_their_own(&t, &old, Duration::from_secs(12)).await?;
    if !wrong.is_empty() {
        let why = not_on_their_own(&wrong, &requests);
        t.stop().await?;
        bail!(why);
    }
    t.stop().await
}

//! The SDK runtime against the real Kueue: a scripted check served by `kueue_admission_sdk::run`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use e2e::TestEnv;
use e2e::probe::{Probe, ProbeScript};
use kube::ResourceExt;
use kube::api::Api;
use kueue_admission_sdk::api::{
    AdmissionCheck, AdmissionCheckState, CheckState, ClusterQueue, Workload,
    workload_condition as cond,
};
use kueue_admission_sdk::{
    AdmissionCheckController, ApiKind, CheckContext, Decision, NoParameters, ReleaseReason,
    RetryPolicy, RuntimeConfig,
};
use serde_json::json;

/// What `serve` started: the check's name, its script, and where its endpoints are served.
struct Served {
    check: String,
    script: Arc<ProbeScript>,
    http: SocketAddr,
    /// The runtime, stopped with the test.
    _runtime: e2e::Running,
}

/// Queues whose check is served by a runtime started for this test alone (its own
/// controllerName, so parallel tests' runtimes never answer each other's checks).
async fn serve(
    env: &TestEnv,
    scripts: &[(&str, Vec<Decision>)],
    policy: RetryPolicy,
) -> Result<Served> {
    let controller_name = format!("e2e.kueue-admission-checks.dev/{}", env.ns);
    let check = env
        .guarded_queue("check", &controller_name, "4")
        .await?
        .check;
    let script = ProbeScript::new();
    for (job, answers) in scripts {
        script.answers(job, answers.clone());
    }
    // A free loopback port for this runtime's endpoints.
    let http = e2e::free_local_address()?;
    let runtime = Probe::new(controller_name, script.clone())
        .policy(policy)
        .run(env, env.client.clone(), |config| RuntimeConfig {
            metrics_address: Some(http),
            health_address: Some(http),
            ..config
        });
    Ok(Served {
        check,
        script,
        http,
        _runtime: runtime,
    })
}

/// Waits until the runtime has counted a Pending decision of `check`, then asserts its samples:
/// one Ready and one Pending decision, one Workload waiting, the check active, one Ready timed.
/// Returns the exposition.
async fn counted_one_ready_and_one_waiting(http: SocketAddr, check: &str) -> Result<String> {
    let c = format!("check=\"{check}\"");
    let metrics = e2e::wait_metric(
        http,
        &format!("kueue_ac_decisions_total{{{c},state=\"Pending\"}}"),
        1.0,
    )
    .await?;
    e2e::assert_samples(
        &metrics,
        &c,
        &[
            ("kueue_ac_decisions_total", r#"state="Ready""#, 1.0),
            ("kueue_ac_decisions_total", r#"state="Pending""#, 1.0),
            ("kueue_ac_workloads_waiting", "", 1.0),
            ("kueue_ac_check_active", "", 1.0),
            (
                "kueue_ac_time_to_decision_seconds_count",
                r#"state="Ready""#,
                1.0,
            ),
        ],
    );
    Ok(metrics)
}

/// Ensures the queue metrics counted the waits of both decisions and both reservations were
/// timed.
fn both_waits_queued_and_reservations_seen(metrics: &str) -> Result<()> {
    // Both decisions were asked on changes from the watch, which the reconciles read: the
    // queue metrics counted their waits and, once all is quiet, nothing is left waiting.
    let waits = e2e::metric_sample(metrics, "kueue_ac_reconcile_queue_wait_seconds_count");
    ensure!(
        waits.is_some_and(|n| n >= 2.0),
        "queue waits {waits:?}:\n{metrics}"
    );
    // Both got quota while the controller watched, so both reservations were timed (the watch
    // sees every namespace: tests running beside this one add theirs).
    let reserved = e2e::metric_sample(metrics, "kueue_ac_quota_reserved_seen_seconds_count");
    ensure!(
        reserved.is_some_and(|n| n >= 2.0),
        "reservations seen {reserved:?}:\n{metrics}"
    );
    Ok(())
}

/// Waits until the Workload's `requeueState.requeueAt` is set (the Retry landed); returns it and
/// `check`'s entry.
async fn retry_with_requeue_at(
    env: &TestEnv,
    wl: &str,
    check: &str,
) -> Result<(Workload, AdmissionCheckState)> {
    let wl = env
        .wait_workload(wl, "Retry with requeueState.requeueAt set", |wl| {
            wl.requeue_at().is_some()
        })
        .await?;
    let entry = wl.admission_check(check).cloned().unwrap_or_default();
    Ok((wl, entry))
}

/// Records every version from now on (the Rejected entry is reset to Pending by the eviction
/// that follows the deactivation, so it may be gone by the time one looks), waits for the
/// eviction of the first Retry (retryCount 1), then until the Workload is deactivated; returns
/// the last version and the first Rejected entry seen.
async fn rejected_then_deactivated(
    env: &TestEnv,
    wl: &str,
    check: &str,
) -> Result<(Workload, AdmissionCheckState)> {
    let mut recorder = env.record_workloads().await?;
    env.wait_workload(wl, "evicted for the first Retry, retryCount 1", |wl| {
        wl.evictions("AdmissionCheck") >= 1
            && wl.admission_check(check).and_then(|e| e.retry_count) == Some(1)
    })
    .await?;
    let versions = recorder
        .until(wl, "Rejected on attempt 2 and deactivated", |wl| {
            !wl.is_active()
        })
        .await?;
    let last = versions.last().cloned().context("no version")?;
    let rejected = versions
        .iter()
        .filter_map(|v| v.admission_check(check))
        .find(|e| e.state == CheckState::Rejected)
        .cloned()
        .unwrap_or_default();
    Ok((last, rejected))
}

/// The notes of the Workload's `CheckRetry` and `CheckRejected` events.
async fn retry_and_rejected_notes(env: &TestEnv, wl: &str) -> Result<(String, String)> {
    let retry = env.event_note(wl, "CheckRetry").await?;
    let rejected = env.event_note(wl, "CheckRejected").await?;
    Ok((retry, rejected))
}

/// Asserts the runtime's samples after one Retry (3 s) then one Rejected of `check`: attempts 1
/// and 2 (an attempt sum of 3), nothing left waiting.
async fn counted_a_retry_then_a_rejection(http: SocketAddr, check: &str) -> Result<()> {
    let (_, metrics) = e2e::http_get(http, "/metrics").await?;
    let c = format!("check=\"{check}\"");
    // Attempts 1 and 2: an attempt sum of 3.
    e2e::assert_samples(
        &metrics,
        &c,
        &[
            ("kueue_ac_decisions_total", r#"state="Retry""#, 1.0),
            ("kueue_ac_decisions_total", r#"state="Rejected""#, 1.0),
            ("kueue_ac_retry_delay_seconds_count", "", 1.0),
            ("kueue_ac_retry_delay_seconds_sum", "", 3.0),
            ("kueue_ac_decision_attempt_sum", "", 3.0),
            ("kueue_ac_workloads_waiting", "", 0.0),
        ],
    );
    Ok(())
}

/// The model of a short SDK test (see `e2e::probe`): a Ready answer admits the Job, on the first
/// attempt, and deleting the Workload releases it.
#[tokio::test]
async fn a_probe_test_is_this_short() -> Result<()> {
    let env = TestEnv::new("sdk-short").await?;
    let q = env
        .guarded_queue("check", &env.own_controller_name("probe"), "4")
        .await?;
    let script = ProbeScript::new();
    script.answer("job", Decision::ready("granted"));
    let _running =
        Probe::new(&q.controller_name, script.clone()).run(&env, env.client.clone(), |c| c);
    let wl = env.admitted_job("job").await?;
    assert!(
        script
            .calls_for("job")
            .iter()
            .all(|(_, attempt)| *attempt == 1)
    );
    env.delete_workload(&wl).await?;
    script.wait_releases("job", [ReleaseReason::Deleted]).await
}

#[tokio::test]
async fn ready_admits_the_workload_and_the_runtime_keeps_the_check_active() -> Result<()> {
    let env = TestEnv::new("sdk-ready").await?;
    let approved = ("job", vec![Decision::ready("approved")]);
    let waits = ("waits", vec![Decision::pending("waiting for approval")]);
    let served = serve(&env, &[approved, waits], RetryPolicy::default()).await?;
    let (check, http) = (&served.check, served.http);
    // Nobody but the runtime marks the check Active; without it no quota would be reserved.
    env.wait_active::<AdmissionCheck>(check, "True", Some("Active"))
        .await?;

    let wl = env.submit_job("job", "lq", "1").await?;
    let entry = e2e::entry_of(&env.wait_admitted(&wl).await?, check)?;
    assert_eq!(entry.state, CheckState::Ready);
    assert_eq!(entry.message, "approved");
    assert_eq!(entry.retry_count, None);
    env.wait_job_unsuspended("job").await?;
    let note = env.event_note(&wl, "CheckReady").await?;
    assert_eq!(note, format!("check {check}: approved"));
    let releases = served.script.releases();
    assert!(releases.is_empty(), "released an admitted workload");

    // A second Workload holds quota and waits: the waiting gauge counts it.
    let waits = env.submit_job("waits", "lq", "1").await?;
    env.wait_entry_message(&waits, check, "waiting for approval")
        .await?;
    assert_eq!(e2e::http_get(http, "/readyz").await?.0, 200);
    assert_eq!(e2e::http_get(http, "/healthz").await?.0, 200);
    let metrics = counted_one_ready_and_one_waiting(http, check).await?;
    both_waits_queued_and_reservations_seen(&metrics)?;
    e2e::wait_metric(http, "kueue_ac_reconcile_queue_depth", 0.0).await?;
    Ok(())
}

/// Retry with the policy's delay, then Retry past the limit: evicted with requeueAt, retryCount
/// grows, then Rejected and the Workload deactivated; the check is told to release both times.
#[tokio::test]
async fn retry_with_delay_then_past_the_limit_rejects_and_deactivates() -> Result<()> {
    let env = TestEnv::new("sdk-retry").await?;
    let policy = RetryPolicy::fixed(Duration::from_secs(3)).with_retry_limit(1);
    let served = serve(&env, &[("job", vec![Decision::retry("not yet")])], policy).await?;
    let check = &served.check;
    let wl_name = env.submit_job("job", "lq", "1").await?;

    // The Retry lands with its delay: requeueAt is set (before the eviction; Kueue clears it
    // once it requeues). The runtime adds the fraction of a second that Kueue's whole-second
    // lastTransitionTime drops, so 3 s become 3 or 4.
    let (wl, entry) = retry_with_requeue_at(&env, &wl_name, check).await?;
    assert_eq!(entry.state, CheckState::Retry, "{}", e2e::dump(&wl));
    let delay_3_or_4 = matches!(entry.requeue_after_seconds, Some(3 | 4));
    assert!(delay_3_or_4, "{}", e2e::dump(&wl));
    let said = "not yet (attempt 1 of 2; next attempt not before ";
    assert!(entry.message.starts_with(said), "{}", entry.message);

    let (wl, rejected) = rejected_then_deactivated(&env, &wl_name, check).await?;
    let why = "no Rejected entry saying so before the deactivation";
    let no_retries_left = rejected.message.contains("no retries left after 1");
    assert!(no_retries_left, "{why}: {}", e2e::dump(&wl));
    assert!(!wl.condition_is_true(cond::ADMITTED));

    let released = vec![ReleaseReason::Evicted, ReleaseReason::Deactivated];
    e2e::eventually_equal("the releases", || served.script.releases(), released).await?;
    let (retry_note, rejected_note) = retry_and_rejected_notes(&env, &wl_name).await?;
    let retry_start = format!("check {check}: not yet (attempt 1 of 2;");
    assert!(retry_note.starts_with(&retry_start), "{retry_note}");
    let told = rejected_note.contains("no retries left after 1");
    assert!(told, "{rejected_note}");
    counted_a_retry_then_a_rejection(served.http, check).await
}

/// A check that takes no parameters but names some is inactive with a clear message, and
/// active again once fixed.
#[tokio::test]
async fn bad_parameters_make_the_check_inactive_until_fixed() -> Result<()> {
    let env = TestEnv::new("sdk-params").await?;
    // The runtime is bound: it runs until the test ends.
    let served = serve(&env, &[], RetryPolicy::default()).await?;
    let check = &served.check;
    env.wait_active::<AdmissionCheck>(check, "True", None)
        .await?;

    let bad = json!({"apiGroup": "example.com", "kind": "Budget", "name": "weekly"});
    env.set_check_parameters(check, bad).await?;
    let inactive = env
        .wait_active::<AdmissionCheck>(check, "False", Some("BadParametersRef"))
        .await?;
    assert_eq!(
        inactive.message,
        "this check takes no parameters, but spec.parameters names Budget weekly"
    );
    let (_, metrics) = e2e::http_get(served.http, "/metrics").await?;
    let gauge = format!("kueue_ac_check_active{{check=\"{check}\"}}");
    assert_eq!(e2e::metric_sample(&metrics, &gauge), Some(0.0), "{metrics}");

    env.set_check_parameters(check, serde_json::Value::Null)
        .await?;
    env.wait_active::<AdmissionCheck>(check, "True", None)
        .await?;
    Ok(())
}

/// A check whose backend is down for its first `failures` calls, recording each call's time and
/// the Workload's resourceVersion (to tell a retry of the same Workload from a reaction to a
/// change).
struct FlakyCheck {
    controller_name: String,
    failures: Mutex<u32>,
    calls: Arc<Mutex<Vec<(tokio::time::Instant, String)>>>,
}

impl AdmissionCheckController for FlakyCheck {
    type Parameters = NoParameters;
    type Error = std::io::Error;

    fn controller_name(&self) -> &str {
        &self.controller_name
    }

    async fn decide(
        &self,
        ctx: &CheckContext<'_, NoParameters>,
    ) -> Result<Decision, std::io::Error> {
        let version = ctx.workload.resource_version().unwrap_or_default();
        self.calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((tokio::time::Instant::now(), version));
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        if *failures > 0 {
            *failures -= 1;
            return Err(std::io::Error::other("the backend is down"));
        }
        Ok(Decision::ready("the backend is back"))
    }
}

/// What `serve_flaky` started: the check's name, the calls recorded, and where the metrics are.
struct ServedFlaky {
    check: String,
    calls: Arc<Mutex<Vec<(tokio::time::Instant, String)>>>,
    http: SocketAddr,
    /// The runtime, stopped with the test.
    _runtime: e2e::Running,
}

/// Queues guarded by a [`FlakyCheck`] of this test alone that fails its first `failures` calls,
/// served with its metrics.
async fn serve_flaky(env: &TestEnv, failures: u32) -> Result<ServedFlaky> {
    let controller_name = format!("e2e.kueue-admission-checks.dev/{}", env.ns);
    let check = env
        .guarded_queue("check", &controller_name, "4")
        .await?
        .check;
    let calls = Arc::new(Mutex::new(Vec::new()));
    let flaky = FlakyCheck {
        controller_name,
        failures: Mutex::new(failures),
        calls: calls.clone(),
    };
    let http = e2e::free_local_address()?;
    let config = RuntimeConfig {
        metrics_address: Some(http),
        health_address: Some(http),
        ..env.runtime_config()
    };
    let _runtime = e2e::Running::check(env.client.clone(), flaky, config);
    Ok(ServedFlaky {
        check,
        calls,
        http,
        _runtime,
    })
}

/// Ensures each of the first three failures n (from 1) delayed the next call by 2^(n-1) s (at
/// least 90 % of it; up to 20 % more is the jitter), unless the Workload itself changed
/// meanwhile (which is reconciled at once); returns how many gaps were such backoffs.
fn backoffs_between(calls: &[(tokio::time::Instant, String)]) -> Result<usize> {
    let mut backoffs = 0;
    for (n, pair) in calls.windows(2).enumerate().take(3) {
        let ((t0, v0), (t1, v1)) = (&pair[0], &pair[1]);
        if v0 != v1 {
            continue;
        }
        let nominal = Duration::from_secs(1 << n);
        let gap = *t1 - *t0;
        ensure!(
            gap >= nominal.mul_f64(0.9),
            "after failure {}, the next call came {gap:?} later, expected about {nominal:?}: {calls:?}",
            n + 1
        );
        backoffs += 1;
    }
    Ok(backoffs)
}

/// A failing `decide` is retried with growing delays (1 s, 2 s, 4 s ... plus up to 20 %), each
/// failure counted and shown as a `CheckFailed` event, and the Workload is admitted once the
/// check answers: the backoff spares a failing backend without losing the Workload.
#[tokio::test]
async fn a_failing_check_is_retried_with_growing_delays_until_it_answers() -> Result<()> {
    let env = TestEnv::new("sdk-flaky").await?;
    let flaky = serve_flaky(&env, 3).await?;
    // Started, with the check resolved: its activation reconciles every Workload once, which
    // would come between a failure and its backoff.
    env.wait_active::<AdmissionCheck>(&flaky.check, "True", None)
        .await?;

    let wl = env.admitted_job("job").await?;
    let note = env.event_note(&wl, "CheckFailed").await?;
    let told = note.contains(&flaky.check) && note.contains("the backend is down");
    ensure!(told, "{note}");
    let calls = flaky
        .calls
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let backoffs = backoffs_between(&calls)?;
    ensure!(
        backoffs >= 2 && calls.len() >= 4,
        "the retries should mostly be the backoff's, not reactions to Workload changes: {calls:?}"
    );
    let (_, metrics) = e2e::http_get(flaky.http, "/metrics").await?;
    let errors = e2e::metric_sample(&metrics, "kueue_ac_reconcile_errors_total{kind=\"check\"}");
    assert_eq!(errors, Some(3.0), "{metrics}");
    Ok(())
}

/// A check that needs an API of another project (here a `Widget` CRD made for this test alone)
/// and answers `Ready` once it can work.
struct NeedsWidgets {
    controller_name: String,
    group: &'static str,
}

impl AdmissionCheckController for NeedsWidgets {
    type Parameters = NoParameters;
    type Error = Infallible;

    fn controller_name(&self) -> &str {
        &self.controller_name
    }

    fn required_apis(&self) -> Vec<ApiKind> {
        vec![ApiKind {
            group: self.group,
            version: "v1",
            kind: "Widget",
            plural: "widgets",
        }]
    }

    async fn decide(&self, _: &CheckContext<'_, NoParameters>) -> Result<Decision, Infallible> {
        Ok(Decision::ready("widgets are served"))
    }
}

/// The `Widget` CRD of `group`, serving `versions` (the first one stored).
fn widget_crd(group: &str, versions: &[&str]) -> serde_json::Value {
    let versions: Vec<_> = versions
        .iter()
        .enumerate()
        .map(|(i, v)| {
            json!({
                "name": v, "served": true, "storage": i == 0,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
            })
        })
        .collect();
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("widgets.{group}")},
        "spec": {
            "group": group,
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget", "listKind": "WidgetList"},
            "scope": "Namespaced",
            "versions": versions,
        },
    })
}

/// Waits until `check` is `Active=False` for `ApiNotServed` with a message containing
/// `saying` (`what` tells the case); returns the message.
async fn wait_not_served(env: &TestEnv, check: &str, what: &str, saying: &str) -> Result<String> {
    let ac = e2e::wait_for(
        Api::<AdmissionCheck>::all(env.client.clone()),
        check,
        &format!("Active=False ApiNotServed, {what}"),
        |ac: &AdmissionCheck| {
            ac.active_condition().is_some_and(|c| {
                c.status == "False" && c.reason == "ApiNotServed" && c.message.contains(saying)
            })
        },
    )
    .await?;
    Ok(ac
        .active_condition()
        .map(|c| c.message.clone())
        .unwrap_or_default())
}

/// A group of this test's own: `<namespace>.e2e.example.com` (a DNS subdomain).
fn widget_group_of(env: &TestEnv) -> &'static str {
    Box::leak(format!("{}.e2e.example.com", env.ns).into_boxed_str())
}

/// Runs a [`NeedsWidgets`] check of `controller_name` needing the `Widget`s of `group`.
fn run_needing_widgets(
    env: &TestEnv,
    controller_name: String,
    group: &'static str,
) -> e2e::Running {
    let widgets = NeedsWidgets {
        controller_name,
        group,
    };
    e2e::Running::check(env.client.clone(), widgets, env.runtime_config())
}

/// Deletes the `Widget` CRD of `group`.
async fn delete_widget_crd(env: &TestEnv, group: &str) -> Result<()> {
    Api::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>::all(env.client.clone())
        .delete(&format!("widgets.{group}"), &Default::default())
        .await?;
    Ok(())
}

/// Catalogue: an API the check needs missing, or served at another version, makes its
/// AdmissionCheck `Active=False` (`ApiNotServed`, naming the API and what the cluster serves);
/// Kueue then keeps the ClusterQueue inactive. Installing the CRD at the right version makes the
/// check active by itself, and Workloads are admitted through it.
#[tokio::test]
async fn a_check_whose_api_is_not_served_is_inactive_until_its_crd_is_installed() -> Result<()> {
    let env = TestEnv::new("sdk-api-served").await?;
    let controller_name = format!("e2e.kueue-admission-checks.dev/{}", env.ns);
    let queue = env.guarded_queue("check", &controller_name, "4").await?;
    let group = widget_group_of(&env);
    let _runtime = run_needing_widgets(&env, controller_name, group);
    let no_version = "serves no version of the API group";
    let message =
        wait_not_served(&env, &queue.check, "no version of the group", no_version).await?;
    let names_the_api = message.contains(&format!("widgets.{group}/v1 (Widget)"));
    let names_the_kind = message.contains("CustomResourceDefinition");
    assert!(names_the_api && names_the_kind, "{message}");
    env.wait_active::<ClusterQueue>(&queue.cluster_queue, "False", None)
        .await?;

    // Installed at another version: named, still inactive (looked at again with backoff).
    e2e::chart::apply(&env.client, &widget_crd(group, &["v1alpha1"]), "e2e").await?;
    wait_not_served(&env, &queue.check, "only at v1alpha1", "only at v1alpha1").await?;

    // Served at v1 too: active by itself, and a Job is admitted through the check.
    e2e::chart::apply(&env.client, &widget_crd(group, &["v1alpha1", "v1"]), "e2e").await?;
    env.wait_active::<AdmissionCheck>(&queue.check, "True", None)
        .await?;
    env.admitted_job("job").await?;
    delete_widget_crd(&env, group).await
}

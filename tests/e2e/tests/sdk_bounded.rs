//! No path holds quota without an answer (issues 26 and 31), against the real Kueue: an answer
//! Kueue would refuse, an answer a policy refuses (also while the controller is killed again
//! and again), an attempt record a policy refuses, a check that turns inactive, and an
//! enforcing check switched back to shadow mode. Each ends with the
//! quota given back (or the Workload admitted), and the reason on the entry on the way.
//!
//! The policies are ValidatingAdmissionPolicies: the API server enforces them itself, worded
//! and answered as a policy webhook's denial would be, bound to the test's namespace only.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use e2e::probe::{Probe, ProbeScript};
use e2e::{GuardedQueue, TestEnv};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use kueue_admission_sdk::api::{
    AdmissionCheck, CheckState, ClusterQueue, PodSetUpdate, Workload, workload_condition as cond,
};
use kueue_admission_sdk::retry::Backoff;
use kueue_admission_sdk::shadow::ShadowScope;
use kueue_admission_sdk::{Decision, RetryPolicy, RuntimeConfig};
use serde_json::json;

/// The permanent-failure hold of these tests: long enough to see the reason on the entry,
/// short enough to see the quota given back.
const HOLD: Duration = Duration::from_secs(3);

/// No delay between attempts, one retry: the second failure rejects.
fn one_retry() -> RetryPolicy {
    immediate_retries(1)
}

/// No delay between attempts, at most `limit` retries.
fn immediate_retries(limit: u32) -> RetryPolicy {
    RetryPolicy {
        backoff: Backoff::Immediate,
        retry_limit: Some(limit),
    }
}

/// Queues guarded by a check this test's probe answers, with the probe's script.
async fn probed(env: &TestEnv) -> Result<(GuardedQueue, Arc<ProbeScript>)> {
    let q = env
        .guarded_queue("check", &env.own_controller_name("bounded"), "4")
        .await?;
    Ok((q, ProbeScript::new()))
}

/// The probe of `q` running with `policy`, the short hold, its metrics served, and `tune`.
fn run_probe(
    env: &TestEnv,
    q: &GuardedQueue,
    script: &Arc<ProbeScript>,
    policy: RetryPolicy,
    tune: impl FnOnce(RuntimeConfig) -> RuntimeConfig,
) -> Result<e2e::Running> {
    let http = e2e::free_local_address()?;
    Ok(Probe::new(&q.controller_name, script.clone())
        .policy(policy)
        .run(env, env.client.clone(), |c| {
            tune(RuntimeConfig {
                permanent_failure_hold: HOLD,
                metrics_address: Some(http),
                health_address: Some(http),
                ..c
            })
        }))
}

fn message_of(wl: &Workload, check: &str) -> String {
    wl.admission_check(check)
        .map(|e| e.message.clone())
        .unwrap_or_default()
}

/// Waits until `check`'s entry on the Workload says something starting with `start` while the
/// Workload holds quota; returns the message.
async fn held_with(env: &TestEnv, wl: &str, check: &str, start: &str) -> Result<String> {
    let what = format!("quota held, entry Pending saying {start:?}");
    let seen = env
        .wait_workload(wl, &what, |w| {
            w.condition_is_true(cond::QUOTA_RESERVED)
                && w.admission_check(check)
                    .is_some_and(|e| e.state == CheckState::Pending && e.message.starts_with(start))
        })
        .await?;
    Ok(message_of(&seen, check))
}

/// Submits Job `job` (1 cpu) to `lq` and waits until its Workload holds quota with `q`'s check
/// `Pending`; returns the Workload's name.
async fn pending_with_quota(env: &TestEnv, q: &GuardedQueue) -> Result<String> {
    let wl = env.submit_job("job", "lq", "1").await?;
    env.wait_check_pending_with_quota(&wl, &q.check).await?;
    Ok(wl)
}

/// Waits until `check`'s entry carries the probe's unscripted "no answer yet" (and, if
/// `holding_quota`, while the Workload holds quota).
async fn probe_has_no_answer_yet(
    env: &TestEnv,
    wl: &str,
    check: &str,
    holding_quota: bool,
) -> Result<Workload> {
    env.wait_workload(wl, "the probe's Pending", |w| {
        (!holding_quota || w.condition_is_true(cond::QUOTA_RESERVED))
            && message_of(w, check) == "no answer yet"
    })
    .await
}

/// Whether the Workload is `Admitted`.
fn is_admitted(w: &Workload) -> bool {
    w.condition_is_true(cond::ADMITTED)
}

/// How the hold's message starts when `check`'s `Ready` cannot be written.
fn ready_unwritable(check: &str) -> String {
    format!("Permanent failure: the Ready answer of check {check} cannot be written")
}

/// How the hold's message starts when `check`'s `Retry` saying `message` cannot be counted.
fn retry_uncountable(check: &str, message: &str) -> String {
    format!(
        "Permanent failure: check {check} answered Retry ({message:?}), but it cannot be counted \
         on the Workload"
    )
}

/// How the hold's message starts when `check` cannot answer, and `why`.
fn cannot_answer(check: &str, why: &str) -> String {
    format!("check {check} cannot answer: {why}")
}

/// The attempt of every call the probe had for Job `job`, in order.
fn attempts_asked(script: &ProbeScript) -> Vec<u32> {
    script.calls_for("job").iter().map(|(_, a)| *a).collect()
}

/// Whether `check`'s entry was ever in `state` in `history`.
fn ever_in_state(history: &[Workload], check: &str, state: CheckState) -> bool {
    history
        .iter()
        .any(|w| w.admission_check(check).is_some_and(|e| e.state == state))
}

/// An update for the podset `name` that changes nothing else.
fn podset_update(name: &str) -> PodSetUpdate {
    PodSetUpdate {
        name: name.into(),
        ..Default::default()
    }
}

/// The runtime's count of attempt records the API server refused for `check`.
async fn records_refused(probe: &e2e::Running, check: &str) -> Result<Option<f64>> {
    let series = format!("kueue_ac_attempt_records_refused_total{{check=\"{check}\"}}");
    probe.metric(&series).await
}

/// The runtime settings in shadow mode for every ClusterQueue.
fn in_shadow_mode(config: RuntimeConfig) -> RuntimeConfig {
    RuntimeConfig {
        shadow: Some(ShadowScope::AllClusterQueues),
        ..config
    }
}

#[tokio::test]
async fn an_answer_kueue_would_refuse_is_shown_on_the_entry_then_retried_then_rejected()
-> Result<()> {
    let env = TestEnv::new("bounded-invalid").await?;
    let (q, script) = probed(&env).await?;
    let nope = podset_update("nope");
    script.answer("job", Decision::ready_with_updates("granted", vec![nope]));
    let _probe = run_probe(&env, &q, &script, one_retry(), |c| c)?;
    let mut recorder = env.record_workloads().await?;
    let wl = env.submit_job("job", "lq", "1").await?;
    let why = "a podSetUpdate for podset \"nope\", which the workload does not have";
    let start = format!("{}: {why}", ready_unwritable(&q.check));
    let message = held_with(&env, &wl, &q.check, &start).await?;
    assert!(message.contains("granted"), "{message}");
    // Not retried for ever: held, given back (Retry), asked again, and past the limit Rejected,
    // which Kueue answers with a deactivation.
    let history = recorder
        .until(&wl, "deactivated", |w| !w.is_active())
        .await?;
    let rejected = ever_in_state(&history, &q.check, CheckState::Rejected);
    let last = history.last().context("no version")?;
    let evicted = last.evictions("AdmissionCheck") >= 1;
    assert!(rejected && evicted, "{}", e2e::dump(last));
    let attempts = attempts_asked(&script);
    let both = attempts.contains(&1) && attempts.contains(&2);
    assert!(both, "{attempts:?}");
    let note = env.event_note(&wl, "CheckFailedPermanently").await?;
    assert!(note.contains("\"nope\""), "{note}");
    Ok(())
}

/// A ValidatingAdmissionPolicy denying what `expression` refuses on `resource` of Workloads
/// (`workloads` or `workloads/status`) with `reason` (`Forbidden`: 403, `Invalid`: 422), bound
/// to the test's namespace only.
async fn deny(
    env: &TestEnv,
    name: &str,
    resource: &str,
    (expression, reason): (&str, &str),
) -> Result<String> {
    let name = env.cluster_name(name);
    let message = "refused by the test's policy";
    e2e::entry_hold::deny_workload_updates(env, &name, resource, expression, message, Some(reason))
        .await?;
    Ok(name)
}

/// Waits until a dry run of `patch` on the Workload (its status if `status`) is refused by a
/// policy (403 or 422): the API server takes a moment to enforce a new binding.
async fn until_refused(
    env: &TestEnv,
    wl: &str,
    status: bool,
    patch: serde_json::Value,
) -> Result<()> {
    let pp = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    for _ in 0..100 {
        let result = if status {
            env.workloads()
                .patch_status(wl, &pp, &Patch::Merge(&patch))
                .await
        } else {
            env.workloads().patch(wl, &pp, &Patch::Merge(&patch)).await
        };
        match result {
            Err(kube::Error::Api(s)) if [403, 422].contains(&s.code) => return Ok(()),
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    bail!("the policy was never enforced on Workload {wl}")
}

/// A policy (403, as a webhook's denial) refusing every status write of the Workload whose
/// entries say "forbidden-word"; returns once the API server enforces it.
async fn refuse_the_forbidden_word(env: &TestEnv, wl: &str, check: &str) -> Result<()> {
    let expression = "!has(object.status.admissionChecks) || \
                      object.status.admissionChecks.all(c, !c.message.contains('forbidden-word'))";
    deny(
        env,
        "no-word",
        "workloads/status",
        (expression, "Forbidden"),
    )
    .await?;
    let word = json!({"status": {"admissionChecks": [{
        "name": check, "state": "Pending", "message": "forbidden-word",
        "lastTransitionTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now()),
    }]}});
    until_refused(env, wl, true, word).await
}

#[tokio::test]
async fn a_policys_denial_of_the_answer_is_permanent_not_rbac() -> Result<()> {
    let env = TestEnv::new("bounded-policy").await?;
    let (q, script) = probed(&env).await?;
    let answers = ["granted, forbidden-word", "granted"].map(Decision::ready);
    script.answers("job", answers.to_vec());
    let gate = script.gate("job");
    let _probe = run_probe(&env, &q, &script, one_retry(), |c| c)?;
    let wl = pending_with_quota(&env, &q).await?;
    refuse_the_forbidden_word(&env, &wl, &q.check).await?;
    gate.add_permits(100);
    let why = "a ValidatingAdmissionPolicy refused a request (403)";
    let start = format!("{}: {why}", ready_unwritable(&q.check));
    let message = held_with(&env, &wl, &q.check, &start).await?;
    assert!(!message.contains("forbidden-word"), "{message}");
    // After the hold the quota goes back; the next attempt's answer is admitted.
    let (admitted, _) = env.wait_admitted_ready(&wl, &q.check).await?;
    let evictions = admitted.evictions("AdmissionCheck");
    assert_eq!(evictions, 1, "{}", e2e::dump(&admitted));
    let attempts = attempts_asked(&script);
    assert_eq!(attempts.last(), Some(&2), "{attempts:?}");
    Ok(())
}

#[tokio::test]
async fn a_refused_attempt_record_holds_the_quota_then_the_retry_goes_uncounted() -> Result<()> {
    let env = TestEnv::new("bounded-record").await?;
    let (q, script) = probed(&env).await?;
    let answers = vec![Decision::retry("busy"), Decision::ready("granted")];
    script.answers("job", answers);
    let gate = script.gate("job");
    let probe = run_probe(&env, &q, &script, immediate_retries(3), |c| c)?;
    let mut recorder = env.record_workloads().await?;
    let wl = pending_with_quota(&env, &q).await?;
    refuse_attempt_records(&env, &wl, &q.check).await?;
    gate.add_permits(100);
    let why = "the API server refused the patch of annotation";
    let start = format!("{}: {why}", retry_uncountable(&q.check, "busy"));
    held_with(&env, &wl, &q.check, &start).await?;
    // After the hold: the Retry without its record; Kueue counts it (retryCount 1), so the
    // next attempt is attempt 2, which is admitted.
    let history = recorder.until(&wl, "admitted", is_admitted).await?;
    retried_uncounted(&history, &q.check)?;
    let attempts = attempts_asked(&script);
    assert_eq!(attempts.last(), Some(&2), "{attempts:?}");
    let note = env.event_note(&wl, "AttemptRecordRefused").await?;
    assert!(note.contains("refused by the test"), "{note}");
    // Counted once per attempt: the first attempt's Retry, and the second attempt's Ready,
    // whose record would only have caught up with Kueue's retryCount (written without it at
    // once, no hold).
    assert_eq!(records_refused(&probe, &q.check).await?, Some(2.0));
    Ok(())
}

/// A policy (422, as for annotations over their limit) refusing every attempt record on the
/// Workload; returns once the API server enforces it.
async fn refuse_attempt_records(env: &TestEnv, wl: &str, check: &str) -> Result<()> {
    let expression = "!has(object.metadata.annotations) || \
                      !object.metadata.annotations.exists(k, \
                      k.startsWith('attempts.kueue-admission-checks.dev/'))";
    deny(env, "no-record", "workloads", (expression, "Invalid")).await?;
    let record = json!({"metadata": {"annotations": {
        kueue_admission_sdk::attempts::annotation_key(check): "retries=1,evictions=0",
    }}});
    until_refused(env, wl, false, record).await
}

/// `check` answered `Retry` in `history` without an attempt record ever landing, and Kueue
/// counted it (`retryCount` 1 on the last version).
fn retried_uncounted(history: &[Workload], check: &str) -> Result<()> {
    let last = history.last().context("no version")?;
    ensure!(
        history.iter().all(|w| w
            .annotations()
            .keys()
            .all(|k| !k.starts_with("attempts.kueue-admission-checks.dev/"))),
        "a record landed:\n{}",
        e2e::dump(last)
    );
    ensure!(
        history.iter().any(|w| w
            .admission_check(check)
            .is_some_and(|e| e.state == CheckState::Retry)),
        "no Retry written"
    );
    let counted = last.admission_check(check).and_then(|e| e.retry_count);
    ensure!(
        counted == Some(1),
        "retryCount {counted:?}:\n{}",
        e2e::dump(last)
    );
    Ok(())
}

/// Bounds survive restarts (issue 31): a policy refuses the `Ready` write while the controller
/// is killed and started again more often than the hold lasts. Each new process reads the
/// hold's start from the entry, so the hold starts once: every message of it announces the same
/// deadline, and the `Retry` that gives the quota back comes after that deadline and within one
/// restart of it. (Counted in memory, as before, each restart started the hold again and the
/// quota was never given back.)
#[tokio::test]
async fn a_hold_survives_restarts_its_deadline_does_not_move_and_the_retry_lands() -> Result<()> {
    let env = TestEnv::new("bounded-restarts").await?;
    let (q, script) = probed(&env).await?;
    script.answer("job", Decision::ready("granted, forbidden-word"));
    let gate = script.gate("job");
    let mut probe = run_with_long_hold(&env, &q, &script)?;
    let mut recorder = env.record_workloads().await?;
    let wl = pending_with_quota(&env, &q).await?;
    refuse_the_forbidden_word(&env, &wl, &q.check).await?;
    gate.add_permits(1_000);
    let start = ready_unwritable(&q.check);
    held_with(&env, &wl, &q.check, &start).await?;
    let run_again = || run_with_long_hold(&env, &q, &script);
    let restarts = restart_until_evicted(&env, &wl, &mut probe, run_again).await?;
    assert!(restarts >= 2, "restarted {restarts} times within the hold");
    let evicted = |w: &Workload| w.evictions("AdmissionCheck") >= 1;
    let history = recorder.until(&wl, "evicted by the check", evicted).await?;
    let deadline = the_one_announced_deadline(&history, &q.check, &start)?;
    let retried = first_retry_at(&history, &q.check)?;
    // Within one restart (and a new process's start) of the deadline, never before it.
    let late = retried.duration_since(deadline);
    assert!(
        late >= SignedDuration::ZERO && late <= SignedDuration::from_secs(30),
        "Retry at {retried}, deadline {deadline}"
    );
    probe.stop().await
}

/// The hold of the restart test: longer than a few restarts.
const LONG_HOLD: Duration = Duration::from_secs(12);

/// How often the restart test kills its controller and starts it again.
const RESTART_EVERY: Duration = Duration::from_secs(4);

/// The probe of `q` with [`LONG_HOLD`].
fn run_with_long_hold(
    env: &TestEnv,
    q: &GuardedQueue,
    script: &Arc<ProbeScript>,
) -> Result<e2e::Running> {
    run_probe(env, q, script, one_retry(), |c| RuntimeConfig {
        permanent_failure_hold: LONG_HOLD,
        ..c
    })
}

/// Kills `probe` (as `kill -9` would) and starts another with `run`, each [`RESTART_EVERY`]
/// after it is ready (so that a slow start on a loaded machine still leaves each process a
/// moment to act), until a check's Retry has evicted the Workload; returns how many restarts
/// that took. A hold that starts again with each process would never end, so the restarts are
/// bounded.
async fn restart_until_evicted(
    env: &TestEnv,
    wl: &str,
    probe: &mut e2e::Running,
    run: impl Fn() -> Result<e2e::Running>,
) -> Result<u64> {
    let most = (LONG_HOLD + Duration::from_secs(60)).as_secs() / RESTART_EVERY.as_secs();
    for restarts in 0..=most {
        probe.wait_ready().await?;
        tokio::time::sleep(RESTART_EVERY).await;
        if env.workloads().get(wl).await?.evictions("AdmissionCheck") >= 1 {
            return Ok(restarts);
        }
        let killed = std::mem::replace(probe, run()?);
        killed.kill().await;
    }
    let now = env.workloads().get(wl).await?;
    bail!(
        "the quota was not given back after {most} restarts:\n{}",
        e2e::dump(&now)
    )
}

/// The one deadline every `Pending` message of `check` starting with `start` announced in
/// `history` (an error if it moved).
fn the_one_announced_deadline(history: &[Workload], check: &str, start: &str) -> Result<Timestamp> {
    let deadlines: std::collections::BTreeSet<String> = history
        .iter()
        .filter_map(|w| w.admission_check(check))
        .filter(|e| e.state == CheckState::Pending && e.message.starts_with(start))
        .filter_map(|e| e.message.split("keeps its quota until ").nth(1))
        .map(|rest| rest.chars().take(20).collect())
        .collect();
    ensure!(deadlines.len() == 1, "the deadline moved: {deadlines:?}");
    Ok(deadlines.iter().next().context("a deadline")?.parse()?)
}

/// When `check`'s first `Retry` in `history` was written.
fn first_retry_at(history: &[Workload], check: &str) -> Result<Timestamp> {
    let retried = history
        .iter()
        .filter_map(|w| w.admission_check(check))
        .find(|e| e.state == CheckState::Retry)
        .and_then(|e| e.last_transition_time.clone());
    let last = history.last().context("no version")?;
    Ok(retried
        .with_context(|| format!("no Retry written:\n{}", e2e::dump(last)))?
        .0)
}

/// Waits until the Workload was evicted by `reason` once, gave its quota back and Kueue keeps it
/// from quota because its ClusterQueue is inactive.
async fn given_back_and_waiting(env: &TestEnv, wl: &str, cq: &str) -> Result<Workload> {
    let what = format!("evicted once, quota given back, waiting: ClusterQueue {cq} is inactive");
    env.wait_workload(wl, &what, |w| {
        w.evictions("AdmissionCheck") == 1
            && w.condition(cond::QUOTA_RESERVED).is_some_and(|c| {
                c.status == "False"
                    && c.message
                        .contains(&format!("ClusterQueue {cq} is inactive"))
            })
    })
    .await
}

#[tokio::test]
async fn a_check_turned_inactive_holds_its_workloads_with_the_reason_then_gives_the_quota_back()
-> Result<()> {
    let env = TestEnv::new("bounded-inactive").await?;
    let (q, script) = probed(&env).await?;
    let _probe = run_probe(&env, &q, &script, RetryPolicy::default(), |c| c)?;
    // Submitted only once the queue admits: a Workload found inadmissible while the queue
    // still waited for the check once stayed so for over a minute after it turned active.
    env.wait_active::<ClusterQueue>(&q.cluster_queue, "True", None)
        .await?;
    let wl = env.submit_job("job", "lq", "1").await?;
    probe_has_no_answer_yet(&env, &wl, &q.check, false).await?;
    let bad = json!({"apiGroup": "example.com", "kind": "Budget", "name": "weekly"});
    env.set_check_parameters(&q.check, bad).await?;
    let why = "its AdmissionCheck is not active (BadParametersRef: this check takes no parameters";
    let message = held_with(&env, &wl, &q.check, &cannot_answer(&q.check, why)).await?;
    assert!(message.contains("keeps its quota until"), "{message}");
    env.event_note(&wl, "CheckCannotAnswer").await?;
    given_back_and_waiting(&env, &wl, &q.cluster_queue).await?;
    // Fixed: active again, the Workload gets quota again and is answered.
    script.answer("job", Decision::ready("granted"));
    env.set_check_parameters(&q.check, serde_json::Value::Null)
        .await?;
    let (admitted, entry) = env.wait_admitted_ready(&wl, &q.check).await?;
    assert_eq!(entry.message, "granted", "{}", e2e::dump(&admitted));
    Ok(())
}

/// Switching an enforcing check back to shadow mode: the Workload that held quota waiting for
/// it is told why, gives the quota back after the hold, and waits in its queue; removing the
/// check from the ClusterQueue (the rest of the rollback) admits it.
#[tokio::test]
async fn switching_an_enforcing_check_back_to_shadow_mode_strands_no_quota() -> Result<()> {
    let env = TestEnv::new("bounded-shadow").await?;
    let (q, script) = probed(&env).await?;
    let enforcing = run_probe(&env, &q, &script, RetryPolicy::default(), |c| c)?;
    let wl = env.submit_job("job", "lq", "1").await?;
    probe_has_no_answer_yet(&env, &wl, &q.check, true).await?;
    enforcing.stop().await?;

    let _shadow = run_probe(&env, &q, &script, RetryPolicy::default(), in_shadow_mode)?;
    env.wait_active::<AdmissionCheck>(&q.check, "False", Some("ShadowMode"))
        .await?;
    let why = "its controller runs in shadow mode (--shadow)";
    held_with(&env, &wl, &q.check, &cannot_answer(&q.check, why)).await?;
    given_back_and_waiting(&env, &wl, &q.cluster_queue).await?;
    env.wait_job_suspend("job", true).await?;

    // The rest of the rollback: the ClusterQueue no longer waits for the check.
    env.remove_queue_checks(&q.cluster_queue).await?;
    let admitted = env.wait_admitted(&wl).await?;
    let entry = admitted.admission_check(&q.check);
    assert!(entry.is_none(), "{}", e2e::dump(&admitted));
    Ok(())
}

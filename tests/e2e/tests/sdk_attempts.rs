//! Attempt numbers with several checks on one ClusterQueue, against the real Kueue.
//!
//! Kueue drops the `retryCount` of a `Ready` entry when another check's `Retry` evicts the
//! Workload (`kueue_contract::another_checks_eviction_drops_the_retry_count_of_a_ready_entry`).
//! The SDK counts each check's own retries on the Workload instead: here every check's attempt
//! must never go back, backoff must grow with it, the retry limit must deactivate the Workload,
//! a restarted controller must keep the count, and the Workload must be admitted once every
//! check answers `Ready`.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, ensure};
use e2e::TestEnv;
use e2e::probe::{Probe, ProbeScript};
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use kueue_admission_sdk::api::{
    AdmissionCheckState, CheckState, Workload, workload_condition as cond,
};
use kueue_admission_sdk::{Decision, RetryPolicy, attempts};
use serde_json::json;

/// One check: its AdmissionCheck, script, and the runtime serving it (while it runs).
struct Check {
    name: String,
    controller_name: String,
    policy: RetryPolicy,
    revalidate: Option<Duration>,
    script: Arc<ProbeScript>,
    running: Option<e2e::Running>,
}

impl Check {
    fn start(&mut self, env: &TestEnv) {
        let probe = Probe::new(&self.controller_name, self.script.clone())
            .policy(self.policy.clone())
            .revalidate_every(self.revalidate);
        self.running = Some(probe.run(env, env.client.clone(), |config| config));
    }

    /// Ends the runtime without any clean-up, as `kill -9` would.
    async fn kill(&mut self) {
        if let Some(running) = self.running.take() {
            running.kill().await;
        }
    }

    async fn stop(&mut self) -> Result<()> {
        match self.running.take() {
            Some(running) => running.stop().await,
            None => Ok(()),
        }
    }
}

/// A ClusterQueue with one check per `(short name, policy, revalidate, otherwise)`, each served
/// by its own runtime, and a LocalQueue `lq`.
async fn checks_on_one_queue(env: &TestEnv, specs: Vec<Spec>) -> Result<Vec<Check>> {
    let flavor = env.resource_flavor("default").await?.name_any();
    let mut checks = Vec::new();
    for (short, policy, revalidate, otherwise) in specs {
        let controller_name = format!("e2e.kueue-admission-checks.dev/{}-{short}", env.ns);
        let name = env
            .admission_check(short, &controller_name)
            .await?
            .name_any();
        let script = ProbeScript::new();
        script.otherwise(otherwise);
        checks.push(Check {
            name,
            controller_name,
            policy,
            revalidate,
            script,
            running: None,
        });
    }
    let names: Vec<&str> = checks.iter().map(|c| c.name.as_str()).collect();
    env.queues_on(&flavor, "4", &names).await?;
    for check in &mut checks {
        check.start(env);
    }
    Ok(checks)
}

fn ensure_never_decreasing(check: &str, attempts: &[u32]) -> Result<()> {
    ensure!(
        attempts.windows(2).all(|w| w[0] <= w[1]),
        "check {check}'s attempt went back: {attempts:?}"
    );
    Ok(())
}

/// What `checks_on_one_queue` makes of a check: short name, policy, revalidation, and what it
/// answers when its script says nothing else.
type Spec = (&'static str, RetryPolicy, Option<Duration>, Decision);

/// Whole seconds.
fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// A check that retries at once and has not made up its mind until its script says so.
fn undecided(short: &'static str) -> Spec {
    let otherwise = Decision::pending(format!("{short} has not made up its mind"));
    (short, RetryPolicy::immediate(), None, otherwise)
}

/// A check that retries at once, revalidates every `revalidate` if given, and passes.
fn passing(short: &'static str, revalidate: Option<Duration>) -> Spec {
    let otherwise = Decision::ready(format!("{short}: passes"));
    (short, RetryPolicy::immediate(), revalidate, otherwise)
}

/// Ensures each check's last call was on attempt 2.
fn ensure_last_asked_at_2(checks: &[(&String, &Arc<ProbeScript>)]) -> Result<()> {
    for (check, script) in checks {
        let asked = script.attempts();
        ensure!(asked.last() == Some(&2), "check {check}: {asked:?}");
    }
    Ok(())
}

/// The attempts, each run of repeats counted once.
fn distinct(attempts: &[u32]) -> Vec<u32> {
    let mut distinct = attempts.to_vec();
    distinct.dedup();
    distinct
}

/// Waits until the Workload was preempted (an eviction for `Preempted`).
async fn preempted(env: &TestEnv, wl: &str) -> Result<Workload> {
    env.wait_workload(wl, "preempted", |w| w.evictions("Preempted") >= 1)
        .await
}

/// `a`'s next four answers: `Retry`, `Ready`, `Retry`, `Retry`.
fn a_retries_passes_then_retries_twice(a_script: &ProbeScript) {
    a_script.then(Decision::retry("a: not yet"));
    a_script.then(Decision::ready("a: passes"));
    a_script.then(Decision::retry("a: not yet again"));
    a_script.then(Decision::retry("a: still not"));
}

/// Stops every check's runtime, in turn.
async fn stop_all(checks: &mut [Check]) -> Result<()> {
    for check in checks {
        check.stop().await?;
    }
    Ok(())
}

/// The `requeueAfterSeconds` of a `Retry` entry (0 if none).
fn retry_delay(entry: &AdmissionCheckState) -> i32 {
    entry.requeue_after_seconds.unwrap_or(0)
}

/// `b` answers `Retry` on its attempt 1 and `Ready` after (asked again on a change of the
/// Workload, it gives the same answer for the same attempt); the Workload is touched so that b
/// is asked at once.
async fn b_retries_once(env: &TestEnv, wl: &str, b_script: &ProbeScript) -> Result<()> {
    b_script.on_attempt(1, Decision::retry("b: try again"));
    b_script.otherwise(Decision::ready("b: passes"));
    env.touch_workload(wl, "b-retries").await?;
    Ok(())
}

/// While `a`'s controller is down, `b` retries once: waits until Kueue has evicted the Workload
/// again and reset `a`'s entry to `Pending`; returns that version.
async fn evicted_by_b_while_a_is_down(
    env: &TestEnv,
    wl: &str,
    a: &str,
    b_script: &ProbeScript,
) -> Result<Workload> {
    let before = env.workloads().get(wl).await?.total_evictions();
    b_retries_once(env, wl, b_script).await?;
    env.wait_workload(wl, "evicted by b, a reset to Pending", |w| {
        w.total_evictions() > before
            && w.admission_check(a)
                .is_some_and(|e| e.state == CheckState::Pending)
    })
    .await
}

/// `b` retries once: waits until Kueue has evicted the Workload and reserved quota again.
async fn evicted_by_b(env: &TestEnv, wl: &str, b_script: &ProbeScript) -> Result<Workload> {
    b_retries_once(env, wl, b_script).await?;
    env.wait_next_attempt(wl).await
}

/// Ensures Kueue dropped `a`'s `retryCount` with the reset (the scenario needs it) while the
/// attempt read from the Workload stayed 2.
fn ensure_count_dropped_but_attempt_kept(reset: &Workload, a: &str) -> Result<()> {
    ensure!(
        reset
            .admission_check(a)
            .and_then(|e| e.retry_count)
            .is_none(),
        "Kueue kept a's retryCount; the scenario needs it dropped:\n{}",
        e2e::dump(reset)
    );
    ensure!(
        attempts::attempt(reset, a) == 2,
        "a's attempt read from the Workload: {}\n{}",
        attempts::attempt(reset, a),
        e2e::dump(reset)
    );
    Ok(())
}

/// Ensures the second delay is longer than the first: 2 or 3 s, then 4 or 5 s.
fn ensure_backoff_grew(first_delay: i32, second_delay: i32) -> Result<()> {
    ensure!(
        second_delay > first_delay
            && (4..=5).contains(&second_delay)
            && (2..=3).contains(&first_delay),
        "backoff did not grow with the attempt: {first_delay}s then {second_delay}s"
    );
    Ok(())
}

/// Ensures `c`'s carried-over `Retry` was counted once (attempt 2 on the Workload) and `c` was
/// asked once per attempt, not again for the carried Retry.
fn ensure_carried_retry_counted_once(
    admitted: &Workload,
    c: &str,
    c_script: &ProbeScript,
) -> Result<()> {
    ensure!(
        attempts::attempt(admitted, c) == 2,
        "c's carried Retry counted once: attempt {}\n{}",
        attempts::attempt(admitted, c),
        e2e::dump(admitted)
    );
    ensure!(
        c_script.attempts() == [1, 2],
        "c is asked once per attempt, not for the carried Retry: {:?}",
        c_script.attempts()
    );
    Ok(())
}

/// Waits until the Workload was evicted again (more than `evictions`) and is admitted again.
async fn admitted_again_after(env: &TestEnv, wl: &str, evictions: i32) -> Result<Workload> {
    env.wait_workload(wl, "admitted again after a's withdrawal", |w| {
        w.total_evictions() > evictions && w.condition_is_true(cond::ADMITTED)
    })
    .await
}

/// Ensures every check's attempt never went back and each ends at attempt 2 (retried once).
fn ensure_each_retried_once(
    again: &Workload,
    names: &[String],
    scripts: &[Arc<ProbeScript>],
) -> Result<()> {
    for (check, script) in names.iter().zip(scripts) {
        ensure_never_decreasing(check, &script.attempts())?;
        ensure!(
            attempts::attempt(again, check) == 2,
            "check {check} ends at attempt {} (each retried once):\n{}",
            attempts::attempt(again, check),
            e2e::dump(again)
        );
    }
    Ok(())
}

/// Ensures the check was asked after the preemption (the calls after the first `before`), and
/// only on attempt 2.
fn ensure_asked_at_2_after(asked: &[u32], before: usize) -> Result<()> {
    let after_preemption = asked.get(before..).unwrap_or_default();
    ensure!(
        !after_preemption.is_empty() && after_preemption.iter().all(|a| *a == 2),
        "after the preemption the check was asked {asked:?} (want 2 again)"
    );
    Ok(())
}

/// Two checks: `a` retries, passes, loses its `Ready` (and Kueue's count) to `b`'s eviction
/// while its controller is down, and, restarted, goes on from the attempt it had reached: its
/// backoff grows and its retry limit rejects the Workload.
#[tokio::test]
async fn attempts_survive_other_checks_evictions_and_restarts_and_the_limit_rejects() -> Result<()>
{
    let env = TestEnv::new("attempts-two").await?;
    // a: 2 s, then 4 s; at most 2 retries, so a Retry on attempt 3 rejects.
    let a_policy = RetryPolicy::exponential(secs(2), 2.0, secs(60), 0.0).with_retry_limit(2);
    let a_spec = ("a", a_policy, None, Decision::pending("unscripted"));
    let mut checks = checks_on_one_queue(&env, vec![a_spec, undecided("b")]).await?;
    let (a, b) = (checks[0].name.clone(), checks[1].name.clone());
    let (a_script, b_script) = (checks[0].script.clone(), checks[1].script.clone());
    a_retries_passes_then_retries_twice(&a_script);

    let wl = env.submit_job("job", "lq", "1").await?;
    let first_delay = retry_delay(&env.wait_entry(&wl, &a, CheckState::Retry).await?.1);
    env.wait_entry(&wl, &a, CheckState::Ready).await?;
    ensure!(a_script.attempts() == [1, 2], "{:?}", a_script.attempts());

    // a's controller dies; b now retries: Kueue evicts and resets a's Ready without its count.
    checks[0].kill().await;
    let reset = evicted_by_b_while_a_is_down(&env, &wl, &a, &b_script).await?;
    ensure_count_dropped_but_attempt_kept(&reset, &a)?;

    // Restarted, a goes on at attempt 2: its second Retry waits twice as long.
    checks[0].start(&env);
    let (_, second) = env.wait_entry(&wl, &a, CheckState::Retry).await?;
    let on_attempt_2 = second.message.contains("attempt 2 of 3");
    ensure!(on_attempt_2, "{}", second.message);
    ensure_backoff_grew(first_delay, retry_delay(&second))?;

    // Attempt 3: a Retry past the limit becomes Rejected, and Kueue deactivates the Workload.
    let rejected = env.wait_deactivated(&wl).await?;
    let note = env.event_note(&wl, "CheckRejected").await?;
    let told = note.contains("attempt 3: no retries left after 2");
    ensure!(told, "{note}");
    let asked = a_script.attempts();
    ensure!(asked == [1, 2, 2, 3], "a was asked at attempts {asked:?}");
    ensure_never_decreasing(&b, &b_script.attempts())?;
    let retries = attempts::record(&rejected, &a).map(|r| r.retries);
    ensure!(retries == Some(2), "{}", e2e::dump(&rejected));
    stop_all(&mut checks).await
}

/// Three checks: `c`'s delayed `Retry` arrives after `b`'s eviction (carried over, counted
/// once); all pass and the Workload is admitted; then `a` withdraws its `Ready`, Kueue evicts
/// the admitted Workload and drops `b`'s and `c`'s counts, and each goes on from its attempt
/// until the Workload is admitted again.
#[tokio::test]
async fn three_checks_a_late_retry_and_a_withdrawn_ready_keep_every_attempt() -> Result<()> {
    let env = TestEnv::new("attempts-three").await?;
    let (a_spec, c_spec) = (passing("a", Some(secs(1))), passing("c", None));
    let mut checks = checks_on_one_queue(&env, vec![a_spec, undecided("b"), c_spec]).await?;
    let names: Vec<String> = checks.iter().map(|c| c.name.clone()).collect();
    let (a, b, c) = (&names[0], &names[1], &names[2]);
    let scripts: Vec<Arc<ProbeScript>> = checks.iter().map(|c| c.script.clone()).collect();
    let busy = Decision::retry_after("c: the licence server is busy", secs(10));
    let c_gate = scripts[2].then_gated(busy);

    let wl = env.submit_job("job", "lq", "1").await?;
    scripts[2].wait_asked("job", "c deciding").await?;
    env.wait_entry(&wl, a, CheckState::Ready).await?;

    // While c decides, b retries: Kueue evicts and reserves quota again.
    evicted_by_b(&env, &wl, &scripts[1]).await?;
    // c's answer arrives late: refused, carried over to this attempt for what is left of it.
    c_gate.add_permits(1);
    env.wait_entry(&wl, c, CheckState::Retry).await?;
    let note = env.event_note(&wl, "CheckRetryCarriedOver").await?;
    ensure!(note.contains(c.as_str()), "{note}");

    // After c's delay every check passes.
    let admitted = env.wait_admitted(&wl).await?;
    ensure_carried_retry_counted_once(&admitted, c, &scripts[2])?;

    // a withdraws its Ready: Kueue evicts the admitted Workload and resets b's and c's Ready
    // entries without their retryCount.
    let evictions = admitted.total_evictions();
    scripts[0].then(Decision::retry_after("a: withdrawn", Duration::ZERO));
    let again = admitted_again_after(&env, &wl, evictions).await?;
    ensure_each_retried_once(&again, &names, &scripts)?;
    // Asked after the withdrawal's eviction, b and c were still at attempt 2.
    ensure_last_asked_at_2(&[(b, &scripts[1]), (c, &scripts[2])])?;
    stop_all(&mut checks).await
}

/// A WorkloadPriorityClass (cluster scoped), for Jobs to name with
/// `kueue.x-k8s.io/priority-class`.
async fn priority_class(env: &TestEnv, name: &str, value: i32) -> Result<()> {
    use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "kueue.x-k8s.io",
        "v1beta2",
        "WorkloadPriorityClass",
    ));
    let class: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "WorkloadPriorityClass",
        "metadata": {"name": name},
        "value": value,
    }))?;
    Api::<DynamicObject>::all_with(env.client.clone(), &resource)
        .create(&PostParams::default(), &class)
        .await?;
    Ok(())
}

/// Submits the Job `name` (3 cpu) of the WorkloadPriorityClass `class`; returns its Workload.
async fn job_of_class(env: &TestEnv, name: &str, class: &str) -> Result<String> {
    env.submit(&e2e::SuspendedJob {
        labels: &[("kueue.x-k8s.io/priority-class", class)],
        ..e2e::SuspendedJob::new(name, "lq", "3")
    })
    .await
}

/// Preemption within the test's ClusterQueue, by priority, and two WorkloadPriorityClasses of
/// its own; returns the names of the low (10) and the high (1000) class.
async fn preemption_by_priority(env: &TestEnv) -> Result<(String, String)> {
    let cq = env.cluster_name("cq");
    let preemption = json!({"spec": {"preemption": {"withinClusterQueue": "LowerPriority"}}});
    kube::Api::<kueue_admission_sdk::api::ClusterQueue>::all(env.client.clone())
        .patch(&cq, &PatchParams::default(), &Patch::Merge(&preemption))
        .await?;
    let (low_class, high_class) = (format!("{}-low", env.ns), format!("{}-high", env.ns));
    priority_class(env, &low_class, 10).await?;
    priority_class(env, &high_class, 1000).await?;
    Ok((low_class, high_class))
}

/// Preemption is an eviction too, and not a retry: a low-priority Workload that retried once
/// and was admitted on attempt 2 is preempted by a high-priority one (eviction reason
/// `Preempted`, quota taken away, entries reset), and once it gets quota again it is asked on
/// attempt 2 still: not 1 (the count kept), not 3 (no Retry was answered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preemption_keeps_the_attempt_and_is_not_counted_as_a_retry() -> Result<()> {
    let env = TestEnv::new("sdk-attempts-preempt").await?;
    let policy = RetryPolicy::fixed(secs(1)).with_retry_limit(3);
    let spec = ("a", policy, None, Decision::ready("fine"));
    let mut checks = checks_on_one_queue(&env, vec![spec]).await?;
    let (check, script) = (checks[0].name.clone(), checks[0].script.clone());
    let (low_class, high_class) = preemption_by_priority(&env).await?;

    // The low one: Retry on attempt 1, Ready on attempt 2.
    script.then(Decision::retry("not yet"));
    let low = job_of_class(&env, "low", &low_class).await?;
    env.wait_admitted(&low).await?;
    // Asked on attempt 1, then on attempt 2. The same attempt may be asked twice: after a
    // write conflict with a Workload whose spec, labels or annotations changed meanwhile, the
    // runtime asks again (writing-a-check.md); a CI run saw [1, 1, 2] here once.
    let before_preemption = script.attempts_of(&low);
    let once_each = distinct(&before_preemption) == [1, 2];
    ensure!(once_each, "{before_preemption:?}");

    // The high one takes the quota: the low one is preempted.
    let high = job_of_class(&env, "high", &high_class).await?;
    let preempted = preempted(&env, &low).await?;
    let kept = attempts::attempt(&preempted, &check) == 2;
    let why = "the stored attempt changed with the preemption";
    ensure!(kept, "{why}: {}", e2e::dump(&preempted));
    env.wait_admitted(&high).await?;

    // The high one ends; the low one gets quota again and is asked on attempt 2.
    env.complete_job("high", &high).await?;
    let again = env.wait_admitted(&low).await?;
    let asked = script.attempts_of(&low);
    ensure_asked_at_2_after(&asked, before_preemption.len())?;
    ensure_never_decreasing(&check, &asked)?;
    let at_2 = attempts::attempt(&again, &check) == 2;
    ensure!(at_2, "{}", e2e::dump(&again));
    ensure!(again.evictions("Preempted") == 1, "{}", e2e::dump(&again));
    stop_all(&mut checks).await
}

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
use kueue_admission_sdk::api::{CheckState, Workload, workload_condition as cond};
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
async fn checks_on_one_queue(
    env: &TestEnv,
    specs: Vec<(&str, RetryPolicy, Option<Duration>, Decision)>,
) -> Result<Vec<Check>> {
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

fn entry_of<'a>(
    wl: &'a Workload,
    check: &str,
) -> Option<&'a kueue_admission_sdk::api::AdmissionCheckState> {
    wl.admission_check(check)
}

/// Changes the Workload so that every controller reconciles it (and asks a Pending check).
async fn touch(env: &TestEnv, wl: &str, value: &str) -> Result<()> {
    env.workloads()
        .patch(
            wl,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"e2e-touch": value}}})),
        )
        .await?;
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
    let a_policy =
        RetryPolicy::exponential(Duration::from_secs(2), 2.0, Duration::from_secs(60), 0.0)
            .with_retry_limit(2);
    let mut checks = checks_on_one_queue(
        &env,
        vec![
            ("a", a_policy, None, Decision::pending("unscripted")),
            (
                "b",
                RetryPolicy::immediate(),
                None,
                Decision::pending("b has not made up its mind"),
            ),
        ],
    )
    .await?;
    let (a, b) = (checks[0].name.clone(), checks[1].name.clone());
    let (a_script, b_script) = (checks[0].script.clone(), checks[1].script.clone());
    a_script.then(Decision::retry("a: not yet"));
    a_script.then(Decision::ready("a: passes"));
    a_script.then(Decision::retry("a: not yet again"));
    a_script.then(Decision::retry("a: still not"));

    let wl = env.submit_job("job", "lq", "1").await?;
    let first = env
        .wait_workload(&wl, "a's first Retry", |w| {
            entry_of(w, &a).is_some_and(|e| e.state == CheckState::Retry)
        })
        .await?;
    let first_delay = entry_of(&first, &a)
        .and_then(|e| e.requeue_after_seconds)
        .unwrap_or(0);
    env.wait_workload(&wl, "a Ready on its second attempt", |w| {
        entry_of(w, &a).is_some_and(|e| e.state == CheckState::Ready)
    })
    .await?;
    ensure!(a_script.attempts() == [1, 2], "{:?}", a_script.attempts());

    // a's controller dies; b now retries: Kueue evicts and resets a's Ready without its count.
    checks[0].kill().await;
    let before = env.workloads().get(&wl).await?.total_evictions();
    // Asked again on a change of the Workload, b gives the same answer for the same attempt.
    b_script.on_attempt(1, Decision::retry("b: try again"));
    b_script.otherwise(Decision::ready("b: passes"));
    touch(&env, &wl, "b-retries").await?;
    let reset = env
        .wait_workload(&wl, "evicted by b, a reset to Pending", |w| {
            w.total_evictions() > before
                && entry_of(w, &a).is_some_and(|e| e.state == CheckState::Pending)
        })
        .await?;
    ensure!(
        entry_of(&reset, &a).and_then(|e| e.retry_count).is_none(),
        "Kueue kept a's retryCount; the scenario needs it dropped:\n{}",
        e2e::dump(&reset)
    );
    ensure!(
        attempts::attempt(&reset, &a) == 2,
        "a's attempt read from the Workload: {}\n{}",
        attempts::attempt(&reset, &a),
        e2e::dump(&reset)
    );

    // Restarted, a goes on at attempt 2: its second Retry waits twice as long.
    checks[0].start(&env);
    let second = env
        .wait_workload(&wl, "a's second Retry", |w| {
            entry_of(w, &a).is_some_and(|e| e.state == CheckState::Retry)
        })
        .await?;
    let entry = entry_of(&second, &a).cloned().unwrap_or_default();
    ensure!(
        entry.message.contains("attempt 2 of 3"),
        "{}",
        entry.message
    );
    let second_delay = entry.requeue_after_seconds.unwrap_or(0);
    ensure!(
        second_delay > first_delay
            && (4..=5).contains(&second_delay)
            && (2..=3).contains(&first_delay),
        "backoff did not grow with the attempt: {first_delay}s then {second_delay}s"
    );

    // Attempt 3: a Retry past the limit becomes Rejected, and Kueue deactivates the Workload.
    let rejected = env
        .wait_workload(&wl, "deactivated after a's Rejected", |w| !w.is_active())
        .await?;
    let note = env.event_note(&wl, "CheckRejected").await?;
    ensure!(
        note.contains("attempt 3: no retries left after 2"),
        "{note}"
    );
    ensure!(
        a_script.attempts() == [1, 2, 2, 3],
        "a was asked at attempts {:?}",
        a_script.attempts()
    );
    ensure_never_decreasing(&b, &b_script.attempts())?;
    ensure!(
        attempts::record(&rejected, &a).is_some_and(|r| r.retries == 2),
        "{}",
        e2e::dump(&rejected)
    );
    for check in &mut checks {
        check.stop().await?;
    }
    Ok(())
}

/// Three checks: `c`'s delayed `Retry` arrives after `b`'s eviction (carried over, counted
/// once); all pass and the Workload is admitted; then `a` withdraws its `Ready`, Kueue evicts
/// the admitted Workload and drops `b`'s and `c`'s counts, and each goes on from its attempt
/// until the Workload is admitted again.
#[tokio::test]
async fn three_checks_a_late_retry_and_a_withdrawn_ready_keep_every_attempt() -> Result<()> {
    let env = TestEnv::new("attempts-three").await?;
    let mut checks = checks_on_one_queue(
        &env,
        vec![
            (
                "a",
                RetryPolicy::immediate(),
                Some(Duration::from_secs(1)),
                Decision::ready("a: passes"),
            ),
            (
                "b",
                RetryPolicy::immediate(),
                None,
                Decision::pending("b has not made up its mind"),
            ),
            (
                "c",
                RetryPolicy::immediate(),
                None,
                Decision::ready("c: passes"),
            ),
        ],
    )
    .await?;
    let names: Vec<String> = checks.iter().map(|c| c.name.clone()).collect();
    let (a, b, c) = (&names[0], &names[1], &names[2]);
    let scripts: Vec<Arc<ProbeScript>> = checks.iter().map(|c| c.script.clone()).collect();
    let c_gate = scripts[2].then_gated(Decision::retry_after(
        "c: the licence server is busy",
        Duration::from_secs(10),
    ));

    let wl = env.submit_job("job", "lq", "1").await?;
    let c_script = scripts[2].clone();
    e2e::eventually("c deciding", || !c_script.attempts().is_empty()).await?;
    env.wait_workload(&wl, "a Ready", |w| {
        entry_of(w, a).is_some_and(|e| e.state == CheckState::Ready)
    })
    .await?;

    // While c decides, b retries: Kueue evicts and reserves quota again.
    scripts[1].on_attempt(1, Decision::retry("b: try again"));
    scripts[1].otherwise(Decision::ready("b: passes"));
    touch(&env, &wl, "b-retries").await?;
    env.wait_workload(&wl, "evicted by b and holding quota again", |w| {
        w.total_evictions() >= 1
            && w.condition_is_true(cond::QUOTA_RESERVED)
            && !w.condition_is_true(cond::EVICTED)
    })
    .await?;
    // c's answer arrives late: refused, carried over to this attempt for what is left of it.
    c_gate.add_permits(1);
    env.wait_workload(&wl, "c's carried-over Retry written", |w| {
        entry_of(w, c).is_some_and(|e| e.state == CheckState::Retry)
    })
    .await?;
    let note = env.event_note(&wl, "CheckRetryCarriedOver").await?;
    ensure!(note.contains(c.as_str()), "{note}");

    // After c's delay every check passes.
    let admitted = env.wait_admitted(&wl).await?;
    ensure!(
        attempts::attempt(&admitted, c) == 2,
        "c's carried Retry counted once: attempt {}\n{}",
        attempts::attempt(&admitted, c),
        e2e::dump(&admitted)
    );
    ensure!(
        scripts[2].attempts() == [1, 2],
        "c is asked once per attempt, not for the carried Retry: {:?}",
        scripts[2].attempts()
    );

    // a withdraws its Ready: Kueue evicts the admitted Workload and resets b's and c's Ready
    // entries without their retryCount.
    let evictions = admitted.total_evictions();
    scripts[0].then(Decision::retry_after("a: withdrawn", Duration::ZERO));
    let again = env
        .wait_workload(&wl, "admitted again after a's withdrawal", |w| {
            w.total_evictions() > evictions && w.condition_is_true(cond::ADMITTED)
        })
        .await?;
    for (check, script) in names.iter().zip(&scripts) {
        ensure_never_decreasing(check, &script.attempts())?;
        ensure!(
            attempts::attempt(&again, check) == 2,
            "check {check} ends at attempt {} (each retried once):\n{}",
            attempts::attempt(&again, check),
            e2e::dump(&again)
        );
    }
    // Asked after the withdrawal's eviction, b and c were still at attempt 2.
    for (check, script) in [(b, &scripts[1]), (c, &scripts[2])] {
        ensure!(
            script.attempts().last() == Some(&2),
            "check {check}: {:?}",
            script.attempts()
        );
    }
    for check in &mut checks {
        check.stop().await?;
    }
    Ok(())
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

/// Preemption is an eviction too, and not a retry: a low-priority Workload that retried once
/// and was admitted on attempt 2 is preempted by a high-priority one (eviction reason
/// `Preempted`, quota taken away, entries reset), and once it gets quota again it is asked on
/// attempt 2 still: not 1 (the count kept), not 3 (no Retry was answered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preemption_keeps_the_attempt_and_is_not_counted_as_a_retry() -> Result<()> {
    let env = TestEnv::new("sdk-attempts-preempt").await?;
    let policy = RetryPolicy::fixed(Duration::from_secs(1)).with_retry_limit(3);
    let mut checks =
        checks_on_one_queue(&env, vec![("a", policy, None, Decision::ready("fine"))]).await?;
    let check = checks[0].name.clone();
    let script = checks[0].script.clone();
    // Preemption within the ClusterQueue, by priority.
    let cq = env.cluster_name("cq");
    let preemption = json!({"spec": {"preemption": {"withinClusterQueue": "LowerPriority"}}});
    kube::Api::<kueue_admission_sdk::api::ClusterQueue>::all(env.client.clone())
        .patch(&cq, &PatchParams::default(), &Patch::Merge(&preemption))
        .await?;
    let (low_class, high_class) = (format!("{}-low", env.ns), format!("{}-high", env.ns));
    priority_class(&env, &low_class, 10).await?;
    priority_class(&env, &high_class, 1000).await?;

    // The low one: Retry on attempt 1, Ready on attempt 2.
    script.then(Decision::retry("not yet"));
    let low = job_of_class(&env, "low", &low_class).await?;
    env.wait_admitted(&low).await?;
    // Asked on attempt 1, then on attempt 2. The same attempt may be asked twice: after a
    // write conflict with a Workload whose spec, labels or annotations changed meanwhile, the
    // runtime asks again (writing-a-check.md); a CI run saw [1, 1, 2] here once.
    let before_preemption = script.attempts_of(&low);
    let mut distinct = before_preemption.clone();
    distinct.dedup();
    ensure!(distinct == [1, 2], "{before_preemption:?}");

    // The high one takes the quota: the low one is preempted.
    let high = job_of_class(&env, "high", &high_class).await?;
    let preempted = env
        .wait_workload(&low, "preempted", |w| w.evictions("Preempted") >= 1)
        .await?;
    ensure!(
        attempts::attempt(&preempted, &check) == 2,
        "the stored attempt changed with the preemption: {}",
        e2e::dump(&preempted)
    );
    env.wait_admitted(&high).await?;

    // The high one ends; the low one gets quota again and is asked on attempt 2.
    env.complete_job("high", &high).await?;
    let again = env.wait_admitted(&low).await?;
    let asked = script.attempts_of(&low);
    let after_preemption = asked.get(before_preemption.len()..).unwrap_or_default();
    ensure!(
        !after_preemption.is_empty() && after_preemption.iter().all(|a| *a == 2),
        "after the preemption the check was asked {asked:?} (want 2 again)"
    );
    ensure_never_decreasing(&check, &asked)?;
    ensure!(
        attempts::attempt(&again, &check) == 2,
        "{}",
        e2e::dump(&again)
    );
    ensure!(again.evictions("Preempted") == 1, "{}", e2e::dump(&again));
    for c in &mut checks {
        c.stop().await?;
    }
    Ok(())
}

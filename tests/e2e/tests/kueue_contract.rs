//! The admission check contract of the real Kueue, exercised with no SDK: the test itself plays
//! the check controller. These pin down what every later layer relies on.

use anyhow::{Context, Result};
use e2e::{GuardedQueue, TestEnv};
use k8s_openapi::api::core::v1::{Pod, PodTemplate};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kueue_admission_sdk::api::{
    CheckState, ClusterQueue, ProvisioningRequest, Workload, workload_condition as cond,
};

const TEST_CONTROLLER: &str = "e2e.kueue-admission-checks.dev/test-controller";

/// A ResourceFlavor, an AdmissionCheck, a ClusterQueue using it and a LocalQueue.
async fn queues(env: &TestEnv) -> Result<GuardedQueue> {
    env.guarded_queue("check", TEST_CONTROLLER, "4").await
}

/// The queues with their check `Active`, and a Job whose Workload holds quota with the check's
/// entry `Pending`: the moment a check controller is asked. Returns the Workload's name and the
/// Workload as then seen.
async fn job_waiting_for_the_check(env: &TestEnv) -> Result<(GuardedQueue, String, Workload)> {
    let q = queues(env).await?;
    env.set_admission_check_active(&q.check, true).await?;
    let wl_name = env.submit_job("job", "lq", "1").await?;
    let wl = env
        .wait_check_pending_with_quota(&wl_name, &q.check)
        .await?;
    Ok((q, wl_name, wl))
}

/// A ClusterQueue (4 cpu, LocalQueue `lq`) guarded by two active checks the test answers, and
/// the Job `job` submitted to it; returns the checks' names and the Workload's.
async fn job_under_two_checks(env: &TestEnv, [a, b]: [&str; 2]) -> Result<([String; 2], String)> {
    let flavor = env.resource_flavor("default").await?.name_any();
    let a = env.admission_check(a, TEST_CONTROLLER).await?.name_any();
    let b = env.admission_check(b, TEST_CONTROLLER).await?.name_any();
    env.queues_on(&flavor, "4", &[&a, &b]).await?;
    env.set_admission_check_active(&a, true).await?;
    env.set_admission_check_active(&b, true).await?;
    let wl_name = env.submit_job("job", "lq", "1").await?;
    Ok(([a, b], wl_name))
}

/// Answers the check `Ready` and waits until the Workload is admitted and its Job `job`
/// unsuspended; returns the admitted Workload.
async fn ready_admits(
    env: &TestEnv,
    wl_name: &str,
    check: &str,
    message: &str,
) -> Result<Workload> {
    env.answer_check(wl_name, check, CheckState::Ready, message)
        .await?;
    let wl = env.wait_admitted(wl_name).await?;
    env.wait_job_unsuspended("job").await?;
    Ok(wl)
}

/// Waits until the Workload holds quota with the check's entry `Pending` (the check is asked),
/// then answers `state`, as a check controller does.
async fn answer_when_asked(
    env: &TestEnv,
    wl_name: &str,
    check: &str,
    state: CheckState,
    message: &str,
) -> Result<Workload> {
    env.wait_check_pending_with_quota(wl_name, check).await?;
    env.answer_check(wl_name, check, state, message).await
}

/// The `retryCount` of the check's entry (`None` without the entry or the count).
fn retry_count(wl: &Workload, check: &str) -> Option<i32> {
    wl.admission_check(check).and_then(|e| e.retry_count)
}

/// A condition of the Workload as `(status, reason)`.
fn condition_of<'a>(wl: &'a Workload, type_: &str) -> Option<(&'a str, &'a str)> {
    wl.condition(type_)
        .map(|c| (c.status.as_str(), c.reason.as_str()))
}

/// Asserts the Workload's condition `type_` has this `(status, reason)`, showing it if not.
#[track_caller]
fn assert_condition(wl: &Workload, type_: &str, expected: (&str, &str)) {
    assert_eq!(condition_of(wl, type_), Some(expected), "{}", e2e::dump(wl));
}

/// Asserts that the Workload's condition `type_` is not `True`, showing the Workload if it is.
#[track_caller]
fn assert_without(wl: &Workload, type_: &str, what: &str) {
    assert!(!wl.condition_is_true(type_), "{what}:\n{}", e2e::dump(wl));
}

/// Asserts that Kueue reset the check's entry to `Pending` on an eviction, with the message
/// that names what the entry said before.
#[track_caller]
fn assert_reset_after_eviction(wl: &Workload, check: &str, previously: &str) {
    let entry = wl.admission_check(check).cloned().unwrap_or_default();
    assert_eq!(entry.state, CheckState::Pending, "{}", e2e::dump(wl));
    assert_eq!(
        entry.message,
        format!("Reset to Pending after eviction. Previously: {previously}"),
        "{}",
        e2e::dump(wl)
    );
}

/// Waits until the check's entry on the Workload is `Pending`, which it is from the Workload's
/// creation, before Kueue reserves any quota (contract section 3).
async fn entry_pending_before_quota(env: &TestEnv, wl_name: &str, check: &str) -> Result<Workload> {
    env.wait_workload(wl_name, "our check entry Pending, before quota", |wl| {
        e2e::entry_state(wl, check) == Some(CheckState::Pending)
    })
    .await
}

/// Waits until a Retry without delay has evicted the Workload once and Kueue has reset the
/// check's entry to `Pending`, counting the retry.
async fn evicted_once_and_reset(env: &TestEnv, wl_name: &str, check: &str) -> Result<Workload> {
    env.wait_workload(
        wl_name,
        "one AdmissionCheck eviction and the entry Pending with retryCount 1",
        |wl| {
            let entry = wl.admission_check(check);
            wl.evictions("AdmissionCheck") == 1
                && entry.is_some_and(|e| e.state == CheckState::Pending && e.retry_count == Some(1))
        },
    )
    .await
}

/// Waits until the check's entry is `state` with retryCount 1 (`what` says which moment).
async fn entry_with_one_retry(
    env: &TestEnv,
    wl_name: &str,
    check: &str,
    state: CheckState,
    what: &str,
) -> Result<Workload> {
    env.wait_workload(wl_name, what, |wl| {
        wl.admission_check(check)
            .is_some_and(|e| e.state == state && e.retry_count == Some(1))
    })
    .await
}

/// Waits until Kueue has set `requeueState.requeueAt` (a delayed Retry landed); returns the
/// Workload and its requeueAt.
async fn requeue_at_set(env: &TestEnv, wl_name: &str) -> Result<(Workload, Timestamp)> {
    let wl = env
        .wait_workload(wl_name, "requeueState.requeueAt set", |wl| {
            wl.requeue_at().is_some()
        })
        .await?;
    let requeue_at = wl.requeue_at().context("requeueAt")?;
    Ok((wl, requeue_at))
}

/// Every version of the Workload from now until Kueue evicts it: the versions before the
/// eviction, and the evicted one.
async fn versions_until_evicted(env: &TestEnv, wl_name: &str) -> Result<(Vec<Workload>, Workload)> {
    let mut versions = env
        .versions_until(wl_name, "evicted at requeueAt", |wl| {
            wl.evictions("AdmissionCheck") >= 1 || wl.condition_is_true(cond::EVICTED)
        })
        .await?;
    let evicted = versions.pop().context("no version")?;
    Ok((versions, evicted))
}

/// Asserts that every version held the quota with the check's entry still `state`.
#[track_caller]
fn assert_quota_held_with_entry(versions: &[Workload], check: &str, state: CheckState) {
    for wl in versions {
        assert!(
            wl.condition_is_true(cond::QUOTA_RESERVED)
                && e2e::entry_state(wl, check) == Some(state),
            "quota released or entry changed during the delay:\n{}",
            e2e::dump(wl)
        );
    }
}

/// Asserts that Kueue evicted the Workload (its `Evicted` condition's transition) no earlier
/// than `requeue_at`, within the 1 s its whole-second times may be off.
fn assert_evicted_no_earlier_than(evicted: &Workload, requeue_at: Timestamp) -> Result<()> {
    let evicted_at = evicted
        .condition(cond::EVICTED)
        .map(|c| c.last_transition_time.0)
        .context("the Evicted condition")?;
    assert!(
        evicted_at.duration_since(requeue_at).as_secs() >= -1,
        "evicted at {evicted_at}, before requeueAt {requeue_at}:\n{}",
        e2e::dump(evicted)
    );
    Ok(())
}

/// Waits until the delayed Retry ended: evicted once, the entry counting one retry, quota
/// reserved again.
async fn requeued_after_one_retry(env: &TestEnv, wl_name: &str, check: &str) -> Result<Workload> {
    env.wait_workload(
        wl_name,
        "evicted at requeueAt and quota reserved again",
        |wl| {
            wl.evictions("AdmissionCheck") == 1
                && wl.condition_is_true(cond::QUOTA_RESERVED)
                && retry_count(wl, check) == Some(1)
        },
    )
    .await
}

/// Waits until the Workload was evicted more often than `before` (`what` says by whom).
async fn evicted_again(env: &TestEnv, wl_name: &str, before: i32, what: &str) -> Result<Workload> {
    env.wait_workload(wl_name, what, |wl| wl.total_evictions() > before)
        .await
}

/// Waits until a check evicted the Workload (an `AdmissionCheck` eviction counted).
async fn evicted_by_a_check(env: &TestEnv, wl_name: &str, what: &str) -> Result<Workload> {
    env.wait_workload(wl_name, what, |wl| wl.evictions("AdmissionCheck") >= 1)
        .await
}

/// The check answers `Retry` once asked; waits until Kueue has evicted the Workload.
async fn evicted_by_retry(env: &TestEnv, wl_name: &str, check: &str) -> Result<Workload> {
    answer_when_asked(
        env,
        wl_name,
        check,
        CheckState::Retry,
        "retry from the test",
    )
    .await?;
    env.wait_workload(wl_name, "Evicted=True", |w| {
        w.condition_is_true(cond::EVICTED)
    })
    .await
}

/// Waits until Kueue tells the Workload the quota is not free (`insufficient unused quota`).
async fn told_quota_is_not_free(env: &TestEnv, wl_name: &str) -> Result<Workload> {
    env.wait_workload(wl_name, "QuotaReserved=False for want of quota", |w| {
        w.condition(cond::QUOTA_RESERVED)
            .is_some_and(|c| c.status == "False" && c.message.contains("insufficient unused quota"))
    })
    .await
}

/// Releases the evicted Workload's reservation as its owner would, then waits until Kueue
/// reserves the freed quota again (for any Workload, in a version written after the release).
async fn release_and_reserve_again(env: &TestEnv, wl_name: &str) -> Result<Workload> {
    e2e::release_quota(env, wl_name).await?;
    let released: u64 = env
        .workloads()
        .get(wl_name)
        .await?
        .resource_version()
        .unwrap_or_default()
        .parse()?;
    e2e::wait_for_any(
        env.workloads(),
        "a Workload reserving the released quota",
        |w: &Workload| {
            let later = w
                .resource_version()
                .and_then(|v| v.parse::<u64>().ok())
                .is_some_and(|v| v > released);
            later && w.condition_is_true(cond::QUOTA_RESERVED)
        },
    )
    .await
}

/// Waits until every one of these pods is gone.
async fn pods_gone(env: &TestEnv, pods: &[Pod]) -> Result<()> {
    for pod in pods {
        e2e::wait_gone(
            Api::<Pod>::namespaced(env.client.clone(), &env.ns),
            &pod.name_any(),
        )
        .await?;
    }
    Ok(())
}

/// The reason of the first `Finished` condition among these versions, if any had one.
fn finished_reason(versions: &[Workload]) -> Option<String> {
    versions
        .iter()
        .find_map(|wl| wl.condition(cond::FINISHED).map(|c| c.reason.clone()))
}

/// The PodTemplate `anchor` (one pod of 1 cpu) that a request can be owned by.
async fn anchor_template(env: &TestEnv) -> Result<PodTemplate> {
    let template: PodTemplate = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "anchor"},
        "template": e2e::pod_template(serde_json::json!({}), "1"),
    }))?;
    Ok(env
        .pod_templates()
        .create(&PostParams::default(), &template)
        .await?)
}

/// An ownerReference to the object `kind/name` of `api_version`.
fn owner(api_version: &str, kind: &str, name: String, uid: Option<String>) -> serde_json::Value {
    serde_json::json!({"apiVersion": api_version, "kind": kind, "name": name, "uid": uid})
}

/// Creates a check-capacity ProvisioningRequest `name` for the pods of `anchor`, owned by
/// `owner`, as any controller might.
async fn create_request(
    requests: &Api<ProvisioningRequest>,
    name: &str,
    owner: serde_json::Value,
) -> Result<()> {
    let request: ProvisioningRequest = serde_json::from_value(serde_json::json!({
        "apiVersion": "autoscaling.x-k8s.io/v1",
        "kind": "ProvisioningRequest",
        "metadata": {"name": name, "ownerReferences": [owner]},
        "spec": {
            "provisioningClassName": "check-capacity.autoscaling.x-k8s.io",
            "podSets": [{"podTemplateRef": {"name": "anchor"}, "count": 1}],
        },
    }))?;
    requests.create(&PostParams::default(), &request).await?;
    Ok(())
}

/// Applies `Ready` with a podSetUpdate whose node selector has the key `key`, as a check
/// controller would, and returns the API server's refusal. Kueue writes the Workload again
/// right after reserving quota: a write at an older resourceVersion gets a 409 first, and is
/// sent again from a fresh read.
async fn ready_with_node_selector_refused(
    env: &TestEnv,
    wl_name: &str,
    check: &str,
    key: &str,
) -> Result<Box<kube::core::Status>> {
    let pp = PatchParams::apply(&format!("{}-{}", e2e::TEST_FIELD_MANAGER, check)).force();
    let mut refused = None;
    for _ in 0..10 {
        let fresh = env.workloads().get(wl_name).await?;
        let body = serde_json::json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": wl_name, "namespace": env.ns, "resourceVersion": fresh.resource_version()},
        "status": {"admissionChecks": [{
            "name": check,
            "state": "Ready",
            "message": "provisioned",
            "lastTransitionTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                Timestamp::now()),
            "podSetUpdates": [{"name": "main", "nodeSelector": {key: "zone-a"}}],
        }]},
        });
        let answer = env
            .workloads()
            .patch_status(wl_name, &pp, &Patch::Apply(&body))
            .await
            .expect_err("Kueue's webhook refuses the key");
        if !matches!(&answer, kube::Error::Api(s) if s.code == 409) {
            refused = Some(answer);
            break;
        }
    }
    let refused = refused.context("409 Conflict ten times in a row")?;
    let kube::Error::Api(status) = refused else {
        panic!("not an API answer: {refused}");
    };
    Ok(status)
}

/// Why the SDK's own validation refuses a podSetUpdate with this node selector key for the
/// Workload's podsets (before anything is sent).
fn sdk_refusal(wl: &Workload, key: &str) -> String {
    let mut update = kueue_admission_sdk::api::PodSetUpdate {
        name: "main".into(),
        ..Default::default()
    };
    update.node_selector.insert(key.into(), "zone-a".into());
    kueue_admission_sdk::api::validation::pod_set_updates(&wl.spec.pod_sets, &[update])
        .expect_err("refused by the SDK too")
}

/// The check answers `Rejected`; waits until Kueue has deactivated the Workload, evicted it,
/// released its quota and said so in `Requeued`.
async fn rejected_and_released(env: &TestEnv, wl_name: &str, check: &str) -> Result<Workload> {
    env.answer_check(wl_name, check, CheckState::Rejected, "rejected by the test")
        .await?;
    env.wait_workload(wl_name, "deactivated, evicted, quota released", |wl| {
        !wl.is_active()
            && wl.condition_is_true(cond::EVICTED)
            && !wl.condition_is_true(cond::QUOTA_RESERVED)
            && wl.condition(cond::REQUEUED).is_some()
    })
    .await
}

/// Asserts that `now`'s `QuotaReserved` is the very one `then` had (status and transition
/// time): the Workload was not reserved quota in between.
#[track_caller]
fn assert_never_reserved_since(now: &Workload, then: &Workload) {
    let since = |wl: &Workload| {
        wl.condition(cond::QUOTA_RESERVED)
            .map(|c| (c.status.clone(), c.last_transition_time.clone()))
    };
    assert_eq!(since(now), since(then), "{}", e2e::dump(now));
}

/// Gives the Workload's `Requeued` condition the reason `Deactivated` (what `kueue-ac
/// reactivate` does), written at the version `stuck` was read at; waits until it holds quota
/// again with the check asked.
async fn requeued_with_reason_deactivated(
    env: &TestEnv,
    stuck: &Workload,
    check: &str,
) -> Result<Workload> {
    let conditions: Vec<_> = stuck
        .status
        .clone()
        .unwrap_or_default()
        .conditions
        .into_iter()
        .map(|mut c| {
            if c.type_ == cond::REQUEUED {
                c.reason = "Deactivated".into();
            }
            c
        })
        .collect();
    env.workloads()
        .patch_status(
            &stuck.name_any(),
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({
                "metadata": {"resourceVersion": stuck.resource_version()},
                "status": {"conditions": conditions},
            })),
        )
        .await?;
    env.wait_check_pending_with_quota(&stuck.name_any(), check)
        .await
}

#[tokio::test]
async fn ready_admits_the_workload_and_unsuspends_the_job() -> Result<()> {
    let env = TestEnv::new("ready-admits").await?;
    let q = queues(&env).await?;

    // Nobody has marked the check Active yet: Kueue makes the ClusterQueue inactive, and an
    // inactive ClusterQueue reserves no quota (contract section 2).
    env.wait_active::<ClusterQueue>(&q.cluster_queue, "False", Some("AdmissionCheckInactive"))
        .await?;

    let wl_name = env.submit_job("job", "lq", "1").await?;
    // The entry appears before any quota is reserved (contract section 3): a check must not
    // act on Pending alone.
    let wl = entry_pending_before_quota(&env, &wl_name, &q.check).await?;
    let inactive = "quota reserved through a ClusterQueue whose check is inactive";
    assert_without(&wl, cond::QUOTA_RESERVED, inactive);

    env.set_admission_check_active(&q.check, true).await?;
    let wl = env
        .wait_check_pending_with_quota(&wl_name, &q.check)
        .await?;
    assert_without(&wl, cond::ADMITTED, "admitted before the check answered");

    let wl = ready_admits(&env, &wl_name, &q.check, "ready from the test").await?;
    assert_eq!(e2e::entry_state(&wl, &q.check), Some(CheckState::Ready));
    Ok(())
}

#[tokio::test]
async fn retry_evicts_and_resets_the_entry_with_a_retry_count() -> Result<()> {
    let env = TestEnv::new("retry-evicts").await?;
    let (q, wl_name, wl) = job_waiting_for_the_check(&env).await?;
    let before = retry_count(&wl, &q.check);
    assert_eq!(before, None, "retryCount before any Retry");

    env.answer_check(&wl_name, &q.check, CheckState::Retry, "retry from the test")
        .await?;

    // Kueue evicts (reason AdmissionCheck), resets the entry to Pending and counts the retry.
    let wl = evicted_once_and_reset(&env, &wl_name, &q.check).await?;
    assert_reset_after_eviction(&wl, &q.check, "Retry");
    let ran = "the Job ran although its check said Retry";
    assert_ne!(env.job_suspend("job").await?, Some(false), "{ran}");

    // A Retry without delay requeues at once: quota is reserved again, the check asked again,
    // and Ready now admits. retryCount stays: Kueue does not reset it when the check passes.
    env.wait_check_pending_with_quota(&wl_name, &q.check)
        .await?;
    let wl = ready_admits(&env, &wl_name, &q.check, "ready on the second attempt").await?;
    assert_eq!(retry_count(&wl, &q.check), Some(1), "{}", e2e::dump(&wl));
    Ok(())
}

/// Contract section 5, "verify": a Retry with a delay, written while quota is reserved, keeps
/// the quota reserved until `requeueAt` (no eviction meanwhile), then evicts and requeues at once.
/// The opposite of KEP-3258's stated goal; the SDK documents it.
#[tokio::test]
async fn delayed_retry_keeps_the_quota_until_requeue_at() -> Result<()> {
    let env = TestEnv::new("delayed-retry").await?;
    let (q, wl_name, _) = job_waiting_for_the_check(&env).await?;

    const DELAY: i32 = 8;
    let started = std::time::Instant::now();
    env.answer_check_with_delay(&wl_name, &q.check, CheckState::Retry, "later", Some(DELAY))
        .await?;
    let (wl, requeue_at) = requeue_at_set(&env, &wl_name).await?;
    let early = wl.evictions("AdmissionCheck");
    assert_eq!(early, 0, "evicted before requeueAt:\n{}", e2e::dump(&wl));

    // Every version until the eviction holds the quota with the entry still Retry, and the
    // eviction itself does not come before requeueAt (stored at whole seconds: 1 s of slack).
    let (during, evicted) = versions_until_evicted(&env, &wl_name).await?;
    assert_quota_held_with_entry(&during, &q.check, CheckState::Retry);
    assert_evicted_no_earlier_than(&evicted, requeue_at)?;

    // At requeueAt: evicted once, entry reset with retryCount 1, quota reserved again.
    let wl = requeued_after_one_retry(&env, &wl_name, &q.check).await?;
    let waited = started.elapsed().as_secs_f64();
    // lastTransitionTime is stored at whole seconds, so requeueAt may come up to 1 s early.
    let at_least = f64::from(DELAY) - 1.0;
    assert!(
        waited >= at_least,
        "requeued after {waited:.1}s:\n{}",
        e2e::dump(&wl)
    );
    Ok(())
}

/// Two checks on one ClusterQueue answer Retry with different delays: Kueue waits for the
/// larger (contract section 5: requeueAt = max over Retry entries of lastTransitionTime +
/// requeueAfterSeconds, never moved backward).
#[tokio::test]
async fn with_two_delayed_retries_the_larger_delay_wins() -> Result<()> {
    let env = TestEnv::new("two-delays").await?;
    let ([short, long], wl_name) = job_under_two_checks(&env, ["short", "long"]).await?;
    env.wait_check_pending_with_quota(&wl_name, &short).await?;
    env.wait_check_pending_with_quota(&wl_name, &long).await?;

    let started = std::time::Instant::now();
    // The long one first, so that a requeueAt taken from the last write would be the short one.
    env.answer_check_with_delay(&wl_name, &long, CheckState::Retry, "long", Some(7))
        .await?;
    env.answer_check_with_delay(&wl_name, &short, CheckState::Retry, "short", Some(2))
        .await?;

    let wl = evicted_by_a_check(&env, &wl_name, "evicted once both entries said Retry").await?;
    let waited = started.elapsed().as_secs_f64();
    // Whole-second lastTransitionTime: up to 1 s early; the short delay alone would be ~2 s.
    assert!(
        waited >= 6.0,
        "evicted after {waited:.1}s, before the longer delay:\n{}",
        e2e::dump(&wl)
    );
    for check in [&short, &long] {
        let count = retry_count(&wl, check);
        assert_eq!(count, Some(1), "{check}:\n{}", e2e::dump(&wl));
    }
    Ok(())
}

/// Contract section 4 (`resetChecksOnEviction`, v0.19.2 `pkg/workload/evict`): an eviction keeps
/// and increments `retryCount` only on entries that say `Retry`; an entry that says `Ready` is
/// reset to `Pending` **without** its `retryCount`. So one check's count is wiped when another
/// check evicts: `retryCount + 1` is no attempt number (the SDK keeps its own).
#[tokio::test]
async fn another_checks_eviction_drops_the_retry_count_of_a_ready_entry() -> Result<()> {
    let env = TestEnv::new("reset-ready").await?;
    let ([a, b], wl_name) = job_under_two_checks(&env, ["a", "b"]).await?;

    // Check a retries once: its entry comes back Pending with retryCount 1.
    answer_when_asked(&env, &wl_name, &a, CheckState::Retry, "a retries").await?;
    let counted = "a's retry counted";
    entry_with_one_retry(&env, &wl_name, &a, CheckState::Pending, counted).await?;
    // Then a passes (its retryCount stays 1) while b retries: Kueue evicts again.
    answer_when_asked(&env, &wl_name, &a, CheckState::Ready, "a passes").await?;
    let kept = "a Ready with retryCount 1";
    let wl = entry_with_one_retry(&env, &wl_name, &a, CheckState::Ready, kept).await?;
    env.answer_check(&wl_name, &b, CheckState::Retry, "b retries")
        .await?;
    let wl = evicted_again(&env, &wl_name, wl.total_evictions(), "evicted by b's Retry").await?;

    assert_reset_after_eviction(&wl, &a, "Ready");
    let wiped = "a's retryCount survived another check's eviction";
    assert_eq!(retry_count(&wl, &a), None, "{wiped}:\n{}", e2e::dump(&wl));
    assert_eq!(retry_count(&wl, &b), Some(1), "{}", e2e::dump(&wl));
    Ok(())
}

/// A Workload that nothing owns (created directly, no Job) and that a check sends to `Retry` is
/// evicted but keeps its quota: Kueue leaves giving it back to the owning integration (the Job
/// integration does it once it has suspended the Job). Shown by cause: a second Workload,
/// created after the eviction, is told the quota is not free; once the test, as the owner,
/// releases the first one's reservation, the quota is reserved again.
#[tokio::test]
async fn an_evicted_workload_without_an_owner_keeps_its_quota_until_its_owner_releases_it()
-> Result<()> {
    let env = TestEnv::new("ownerless-evicted").await?;
    let q = env.guarded_queue("check", TEST_CONTROLLER, "1").await?;
    env.set_admission_check_active(&q.check, true).await?;
    env.standalone_workload("first", "provision").await?;
    evicted_by_retry(&env, "first", &q.check).await?;

    env.standalone_workload("second", "provision").await?;
    told_quota_is_not_free(&env, "second").await?;
    let first = env.workloads().get("first").await?;
    assert!(
        first.condition_is_true(cond::QUOTA_RESERVED) && first.condition_is_true(cond::EVICTED),
        "Kueue released the quota of an evicted Workload without an owner; the soak's driver \
         (e2e::release_quota) and docs/kueue-behaviour.md are out of date:\n{}",
        e2e::dump(&first)
    );

    // As the owner: the reservation goes, and Kueue reserves the quota again (for either).
    let reserved = release_and_reserve_again(&env, "first").await?;
    println!("the released quota went to {}", reserved.name_any());
    Ok(())
}

/// What deleting the Job of an admitted Workload does. The Job owns its Workload, so the
/// garbage collector deletes the Workload (and the Job's pods) in every supported version; a
/// check controller sees the Workload deleted. From v0.18 (feature gate
/// `FinishOrphanedWorkloads`, beta and on by default) Kueue may first mark the orphan
/// `Finished` (reason `OwnerNotFound`); before, it only drops its `resource-in-use` finalizer
/// and leaves the rest to the collector. Either way the quota is released.
#[tokio::test]
async fn deleting_the_job_lets_the_garbage_collector_delete_its_workload_and_pods() -> Result<()> {
    let env = TestEnv::new("job-deleted").await?;
    let (q, wl_name, _) = job_waiting_for_the_check(&env).await?;
    ready_admits(&env, &wl_name, &q.check, "ready from the test").await?;
    let running = env.wait_job_pods_running("job", 1).await?;
    let mut recorder = env.record_workloads().await?;

    env.jobs()
        .delete("job", &DeleteParams::background())
        .await?;
    let versions = recorder.until_deleted(&wl_name).await?;
    pods_gone(&env, &running).await?;
    let finished = finished_reason(&versions);
    let (minor, _) = e2e::kueue_version();
    println!("Kueue v0.{minor}: Finished before its deletion: {finished:?}");
    if minor < 18 {
        let why = format!("Kueue v0.{minor} has no FinishOrphanedWorkloads");
        assert_eq!(finished, None, "{why}");
    } else if let Some(reason) = finished {
        assert_eq!(reason, "OwnerNotFound");
    }
    Ok(())
}

/// Why our requests are owned by their PodTemplates and not by their Workload: Kueue's built-in
/// provisioning check (always running when the ProvisioningRequest API is served) deletes every
/// ProvisioningRequest whose ownerReferences name a Workload that holds quota, whichever
/// controller made it and whether or not a check of its own guards the Workload (its index
/// keys on the reference's name only), the next time it reconciles that Workload (any change of
/// it). A request owned by a PodTemplate, made at the same moment, stays.
#[tokio::test]
async fn kueues_check_deletes_any_request_owned_by_a_workload_holding_quota() -> Result<()> {
    let env = TestEnv::new("owned-by-workload").await?;
    let (_, wl_name, wl) = job_waiting_for_the_check(&env).await?;
    let template = anchor_template(&env).await?;
    let requests = env.provisioning_requests();
    let by_template = owner("v1", "PodTemplate", template.name_any(), template.uid());
    create_request(&requests, "owned-by-template", by_template).await?;
    let by_workload = owner(
        "kueue.x-k8s.io/v1beta2",
        "Workload",
        wl_name.clone(),
        wl.uid(),
    );
    create_request(&requests, "owned-by-workload", by_workload).await?;
    // Kueue's check reconciles the Workload on any change of it (a check writing its entry,
    // say); the test makes one.
    env.touch_workload(&wl_name, "1").await?;

    e2e::wait_gone(requests.clone(), "owned-by-workload").await?;
    assert!(requests.get_opt("owned-by-template").await?.is_some());
    let still: Workload = env.workloads().get(&wl_name).await?;
    let reserved = still.condition_is_true(cond::QUOTA_RESERVED);
    assert!(reserved, "{}", e2e::dump(&still));
    Ok(())
}

/// Kueue's Workload webhook refuses a podSetUpdate it finds invalid with 403, worded as an
/// admission webhook's denial, not as RBAC: here the node selector key with a
/// 70-character name part (a ProvisioningRequestConfig's CRD takes such a key). The SDK takes
/// that denial for permanent, and validates podSetUpdates before writing so it never sends one.
#[tokio::test]
async fn kueues_webhook_refuses_an_invalid_pod_set_update_with_a_403_that_is_no_rbac() -> Result<()>
{
    use kueue_admission_sdk::ErrorClass;
    let env = TestEnv::new("webhook-403").await?;
    let (q, wl_name, wl) = job_waiting_for_the_check(&env).await?;
    let key = format!("example.com/{}", "z".repeat(70));
    let status = ready_with_node_selector_refused(&env, &wl_name, &q.check, &key).await?;
    println!("{} {}: {}", status.code, status.reason, status.message);
    assert_eq!(status.code, 403, "{status:?}");
    let denial = "admission webhook \"vworkload.kb.io\" denied the request";
    assert!(
        status.message.starts_with(denial)
            && status.message.contains("name part must be no more than 63"),
        "{status:?}"
    );
    let class = ErrorClass::of_status(status.code, &status.reason, &status.message);
    let permanent = matches!(class, ErrorClass::Permanent { .. });
    assert!(permanent, "the SDK takes it for permanent");
    // The SDK's own check says the same before anything is sent.
    let why = sdk_refusal(&wl, &key);
    assert!(why.contains("70 characters"), "{why}");
    // Nothing landed.
    let now = env.workloads().get(&wl_name).await?;
    assert_eq!(e2e::entry_state(&now, &q.check), Some(CheckState::Pending));
    Ok(())
}

/// A Workload deactivated because a check answered `Rejected` is not queued again by
/// `spec.active: true` (Kueue v0.15 to v0.19, `pkg/controller/core/workload_controller.go`:
/// a reactivated Workload is requeued only when its `Requeued` condition says reason
/// `Deactivated`, and this one says `DeactivatedDueToAdmissionCheck`). It stays evicted and
/// never gets quota, while a later Workload of the same queue does. Giving `Requeued` the
/// reason `Deactivated` (what `kueue-ac reactivate` does) is what requeues it.
#[tokio::test]
async fn a_workload_a_check_rejected_is_not_queued_again_by_spec_active_true() -> Result<()> {
    const BY_CHECK: &str = "DeactivatedDueToAdmissionCheck";
    let env = TestEnv::new("reactivate-rejected").await?;
    let (q, wl_name, _) = job_waiting_for_the_check(&env).await?;
    let deactivated = rejected_and_released(&env, &wl_name, &q.check).await?;
    assert_condition(&deactivated, cond::REQUEUED, ("False", BY_CHECK));
    assert_condition(&deactivated, cond::EVICTED, ("True", BY_CHECK));

    // The advice of old: spec.active: true.
    env.set_workload_active(&wl_name, true).await?;
    // A Job submitted afterwards, with room for both: the scheduler runs and admits it, while
    // the reactivated Workload (older, same priority, first in line if it were queued) gets
    // nothing.
    let later = env.submit_job("later", "lq", "1").await?;
    env.wait_check_pending_with_quota(&later, &q.check).await?;
    let stuck = env.workloads().get(&wl_name).await?;
    // Never reserved since: its QuotaReserved=False is the one the deactivation left.
    assert_never_reserved_since(&stuck, &deactivated);
    let requeued = condition_of(&stuck, cond::REQUEUED).map(|(_, reason)| reason);
    assert!(
        stuck.is_active() && stuck.condition_is_true(cond::EVICTED) && requeued == Some(BY_CHECK),
        "{}",
        e2e::dump(&stuck)
    );

    // The reason Kueue requeues on: it is queued again and reserves quota.
    let back = requeued_with_reason_deactivated(&env, &stuck, &q.check).await?;
    assert_condition(&back, cond::REQUEUED, ("True", "Reactivated"));
    Ok(())
}

/// Writes a quota reservation on ClusterQueue `cq` (flavor `flavor`, 1 cpu for podset `main`)
/// to the Workload's status, as Kueue's scheduler does.
async fn reserve_by_hand(env: &TestEnv, name: &str, cq: &str, flavor: &str) -> Result<()> {
    let status = serde_json::json!({"status": {
        "admission": {"clusterQueue": cq, "podSetAssignments": [{
            "name": "main", "count": 1,
            "flavors": {"cpu": flavor}, "resourceUsage": {"cpu": "1"},
        }]},
        "conditions": [{
            "type": cond::QUOTA_RESERVED, "status": "True", "reason": "QuotaReserved",
            "message": "reserved by the test", "lastTransitionTime": Timestamp::now().to_string(),
        }],
    }});
    env.workloads()
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .with_context(|| format!("reserving quota for {name} by hand"))?;
    Ok(())
}

/// **Kueue admits a reserved Workload without its checks when it cannot tell the Workload's
/// ClusterQueue.** Kueue's Workload reconciler adds the entries only after finding the
/// ClusterQueue through its queue manager (the Workload's LocalQueue, as the manager knows it);
/// when it cannot, it skips the entries and syncs `Admitted` from the entries there are: none,
/// so every check is "ready". Here the LocalQueue does not exist and the reservation names a
/// ClusterQueue whose check is active and unanswered: admitted, no entry. The same reservation
/// through the LocalQueue that exists gets its entry `Pending` and waits. (The chaos soak saw it
/// after a Kueue restart: a Workload reserved just before, its entry not yet written, admitted
/// by the next Kueue with none; the soak reports such admissions apart.)
#[tokio::test]
async fn a_reservation_kueue_cannot_map_to_its_queue_is_admitted_without_the_checks() -> Result<()>
{
    let env = TestEnv::new("unmapped-reservation").await?;
    let q = queues(&env).await?;
    env.set_admission_check_active(&q.check, true).await?;
    let template = e2e::pod_template(serde_json::json!({}), "1");
    let mut unmapped =
        e2e::standalone_workload(&env.ns, "unmapped", serde_json::json!({}), template.clone())?;
    unmapped.spec.queue_name = Some("no-such-queue".into());
    env.create_workload(&unmapped).await?;
    reserve_by_hand(&env, "unmapped", &q.cluster_queue, &q.flavor).await?;
    let admitted = env
        .wait_workload("unmapped", "admitted by Kueue", |w| {
            w.condition_is_true(cond::ADMITTED)
        })
        .await?;
    let entries = admitted
        .status
        .as_ref()
        .map(|s| s.admission_checks.len())
        .unwrap_or_default();
    assert_eq!(
        entries,
        0,
        "Kueue wrote entries on a Workload whose queue it cannot tell (a fix upstream? update \
         docs/kueue-behaviour.md and the soak's report):\n{}",
        e2e::dump(&admitted)
    );

    // The contrast: through the LocalQueue that exists, a reservation on the same ClusterQueue
    // (Kueue's own) gets the check's entry and waits.
    let mapped = e2e::standalone_workload(&env.ns, "mapped", serde_json::json!({}), template)?;
    env.create_workload(&mapped).await?;
    let waiting = env
        .wait_check_pending_with_quota("mapped", &q.check)
        .await?;
    assert!(
        !waiting.condition_is_true(cond::ADMITTED),
        "{}",
        e2e::dump(&waiting)
    );
    Ok(())
}

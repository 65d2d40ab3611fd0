//! Where a user switching from Kueue's built-in ProvisioningRequest check meets a difference,
//! or wonders whether there is one (issue 26, item 8), against the real Kueue with the
//! autoscaler simulator playing cluster-autoscaler:
//!
//! - a request that fails after our `Ready` while another check still holds the Workload back
//!   is a failed attempt (`Retry`), as with the built-in check;
//! - several provisioning checks on one ClusterQueue: each makes its own request; on disjoint
//!   podsets all are `Ready` before admission; on one podset Kueue could not start the job
//!   (each check names its own request in the same pod annotation), so the second `Ready` is
//!   refused with the reason, where Kueue would admit and then finish the Workload as
//!   `FailedToStart` (pinned here too, with checks the test answers, and with two of Kueue's
//!   built-in checks, which do exactly that);
//! - a check limited to one flavor of a ClusterQueue (`onFlavors`) makes nothing for Workloads
//!   assigned another flavor.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use autoscaler_simulator::SCRIPT_ANNOTATION;
use e2e::TestEnv;
use e2e::capacity::{CONSUME_ANNOTATION, node_of, pod_annotation};
use e2e::provisioning::{History, World, retry_strategy};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use kueue_admission_sdk::api::{
    AdmissionCheckState, CheckState, PodSetUpdate, Workload, provisioning_condition as pr,
    workload_condition as cond,
};
use kueue_provisioning_controller::identity::KUEUE_CONTROLLER_NAME;
use serde_json::{Value, json};

/// Field manager of the objects this file applies.
const FIELD_MANAGER: &str = "e2e-provisioning-vs-builtin";

/// The usual world (config `spec`, 4 cpu) with a second AdmissionCheck on the ClusterQueue,
/// `gate`, active and answered by the test; returns its name too.
async fn with_gate(test: &str, spec: Value) -> Result<(World, String)> {
    let env = TestEnv::new(test).await?;
    let gate = env.cluster_name("gate");
    let p = env.provisioning_with(spec, &[], "4", &[&gate]).await?;
    env.admission_check("gate", &env.own_controller_name("gate"))
        .await?;
    env.set_admission_check_active(&gate, true).await?;
    let controller = env.start_provisioning_controller(None)?;
    Ok((World::around(env, p, controller)?, gate))
}

/// Kueue's built-in check answers `Retry` when a request fails after it was provisioned, as
/// long as the Workload holds quota (`syncCheckStates`, v0.19.2): before admission we do the
/// same. Our `Ready` stands while the gate is `Pending`; the test fails the request (as the
/// autoscaler would); our entry goes `Retry` with the reason (attempt 1 of 3), Kueue evicts
/// after the delay, attempt 2's request is provisioned, and once the gate opens the Workload is
/// admitted on it.
#[tokio::test]
async fn a_request_failed_after_our_ready_before_admission_is_retried_like_the_built_in()
-> Result<()> {
    let (t, gate) = with_gate("prov-failed-after-ready", retry_strategy(2, 1)).await?;
    let (env, check) = (&t.env, &t.p.check);
    let wls = env.workload_history();
    let wl = env.job_with_script("job", "provision").await?;
    ready_held_by_the_gate(env, &wl, check, None).await?;

    let failure = "the node group went away";
    env.add_request_condition(&t.request(&wl, 1), pr::FAILED, "SetByTheTest", failure)
        .await?;
    let again = ready_held_by_the_gate(env, &wl, check, Some(1)).await?;
    let evictions = again.evictions("AdmissionCheck");
    assert_eq!(evictions, 1, "{}", e2e::dump(&again));
    let retries = retries_seen_before_ready_again(&wls, &wl, check).await?;
    let expected = format!(
        "ProvisioningRequest {} failed after it was provisioned, before the workload was \
         admitted: the node group went away (attempt 1 of 3; next attempt not before ",
        t.qualified(&wl, 1)
    );
    let all_expected = retries.iter().all(|m| m.starts_with(&expected));
    assert!(!retries.is_empty() && all_expected, "{retries:#?}");
    assert_eq!(env.our_requests().await?, [t.request(&wl, 2)]);

    env.answer_check(&wl, &gate, CheckState::Ready, "the gate opens")
        .await?;
    t.admitted_on_attempt(&wl, 2).await?;
    let (counts, m) = failed_and_provisioned_counts(&t).await?;
    assert_eq!(counts, [1.0, 2.0], "failed, provisioned: {m}");
    t.stop().await
}

/// The other side of that decision, Kueue's built-in check after admission (read in
/// `syncCheckStates`, v0.19.2: a `Failed` request is a `Retry` whenever the Workload holds
/// quota): its request failing once the Job runs, it answers `Retry` and Kueue evicts the
/// running Workload and suspends the Job. Ours keeps `Ready` then (only `CapacityRevoked`
/// withdraws it: `outcome::tests::a_ready_answer_is_withdrawn_before_admission_by_a_failure_and_after_only_by_revocation`).
#[tokio::test]
async fn kueues_built_in_check_evicts_a_running_workload_whose_request_fails() -> Result<()> {
    let env = TestEnv::new("kueue-failed-after-admission").await?;
    let config = env.provisioning_config("prc", retry_strategy(2, 1)).await?;
    let check = env
        .provisioning_check("kprov", KUEUE_CONTROLLER_NAME, &config)
        .await?;
    let flavor = env.provisioning_flavor("pool").await?;
    env.queues_on(&flavor, "4", &[&check]).await?;
    let simulator = env.start_simulator()?;
    // Attempt 2's request is never provisioned: the Job stays suspended once evicted.
    let wl = env.job_with_script("job", "provision,accept").await?;
    env.wait_admitted_ready(&wl, &check).await?;
    env.wait_job_pods_running("job", 1).await?;

    let request = format!("{wl}-{check}-1");
    let failure = "the node group went away";
    env.add_request_condition(&request, pr::FAILED, "SetByTheTest", failure)
        .await?;
    let evicted = env
        .wait_workload(&wl, "evicted by its check", |w| {
            w.evictions("AdmissionCheck") == 1
        })
        .await?;
    let entry = evicted.admission_check(&check).cloned().unwrap_or_default();
    assert_eq!(entry.retry_count, Some(1), "{}", e2e::dump(&evicted));
    env.wait_job_suspend("job", true).await?;
    simulator.stop().await
}

/// Applies cluster-scoped or namespaced `object` (server-side, this file's field manager).
async fn apply(env: &TestEnv, object: Value) -> Result<()> {
    e2e::chart::apply(&env.client, &object, FIELD_MANAGER).await
}

/// ClusterQueue `cq` (all namespaces) with one resource group of `resources`, each flavor of
/// `quotas` giving `(resource, quantity)`s, and `checks` as `(check, onFlavors)`; LocalQueue
/// `lq` feeding it. Returns the ClusterQueue's name.
async fn queue(
    env: &TestEnv,
    resources: &[&str],
    quotas: &[(&str, &[(&str, &str)])],
    checks: &[(&str, &[&str])],
) -> Result<String> {
    let name = env.cluster_name("cq");
    let flavors: Vec<Value> = quotas
        .iter()
        .map(|(flavor, quota)| {
            let resources: Vec<Value> = quota
                .iter()
                .map(|(r, q)| json!({"name": r, "nominalQuota": q}))
                .collect();
            json!({"name": flavor, "resources": resources})
        })
        .collect();
    let rules: Vec<Value> = checks
        .iter()
        .map(|(check, on)| match on.is_empty() {
            true => json!({"name": check}),
            false => json!({"name": check, "onFlavors": on}),
        })
        .collect();
    apply(
        env,
        json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": name},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [{"coveredResources": resources, "flavors": flavors}],
                "admissionChecksStrategy": {"admissionChecks": rules},
            },
        }),
    )
    .await?;
    env.local_queue("lq", &name).await?;
    Ok(name)
}

/// Writes `state` with `updates` in `check`'s entry as a correct controller does (only that
/// entry, the read's `resourceVersion`, a field manager per check; read again on 409).
async fn answer_with_updates(
    env: &TestEnv,
    workload: &str,
    check: &str,
    updates: &[PodSetUpdate],
) -> Result<()> {
    for _ in 0..10 {
        let wl = env.workloads().get(workload).await?;
        let entry = AdmissionCheckState {
            name: check.into(),
            state: CheckState::Ready,
            message: "answered by the test".into(),
            last_transition_time: Some(Time(Timestamp::now())),
            pod_set_updates: updates.to_vec(),
            ..Default::default()
        };
        let body = json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "metadata": {"name": workload, "namespace": env.ns, "resourceVersion": wl.resource_version()},
            "status": {"admissionChecks": [entry]},
        });
        let pp = PatchParams::apply(&format!("{FIELD_MANAGER}-{check}")).force();
        match env
            .workloads()
            .patch_status(workload, &pp, &Patch::Apply(&body))
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(e).with_context(|| format!("answering {check}")),
        }
    }
    bail!("Workload {workload} kept changing")
}

/// A podSetUpdate of podset `main` naming `request` as the pods' ProvisioningRequest.
fn consume(request: &str) -> PodSetUpdate {
    PodSetUpdate {
        name: "main".into(),
        annotations: BTreeMap::from([(CONSUME_ANNOTATION.to_string(), request.to_string())]),
        ..Default::default()
    }
}

/// The Kueue behaviour the SDK's refusal prevents. Two checks the test answers `Ready`, each
/// naming its own request in `consume-provisioning-request` for the one podset of a Job:
/// Kueue's webhook takes both, Kueue admits the Workload, and then its Job reconciler cannot
/// merge the two into the pod template and finishes the Workload, reason `FailedToStart`,
/// naming the key and both values; the Job stays suspended. Given the same value, the Job
/// starts.
#[tokio::test]
async fn kueue_admits_then_fails_to_start_a_workload_whose_ready_entries_give_a_key_two_values()
-> Result<()> {
    let env = TestEnv::new("ready-updates-conflict").await?;
    let flavor = env.resource_flavor("default").await?.name_any();
    let (a, b) = (own_check(&env, "a").await?, own_check(&env, "b").await?);
    let quotas: [(&str, &[(&str, &str)]); 1] = [(&flavor, &[("cpu", "4")])];
    queue(&env, &["cpu"], &quotas, &[(&a, &[]), (&b, &[])]).await?;

    let wl = env.submit_job("two-values", "lq", "1").await?;
    env.wait_check_pending_with_quota(&wl, &b).await?;
    let mut versions = env.record_workloads().await?;
    answer_ready_consuming(&env, &wl, &[(&a, "req-a"), (&b, "req-b")]).await?;
    let failed = finished_failed_to_start(&mut versions, &wl).await?;
    assert_eq!(
        failed.condition.message,
        format!(
            "in admission check \"{b}\": invalid admission check PodSetUpdate: conflict for \
             annotations: conflict for key={CONSUME_ANNOTATION}, value1=req-a, value2=req-b"
        )
    );
    // Admitted first (v0.15.2 then drops Admitted with the Finished write; v0.19.2 keeps it).
    assert!(failed.seen.iter().any(admitted), "admitted first");
    assert_job_suspended(&env, "two-values").await?;

    let same = env.submit_job("one-value", "lq", "1").await?;
    env.wait_check_pending_with_quota(&same, &b).await?;
    answer_ready_consuming(&env, &same, &[(&a, "req-same"), (&b, "req-same")]).await?;
    env.wait_job_unsuspended("one-value").await?;
    let now = env.workloads().get(&same).await?;
    let finished = now.condition_is_true(cond::FINISHED);
    assert!(!finished, "{}", e2e::dump(&now));
    Ok(())
}

/// Two provisioning checks of ours on one ClusterQueue, both covering the Job's one podset:
/// each makes its own request and both are provisioned, but a pod consumes one request only.
/// The first `Ready` written stands; the second is refused before it is written, its entry
/// says why (the podset, the annotation, the other check), the quota is held for the
/// permanent-failure hold, then the `Retry`, past the limit of 0, is `Rejected` and Kueue
/// deactivates the Workload. At no moment is it admitted or finished, so nothing starts on
/// capacity it could not use.
#[tokio::test]
async fn two_checks_of_ours_on_one_podset_refuse_the_second_ready_instead_of_failing_the_job()
-> Result<()> {
    let env = TestEnv::new("prov-two-checks-one-podset").await?;
    let specs = [
        ("prov-a", retry_strategy(0, 1)),
        ("prov-b", retry_strategy(0, 1)),
    ];
    let checks = our_checks(&env, &specs).await?;
    let flavor = env.provisioning_flavor("pool").await?;
    env.queues_on(&flavor, "4", &names(&checks)).await?;
    let controller = env.start_provisioning_controller_tuned(env.client.clone(), None, |c| {
        c.permanent_failure_hold = Duration::from_secs(3);
    })?;
    let simulator = env.start_simulator()?;
    let mut recorder = env.record_workloads().await?;
    let wl = env.job_with_script("job", "provision").await?;

    let (first, second, message) = one_ready_the_other_refused(&env, &wl, &checks).await?;
    let expected = refused_second_ready(&first, &second);
    assert!(message.starts_with(&expected), "{message}");
    let requests = env.our_requests().await?;
    assert_eq!(requests.len(), 2, "one request per check");

    let history = recorder
        .until(&wl, "deactivated", |w| !w.is_active())
        .await?;
    let never_started = |w: &Workload| !admitted(w) && !w.condition_is_true(cond::FINISHED);
    assert!(
        history.iter().all(never_started),
        "admitted or finished on the way"
    );
    let rejected = |w: &Workload| entry_is(w, &second, CheckState::Rejected);
    assert!(history.iter().any(rejected), "never Rejected");
    assert_job_suspended(&env, "job").await?;
    env.wait_nothing_left().await?;
    e2e::Running::stop_all([controller, simulator]).await
}

/// Kueue's built-in check walks into the trap the SDK now refuses: two of its AdmissionChecks
/// (one config) on one ClusterQueue, both covering the Job's one podset, each have their request
/// provisioned and answer `Ready` naming it in `consume-provisioning-request`; Kueue admits the
/// Workload, then finishes it as `FailedToStart`, and the Job never starts.
#[tokio::test]
async fn two_built_in_checks_on_one_podset_are_admitted_then_fail_to_start() -> Result<()> {
    let env = TestEnv::new("kueue-two-checks-one-podset").await?;
    let config = env.provisioning_config("prc", retry_strategy(0, 1)).await?;
    let checks = kueues_checks(&env, &config, &["kprov-a", "kprov-b"]).await?;
    let flavor = env.provisioning_flavor("pool").await?;
    env.queues_on(&flavor, "4", &names(&checks)).await?;
    let simulator = env.start_simulator()?;
    let mut versions = env.record_workloads().await?;
    let wl = env.job_with_script("job", "provision").await?;
    let failed = finished_failed_to_start(&mut versions, &wl).await?;
    let conflict = format!(
        "invalid admission check PodSetUpdate: conflict for annotations: conflict for \
         key={CONSUME_ANNOTATION}"
    );
    let message = &failed.condition.message;
    assert!(message.contains(&conflict), "{message}");
    assert_all_ready(&failed.finished, &checks);
    assert!(failed.seen.iter().any(admitted));
    assert_job_suspended(&env, "job").await?;
    simulator.stop().await
}

/// A Workload of two podsets, `cpus` (cpu only) and `mems` (memory only), in LocalQueue `lq`,
/// whose requests the simulator provisions; owned by no Job (a batch/v1 Job has one podset).
async fn two_podset_workload(env: &TestEnv, name: &str) -> Result<Workload> {
    let template = |resource: &str, quantity: &str| {
        json!({
            "metadata": {"annotations": {SCRIPT_ANNOTATION: "provision"}},
            "spec": {
                "restartPolicy": "Never",
                "containers": [{
                    "name": "main",
                    "image": "registry.invalid/kwok-runs-it:1",
                    "resources": {"requests": {resource: quantity}},
                }],
            },
        })
    };
    let wl: Workload = serde_json::from_value(json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": name, "namespace": env.ns},
        "spec": {
            "queueName": "lq",
            "podSets": [
                {"name": "cpus", "count": 2, "template": template("cpu", "1")},
                {"name": "mems", "count": 1, "template": template("memory", "1Gi")},
            ],
        },
    }))?;
    env.create_workload(&wl).await
}

/// Two provisioning checks of ours whose configs manage different resources, on one
/// ClusterQueue, for a Workload whose two podsets need one each: each check makes one request
/// for its podset only, both are `Ready` while the gate holds the Workload back, each entry's
/// podSetUpdates name its own podset and request, and once the gate opens the Workload is
/// admitted with both. Finished, nothing is left.
#[tokio::test]
async fn two_checks_of_ours_on_two_podsets_each_make_a_request_and_admit_together() -> Result<()> {
    let env = TestEnv::new("prov-two-checks-two-podsets").await?;
    let (checks, gate) = checks_per_resource_and_a_gate(&env).await?;
    let controller = env.start_provisioning_controller(None)?;
    let simulator = env.start_simulator()?;

    let wl = two_podset_workload(&env, "pair").await?.name_any();
    let both = all_ready(&env, &wl, &checks).await?;
    assert!(!admitted(&both), "the gate holds it");
    for (check, pod_set, count) in [(&checks[0], "cpus", 2), (&checks[1], "mems", 1)] {
        let request = format!("{wl}-{check}-1");
        let entry = e2e::entry_of(&both, check)?;
        let expected = [(pod_set.to_string(), Some(request.clone()))];
        assert_eq!(consumed_per_podset(&entry), expected, "{entry:#?}");
        let template = format!("ppt-{request}-{pod_set}");
        assert_eq!(templates_of(&env, &request).await?, [(template, count)]);
    }
    assert_eq!(env.our_requests().await?.len(), 2);

    env.answer_check(&wl, &gate, CheckState::Ready, "the gate opens")
        .await?;
    assert_all_ready(&env.wait_admitted(&wl).await?, &checks);
    env.finish_standalone_workload(&wl).await?;
    env.wait_nothing_left().await?;
    e2e::Running::stop_all([controller, simulator]).await
}

/// A check limited to one flavor (`onFlavors`) of a two-flavor ClusterQueue, as Kueue decides
/// which checks a Workload gets: the first Job, assigned that flavor, gets the entry, a request
/// and the podSetUpdates; the second, assigned the other flavor because the first holds all of
/// its quota, gets no entry for the check, no request, and its pods run on the other flavor's
/// Node without the autoscaler's annotation. Kueue's built-in check acts on entries only, so it
/// behaves the same.
#[tokio::test]
async fn a_check_on_one_flavor_makes_no_request_for_workloads_on_the_other() -> Result<()> {
    let env = TestEnv::new("prov-on-flavors").await?;
    let check = our_check(&env, "prov", "prc", json!({})).await?;
    let guarded = env.provisioning_flavor("pool").await?;
    let other = env.provisioning_flavor("pool-b").await?;
    let quotas: [(&str, &[(&str, &str)]); 2] =
        [(&guarded, &[("cpu", "1")]), (&other, &[("cpu", "4")])];
    queue(&env, &["cpu"], &quotas, &[(&check, &[&guarded])]).await?;
    let controller = env.start_provisioning_controller(None)?;
    let simulator = env.start_simulator()?;

    let first = env.job_with_script("first", "provision").await?;
    let (admitted, entry) = env.wait_admitted_ready(&first, &check).await?;
    assert_eq!(assigned_flavor(&admitted), Some(guarded.clone()));
    let request = format!("{first}-{check}-1");
    assert_eq!(first_consumed(&entry), Some(&request));
    env.wait_job_pods_running("first", 1).await?;

    let second = env.job_with_script("second", "provision").await?;
    let admitted = env.wait_admitted(&second).await?;
    assert_eq!(assigned_flavor(&admitted), Some(other.clone()));
    let entry = admitted.admission_check(&check);
    assert_eq!(entry, None, "{}", e2e::dump(&admitted));
    let pods = env.wait_job_pods_running("second", 1).await?;
    assert_eq!(node_of(&pods[0]), Some("kwok-standing-pool-b"));
    assert_eq!(pod_annotation(&pods[0], CONSUME_ANNOTATION), None);
    assert_eq!(env.our_requests().await?, [request]);
    e2e::Running::stop_all([controller, simulator]).await
}

/// The flavor assigned to the first podset's cpu.
fn assigned_flavor(wl: &Workload) -> Option<String> {
    let admission = wl.status.as_ref()?.admission.as_ref()?;
    admission
        .pod_set_assignments
        .first()?
        .flavors
        .get("cpu")
        .cloned()
}

/// Whether Kueue admitted the Workload.
fn admitted(wl: &Workload) -> bool {
    wl.condition_is_true(cond::ADMITTED)
}

/// Whether `check`'s entry on the Workload is in `state`.
fn entry_is(wl: &Workload, check: &str, state: CheckState) -> bool {
    wl.admission_check(check).is_some_and(|e| e.state == state)
}

/// The checks' names as the queue helpers take them.
fn names(checks: &[String]) -> Vec<&str> {
    checks.iter().map(String::as_str).collect()
}

/// Waits until our entry is `Ready` after `retry_count` retries while the Workload holds
/// quota (not being evicted), and asserts the gate still holds it back (not admitted).
async fn ready_held_by_the_gate(
    env: &TestEnv,
    workload: &str,
    check: &str,
    retry_count: Option<i32>,
) -> Result<Workload> {
    let what = match retry_count {
        None => "our check Ready on attempt 1".to_string(),
        Some(n) => format!("our check Ready again on attempt {}", n + 1),
    };
    let ready = env
        .wait_workload(workload, &what, |w| {
            w.condition_is_true(cond::QUOTA_RESERVED)
                && !w.condition_is_true(cond::EVICTED)
                && w.admission_check(check)
                    .is_some_and(|e| e.state == CheckState::Ready && e.retry_count == retry_count)
        })
        .await?;
    assert!(!admitted(&ready), "the gate holds it");
    Ok(ready)
}

/// Waits until the history saw our entry `Ready` on attempt 2; returns the messages of every
/// `Retry` entry it saw before.
async fn retries_seen_before_ready_again(
    wls: &History<Workload>,
    workload: &str,
    check: &str,
) -> Result<Vec<String>> {
    wls.wait_seen(workload, "the history saw attempt 2's Ready", |w| {
        w.admission_check(check)
            .is_some_and(|e| e.state == CheckState::Ready && e.retry_count == Some(1))
    })
    .await?;
    Ok(wls
        .applied()
        .iter()
        .filter_map(|w| w.admission_check(check))
        .filter(|e| e.state == CheckState::Retry)
        .map(|e| e.message.clone())
        .collect())
}

/// The controller's counts of failed and of provisioned requests for the check, with the
/// metrics they were read from.
async fn failed_and_provisioned_counts(t: &World) -> Result<([f64; 2], String)> {
    let m = t.controller()?.metrics().await?;
    let series = |name: &str| e2e::metric_sample(&m, &t.series(name)).unwrap_or_default();
    let counts = [
        series("kueue_provisioning_requests_failed_total"),
        series("kueue_provisioning_requests_provisioned_total"),
    ];
    Ok((counts, m))
}

/// An AdmissionCheck `name` of a controller of the test's own (the test answers it), active;
/// returns its name.
async fn own_check(env: &TestEnv, name: &str) -> Result<String> {
    let controller = env.own_controller_name(name);
    let check = env.admission_check(name, &controller).await?.name_any();
    env.set_admission_check_active(&check, true).await?;
    Ok(check)
}

/// A ProvisioningRequestConfig `config` of `spec` and an AdmissionCheck `name` of our
/// controller on it; returns the check's name.
async fn our_check(env: &TestEnv, name: &str, config: &str, spec: Value) -> Result<String> {
    let config = env.provisioning_config(config, spec).await?;
    env.provisioning_check(name, &env.provisioning_controller_name(), &config)
        .await
}

/// [`our_check`] `<name>` on config `<name>-prc` for each `(name, spec)`, in order; returns
/// the checks' names.
async fn our_checks(env: &TestEnv, specs: &[(&str, Value)]) -> Result<Vec<String>> {
    let mut checks = Vec::new();
    for (name, spec) in specs {
        let config = format!("{name}-prc");
        checks.push(our_check(env, name, &config, spec.clone()).await?);
    }
    Ok(checks)
}

/// AdmissionChecks `names` of Kueue's built-in controller, all on config `config`, in order;
/// returns their names.
async fn kueues_checks(env: &TestEnv, config: &str, names: &[&str]) -> Result<Vec<String>> {
    let mut checks = Vec::new();
    for name in names {
        checks.push(
            env.provisioning_check(name, KUEUE_CONTROLLER_NAME, config)
                .await?,
        );
    }
    Ok(checks)
}

/// Answers each `(check, request)` in order `Ready`, its podSetUpdate naming `request` for
/// the pods of podset `main` to consume.
async fn answer_ready_consuming(
    env: &TestEnv,
    workload: &str,
    answers: &[(&str, &str)],
) -> Result<()> {
    for (check, request) in answers {
        answer_with_updates(env, workload, check, &[consume(request)]).await?;
    }
    Ok(())
}

/// A Workload Kueue finished as `FailedToStart`: every version seen until then, the last,
/// and its `Finished` condition.
struct FailedToStart {
    seen: Vec<Workload>,
    finished: Workload,
    condition: Condition,
}

/// Records the Workload until it is `Finished` and asserts the reason is `FailedToStart`.
async fn finished_failed_to_start(
    versions: &mut e2e::WorkloadRecorder,
    workload: &str,
) -> Result<FailedToStart> {
    let seen = versions
        .until(workload, "Finished", |w| {
            w.condition_is_true(cond::FINISHED)
        })
        .await?;
    let finished = seen.last().cloned().context("a version")?;
    let condition = finished
        .condition(cond::FINISHED)
        .cloned()
        .context("a Finished condition")?;
    assert_eq!(
        condition.reason,
        "FailedToStart",
        "{}",
        e2e::dump(&finished)
    );
    Ok(FailedToStart {
        seen,
        finished,
        condition,
    })
}

/// Asserts Job `job` is still suspended.
async fn assert_job_suspended(env: &TestEnv, job: &str) -> Result<()> {
    assert_eq!(env.job_suspend(job).await?, Some(true));
    Ok(())
}

/// Asserts every one of `checks` has its entry `Ready` on the Workload.
fn assert_all_ready(wl: &Workload, checks: &[String]) {
    for check in checks {
        let e = wl.admission_check(check).cloned().unwrap_or_default();
        assert_eq!(e.state, CheckState::Ready, "{}", e2e::dump(wl));
    }
}

/// Waits until the Workload holds quota with one of `checks` `Ready` and the other's
/// `Ready` refused (its entry `Pending` with a permanent failure), and asserts the first is
/// `Ready`; returns the first check, the refused one and the refusal's message.
async fn one_ready_the_other_refused(
    env: &TestEnv,
    workload: &str,
    checks: &[String],
) -> Result<(String, String, String)> {
    let refused = |w: &Workload| {
        checks.iter().find_map(|c| {
            let e = w.admission_check(c)?;
            (e.state == CheckState::Pending && e.message.starts_with("Permanent failure"))
                .then(|| (c.clone(), e.message.clone()))
        })
    };
    let held = env
        .wait_workload(workload, "one Ready, the other refused", |w| {
            w.condition_is_true(cond::QUOTA_RESERVED) && refused(w).is_some()
        })
        .await?;
    let (second, message) = refused(&held).context("the refused check")?;
    let first = checks
        .iter()
        .find(|c| **c != second)
        .cloned()
        .unwrap_or_default();
    let first_entry = held.admission_check(&first).cloned().unwrap_or_default();
    assert_eq!(first_entry.state, CheckState::Ready, "{}", e2e::dump(&held));
    Ok((first, second, message))
}

/// How the refusal of check `second`'s `Ready` begins, when `first`'s stands: the podset,
/// the annotation, the other check and what Kueue would do.
fn refused_second_ready(first: &str, second: &str) -> String {
    format!(
        "Permanent failure: the Ready answer of check {second} cannot be written: the \
         podSetUpdate for podset \"main\" gives annotation \"{CONSUME_ANNOTATION}\" another \
         value than the Ready entry of check \"{first}\" does: Kueue would admit the \
         workload and then fail to start it (reason FailedToStart)"
    )
}

/// Waits until every one of `checks` is `Ready` on the Workload.
async fn all_ready(env: &TestEnv, workload: &str, checks: &[String]) -> Result<Workload> {
    env.wait_workload(workload, "both provisioning checks Ready", |w| {
        checks.iter().all(|c| entry_is(w, c, CheckState::Ready))
    })
    .await
}

/// Each podSetUpdate of the entry: its podset and the request its pods consume.
fn consumed_per_podset(entry: &AdmissionCheckState) -> Vec<(String, Option<String>)> {
    entry
        .pod_set_updates
        .iter()
        .map(|u| {
            (
                u.name.clone(),
                u.annotations.get(CONSUME_ANNOTATION).cloned(),
            )
        })
        .collect()
}

/// The request the first podSetUpdate of the entry has its pods consume.
fn first_consumed(entry: &AdmissionCheckState) -> Option<&String> {
    entry.pod_set_updates[0].annotations.get(CONSUME_ANNOTATION)
}

/// Each podset of request `request`: the PodTemplate it names and its count.
async fn templates_of(env: &TestEnv, request: &str) -> Result<Vec<(String, i32)>> {
    let r = env.provisioning_requests().get(request).await?;
    Ok(r.spec
        .pod_sets
        .iter()
        .map(|p| (p.pod_template_ref.name.clone(), p.count))
        .collect())
}

/// Our checks `prov-cpu` and `prov-mem`, whose configs manage cpu and memory only, and the
/// test's `gate`, all on one ClusterQueue of flavor `pool` (4 cpu, 4Gi) fed by LocalQueue
/// `lq`; returns our checks' names and the gate's.
async fn checks_per_resource_and_a_gate(env: &TestEnv) -> Result<(Vec<String>, String)> {
    let managing = |resource: &str| json!({"managedResources": [resource]});
    let specs = [
        ("prov-cpu", managing("cpu")),
        ("prov-mem", managing("memory")),
    ];
    let checks = our_checks(env, &specs).await?;
    let gate = own_check(env, "gate").await?;
    let flavor = env.provisioning_flavor("pool").await?;
    let quotas: [(&str, &[(&str, &str)]); 1] = [(&flavor, &[("cpu", "4"), ("memory", "4Gi")])];
    let rules = [
        (checks[0].as_str(), &[][..]),
        (&checks[1], &[]),
        (&gate, &[]),
    ];
    queue(env, &["cpu", "memory"], &quotas, &rules).await?;
    Ok((checks, gate))
}

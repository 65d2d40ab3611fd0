//! The provisioning check on a cluster: the simulator plays cluster-autoscaler 1.36.1 (no
//! script), adds kwok Nodes from the test's node group or finds room on Nodes the test made,
//! kube-scheduler binds the Job's pods and kwok runs them. Each test looks at the pods and the
//! Nodes, not only at the Workload.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, Result};
use e2e::capacity::{
    BEST_EFFORT, CHECK_CAPACITY, CLASS_ANNOTATION, CONSUME_ANNOTATION, CapacitySetup, GROUP_LABEL,
    GroupShape, node_of, pod_annotation, pod_node_selector, wait_request_where,
};
use e2e::provisioning::World;
use e2e::{SuspendedJob, TestEnv};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kueue_admission_sdk::api::{
    AdmissionCheckState, CheckState, ProvisioningRequest, Workload, find_condition,
    workload_condition as cond,
};
use serde_json::json;

/// `provisioningClassName: class`, one retry a second later, then Rejected.
fn config(class: &str) -> serde_json::Value {
    json!({
        "provisioningClassName": class,
        "retryStrategy": {"backoffLimitCount": 1, "backoffBaseSeconds": 1, "backoffMaxSeconds": 1},
    })
}

/// Submits a Job of `pods` pods of 1 cpu to `lq`; returns its Workload's name.
async fn job(env: &TestEnv, name: &str, pods: i32) -> Result<String> {
    env.submit(&SuspendedJob {
        parallelism: Some(pods),
        ..SuspendedJob::new(name, "lq", "1")
    })
    .await
}

/// The condition `type_` of a request, as `(status, reason, message)`.
fn request_condition(r: &ProvisioningRequest, type_: &str) -> Option<(String, String, String)> {
    let conditions = r.status.as_ref().map_or(&[][..], |s| &s.conditions[..]);
    find_condition(conditions, type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Asserts that each pod consumes `request` of `class`, selects this test's node group, and
/// runs on one of `nodes`.
fn assert_pods_on(pods: &[Pod], request: &str, class: &str, group: &str, nodes: &BTreeSet<String>) {
    for pod in pods {
        let what = e2e::describe_pod(pod);
        assert_eq!(
            pod_annotation(pod, CONSUME_ANNOTATION),
            Some(request),
            "{what}"
        );
        assert_eq!(pod_annotation(pod, CLASS_ANNOTATION), Some(class), "{what}");
        assert_eq!(pod_node_selector(pod, GROUP_LABEL), Some(group), "{what}");
        let node = node_of(pod).unwrap_or_default();
        assert!(nodes.contains(node), "{what}: not on {nodes:?}");
    }
}

/// The names of this test's node group's Nodes.
async fn group_node_names(env: &TestEnv) -> Result<BTreeSet<String>> {
    Ok(env
        .group_nodes()
        .await?
        .iter()
        .map(|n| n.name_any())
        .collect())
}

/// Waits until the node group has no Node left.
async fn wait_group_empty(env: &TestEnv) -> Result<()> {
    e2e::eventually_async("the node group scaled down to no Node", || async {
        Ok(env.group_nodes().await?.is_empty())
    })
    .await
}

/// The controller's counter of the requests it made.
const CREATED: &str = "kueue_provisioning_requests_created_total";
/// The controller's counter of the bookings it saw expire.
const BOOKING_EXPIRED: &str = "kueue_provisioning_requests_booking_expired_total";

/// The node group of the best-effort tests: Nodes of 4 cpu, at most 5.
const GROUP: GroupShape = GroupShape { cpu: "4", max: 5 };

/// A best-effort world's setup: [`config`] of [`BEST_EFFORT`] and the node group [`GROUP`].
fn best_effort() -> CapacitySetup {
    CapacitySetup {
        config: config(BEST_EFFORT),
        group: Some(GROUP),
        ..CapacitySetup::default()
    }
}

/// A check-capacity world's setup: [`config`] of [`CHECK_CAPACITY`], 16 cpu of quota, no node
/// group (the simulator adds no Node).
fn check_capacity() -> CapacitySetup {
    CapacitySetup {
        config: config(CHECK_CAPACITY),
        quota: "16",
        ..CapacitySetup::default()
    }
}

/// A best-effort setup whose node group may have 1 Node of 4 cpu, with no retries and the
/// controller's provisioning timeout at 6 s.
fn one_node_and_a_6s_timeout() -> CapacitySetup {
    CapacitySetup {
        config: json!({
            "provisioningClassName": BEST_EFFORT,
            "retryStrategy": {"backoffLimitCount": 0},
        }),
        config_annotations: vec![(
            "kueue-admission-checks.dev/provisioning-timeout-seconds",
            "6".into(),
        )],
        group: Some(GroupShape { cpu: "4", max: 1 }),
        ..CapacitySetup::default()
    }
}

/// The best-effort setup with the AdmissionCheck `gate` beside ours, and 2 retries 3 s apart.
fn gated_best_effort(gate: &str) -> CapacitySetup {
    CapacitySetup {
        config: json!({
            "provisioningClassName": BEST_EFFORT,
            "retryStrategy": {"backoffLimitCount": 2, "backoffBaseSeconds": 3, "backoffMaxSeconds": 3},
        }),
        extra_checks: vec![gate.to_string()],
        ..best_effort()
    }
}

/// The simulator's settings with bookings of 2 s (10 minutes in cluster-autoscaler).
fn short_booking(s: &mut autoscaler_simulator::Settings) {
    s.booking_duration = Duration::from_secs(2);
}

/// `(reason, message)` of the request's `Provisioned` condition, once it is `False`.
async fn wait_not_provisioned(env: &TestEnv, request: &str) -> Result<(String, String)> {
    let r = wait_request_where(env, request, "Provisioned=False", |r| {
        request_condition(r, "Provisioned").is_some_and(|(s, _, _)| s == "False")
    })
    .await?;
    let (_, reason, message) = request_condition(&r, "Provisioned").context("Provisioned")?;
    Ok((reason, message))
}

/// `(status, reason)` of the request's `Provisioned` condition now.
async fn provisioned(env: &TestEnv, request: &str) -> Result<(String, String)> {
    let r = env.provisioning_requests().get(request).await?;
    let (status, reason, _) = request_condition(&r, "Provisioned").context("Provisioned")?;
    Ok((status, reason))
}

/// Waits until our entry is `Pending` with the autoscaler's `message` in it (`what`).
async fn wait_pending_with(t: &World, wl: &str, message: &str, what: &str) -> Result<Workload> {
    t.env
        .wait_workload(wl, what, |w| {
            w.admission_check(&t.p.check)
                .is_some_and(|e| e.state == CheckState::Pending && e.message.contains(message))
        })
        .await
}

/// Waits until our entry is in `state` (`what`); returns the Workload and the entry.
async fn wait_our_entry(
    t: &World,
    wl: &str,
    state: CheckState,
    what: &str,
) -> Result<(Workload, AdmissionCheckState)> {
    let found = t
        .env
        .wait_workload(wl, what, |w| {
            w.admission_check(&t.p.check)
                .is_some_and(|e| e.state == state)
        })
        .await?;
    let entry = found
        .admission_check(&t.p.check)
        .cloned()
        .context("entry")?;
    Ok((found, entry))
}

/// The Workload now and our entry on it.
async fn workload_and_entry(t: &World, wl: &str) -> Result<(Workload, AdmissionCheckState)> {
    let now: Workload = t.env.workloads().get(wl).await?;
    let entry = now.admission_check(&t.p.check).cloned().context("entry")?;
    Ok((now, entry))
}

/// Submits a Job of one pod, waits until it is admitted with our check `Ready` and its pod
/// runs; returns its Workload and the running pod.
async fn admitted_and_running(t: &World, name: &str) -> Result<(String, Vec<Pod>)> {
    let wl = job(&t.env, name, 1).await?;
    t.env.wait_admitted_ready(&wl, &t.p.check).await?;
    let running = t.env.wait_job_pods_running(name, 1).await?;
    Ok((wl, running))
}

/// Waits until `pods` pods of the Job run; returns them and the names of the node group's
/// Nodes then.
async fn running_on_the_group(
    env: &TestEnv,
    job: &str,
    pods: i32,
) -> Result<(Vec<Pod>, BTreeSet<String>)> {
    let running = env.wait_job_pods_running(job, pods).await?;
    Ok((running, group_node_names(env).await?))
}

/// `(name, node)` of each pod.
fn placements(pods: &[Pod]) -> Vec<(String, Option<String>)> {
    pods.iter()
        .map(|p| (p.name_any(), node_of(p).map(String::from)))
        .collect()
}

/// How many reconciles the controller has finished, whatever their result.
async fn reconciles(t: &World) -> Result<f64> {
    let text = t.controller()?.metrics().await?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with("kueue_ac_reconcile_duration_seconds_count"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// Changes the Workload (a label nobody reads) and waits until the controller has reconciled
/// since: a decision after whatever happened before.
async fn changed_and_reconciled(t: &World, wl: &str) -> Result<()> {
    let before = reconciles(t).await?;
    t.env.touch_workload(wl, "1").await?;
    e2e::eventually_async("a reconcile after the change", || async {
        Ok(reconciles(t).await? > before)
    })
    .await
}

/// The world again with the simulator's bookings as long as cluster-autoscaler's: the old
/// simulator stopped, a new one scaling [`GROUP`] started.
async fn with_full_bookings(t: World) -> Result<World> {
    let World {
        env,
        p,
        controller,
        simulator,
    } = t;
    simulator.stop().await?;
    let group = env.node_group_of(GROUP)?;
    let simulator = env.start_autoscaler(vec![group], |_| {});
    Ok(World {
        env,
        p,
        controller,
        simulator,
    })
}

/// Waits until our entry is `Ready` (attempt 2's, the gate still closed), then opens the gate
/// and waits until the Workload is admitted.
async fn ready_then_the_gate_opens(t: &World, wl: &str, gate: &str) -> Result<()> {
    let env = &t.env;
    env.wait_workload(wl, "our entry Ready on attempt 2", |w| {
        w.admission_check(&t.p.check)
            .is_some_and(|e| e.state == CheckState::Ready)
    })
    .await?;
    env.answer_check(wl, gate, CheckState::Ready, "the gate opens")
        .await?;
    env.wait_admitted(wl).await?;
    Ok(())
}

/// best-effort-atomic-scale-up: the request makes the autoscaler add Nodes of the group (all
/// the pods need, at once) and write Provisioned; the Job's pods consume that request, carry the
/// flavor's node selector and run on those Nodes. When the Job's pods succeed, the Workload
/// finishes and the request, its templates and (once idle) the Nodes go.
#[tokio::test]
async fn best_effort_pods_run_on_the_nodes_added_for_their_request_and_all_goes_when_they_end()
-> Result<()> {
    let t = World::on_capacity("cap-best-effort", best_effort(), |_| {}).await?;
    let env = &t.env;
    let none = env.group_nodes().await?.is_empty();
    assert!(none, "no Node before the request");
    let wl = job(env, "train", 4).await?;
    env.wait_admitted_ready(&wl, &t.p.check).await?;
    let request = t.request(&wl, 1);
    let (status, reason) = provisioned(env, &request).await?;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "CapacityIsProvisioned")
    );
    let nodes = group_node_names(env).await?;
    // 4 pods of 1 cpu on Nodes of 4 cpu, less what the autoscaler keeps for kube-proxy on a
    // Node it has not seen yet: 3 a Node, so 2 Nodes, added for this request only.
    assert_eq!(nodes.len(), 2, "{nodes:?}");
    let pods = env.wait_job_pods_running("train", 4).await?;
    assert_pods_on(&pods, &request, BEST_EFFORT, &env.node_group(), &nodes);

    let done = env.complete_job("train", &wl).await?;
    let finished = done.condition(cond::FINISHED).map(|c| c.reason.as_str());
    assert_eq!(finished, Some("Succeeded"));
    env.wait_nothing_left().await?;
    wait_group_empty(env).await?;
    t.stop().await
}

/// check-capacity: the request is provisioned only because the room exists (a Node the test
/// made), no Node is added, and the pods run on that Node. A second Job that does not fit (the
/// first one's pods run there and its booking still holds) gets Provisioned=False, and its
/// check stays Pending with the autoscaler's message.
#[tokio::test]
async fn check_capacity_pods_run_on_existing_room_and_a_job_that_does_not_fit_waits() -> Result<()>
{
    let t = World::on_capacity("cap-check-capacity", check_capacity(), |_| {}).await?;
    let env = &t.env;
    let room = env.existing_capacity("room", "4").await?;
    let wl = job(env, "fits", 2).await?;
    env.wait_admitted_ready(&wl, &t.p.check).await?;
    let request = t.request(&wl, 1);
    assert_eq!(provisioned(env, &request).await?.1, "CapacityIsFound");
    let pods = env.wait_job_pods_running("fits", 2).await?;
    let only_room = BTreeSet::from([room.clone()]);
    let group = env.node_group();
    assert_pods_on(&pods, &request, CHECK_CAPACITY, &group, &only_room);

    // 4 cpu less 2 running and 2 booked (cluster-autoscaler 1.36.1 counts both): no room for 1.
    let waiting = job(env, "waits", 1).await?;
    let (reason, message) = wait_not_provisioned(env, &t.request(&waiting, 1)).await?;
    assert_eq!(reason, "CapacityIsNotFound");
    let what = "the autoscaler's message on the entry";
    let pending = wait_pending_with(&t, &waiting, &message, what).await?;
    assert!(!pending.condition_is_true(cond::ADMITTED));
    let nodes = group_node_names(env).await?;
    assert_eq!(nodes, only_room, "check-capacity adds no Node");
    t.stop().await
}

/// A best-effort request the node group cannot serve (it would need 2 Nodes, the group may
/// have 1) is Provisioned=False/CapacityIsNotFound: no Node is added, the check stays Pending
/// with the autoscaler's message, and the controller's provisioning timeout still ends the
/// attempt (no retry left: Rejected).
#[tokio::test]
async fn capacity_not_found_keeps_the_check_pending_with_the_message_until_the_timeout()
-> Result<()> {
    let setup = one_node_and_a_6s_timeout();
    let t = World::on_capacity("cap-not-found", setup, |_| {}).await?;
    let env = &t.env;
    let wl = job(env, "big", 4).await?;
    let (reason, message) = wait_not_provisioned(env, &t.request(&wl, 1)).await?;
    assert_eq!(reason, "CapacityIsNotFound");
    wait_pending_with(&t, &wl, &message, "Pending with the autoscaler's message").await?;
    let none = env.group_nodes().await?.is_empty();
    assert!(none, "never a partial scale-up");

    let what = "Rejected after the timeout";
    let (_, entry) = wait_our_entry(&t, &wl, CheckState::Rejected, what).await?;
    let timed_out = entry.message.contains("not provisioned within");
    assert!(timed_out, "{}", entry.message);
    t.wait_counter("kueue_provisioning_requests_timed_out_total", 1.0)
        .await?;
    assert!(env.group_nodes().await?.is_empty());
    t.stop().await
}

/// cluster-autoscaler deletes requests a while after they were provisioned (7 days; 3 s
/// here). A Workload admitted on such a request keeps running: its request is not made again,
/// and its pods stay where they run.
#[tokio::test]
async fn a_request_the_autoscaler_deletes_while_its_workload_runs_is_not_made_again() -> Result<()>
{
    let three_seconds = |s: &mut autoscaler_simulator::Settings| {
        s.request_ttl = Duration::from_secs(3);
    };
    let t = World::on_capacity("cap-request-gc", best_effort(), three_seconds).await?;
    let env = &t.env;
    let (wl, running) = admitted_and_running(&t, "long").await?;
    let request = t.request(&wl, 1);
    e2e::wait_gone(env.provisioning_requests(), &request).await?;
    // Our watch saw the deletion: it deletes the request's templates.
    env.wait_nothing_left().await?;
    // And a decision after it makes nothing: the Workload is changed, and reconciled.
    changed_and_reconciled(&t, &wl).await?;
    assert!(env.our_requests().await?.is_empty());
    t.wait_counter(CREATED, 1.0).await?;
    let now: Workload = env.workloads().get(&wl).await?;
    assert!(now.condition_is_true(cond::ADMITTED), "{}", e2e::dump(&now));
    assert!(!now.condition_is_true(cond::EVICTED), "{}", e2e::dump(&now));
    let still = env.wait_job_pods_running("long", 1).await?;
    assert_eq!(placements(&still), placements(&running));
    t.stop().await
}

/// The booking ends (10 minutes after Provisioned in cluster-autoscaler; 2 s here). Before
/// admission (another check holds it) that is a failed attempt: Retry, and the next attempt's
/// request makes the Job run, on Nodes added for it. After admission it is ignored: the pods
/// keep running and no request is made again.
#[tokio::test]
async fn an_expired_booking_retries_before_admission_and_is_ignored_after() -> Result<()> {
    let (env, gate) = e2e::capacity::env_with_gate("cap-booking").await?;
    let t = World::on_capacity_in(env, gated_best_effort(&gate), short_booking).await?;
    let wl = job(&t.env, "gated", 1).await?;
    // Attempt 1: provisioned, and its booking expires while the gate holds admission.
    t.env
        .wait_request(&t.request(&wl, 1), "BookingExpired")
        .await?;
    // From now on bookings last as long as cluster-autoscaler's, so the next attempt's holds
    // while the test opens the gate (that request comes after the 3 s retry delay).
    let t = with_full_bookings(t).await?;
    let (env, second) = (&t.env, t.request(&wl, 2));
    env.wait_request(&second, "Provisioned").await?;
    ready_then_the_gate_opens(&t, &wl, &gate).await?;
    let (pods, nodes) = running_on_the_group(env, "gated", 1).await?;
    assert_pods_on(&pods, &second, BEST_EFFORT, &env.node_group(), &nodes);
    t.wait_counter(BOOKING_EXPIRED, 1.0).await?;
    t.stop().await?;

    // After admission: a world of one check, bookings of 2 s.
    let t = World::on_capacity("cap-booking-after", best_effort(), short_booking).await?;
    let (wl, running) = admitted_and_running(&t, "runs").await?;
    t.env
        .wait_request(&t.request(&wl, 1), "BookingExpired")
        .await?;
    // The controller has seen it, and made nothing of it.
    t.wait_counter(BOOKING_EXPIRED, 1.0).await?;
    t.wait_counter(CREATED, 1.0).await?;
    let (now, entry) = workload_and_entry(&t, &wl).await?;
    assert!(now.condition_is_true(cond::ADMITTED), "{}", e2e::dump(&now));
    assert_eq!(entry.state, CheckState::Ready);
    let still = t.env.wait_job_pods_running("runs", 1).await?;
    assert_eq!(still[0].name_any(), running[0].name_any());
    t.stop().await
}

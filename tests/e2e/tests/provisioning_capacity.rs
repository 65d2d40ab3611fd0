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
use kube::api::{Patch, PatchParams};
use kueue_admission_sdk::api::{
    CheckState, ProvisioningRequest, Workload, find_condition, workload_condition as cond,
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

/// best-effort-atomic-scale-up: the request makes the autoscaler add Nodes of the group (all
/// the pods need, at once) and write Provisioned; the Job's pods consume that request, carry the
/// flavor's node selector and run on those Nodes. When the Job's pods succeed, the Workload
/// finishes and the request, its templates and (once idle) the Nodes go.
#[tokio::test]
async fn best_effort_pods_run_on_the_nodes_added_for_their_request_and_all_goes_when_they_end()
-> Result<()> {
    let setup = CapacitySetup {
        config: config(BEST_EFFORT),
        group: Some(GroupShape { cpu: "4", max: 5 }),
        ..CapacitySetup::default()
    };
    let t = World::on_capacity("cap-best-effort", setup, |_| {}).await?;
    let env = &t.env;
    assert!(
        env.group_nodes().await?.is_empty(),
        "no Node before the request"
    );
    let wl = job(env, "train", 4).await?;
    env.wait_admitted_ready(&wl, &t.p.check).await?;

    let request = t.request(&wl, 1);
    let r = env.provisioning_requests().get(&request).await?;
    let (status, reason, _) = request_condition(&r, "Provisioned").context("Provisioned")?;
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
    assert_eq!(
        done.condition(cond::FINISHED).map(|c| c.reason.as_str()),
        Some("Succeeded")
    );
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
    let setup = CapacitySetup {
        config: config(CHECK_CAPACITY),
        quota: "16",
        ..CapacitySetup::default()
    };
    let t = World::on_capacity("cap-check-capacity", setup, |_| {}).await?;
    let env = &t.env;
    let room = env.existing_capacity("room", "4").await?;
    let wl = job(env, "fits", 2).await?;
    env.wait_admitted_ready(&wl, &t.p.check).await?;
    let request = t.request(&wl, 1);
    let r = env.provisioning_requests().get(&request).await?;
    let (_, reason, _) = request_condition(&r, "Provisioned").context("Provisioned")?;
    assert_eq!(reason, "CapacityIsFound");
    let pods = env.wait_job_pods_running("fits", 2).await?;
    let only_room = BTreeSet::from([room.clone()]);
    assert_pods_on(
        &pods,
        &request,
        CHECK_CAPACITY,
        &env.node_group(),
        &only_room,
    );

    // 4 cpu less 2 running and 2 booked (cluster-autoscaler 1.36.1 counts both): no room for 1.
    let waiting = job(env, "waits", 1).await?;
    let second = t.request(&waiting, 1);
    let r = wait_request_where(env, &second, "Provisioned=False", |r| {
        request_condition(r, "Provisioned").is_some_and(|(s, _, _)| s == "False")
    })
    .await?;
    let (_, reason, message) = request_condition(&r, "Provisioned").context("Provisioned")?;
    assert_eq!(reason, "CapacityIsNotFound");
    let pending = env
        .wait_workload(&waiting, "the autoscaler's message on the entry", |w| {
            w.admission_check(&t.p.check)
                .is_some_and(|e| e.state == CheckState::Pending && e.message.contains(&message))
        })
        .await?;
    assert!(!pending.condition_is_true(cond::ADMITTED));
    assert_eq!(
        group_node_names(env).await?,
        only_room,
        "check-capacity adds no Node"
    );
    t.stop().await
}

/// A best-effort request the node group cannot serve (it would need 2 Nodes, the group may
/// have 1) is Provisioned=False/CapacityIsNotFound: no Node is added, the check stays Pending
/// with the autoscaler's message, and the controller's provisioning timeout still ends the
/// attempt (no retry left: Rejected).
#[tokio::test]
async fn capacity_not_found_keeps_the_check_pending_with_the_message_until_the_timeout()
-> Result<()> {
    let setup = CapacitySetup {
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
    };
    let t = World::on_capacity("cap-not-found", setup, |_| {}).await?;
    let env = &t.env;
    let wl = job(env, "big", 4).await?;
    let request = t.request(&wl, 1);
    let r = wait_request_where(env, &request, "Provisioned=False", |r| {
        request_condition(r, "Provisioned").is_some_and(|(s, _, _)| s == "False")
    })
    .await?;
    let (_, reason, message) = request_condition(&r, "Provisioned").context("Provisioned")?;
    assert_eq!(reason, "CapacityIsNotFound");
    env.wait_workload(&wl, "Pending with the autoscaler's message", |w| {
        w.admission_check(&t.p.check)
            .is_some_and(|e| e.state == CheckState::Pending && e.message.contains(&message))
    })
    .await?;
    assert!(
        env.group_nodes().await?.is_empty(),
        "never a partial scale-up"
    );

    let rejected = env
        .wait_workload(&wl, "Rejected after the timeout", |w| {
            w.admission_check(&t.p.check)
                .is_some_and(|e| e.state == CheckState::Rejected)
        })
        .await?;
    let entry = rejected.admission_check(&t.p.check).context("entry")?;
    assert!(
        entry.message.contains("not provisioned within"),
        "{}",
        entry.message
    );
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
    let setup = CapacitySetup {
        config: config(BEST_EFFORT),
        group: Some(GroupShape { cpu: "4", max: 5 }),
        ..CapacitySetup::default()
    };
    let t = World::on_capacity("cap-request-gc", setup, |s| {
        s.request_ttl = Duration::from_secs(3);
    })
    .await?;
    let env = &t.env;
    let wl = job(env, "long", 1).await?;
    env.wait_admitted_ready(&wl, &t.p.check).await?;
    let running = env.wait_job_pods_running("long", 1).await?;
    let request = t.request(&wl, 1);

    e2e::wait_gone(env.provisioning_requests(), &request).await?;
    // Our watch saw the deletion: it deletes the request's templates.
    env.wait_nothing_left().await?;
    // And a decision after it makes nothing: the Workload is changed, and reconciled.
    let before = reconciles(&t).await?;
    let touch =
        json!({"metadata": {"annotations": {"e2e.kueue-admission-checks.dev/touched": "1"}}});
    env.workloads()
        .patch(&wl, &PatchParams::default(), &Patch::Merge(&touch))
        .await?;
    e2e::eventually_async("a reconcile after the change", || async {
        Ok(reconciles(&t).await? > before)
    })
    .await?;
    assert!(env.our_requests().await?.is_empty());
    t.wait_counter("kueue_provisioning_requests_created_total", 1.0)
        .await?;
    let now: Workload = env.workloads().get(&wl).await?;
    assert!(now.condition_is_true(cond::ADMITTED), "{}", e2e::dump(&now));
    assert!(!now.condition_is_true(cond::EVICTED), "{}", e2e::dump(&now));
    let still = env.wait_job_pods_running("long", 1).await?;
    assert_eq!(
        still
            .iter()
            .map(|p| (p.name_any(), node_of(p).map(String::from)))
            .collect::<Vec<_>>(),
        running
            .iter()
            .map(|p| (p.name_any(), node_of(p).map(String::from)))
            .collect::<Vec<_>>(),
    );
    t.stop().await
}

/// The booking ends (10 minutes after Provisioned in cluster-autoscaler; 2 s here). Before
/// admission (another check holds it) that is a failed attempt: Retry, and the next attempt's
/// request makes the Job run, on Nodes added for it. After admission it is ignored: the pods
/// keep running and no request is made again.
#[tokio::test]
async fn an_expired_booking_retries_before_admission_and_is_ignored_after() -> Result<()> {
    let setup = CapacitySetup {
        config: json!({
            "provisioningClassName": BEST_EFFORT,
            "retryStrategy": {"backoffLimitCount": 2, "backoffBaseSeconds": 3, "backoffMaxSeconds": 3},
        }),
        group: Some(GroupShape { cpu: "4", max: 5 }),
        ..CapacitySetup::default()
    };
    let short_booking = |s: &mut autoscaler_simulator::Settings| {
        s.booking_duration = Duration::from_secs(2);
    };
    // The gate, made before the queue that names it, holds admission until the test opens it.
    let env = TestEnv::new("cap-booking").await?;
    let gate_controller = env.own_controller_name("gate");
    let gate = env
        .admission_check("gate", &gate_controller)
        .await?
        .name_any();
    env.set_admission_check_active(&gate, true).await?;
    let setup = CapacitySetup {
        extra_checks: vec![gate.clone()],
        ..setup
    };
    let t = World::on_capacity_in(env, setup, short_booking).await?;
    let wl = job(&t.env, "gated", 1).await?;

    // Attempt 1: provisioned, and its booking expires while the gate holds admission.
    let first = t.request(&wl, 1);
    wait_request_where(&t.env, &first, "BookingExpired=True", |r| {
        request_condition(r, "BookingExpired").is_some_and(|(s, _, _)| s == "True")
    })
    .await?;
    // From now on bookings last as long as cluster-autoscaler's, so the next attempt's holds
    // while the test opens the gate (that request comes after the 3 s retry delay).
    let World {
        env,
        p,
        controller,
        simulator,
    } = t;
    simulator.stop().await?;
    let group = env.node_group_of(GroupShape { cpu: "4", max: 5 })?;
    let simulator = env.start_autoscaler(vec![group], |_| {});
    let t = World {
        env: env.clone(),
        p,
        controller,
        simulator,
    };

    let second = t.request(&wl, 2);
    env.wait_request(&second, "Provisioned").await?;
    env.wait_workload(&wl, "our entry Ready on attempt 2", |w| {
        w.admission_check(&t.p.check)
            .is_some_and(|e| e.state == CheckState::Ready)
    })
    .await?;
    env.answer_check(&wl, &gate, CheckState::Ready, "the gate opens")
        .await?;
    env.wait_admitted(&wl).await?;
    let pods = env.wait_job_pods_running("gated", 1).await?;
    let nodes = group_node_names(&env).await?;
    assert_pods_on(&pods, &second, BEST_EFFORT, &env.node_group(), &nodes);
    t.wait_counter("kueue_provisioning_requests_booking_expired_total", 1.0)
        .await?;
    t.stop().await?;

    // After admission: a world of one check, bookings of 2 s.
    let setup = CapacitySetup {
        config: config(BEST_EFFORT),
        group: Some(GroupShape { cpu: "4", max: 5 }),
        ..CapacitySetup::default()
    };
    let t = World::on_capacity("cap-booking-after", setup, short_booking).await?;
    let env = &t.env;
    let wl = job(env, "runs", 1).await?;
    env.wait_admitted_ready(&wl, &t.p.check).await?;
    let running = env.wait_job_pods_running("runs", 1).await?;
    let request = t.request(&wl, 1);
    env.wait_request(&request, "BookingExpired").await?;
    // The controller has seen it, and made nothing of it.
    t.wait_counter("kueue_provisioning_requests_booking_expired_total", 1.0)
        .await?;
    t.wait_counter("kueue_provisioning_requests_created_total", 1.0)
        .await?;
    let now: Workload = env.workloads().get(&wl).await?;
    assert!(now.condition_is_true(cond::ADMITTED), "{}", e2e::dump(&now));
    let entry = now.admission_check(&t.p.check).context("entry")?;
    assert_eq!(entry.state, CheckState::Ready);
    let still = env.wait_job_pods_running("runs", 1).await?;
    assert_eq!(still[0].name_any(), running[0].name_any());
    t.stop().await
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

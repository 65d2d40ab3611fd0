//! Capacity made for one request, taken by other pods: kube-scheduler knows nothing of
//! ProvisioningRequests, so any pod that tolerates the Nodes and selects their labels may land
//! on the Nodes the autoscaler added for another Job's request, and cluster-autoscaler never
//! scales up for a pod that consumes a request. These tests show a Job stranded that way on the
//! real scheduler and the check's bound: once the request's booking runs out with pods of the
//! admitted Workload still unplaced, `Retry`, so that a new attempt asks for capacity again.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use e2e::capacity::{
    BEST_EFFORT, CONSUME_ANNOTATION, CapacitySetup, GROUP_LABEL, GroupShape, PROVIDER_TAINT,
    node_of, pod_annotation,
};
use e2e::provisioning::World;
use e2e::{SuspendedJob, TestEnv};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kueue_admission_sdk::api::{CheckState, workload_condition as cond};
use serde_json::json;

/// The controller's counter of admitted Workloads retried for unplaced pods.
const STRANDED: &str = "kueue_provisioning_requests_stranded_total";

/// What cluster-autoscaler writes when a booking runs out.
const RAN_OUT: &str = "CapacityReservationTimeExpired";

/// best-effort-atomic-scale-up with the AdmissionCheck `gate` beside ours (the test opens it),
/// retries at once, Nodes of 4 cpu.
fn gated(gate: &str) -> CapacitySetup {
    CapacitySetup {
        config: json!({
            "provisioningClassName": BEST_EFFORT,
            "retryStrategy": {"backoffLimitCount": 2, "backoffBaseSeconds": 1, "backoffMaxSeconds": 1},
        }),
        group: Some(GroupShape { cpu: "4", max: 3 }),
        extra_checks: vec![gate.to_string()],
        ..CapacitySetup::default()
    }
}

/// A pod that is no Job's and consumes no request, asking `cpu` on the node group: the kind
/// of pod the scheduler may place on capacity made for a request.
async fn other_pod(env: &TestEnv, name: &str, cpu: &str) -> Result<Pod> {
    let (key, value) = PROVIDER_TAINT;
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {GROUP_LABEL: env.node_group()},
            "tolerations": [{"key": key, "operator": "Equal", "value": value, "effect": "NoSchedule"}],
            "containers": [{"name": "c", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}],
        },
    }))?;
    let api: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns);
    api.create(&PostParams::default(), &pod)
        .await
        .context("creating the other pod")?;
    e2e::eventually_async("the other pod bound to a Node", || async {
        Ok(node_of(&api.get(name).await?).is_some())
    })
    .await?;
    Ok(api.get(name).await?)
}

/// Waits until the scheduler has tried the Job's only pod and found no room for it; returns it.
async fn wait_unschedulable(env: &TestEnv, job: &str) -> Result<Pod> {
    e2e::eventually_async("the Job's pod Unschedulable", || async {
        let pods = env.job_pods(job).await?;
        Ok(pods.iter().any(|p| {
            let conditions = p.status.as_ref().and_then(|s| s.conditions.as_ref());
            conditions.is_some_and(|cs| {
                cs.iter().any(|c| {
                    c.type_ == "PodScheduled" && c.reason.as_deref() == Some("Unschedulable")
                })
            })
        }))
    })
    .await?;
    env.job_pods(job).await?.pop().context("the Job's pod")
}

/// Our entry `Ready` on attempt `attempt`'s request (the gate still closed), then the gate
/// opened: the Workload is admitted.
async fn admitted_on(t: &World, wl: &str, gate: &str, attempt: u32) -> Result<()> {
    let request = t.request(wl, attempt);
    t.env.wait_request(&request, "Provisioned").await?;
    t.env
        .wait_workload(wl, "our entry Ready", |w| {
            w.admission_check(&t.p.check)
                .is_some_and(|e| e.state == CheckState::Ready)
        })
        .await?;
    t.env
        .answer_check(wl, gate, CheckState::Ready, "the gate opens")
        .await?;
    t.env.wait_admitted(wl).await?;
    Ok(())
}

/// The admitted Workload's pod found its Node taken: still `Pending` and still admitted, with
/// nothing more coming from the autoscaler (it never scales up for a consumer).
async fn stranded_on_its_own_capacity(t: &World, wl: &str, taken: &Pod) -> Result<Pod> {
    let pod = wait_unschedulable(&t.env, "large").await?;
    ensure!(pod_annotation(&pod, CONSUME_ANNOTATION) == Some(t.request(wl, 1).as_str()));
    let nodes = t.env.group_nodes().await?;
    ensure!(nodes.len() == 1, "one Node, the request's: {nodes:?}");
    ensure!(node_of(taken) == Some(nodes[0].name_any().as_str()));
    let now = t.env.workloads().get(wl).await?;
    ensure!(now.condition_is_true(cond::ADMITTED), "{}", e2e::dump(&now));
    Ok(pod)
}

/// The booking runs out (the test writes what cluster-autoscaler writes 10 minutes after
/// `Provisioned`): our entry says `Retry`, naming the pod, and the Workload is evicted.
async fn retried_when_the_booking_runs_out(t: &World, wl: &str, pod: &Pod) -> Result<()> {
    let request = t.request(wl, 1);
    t.env
        .add_request_condition(&request, "BookingExpired", RAN_OUT, "booking ran out")
        .await?;
    let evicted = t
        .env
        .wait_workload(wl, "evicted by our Retry", |w| {
            w.condition(cond::EVICTED)
                .is_some_and(|c| c.status == "True" && c.reason == "AdmissionCheck")
        })
        .await?;
    let message = evicted
        .condition(cond::EVICTED)
        .map(|c| c.message.clone())
        .unwrap_or_default();
    ensure!(message.contains(&pod.name_any()), "{message}");
    t.wait_counter(STRANDED, 1.0).await?;
    Ok(())
}

/// A Job's pod of 3 cpu whose Node (4 cpu, added for its request) another pod of 2 cpu took
/// while a second check held the Job back: once admitted, the pod cannot be placed, and the
/// autoscaler adds nothing for it. When the booking runs out our entry says `Retry` naming the
/// pod; Kueue evicts the Workload, attempt 2's request gets a Node of its own, and the pod runs
/// there.
#[tokio::test]
async fn a_pod_whose_room_another_pod_took_is_retried_when_the_booking_runs_out() -> Result<()> {
    let (env, gate) = e2e::capacity::env_with_gate("shared-stranded").await?;
    let t = World::on_capacity_in(env, gated(&gate), |_| {}).await?;
    let env = &t.env;
    let job = SuspendedJob::new("large", "lq", "3");
    let wl = env.submit(&job).await?;
    env.wait_request(&t.request(&wl, 1), "Provisioned").await?;
    let taken = other_pod(env, "other", "2").await?;
    admitted_on(&t, &wl, &gate, 1).await?;
    let pod = stranded_on_its_own_capacity(&t, &wl, &taken).await?;

    retried_when_the_booking_runs_out(&t, &wl, &pod).await?;
    admitted_on(&t, &wl, &gate, 2).await?;
    let running = env.wait_job_pods_running("large", 1).await?;
    ensure!(
        node_of(&running[0]) != node_of(&taken),
        "on a Node of its own"
    );
    ensure!(
        env.group_nodes().await?.len() == 2,
        "attempt 2 added a Node"
    );
    t.stop().await
}

/// Twenty Jobs at once, half of two pods of 3 cpu, half of three pods of 1 cpu, on Nodes of 4
/// cpu (bookings of 20 s): pods land on Nodes added for other Jobs' requests, and a Job whose
/// room was taken is retried when its booking runs out, until every pod of every Job runs.
#[tokio::test]
async fn twenty_jobs_of_mixed_sizes_all_run_though_pods_take_each_others_room() -> Result<()> {
    let t = World::on_capacity("shared-burst", burst_setup(), |s| {
        s.booking_duration = Duration::from_secs(20);
    })
    .await?;
    let jobs = submit_burst(&t.env).await?;
    for (name, pods) in &jobs {
        t.env.wait_job_pods_running(name, *pods).await?;
    }
    let shared = nodes_shared_by_jobs(&t.env, &jobs).await?;
    let retried = t.metric(&t.series(STRANDED)).await?;
    eprintln!("Nodes running pods of more than one Job: {shared}; Jobs retried: {retried}");
    t.stop().await
}

/// best-effort-atomic-scale-up, up to 5 retries 1 s apart, Nodes of 4 cpu (at most 60), 200
/// cpu of quota.
fn burst_setup() -> CapacitySetup {
    CapacitySetup {
        config: json!({
            "provisioningClassName": BEST_EFFORT,
            "retryStrategy": {"backoffLimitCount": 5, "backoffBaseSeconds": 1, "backoffMaxSeconds": 1},
        }),
        group: Some(GroupShape { cpu: "4", max: 60 }),
        quota: "200",
        ..CapacitySetup::default()
    }
}

/// Creates the twenty Jobs, large and small in turn, without waiting in between; returns each
/// Job's name and pod count.
async fn submit_burst(env: &TestEnv) -> Result<Vec<(String, i32)>> {
    let mut jobs = Vec::new();
    for i in 0..10 {
        for (kind, pods, cpu) in [("large", 2, "3"), ("small", 3, "1")] {
            let name = format!("{kind}-{i}");
            let job = SuspendedJob {
                parallelism: Some(pods),
                ..SuspendedJob::new(&name, "lq", cpu)
            };
            env.create_job(&job).await?;
            jobs.push((name, pods));
        }
    }
    Ok(jobs)
}

/// How many Nodes run pods of more than one of `jobs`.
async fn nodes_shared_by_jobs(env: &TestEnv, jobs: &[(String, i32)]) -> Result<usize> {
    let mut by_node: BTreeMap<String, BTreeSet<&str>> = BTreeMap::new();
    for (name, _) in jobs {
        for pod in env.job_pods(name).await? {
            let node = node_of(&pod).context("a running pod's Node")?.to_string();
            by_node.entry(node).or_default().insert(name);
        }
    }
    Ok(by_node.values().filter(|j| j.len() > 1).count())
}

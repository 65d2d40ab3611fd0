//! The capacity-buffer check against the real Karpenter v1.14.1 (kwok provider, the
//! `CapacityBuffer` gate on): Karpenter launches the NodeClaims, kwok makes their Nodes Ready and
//! runs the pods kube-scheduler binds there, Karpenter consolidates what is empty. Each test
//! has a NodePool of its own (see `e2e::karpenter`).

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, Result};
use e2e::capacity::node_of;
use e2e::karpenter::{CONSOLIDATION, ClaimRecorder};
use e2e::{SuspendedJob, TestEnv};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::ListParams;
use kueue_admission_sdk::api::{CheckState, Workload, workload_condition as cond};
use kueue_capacity_buffer_controller::api::DO_NOT_DISRUPT;
use kueue_capacity_buffer_controller::names::{
    CAPACITY_READY_ANNOTATION, MANAGED_BY_LABEL, PROTECTED_FOR_ANNOTATION,
    PROTECTED_UNTIL_ANNOTATION, WORKLOAD_UID_LABEL,
};
use serde_json::json;

fn uid(wl: &Workload) -> String {
    wl.uid().unwrap_or_default()
}

/// A Job whose capacity is not there: Karpenter launches Nodes for its buffer, the Workload is
/// admitted once they are Ready, its pods run on exactly those Nodes, no NodeClaim is made for
/// it after that (no capacity twice), none of its Nodes goes while its pods are pending, the
/// buffers are shrunk at `Ready` and deleted when the Job is done, and Karpenter then
/// consolidates the Nodes.
#[tokio::test(flavor = "multi_thread")]
async fn a_job_is_admitted_on_nodes_karpenter_launched_for_it_and_they_go_when_it_is_done()
-> Result<()> {
    let env = TestEnv::new("cb-happy").await?;
    let world = env
        .buffer_world("32", "10", json!({"protectionSeconds": 300}))
        .await?;
    let claims = ClaimRecorder::start(&env, &world.node_label).await?;
    let controller = env.start_buffer_controller(&world, |_| {})?;
    let name = env
        .submit(&SuspendedJob {
            parallelism: Some(3),
            ..SuspendedJob::new("train", "lq", "1")
        })
        .await?;
    let (admitted, _) = env.wait_admitted_ready(&name, &world.check).await?;
    let uid = uid(&admitted);

    // At Ready: every NodeClaim made for the Workload is Ready, its Nodes protected, its
    // buffers shrunk to zero and marked.
    let at_ready = env.node_claim_names(&world.node_label, &uid).await?;
    assert!(
        !at_ready.is_empty(),
        "Karpenter launched nothing for the Workload"
    );
    let nodes_at_ready = env.labelled_node_names(&world.node_label, &uid).await?;
    let buffers = env
        .capacity_buffers()
        .list(&Default::default())
        .await?
        .items;
    assert_eq!(buffers.len(), 1, "one buffer for the one podset");
    for b in &buffers {
        assert_eq!(
            b.spec.replicas,
            Some(0),
            "shrunk at Ready: {}",
            b.name_any()
        );
        assert!(b.annotations().contains_key(CAPACITY_READY_ANNOTATION));
    }
    let entry = e2e::entry_of(&admitted, &world.check)?;
    assert_eq!(entry.state, CheckState::Ready);
    assert!(
        entry.message.contains("capacity for 3 pods is ready"),
        "{}",
        entry.message
    );

    // The pods run on the Nodes made for the Workload, and on no other.
    let pods = env.job_pods_on("train", 3, &nodes_at_ready).await?;
    for pod in &pods {
        assert_eq!(pod.labels().get(WORKLOAD_UID_LABEL), Some(&uid));
    }
    // Still every Node of Ready there once the pods run: none went while they were pending.
    let now = env.labelled_node_names(&world.node_label, &uid).await?;
    assert!(
        nodes_at_ready.is_subset(&now),
        "a Node went before the pods ran: {nodes_at_ready:?} then {now:?}"
    );
    // With every pod bound, the protection ends (the controller's task).
    e2e::eventually_within(
        "the Nodes' protection to end once the pods are bound",
        e2e::DEFAULT_TIMEOUT,
        async || {
            let nodes = env.labelled_nodes(&world.node_label, &uid).await?;
            Ok(nodes.iter().all(|n| {
                !n.annotations().contains_key(DO_NOT_DISRUPT)
                    && !n.annotations().contains_key(PROTECTED_FOR_ANNOTATION)
            }))
        },
    )
    .await?;
    // A provisioning pass of Karpenter's after the pods are bound (a probe buffer of the test's
    // own triggers one): had the Workload's buffer still asked for its 3 pods, they would not fit
    // beside the real ones and Karpenter would launch a NodeClaim for them now.
    env.probe_buffer("probe", &world.node_label, "probe", 1)
        .await?;
    env.delete_probe("probe").await?;
    let ended = controller
        .metric("kueue_capacity_buffer_node_protections_ended_total{why=\"pods_bound\"}")
        .await?;
    assert_eq!(
        ended,
        Some(nodes_at_ready.len() as f64),
        "each Node's protection ended for its pods"
    );

    // Done: the buffers and templates go with the release, then Karpenter consolidates.
    env.complete_job("train", &name).await?;
    e2e::eventually_within(
        "the buffers to be deleted",
        e2e::DEFAULT_TIMEOUT,
        async || {
            Ok(env
                .capacity_buffers()
                .list(&ListParams::default().labels(MANAGED_BY_LABEL))
                .await?
                .items
                .is_empty())
        },
    )
    .await?;
    e2e::eventually_within(
        "Karpenter to consolidate the Workload's Nodes",
        CONSOLIDATION,
        async || Ok(env.node_claims(&world.node_label, &uid).await?.is_empty()),
    )
    .await?;
    // No NodeClaim was ever made for the Workload but those of Ready.
    assert_eq!(
        claims.seen_for(&uid),
        at_ready,
        "a NodeClaim made after Ready: capacity twice"
    );
    controller.stop().await
}

/// A Job larger than the NodePool's limits: Karpenter cannot place some of its pods; past the
/// grace the entry says so (the runtime's hold), then the quota goes back with `Retry`.
#[tokio::test(flavor = "multi_thread")]
async fn a_job_beyond_the_nodepools_limits_is_told_why_and_gives_its_quota_back() -> Result<()> {
    let env = TestEnv::new("cb-too-big").await?;
    let spec = json!({"unprovisionableGraceSeconds": 0, "retryStrategy": {"backoffLimitCount": 3, "backoffBaseSeconds": 60}});
    let world = env.buffer_world("4", "20", spec).await?;
    let controller = env.start_buffer_controller(&world, |c| {
        c.permanent_failure_hold = Duration::from_secs(5);
    })?;
    let name = env
        .submit(&SuspendedJob {
            parallelism: Some(8),
            ..SuspendedJob::new("huge", "lq", "1")
        })
        .await?;
    let held = env
        .wait_workload(
            &name,
            "the entry naming the pods Karpenter cannot place",
            |wl| {
                wl.admission_check(&world.check)
                    .is_some_and(|e| e.message.contains("cannot place"))
            },
        )
        .await?;
    let entry = e2e::entry_of(&held, &world.check)?;
    assert_eq!(entry.state, CheckState::Pending, "{entry:?}");
    assert!(entry.message.contains("limits"), "{}", entry.message);
    assert!(
        held.condition_is_true(cond::QUOTA_RESERVED),
        "held while the message shows"
    );
    // Then Retry (after the hold): Kueue evicts it and gives the quota back.
    env.wait_workload(&name, "quota released", |wl| {
        !wl.condition_is_true(cond::QUOTA_RESERVED)
    })
    .await?;
    let unprovisionable = controller
        .metric(&format!(
            "kueue_capacity_buffer_outcomes_total{{check=\"{}\",outcome=\"unprovisionable\"}}",
            world.check
        ))
        .await?;
    assert_eq!(unprovisionable, Some(1.0));
    controller.stop().await
}

/// A Workload admitted whose pods never come (created directly, no Job): its Nodes are empty,
/// and Karpenter would consolidate them; the check's `karpenter.sh/do-not-disrupt` keeps them
/// until `protectionSeconds` run out, then the task ends the protection and Karpenter
/// consolidates them. Shown against a control: an empty Node of the same NodePool that nothing
/// protects (its one pod deleted) is consolidated while ours, just as empty, stay. (Karpenter's
/// `DisruptionBlocked` event is no proof either way: it keeps one per Node for 2 minutes
/// whatever the message, so an earlier "node isn't initialized" hides the do-not-disrupt one.)
/// The longest test of the suite: named to sort among the first, which libtest starts first.
#[tokio::test(flavor = "multi_thread")]
async fn an_admitted_workloads_empty_nodes_are_kept_until_the_protection_runs_out() -> Result<()> {
    use k8s_openapi::api::core::v1::{Event, Pod};
    use kube::api::{Api, PostParams};
    let env = TestEnv::new("cb-protect").await?;
    let world = env
        .buffer_world("32", "10", json!({"protectionSeconds": 80}))
        .await?;
    let controller = env.start_buffer_controller(&world, |_| {})?;
    // The control's pod selects a value of the dedication label no Workload has: Karpenter
    // launches a Node of the same NodePool for it alone.
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns);
    let control_pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "control", "namespace": env.ns},
        "spec": {
            "nodeSelector": {world.node_label.as_str(): "control"},
            "containers": [{"name": "c", "image": "registry.k8s.io/pause", "resources": {"requests": {"cpu": "1"}}}],
        },
    }))?;
    pods.create(&PostParams::default(), &control_pod).await?;
    let created = env.podless_workload("bare", 2).await?;
    let (admitted, _) = env
        .wait_admitted_ready(&created.name_any(), &world.check)
        .await?;
    let uid = uid(&admitted);
    let nodes = env.labelled_nodes(&world.node_label, &uid).await?;
    assert!(!nodes.is_empty());
    let mut ends = Vec::new();
    for node in &nodes {
        let a = node.annotations();
        assert_eq!(
            a.get(DO_NOT_DISRUPT).map(String::as_str),
            Some("true"),
            "{a:?}"
        );
        let end: Timestamp = a
            .get(PROTECTED_UNTIL_ANNOTATION)
            .context("a protected Node says until when")?
            .parse()?;
        ends.push(end);
    }
    // The earliest end: the comparison with the control must hold for every protected Node.
    let until = ends.into_iter().min().context("a protected Node")?;
    let names: BTreeSet<String> = nodes.iter().map(|n| n.name_any()).collect();
    e2e::wait_for(pods.clone(), "control", "bound", |p: &Pod| {
        p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some()
    })
    .await?;
    let now = kube::api::DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    pods.delete("control", &now).await?;
    let emptied = std::time::Instant::now();
    e2e::eventually_within(
        "Karpenter to consolidate the emptied control Node",
        CONSOLIDATION,
        async || {
            Ok(env
                .node_claims(&world.node_label, "control")
                .await?
                .is_empty())
        },
    )
    .await?;
    println!(
        "control Node consolidated {} s after its pod was deleted; {} s of protection left",
        emptied.elapsed().as_secs(),
        until.duration_since(Timestamp::now()).as_secs()
    );
    anyhow::ensure!(
        Timestamp::now() < until,
        "the control Node outlived the protection (until {until}): Karpenter was too slow here \
         for the comparison to show anything; raise protectionSeconds"
    );
    let still = env.labelled_node_names(&world.node_label, &uid).await?;
    assert_eq!(still, names, "a protected Node went");
    // The protection runs out; then Karpenter consolidates them though the Workload is admitted.
    e2e::eventually_within(
        "the protection to run out and Karpenter to consolidate the Nodes",
        CONSOLIDATION + Duration::from_secs(80),
        async || Ok(env.node_claims(&world.node_label, &uid).await?.is_empty()),
    )
    .await?;
    let expired = controller
        .metric("kueue_capacity_buffer_node_protections_ended_total{why=\"expired\"}")
        .await?;
    assert_eq!(expired, Some(nodes.len() as f64));
    // What Karpenter said of them, for the log (see above why it is not asserted).
    let events: Api<Event> = Api::namespaced(env.client.clone(), "default");
    let list = events
        .list(&ListParams::default().fields("reason=DisruptionBlocked"))
        .await?;
    for e in list.items.iter().filter(|e| {
        e.involved_object
            .name
            .as_ref()
            .is_some_and(|n| names.contains(n))
    }) {
        println!(
            "DisruptionBlocked on {:?}: {:?}",
            e.involved_object.name, e.message
        );
    }
    controller.stop().await
}

/// The capacity-buffer check on one ClusterQueue beside the provisioning check on another (the
/// autoscaler simulator scaling its node group): each Job is admitted by its own check on its
/// own capacity, each controller makes only its own objects, and Karpenter launches nothing for
/// the provisioning check's Job.
#[tokio::test(flavor = "multi_thread")]
async fn beside_the_provisioning_check_each_job_gets_its_own_capacity() -> Result<()> {
    use e2e::capacity::{BEST_EFFORT, CapacitySetup, GROUP_LABEL, GroupShape};
    use e2e::provisioning::World;
    let env = TestEnv::new("cb-beside").await?;
    let setup = CapacitySetup {
        config: json!({"provisioningClassName": BEST_EFFORT, "retryStrategy": {"backoffLimitCount": 0}}),
        group: Some(GroupShape { cpu: "4", max: 2 }),
        ..CapacitySetup::default()
    };
    let provisioning = World::on_capacity_in(env.clone(), setup, |_| {}).await?;
    let world = env
        .buffer_world_on("32", "10", json!({}), ("cq-karpenter", "lq-karpenter"), &[])
        .await?;
    let claims = ClaimRecorder::start(&env, &world.node_label).await?;
    let controller = env.start_buffer_controller(&world, |_| {})?;
    let by_autoscaler = env
        .submit(&SuspendedJob {
            parallelism: Some(2),
            ..SuspendedJob::new("on-group", "lq", "1")
        })
        .await?;
    let by_karpenter = env
        .submit(&SuspendedJob {
            parallelism: Some(2),
            ..SuspendedJob::new("on-karpenter", "lq-karpenter", "1")
        })
        .await?;
    let (group_wl, _) = env
        .wait_admitted_ready(&by_autoscaler, &provisioning.p.check)
        .await?;
    let (karpenter_wl, _) = env.wait_admitted_ready(&by_karpenter, &world.check).await?;
    assert!(group_wl.admission_check(&world.check).is_none());
    assert!(
        karpenter_wl
            .admission_check(&provisioning.p.check)
            .is_none()
    );
    let group_pods = env.wait_job_pods_running("on-group", 2).await?;
    for pod in &group_pods {
        let node = node_of(pod).unwrap_or_default();
        let node = kube::Api::<k8s_openapi::api::core::v1::Node>::all(env.client.clone())
            .get(node)
            .await?;
        assert!(
            node.labels().contains_key(GROUP_LABEL),
            "{} not on the node group",
            e2e::describe_pod(pod)
        );
    }
    let karpenter_uid = uid(&karpenter_wl);
    let karpenter_nodes = env
        .labelled_node_names(&world.node_label, &karpenter_uid)
        .await?;
    env.job_pods_on("on-karpenter", 2, &karpenter_nodes).await?;
    // Each controller made only its own: no buffer for the other Job, no request for ours.
    let buffers = env
        .capacity_buffers()
        .list(&ListParams::default().labels(MANAGED_BY_LABEL))
        .await?;
    let group_uid = uid(&group_wl);
    assert!(
        buffers
            .items
            .iter()
            .all(|b| b.labels().get(WORKLOAD_UID_LABEL) != Some(&group_uid))
    );
    let requests = env
        .provisioning_requests()
        .list(&Default::default())
        .await?;
    assert!(
        requests
            .items
            .iter()
            .all(|r| !r.name_any().contains(&by_karpenter)),
        "a ProvisioningRequest for the Karpenter Job"
    );
    assert!(
        claims.seen_for(&group_uid).is_empty(),
        "Karpenter launched for the node group's Job"
    );
    let seen: BTreeSet<String> = claims.seen_for(&karpenter_uid);
    assert!(!seen.is_empty());
    controller.stop().await
}

/// Capacity that is not ready within `provisioningTimeoutSeconds` (1 s: Karpenter batches for a
/// second before it launches anything) fails the attempt: `Retry`, and past the config's
/// retry limit (0 here) `Rejected`, with a message naming the timeout; the attempt's buffer
/// goes with the release.
#[tokio::test(flavor = "multi_thread")]
async fn capacity_not_ready_within_the_timeout_fails_the_attempt() -> Result<()> {
    let env = TestEnv::new("cb-timeout").await?;
    let spec = json!({"provisioningTimeoutSeconds": 1, "retryStrategy": {"backoffLimitCount": 0}});
    let world = env.buffer_world("32", "10", spec).await?;
    let controller = env.start_buffer_controller(&world, |_| {})?;
    let name = env
        .submit(&SuspendedJob {
            parallelism: Some(2),
            ..SuspendedJob::new("slow", "lq", "1")
        })
        .await?;
    let rejected = env
        .wait_workload(&name, "the check's Rejected", |wl| {
            wl.admission_check(&world.check)
                .is_some_and(|e| e.state == CheckState::Rejected)
        })
        .await?;
    let entry = e2e::entry_of(&rejected, &world.check)?;
    assert!(
        entry.message.contains("not ready within 1 s"),
        "{}",
        entry.message
    );
    assert!(!rejected.condition_is_true(cond::ADMITTED));
    e2e::eventually_within(
        "the attempt's buffer deleted",
        e2e::DEFAULT_TIMEOUT,
        async || {
            let ours = ListParams::default().labels(MANAGED_BY_LABEL);
            Ok(env.capacity_buffers().list(&ours).await?.items.is_empty())
        },
    )
    .await?;
    let timed_out = controller
        .metric(&format!(
            "kueue_capacity_buffer_outcomes_total{{check=\"{}\",outcome=\"timed_out\"}}",
            world.check
        ))
        .await?;
    assert_eq!(timed_out, Some(1.0));
    controller.stop().await
}

/// Another check on the same ClusterQueue answers `Retry` while ours stands `Ready`: Kueue
/// evicts the Workload and gives its quota back; the release deletes the attempt's buffers and
/// ends the protection of its Nodes. At the next reservation the check asks again under the
/// same attempt's names (another check's `Retry` spends none of ours), Karpenter's capacity is
/// `Ready` again, and once the other check agrees the pods run on Nodes made for the Workload.
/// No NodeClaim is made for it while either `Ready` stands.
#[tokio::test(flavor = "multi_thread")]
async fn another_checks_retry_releases_the_capacity_and_the_next_reservation_asks_again()
-> Result<()> {
    // The gate is made before the ClusterQueue that names it after our check.
    let (env, gate) = e2e::capacity::env_with_gate("cb-evicted").await?;
    let world = env
        .buffer_world_on(
            "32",
            "10",
            json!({"protectionSeconds": 300}),
            ("cq", "lq"),
            &[&gate],
        )
        .await?;
    let claims = ClaimRecorder::start(&env, &world.node_label).await?;
    let controller = env.start_buffer_controller(&world, |_| {})?;
    let name = env
        .submit(&SuspendedJob {
            parallelism: Some(2),
            ..SuspendedJob::new("gated", "lq", "1")
        })
        .await?;
    let ours_ready = |w: &Workload| {
        w.condition_is_true(cond::QUOTA_RESERVED)
            && w.admission_check(&world.check)
                .is_some_and(|e| e.state == CheckState::Ready)
    };
    env.wait_check_pending_with_quota(&name, &gate).await?;
    let first = env
        .wait_workload(&name, "our entry Ready, the gate's Pending", ours_ready)
        .await?;
    let uid = uid(&first);
    let first_claims = claims.seen_for(&uid);
    assert!(!first_claims.is_empty(), "Karpenter launched nothing");
    let first_buffers = env
        .capacity_buffers()
        .list(&Default::default())
        .await?
        .items;
    assert_eq!(first_buffers.len(), 1, "one buffer for the one podset");
    let buffer = first_buffers[0].name_any();
    let first_buffer_uid = first_buffers[0].uid();
    let protected = env.labelled_nodes(&world.node_label, &uid).await?.len();
    assert!(protected > 0);

    // The gate says later: evicted, quota back, our release deletes the buffer and ends the
    // protection of its Nodes.
    let evictions = first.total_evictions();
    env.answer_check(&name, &gate, CheckState::Retry, "the gate says later")
        .await?;
    env.wait_workload(&name, "evicted by the gate", |w| {
        w.total_evictions() > evictions
    })
    .await?;
    let released = "kueue_capacity_buffer_node_protections_ended_total{why=\"released\"}";
    e2e::eventually_within(
        "the release to end the protection of every Node",
        e2e::DEFAULT_TIMEOUT,
        async || Ok(controller.metric(released).await? == Some(protected as f64)),
    )
    .await?;
    assert_eq!(
        claims.seen_for(&uid),
        first_claims,
        "a NodeClaim made while our first Ready stood"
    );

    // Quota again: the same attempt's buffer made anew, Ready again, then the gate agrees.
    let again = env
        .wait_workload(&name, "our entry Ready again after the eviction", |w| {
            ours_ready(w) && w.total_evictions() > evictions
        })
        .await?;
    let attempt = kueue_admission_sdk::attempts::attempt(&again, &world.check);
    assert_eq!(attempt, 1, "another check's Retry spent an attempt of ours");
    let buffers = env
        .capacity_buffers()
        .list(&Default::default())
        .await?
        .items;
    let names: Vec<String> = buffers.iter().map(|b| b.name_any()).collect();
    assert_eq!(names, [buffer], "the same attempt's name");
    assert_ne!(
        buffers[0].uid(),
        first_buffer_uid,
        "the release deleted the first buffer; this one is new"
    );
    let second_claims = claims.seen_for(&uid);
    env.answer_check(&name, &gate, CheckState::Ready, "the gate opens")
        .await?;
    let (admitted, _) = env.wait_admitted_ready(&name, &world.check).await?;
    assert_eq!(admitted.uid().as_deref(), Some(uid.as_str()));
    let nodes = env.labelled_node_names(&world.node_label, &uid).await?;
    env.job_pods_on("gated", 2, &nodes).await?;
    assert_eq!(
        claims.seen_for(&uid),
        second_claims,
        "a NodeClaim made while our second Ready stood"
    );
    println!(
        "NodeClaims for the Workload: {} at the first Ready, {} at the second ({:?} then {:?})",
        first_claims.len(),
        second_claims.len(),
        first_claims,
        second_claims
    );
    let created = controller
        .metric(&format!(
            "kueue_capacity_buffer_buffers_created_total{{check=\"{}\"}}",
            world.check
        ))
        .await?;
    assert_eq!(created, Some(2.0), "made once per reservation");
    controller.stop().await
}

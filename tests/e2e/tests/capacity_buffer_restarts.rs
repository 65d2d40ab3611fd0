//! The capacity-buffer check across restarts, against the real Karpenter: of the controller
//! (killed as a crash would) and of Karpenter itself, mid-way. What the check made and the
//! bounds it set (a Node's protection and its end) are read back from the cluster, not from a
//! process's memory. A suite of its own: it restarts the Karpenter other suites' tests share.

use anyhow::Result;
use e2e::karpenter::{CONSOLIDATION, ClaimRecorder, restart_karpenter};
use e2e::{SuspendedJob, TestEnv};
use kube::ResourceExt;
use kube::api::ListParams;
use kueue_capacity_buffer_controller::names::MANAGED_BY_LABEL;
use serde_json::json;

/// The controller is killed once it has made the buffer, Karpenter is restarted, and a new
/// controller takes over: it finds the buffer it made (no second one), the Workload is
/// admitted on the capacity launched for it, and no NodeClaim is made for it twice.
#[tokio::test(flavor = "multi_thread")]
async fn killing_the_controller_and_restarting_karpenter_mid_way_loses_nothing_and_makes_nothing_twice()
-> Result<()> {
    let env = TestEnv::new("cb-restarts").await?;
    let world = env
        .buffer_world("32", "10", json!({"protectionSeconds": 300}))
        .await?;
    let claims = ClaimRecorder::start(&env, &world.node_label).await?;
    let first = env.start_buffer_controller(&world, |_| {})?;
    let name = env
        .submit(&SuspendedJob {
            parallelism: Some(2),
            ..SuspendedJob::new("train", "lq", "1")
        })
        .await?;
    let ours = ListParams::default().labels(MANAGED_BY_LABEL);
    e2e::eventually_within(
        "the first controller's buffer",
        e2e::DEFAULT_TIMEOUT,
        async || Ok(!env.capacity_buffers().list(&ours).await?.items.is_empty()),
    )
    .await?;
    let made: Vec<(String, Option<String>)> = env
        .capacity_buffers()
        .list(&ours)
        .await?
        .items
        .iter()
        .map(|b| (b.name_any(), b.uid()))
        .collect();
    first.kill().await;
    restart_karpenter()?;
    let second = env.start_buffer_controller(&world, |_| {})?;
    let (admitted, entry) = env.wait_admitted_ready(&name, &world.check).await?;
    assert!(
        entry.message.contains("capacity for 2 pods is ready"),
        "{}",
        entry.message
    );
    let now: Vec<(String, Option<String>)> = env
        .capacity_buffers()
        .list(&ours)
        .await?
        .items
        .iter()
        .map(|b| (b.name_any(), b.uid()))
        .collect();
    assert_eq!(
        now, made,
        "the second controller used the buffer the first made"
    );
    let uid = admitted.uid().unwrap_or_default();
    let at_ready = env.node_claim_names(&world.node_label, &uid).await?;
    let nodes = env.labelled_node_names(&world.node_label, &uid).await?;
    env.job_pods_on("train", 2, &nodes).await?;
    // A pass of Karpenter's after the pods bound (a probe buffer triggers one) makes nothing more.
    env.probe_buffer("probe", &world.node_label, "probe", 1)
        .await?;
    env.delete_probe("probe").await?;
    assert_eq!(
        claims.seen_for(&uid),
        at_ready,
        "a NodeClaim made for the Workload after Ready"
    );
    env.complete_job("train", &name).await?;
    e2e::eventually_within(
        "Karpenter to consolidate the Workload's Nodes",
        CONSOLIDATION,
        async || Ok(env.node_claims(&world.node_label, &uid).await?.is_empty()),
    )
    .await?;
    second.stop().await
}

/// A protection set by a controller that is then killed ends on time under the next one: its
/// end is written on the Node, not kept in memory.
#[tokio::test(flavor = "multi_thread")]
async fn a_nodes_protection_ends_on_time_after_the_controller_that_set_it_is_killed() -> Result<()>
{
    let env = TestEnv::new("cb-protect-restart").await?;
    let world = env
        .buffer_world("32", "10", json!({"protectionSeconds": 30}))
        .await?;
    let first = env.start_buffer_controller(&world, |_| {})?;
    let created = env.podless_workload("bare", 1).await?;
    let (admitted, _) = env
        .wait_admitted_ready(&created.name_any(), &world.check)
        .await?;
    let uid = admitted.uid().unwrap_or_default();
    let nodes = env.labelled_nodes(&world.node_label, &uid).await?;
    assert!(!nodes.is_empty());
    first.kill().await;
    let second = env.start_buffer_controller(&world, |_| {})?;
    e2e::eventually_within(
        "the protection to end and Karpenter to consolidate the Nodes",
        CONSOLIDATION,
        async || Ok(env.node_claims(&world.node_label, &uid).await?.is_empty()),
    )
    .await?;
    let expired = second
        .metric("kueue_capacity_buffer_node_protections_ended_total{why=\"expired\"}")
        .await?;
    assert_eq!(
        expired,
        Some(nodes.len() as f64),
        "the second controller ended it"
    );
    second.stop().await
}

//! What the capacity-buffer check relies on in Karpenter v1.14.1 (kwok provider, the
//! `CapacityBuffer` gate on), pinned against the real thing: if an upgrade changes one of
//! these, this suite says which. The check's own behaviour is in `capacity_buffer.rs`.
//!
//! - A NodePool requirement `{key, operator: Exists}` lets a pod's node selector `key=value`
//!   be met: Karpenter launches a Node labelled with that value (the dedication of Nodes to one
//!   Workload).
//! - A buffer's virtual pods and real pending pods are simulated as separate pods: a real pod
//!   that kube-scheduler binds to the buffer's Node takes its room, and Karpenter's next pass
//!   launches more for the buffer (why the check shrinks the buffer before any pod exists).
//! - A Node annotated `karpenter.sh/do-not-disrupt` is not consolidated while empty: pinned in
//!   `capacity_buffer.rs` against an unprotected control Node of the same NodePool
//!   (`an_admitted_workloads_empty_nodes_are_kept_until_the_protection_runs_out`). Karpenter's
//!   `DisruptionBlocked` event cannot pin it: one per Node is kept for 2 minutes whatever its
//!   message, so an earlier one ("node isn't initialized") hides the do-not-disrupt one.

use std::collections::BTreeSet;

use anyhow::Result;
use e2e::TestEnv;
use e2e::karpenter::ensure_karpenter;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use serde_json::json;

/// The names of the `Ready` NodeClaims carrying `label=value`, once there is at least one and
/// all are Ready.
async fn ready_claims(env: &TestEnv, label: &str, value: &str) -> Result<BTreeSet<String>> {
    e2e::eventually_within(
        "Karpenter's NodeClaims Ready",
        e2e::DEFAULT_TIMEOUT,
        async || {
            let claims = env.node_claims(label, value).await?;
            Ok(!claims.is_empty()
                && claims.iter().all(|c| {
                    c.status.as_ref().is_some_and(|s| {
                        s.conditions
                            .iter()
                            .any(|k| k.type_ == "Ready" && k.status == "True")
                    })
                }))
        },
    )
    .await?;
    Ok(env
        .node_claims(label, value)
        .await?
        .iter()
        .map(|c| c.name_any())
        .collect())
}

#[tokio::test(flavor = "multi_thread")]
async fn an_exists_requirement_gives_the_nodes_the_value_the_pods_select() -> Result<()> {
    let env = TestEnv::new("karpenter-exists").await?;
    ensure_karpenter(&env).await?;
    let label = env.buffer_node_label();
    env.node_pool("pool", &label, "16").await?;
    env.probe_buffer("b", &label, "wanted-value", 2).await?;
    let claims = ready_claims(&env, &label, "wanted-value").await?;
    let nodes = env.labelled_nodes(&label, "wanted-value").await?;
    assert_eq!(
        nodes.len(),
        claims.len(),
        "each NodeClaim's Node carries the value"
    );
    env.delete_probe("b").await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_real_pod_bound_to_a_buffers_node_makes_karpenter_launch_again_for_the_buffer()
-> Result<()> {
    let env = TestEnv::new("karpenter-twice").await?;
    ensure_karpenter(&env).await?;
    let label = env.buffer_node_label();
    env.node_pool("pool", &label, "32").await?;
    // 3 cpu: one such pod per Node of the smallest instance type that takes it.
    let template = json!({
        "apiVersion": "v1", "kind": "PodTemplate",
        "metadata": {"name": "big", "namespace": env.ns},
        "template": {"spec": {
            "nodeSelector": {label.as_str(): "v"},
            "containers": [{"name": "c", "image": "registry.k8s.io/pause", "resources": {"requests": {"cpu": "3"}}}],
        }},
    });
    e2e::chart::apply(&env.client, &template, "e2e").await?;
    let buffer = json!({
        "apiVersion": "autoscaling.x-k8s.io/v1beta1", "kind": "CapacityBuffer",
        "metadata": {"name": "big", "namespace": env.ns},
        "spec": {"podTemplateRef": {"name": "big"}, "replicas": 1},
    });
    e2e::chart::apply(&env.client, &buffer, "e2e").await?;
    let first = ready_claims(&env, &label, "v").await?;
    assert_eq!(first.len(), 1, "{first:?}");
    // A real pod of the same shape: kube-scheduler, which knows nothing of virtual pods, binds
    // it to the buffer's Node.
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "real", "namespace": env.ns},
        "spec": {
            "nodeSelector": {label.as_str(): "v"},
            "containers": [{"name": "c", "image": "registry.k8s.io/pause", "resources": {"requests": {"cpu": "3"}}}],
        },
    }))?;
    Api::<Pod>::namespaced(env.client.clone(), &env.ns)
        .create(&PostParams::default(), &pod)
        .await?;
    let bound = e2e::wait_for(
        Api::<Pod>::namespaced(env.client.clone(), &env.ns),
        "real",
        "bound",
        |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some(),
    )
    .await?;
    let node = bound.spec.and_then(|s| s.node_name).unwrap_or_default();
    let nodes: BTreeSet<String> = env
        .labelled_nodes(&label, "v")
        .await?
        .iter()
        .map(|n| n.name_any())
        .collect();
    assert!(nodes.contains(&node), "bound to the buffer's Node");
    // Karpenter's next pass (another buffer triggers one) finds the virtual pod without room and
    // launches a second NodeClaim for it: buffer and real pod get capacity each.
    env.probe_buffer("trigger", &label, "other", 1).await?;
    e2e::eventually_within(
        "a second NodeClaim for the buffer",
        e2e::DEFAULT_TIMEOUT,
        async || Ok(env.node_claims(&label, "v").await?.len() == 2),
    )
    .await?;
    for name in ["big", "trigger"] {
        env.delete_probe(name).await?;
    }
    Api::<Pod>::namespaced(env.client.clone(), &env.ns)
        .delete("real", &Default::default())
        .await?;
    Ok(())
}

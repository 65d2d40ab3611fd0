//! podSetUpdates Kueue refuses, from the provisioning check, against the real Kueue with the
//! autoscaler simulator playing cluster-autoscaler (issue 26, item 2).
//!
//! As it was seen: a ProvisioningRequestConfig whose `podSetUpdates.nodeSelector` key has a
//! 70-character name part (the CRD accepts it) made Kueue's webhook refuse every `Ready` with
//! 403, which the SDK took for RBAC and retried until the booking expired. Now the config is
//! refused with the reason (the check is inactive, nothing is reserved), and a class detail the
//! autoscaler reports that is no label value is a permanent failure with the key named.

use std::time::Duration;

use anyhow::Result;
use autoscaler_simulator::{CLASS_DETAILS_ANNOTATION, SCRIPT_ANNOTATION};
use e2e::TestEnv;
use e2e::provisioning::World;
use kube::ResourceExt;
use kube::api::Api;
use kueue_admission_sdk::RuntimeConfig;
use kueue_admission_sdk::api::{
    AdmissionCheck, CheckState, ClusterQueue, ProvisioningRequestConfig, workload_condition as cond,
};
use serde_json::{Value, json};

/// The node selector key of the issue: a 70-character name part.
fn long_key() -> String {
    format!("example.com/{}", "z".repeat(70))
}

/// A config spec whose podSetUpdates set node selector `key` from the class detail `zone`.
fn zone_selector(key: &str) -> Value {
    json!({"podSetUpdates": {"nodeSelector": [
        {"key": key, "valueFromProvisioningClassDetail": "zone"},
    ]}})
}

/// Submits Job `job`, provisioned by the simulator with these class details
/// (`key=value,...`); returns its Workload's name.
async fn job_with_class_details(env: &TestEnv, details: &str) -> Result<String> {
    let job = env
        .job_with_pod_annotations(
            "job",
            "lq",
            "1",
            1,
            &[
                (SCRIPT_ANNOTATION, "provision"),
                (CLASS_DETAILS_ANNOTATION, details),
            ],
        )
        .await?;
    Ok(env.workload_for_job(&job).await?.name_any())
}

/// Waits until Kueue refuses the Workload quota because ClusterQueue `cq` is inactive.
async fn refused_quota_while_inactive(env: &TestEnv, wl: &str, cq: &str) -> Result<()> {
    env.wait_workload(wl, "no quota: the ClusterQueue is inactive", |w| {
        w.condition(cond::QUOTA_RESERVED).is_some_and(|c| {
            c.status == "False"
                && c.message
                    .contains(&format!("ClusterQueue {cq} is inactive"))
        })
    })
    .await?;
    Ok(())
}

/// Replaces the key of the config's first podSetUpdates node selector, as an operator fixing
/// it would.
async fn set_node_selector_key(env: &TestEnv, config: &str, key: &str) -> Result<()> {
    let configs = Api::<ProvisioningRequestConfig>::all(env.client.clone());
    let mut current = configs.get(config).await?;
    if let Some(updates) = current.spec.pod_set_updates.as_mut() {
        updates.node_selector[0].key = key.into();
    }
    configs
        .replace(config, &Default::default(), &current)
        .await?;
    Ok(())
}

/// Waits until the Workload holds quota with `check`'s entry `Pending` on a permanent failure
/// (the hold before `Retry`); returns the entry's message.
async fn held_on_permanent_failure(env: &TestEnv, wl: &str, check: &str) -> Result<String> {
    let held = env
        .wait_workload(wl, "the refused Ready on the entry", |w| {
            w.condition_is_true(cond::QUOTA_RESERVED)
                && w.admission_check(check).is_some_and(|e| {
                    e.state == CheckState::Pending && e.message.starts_with("Permanent failure")
                })
        })
        .await?;
    Ok(held
        .admission_check(check)
        .map(|e| e.message.clone())
        .unwrap_or_default())
}

/// Controller settings keeping a Workload's quota only 3 s after a failure retrying cannot fix.
fn hold_3s(config: &mut RuntimeConfig) {
    config.permanent_failure_hold = Duration::from_secs(3);
}

#[tokio::test]
async fn a_node_selector_key_kueue_refuses_makes_the_check_inactive_until_fixed() -> Result<()> {
    // The CRD takes the key.
    let t = World::new("prov-bad-key", zone_selector(&long_key())).await?;
    let (env, p) = (&t.env, &t.p);
    let inactive = env
        .wait_active::<AdmissionCheck>(&p.check, "False", Some("InvalidParameters"))
        .await?;
    assert!(
        inactive.message.contains(&format!(
            "spec.podSetUpdates.nodeSelector[0].key {:?} is not a valid label name",
            long_key()
        )) && inactive.message.contains("70 characters, more than 63"),
        "{}",
        inactive.message
    );
    env.wait_active::<ClusterQueue>(&p.cluster_queue, "False", Some("AdmissionCheckInactive"))
        .await?;
    let wl = job_with_class_details(env, "zone=zone-b").await?;
    refused_quota_while_inactive(env, &wl, &p.cluster_queue).await?;

    // Fixed: the check answers, and the Job gets the node selector.
    set_node_selector_key(env, &p.config, "example.com/zone").await?;
    let (_, entry) = env.wait_admitted_ready(&wl, &p.check).await?;
    assert_eq!(
        entry.pod_set_updates[0]
            .node_selector
            .get("example.com/zone"),
        Some(&"zone-b".to_string()),
        "{entry:?}"
    );
    t.stop().await
}

#[tokio::test]
async fn a_class_detail_that_is_no_label_value_is_named_on_the_entry_then_rejected() -> Result<()> {
    let mut spec = zone_selector("topology.kubernetes.io/zone");
    // No retry: after the hold, the Retry that gives the quota back is past the limit.
    spec["retryStrategy"] = json!({"backoffLimitCount": 0, "backoffBaseSeconds": 0});
    let t = World::tuned("prov-bad-detail", spec, hold_3s).await?;
    let (env, p) = (&t.env, &t.p);
    let mut recorder = env.record_workloads().await?;
    // A '/' has no place in a label value.
    let wl = job_with_class_details(env, "zone=eu/1").await?;
    let message = held_on_permanent_failure(env, &wl, &p.check).await?;
    assert!(
        message.starts_with(&format!(
            "Permanent failure: the Ready answer of check {} cannot be written: the podSetUpdate \
             for podset \"main\": nodeSelector \"topology.kubernetes.io/zone\": the value has '/'",
            p.check
        )) && message.contains(
            "the provisioningClassDetails value for node selector \
             \"topology.kubernetes.io/zone\" is not a valid label value"
        ),
        "{message}"
    );
    // Held, then Retry past the limit: Rejected, and Kueue deactivates the Workload.
    let history = recorder
        .until(&wl, "deactivated", |w| !w.is_active())
        .await?;
    assert!(
        history.iter().any(|w| w
            .admission_check(&p.check)
            .is_some_and(|e| e.state == CheckState::Rejected)),
        "never Rejected"
    );
    t.env.wait_nothing_left().await?;
    t.stop().await
}

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
use e2e::provisioning::World;
use kube::ResourceExt;
use kube::api::Api;
use kueue_admission_sdk::api::{
    AdmissionCheck, CheckState, ClusterQueue, ProvisioningRequestConfig, workload_condition as cond,
};
use serde_json::json;

/// The node selector key of the issue: a 70-character name part.
fn long_key() -> String {
    format!("example.com/{}", "z".repeat(70))
}

#[tokio::test]
async fn a_node_selector_key_kueue_refuses_makes_the_check_inactive_until_fixed() -> Result<()> {
    let selector = |key: String| {
        json!({"podSetUpdates": {"nodeSelector": [
            {"key": key, "valueFromProvisioningClassDetail": "zone"},
        ]}})
    };
    // The CRD takes the key.
    let t = World::new("prov-bad-key", selector(long_key())).await?;
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
    let job = env
        .job_with_pod_annotations(
            "job",
            "lq",
            "1",
            1,
            &[
                (SCRIPT_ANNOTATION, "provision"),
                (CLASS_DETAILS_ANNOTATION, "zone=zone-b"),
            ],
        )
        .await?;
    let wl = env.workload_for_job(&job).await?.name_any();
    let cq = &p.cluster_queue;
    env.wait_workload(&wl, "no quota: the ClusterQueue is inactive", |w| {
        w.condition(cond::QUOTA_RESERVED).is_some_and(|c| {
            c.status == "False"
                && c.message
                    .contains(&format!("ClusterQueue {cq} is inactive"))
        })
    })
    .await?;

    // Fixed: the check answers, and the Job gets the node selector.
    let mut config = Api::<ProvisioningRequestConfig>::all(env.client.clone())
        .get(&p.config)
        .await?;
    if let Some(updates) = config.spec.pod_set_updates.as_mut() {
        updates.node_selector[0].key = "example.com/zone".into();
    }
    Api::<ProvisioningRequestConfig>::all(env.client.clone())
        .replace(&p.config, &Default::default(), &config)
        .await?;
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
    let spec = json!({
        "podSetUpdates": {"nodeSelector": [
            {"key": "topology.kubernetes.io/zone", "valueFromProvisioningClassDetail": "zone"},
        ]},
        // No retry: after the hold, the Retry that gives the quota back is past the limit.
        "retryStrategy": {"backoffLimitCount": 0, "backoffBaseSeconds": 0},
    });
    let t = World::tuned("prov-bad-detail", spec, |c| {
        c.permanent_failure_hold = Duration::from_secs(3);
    })
    .await?;
    let (env, p) = (&t.env, &t.p);
    let mut recorder = env.record_workloads().await?;
    let job = env
        .job_with_pod_annotations(
            "job",
            "lq",
            "1",
            1,
            &[
                (SCRIPT_ANNOTATION, "provision"),
                // A '/' has no place in a label value.
                (CLASS_DETAILS_ANNOTATION, "zone=eu/1"),
            ],
        )
        .await?;
    let wl = env.workload_for_job(&job).await?.name_any();
    let held = env
        .wait_workload(&wl, "the refused Ready on the entry", |w| {
            w.condition_is_true(cond::QUOTA_RESERVED)
                && w.admission_check(&p.check).is_some_and(|e| {
                    e.state == CheckState::Pending && e.message.starts_with("Permanent failure")
                })
        })
        .await?;
    let message = held
        .admission_check(&p.check)
        .map(|e| e.message.clone())
        .unwrap_or_default();
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

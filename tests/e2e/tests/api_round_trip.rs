//! The SDK's API types against the real apiserver with Kueue's and cluster-autoscaler's CRDs:
//! objects written with every modelled field read back equal, and defaults are what the SDK
//! documents.

use std::collections::BTreeMap;

use anyhow::{Result, ensure};
use e2e::TestEnv;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kueue_admission_sdk::api::{
    PodTemplateReference, ProvisioningRequest, ProvisioningRequestConfig,
    ProvisioningRequestConfigSpec, ProvisioningRequestPodSet, ProvisioningRequestPodSetUpdates,
    ProvisioningRequestPodSetUpdatesNodeSelector, ProvisioningRequestRetryStrategy,
    ProvisioningRequestSpec, ProvisioningRequestStatus, provisioning_condition,
};

/// A ProvisioningRequestConfig with every field reads back equal; one with only its class gets
/// Kueue's default retry strategy and nothing else.
#[tokio::test]
async fn provisioning_request_config_round_trips_and_defaults_its_retry_strategy() -> Result<()> {
    let env = TestEnv::new("api-prc").await?;
    let full = every_config_field();
    let back = created_config(&env, "full", full.clone()).await?;
    ensure!(back.spec == full, "{:#?}\n!=\n{full:#?}", back.spec);

    // Absent fields: Kueue's CRD fills in the retry strategy, nothing else.
    let sparse = ProvisioningRequestConfigSpec {
        provisioning_class_name: "check-capacity.autoscaling.x-k8s.io".into(),
        ..Default::default()
    };
    let back = created_config(&env, "sparse", sparse).await?;
    ensure!(
        back.spec.retry_strategy
            == Some(ProvisioningRequestRetryStrategy {
                backoff_limit_count: Some(3),
                backoff_base_seconds: Some(60),
                backoff_max_seconds: Some(1800),
            }),
        "{:?}",
        back.spec.retry_strategy
    );
    ensure!(back.spec.pod_set_merge_policy.is_none() && back.spec.pod_set_updates.is_none());
    Ok(())
}

/// A ProvisioningRequest and the status an autoscaler applies to it read back equal.
#[tokio::test]
async fn provisioning_request_round_trips_with_status() -> Result<()> {
    let env = TestEnv::new("api-pr").await?;
    let api = env.provisioning_requests();
    let spec = ProvisioningRequestSpec {
        pod_sets: vec![ProvisioningRequestPodSet {
            pod_template_ref: PodTemplateReference {
                name: "ppt-main".into(),
            },
            count: 3,
        }],
        provisioning_class_name: "check-capacity.autoscaling.x-k8s.io".into(),
        parameters: BTreeMap::from([("a".into(), "b".into())]),
    };
    api.create(
        &PostParams::default(),
        &ProvisioningRequest::new("pr", spec.clone()),
    )
    .await?;
    let status = provisioned_on_pool_a()?;
    apply_status_as_the_autoscaler(&api, "pr", &status).await?;
    let back = api.get("pr").await?;
    ensure!(back.spec == spec, "{:#?}", back.spec);
    ensure!(back.status == Some(status), "{:#?}", back.status);
    Ok(())
}

/// A ProvisioningRequestConfig spec with every modelled field set.
fn every_config_field() -> ProvisioningRequestConfigSpec {
    ProvisioningRequestConfigSpec {
        provisioning_class_name: "queued-provisioning.gke.io".into(),
        parameters: BTreeMap::from([("ValidUntilSeconds".into(), "600".into())]),
        managed_resources: vec!["nvidia.com/gpu".into()],
        retry_strategy: Some(ProvisioningRequestRetryStrategy {
            backoff_limit_count: Some(5),
            backoff_base_seconds: Some(10),
            backoff_max_seconds: Some(300),
        }),
        pod_set_updates: Some(ProvisioningRequestPodSetUpdates {
            node_selector: vec![ProvisioningRequestPodSetUpdatesNodeSelector {
                key: "cloud.google.com/gke-nodepool".into(),
                value_from_provisioning_class_detail: "NodePoolName".into(),
            }],
        }),
        pod_set_merge_policy: Some("IdenticalWorkloadSchedulingRequirements".into()),
    }
}

/// Creates the ProvisioningRequestConfig `name` (made cluster-unique) with `spec` and reads it
/// back as the apiserver stored it.
async fn created_config(
    env: &TestEnv,
    name: &str,
    spec: ProvisioningRequestConfigSpec,
) -> Result<ProvisioningRequestConfig> {
    let api: Api<ProvisioningRequestConfig> = Api::all(env.client.clone());
    let name = env.cluster_name(name);
    api.create(
        &PostParams::default(),
        &ProvisioningRequestConfig::new(&name, spec),
    )
    .await?;
    Ok(api.get(&name).await?)
}

/// A status an autoscaler writes once capacity is ready: `Provisioned=True` (whole seconds, as
/// the apiserver keeps them) and the node pool it made, `pool-a`.
fn provisioned_on_pool_a() -> Result<ProvisioningRequestStatus> {
    let now = Timestamp::from_second(Timestamp::now().as_second())?;
    Ok(ProvisioningRequestStatus {
        conditions: vec![Condition {
            type_: provisioning_condition::PROVISIONED.into(),
            status: "True".into(),
            reason: "Provisioned".into(),
            message: "capacity is ready".into(),
            last_transition_time: Time(now),
            observed_generation: Some(1),
        }],
        provisioning_class_details: BTreeMap::from([("NodePoolName".into(), "pool-a".into())]),
    })
}

/// Applies `status` to the ProvisioningRequest `name` as the autoscaler would (its own field
/// manager, on the status subresource).
async fn apply_status_as_the_autoscaler(
    api: &Api<ProvisioningRequest>,
    name: &str,
    status: &ProvisioningRequestStatus,
) -> Result<()> {
    api.patch_status(
        name,
        &PatchParams::apply("e2e-autoscaler").force(),
        &Patch::Apply(serde_json::json!({
            "apiVersion": "autoscaling.x-k8s.io/v1",
            "kind": "ProvisioningRequest",
            "status": status,
        })),
    )
    .await?;
    Ok(())
}

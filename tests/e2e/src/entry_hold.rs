//! Holding back Kueue's write that adds a check's entry, so a test can work in the window
//! between the quota reservation and the entry, which under load lasts seconds and on an idle
//! control plane milliseconds. A ValidatingAdmissionPolicy of the API server (no webhook of
//! ours) refuses every status write to this test's Workloads that would carry the entry; Kueue
//! tries again with backoff, and adds the entry once the hold is lifted.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kueue_admission_sdk::api::Workload;
use serde_json::json;

use crate::TestEnv;

/// What the policy's refusal says; a refusal with other words is not the hold's.
const HELD: &str = "held back by an end-to-end test";

/// Creates a ValidatingAdmissionPolicy `name` that refuses every update of Workloads'
/// `resource` (`workloads` or `workloads/status`) for which the CEL `expression` is false,
/// saying `message`, with `reason` (`Forbidden`: 403, `Invalid`: 422; the API server's default
/// when `None`), and its binding to `env`'s namespace only.
pub async fn deny_workload_updates(
    env: &TestEnv,
    name: &str,
    resource: &str,
    expression: &str,
    message: &str,
    reason: Option<&str>,
) -> Result<()> {
    let mut validation = json!({"expression": expression, "message": message});
    if let Some(reason) = reason {
        validation["reason"] = json!(reason);
    }
    let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": ["kueue.x-k8s.io"],
                "apiVersions": ["*"],
                "operations": ["UPDATE"],
                "resources": [resource],
            }]},
            "validations": [validation],
        },
    }))?;
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {
                "kubernetes.io/metadata.name": env.ns,
            }}},
        },
    }))?;
    let pp = PostParams::default();
    Api::<ValidatingAdmissionPolicy>::all(env.client.clone())
        .create(&pp, &policy)
        .await
        .with_context(|| format!("creating the ValidatingAdmissionPolicy {name}"))?;
    Api::<ValidatingAdmissionPolicyBinding>::all(env.client.clone())
        .create(&pp, &binding)
        .await
        .with_context(|| format!("creating the binding of {name}"))?;
    Ok(())
}

/// The policy and its binding, deleted by [`EntryHold::lift`].
pub struct EntryHold {
    client: kube::Client,
    name: String,
}

impl std::fmt::Debug for EntryHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EntryHold")
            .field("name", &self.name)
            .finish()
    }
}

impl EntryHold {
    /// Holds back the entry of `check` on every Workload of `env`'s namespace, and returns once
    /// the API server enforces it (a dry-run write of the entry is refused).
    pub async fn new(env: &TestEnv, check: &str) -> Result<Self> {
        let name = format!("e2e-hold-entry-{}", env.ns);
        let expression = format!(
            "!has(object.status) || !has(object.status.admissionChecks) || \
             !object.status.admissionChecks.exists(c, c.name == '{check}')"
        );
        deny_workload_updates(env, &name, "workloads/status", &expression, HELD, None).await?;
        let hold = Self {
            client: env.client.clone(),
            name,
        };
        hold.wait_enforced(env, check).await?;
        Ok(hold)
    }

    /// Deletes the policy: Kueue's next try adds the entry.
    pub async fn lift(self) -> Result<()> {
        let dp = DeleteParams::default();
        Api::<ValidatingAdmissionPolicyBinding>::all(self.client.clone())
            .delete(&self.name, &dp)
            .await?;
        Api::<ValidatingAdmissionPolicy>::all(self.client.clone())
            .delete(&self.name, &dp)
            .await?;
        Ok(())
    }

    /// Waits until a dry-run status write carrying the entry, on a Workload no queue feeds, is
    /// refused by the policy (the API server compiles and binds it a moment after it exists).
    async fn wait_enforced(&self, env: &TestEnv, check: &str) -> Result<()> {
        // No LocalQueue of that name: Kueue never reserves quota for it.
        let probe: Workload = serde_json::from_value(json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "metadata": {"name": "hold-probe", "namespace": env.ns},
            "spec": {
                "queueName": "no-such-queue",
                "podSets": [{
                    "name": "main",
                    "count": 1,
                    "template": crate::pod_template(json!({}), "1"),
                }],
            },
        }))?;
        let api: Api<Workload> = Api::namespaced(env.client.clone(), &env.ns);
        let probe = api
            .create(&PostParams::default(), &probe)
            .await
            .context("creating the probe Workload")?;
        let status = json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "status": {"admissionChecks": [{
                "name": check,
                "state": "Pending",
                "message": "",
                "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string(),
            }]},
        });
        let pp = PatchParams::apply("e2e-hold-probe").dry_run();
        let name = kube::ResourceExt::name_any(&probe);
        for _ in 0..100 {
            match api
                .patch_status(&name, &pp, &Patch::Apply(status.clone()))
                .await
            {
                Err(kube::Error::Api(e)) if e.message.contains(HELD) => {
                    api.delete(&name, &DeleteParams::default()).await?;
                    return Ok(());
                }
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        bail!(
            "the API server never enforced the ValidatingAdmissionPolicy {}",
            self.name
        )
    }
}

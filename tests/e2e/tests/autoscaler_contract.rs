//! Rule 1 of `autoscaler-contract.md`'s list of what a faithful simulator must do: the CRD
//! limits of a ProvisioningRequest and the immutability of its `podSets`, class and parameters,
//! on both served versions. The simulator does not enforce them itself: the API server does,
//! with the CRD the control plane installs (the one Kueue's release pins), and this test pins
//! that it does, so nothing the simulator reads can break them.

use anyhow::Result;
use e2e::TestEnv;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};

/// The ProvisioningRequest API at `version` (`v1` or `v1beta1`).
fn requests(env: &TestEnv, version: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("autoscaling.x-k8s.io", version, "ProvisioningRequest");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "provisioningrequests");
    Api::namespaced_with(env.client.clone(), &env.ns, &resource)
}

fn request(version: &str, name: &str, pod_sets: usize, parameters: usize) -> Result<DynamicObject> {
    let pod_sets: Vec<Value> = (0..pod_sets)
        .map(|i| json!({"podTemplateRef": {"name": format!("t-{i}")}, "count": 1}))
        .collect();
    let parameters: serde_json::Map<String, Value> = (0..parameters)
        .map(|i| (format!("p{i}"), json!("v")))
        .collect();
    Ok(serde_json::from_value(json!({
        "apiVersion": format!("autoscaling.x-k8s.io/{version}"),
        "kind": "ProvisioningRequest",
        "metadata": {"name": name},
        "spec": {
            "provisioningClassName": "check-capacity.autoscaling.x-k8s.io",
            "podSets": pod_sets,
            "parameters": parameters,
        },
    }))?)
}

/// The API server's answer to a create: its HTTP code (201 when created).
async fn create_code(api: &Api<DynamicObject>, object: &DynamicObject) -> u16 {
    match api.create(&PostParams::default(), object).await {
        Ok(_) => 201,
        Err(kube::Error::Api(s)) => s.code,
        Err(_) => 0,
    }
}

#[tokio::test]
async fn the_crd_enforces_the_limits_and_the_immutable_spec_on_both_versions() -> Result<()> {
    let env = TestEnv::new("autoscaler-crd").await?;
    for version in ["v1", "v1beta1"] {
        let api = requests(&env, version);
        let at = |what: &str| format!("{version}-{what}");
        // 32 podsets and 100 parameters are the most a request may have.
        assert_eq!(
            create_code(&api, &request(version, &at("max"), 32, 100)?).await,
            201
        );
        assert_eq!(
            create_code(&api, &request(version, &at("podsets"), 33, 1)?).await,
            422
        );
        assert_eq!(
            create_code(&api, &request(version, &at("none"), 0, 1)?).await,
            422
        );
        assert_eq!(
            create_code(&api, &request(version, &at("params"), 1, 101)?).await,
            422
        );
        let mut long = request(version, &at("long"), 1, 1)?;
        long.data["spec"]["parameters"]["p0"] = json!("x".repeat(256));
        assert_eq!(create_code(&api, &long).await, 422);

        // The spec cannot change once created: each part refused on its own.
        let name = at("max");
        for change in [
            json!({"spec": {"provisioningClassName": "best-effort-atomic-scale-up.autoscaling.x-k8s.io"}}),
            json!({"spec": {"podSets": [{"podTemplateRef": {"name": "other"}, "count": 2}]}}),
            json!({"spec": {"parameters": {"p0": "changed"}}}),
        ] {
            let refused = api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&change))
                .await;
            assert!(
                matches!(&refused, Err(kube::Error::Api(s)) if s.code == 422),
                "{version}: {change} was {refused:?}"
            );
        }
    }
    Ok(())
}

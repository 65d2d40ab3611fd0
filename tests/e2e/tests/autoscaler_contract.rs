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
        // 32 podsets and 100 parameters are the most a request may have.
        let codes = create_codes_at_the_limits(&api, version).await?;
        let expected = [
            ("max", 201),
            ("podsets", 422),
            ("none", 422),
            ("params", 422),
            ("long", 422),
        ];
        assert_eq!(codes, expected, "{version}");

        // The spec cannot change once created: each part refused on its own.
        for change in spec_changes() {
            let refused = patch_request(&api, &format!("{version}-max"), &change).await;
            assert!(
                matches!(&refused, Err(kube::Error::Api(s)) if s.code == 422),
                "{version}: {change} was {refused:?}"
            );
        }
    }
    Ok(())
}

/// Creates `<version>-max` (32 podsets, 100 parameters), then one request past each limit:
/// 33 podsets, none, 101 parameters, a parameter value of 256 characters; returns each
/// one's name suffix with the API server's code, in that order.
async fn create_codes_at_the_limits(
    api: &Api<DynamicObject>,
    version: &str,
) -> Result<Vec<(&'static str, u16)>> {
    let mut codes = Vec::new();
    for (what, pod_sets, parameters) in [
        ("max", 32, 100),
        ("podsets", 33, 1),
        ("none", 0, 1),
        ("params", 1, 101),
    ] {
        let object = request(version, &format!("{version}-{what}"), pod_sets, parameters)?;
        codes.push((what, create_code(api, &object).await));
    }
    let mut long = request(version, &format!("{version}-long"), 1, 1)?;
    long.data["spec"]["parameters"]["p0"] = json!("x".repeat(256));
    codes.push(("long", create_code(api, &long).await));
    Ok(codes)
}

/// One change of each immutable part of the spec: the class, the podsets, the parameters.
fn spec_changes() -> [Value; 3] {
    [
        json!({"spec": {"provisioningClassName": "best-effort-atomic-scale-up.autoscaling.x-k8s.io"}}),
        json!({"spec": {"podSets": [{"podTemplateRef": {"name": "other"}, "count": 2}]}}),
        json!({"spec": {"parameters": {"p0": "changed"}}}),
    ]
}

/// Merge-patches request `name` with `change`; the API server's answer as it is.
async fn patch_request(
    api: &Api<DynamicObject>,
    name: &str,
    change: &Value,
) -> kube::Result<DynamicObject> {
    api.patch(name, &PatchParams::default(), &Patch::Merge(change))
        .await
}

//! Properties of the local control plane that later suites (least-privilege RBAC) rely on.

use std::time::Duration;

use anyhow::{Result, bail};
use e2e::TestEnv;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, ListParams, PostParams};
use kueue_admission_sdk::api::Workload;
use serde_json::json;

fn is_forbidden(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 403)
}

/// A ServiceAccount's client is refused what no binding allows, and allowed it once a
/// RoleBinding grants it.
#[tokio::test]
async fn service_account_clients_are_subject_to_rbac() -> Result<()> {
    let env = TestEnv::new("rbac").await?;
    let sa_client = env.service_account("reader").await?;
    let workloads: Api<Workload> = Api::namespaced(sa_client, &env.ns);

    let denied = workloads.list(&ListParams::default()).await;
    match denied {
        Err(e) if is_forbidden(&e) => {}
        other => bail!("a ServiceAccount without any binding listed Workloads: {other:?}"),
    }

    allow_listing_workloads(&env, "reader").await?;
    listed_once_the_authorizer_follows(&workloads).await
}

/// Kueue's conversion webhook is wired as in a real installation. The field `cohortName` of a
/// v1beta2 ClusterQueue is `cohort` in v1beta1: only Kueue's converter renames it (the
/// apiserver's own "None" conversion would only swap apiVersion). Without the webhook, an older
/// Kueue whose storage version is v1beta1 (v0.15) could not be tested at all.
#[tokio::test]
async fn kueue_conversion_webhook_serves_both_api_versions() -> Result<()> {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};

    let env = TestEnv::new("conversion").await?;
    let name = env.cluster_name("cq");
    let at = |version: &str| -> Api<DynamicObject> {
        let gvk = GroupVersionKind::gvk("kueue.x-k8s.io", version, "ClusterQueue");
        Api::all_with(env.client.clone(), &ApiResource::from_gvk(&gvk))
    };
    let cq: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {"cohortName": "some-cohort"},
    }))?;
    at("v1beta2").create(&PostParams::default(), &cq).await?;

    let old = at("v1beta1").get(&name).await?;
    assert_eq!(old.data["spec"]["cohort"], "some-cohort", "{:#}", old.data);
    assert!(
        old.data["spec"].get("cohortName").is_none(),
        "{:#}",
        old.data
    );
    Ok(())
}

/// Grants the ServiceAccount `service_account` `list` on Workloads of the test namespace, through
/// a Role and RoleBinding `workload-reader`.
async fn allow_listing_workloads(env: &TestEnv, service_account: &str) -> Result<()> {
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "workload-reader"},
        "rules": [{"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["list"]}],
    }))?;
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "workload-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "workload-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": env.ns}],
    }))?;
    Api::<Role>::namespaced(env.client.clone(), &env.ns)
        .create(&PostParams::default(), &role)
        .await?;
    Api::<RoleBinding>::namespaced(env.client.clone(), &env.ns)
        .create(&PostParams::default(), &binding)
        .await?;
    Ok(())
}

/// Lists `workloads` until the authorizer has learned of the new binding (it follows through its
/// informers, so it is allowed 10 s); any error but a 403 within that time fails.
async fn listed_once_the_authorizer_follows(workloads: &Api<Workload>) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match workloads.list(&ListParams::default()).await {
            Ok(_) => return Ok(()),
            Err(e) if is_forbidden(&e) && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => bail!("listing Workloads with a RoleBinding that allows it: {e}"),
        }
    }
}

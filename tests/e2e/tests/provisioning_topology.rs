//! Topology-aware scheduling (TAS) and the provisioning check, against the real Kueue.
//!
//! Kueue delays a Workload's topology assignment until after provisioning only for its own
//! controllerName (`kueue.x-k8s.io/provisioning-request`): with any other check, ours
//! included, it assigns the topology when it reserves quota, against the Nodes that exist then.
//! [`kueue_assigns_the_topology_before_our_check_and_after_its_own`] pins both sides on one
//! topology-aware flavor; the warning our controller puts on its AdmissionCheck is pinned by
//! [`the_check_warns_while_a_cluster_queue_applies_it_to_a_topology_aware_flavor`].
//!
//! No simulator runs here: the test plays the autoscaler, marking each request `Provisioned`
//! itself once it has shown what Kueue did before, and adds the Nodes "provisioned" when it
//! wants them. The Nodes are kwok Nodes of labels no other test uses.

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use e2e::TestEnv;
use e2e::capacity::node_of;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams};
use kueue_admission_sdk::api::{
    AdmissionCheck, CheckState, ProvisioningRequest, Workload, find_condition,
    workload_condition as cond,
};
use kueue_provisioning_controller::identity::KUEUE_CONTROLLER_NAME;
use kueue_provisioning_controller::topology;
use serde_json::{Value, json};

/// The topology level the Jobs ask for: a block of Nodes.
const BLOCK: &str = "e2e.kueue-admission-checks.dev/block";
/// The label of the Nodes of this test's flavor (value: the test's namespace).
const POOL: &str = "e2e.kueue-admission-checks.dev/tas-pool";
/// The pod annotation that asks for all pods of a podset in one domain of a level.
const REQUIRED_TOPOLOGY: &str = "kueue.x-k8s.io/podset-required-topology";
/// Field manager of the objects this test applies.
const FIELD_MANAGER: &str = "e2e-provisioning-topology";

/// A Topology (levels: [`BLOCK`], hostname) and a topology-aware flavor `tas` of it, whose
/// Nodes carry [`POOL`]`=<namespace>`; returns the flavor's and the Topology's names.
async fn topology_aware_flavor(env: &TestEnv) -> Result<(String, String)> {
    let (flavor, topology) = (env.cluster_name("tas"), env.cluster_name("topology"));
    let objects = [
        json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Topology",
            "metadata": {"name": topology},
            "spec": {"levels": [{"nodeLabel": BLOCK}, {"nodeLabel": "kubernetes.io/hostname"}]},
        }),
        json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": flavor},
            "spec": {"nodeLabels": {POOL: env.ns}, "topologyName": topology},
        }),
    ];
    for object in &objects {
        e2e::chart::apply(&env.client, object, FIELD_MANAGER).await?;
    }
    Ok((flavor, topology))
}

/// A kwok Node of the flavor in `block`, with 4 cpu; returns its name.
async fn node(env: &TestEnv, name: &str, block: &str) -> Result<String> {
    let name = env.cluster_name(name);
    let room = json!({"cpu": "4", "memory": "16Gi", "pods": "110"});
    let node: Node = serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "labels": {POOL: env.ns, BLOCK: block, "kubernetes.io/hostname": name},
            "annotations": {"kwok.x-k8s.io/node": "fake"},
        },
        "status": {"allocatable": room, "capacity": room},
    }))?;
    Api::<Node>::all(env.client.clone())
        .create(&Default::default(), &node)
        .await
        .with_context(|| format!("creating Node {name}"))?;
    Ok(name)
}

/// Deletes this test's Nodes (best effort: kube-controller-manager collects their pods).
async fn delete_nodes(env: &TestEnv) {
    let nodes: Api<Node> = Api::all(env.client.clone());
    let selector = format!("{POOL}={}", env.ns);
    let _ = nodes
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(&selector),
        )
        .await;
}

/// The Workload as JSON: the SDK's type leaves out the topology fields of its admission.
async fn workload_json(env: &TestEnv, name: &str) -> Result<Value> {
    let resource = ApiResource::erase::<Workload>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(env.client.clone(), &env.ns, &resource);
    Ok(serde_json::to_value(api.get(name).await?)?)
}

/// The first podset assignment of a Workload's admission, `Null` without one.
fn assignment(wl: &Value) -> &Value {
    &wl["status"]["admission"]["podSetAssignments"][0]
}

/// The Node names of an assignment's topology (its last level is the hostname).
fn assigned_hosts(assignment: &Value) -> Vec<String> {
    let slices = assignment["topologyAssignment"]["slices"].as_array();
    let mut hosts: Vec<String> = slices
        .into_iter()
        .flatten()
        .flat_map(|s| {
            let values = &s["valuesPerLevel"];
            let last = values.as_array().and_then(|v| v.last()).cloned();
            let last = last.unwrap_or(Value::Null);
            let universal = last["universal"].as_str().map(|u| vec![u.to_string()]);
            universal.unwrap_or_else(|| {
                let individual = last["individual"]["roots"].as_array().cloned();
                individual
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|r| r.as_str().map(String::from))
                    .collect()
            })
        })
        .collect();
    hosts.sort();
    hosts.dedup();
    hosts
}

/// Polls the Workload as JSON until `until` holds; fails with it dumped.
async fn wait_json(
    env: &TestEnv,
    name: &str,
    what: &str,
    until: impl Fn(&Value) -> bool,
) -> Result<Value> {
    let deadline = tokio::time::Instant::now() + e2e::DEFAULT_TIMEOUT;
    loop {
        let wl = workload_json(env, name).await?;
        if until(&wl) {
            return Ok(wl);
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "timed out waiting for Workload {name}: {what}; last:\n{:#}",
                wl["status"]
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The requests of the namespace whose name starts with `<workload>-<check>-`.
async fn requests_of(
    env: &TestEnv,
    workload: &str,
    check: &str,
) -> Result<Vec<ProvisioningRequest>> {
    let prefix = format!("{workload}-{check}-");
    let list = env
        .provisioning_requests()
        .list(&Default::default())
        .await?;
    Ok(list
        .items
        .into_iter()
        .filter(|r| r.name_any().starts_with(&prefix))
        .collect())
}

/// The one request our controller made in this namespace, once it exists.
async fn our_request(env: &TestEnv) -> Result<String> {
    let deadline = tokio::time::Instant::now() + e2e::DEFAULT_TIMEOUT;
    loop {
        if let Some(name) = env.our_requests().await?.into_iter().next() {
            return Ok(name);
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "our controller made no request"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A Job of two pods of 1 cpu that must run in one block, submitted to `local_queue`; returns
/// its Workload's name.
async fn topology_job(env: &TestEnv, name: &str, local_queue: &str) -> Result<String> {
    env.submit(&e2e::SuspendedJob {
        parallelism: Some(2),
        pod_annotations: &[(REQUIRED_TOPOLOGY, BLOCK)],
        ..e2e::SuspendedJob::new(name, local_queue, "1")
    })
    .await
}

/// Two ClusterQueues on one topology-aware flavor, one guarded by our check, one by Kueue's
/// built-in check (same ProvisioningRequestConfig), and a Job needing one block in each:
///
/// 1. No Node of the flavor exists. Kueue reserves no quota for ours ("no topology domains"),
///    so our controller makes no request: nothing can ask the autoscaler for the Nodes the
///    Workload waits for. Kueue's Workload gets quota with `delayedTopologyRequest: Pending`
///    and no topology, and Kueue's check makes its request.
/// 2. A Node appears (block b1). Ours now gets quota with a topology naming that Node at once,
///    while our entry is still `Pending` (its request not provisioned); Kueue's stays delayed.
/// 3. Capacity "provisioned" for ours arrives as a Node of block b2 and our request is marked
///    `Provisioned`: the Workload is admitted and its pods run on the b1 Node assigned before,
///    none on the new one. Kueue's request provisioned, Kueue assigns its topology only now.
#[tokio::test]
async fn kueue_assigns_the_topology_before_our_check_and_after_its_own() -> Result<()> {
    let env = TestEnv::new("prov-topology").await?;
    let result = topology_scenario(&env).await;
    delete_nodes(&env).await;
    result
}

/// The objects of the scenario (cluster-scoped names).
struct Scene<'a> {
    env: &'a TestEnv,
    flavor: String,
    topology: String,
    /// Our AdmissionCheck, and its ClusterQueue.
    ours: String,
    cq_ours: String,
    /// Kueue's built-in check's AdmissionCheck.
    kueues: String,
}

impl<'a> Scene<'a> {
    /// The flavor, one config, both checks (active), their ClusterQueues and LocalQueues
    /// `lq-ours` and `lq-kueue`.
    async fn new(env: &'a TestEnv) -> Result<Self> {
        let (flavor, topology) = topology_aware_flavor(env).await?;
        let config = env.provisioning_config("prc", json!({})).await?;
        let controller_name = env.provisioning_controller_name();
        let ours = env
            .provisioning_check("prov", &controller_name, &config)
            .await?;
        let kueues = env
            .provisioning_check("kueue", KUEUE_CONTROLLER_NAME, &config)
            .await?;
        let cq_ours = env
            .named_queues("cq-ours", "lq-ours", &flavor, "8", &[&ours])
            .await?;
        env.named_queues("cq-kueue", "lq-kueue", &flavor, "8", &[&kueues])
            .await?;
        Ok(Self {
            env,
            flavor,
            topology,
            ours,
            cq_ours,
            kueues,
        })
    }

    /// 1. No Node: no quota for ours, quota with the topology delayed for Kueue's, whose
    ///    request is made.
    async fn without_nodes(&self, a: &str, b: &str) -> Result<()> {
        let env = self.env;
        let waiting = env
            .wait_workload(a, "no quota: no topology domain", |w| {
                w.condition(cond::QUOTA_RESERVED).is_some_and(|c| {
                    c.status == "False"
                        && c.message.contains("no topology domains")
                        && c.message.contains(BLOCK)
                })
            })
            .await?;
        let delayed = wait_json(env, b, "quota with the topology delayed", |w| {
            assignment(w)["delayedTopologyRequest"] == "Pending"
        })
        .await?;
        ensure!(
            assignment(&delayed)["topologyAssignment"].is_null(),
            "Kueue's Workload got a topology before provisioning: {:#}",
            assignment(&delayed)
        );
        e2e::eventually_async("Kueue's check made its request", || async {
            Ok(!requests_of(env, b, &self.kueues).await?.is_empty())
        })
        .await?;
        // Our Workload never had quota, so our controller made nothing.
        let none: Vec<String> = Vec::new();
        assert_eq!(env.our_requests().await?, none, "{}", e2e::dump(&waiting));
        Ok(())
    }

    /// 2. A Node appears: ours gets quota with the topology on it while our entry is still
    ///    Pending; Kueue's stays delayed. Returns the Node.
    async fn with_a_node(&self, a: &str, b: &str) -> Result<String> {
        let env = self.env;
        let old = node(env, "old", "b1").await?;
        let reserved = wait_json(env, a, "quota with a topology", |w| {
            !assignment(w)["topologyAssignment"].is_null()
        })
        .await?;
        let assigned = assignment(&reserved);
        ensure!(assigned["delayedTopologyRequest"].is_null(), "{assigned:#}");
        assert_eq!(assigned_hosts(assigned), std::slice::from_ref(&old));
        let typed: Workload = serde_json::from_value(reserved.clone())?;
        let entry = typed
            .admission_check(&self.ours)
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            entry.state,
            CheckState::Pending,
            "assigned before our answer: {entry:?}"
        );
        assert!(!typed.condition_is_true(cond::ADMITTED));
        let still = workload_json(env, b).await?;
        assert_eq!(
            assignment(&still)["delayedTopologyRequest"],
            "Pending",
            "Kueue's waits for its check, Nodes or not: {:#}",
            assignment(&still)
        );
        Ok(old)
    }

    /// Our check carries the warning, naming the ClusterQueue, the flavor and the Topology.
    async fn warned(&self) -> Result<()> {
        let ac = wait_warning(self.env, &self.ours, "True", &self.cq_ours).await?;
        let message = ac["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == topology::CONDITION)
            .and_then(|c| c["message"].as_str())
            .unwrap_or_default()
            .to_string();
        let head = format!(
            "ClusterQueue {} on flavor {} (Topology {}): Kueue assigns",
            self.cq_ours, self.flavor, self.topology
        );
        assert!(message.starts_with(&head), "{message}");
        Ok(())
    }

    /// 3. Capacity for ours arrives as another Node, our request provisioned: admitted, its pods
    ///    on the Node assigned before (`old`). Kueue's provisioned: its topology assigned now.
    async fn provisioned(&self, a: &str, b: &str, old: &str) -> Result<()> {
        let env = self.env;
        let new = node(env, "new", "b2").await?;
        env.mark_request_provisioned(&our_request(env).await?)
            .await?;
        env.wait_admitted(a).await?;
        let pods = env.wait_job_pods_running("a", 2).await?;
        let placed: Vec<&str> = pods.iter().filter_map(node_of).collect();
        assert_eq!(placed, [old, old], "not on {new}");

        let requests = requests_of(env, b, &self.kueues).await?;
        let request = requests.first().context("Kueue's request")?.name_any();
        env.mark_request_provisioned(&request).await?;
        let assigned = wait_json(env, b, "the topology assigned after provisioning", |w| {
            assignment(w)["delayedTopologyRequest"] == "Ready"
                && !assignment(w)["topologyAssignment"].is_null()
        })
        .await?;
        ensure!(!assigned_hosts(assignment(&assigned)).is_empty());
        env.wait_admitted(b).await?;
        Ok(())
    }
}

async fn topology_scenario(env: &TestEnv) -> Result<()> {
    let scene = Scene::new(env).await?;
    let controller = env.start_provisioning_controller(None)?;
    env.wait_active::<AdmissionCheck>(&scene.ours, "True", None)
        .await?;
    env.wait_active::<AdmissionCheck>(&scene.kueues, "True", None)
        .await?;
    let a = topology_job(env, "a", "lq-ours").await?;
    let b = topology_job(env, "b", "lq-kueue").await?;
    scene.without_nodes(&a, &b).await?;
    let old = scene.with_a_node(&a, &b).await?;
    scene.warned().await?;
    scene.provisioned(&a, &b, &old).await?;
    controller.stop().await
}

/// Waits until our check's warning condition has `status` and, when `True`, names `queue`.
async fn wait_warning(env: &TestEnv, check: &str, status: &str, queue: &str) -> Result<Value> {
    let checks = Api::<AdmissionCheck>::all(env.client.clone());
    let what = format!("{} {status} naming {queue:?}", topology::CONDITION);
    let ac = e2e::wait_for(checks, check, &what, |ac: &AdmissionCheck| {
        let conditions = ac.status.as_ref().map(|s| s.conditions.as_slice());
        find_condition(conditions.unwrap_or_default(), topology::CONDITION)
            .is_some_and(|c| c.status == status && (status == "False" || c.message.contains(queue)))
    })
    .await?;
    Ok(serde_json::to_value(ac)?)
}

/// Applies ClusterQueue `name` with 1 cpu of each of `flavors` and `check` limited to
/// `on_flavors` (empty: all).
async fn apply_queue(
    env: &TestEnv,
    name: &str,
    flavors: &[&str],
    check: &str,
    on_flavors: &[&str],
) -> Result<String> {
    let name = env.cluster_name(name);
    let quotas: Vec<Value> = flavors
        .iter()
        .map(|f| json!({"name": f, "resources": [{"name": "cpu", "nominalQuota": "1"}]}))
        .collect();
    let mut rule = json!({"name": check});
    if !on_flavors.is_empty() {
        rule["onFlavors"] = json!(on_flavors);
    }
    let queue = json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [{"coveredResources": ["cpu"], "flavors": quotas}],
            "admissionChecksStrategy": {"admissionChecks": [rule]},
        },
    });
    e2e::chart::apply(&env.client, &queue, FIELD_MANAGER).await?;
    Ok(name)
}

/// The warning's life: none while the only ClusterQueue limits the check to a plain flavor
/// (`onFlavors`); `True` naming exactly the queue that applies it to the topology-aware flavor
/// once one does, and the other too once its `onFlavors` no longer leaves that flavor out;
/// `False` once neither applies it there.
#[tokio::test]
async fn the_check_warns_while_a_cluster_queue_applies_it_to_a_topology_aware_flavor() -> Result<()>
{
    let env = TestEnv::new("prov-topology-warning").await?;
    let s = WarningScene::new(&env).await?;
    let mixed = s.mixed_queue(&[&s.plain]).await?;
    let controller = env.start_provisioning_controller(None)?;
    env.wait_active::<AdmissionCheck>(&s.check, "True", None)
        .await?;

    // The queue applying the check to the topology-aware flavor is named; the one whose
    // onFlavors leaves it out (in the leader's cache before it: one watch, in order) is not.
    let only = apply_queue(&env, "cq-tas", &[&s.tas], &s.check, &[]).await?;
    let warned = wait_warning(&env, &s.check, "True", &only).await?;
    let text = warned.to_string();
    assert!(!text.contains(&mixed), "{text}");

    s.mixed_queue(&[]).await?;
    wait_warning(&env, &s.check, "True", &mixed).await?;

    s.mixed_queue(&[&s.plain]).await?;
    delete_queue(&env, &only).await?;
    let warning = cleared_warning(&env, &s.check).await?;
    assert_eq!(warning["reason"], topology::REASON_NONE, "{warning:#}");
    // The runtime's Active condition is untouched by the warning's own apply, and back.
    env.wait_active::<AdmissionCheck>(&s.check, "True", Some("Active"))
        .await?;
    controller.stop().await
}

/// The objects of the warning's test: a topology-aware flavor, a plain one and our check.
struct WarningScene<'a> {
    env: &'a TestEnv,
    tas: String,
    plain: String,
    check: String,
}

impl<'a> WarningScene<'a> {
    /// The two flavors, a config and our check on it (the controller not yet started).
    async fn new(env: &'a TestEnv) -> Result<Self> {
        let (tas, _) = topology_aware_flavor(env).await?;
        let plain = env.resource_flavor("plain").await?.name_any();
        let config = env.provisioning_config("prc", json!({})).await?;
        let controller_name = env.provisioning_controller_name();
        let check = env
            .provisioning_check("prov", &controller_name, &config)
            .await?;
        Ok(Self {
            env,
            tas,
            plain,
            check,
        })
    }

    /// Applies ClusterQueue `cq-mixed`, on both flavors, with the check limited to
    /// `on_flavors` (empty: all); returns its name.
    async fn mixed_queue(&self, on_flavors: &[&str]) -> Result<String> {
        let flavors = [self.plain.as_str(), self.tas.as_str()];
        apply_queue(self.env, "cq-mixed", &flavors, &self.check, on_flavors).await
    }
}

/// Deletes ClusterQueue `name`.
async fn delete_queue(env: &TestEnv, name: &str) -> Result<()> {
    Api::<kueue_admission_sdk::api::ClusterQueue>::all(env.client.clone())
        .delete(name, &DeleteParams::default())
        .await?;
    Ok(())
}

/// Waits until our check's warning condition is `False`; returns that condition.
async fn cleared_warning(env: &TestEnv, check: &str) -> Result<Value> {
    let cleared = wait_warning(env, check, "False", "").await?;
    let conditions = cleared["status"]["conditions"].as_array().cloned();
    Ok(conditions
        .unwrap_or_default()
        .into_iter()
        .find(|c| c["type"] == topology::CONDITION)
        .unwrap_or_default())
}

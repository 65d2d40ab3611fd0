//! Provisioning tests on capacity: the autoscaler simulator in its cluster-autoscaler mode
//! (no script) creates kwok Nodes from a node group of the test's own, or finds room on Nodes
//! the test made, and the pods of the Job run there.
//!
//! Each test has its own node group (`<namespace>-grp`, by the kwok provider's grouping label
//! [`GROUP_LABEL`]), a ResourceFlavor selecting that label and tolerating the provider's taint,
//! and a simulator watching only its namespace, so tests in parallel never share capacity.

use std::time::Duration;

use anyhow::{Context, Result};
use autoscaler_simulator::{self as simulator, NodeGroup};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use kueue_admission_sdk::api::ResourceFlavor;
use serde_json::{Value, json};

use crate::provisioning::{Provisioning, World};
use crate::{Running, TestEnv};

/// The label by which the kwok provider (and the simulator) groups Nodes.
pub const GROUP_LABEL: &str = "kwok-nodegroup";
/// The taint the kwok provider puts on the Nodes it creates (`kwok-provider=true:NoSchedule`).
pub const PROVIDER_TAINT: (&str, &str) = ("kwok-provider", "true");
/// cluster-autoscaler's scale-up class.
pub const BEST_EFFORT: &str = "best-effort-atomic-scale-up.autoscaling.x-k8s.io";
/// cluster-autoscaler's class that only looks for room.
pub const CHECK_CAPACITY: &str = "check-capacity.autoscaling.x-k8s.io";
/// The pod annotation naming the request a pod consumes.
pub const CONSUME_ANNOTATION: &str = "autoscaling.x-k8s.io/consume-provisioning-request";
/// The pod annotation naming the request's class.
pub const CLASS_ANNOTATION: &str = "autoscaling.x-k8s.io/provisioning-class-name";

/// The node group of a test: its Nodes' shape and how many it may have.
#[derive(Clone, Copy, Debug)]
pub struct GroupShape {
    /// cpu of each Node.
    pub cpu: &'static str,
    /// The group's max count.
    pub max: u32,
}

/// What a capacity world is made of, beyond the defaults of [`World::on_capacity`].
#[derive(Debug, Default)]
pub struct CapacitySetup {
    /// The config's `provisioningClassName` and whatever else its spec says.
    pub config: Value,
    /// Annotations on the config (the controller's timeout annotation, say).
    pub config_annotations: Vec<(&'static str, String)>,
    /// The node group the simulator scales; `None`: it adds no Node (check-capacity).
    pub group: Option<GroupShape>,
    /// AdmissionChecks (cluster-scoped names, made by the caller) beside the provisioning one.
    pub extra_checks: Vec<String>,
    /// The ClusterQueue's cpu quota (8 when empty).
    pub quota: &'static str,
}

impl TestEnv {
    /// This test's node group: `<namespace>-grp` (a valid label value: namespaces are at most
    /// 50 characters).
    pub fn node_group(&self) -> String {
        self.cluster_name("grp")
    }

    /// A ResourceFlavor whose pods go to this test's node group: its label as node label, the
    /// kwok provider's taint tolerated.
    pub async fn node_group_flavor(&self) -> Result<String> {
        let (key, value) = PROVIDER_TAINT;
        let rf: ResourceFlavor = serde_json::from_value(json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": self.cluster_name("grp")},
            "spec": {
                "nodeLabels": {GROUP_LABEL: self.node_group()},
                "tolerations": [{"key": key, "operator": "Equal", "value": value, "effect": "NoSchedule"}],
            },
        }))?;
        let created = Api::<ResourceFlavor>::all(self.client.clone())
            .create(&PostParams::default(), &rf)
            .await
            .context("creating the node group's ResourceFlavor")?;
        Ok(created.name_any())
    }

    /// The node group as the kwok provider reads it from a Node template: `shape.cpu` cpu,
    /// 16Gi, 110 pods per Node, at most `shape.max` Nodes.
    pub fn node_group_of(&self, shape: GroupShape) -> Result<NodeGroup> {
        let room = json!({"cpu": shape.cpu, "memory": "16Gi", "pods": "110"});
        let template = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": format!("{}-template", self.node_group()),
                "labels": {GROUP_LABEL: self.node_group(), "type": "kwok"},
                "annotations": {
                    "kwok.x-k8s.io/node": "fake",
                    "cluster-autoscaler.kwok.nodegroup/max-count": shape.max.to_string(),
                },
            },
            "status": {"allocatable": room, "capacity": room},
        });
        let loaded = simulator::parse_node_groups(&template.to_string(), GROUP_LABEL, false)
            .map_err(|e| anyhow::anyhow!("the test's node template: {e}"))?;
        loaded
            .groups
            .into_iter()
            .next()
            .context("the template made no group")
    }

    /// A kwok Node the test makes itself in its node group's label and taint, with `cpu`: room
    /// that exists before any request (what check-capacity looks for). Not one of a group the
    /// simulator scales, so it never removes it.
    pub async fn existing_capacity(&self, name: &str, cpu: &str) -> Result<String> {
        let name = self.cluster_name(name);
        let room = json!({"cpu": cpu, "memory": "16Gi", "pods": "110"});
        let (key, value) = PROVIDER_TAINT;
        let node: Node = serde_json::from_value(json!({
            "metadata": {
                "name": name,
                "labels": {GROUP_LABEL: self.node_group(), "kubernetes.io/hostname": name},
                "annotations": {"kwok.x-k8s.io/node": "fake"},
            },
            "spec": {"taints": [{"key": key, "value": value, "effect": "NoSchedule"}]},
            "status": {"allocatable": room, "capacity": room},
        }))?;
        Api::<Node>::all(self.client.clone())
            .create(&PostParams::default(), &node)
            .await
            .with_context(|| format!("creating Node {name}"))?;
        Ok(name)
    }

    /// The Nodes carrying this test's node group label, in name order.
    pub async fn group_nodes(&self) -> Result<Vec<Node>> {
        let selector = format!("{GROUP_LABEL}={}", self.node_group());
        let mut nodes = Api::<Node>::all(self.client.clone())
            .list(&ListParams::default().labels(&selector))
            .await
            .context("listing the node group's Nodes")?
            .items;
        nodes.sort_by_key(|n| n.name_any());
        Ok(nodes)
    }

    /// The simulator in cluster-autoscaler mode for this namespace, scaling `groups`, with
    /// timings for tests (a loop every 200 ms, retries after 1 then 2 s, idle Nodes removed
    /// after 2 s, and no sooner than 2 s after a scale-up) and then `tune` applied.
    pub fn start_autoscaler(
        &self,
        groups: Vec<NodeGroup>,
        tune: impl FnOnce(&mut simulator::Settings),
    ) -> Running {
        let mut settings = simulator::Settings {
            namespace: Some(self.ns.clone()),
            node_groups: groups,
            scan_interval: Duration::from_millis(200),
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(2),
            scale_down_unneeded_time: Duration::from_secs(2),
            scale_down_delay_after_add: Duration::from_secs(2),
            ..simulator::Settings::default()
        };
        tune(&mut settings);
        self.start_simulator_with(settings)
    }
}

impl World {
    /// A provisioning world on capacity: the config `setup.config`, an AdmissionCheck of this
    /// test's controller, the node group flavor, a ClusterQueue guarded by the check (and
    /// `setup.extra_checks`), LocalQueue `lq`, the controller, and the simulator in
    /// cluster-autoscaler mode (`tune` applied to its settings).
    pub async fn on_capacity(
        test: &str,
        setup: CapacitySetup,
        tune: impl FnOnce(&mut simulator::Settings),
    ) -> Result<Self> {
        Self::on_capacity_in(TestEnv::new(test).await?, setup, tune).await
    }

    /// [`World::on_capacity`] in a namespace the test made (with objects it needs first, such
    /// as the AdmissionChecks of `setup.extra_checks`).
    pub async fn on_capacity_in(
        env: TestEnv,
        setup: CapacitySetup,
        tune: impl FnOnce(&mut simulator::Settings),
    ) -> Result<Self> {
        let controller_name = env.provisioning_controller_name();
        let annotations: Vec<(&str, &str)> = setup
            .config_annotations
            .iter()
            .map(|(k, v)| (*k, v.as_str()))
            .collect();
        let config = env
            .provisioning_config_with_annotations("prc", setup.config.clone(), &annotations)
            .await?;
        let class = setup.config["provisioningClassName"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let check = env
            .provisioning_check("prov", &controller_name, &config)
            .await?;
        let flavor = env.node_group_flavor().await?;
        let mut checks = vec![check.as_str()];
        checks.extend(setup.extra_checks.iter().map(String::as_str));
        let quota = if setup.quota.is_empty() {
            "8"
        } else {
            setup.quota
        };
        let cluster_queue = env.queues_on(&flavor, quota, &checks).await?;
        let groups = match setup.group {
            Some(shape) => vec![env.node_group_of(shape)?],
            None => Vec::new(),
        };
        let controller = env.start_provisioning_controller(None)?;
        let simulator = env.start_autoscaler(groups, tune);
        let p = Provisioning {
            controller_name,
            class,
            check,
            config,
            cluster_queue,
            flavor,
        };
        Ok(Self {
            env,
            p,
            controller: Some(controller),
            simulator,
        })
    }
}

/// A test's namespace with an AdmissionCheck `gate`, Active, answered by the test: made before
/// the queue that names it, it holds admission until the test opens it. Returns the gate's
/// name.
pub async fn env_with_gate(test: &str) -> Result<(TestEnv, String)> {
    let env = TestEnv::new(test).await?;
    let gate_controller = env.own_controller_name("gate");
    let gate = env
        .admission_check("gate", &gate_controller)
        .await?
        .name_any();
    env.set_admission_check_active(&gate, true).await?;
    Ok((env, gate))
}

/// The node a pod is bound to, if any.
pub fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

/// A pod annotation, if set.
pub fn pod_annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// A pod's nodeSelector value for `key`, if set.
pub fn pod_node_selector<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.spec
        .as_ref()?
        .node_selector
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// Waits until request `name` satisfies `cond`; on timeout, fails with the request dumped.
pub async fn wait_request_where(
    env: &TestEnv,
    name: &str,
    what: &str,
    cond: impl Fn(&kueue_admission_sdk::api::ProvisioningRequest) -> bool,
) -> Result<kueue_admission_sdk::api::ProvisioningRequest> {
    crate::wait_for(env.provisioning_requests(), name, what, cond).await
}

//! The capacity-buffer check against the real Karpenter (its kwok provider, the
//! `CapacityBuffer` gate on), started beside the control plane by
//! `control-plane.sh start-karpenter` the first time a test needs it.
//!
//! Each test gets a NodePool of its own whose NodeClaims carry a label key of its own
//! (`<namespace>.e2e.kueue-admission-checks.dev/capacity-for`, required with `Exists`): the
//! check's buffers select that key, so Karpenter places them on this test's NodePool alone, and
//! tests running at once never share Nodes.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kueue_admission_sdk::RuntimeConfig;
use kueue_admission_sdk::api::{
    AdmissionCheck, AdmissionCheckParametersReference, AdmissionCheckSpec,
};
use kueue_capacity_buffer_controller::api::{CapacityBuffer, NodeClaim};
use kueue_capacity_buffer_controller::config::GROUP;
use kueue_capacity_buffer_controller::{CapacityBufferCheck, CapacityBufferCheckConfig, Settings};
use serde_json::{Value, json};

use crate::{Running, TestEnv};

/// Starts Karpenter beside the control plane, once per test process (a no-op when it runs).
/// Against a control plane managed elsewhere (`E2E_KUBECONFIG`) Karpenter must already run
/// there: the NodePool CRD is looked for, and its absence fails the test.
pub async fn ensure_karpenter(env: &TestEnv) -> Result<()> {
    static STARTED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    let started = STARTED.get_or_init(|| {
        if std::env::var_os("E2E_KUBECONFIG").is_some() {
            return Ok(());
        }
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../control-plane/control-plane.sh");
        let out = Command::new("bash")
            .arg(&script)
            .arg("start-karpenter")
            .output();
        match out {
            Ok(out) if out.status.success() => Ok(()),
            Ok(out) => Err(format!(
                "Karpenter did not start ({}):\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )),
            Err(e) => Err(format!("cannot run {}: {e}", script.display())),
        }
    });
    if let Err(e) = started {
        bail!("{e}");
    }
    let crds: Api<CustomResourceDefinition> = Api::all(env.client.clone());
    for name in [
        "nodepools.karpenter.sh",
        "capacitybuffers.autoscaling.x-k8s.io",
    ] {
        crds.get(name)
            .await
            .with_context(|| format!("Karpenter's CRD {name} is not installed"))?;
    }
    Ok(())
}

/// Restarts Karpenter (`control-plane.sh restart karpenter`): stopped, started again on the
/// same cluster state. Only on the local control plane.
pub fn restart_karpenter() -> Result<()> {
    if std::env::var_os("E2E_KUBECONFIG").is_some() {
        bail!("restarting Karpenter needs the local control plane (E2E_KUBECONFIG is set)");
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../control-plane/control-plane.sh");
    let out = Command::new("bash")
        .arg(&script)
        .args(["restart", "karpenter"])
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "restarting Karpenter failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// One test's Karpenter setup: its label key, NodePool, config, AdmissionCheck and queues.
#[derive(Debug, Clone)]
pub struct BufferWorld {
    /// The node label key of this test.
    pub node_label: String,
    /// The NodePool's name.
    pub node_pool: String,
    /// The controllerName of this test's controller.
    pub controller_name: String,
    /// The AdmissionCheck's name.
    pub check: String,
    /// The CapacityBufferCheckConfig's name.
    pub config: String,
    /// The ClusterQueue's name (LocalQueue `lq`).
    pub cluster_queue: String,
}

impl TestEnv {
    /// This test's dedication label key.
    pub fn buffer_node_label(&self) -> String {
        format!("{}.e2e.kueue-admission-checks.dev/capacity-for", self.ns)
    }

    /// Karpenter running, the config CRD installed, and for this test: a NodePool (`cpu_limit`
    /// cpus at most, requiring this test's label key), a config (`spec` over this test's
    /// label), an AdmissionCheck of this test's controller, a flavor without labels, a
    /// ClusterQueue with `quota` cpu guarded by the check, and LocalQueue `lq`.
    pub async fn buffer_world(
        &self,
        cpu_limit: &str,
        quota: &str,
        spec: Value,
    ) -> Result<BufferWorld> {
        self.buffer_world_on(cpu_limit, quota, spec, ("cq", "lq"), &[])
            .await
    }

    /// [`Self::buffer_world`] with these (ClusterQueue, LocalQueue) names, beside other queues,
    /// its ClusterQueue guarded by `besides` (AdmissionCheck names) after the check.
    pub async fn buffer_world_on(
        &self,
        cpu_limit: &str,
        quota: &str,
        spec: Value,
        (cq, lq): (&str, &str),
        besides: &[&str],
    ) -> Result<BufferWorld> {
        ensure_karpenter(self).await?;
        install_config_crd(self).await?;
        let node_label = self.buffer_node_label();
        let node_pool = self.node_pool("pool", &node_label, cpu_limit).await?;
        let mut spec = spec;
        spec["nodeLabel"] = json!(node_label);
        let config = self.cluster_name("cbc");
        let object = json!({
            "apiVersion": format!("{GROUP}/v1alpha1"),
            "kind": "CapacityBufferCheckConfig",
            "metadata": {"name": config},
            "spec": spec,
        });
        crate::chart::apply(&self.client, &object, "e2e").await?;
        let controller_name = self.own_controller_name("capacity-buffer");
        let check_spec = AdmissionCheckSpec {
            controller_name: controller_name.clone(),
            parameters: Some(AdmissionCheckParametersReference {
                api_group: GROUP.into(),
                kind: "CapacityBufferCheckConfig".into(),
                name: config.clone(),
            }),
        };
        let check = Api::<AdmissionCheck>::all(self.client.clone())
            .create(
                &PostParams::default(),
                &AdmissionCheck::new(&self.cluster_name("cb"), check_spec),
            )
            .await
            .context("creating the AdmissionCheck")?
            .name_any();
        let flavor = self.cluster_name("karpenter");
        crate::create(
            Api::all(self.client.clone()),
            &kueue_admission_sdk::api::ResourceFlavor::new(&flavor, Default::default()),
        )
        .await?;
        let checks: Vec<&str> = std::iter::once(check.as_str())
            .chain(besides.iter().copied())
            .collect();
        let cluster_queue = self.named_queues(cq, lq, &flavor, quota, &checks).await?;
        Ok(BufferWorld {
            node_label,
            node_pool,
            controller_name,
            check,
            config,
            cluster_queue,
        })
    }

    /// A KWOKNodeClass (shared, `default`) and a NodePool `name` of this test: on-demand amd64
    /// Nodes carrying `label` (any value: `Exists`), at most `cpu_limit` cpus, consolidated as
    /// soon as they are empty.
    pub async fn node_pool(&self, name: &str, label: &str, cpu_limit: &str) -> Result<String> {
        let class = json!({
            "apiVersion": "karpenter.kwok.sh/v1alpha1",
            "kind": "KWOKNodeClass",
            "metadata": {"name": "default"},
        });
        crate::chart::apply(&self.client, &class, "e2e").await?;
        let pool = self.cluster_name(name);
        let object = json!({
            "apiVersion": "karpenter.sh/v1",
            "kind": "NodePool",
            "metadata": {"name": pool},
            "spec": {
                "limits": {"cpu": cpu_limit},
                "disruption": {"consolidateAfter": "0s", "consolidationPolicy": "WhenEmpty", "budgets": [{"nodes": "100%"}]},
                "template": {"spec": {
                    "nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "default"},
                    "expireAfter": "Never",
                    "requirements": [
                        {"key": label, "operator": "Exists"},
                        {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
                        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
                    ],
                }},
            },
        });
        crate::chart::apply(&self.client, &object, "e2e").await?;
        Ok(pool)
    }

    /// Starts this test's capacity-buffer controller in process.
    pub fn start_buffer_controller(
        &self,
        world: &BufferWorld,
        tune: impl FnOnce(&mut RuntimeConfig),
    ) -> Result<Running> {
        let http = crate::free_local_address()?;
        let check = CapacityBufferCheck::new(Settings {
            controller_name: world.controller_name.clone(),
            start_early: true,
        });
        let mut config = RuntimeConfig {
            metrics_address: Some(http),
            health_address: Some(http),
            field_manager: format!("e2e-cb-{}", self.ns),
            ..self.runtime_config()
        };
        tune(&mut config);
        Ok(Running::check(self.client.clone(), check, config))
    }

    /// The CapacityBuffers of this test's namespace.
    pub fn capacity_buffers(&self) -> Api<CapacityBuffer> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// A buffer of `replicas` pods of 100m cpu selecting `label=value` (and its template), made
    /// by the test itself: creating one makes Karpenter run a provisioning pass, in which it
    /// looks at every buffer. Waits until Karpenter has written its `Provisioning` condition,
    /// so that the pass has happened.
    pub async fn probe_buffer(
        &self,
        name: &str,
        label: &str,
        value: &str,
        replicas: i32,
    ) -> Result<CapacityBuffer> {
        let template = json!({
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": name, "namespace": self.ns},
            "template": {"spec": {
                "nodeSelector": {label: value},
                "containers": [{"name": "c", "image": "probe", "resources": {"requests": {"cpu": "100m"}}}],
            }},
        });
        crate::chart::apply(&self.client, &template, "e2e").await?;
        let buffer = json!({
            "apiVersion": "autoscaling.x-k8s.io/v1beta1",
            "kind": "CapacityBuffer",
            "metadata": {"name": name, "namespace": self.ns},
            "spec": {"podTemplateRef": {"name": name}, "replicas": replicas},
        });
        crate::chart::apply(&self.client, &buffer, "e2e").await?;
        crate::wait_for(
            self.capacity_buffers(),
            name,
            "Karpenter's Provisioning condition",
            |b: &CapacityBuffer| {
                b.status
                    .as_ref()
                    .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Provisioning"))
            },
        )
        .await
    }

    /// Deletes a buffer the test made ([`Self::probe_buffer`]) and its template, so that its
    /// capacity does not outlive the test.
    pub async fn delete_probe(&self, name: &str) -> Result<()> {
        let params = kube::api::DeleteParams::default();
        self.capacity_buffers().delete(name, &params).await?;
        Api::<k8s_openapi::api::core::v1::PodTemplate>::namespaced(self.client.clone(), &self.ns)
            .delete(name, &params)
            .await?;
        Ok(())
    }

    /// A Workload of `pods` pods of 1 cpu queued to LocalQueue `lq`, made directly (no Job):
    /// admitted, it never has pods. Its containers have an image (a PodTemplate needs one).
    pub async fn podless_workload(
        &self,
        name: &str,
        pods: i32,
    ) -> Result<kueue_admission_sdk::api::Workload> {
        let mut wl = kueue_admission_sdk::testing::WorkloadBuilder::new(&self.ns, name)
            .pod_set("main", pods, "1")
            .build();
        wl.spec.queue_name = Some("lq".into());
        wl.metadata.resource_version = None;
        wl.metadata.uid = None;
        wl.status = None;
        for spec in wl
            .spec
            .pod_sets
            .iter_mut()
            .filter_map(|p| p.template.spec.as_mut())
        {
            for c in &mut spec.containers {
                c.image = Some("registry.k8s.io/pause".into());
            }
        }
        self.create_workload(&wl).await
    }

    /// The NodeClaims carrying `label=value`.
    pub async fn node_claims(&self, label: &str, value: &str) -> Result<Vec<NodeClaim>> {
        let api: Api<NodeClaim> = Api::all(self.client.clone());
        Ok(api
            .list(&ListParams::default().labels(&format!("{label}={value}")))
            .await?
            .items)
    }

    /// The names of the NodeClaims carrying `label=value`.
    pub async fn node_claim_names(&self, label: &str, value: &str) -> Result<BTreeSet<String>> {
        let claims = self.node_claims(label, value).await?;
        Ok(claims.iter().map(|c| c.name_any()).collect())
    }

    /// The Nodes carrying `label=value`.
    pub async fn labelled_nodes(&self, label: &str, value: &str) -> Result<Vec<Node>> {
        let api: Api<Node> = Api::all(self.client.clone());
        Ok(api
            .list(&ListParams::default().labels(&format!("{label}={value}")))
            .await?
            .items)
    }

    /// The names of the Nodes carrying `label=value`.
    pub async fn labelled_node_names(&self, label: &str, value: &str) -> Result<BTreeSet<String>> {
        let nodes = self.labelled_nodes(label, value).await?;
        Ok(nodes.iter().map(|n| n.name_any()).collect())
    }

    /// Waits until `count` pods of Job `job` run; fails unless each is on one of `nodes`.
    pub async fn job_pods_on(
        &self,
        job: &str,
        count: i32,
        nodes: &BTreeSet<String>,
    ) -> Result<Vec<Pod>> {
        let pods = self.wait_job_pods_running(job, count).await?;
        for pod in &pods {
            let node = crate::capacity::node_of(pod).unwrap_or_default();
            if !nodes.contains(node) {
                bail!("{} is not on {nodes:?}", crate::describe_pod(pod));
            }
        }
        Ok(pods)
    }
}

/// Applies the CapacityBufferCheckConfig CRD (the one the binary prints).
pub async fn install_config_crd(env: &TestEnv) -> Result<()> {
    crate::install_crd::<CapacityBufferCheckConfig>(env).await
}

/// How long Karpenter may take to consolidate an empty Node: consolidateAfter 0 s, its 10 s
/// disruption poll, the 15 s validation, then the drain; doubled for a loaded machine.
pub const CONSOLIDATION: std::time::Duration = std::time::Duration::from_secs(120);

/// Every NodeClaim a watch saw carrying a label key, by name with the label's value, from the
/// moment it starts: what proves that no capacity was made twice. Stops when dropped.
#[derive(Debug)]
pub struct ClaimRecorder {
    seen: Arc<Mutex<BTreeSet<(String, String)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl ClaimRecorder {
    /// Starts recording the NodeClaims that carry `label` (any value).
    pub async fn start(env: &TestEnv, label: &str) -> Result<Self> {
        let api: Api<NodeClaim> = Api::all(env.client.clone());
        let seen = Arc::new(Mutex::new(BTreeSet::new()));
        let into = seen.clone();
        let config = watcher::Config::default().labels(label);
        let key = label.to_string();
        let (listed_tx, listed_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut listed = Some(listed_tx);
            let mut events = std::pin::pin!(watcher(api, config).default_backoff());
            while let Some(event) = events.next().await {
                match event {
                    Ok(
                        watcher::Event::Apply(c)
                        | watcher::Event::InitApply(c)
                        | watcher::Event::Delete(c),
                    ) => {
                        let value = c.labels().get(&key).cloned().unwrap_or_default();
                        into.lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert((value, c.name_any()));
                    }
                    Ok(watcher::Event::InitDone) => {
                        if let Some(tx) = listed.take() {
                            let _ = tx.send(());
                        }
                    }
                    _ => {}
                }
            }
        });
        listed_rx
            .await
            .context("the NodeClaim watch ended before its first list")?;
        Ok(Self { seen, task })
    }

    /// The NodeClaims seen so far whose label has `value`.
    pub fn seen_for(&self, value: &str) -> BTreeSet<String> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.iter()
            .filter(|(v, _)| v == value)
            .map(|(_, name)| name.clone())
            .collect()
    }
}

impl Drop for ClaimRecorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

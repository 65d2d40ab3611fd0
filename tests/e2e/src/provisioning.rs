//! Harness for the provisioning controller's end-to-end tests: a ProvisioningRequestConfig, an
//! AdmissionCheck naming it, a ClusterQueue and LocalQueue, the controller under test and the
//! autoscaler simulator, all started for one test.
//!
//! Each test gets its own controllerName and its own provisioning class, and the simulator it
//! starts serves only that class, so tests running in parallel never act on each other's
//! requests.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use autoscaler_simulator::{self as simulator, Script};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::PodTemplate;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kueue_admission_sdk::RuntimeConfig;
use kueue_admission_sdk::api::{
    AdmissionCheck, AdmissionCheckParametersReference, AdmissionCheckSpec, AdmissionCheckState,
    ProvisioningRequest, ProvisioningRequestConfig, Workload,
};
use kueue_provisioning_controller::{ProvisioningCheck, Settings, identity};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::{Running, TestEnv};

/// The kind an AdmissionCheck's parameters name for the provisioning check.
const PARAMETERS_KIND: &str = "ProvisioningRequestConfig";

/// A config spec retrying `limit` times, `base` s apart at first, at most 10 s.
pub fn retry_strategy(limit: i32, base: i32) -> Value {
    json!({"retryStrategy": {
        "backoffLimitCount": limit,
        "backoffBaseSeconds": base,
        "backoffMaxSeconds": 10,
    }})
}

/// What [`TestEnv::provisioning`] set up.
#[derive(Debug)]
pub struct Provisioning {
    /// The controllerName served by this test's controller.
    pub controller_name: String,
    /// The provisioning class of this test's config (served by this test's simulator only).
    pub class: String,
    /// The AdmissionCheck (cluster-scoped name).
    pub check: String,
    /// The ProvisioningRequestConfig (cluster-scoped name).
    pub config: String,
    /// The ClusterQueue (cluster-scoped name).
    pub cluster_queue: String,
    /// The ResourceFlavor (cluster-scoped name).
    pub flavor: String,
}

impl TestEnv {
    /// This test's controllerName.
    pub fn provisioning_controller_name(&self) -> String {
        self.own_controller_name("prov")
    }

    /// A ProvisioningRequestConfig with this spec (merged over this test's class name).
    pub async fn provisioning_config(&self, name: &str, spec: Value) -> Result<String> {
        self.provisioning_config_with_annotations(name, spec, &[])
            .await
    }

    /// [`provisioning_config`](Self::provisioning_config) with these annotations on the config
    /// (e.g. the controller's timeout annotation).
    pub async fn provisioning_config_with_annotations(
        &self,
        name: &str,
        spec: Value,
        annotations: &[(&str, &str)],
    ) -> Result<String> {
        let annotations: serde_json::Map<String, Value> = annotations
            .iter()
            .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
            .collect();
        let mut full = json!({"provisioningClassName": self.provisioning_class()});
        if let (Some(full), Some(spec)) = (full.as_object_mut(), spec.as_object()) {
            for (k, v) in spec {
                full.insert(k.clone(), v.clone());
            }
        }
        let config: ProvisioningRequestConfig = serde_json::from_value(json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": PARAMETERS_KIND,
            "metadata": {"name": self.cluster_name(name), "annotations": annotations},
            "spec": full,
        }))?;
        let created = Api::<ProvisioningRequestConfig>::all(self.client.clone())
            .create(&PostParams::default(), &config)
            .await
            .context("creating the ProvisioningRequestConfig")?;
        Ok(created.name_any())
    }

    /// This test's provisioning class.
    pub fn provisioning_class(&self) -> String {
        format!("{}.e2e.kueue-admission-checks.dev", self.ns)
    }

    /// An AdmissionCheck answered by `controller_name` whose parameters are the
    /// ProvisioningRequestConfig `config`.
    pub async fn provisioning_check(
        &self,
        name: &str,
        controller_name: &str,
        config: &str,
    ) -> Result<String> {
        self.admission_check_with_parameters(name, controller_name, PARAMETERS_KIND, config)
            .await
    }

    /// An AdmissionCheck answered by `controller_name` with a parameters reference of `kind`
    /// (`ProvisioningRequestConfig` unless testing a wrong kind) named `parameters`.
    pub async fn admission_check_with_parameters(
        &self,
        name: &str,
        controller_name: &str,
        kind: &str,
        parameters: &str,
    ) -> Result<String> {
        let spec = AdmissionCheckSpec {
            controller_name: controller_name.into(),
            parameters: Some(AdmissionCheckParametersReference {
                api_group: "kueue.x-k8s.io".into(),
                kind: kind.into(),
                name: parameters.into(),
            }),
        };
        let ac = Api::<AdmissionCheck>::all(self.client.clone())
            .create(
                &PostParams::default(),
                &AdmissionCheck::new(&self.cluster_name(name), spec),
            )
            .await
            .context("creating the AdmissionCheck")?;
        Ok(ac.name_any())
    }

    /// Config `spec` (over this test's class), an AdmissionCheck of this test's controller naming
    /// it, a flavor with node labels and a toleration, a ClusterQueue with `cpu` quota guarded
    /// by the check, and LocalQueue `lq`.
    pub async fn provisioning(&self, spec: Value, cpu: &str) -> Result<Provisioning> {
        self.provisioning_with(spec, &[], cpu, &[]).await
    }

    /// [`provisioning`](Self::provisioning) with `annotations` on the config and `extra_checks`
    /// (cluster-scoped AdmissionCheck names, created by the caller) guarding the ClusterQueue
    /// beside this test's provisioning check.
    pub async fn provisioning_with(
        &self,
        spec: Value,
        annotations: &[(&str, &str)],
        cpu: &str,
        extra_checks: &[&str],
    ) -> Result<Provisioning> {
        let controller_name = self.provisioning_controller_name();
        let config = self
            .provisioning_config_with_annotations("prc", spec, annotations)
            .await?;
        let check = self
            .provisioning_check("prov", &controller_name, &config)
            .await?;
        let mut checks = vec![check.as_str()];
        checks.extend_from_slice(extra_checks);
        let (flavor, cq) = self.pool_queues(cpu, &checks).await?;
        Ok(Provisioning {
            controller_name,
            class: self.provisioning_class(),
            check,
            config,
            cluster_queue: cq,
            flavor,
        })
    }

    /// The flavor `pool` ([`Self::provisioning_flavor`]), ClusterQueue `cq` with `cpu` of it
    /// guarded by `checks`, and LocalQueue `lq`; returns the flavor's and the ClusterQueue's
    /// cluster-scoped names.
    pub async fn pool_queues(&self, cpu: &str, checks: &[&str]) -> Result<(String, String)> {
        let flavor = self.provisioning_flavor("pool").await?;
        let cq = self.queues_on(&flavor, cpu, checks).await?;
        Ok((flavor, cq))
    }

    /// The toleration of the flavor [`Self::provisioning_flavor`] makes as `pool`.
    pub fn pool_toleration() -> k8s_openapi::api::core::v1::Toleration {
        k8s_openapi::api::core::v1::Toleration {
            key: Some("dedicated".into()),
            operator: Some("Equal".into()),
            value: Some("pool".into()),
            effect: Some("NoSchedule".into()),
            ..Default::default()
        }
    }

    /// A ResourceFlavor with node label `pool=<name>` and a `dedicated=<name>:NoSchedule`
    /// toleration, which the PodTemplates must carry. Its pods run on a standing kwok node of
    /// that label and taint, shared by every test ([`crate::ensure_standing_node`]): the
    /// capacity of a scripted autoscaler, which only writes conditions. Tests of the real
    /// autoscaler's behaviour use node groups of their own instead.
    pub async fn provisioning_flavor(&self, name: &str) -> Result<String> {
        crate::ensure_standing_node(
            &self.client,
            &format!("kwok-standing-{name}"),
            &[("pool", name)],
            Some(("dedicated", name)),
        )
        .await?;
        let rf: kueue_admission_sdk::api::ResourceFlavor = serde_json::from_value(json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": self.cluster_name(name)},
            "spec": {
                "nodeLabels": {"pool": name},
                "tolerations": [{"key": "dedicated", "operator": "Equal", "value": name, "effect": "NoSchedule"}],
            },
        }))?;
        let created = Api::<kueue_admission_sdk::api::ResourceFlavor>::all(self.client.clone())
            .create(&PostParams::default(), &rf)
            .await
            .context("creating the ResourceFlavor")?;
        Ok(created.name_any())
    }

    /// A suspended Job of `parallelism` pods requesting `cpu` each, whose pod template carries
    /// `annotations` (e.g. the simulator's script), submitted to `local_queue`.
    pub async fn job_with_pod_annotations(
        &self,
        name: &str,
        local_queue: &str,
        cpu: &str,
        parallelism: i32,
        annotations: &[(&str, &str)],
    ) -> Result<Job> {
        self.create_job(&crate::SuspendedJob {
            parallelism: Some(parallelism),
            pod_annotations: annotations,
            ..crate::SuspendedJob::new(name, local_queue, cpu)
        })
        .await
    }

    /// Submits a Job whose requests the simulator answers with `script`; returns its Workload.
    pub async fn job_with_script(&self, name: &str, script: &str) -> Result<String> {
        let job = self
            .job_with_pod_annotations(
                name,
                "lq",
                "1",
                1,
                &[(simulator::SCRIPT_ANNOTATION, script)],
            )
            .await?;
        Ok(self.workload_for_job(&job).await?.name_any())
    }

    /// Starts this test's controller (its own controllerName, no leader election).
    pub fn start_provisioning_controller(
        &self,
        default_timeout: Option<Duration>,
    ) -> Result<Running> {
        self.start_provisioning_controller_as(self.client.clone(), default_timeout)
    }

    /// [`Self::start_provisioning_controller`], acting with `client` (e.g. a ServiceAccount's).
    pub fn start_provisioning_controller_as(
        &self,
        client: kube::Client,
        default_timeout: Option<Duration>,
    ) -> Result<Running> {
        self.start_provisioning_controller_tuned(client, default_timeout, |_| {})
    }

    /// [`Self::start_provisioning_controller_as`], with `tune` applied to the runtime's settings
    /// (e.g. a short `permanent_failure_hold` or `max_retry_delay`).
    pub fn start_provisioning_controller_tuned(
        &self,
        client: kube::Client,
        default_timeout: Option<Duration>,
        tune: impl FnOnce(&mut RuntimeConfig),
    ) -> Result<Running> {
        let http = crate::free_local_address()?;
        let check = ProvisioningCheck::new(Settings {
            controller_name: self.provisioning_controller_name(),
            default_timeout,
            start_early: true,
        });
        let mut config = RuntimeConfig {
            metrics_address: Some(http),
            health_address: Some(http),
            field_manager: format!("e2e-prov-{}", self.ns),
            ..self.runtime_config()
        };
        tune(&mut config);
        Ok(Running::check(client, check, config))
    }

    /// Starts a simulator for this test's namespace, scripting this test's class (`provision`
    /// by default).
    pub fn start_simulator(&self) -> Result<Running> {
        let settings = simulator::Settings {
            scripted_classes: vec![self.provisioning_class()],
            default_script: "provision"
                .parse::<Script>()
                .map_err(|e| anyhow::anyhow!("{e}"))?,
            namespace: Some(self.ns.clone()),
            ..simulator::Settings::default()
        };
        Ok(self.start_simulator_with(settings))
    }

    /// Starts a simulator with these settings, in this process.
    pub fn start_simulator_with(&self, settings: simulator::Settings) -> Running {
        let client = self.client.clone();
        Running::spawn(None, |shutdown| async move {
            tokio::select! {
                () = simulator::run(client, settings) => {}
                () = shutdown => {}
            }
            Ok(())
        })
    }

    /// The ProvisioningRequests of this test's namespace.
    pub fn provisioning_requests(&self) -> Api<ProvisioningRequest> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Names of this test's ProvisioningRequests made by the controller under test.
    pub async fn our_requests(&self) -> Result<Vec<String>> {
        self.names_made_by_ours(self.provisioning_requests()).await
    }

    /// PodTemplates of this test's namespace.
    pub fn pod_templates(&self) -> Api<PodTemplate> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Names of this test namespace's PodTemplates made by the controller under test.
    pub async fn our_pod_templates(&self) -> Result<Vec<String>> {
        self.names_made_by_ours(self.pod_templates()).await
    }

    /// Names, sorted, of the objects of `api` labelled as made by the controller under test.
    async fn names_made_by_ours<K>(&self, api: Api<K>) -> Result<Vec<String>>
    where
        K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
    {
        let selector = format!(
            "{}={}",
            identity::INSTANCE_LABEL,
            identity::instance_label(&self.provisioning_controller_name())
        );
        let list = api.list(&ListParams::default().labels(&selector)).await?;
        let mut names: Vec<String> = list.items.iter().map(|r| r.name_any()).collect();
        names.sort();
        Ok(names)
    }

    /// Waits until nothing of the controller under test is left in this namespace.
    pub async fn wait_nothing_left(&self) -> Result<()> {
        let deadline = tokio::time::Instant::now() + crate::DEFAULT_TIMEOUT;
        loop {
            let (requests, templates) =
                (self.our_requests().await?, self.our_pod_templates().await?);
            if requests.is_empty() && templates.is_empty() {
                return Ok(());
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "left behind: requests {requests:?}, templates {templates:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until the requests of the controller under test in this namespace are exactly
    /// `requests` and its PodTemplates exactly theirs (named `ppt-<request>-<podset>`).
    pub async fn wait_only_left(&self, requests: &[String]) -> Result<()> {
        let mut want = requests.to_vec();
        want.sort();
        let deadline = tokio::time::Instant::now() + crate::DEFAULT_TIMEOUT;
        loop {
            let (have, templates) = (self.our_requests().await?, self.our_pod_templates().await?);
            let templates_ok = templates.len() == want.len()
                && templates
                    .iter()
                    .all(|t| want.iter().any(|r| t.starts_with(&format!("ppt-{r}-"))));
            if have == want && templates_ok {
                return Ok(());
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "expected only {want:?} and their templates; left: requests {have:?}, templates {templates:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The entry of `check` on the Workload, as last read.
    pub async fn check_entry(
        &self,
        workload: &str,
        check: &str,
    ) -> Result<Option<kueue_admission_sdk::api::AdmissionCheckState>> {
        let wl: Workload = self.workloads().get(workload).await?;
        Ok(wl.admission_check(check).cloned())
    }
}

/// One change a [`History`] saw.
#[derive(Clone, Debug)]
pub enum Seen<K> {
    /// Created or changed (or listed when the watch started).
    Applied(K),
    /// Deleted.
    Deleted(K),
}

/// Every version of the objects of one kind in a test namespace, as a watch delivered them, in
/// order: what a test asserts on when a state lasts too briefly to be waited for (a `Retry`
/// entry, the first attempt's request). Started before the objects exist, it sees each change.
#[derive(Debug)]
pub struct History<K> {
    seen: std::sync::Arc<std::sync::Mutex<Vec<Seen<K>>>>,
    task: JoinHandle<()>,
}

impl<K> Drop for History<K> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl<K: Clone> History<K> {
    /// Everything seen so far.
    pub fn seen(&self) -> Vec<Seen<K>> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The versions applied so far (deletions left out).
    pub fn applied(&self) -> Vec<K> {
        self.seen()
            .into_iter()
            .filter_map(|s| match s {
                Seen::Applied(k) => Some(k),
                Seen::Deleted(_) => None,
            })
            .collect()
    }
}

/// Whether the request has a condition of this type with status `True`.
pub fn request_condition_is_true(r: &ProvisioningRequest, type_: &str) -> bool {
    r.status
        .as_ref()
        .and_then(|s| kueue_admission_sdk::api::find_condition(&s.conditions, type_))
        .is_some_and(|c| c.status == "True")
}

impl<K: kube::Resource + Clone> History<K> {
    /// Waits until the history has seen a version of the object `name` satisfying `cond` (the
    /// history's watch may lag behind the one a test waited on).
    pub async fn wait_seen(&self, name: &str, what: &str, cond: impl Fn(&K) -> bool) -> Result<()> {
        crate::eventually(what, || {
            self.applied()
                .iter()
                .any(|k| k.meta().name.as_deref() == Some(name) && cond(k))
        })
        .await
    }
}

impl<K: kube::Resource> History<K> {
    /// Names of the objects deleted so far.
    pub fn deleted(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(|s| match s {
                Seen::Deleted(k) => Some(k.meta().name.clone().unwrap_or_default()),
                Seen::Applied(_) => None,
            })
            .collect()
    }

    /// `(name, uid)` of every object seen, each once, in the order they first appeared.
    pub fn objects(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        for s in self.seen.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let (Seen::Applied(k) | Seen::Deleted(k)) = s;
            let id = (
                k.meta().name.clone().unwrap_or_default(),
                k.meta().uid.clone().unwrap_or_default(),
            );
            if !out.contains(&id) {
                out.push(id);
            }
        }
        out
    }
}

/// Starts recording every change of the objects of `api`.
pub fn history<K>(api: Api<K>) -> History<K>
where
    K: kube::Resource
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + Clone + Eq + std::hash::Hash,
{
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = seen.clone();
    let task = tokio::spawn(async move {
        let mut events = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
        while let Some(event) = events.next().await {
            let seen = match event {
                Ok(watcher::Event::Apply(k) | watcher::Event::InitApply(k)) => Seen::Applied(k),
                Ok(watcher::Event::Delete(k)) => Seen::Deleted(k),
                _ => continue,
            };
            sink.lock().unwrap_or_else(|p| p.into_inner()).push(seen);
        }
    });
    History { seen, task }
}

impl TestEnv {
    /// Records every version of this test namespace's Workloads.
    pub fn workload_history(&self) -> History<Workload> {
        history(self.workloads())
    }

    /// Records every version of this test namespace's ProvisioningRequests.
    pub fn request_history(&self) -> History<ProvisioningRequest> {
        history(self.provisioning_requests())
    }

    /// The notes of the events with this reason on the Workload so far, oldest first.
    pub async fn event_notes(&self, workload: &str, reason: &str) -> Result<Vec<String>> {
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(self.client.clone(), &self.ns);
        let mut events: Vec<_> = events
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(workload)
            })
            .collect();
        events.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
        Ok(events
            .into_iter()
            .map(|e| e.note.unwrap_or_default())
            .collect())
    }

    /// Waits until the named ProvisioningRequest of this namespace has condition `type_` True.
    pub async fn wait_request(&self, name: &str, type_: &str) -> Result<ProvisioningRequest> {
        crate::wait_for(
            self.provisioning_requests(),
            name,
            &format!("{type_}=True"),
            |r: &ProvisioningRequest| request_condition_is_true(r, type_),
        )
        .await
    }

    /// Adds the `True` condition `type_` to request `name` as the autoscaler would (others kept).
    pub async fn add_request_condition(
        &self,
        name: &str,
        type_: &str,
        reason: &str,
        message: &str,
    ) -> Result<ProvisioningRequest> {
        let api = self.provisioning_requests();
        for _ in 0..10 {
            let r = api.get(name).await?;
            let mut conditions = r.status.clone().unwrap_or_default().conditions;
            conditions.retain(|c| c.type_ != type_);
            conditions.push(Condition {
                type_: type_.into(),
                status: "True".into(),
                reason: reason.into(),
                message: message.into(),
                last_transition_time: Time(Timestamp::now()),
                observed_generation: r.metadata.generation,
            });
            let patch = json!({
                "metadata": {"resourceVersion": r.resource_version()},
                "status": {"conditions": conditions},
            });
            match api
                .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(r) => return Ok(r),
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => return Err(e).with_context(|| format!("setting {type_} on {name}")),
            }
        }
        bail!("request {name} kept changing")
    }

    /// Marks request `name` `Provisioned`, as cluster-autoscaler does once the capacity is there.
    pub async fn mark_request_provisioned(&self, name: &str) -> Result<ProvisioningRequest> {
        let message = "provisioned by the end-to-end test";
        self.add_request_condition(name, "Provisioned", "Provisioned", message)
            .await
    }

    /// Creates a Workload of one podset `main` of one pod requesting 1 cpu, owned by no job,
    /// submitted to LocalQueue `lq`, whose request the simulator answers with `script`. Unlike
    /// a Job's, it can be deleted without Kueue creating it again.
    pub async fn standalone_workload(&self, name: &str, script: &str) -> Result<Workload> {
        let template = crate::pod_template(json!({simulator::SCRIPT_ANNOTATION: script}), "1");
        let wl = crate::standalone_workload(&self.ns, name, json!({}), template)?;
        self.create_workload(&wl).await
    }

    /// Marks a standalone Workload `Finished` as its owner would once its pods completed (it
    /// has no Job whose pods could).
    pub async fn finish_standalone_workload(&self, name: &str) -> Result<()> {
        let patch = json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "status": {"conditions": [{
                "type": "Finished", "status": "True", "reason": "Succeeded",
                "message": "finished by the end-to-end test, as its owner would",
                "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string(),
            }]},
        });
        let params = kube::api::PatchParams::apply(crate::TEST_FIELD_MANAGER).force();
        self.workloads()
            .patch_status(name, &params, &kube::api::Patch::Apply(&patch))
            .await
            .with_context(|| format!("finishing Workload {name}"))?;
        Ok(())
    }
}

/// One provisioning test's world: its namespace, the objects of [`TestEnv::provisioning`], the
/// controller under test (while it runs) and the autoscaler simulator.
pub struct World {
    /// The test's namespace and client.
    pub env: TestEnv,
    /// Its config, check, flavor and queues.
    pub p: Provisioning,
    /// The controller under test; a test that restarts it takes it out and puts another in.
    pub controller: Option<Running>,
    /// The simulator answering this test's requests.
    pub simulator: Running,
}

impl std::fmt::Debug for World {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("World")
            .field("namespace", &self.env.ns)
            .field("p", &self.p)
            .finish_non_exhaustive()
    }
}

impl World {
    /// Config `spec`, 4 cpu of quota, the controller as tests run it (no default timeout).
    pub async fn new(test: &str, spec: Value) -> Result<Self> {
        Self::tuned(test, spec, |_| {}).await
    }

    /// [`World::new`] with `tune` applied to the controller's runtime settings.
    pub async fn tuned(
        test: &str,
        spec: Value,
        tune: impl FnOnce(&mut RuntimeConfig),
    ) -> Result<Self> {
        let env = TestEnv::new(test).await?;
        let p = env.provisioning(spec, "4").await?;
        let controller = env.start_provisioning_controller_tuned(env.client.clone(), None, tune)?;
        Self::around(env, p, controller)
    }

    /// A world of objects the test made itself, with `controller` and a new simulator.
    pub fn around(env: TestEnv, p: Provisioning, controller: Running) -> Result<Self> {
        let simulator = env.start_simulator()?;
        Ok(Self {
            env,
            p,
            controller: Some(controller),
            simulator,
        })
    }

    /// The name of attempt `attempt`'s request for `workload`.
    pub fn request(&self, workload: &str, attempt: u32) -> String {
        format!("{workload}-{}-{attempt}", self.p.check)
    }

    /// `<namespace>/<name>`, as messages name requests.
    pub fn qualified_name(&self, name: &str) -> String {
        format!("{}/{name}", self.env.ns)
    }

    /// `<namespace>/<request>` of attempt `attempt` for `workload`.
    pub fn qualified(&self, workload: &str, attempt: u32) -> String {
        self.qualified_name(&self.request(workload, attempt))
    }

    /// Our entry's message once attempt `attempt`'s request for `workload` was provisioned.
    pub fn provisioned(&self, workload: &str, attempt: u32) -> String {
        format!(
            "ProvisioningRequest {} provisioned",
            self.qualified(workload, attempt)
        )
    }

    /// Waits until the Workload is admitted; asserts our entry names attempt `attempt`'s request.
    pub async fn admitted_on_attempt(
        &self,
        workload: &str,
        attempt: u32,
    ) -> Result<(Workload, AdmissionCheckState)> {
        let admitted = self.env.wait_admitted(workload).await?;
        let entry = admitted
            .admission_check(&self.p.check)
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            entry.message,
            self.provisioned(workload, attempt),
            "{entry:#?}"
        );
        Ok((admitted, entry))
    }

    /// The controller, if it runs.
    pub fn controller(&self) -> Result<&Running> {
        self.controller
            .as_ref()
            .context("the controller is not running")
    }

    /// `name{check="<this test's check>"}`.
    pub fn series(&self, name: &str) -> String {
        format!("{name}{{check=\"{}\"}}", self.p.check)
    }

    /// A sample of the controller's metrics, 0 when the series was never written.
    pub async fn metric(&self, series: &str) -> Result<f64> {
        let text = self.controller()?.metrics().await?;
        Ok(crate::metric_sample(&text, series).unwrap_or(0.0))
    }

    /// Waits until the controller's counter `name` for this test's check reads `value`.
    pub async fn wait_counter(&self, name: &str, value: f64) -> Result<String> {
        let addr = self
            .controller()?
            .http
            .context("the controller's address")?;
        crate::wait_metric(addr, &self.series(name), value).await
    }

    /// Stops the controller (if it runs) and the simulator as SIGTERM would.
    pub async fn stop(self) -> Result<()> {
        Running::stop_all(self.controller.into_iter().chain([self.simulator])).await
    }
}

/// Whether a request of ours is owned as this controller owns it: by the PodTemplates it
/// names (one reference each, by uid), and by nothing else, a Workload least of all.
pub fn owned_by_its_templates(request: &ProvisioningRequest) -> bool {
    let owners = request.owner_references();
    let mut named: Vec<&str> = request
        .spec
        .pod_sets
        .iter()
        .map(|p| p.pod_template_ref.name.as_str())
        .collect();
    let mut owning: Vec<&str> = owners.iter().map(|o| o.name.as_str()).collect();
    named.sort_unstable();
    owning.sort_unstable();
    !owners.is_empty()
        && owners
            .iter()
            .all(|o| o.kind == "PodTemplate" && o.api_version == "v1" && !o.uid.is_empty())
        && named == owning
}

//! The SDK trait implementation: plans the attempt's buffers, creates them (with their
//! PodTemplates, owned by the Workload) as soon as quota is reserved, answers from what
//! Karpenter writes on them, and at `Ready` protects the Nodes and shrinks the buffers.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::PodTemplate;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use kueue_admission_sdk::api::Workload;
use kueue_admission_sdk::flavors::FlavorCache;
use kueue_admission_sdk::holding::{self, Holding, Lasts};
use kueue_admission_sdk::prometheus_client::registry::Registry;
use kueue_admission_sdk::watched_cache::WatchedCache;
use kueue_admission_sdk::{
    AdmissionCheckController, ApiKind, CheckContext, Decision, ErrorClass, Extensions,
    LeaderContext, QueueRule, ReleaseContext, RetryPolicy,
};
use serde_json::json;
use tracing::{info, warn};

use crate::api::{CapacityBuffer, CapacityBufferSpec, LocalObjectRef, NodeClaim, is_true};
use crate::config::{CapacityBufferCheckConfig, CapacityBufferCheckConfigSpec};
use crate::error::Error;
use crate::metrics::{Metrics, ProtectionEnd};
use crate::names;
use crate::outcome::{self, Claim, Limits, Outcome};
use crate::plan::{self, Plan, PlanInput};
use crate::protection::{self, NodeCache, Protection};

/// Settings from flags, beside the AdmissionCheck's parameters.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The `spec.controllerName` this controller answers.
    pub controller_name: String,
    /// Create the buffers when quota is reserved, before Kueue adds the check's entry.
    pub start_early: bool,
}

/// This instance's buffers, grouped by their Workload's uid.
pub type BufferCache = WatchedCache<Arc<CapacityBuffer>>;

/// What is kept of a NodeClaim: its labels, whether it is `Ready`, and its Node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimView {
    labels: BTreeMap<String, String>,
    ready: bool,
    node: Option<String>,
}

fn kept_buffer(b: &CapacityBuffer) -> Arc<CapacityBuffer> {
    let mut kept = b.clone();
    kept.metadata.managed_fields = None;
    Arc::new(kept)
}

fn buffer_group(b: &Arc<CapacityBuffer>) -> Option<String> {
    b.labels().get(names::WORKLOAD_UID_LABEL).cloned()
}

fn kept_claim(c: &NodeClaim) -> ClaimView {
    let conditions = c
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    ClaimView {
        labels: c.labels().clone(),
        ready: is_true(conditions, "Ready"),
        node: c.status.as_ref().and_then(|s| s.node_name.clone()),
    }
}

/// The plan's buffers, by name, with what the cache has under each.
type Found = Vec<(String, Option<Arc<CapacityBuffer>>)>;

/// One attempt for one Workload: its plan, namespace and uid.
struct Attempt {
    plan: Plan,
    namespace: String,
    uid: String,
}

/// The CapacityBuffer admission check.
#[derive(Clone, Debug)]
pub struct CapacityBufferCheck {
    settings: Settings,
    instance: String,
    metrics: Arc<Metrics>,
    flavors: FlavorCache,
    buffers: Arc<BufferCache>,
    claims: Arc<WatchedCache<ClaimView>>,
    nodes: Arc<NodeCache>,
    /// `(outcome, first buffer)` already counted: a decision may be computed twice.
    counted: Arc<Mutex<HashSet<(&'static str, String)>>>,
}

/// How many counted outcomes are remembered before the memory is cleared (a recount after that
/// is harmless; unbounded memory is not).
const COUNTED_MAX: usize = 10_000;

impl CapacityBufferCheck {
    /// A check answering `settings.controller_name`.
    pub fn new(settings: Settings) -> Self {
        let instance = names::instance(&settings.controller_name);
        Self {
            settings,
            instance,
            metrics: Arc::new(Metrics::default()),
            flavors: FlavorCache::default(),
            buffers: Arc::new(WatchedCache::grouped(
                "capacitybuffers.autoscaling.x-k8s.io",
                buffer_group,
            )),
            claims: Arc::new(WatchedCache::new("nodeclaims.karpenter.sh")),
            nodes: protection::node_cache(),
            counted: Default::default(),
        }
    }

    /// The instance label's value of this controller's objects.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    fn count_once(&self, outcome: &'static str, buffer: &str) -> bool {
        let mut counted = self.counted.lock().unwrap_or_else(|e| e.into_inner());
        if counted.len() >= COUNTED_MAX {
            counted.clear();
        }
        counted.insert((outcome, buffer.to_string()))
    }

    async fn plan(
        &self,
        ctx: &CheckContext<'_, CapacityBufferCheckConfig>,
    ) -> Result<Attempt, Error> {
        let wl = ctx.workload;
        let uid = wl
            .uid()
            .ok_or_else(|| Error::MalformedWorkload(wl.name_any(), "uid"))?;
        let namespace = wl
            .namespace()
            .ok_or_else(|| Error::MalformedWorkload(wl.name_any(), "namespace"))?;
        let flavors = self.flavors.assigned(wl).await?;
        let plan = plan::plan(&PlanInput {
            workload: wl,
            uid: &uid,
            check: ctx.check_name(),
            attempt: ctx.attempt(),
            flavors: &flavors,
            node_label: ctx.parameters.spec.node_label(),
        })?;
        Ok(Attempt {
            plan,
            namespace,
            uid,
        })
    }

    /// The plan's buffers as the cache has them.
    fn find(&self, namespace: &str, plan: &Plan) -> Result<Found, Error> {
        plan.buffers
            .iter()
            .map(|b| {
                let found = self.buffers.get(&(namespace.to_string(), b.name.clone()))?;
                Ok((b.name.clone(), found))
            })
            .collect()
    }

    /// The NodeClaims carrying `label=uid`.
    fn claims_of(&self, label: &str, uid: &str) -> Result<Vec<Claim>, Error> {
        let mut claims: Vec<Claim> = self
            .claims
            .select(|_, c| c.labels.get(label).is_some_and(|v| v == uid))?
            .into_iter()
            .map(|((_, name), c)| Claim {
                name,
                ready: c.ready,
                node: c.node,
            })
            .collect();
        claims.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(claims)
    }

    fn meta(
        &self,
        wl: &Workload,
        check: &str,
        uid: &str,
        attempt: u32,
        pod_set: &str,
        name: &str,
    ) -> ObjectMeta {
        let owner = OwnerReference {
            api_version: Workload::api_version(&()).into_owned(),
            kind: Workload::kind(&()).into_owned(),
            name: wl.name_any(),
            uid: uid.to_string(),
            ..Default::default()
        };
        ObjectMeta {
            name: Some(name.to_string()),
            namespace: wl.namespace(),
            labels: Some(BTreeMap::from([
                (
                    names::MANAGED_BY_LABEL.to_string(),
                    names::MANAGED_BY.to_string(),
                ),
                (names::INSTANCE_LABEL.to_string(), self.instance.clone()),
                (names::WORKLOAD_UID_LABEL.to_string(), uid.to_string()),
                (names::ATTEMPT_LABEL.to_string(), attempt.to_string()),
            ])),
            annotations: Some(BTreeMap::from([
                (names::WORKLOAD_ANNOTATION.to_string(), wl.name_any()),
                (names::CHECK_ANNOTATION.to_string(), check.to_string()),
                (names::POD_SET_ANNOTATION.to_string(), pod_set.to_string()),
            ])),
            owner_references: Some(vec![owner]),
            ..Default::default()
        }
    }

    /// Creates the missing buffers of the plan, each after its PodTemplate (a buffer without
    /// its template is `PodTemplateNotFound` to Karpenter). What exists under our names and is
    /// ours is kept.
    async fn create_missing(
        &self,
        ctx: &CheckContext<'_, CapacityBufferCheckConfig>,
        attempt: &Attempt,
        missing: &[String],
    ) -> Result<(), Error> {
        let (client, wl) = (ctx.client, ctx.workload);
        let (plan, namespace, uid) = (
            &attempt.plan,
            attempt.namespace.as_str(),
            attempt.uid.as_str(),
        );
        let (check, attempt) = (ctx.check_name(), ctx.attempt());
        let spec = &ctx.parameters.spec;
        let templates: Api<PodTemplate> = Api::namespaced(client.clone(), namespace);
        let buffers: Api<CapacityBuffer> = Api::namespaced(client.clone(), namespace);
        let mut made = 0;
        for b in plan.buffers.iter().filter(|b| missing.contains(&b.name)) {
            let meta = self.meta(wl, check, uid, attempt, &b.pod_set, &b.name);
            let template = PodTemplate {
                metadata: meta.clone(),
                template: Some(b.template.clone()),
            };
            match templates.create(&PostParams::default(), &template).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    let existing = templates.get(&b.name).await.map_err(Error::api(
                        "get",
                        "PodTemplate",
                        namespace,
                        &b.name,
                    ))?;
                    self.ours(&existing.metadata, uid, "PodTemplate", namespace, &b.name)?;
                }
                Err(e) => return Err(Error::api("create", "PodTemplate", namespace, &b.name)(e)),
            }
            let buffer = CapacityBuffer {
                metadata: meta,
                spec: CapacityBufferSpec {
                    pod_template_ref: Some(LocalObjectRef {
                        name: b.name.clone(),
                    }),
                    replicas: Some(i32::try_from(b.replicas).unwrap_or(i32::MAX)),
                    provisioning_strategy: spec.provisioning_strategy.clone(),
                },
                status: None,
            };
            let created = match buffers.create(&PostParams::default(), &buffer).await {
                Ok(created) => {
                    made += 1;
                    created
                }
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    let existing = buffers.get(&b.name).await.map_err(Error::api(
                        "get",
                        "CapacityBuffer",
                        namespace,
                        &b.name,
                    ))?;
                    self.ours(
                        &existing.metadata,
                        uid,
                        "CapacityBuffer",
                        namespace,
                        &b.name,
                    )?;
                    existing
                }
                Err(e) => {
                    return Err(Error::api("create", "CapacityBuffer", namespace, &b.name)(
                        e,
                    ));
                }
            };
            let key = (namespace.to_string(), b.name.clone());
            self.buffers.created(
                key,
                created.uid().unwrap_or_default(),
                kept_buffer(&created),
            );
        }
        if made > 0 {
            self.metrics.created(check, made);
            info!(workload = %wl.name_any(), attempt, buffers = made, pods = plan.pods, "created CapacityBuffers");
        }
        Ok(())
    }

    fn ours(
        &self,
        meta: &ObjectMeta,
        uid: &str,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Result<(), Error> {
        let labels = meta.labels.as_ref();
        let label = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
        if label(names::INSTANCE_LABEL) == Some(self.instance.as_str())
            && label(names::WORKLOAD_UID_LABEL) == Some(uid)
        {
            return Ok(());
        }
        Err(Error::NameTaken(format!(
            "{kind} {namespace}/{name}, the name this check needs for the Workload, exists and was not made by it for this Workload; delete it or rename the Workload"
        )))
    }

    /// Protects the Nodes, then shrinks the buffers to zero (marking them ready): Karpenter's
    /// next pass sees no virtual pods of the Workload, whose real pods come after admission.
    async fn hand_over(
        &self,
        ctx: &CheckContext<'_, CapacityBufferCheckConfig>,
        attempt: &Attempt,
        found: &Found,
        nodes: &[String],
    ) -> Result<(), Error> {
        let client = ctx.client;
        let (plan, namespace, uid) = (
            &attempt.plan,
            attempt.namespace.as_str(),
            attempt.uid.as_str(),
        );
        let protection = ctx.parameters.spec.protection();
        if !protection.is_zero() {
            let until = ctx.now + protection;
            let p = Protection {
                by: self.instance.clone(),
                uid: uid.to_string(),
                pods: plan.pods,
                until,
            };
            for node in nodes {
                protection::protect(client, &self.nodes, node, &p).await?;
            }
        }
        let api: Api<CapacityBuffer> = Api::namespaced(client.clone(), namespace);
        let at = ctx.now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
        for (name, _) in found {
            let patch = json!({
                "metadata": {"annotations": {names::CAPACITY_READY_ANNOTATION: at}},
                "spec": {"replicas": 0},
            });
            let shrunk = api
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(Error::api("patch", "CapacityBuffer", namespace, name))?;
            self.buffers.created(
                (namespace.to_string(), name.clone()),
                shrunk.uid().unwrap_or_default(),
                kept_buffer(&shrunk),
            );
        }
        Ok(())
    }

    /// Deletes every buffer (and template) of the Workload `uid` for `check` this instance made.
    async fn delete_buffers(
        &self,
        client: &Client,
        uid: &str,
        check: &str,
    ) -> Result<usize, Error> {
        let of_check = |_: &(String, String), b: &Arc<CapacityBuffer>| {
            b.annotations()
                .get(names::CHECK_ANNOTATION)
                .map(String::as_str)
                == Some(check)
        };
        let found = self.buffers.select_group(uid, of_check)?;
        for ((namespace, name), b) in &found {
            delete_buffer(client, &self.buffers, namespace, name, b.uid()).await?;
        }
        Ok(found.len())
    }

    fn ready(&self, plan: &Plan, message: String) -> Decision {
        Decision::ready_with_updates(message, plan.updates.clone())
    }
}

/// Deletes a buffer and its template (same name), exactly: by uid for the buffer.
async fn delete_buffer(
    client: &Client,
    cache: &BufferCache,
    namespace: &str,
    name: &str,
    uid: Option<String>,
) -> Result<(), Error> {
    let buffers: Api<CapacityBuffer> = Api::namespaced(client.clone(), namespace);
    let templates: Api<PodTemplate> = Api::namespaced(client.clone(), namespace);
    let params = DeleteParams {
        preconditions: uid.clone().map(|uid| kube::api::Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..Default::default()
    };
    for result in [
        buffers.delete(name, &params).await.map(|_| ()),
        templates
            .delete(name, &DeleteParams::default())
            .await
            .map(|_| ()),
    ] {
        match result {
            Ok(()) => {}
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => return Err(Error::api("delete", "CapacityBuffer", namespace, name)(e)),
        }
    }
    cache.deleted(
        (namespace.to_string(), name.to_string()),
        uid.unwrap_or_default(),
    );
    Ok(())
}

fn age_seconds(found: &Found, now: Timestamp) -> f64 {
    found
        .iter()
        .filter_map(|(_, b)| {
            b.as_ref()?
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0)
        })
        .min()
        .map(|t| now.duration_since(t).as_secs_f64().max(0.0))
        .unwrap_or(0.0)
}

fn list_nodes(nodes: &[String]) -> String {
    const SHOWN: usize = 5;
    let mut text = nodes
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if nodes.len() > SHOWN {
        text.push_str(&format!(" and {} more", nodes.len() - SHOWN));
    }
    text
}

impl AdmissionCheckController for CapacityBufferCheck {
    type Parameters = CapacityBufferCheckConfig;
    type Error = Error;

    fn controller_name(&self) -> &str {
        &self.settings.controller_name
    }

    fn retry_policy(&self, parameters: &CapacityBufferCheckConfig) -> RetryPolicy {
        parameters.spec.retry_policy()
    }

    fn classify_error(&self, error: &Error) -> ErrorClass {
        error.class()
    }

    fn required_apis(&self) -> Vec<ApiKind> {
        vec![
            ApiKind {
                group: "autoscaling.x-k8s.io",
                version: "v1beta1",
                kind: "CapacityBuffer",
                plural: "capacitybuffers",
            },
            ApiKind {
                group: "karpenter.sh",
                version: "v1",
                kind: "NodeClaim",
                plural: "nodeclaims",
            },
        ]
    }

    fn shadow_mode_refusal(&self) -> Option<String> {
        Some(
            "it creates CapacityBuffers, for which Karpenter launches Nodes that cost money".into(),
        )
    }

    fn register_metrics(&self, registry: &mut Registry) {
        self.metrics.register(registry);
    }

    fn starts_early(&self) -> bool {
        self.settings.start_early
    }

    fn while_leading(&self) -> Extensions {
        let (flavors, buffers, claims, nodes) = (
            self.flavors.shared(),
            self.buffers.clone(),
            self.claims.clone(),
            self.nodes.clone(),
        );
        let (instance, metrics) = (self.instance.clone(), self.metrics.clone());
        let claim_buffers = self.buffers.clone();
        let protect_instance = self.instance.clone();
        Extensions::new()
            .while_leading("resourceflavors", move |ctx| {
                FlavorCache::watch(flavors, ctx)
            })
            .while_leading("capacitybuffers", move |ctx| {
                watch_buffers(ctx, buffers, instance)
            })
            .while_leading("nodeclaims", move |ctx| {
                watch_claims(ctx, claims, claim_buffers)
            })
            .while_leading("node-protection", move |ctx| {
                protection::watch_protections(ctx, nodes, metrics, protect_instance)
            })
    }

    async fn start_early(
        &self,
        ctx: &CheckContext<'_, CapacityBufferCheckConfig>,
    ) -> Result<(), Error> {
        let attempt = self.plan(ctx).await?;
        let found = self.find(&attempt.namespace, &attempt.plan)?;
        let missing: Vec<String> = found
            .iter()
            .filter(|(_, b)| b.is_none())
            .map(|(n, _)| n.clone())
            .collect();
        if !missing.is_empty() {
            self.create_missing(ctx, &attempt, &missing).await?;
        }
        Ok(())
    }

    async fn decide(
        &self,
        ctx: &CheckContext<'_, CapacityBufferCheckConfig>,
    ) -> Result<Decision, Error> {
        let spec: &CapacityBufferCheckConfigSpec = &ctx.parameters.spec;
        let check = ctx.check_name();
        let attempt = self.plan(ctx).await?;
        let plan = &attempt.plan;
        let found = self.find(&attempt.namespace, plan)?;
        let claims = self.claims_of(spec.node_label(), &attempt.uid)?;
        let limits = Limits {
            timeout: spec.provisioning_timeout(),
            unprovisionable_grace: spec.unprovisionable_grace(),
        };
        let refs: Vec<(String, Option<&CapacityBuffer>)> = found
            .iter()
            .map(|(n, b)| (n.clone(), b.as_deref()))
            .collect();
        let first = plan
            .buffers
            .first()
            .map(|b| b.name.clone())
            .unwrap_or_default();
        match outcome::outcome(&refs, &claims, limits, ctx.now) {
            Outcome::Missing(missing) => {
                self.create_missing(ctx, &attempt, &missing).await?;
                Ok(Decision::pending_recheck_after(
                    format!(
                        "asked Karpenter for capacity for {} pods (CapacityBuffer {})",
                        plan.pods,
                        missing.join(", ")
                    ),
                    limits.timeout,
                ))
            }
            Outcome::AlreadyReady => Ok(self.ready(
                plan,
                format!("Karpenter's capacity for {} pods is ready", plan.pods),
            )),
            Outcome::CapacityReady { nodes } => {
                self.hand_over(ctx, &attempt, &found, &nodes).await?;
                if self.count_once("capacity_ready", &first) {
                    self.metrics
                        .capacity_ready(check, age_seconds(&found, ctx.now));
                }
                info!(workload = %ctx.workload.name_any(), nodes = nodes.len(), "capacity ready; Nodes protected, buffers shrunk");
                Ok(self.ready(
                    plan,
                    format!(
                        "Karpenter's capacity for {} pods is ready on {} Node(s): {}",
                        plan.pods,
                        nodes.len(),
                        list_nodes(&nodes)
                    ),
                ))
            }
            Outcome::TimedOut(after) => {
                if self.count_once("timed_out", &first) {
                    self.metrics.outcome(check, "timed_out");
                }
                Ok(Decision::retry(format!(
                    "Karpenter's capacity for {} pods was not ready within {} s (provisioningTimeoutSeconds)",
                    plan.pods,
                    after.as_secs()
                )))
            }
            Outcome::Unprovisionable(message) => {
                if self.count_once("unprovisionable", &first) {
                    self.metrics.outcome(check, "unprovisionable");
                }
                Err(Error::Unprovisionable(message))
            }
            Outcome::Unresolved(message) => {
                if self.count_once("unresolved", &first) {
                    self.metrics.outcome(check, "unresolved");
                }
                Err(Error::Unresolved(message))
            }
            Outcome::Waiting {
                message,
                recheck_after,
            } => Ok(Decision::Pending {
                message,
                recheck_after,
            }),
        }
    }

    async fn release(&self, ctx: &ReleaseContext<'_>) -> Result<(), Error> {
        let Some(uid) = ctx.workload.and_then(|w| w.uid()) else {
            // Gone before it was read: the garbage collector deletes what it owned; the
            // protection task ends its Nodes' protection once the Workload is not in the cache.
            return Ok(());
        };
        let deleted = self
            .delete_buffers(ctx.client, &uid, ctx.check_name)
            .await?;
        let released =
            protection::unprotect_workload(ctx.client, &self.nodes, &self.instance, &uid).await?;
        for _ in 0..released {
            self.metrics.protection_ended(ProtectionEnd::Released);
        }
        if deleted + released > 0 {
            info!(
                workload = ctx.name,
                reason = ctx.reason.as_str(),
                buffers = deleted,
                nodes = released,
                "released"
            );
        }
        Ok(())
    }
}

/// Watches this instance's buffers: keeps the cache, wakes a buffer's Workload on each change,
/// and deletes what no Workload needs (made for an earlier attempt, or for a Workload that lost
/// its quota or finished while no replica led).
async fn watch_buffers(ctx: LeaderContext, cache: Arc<BufferCache>, instance: String) {
    use futures::StreamExt;
    let api: Api<CapacityBuffer> = Api::all(ctx.client.clone());
    let config =
        watcher::Config::default().labels(&format!("{}={instance}", names::INSTANCE_LABEL));
    let mut events = std::pin::pin!(cache.clone().watch(api, config, kept_buffer));
    while let Some(event) = events.next().await {
        let buffer = match event {
            watcher::Event::Apply(b) | watcher::Event::InitApply(b) => b,
            _ => continue,
        };
        let namespace = buffer.namespace().unwrap_or_default();
        let Some(name) = buffer
            .annotations()
            .get(names::WORKLOAD_ANNOTATION)
            .cloned()
        else {
            continue;
        };
        let workload = ctx.workloads.get(&ObjectRef::new(&name).within(&namespace));
        let uid = buffer
            .labels()
            .get(names::WORKLOAD_UID_LABEL)
            .cloned()
            .unwrap_or_default();
        let check = buffer
            .annotations()
            .get(names::CHECK_ANNOTATION)
            .cloned()
            .unwrap_or_default();
        let attempt = buffer
            .labels()
            .get(names::ATTEMPT_LABEL)
            .and_then(|a| a.parse().ok())
            .unwrap_or(u32::MAX);
        let held = Holding {
            uid: &uid,
            check: &check,
            lasts: Lasts::ForTheAttempt(attempt),
        };
        let expected = workload
            .as_deref()
            .is_some_and(|wl| ctx.cluster_queues.rule_for(wl, &check) != QueueRule::DoesNotApply);
        match holding::stale_reason_expecting_entry(&held, workload.as_deref(), None, expected) {
            Some(why) => {
                let result = delete_buffer(
                    &ctx.client,
                    &cache,
                    &namespace,
                    &buffer.name_any(),
                    buffer.uid(),
                )
                .await;
                match result {
                    Ok(()) => {
                        info!(buffer = %buffer.name_any(), %namespace, why, "deleted a CapacityBuffer no Workload needs")
                    }
                    Err(e) => {
                        warn!(buffer = %buffer.name_any(), error = %e, "could not delete a CapacityBuffer no Workload needs")
                    }
                }
            }
            None => ctx.waker.wake(&namespace, &name).await,
        }
    }
}

/// Watches NodeClaims: keeps the cache and wakes the Workload whose uid a claim carries as a
/// label value (found through its buffers).
async fn watch_claims(
    ctx: LeaderContext,
    cache: Arc<WatchedCache<ClaimView>>,
    buffers: Arc<BufferCache>,
) {
    use futures::StreamExt;
    let api: Api<NodeClaim> = Api::all(ctx.client.clone());
    let mut events = std::pin::pin!(cache.clone().watch(
        api,
        watcher::Config::default(),
        kept_claim
    ));
    while let Some(event) = events.next().await {
        let claim = match event {
            watcher::Event::Apply(c) | watcher::Event::Delete(c) => c,
            _ => continue,
        };
        let mut woken = HashSet::new();
        for value in claim.labels().values() {
            let Ok(found) = buffers.select_group(value, |_, _| true) else {
                continue;
            };
            for ((namespace, _), b) in found {
                if let Some(name) = b.annotations().get(names::WORKLOAD_ANNOTATION)
                    && woken.insert((namespace.clone(), name.clone()))
                {
                    ctx.waker.wake(&namespace, name).await;
                }
            }
        }
    }
}

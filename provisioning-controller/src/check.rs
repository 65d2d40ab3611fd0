//! The SDK trait implementation: reads the Workload and its config, creates the attempt's
//! PodTemplates and ProvisioningRequest, and answers from the request's conditions.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::PodTemplate;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};
use kueue_admission_sdk::api::{
    CheckState, ProvisioningRequest, ResourceFlavor, ResourceFlavorSpec, Workload,
    workload_condition as cond,
};
use kueue_admission_sdk::prometheus_client::registry::Registry;
use kueue_admission_sdk::{
    AdmissionCheckController, CheckContext, Decision, ReleaseContext, RetryPolicy,
};
use tracing::{info, warn};

use crate::cleanup;
use crate::config::ProvisioningParameters;
use crate::error::Error;
use crate::metrics::Metrics;
use crate::names;
use crate::outcome::{self, Outcome};
use crate::plan::{self, Plan, PlanInput, RequestPlan};

/// Settings that are not in Kueue's `ProvisioningRequestConfig`.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The `spec.controllerName` this controller answers.
    pub controller_name: String,
    /// Timeout for configs without the timeout annotation; `None` waits forever (as Kueue).
    pub default_timeout: Option<Duration>,
}

/// The ProvisioningRequest admission check.
#[derive(Clone, Debug)]
pub struct ProvisioningCheck {
    settings: Settings,
    /// Value of the label that ties requests and templates to this controller instance.
    instance: String,
    metrics: Arc<Metrics>,
    /// Requests whose timeout was already counted (a decision may be computed twice).
    timed_out: Arc<Mutex<HashSet<String>>>,
}

impl ProvisioningCheck {
    /// A check answering `settings.controller_name`.
    pub fn new(settings: Settings) -> Self {
        let instance = cleanup::instance_label(&settings.controller_name);
        Self {
            settings,
            instance,
            metrics: Arc::new(Metrics::new()),
            timed_out: Default::default(),
        }
    }

    /// The metrics, shared with the task that watches requests.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// The label value that marks this instance's requests and templates.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// The ResourceFlavors assigned to the Workload, by name.
    async fn assigned_flavors(
        &self,
        client: &Client,
        wl: &Workload,
    ) -> Result<BTreeMap<String, ResourceFlavorSpec>, Error> {
        let api: Api<ResourceFlavor> = Api::all(client.clone());
        let mut flavors = BTreeMap::new();
        let names: HashSet<&String> = wl
            .status
            .as_ref()
            .and_then(|s| s.admission.as_ref())
            .map(|a| {
                a.pod_set_assignments
                    .iter()
                    .flat_map(|p| p.flavors.values())
                    .collect()
            })
            .unwrap_or_default();
        for name in names {
            // A missing flavor is left out; the plan says which one it needed.
            if let Some(f) = api.get_opt(name).await? {
                flavors.insert(name.clone(), f.spec);
            }
        }
        Ok(flavors)
    }

    /// Creates the attempt's PodTemplates, then its request, then makes the request the
    /// templates' owner (so that deleting the request collects them). Existing objects of the
    /// same names (a restart between two steps) are kept.
    async fn create(
        &self,
        client: &Client,
        wl: &Workload,
        check: &str,
        attempt: u32,
        plan: &RequestPlan,
    ) -> Result<ProvisioningRequest, Error> {
        let namespace = wl.namespace().unwrap_or_default();
        let templates: Api<PodTemplate> = Api::namespaced(client.clone(), &namespace);
        let requests: Api<ProvisioningRequest> = Api::namespaced(client.clone(), &namespace);
        let mut template_objects =
            plan::pod_template_objects(plan, wl, check, attempt, cleanup::MANAGED_BY);
        for t in &mut template_objects {
            t.labels_mut()
                .insert(cleanup::INSTANCE_LABEL.into(), self.instance.clone());
            match templates.create(&PostParams::default(), t).await {
                Ok(_) => {}
                Err(e) if is_already_exists(&e) => {
                    // Ours from an interrupted earlier pass is kept; a predecessor's is replaced.
                    let existing = templates.get(&t.name_any()).await?;
                    if !made_for(&existing, wl) {
                        cleanup::delete_exactly(&templates, &existing).await?;
                        templates.create(&PostParams::default(), t).await?;
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        let mut request = plan::request_object(plan, wl, check, attempt, cleanup::MANAGED_BY);
        request
            .labels_mut()
            .insert(cleanup::INSTANCE_LABEL.into(), self.instance.clone());
        let created = match requests.create(&PostParams::default(), &request).await {
            Ok(r) => {
                self.metrics.created(check, attempt);
                info!(request = %plan.name, attempt, "created ProvisioningRequest");
                r
            }
            Err(e) if is_already_exists(&e) => {
                // Created meanwhile; decide() checks whose it is on the next pass.
                requests.get(&plan.name).await?
            }
            Err(e) => return Err(e.into()),
        };
        // Never make a predecessor's request (same name, another Workload) the owner: the
        // garbage collector would take our templates with it.
        if let Some(owner) = created
            .controller_owner_ref(&())
            .filter(|_| made_for(&created, wl))
        {
            let owner = OwnerReference {
                controller: Some(false),
                block_owner_deletion: Some(false),
                ..owner
            };
            for t in &template_objects {
                let patch = serde_json::json!({"metadata": {"ownerReferences": [owner]}});
                if let Err(e) = templates
                    .patch(
                        &t.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await
                {
                    // Only garbage collection needs it; release and the sweep delete templates.
                    warn!(template = %t.name_any(), error = %e, "setting the template's owner");
                }
            }
        }
        Ok(created)
    }

    /// For a `Ready` entry: withdraw it only if the capacity was revoked, or the booking expired
    /// before admission. Anything else keeps the answer exactly as written (no write).
    async fn revalidate(
        &self,
        ctx: &CheckContext<'_, ProvisioningParameters>,
        namespace: &str,
    ) -> Result<Decision, Error> {
        let keep = Decision::Ready {
            message: ctx.entry.message.clone(),
            pod_set_updates: ctx.entry.pod_set_updates.clone(),
        };
        let name = names::request_name(&ctx.workload.name_any(), &ctx.entry.name, ctx.attempt());
        let api: Api<ProvisioningRequest> = Api::namespaced(ctx.client.clone(), namespace);
        let Some(request) = api
            .get_opt(&name)
            .await?
            .filter(|r| made_for(r, ctx.workload))
        else {
            return Ok(keep);
        };
        let admitted = ctx.workload.condition_is_true(cond::ADMITTED);
        let o = outcome::outcome(&request, admitted, None, ctx.now);
        Ok(match o {
            Outcome::Revoked(_) | Outcome::BookingExpired(_) => {
                outcome::decision(&o, &format!("{namespace}/{name}"), ctx.attempt(), Vec::new)
            }
            _ => keep,
        })
    }
}

/// Whether an existing request is the one `plan` describes (class, parameters, podsets).
fn matches_plan(plan: &RequestPlan, request: &ProvisioningRequest) -> bool {
    let spec = &request.spec;
    spec.provisioning_class_name == plan.provisioning_class_name
        && spec.parameters == plan.parameters
        && spec.pod_sets.len() == plan.pod_sets.len()
        && spec
            .pod_sets
            .iter()
            .zip(&plan.pod_sets)
            .all(|(have, want)| {
                have.pod_template_ref.name == want.template_name && have.count == want.count
            })
}

pub(crate) fn is_already_exists(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409 && s.reason == "AlreadyExists")
}

pub(crate) fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// Whether an object of ours was made for this Workload (same uid), not for a predecessor of
/// the same name.
fn made_for(object: &impl ResourceExt, wl: &Workload) -> bool {
    object.labels().get(plan::WORKLOAD_UID_LABEL) == wl.uid().as_ref()
}

pub(crate) fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

impl AdmissionCheckController for ProvisioningCheck {
    type Parameters = ProvisioningParameters;
    type Error = Error;

    fn controller_name(&self) -> &str {
        &self.settings.controller_name
    }

    fn retry_policy(&self, parameters: &ProvisioningParameters) -> RetryPolicy {
        parameters.retry_policy()
    }

    // Capacity can be revoked after admission: a change of the request wakes the Workload and
    // its Ready answer is read again.
    fn revalidate_ready_on_change(&self) -> bool {
        true
    }

    fn register_metrics(&self, registry: &mut Registry) {
        self.metrics.register(registry);
    }

    async fn decide(
        &self,
        ctx: &CheckContext<'_, ProvisioningParameters>,
    ) -> Result<Decision, Error> {
        let wl = ctx.workload;
        let namespace = wl
            .namespace()
            .ok_or_else(|| Error::MalformedWorkload(wl.name_any(), "namespace"))?;
        if ctx.entry.state == CheckState::Ready {
            return self.revalidate(ctx, &namespace).await;
        }
        let check = ctx.entry.name.as_str();
        let attempt = ctx.attempt();
        let config = &ctx.parameters.spec;
        let flavors = self.assigned_flavors(ctx.client, wl).await?;
        let plan = plan::plan(&PlanInput {
            workload: wl,
            check,
            attempt,
            config,
            flavors: &flavors,
        })?;
        let plan = match plan {
            Plan::NotNeeded => {
                return Ok(Decision::ready(
                    "no podset needs capacity: the provisioning request is not needed",
                ));
            }
            Plan::Request(p) => p,
        };
        let qualified = format!("{namespace}/{}", plan.name);
        let api: Api<ProvisioningRequest> = Api::namespaced(ctx.client.clone(), &namespace);
        let existing = api.get_opt(&plan.name).await?;
        let request = match existing {
            None => {
                // A new attempt: what earlier attempts left behind goes first.
                cleanup::delete_requests_of(ctx.client, &self.instance, wl, check, |r| {
                    names::attempt_of(&r.name_any()).is_some_and(|a| a < attempt)
                })
                .await?;
                self.create(ctx.client, wl, check, attempt, &plan).await?;
                return Ok(Decision::pending(format!(
                    "created ProvisioningRequest {qualified} (attempt {attempt}); waiting for it to \
                     be provisioned"
                )));
            }
            Some(r) if r.metadata.deletion_timestamp.is_some() => {
                return Ok(Decision::pending(format!(
                    "waiting for the old ProvisioningRequest {qualified} to be deleted"
                )));
            }
            Some(r) if !made_for(&r, wl) => {
                // Left by a deleted Workload of the same name: never adopt its capacity.
                cleanup::delete_request(ctx.client, &r).await?;
                return Ok(Decision::pending(format!(
                    "replacing ProvisioningRequest {qualified}, left by an earlier Workload of the \
                     same name"
                )));
            }
            Some(r) => r,
        };
        if !matches_plan(&plan, &request) {
            // The config changed since the request was made (the request spec is immutable).
            // The desired request already includes the Workload's annotation overrides, so a
            // request made from them is never judged out of date: no recreate loop.
            cleanup::delete_request(ctx.client, &request).await?;
            return Ok(Decision::pending(format!(
                "ProvisioningRequest {qualified} no longer matches ProvisioningRequestConfig {}; \
                 recreating it",
                ctx.parameters.metadata.name
            )));
        }
        let timeout = ctx.parameters.timeout(self.settings.default_timeout);
        let admitted = wl.condition_is_true(cond::ADMITTED);
        let o = outcome::outcome(&request, admitted, timeout, ctx.now);
        if matches!(o, Outcome::TimedOut(_)) {
            let first = self
                .timed_out
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(request.uid().unwrap_or_default());
            if first {
                self.metrics.timed_out(check);
            }
        }
        let members: Vec<String> = plan
            .pod_sets
            .iter()
            .flat_map(|p| p.members.iter().cloned())
            .collect();
        let node_selector = ctx.parameters.node_selector_updates();
        Ok(outcome::decision(&o, &qualified, attempt, || {
            outcome::pod_set_updates(&request, &members, node_selector)
        }))
    }

    async fn release(&self, ctx: &ReleaseContext<'_>) -> Result<(), Error> {
        let Some(wl) = ctx.workload else {
            return Ok(());
        };
        let deleted =
            cleanup::delete_requests_of(ctx.client, &self.instance, wl, ctx.check_name, |_| true)
                .await?;
        if deleted > 0 {
            info!(
                workload = %ctx.name,
                namespace = %ctx.namespace,
                check = %ctx.check_name,
                reason = ctx.reason.as_str(),
                deleted,
                "deleted ProvisioningRequests"
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_instance_label_differs_per_controller_name() {
        let a = ProvisioningCheck::new(Settings {
            controller_name: "a.example.com/provisioning".into(),
            default_timeout: None,
        });
        let b = ProvisioningCheck::new(Settings {
            controller_name: "b.example.com/provisioning".into(),
            default_timeout: None,
        });
        assert_ne!(a.instance(), b.instance());
        assert!(a.instance().len() <= 63);
    }

    #[test]
    fn api_error_kinds() {
        let status = |code, reason: &str| {
            kube::Error::Api(
                kube::core::Status::failure("x", reason)
                    .with_code(code)
                    .boxed(),
            )
        };
        assert!(is_already_exists(&status(409, "AlreadyExists")));
        assert!(!is_already_exists(&status(409, "Conflict")));
        assert!(is_not_found(&status(404, "NotFound")));
    }
}

//! Which ProvisioningRequest (and PodTemplates) an attempt of a check needs, decided without I/O.
//!
//! The rules are those of Kueue's built-in provisioning check:
//! - a podset needs capacity when its count and its assigned count are positive and, when the
//!   config lists `managedResources`, one of its containers or init containers requests or
//!   limits one of them; when none does, no request is needed;
//! - a podset's PodTemplate is its template plus, from every ResourceFlavor assigned to it, the
//!   node labels (as nodeSelector) and the tolerations, with limits copied into missing requests;
//! - with a `podSetMergePolicy`, a podset joins the first earlier group it matches and the
//!   counts add up. Templates are compared as the Workload holds them, before the flavors'
//!   additions, as Kueue does; in addition, podsets are merged only when their flavors add the
//!   same node labels and tolerations, since one PodTemplate cannot ask for two kinds of nodes;
//! - the request's parameters are the config's, overlaid by the Workload's annotations prefixed
//!   with [`PARAMETER_ANNOTATION_PREFIX`] (prefix stripped, the annotation wins).
//!
//! Requests and PodTemplates carry labels and annotations that identify their Workload, check
//! and attempt. For the garbage collector, the Workload owns the templates and the templates own
//! their request ([`template_owners`]), so deleting the Workload removes both without this
//! controller. The request names no Workload as its owner: Kueue's built-in controller deletes
//! any ProvisioningRequest with an ownerReference named like a Workload that holds quota,
//! whichever check it is for.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::{Container, PodTemplate, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;
use kueue_admission_sdk::api::{
    PodSet, PodTemplateReference, ProvisioningRequest, ProvisioningRequestConfigSpec,
    ProvisioningRequestPodSet, ProvisioningRequestSpec, ResourceFlavorSpec, Workload,
};

use crate::identity::{
    ATTEMPT_ANNOTATION, CHECK_ANNOTATION, MANAGED_BY_LABEL, REQUEST_ANNOTATION,
    WORKLOAD_ANNOTATION, WORKLOAD_UID_LABEL,
};
use crate::names;

mod merge;

use kueue_admission_sdk::pod_template::{FlavorAdditions, TemplateError, build_template};
pub use merge::MergePolicy;

/// Workload annotations with this prefix become request parameters (prefix stripped).
pub const PARAMETER_ANNOTATION_PREFIX: &str = "provreq.kueue.x-k8s.io/";
/// Longest parameter value a ProvisioningRequest accepts.
pub const MAX_PARAMETER_LEN: usize = 255;
/// Most parameters a ProvisioningRequest accepts.
pub const MAX_PARAMETERS: usize = 100;

/// What [`plan`] needs to know.
#[derive(Clone, Copy, Debug)]
pub struct PlanInput<'a> {
    /// The Workload, holding quota: `status.admission.podSetAssignments` is read.
    pub workload: &'a Workload,
    /// The AdmissionCheck's name.
    pub check: &'a str,
    /// The attempt, from 1 (Kueue's `retryCount` + 1).
    pub attempt: u32,
    /// The check's parameters (Kueue's ProvisioningRequestConfig).
    pub config: &'a ProvisioningRequestConfigSpec,
    /// ResourceFlavor name → spec, at least the flavors assigned to the Workload.
    pub flavors: &'a BTreeMap<String, ResourceFlavorSpec>,
}

/// What an attempt of the check needs.
#[derive(Clone, Debug, PartialEq)]
pub enum Plan {
    /// No podset needs capacity: the check can be Ready without a request.
    NotNeeded,
    /// This request, with one PodTemplate per entry of `pod_sets`.
    Request(RequestPlan),
}

/// The ProvisioningRequest an attempt needs.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestPlan {
    /// The request's name ([`names::request_name`]).
    pub name: String,
    /// `spec.provisioningClassName`.
    pub provisioning_class_name: String,
    /// `spec.parameters`: the config's, overlaid by the Workload's parameter annotations.
    pub parameters: BTreeMap<String, String>,
    /// The request's podsets, in the Workload's podset order, after merging.
    pub pod_sets: Vec<PlannedPodSet>,
}

impl RequestPlan {
    /// The same request under another name (and its PodTemplates under the matching names).
    pub fn renamed(&self, name: &str) -> RequestPlan {
        let mut plan = self.clone();
        plan.name = name.to_string();
        for ps in &mut plan.pod_sets {
            let owner = ps.members.first().map(String::as_str).unwrap_or_default();
            ps.template_name = names::pod_template_name(name, owner);
        }
        plan
    }
}

/// One podset of the request, standing for one or more (merged) podsets of the Workload.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedPodSet {
    /// The PodTemplate's name ([`names::pod_template_name`] of the request and first member).
    pub template_name: String,
    /// The first member's template with its flavors' node labels and tolerations, and limits
    /// copied into missing requests.
    pub template: PodTemplateSpec,
    /// Assigned pods, summed over the members.
    pub count: i32,
    /// The Workload podsets this one stands for, in Workload order; the first owns the template.
    pub members: Vec<String>,
}

/// Why no plan can be made. The messages are meant for the Workload's check message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The Workload holds no quota, so nothing says which flavors and counts it got.
    #[error("the Workload holds no quota reservation (status.admission is empty)")]
    NoQuotaReservation,
    /// The config has no provisioningClassName.
    #[error("the ProvisioningRequestConfig has no provisioningClassName")]
    MissingProvisioningClass,
    /// The config's podSetMergePolicy is not one Kueue defines.
    #[error(
        "unknown podSetMergePolicy {0:?} in the ProvisioningRequestConfig: expected IdenticalPodTemplates or IdenticalWorkloadSchedulingRequirements"
    )]
    UnknownMergePolicy(String),
    /// A podset that needs capacity has no entry in `status.admission.podSetAssignments`.
    #[error("podset {pod_set:?} has no entry in the Workload's status.admission.podSetAssignments")]
    MissingAssignment {
        /// The podset.
        pod_set: String,
    },
    /// A flavor assigned to a podset is not among the known ResourceFlavors.
    #[error("ResourceFlavor {flavor:?}, assigned to podset {pod_set:?}, was not found")]
    UnknownFlavor {
        /// The podset.
        pod_set: String,
        /// The flavor's name.
        flavor: String,
    },
    /// A flavor's node label gives another value to a key already set by the podset's
    /// nodeSelector or by another of its flavors.
    #[error("{0}")]
    NodeLabelConflict(Box<LabelConflict>),
    /// A parameter value is longer than a ProvisioningRequest accepts (the value itself is
    /// never kept: it may be anything a user wrote).
    #[error(
        "parameter {key:?} ({from}) is {len} characters long; a ProvisioningRequest accepts at most 255"
    )]
    ParameterTooLong {
        /// The parameter's name.
        key: String,
        /// Its length in characters.
        len: usize,
        /// Where the value comes from.
        from: ParameterSource,
    },
    /// More parameters than a ProvisioningRequest accepts.
    #[error(
        "{count} parameters ({from_annotations} of them only from Workload annotations); a ProvisioningRequest accepts at most 100"
    )]
    TooManyParameters {
        /// How many there are.
        count: usize,
        /// How many of them the config does not have (added by Workload annotations).
        from_annotations: usize,
    },
    /// The counts of merged podsets add up beyond what a request podset can hold.
    #[error("the pod counts merged into podset {pod_set:?} exceed {}", i32::MAX)]
    CountTooLarge {
        /// The group's first podset.
        pod_set: String,
    },
}

/// Where a request parameter's value comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParameterSource {
    /// The Workload's annotation [`PARAMETER_ANNOTATION_PREFIX`]`<key>`, which wins over the
    /// config.
    WorkloadAnnotation,
    /// The ProvisioningRequestConfig's `spec.parameters`.
    Config,
}

impl fmt::Display for ParameterSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ParameterSource::WorkloadAnnotation => "from a Workload annotation",
            ParameterSource::Config => "from the ProvisioningRequestConfig",
        })
    }
}

pub use kueue_admission_sdk::pod_template::LabelConflict;

impl From<TemplateError> for PlanError {
    fn from(e: TemplateError) -> Self {
        match e {
            TemplateError::UnknownFlavor { pod_set, flavor } => {
                PlanError::UnknownFlavor { pod_set, flavor }
            }
            TemplateError::NodeLabelConflict(c) => PlanError::NodeLabelConflict(c),
        }
    }
}

/// Decides which request (if any) this attempt of the check needs for the Workload.
pub fn plan(input: &PlanInput<'_>) -> Result<Plan, PlanError> {
    let config = input.config;
    let policy = MergePolicy::from_config(config.pod_set_merge_policy.as_deref())?;
    if config.provisioning_class_name.is_empty() {
        return Err(PlanError::MissingProvisioningClass);
    }
    let workload = input.workload;
    let assignments = &workload
        .status
        .as_ref()
        .and_then(|s| s.admission.as_ref())
        .ok_or(PlanError::NoQuotaReservation)?
        .pod_set_assignments;

    let mut groups: Vec<Group<'_>> = Vec::new();
    for pod_set in &workload.spec.pod_sets {
        if pod_set.count <= 0 || !uses_any(pod_set, &config.managed_resources) {
            continue;
        }
        let assignment = assignments
            .iter()
            .find(|a| a.name == pod_set.name)
            .ok_or_else(|| PlanError::MissingAssignment {
                pod_set: pod_set.name.clone(),
            })?;
        let count = assignment.count.unwrap_or(pod_set.count);
        if count <= 0 {
            continue;
        }
        let additions =
            FlavorAdditions::of(&pod_set.name, assignment.flavors.values(), input.flavors)?;
        let template = build_template(pod_set, &additions)?;

        join_or_add(&mut groups, policy, pod_set, additions, template, count)?;
    }
    if groups.is_empty() {
        return Ok(Plan::NotNeeded);
    }

    let name = names::request_name(&workload.name_any(), input.check, input.attempt);
    let parameters = parameters(config, workload)?;
    let pod_sets = groups
        .into_iter()
        .map(|g| PlannedPodSet {
            template_name: names::pod_template_name(&name, &g.owner.name),
            template: g.template,
            count: g.count,
            members: g.members,
        })
        .collect();
    Ok(Plan::Request(RequestPlan {
        name,
        provisioning_class_name: config.provisioning_class_name.clone(),
        parameters,
        pod_sets,
    }))
}

/// Adds `pod_set` to the group it merges with under `policy` (same flavor additions, templates
/// that match), or as a group of its own.
fn join_or_add<'a>(
    groups: &mut Vec<Group<'a>>,
    policy: Option<MergePolicy>,
    pod_set: &'a PodSet,
    additions: FlavorAdditions,
    template: PodTemplateSpec,
    count: i32,
) -> Result<(), PlanError> {
    let joined = policy.and_then(|policy| {
        groups.iter_mut().find(|g| {
            g.additions.same_as(&additions) && policy.matches(&g.owner.template, &pod_set.template)
        })
    });
    match joined {
        Some(group) => {
            group.count =
                group
                    .count
                    .checked_add(count)
                    .ok_or_else(|| PlanError::CountTooLarge {
                        pod_set: group.owner.name.clone(),
                    })?;
            group.members.push(pod_set.name.clone());
        }
        None => groups.push(Group {
            owner: pod_set,
            additions,
            template,
            count,
            members: vec![pod_set.name.clone()],
        }),
    }
    Ok(())
}

/// The ProvisioningRequest of a plan, in the Workload's namespace, identified by labels and
/// annotations and owned by `templates` (the PodTemplates made for it, see
/// [`template_owners`]).
pub fn request_object(
    plan: &RequestPlan,
    workload: &Workload,
    check: &str,
    attempt: u32,
    managed_by: &str,
    templates: &[PodTemplate],
) -> ProvisioningRequest {
    let spec = ProvisioningRequestSpec {
        pod_sets: plan
            .pod_sets
            .iter()
            .map(|ps| ProvisioningRequestPodSet {
                pod_template_ref: PodTemplateReference {
                    name: ps.template_name.clone(),
                },
                count: ps.count,
            })
            .collect(),
        provisioning_class_name: plan.provisioning_class_name.clone(),
        parameters: plan.parameters.clone(),
    };
    let mut request = ProvisioningRequest::new(&plan.name, spec);
    request.metadata = identification(&plan.name, workload, check, attempt, managed_by);
    let owners = template_owners(templates);
    request.metadata.owner_references = (!owners.is_empty()).then_some(owners);
    request
}

/// The request's owners: every PodTemplate made for it (those with a uid, that is, created).
///
/// This is the garbage collector's chain from the Workload (which owns the templates) to the
/// request, and how clean-up tells a request's own templates from a successor's of the same
/// names: by uid. A request with several owners goes when the last one is gone; the templates
/// all belong to the same Workload, so that is when the Workload goes. None is a controller
/// reference or blocks deletion.
pub fn template_owners(templates: &[PodTemplate]) -> Vec<OwnerReference> {
    templates
        .iter()
        .filter_map(|t| {
            Some(OwnerReference {
                api_version: "v1".into(),
                kind: "PodTemplate".into(),
                name: t.metadata.name.clone()?,
                uid: t.metadata.uid.clone()?,
                controller: Some(false),
                block_owner_deletion: Some(false),
            })
        })
        .collect()
}

/// The uids of the PodTemplates that own `request` (see [`template_owners`]); empty for a
/// request made before templates owned requests.
pub fn owner_template_uids(request: &ProvisioningRequest) -> Vec<&str> {
    request
        .metadata
        .owner_references
        .iter()
        .flatten()
        .filter(|o| o.kind == "PodTemplate" && o.api_version == "v1")
        .map(|o| o.uid.as_str())
        .collect()
}

/// The PodTemplates of a plan, in the Workload's namespace, identified by labels and annotations
/// (including [`REQUEST_ANNOTATION`]) and owned by the Workload (its ownerReference, so that the
/// garbage collector deletes them, and the request they own, with it).
pub fn pod_template_objects(
    plan: &RequestPlan,
    workload: &Workload,
    check: &str,
    attempt: u32,
    managed_by: &str,
) -> Vec<PodTemplate> {
    plan.pod_sets
        .iter()
        .map(|ps| {
            let mut metadata =
                identification(&ps.template_name, workload, check, attempt, managed_by);
            metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(REQUEST_ANNOTATION.to_string(), plan.name.clone());
            metadata.owner_references = workload_owner(workload).map(|o| vec![o]);
            PodTemplate {
                metadata,
                template: Some(ps.template.clone()),
            }
        })
        .collect()
}

/// The Workload as the templates' owner, for the garbage collector: in the create itself, so
/// no second request sets it. The templates own the request in turn ([`template_owners`]), not
/// the other way round as Kueue's built-in check ends up doing with an update per template: the
/// request's uid exists only after the templates, which are made first on purpose (see
/// `check.rs`). A template whose request is deleted by someone else is deleted by the request
/// watch, or by the template sweep when no replica ran. Not a controller reference, and never
/// blocking the Workload's deletion.
fn workload_owner(workload: &Workload) -> Option<OwnerReference> {
    Some(OwnerReference {
        api_version: "kueue.x-k8s.io/v1beta2".into(),
        kind: "Workload".into(),
        name: workload.name_any(),
        uid: workload.uid()?,
        controller: Some(false),
        block_owner_deletion: Some(false),
    })
}

fn identification(
    name: &str,
    workload: &Workload,
    check: &str,
    attempt: u32,
    managed_by: &str,
) -> ObjectMeta {
    let mut labels = BTreeMap::from([(MANAGED_BY_LABEL.to_string(), managed_by.to_string())]);
    if let Some(uid) = workload.uid() {
        labels.insert(WORKLOAD_UID_LABEL.to_string(), uid);
    }
    let annotations = BTreeMap::from([
        (WORKLOAD_ANNOTATION.to_string(), workload.name_any()),
        (CHECK_ANNOTATION.to_string(), check.to_string()),
        (ATTEMPT_ANNOTATION.to_string(), attempt.to_string()),
    ]);
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: workload.namespace(),
        labels: Some(labels),
        annotations: Some(annotations),
        ..ObjectMeta::default()
    }
}

/// A request podset being assembled.
struct Group<'a> {
    owner: &'a PodSet,
    additions: FlavorAdditions,
    template: PodTemplateSpec,
    count: i32,
    members: Vec<String>,
}

/// The config's parameters overlaid by the Workload's parameter annotations.
fn parameters(
    config: &ProvisioningRequestConfigSpec,
    workload: &Workload,
) -> Result<BTreeMap<String, String>, PlanError> {
    let mut parameters = config.parameters.clone();
    let overrides = annotation_parameters(workload);
    for (name, value) in &overrides {
        parameters.insert(name.clone(), (*value).clone());
    }
    // The checks the ProvisioningRequest CRD makes on spec.parameters (maxProperties 100,
    // maxLength 255 per value, counted in characters), made before anything is created so that
    // the answer names the annotation to fix rather than the API server's field path.
    if parameters.len() > MAX_PARAMETERS {
        return Err(PlanError::TooManyParameters {
            count: parameters.len(),
            from_annotations: overrides
                .keys()
                .filter(|k| !config.parameters.contains_key(*k))
                .count(),
        });
    }
    for (key, value) in &parameters {
        let len = value.chars().count();
        if len > MAX_PARAMETER_LEN {
            let from = if overrides.contains_key(key) {
                ParameterSource::WorkloadAnnotation
            } else {
                ParameterSource::Config
            };
            return Err(PlanError::ParameterTooLong {
                key: key.clone(),
                len,
                from,
            });
        }
    }
    Ok(parameters)
}

/// The request parameters the Workload's annotations set: annotation
/// [`PARAMETER_ANNOTATION_PREFIX`]`<key>` → `<key>`.
pub fn annotation_parameters(workload: &Workload) -> BTreeMap<String, &String> {
    workload
        .annotations()
        .iter()
        .filter_map(|(key, value)| {
            key.strip_prefix(PARAMETER_ANNOTATION_PREFIX)
                .filter(|name| !name.is_empty())
                .map(|name| (name.to_string(), value))
        })
        .collect()
}

/// Whether any container or init container of the podset requests or limits one of
/// `resources`; true when `resources` is empty.
fn uses_any(pod_set: &PodSet, resources: &[String]) -> bool {
    if resources.is_empty() {
        return true;
    }
    let Some(spec) = pod_set.template.spec.as_ref() else {
        return false;
    };
    let uses = |c: &Container| {
        c.resources.as_ref().is_some_and(|r| {
            [&r.requests, &r.limits]
                .into_iter()
                .flatten()
                .flat_map(|list| list.keys())
                .any(|name| resources.contains(name))
        })
    };
    spec.init_containers.iter().flatten().any(uses) || spec.containers.iter().any(uses)
}

#[cfg(test)]
mod tests;

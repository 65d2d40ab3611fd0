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
//! and attempt, and no ownerReference to the Workload: Kueue's built-in controller deletes any
//! ProvisioningRequest with an ownerReference named like a Workload it handles.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::core::v1::{
    Container, PodSpec, PodTemplate, PodTemplateSpec, ResourceRequirements, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kueue_admission_sdk::api::{
    ExactQuantity, PodSet, PodTemplateReference, ProvisioningRequest,
    ProvisioningRequestConfigSpec, ProvisioningRequestPodSet, ProvisioningRequestSpec,
    ResourceFlavorSpec, Workload,
};
use serde::Serialize;
use serde_json::Value;

use crate::names;

/// Label naming the controller that manages the object; its value is the `managed_by` argument.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Label holding the uid of the Workload the object was made for.
pub const WORKLOAD_UID_LABEL: &str = "kueue-admission-checks.dev/workload-uid";
/// Annotation holding the name of the Workload the object was made for.
pub const WORKLOAD_ANNOTATION: &str = "kueue-admission-checks.dev/workload";
/// Annotation holding the name of the AdmissionCheck the object was made for.
pub const CHECK_ANNOTATION: &str = "kueue-admission-checks.dev/check";
/// Annotation holding the attempt (1-based) the object was made for.
pub const ATTEMPT_ANNOTATION: &str = "kueue-admission-checks.dev/attempt";
/// Annotation of PodTemplates holding the name of their ProvisioningRequest.
pub const REQUEST_ANNOTATION: &str = "kueue-admission-checks.dev/request";
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

/// `podSetMergePolicy` of a ProvisioningRequestConfig.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MergePolicy {
    /// Merge podsets whose templates are equal.
    IdenticalPodTemplates,
    /// Merge podsets with equal container and init container requests (same number of each),
    /// pod-level resources, nodeSelector, tolerations, affinity and resourceClaims.
    IdenticalWorkloadSchedulingRequirements,
}

impl MergePolicy {
    /// The value used in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            MergePolicy::IdenticalPodTemplates => "IdenticalPodTemplates",
            MergePolicy::IdenticalWorkloadSchedulingRequirements => {
                "IdenticalWorkloadSchedulingRequirements"
            }
        }
    }

    /// The policy of a config value: `None` or `""` means never merge.
    pub fn from_config(value: Option<&str>) -> Result<Option<Self>, PlanError> {
        match value {
            None | Some("") => Ok(None),
            Some("IdenticalPodTemplates") => Ok(Some(MergePolicy::IdenticalPodTemplates)),
            Some("IdenticalWorkloadSchedulingRequirements") => {
                Ok(Some(MergePolicy::IdenticalWorkloadSchedulingRequirements))
            }
            Some(other) => Err(PlanError::UnknownMergePolicy(other.to_string())),
        }
    }

    /// Whether a podset with template `b` may join a group whose first podset has template `a`.
    pub fn matches(self, a: &PodTemplateSpec, b: &PodTemplateSpec) -> bool {
        match self {
            MergePolicy::IdenticalPodTemplates => {
                semantic("template", a) == semantic("template", b)
            }
            MergePolicy::IdenticalWorkloadSchedulingRequirements => {
                same_scheduling_requirements(a, b)
            }
        }
    }
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

/// Details of [`PlanError::NodeLabelConflict`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabelConflict {
    /// The podset.
    pub pod_set: String,
    /// The label key.
    pub key: String,
    /// The flavor's value.
    pub value: String,
    /// The flavor.
    pub flavor: String,
    /// The value already set.
    pub existing: String,
    /// The flavor the value already set comes from; `None` for the podset's nodeSelector.
    pub existing_flavor: Option<String>,
}

impl fmt::Display for LabelConflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let LabelConflict {
            pod_set,
            key,
            value,
            flavor,
            existing,
            existing_flavor,
        } = self;
        write!(
            f,
            "podset {pod_set:?}: node label {key}={value} of ResourceFlavor {flavor:?} conflicts with {key}={existing} from "
        )?;
        match existing_flavor {
            Some(other) => write!(f, "ResourceFlavor {other:?}"),
            None => f.write_str("the podset's nodeSelector"),
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

        let joined = policy.and_then(|policy| {
            groups.iter_mut().find(|g| {
                g.additions.same_as(&additions)
                    && policy.matches(&g.owner.template, &pod_set.template)
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

/// The ProvisioningRequest of a plan, in the Workload's namespace, identified by labels and
/// annotations and without ownerReferences.
pub fn request_object(
    plan: &RequestPlan,
    workload: &Workload,
    check: &str,
    attempt: u32,
    managed_by: &str,
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
    request
}

/// The PodTemplates of a plan, in the Workload's namespace, identified by labels and annotations
/// (including [`REQUEST_ANNOTATION`]) and without ownerReferences.
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
            PodTemplate {
                metadata,
                template: Some(ps.template.clone()),
            }
        })
        .collect()
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

/// Node labels and tolerations the flavors assigned to a podset add to its template.
#[derive(Debug, Default)]
struct FlavorAdditions {
    /// Label key → (value, flavor it comes from).
    node_labels: BTreeMap<String, (String, String)>,
    tolerations: Vec<Toleration>,
}

impl FlavorAdditions {
    fn of<'f>(
        pod_set: &str,
        assigned: impl IntoIterator<Item = &'f String>,
        flavors: &BTreeMap<String, ResourceFlavorSpec>,
    ) -> Result<Self, PlanError> {
        let mut additions = FlavorAdditions::default();
        let mut seen = BTreeSet::new();
        for flavor in assigned {
            if !seen.insert(flavor) {
                continue;
            }
            let spec = flavors
                .get(flavor)
                .ok_or_else(|| PlanError::UnknownFlavor {
                    pod_set: pod_set.to_string(),
                    flavor: flavor.clone(),
                })?;
            for (key, value) in &spec.node_labels {
                match additions.node_labels.get(key) {
                    Some((existing, from)) if existing != value => {
                        return Err(PlanError::NodeLabelConflict(Box::new(LabelConflict {
                            pod_set: pod_set.to_string(),
                            key: key.clone(),
                            value: value.clone(),
                            flavor: flavor.clone(),
                            existing: existing.clone(),
                            existing_flavor: Some(from.clone()),
                        })));
                    }
                    Some(_) => {}
                    None => {
                        additions
                            .node_labels
                            .insert(key.clone(), (value.clone(), flavor.clone()));
                    }
                }
            }
            for toleration in &spec.tolerations {
                add_toleration(&mut additions.tolerations, toleration);
            }
        }
        Ok(additions)
    }

    fn is_empty(&self) -> bool {
        self.node_labels.is_empty() && self.tolerations.is_empty()
    }

    /// Whether both add the same labels and tolerations, whichever flavors they come from.
    fn same_as(&self, other: &FlavorAdditions) -> bool {
        self.node_labels.len() == other.node_labels.len()
            && self
                .node_labels
                .iter()
                .zip(&other.node_labels)
                .all(|((k1, (v1, _)), (k2, (v2, _)))| k1 == k2 && v1 == v2)
            && self.tolerations.len() == other.tolerations.len()
            && self
                .tolerations
                .iter()
                .zip(&other.tolerations)
                .all(|(a, b)| same_toleration(a, b))
    }
}

/// Appends `toleration` unless an equal one is there already.
fn add_toleration(tolerations: &mut Vec<Toleration>, toleration: &Toleration) {
    if !tolerations.iter().any(|t| same_toleration(t, toleration)) {
        tolerations.push(toleration.clone());
    }
}

/// Kubernetes' toleration equality: key, effect, operator (empty meaning `Equal`) and value;
/// `tolerationSeconds` is not compared.
fn same_toleration(a: &Toleration, b: &Toleration) -> bool {
    fn text(s: &Option<String>) -> &str {
        s.as_deref().unwrap_or("")
    }
    fn operator(t: &Toleration) -> &str {
        match text(&t.operator) {
            "" => "Equal",
            op => op,
        }
    }
    text(&a.key) == text(&b.key)
        && text(&a.effect) == text(&b.effect)
        && operator(a) == operator(b)
        && text(&a.value) == text(&b.value)
}

/// The PodTemplate of a podset: its template, the flavors' additions, limits as missing requests.
fn build_template(
    pod_set: &PodSet,
    additions: &FlavorAdditions,
) -> Result<PodTemplateSpec, PlanError> {
    let mut template = pod_set.template.clone();
    if !additions.is_empty() {
        let spec = template.spec.get_or_insert_with(PodSpec::default);
        if !additions.node_labels.is_empty() {
            let selector = spec.node_selector.get_or_insert_with(BTreeMap::new);
            for (key, (value, flavor)) in &additions.node_labels {
                match selector.get(key) {
                    Some(existing) if existing != value => {
                        return Err(PlanError::NodeLabelConflict(Box::new(LabelConflict {
                            pod_set: pod_set.name.clone(),
                            key: key.clone(),
                            value: value.clone(),
                            flavor: flavor.clone(),
                            existing: existing.clone(),
                            existing_flavor: None,
                        })));
                    }
                    Some(_) => {}
                    None => {
                        selector.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        if !additions.tolerations.is_empty() {
            let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
            for toleration in &additions.tolerations {
                add_toleration(tolerations, toleration);
            }
        }
    }
    if let Some(spec) = template.spec.as_mut() {
        limits_as_missing_requests(spec);
    }
    Ok(template)
}

/// Copies each limit without a request into the requests, for every container, init container
/// and the pod-level resources.
fn limits_as_missing_requests(spec: &mut PodSpec) {
    fn fill(resources: &mut ResourceRequirements) {
        let Some(limits) = resources.limits.as_ref().filter(|l| !l.is_empty()) else {
            return;
        };
        let requests = resources.requests.get_or_insert_with(BTreeMap::new);
        for (name, quantity) in limits {
            requests
                .entry(name.clone())
                .or_insert_with(|| quantity.clone());
        }
    }
    let containers = spec
        .init_containers
        .iter_mut()
        .flatten()
        .chain(spec.containers.iter_mut());
    for container in containers {
        if let Some(resources) = container.resources.as_mut() {
            fill(resources);
        }
    }
    if let Some(resources) = spec.resources.as_mut() {
        fill(resources);
    }
}

/// `IdenticalWorkloadSchedulingRequirements`.
fn same_scheduling_requirements(a: &PodTemplateSpec, b: &PodTemplateSpec) -> bool {
    let empty = PodSpec::default();
    let a = a.spec.as_ref().unwrap_or(&empty);
    let b = b.spec.as_ref().unwrap_or(&empty);
    let no_containers: Vec<Container> = Vec::new();
    same_requests(&a.containers, &b.containers)
        && same_requests(
            a.init_containers.as_ref().unwrap_or(&no_containers),
            b.init_containers.as_ref().unwrap_or(&no_containers),
        )
        && semantic("resources", &a.resources) == semantic("resources", &b.resources)
        && semantic("nodeSelector", &a.node_selector) == semantic("nodeSelector", &b.node_selector)
        && semantic("tolerations", &a.tolerations) == semantic("tolerations", &b.tolerations)
        && semantic("affinity", &a.affinity) == semantic("affinity", &b.affinity)
        && semantic("resourceClaims", &a.resource_claims)
            == semantic("resourceClaims", &b.resource_claims)
}

/// Same number of containers, and equal requests container by container.
fn same_requests(a: &[Container], b: &[Container]) -> bool {
    let requests = |c: &Container| {
        let requests = c.resources.as_ref().and_then(|r| r.requests.as_ref());
        semantic("requests", &requests)
    };
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| requests(x) == requests(y))
}

/// Object keys whose value, when empty, means the same as no value: Go maps (which Kubernetes
/// omits when empty) and structs held by value.
const EMPTY_MEANS_ABSENT: &[&str] = &[
    "annotations",
    "labels",
    "limits",
    "matchLabels",
    "metadata",
    "nodeSelector",
    "overhead",
    "requests",
    "resources",
];

/// Object keys whose values are maps of resource quantities.
const QUANTITY_MAPS: &[&str] = &["limits", "overhead", "requests"];

/// A value reduced to what Kubernetes' semantic equality compares: no nulls, no empty lists,
/// no empty maps, and quantities in canonical form (`1` equals `1000m`). `None` for nothing.
fn semantic<T: Serialize + ?Sized>(key: &str, value: &T) -> Option<Value> {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| normalize(key, v))
}

fn normalize(key: &str, value: Value) -> Option<Value> {
    match value {
        Value::Null => None,
        Value::Array(items) => {
            let items: Vec<Value> = items
                .into_iter()
                .map(|item| normalize("", item).unwrap_or(Value::Null))
                .collect();
            (!items.is_empty()).then_some(Value::Array(items))
        }
        Value::Object(map) => {
            let quantities = QUANTITY_MAPS.contains(&key);
            let map: serde_json::Map<String, Value> = map
                .into_iter()
                .filter_map(|(k, v)| {
                    let v = match v {
                        Value::String(s) if quantities => Value::String(canonical_quantity(&s)),
                        other => normalize(&k, other)?,
                    };
                    Some((k, v))
                })
                .collect();
            if map.is_empty() && EMPTY_MEANS_ABSENT.contains(&key) {
                None
            } else {
                Some(Value::Object(map))
            }
        }
        Value::String(s) if key == "sizeLimit" => Some(Value::String(canonical_quantity(&s))),
        other => Some(other),
    }
}

/// A resource quantity written so that equal amounts read the same (`1`, `1000m` and `1e0`
/// all become `1e0`). A string that does not parse is returned unchanged.
fn canonical_quantity(text: &str) -> String {
    text.parse::<ExactQuantity>()
        .map_or_else(|_| text.to_string(), |q| q.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    use k8s_openapi::api::core::v1::{
        Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use kueue_admission_sdk::api::{Admission, PodSetAssignment, WorkloadSpec, WorkloadStatus};

    fn resources(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, Quantity>> {
        (!pairs.is_empty()).then(|| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                .collect()
        })
    }

    fn container(name: &str, requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Container {
        Container {
            name: name.into(),
            image: Some(format!("img-{name}")),
            resources: Some(ResourceRequirements {
                requests: resources(requests),
                limits: resources(limits),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn pod_set(name: &str, count: i32, containers: Vec<Container>) -> PodSet {
        PodSet {
            name: name.into(),
            count,
            template: PodTemplateSpec {
                spec: Some(PodSpec {
                    containers,
                    ..Default::default()
                }),
                ..Default::default()
            },
            min_count: None,
        }
    }

    fn cpu_pod_set(name: &str, count: i32) -> PodSet {
        pod_set(name, count, vec![container("main", &[("cpu", "1")], &[])])
    }

    fn spec_of(ps: &mut PodSet) -> &mut PodSpec {
        ps.template.spec.get_or_insert_with(Default::default)
    }

    /// A Workload holding quota: every podset assigned `flavor` for cpu, with its own count.
    fn workload(pod_sets: Vec<PodSet>, flavor: &str) -> Workload {
        let assignments = pod_sets
            .iter()
            .map(|ps| PodSetAssignment {
                name: ps.name.clone(),
                flavors: BTreeMap::from([("cpu".to_string(), flavor.to_string())]),
                count: Some(ps.count),
                ..Default::default()
            })
            .collect();
        let mut wl = Workload::new(
            "job-1",
            WorkloadSpec {
                pod_sets,
                ..Default::default()
            },
        );
        wl.metadata.namespace = Some("team-a".into());
        wl.metadata.uid = Some("uid-1".into());
        wl.status = Some(WorkloadStatus {
            admission: Some(Admission {
                cluster_queue: "cq".into(),
                pod_set_assignments: assignments,
            }),
            ..Default::default()
        });
        wl
    }

    fn assignment_mut<'a>(wl: &'a mut Workload, name: &str) -> &'a mut PodSetAssignment {
        wl.status
            .as_mut()
            .and_then(|s| s.admission.as_mut())
            .and_then(|a| a.pod_set_assignments.iter_mut().find(|p| p.name == name))
            .expect("assignment")
    }

    fn config() -> ProvisioningRequestConfigSpec {
        ProvisioningRequestConfigSpec {
            provisioning_class_name: "check-capacity.autoscaling.x-k8s.io".into(),
            ..Default::default()
        }
    }

    fn toleration(key: &str, value: &str) -> Toleration {
        Toleration {
            key: Some(key.into()),
            operator: Some("Equal".into()),
            value: Some(value.into()),
            effect: Some("NoSchedule".into()),
            toleration_seconds: None,
        }
    }

    fn flavors() -> BTreeMap<String, ResourceFlavorSpec> {
        BTreeMap::from([
            ("default".to_string(), ResourceFlavorSpec::default()),
            (
                "spot".to_string(),
                ResourceFlavorSpec {
                    node_labels: BTreeMap::from([
                        ("pool".to_string(), "spot".to_string()),
                        ("zone".to_string(), "a".to_string()),
                    ]),
                    tolerations: vec![toleration("spot", "true")],
                },
            ),
            (
                "gpu".to_string(),
                ResourceFlavorSpec {
                    node_labels: BTreeMap::from([("accelerator".to_string(), "a100".to_string())]),
                    tolerations: vec![toleration("nvidia.com/gpu", "present")],
                },
            ),
            (
                "other-pool".to_string(),
                ResourceFlavorSpec {
                    node_labels: BTreeMap::from([("pool".to_string(), "other".to_string())]),
                    tolerations: vec![],
                },
            ),
        ])
    }

    fn run(wl: &Workload, config: &ProvisioningRequestConfigSpec) -> Result<Plan, PlanError> {
        plan(&PlanInput {
            workload: wl,
            check: "prov",
            attempt: 1,
            config,
            flavors: &flavors(),
        })
    }

    fn request(wl: &Workload, config: &ProvisioningRequestConfigSpec) -> RequestPlan {
        match run(wl, config) {
            Ok(Plan::Request(r)) => r,
            other => panic!("expected a request, got {other:?}"),
        }
    }

    fn members(r: &RequestPlan) -> Vec<(Vec<&str>, i32)> {
        r.pod_sets
            .iter()
            .map(|p| (p.members.iter().map(String::as_str).collect(), p.count))
            .collect()
    }

    fn with_policy(policy: &str) -> ProvisioningRequestConfigSpec {
        ProvisioningRequestConfigSpec {
            pod_set_merge_policy: Some(policy.into()),
            ..config()
        }
    }

    fn pod_spec(p: &PlannedPodSet) -> &PodSpec {
        p.template.spec.as_ref().expect("spec")
    }

    #[test]
    fn one_podset_one_request() {
        let wl = workload(vec![cpu_pod_set("main", 4)], "default");
        let r = request(&wl, &config());
        assert_eq!(r.name, "job-1-prov-1");
        assert_eq!(
            r.provisioning_class_name,
            "check-capacity.autoscaling.x-k8s.io"
        );
        assert!(r.parameters.is_empty());
        assert_eq!(members(&r), vec![(vec!["main"], 4)]);
        assert_eq!(r.pod_sets[0].template_name, "ppt-job-1-prov-1-main");
        assert_eq!(r.pod_sets[0].template, wl.spec.pod_sets[0].template);
    }

    #[test]
    fn attempt_goes_into_the_names() {
        let wl = workload(vec![cpu_pod_set("main", 1)], "default");
        let r = match plan(&PlanInput {
            workload: &wl,
            check: "prov",
            attempt: 3,
            config: &config(),
            flavors: &flavors(),
        }) {
            Ok(Plan::Request(r)) => r,
            other => panic!("{other:?}"),
        };
        assert_eq!(r.name, names::request_name("job-1", "prov", 3));
        assert_eq!(r.pod_sets[0].template_name, "ppt-job-1-prov-3-main");
    }

    #[test]
    fn not_needed_when_every_count_is_zero() {
        let wl = workload(vec![cpu_pod_set("a", 0), cpu_pod_set("b", 0)], "default");
        assert_eq!(run(&wl, &config()), Ok(Plan::NotNeeded));
    }

    #[test]
    fn zero_assigned_count_is_skipped() {
        let mut wl = workload(vec![cpu_pod_set("a", 3), cpu_pod_set("b", 2)], "default");
        assignment_mut(&mut wl, "a").count = Some(0);
        assert_eq!(members(&request(&wl, &config())), vec![(vec!["b"], 2)]);
        assignment_mut(&mut wl, "b").count = Some(0);
        assert_eq!(run(&wl, &config()), Ok(Plan::NotNeeded));
    }

    #[test]
    fn counts_come_from_the_assignment_then_the_podset() {
        let mut wl = workload(vec![cpu_pod_set("a", 5), cpu_pod_set("b", 7)], "default");
        assignment_mut(&mut wl, "a").count = Some(3); // partial admission
        assignment_mut(&mut wl, "b").count = None;
        assert_eq!(
            members(&request(&wl, &config())),
            vec![(vec!["a"], 3), (vec!["b"], 7)]
        );
    }

    #[test]
    fn managed_resources_select_podsets() {
        let gpu = pod_set(
            "gpu",
            2,
            vec![container(
                "main",
                &[("cpu", "1"), ("nvidia.com/gpu", "1")],
                &[],
            )],
        );
        let wl = workload(vec![cpu_pod_set("cpu", 3), gpu], "default");
        let config = ProvisioningRequestConfigSpec {
            managed_resources: vec!["nvidia.com/gpu".into()],
            ..config()
        };
        assert_eq!(members(&request(&wl, &config)), vec![(vec!["gpu"], 2)]);
    }

    #[test]
    fn managed_resources_count_limits_and_init_containers() {
        let limits_only = pod_set(
            "limits",
            1,
            vec![container(
                "main",
                &[("cpu", "1")],
                &[("nvidia.com/gpu", "1")],
            )],
        );
        let mut init = cpu_pod_set("init", 2);
        spec_of(&mut init).init_containers =
            Some(vec![container("setup", &[("nvidia.com/gpu", "1")], &[])]);
        let wl = workload(vec![limits_only, cpu_pod_set("cpu", 3), init], "default");
        let config = ProvisioningRequestConfigSpec {
            managed_resources: vec!["nvidia.com/gpu".into()],
            ..config()
        };
        assert_eq!(
            members(&request(&wl, &config)),
            vec![(vec!["limits"], 1), (vec!["init"], 2)]
        );
    }

    #[test]
    fn not_needed_when_no_podset_uses_managed_resources() {
        let wl = workload(vec![cpu_pod_set("a", 3)], "default");
        let config = ProvisioningRequestConfigSpec {
            managed_resources: vec!["nvidia.com/gpu".into()],
            ..config()
        };
        assert_eq!(run(&wl, &config), Ok(Plan::NotNeeded));
    }

    #[test]
    fn skipped_podsets_need_no_assignment() {
        let mut wl = workload(vec![cpu_pod_set("a", 3), cpu_pod_set("b", 0)], "default");
        let admission = wl.status.as_mut().and_then(|s| s.admission.as_mut());
        admission
            .expect("admission")
            .pod_set_assignments
            .retain(|a| a.name == "a");
        assert_eq!(members(&request(&wl, &config())), vec![(vec!["a"], 3)]);
    }

    #[test]
    fn flavor_node_labels_and_tolerations_are_added() {
        let mut ps = cpu_pod_set("main", 2);
        let spec = spec_of(&mut ps);
        spec.node_selector = Some(BTreeMap::from([("zone".to_string(), "a".to_string())]));
        // Already there, written with the default operator: not added twice.
        spec.tolerations = Some(vec![Toleration {
            operator: None,
            ..toleration("spot", "true")
        }]);
        let wl = workload(vec![ps], "spot");
        let r = request(&wl, &config());
        let spec = pod_spec(&r.pod_sets[0]);
        assert_eq!(
            spec.node_selector,
            Some(BTreeMap::from([
                ("pool".to_string(), "spot".to_string()),
                ("zone".to_string(), "a".to_string()),
            ]))
        );
        assert_eq!(spec.tolerations.as_ref().map(Vec::len), Some(1));
    }

    #[test]
    fn every_assigned_flavor_contributes() {
        let ps = pod_set(
            "main",
            1,
            vec![container(
                "main",
                &[("cpu", "1"), ("nvidia.com/gpu", "1")],
                &[],
            )],
        );
        let mut wl = workload(vec![ps], "spot");
        assignment_mut(&mut wl, "main")
            .flavors
            .insert("nvidia.com/gpu".into(), "gpu".into());
        let r = request(&wl, &config());
        let spec = pod_spec(&r.pod_sets[0]);
        let selector = spec.node_selector.as_ref().expect("nodeSelector");
        assert_eq!(
            selector.get("accelerator").map(String::as_str),
            Some("a100")
        );
        assert_eq!(selector.get("pool").map(String::as_str), Some("spot"));
        let keys: Vec<_> = spec
            .tolerations
            .iter()
            .flatten()
            .map(|t| t.key.as_deref().unwrap_or(""))
            .collect();
        // Flavors in the order of their resource names: cpu, then nvidia.com/gpu.
        assert_eq!(keys, vec!["spot", "nvidia.com/gpu"]);
    }

    #[test]
    fn template_node_selector_conflicting_with_a_flavor_is_an_error() {
        let mut ps = cpu_pod_set("main", 1);
        spec_of(&mut ps).node_selector = Some(BTreeMap::from([(
            "pool".to_string(),
            "on-demand".to_string(),
        )]));
        let wl = workload(vec![ps], "spot");
        let err = run(&wl, &config()).expect_err("conflict");
        assert!(matches!(err, PlanError::NodeLabelConflict(ref c) if c.key == "pool"));
        let message = err.to_string();
        assert!(message.contains("pool=spot"), "{message}");
        assert!(message.contains("pool=on-demand"), "{message}");
        assert!(message.contains("nodeSelector"), "{message}");
    }

    #[test]
    fn flavors_with_conflicting_labels_are_an_error() {
        let ps = pod_set(
            "main",
            1,
            vec![container("main", &[("cpu", "1"), ("memory", "1Gi")], &[])],
        );
        let mut wl = workload(vec![ps], "spot");
        assignment_mut(&mut wl, "main")
            .flavors
            .insert("memory".into(), "other-pool".into());
        let err = run(&wl, &config()).expect_err("conflict");
        assert_eq!(
            err,
            PlanError::NodeLabelConflict(Box::new(LabelConflict {
                pod_set: "main".into(),
                key: "pool".into(),
                value: "other".into(),
                flavor: "other-pool".into(),
                existing: "spot".into(),
                existing_flavor: Some("spot".into()),
            }))
        );
        assert!(
            err.to_string().contains("from ResourceFlavor \"spot\""),
            "{err}"
        );
    }

    #[test]
    fn unknown_flavor_is_named() {
        let wl = workload(vec![cpu_pod_set("main", 1)], "vanished");
        let err = run(&wl, &config()).expect_err("unknown flavor");
        assert_eq!(
            err,
            PlanError::UnknownFlavor {
                pod_set: "main".into(),
                flavor: "vanished".into()
            }
        );
        assert!(err.to_string().contains("\"vanished\""));
    }

    #[test]
    fn missing_assignment_is_an_error() {
        let mut wl = workload(vec![cpu_pod_set("a", 1), cpu_pod_set("b", 1)], "default");
        let admission = wl.status.as_mut().and_then(|s| s.admission.as_mut());
        admission
            .expect("admission")
            .pod_set_assignments
            .retain(|a| a.name == "a");
        assert_eq!(
            run(&wl, &config()),
            Err(PlanError::MissingAssignment {
                pod_set: "b".into()
            })
        );
    }

    #[test]
    fn no_quota_reservation_is_an_error() {
        let mut wl = workload(vec![cpu_pod_set("a", 1)], "default");
        wl.status = None;
        assert_eq!(run(&wl, &config()), Err(PlanError::NoQuotaReservation));
    }

    #[test]
    fn config_errors() {
        let wl = workload(vec![cpu_pod_set("a", 1)], "default");
        let no_class = ProvisioningRequestConfigSpec::default();
        assert_eq!(
            run(&wl, &no_class),
            Err(PlanError::MissingProvisioningClass)
        );
        let err = run(&wl, &with_policy("Sometimes")).expect_err("bad policy");
        assert_eq!(err, PlanError::UnknownMergePolicy("Sometimes".into()));
        assert!(err.to_string().contains("IdenticalPodTemplates"));
        assert!(run(&wl, &with_policy("")).is_ok());
    }

    #[test]
    fn limits_are_copied_into_missing_requests() {
        let mut ps = pod_set(
            "main",
            1,
            vec![container(
                "main",
                &[("cpu", "500m")],
                &[("cpu", "2"), ("memory", "1Gi")],
            )],
        );
        let spec = spec_of(&mut ps);
        spec.init_containers = Some(vec![container("init", &[], &[("cpu", "1")])]);
        spec.resources = Some(ResourceRequirements {
            limits: resources(&[("memory", "4Gi")]),
            ..Default::default()
        });
        let wl = workload(vec![ps], "default");
        let r = request(&wl, &config());
        let spec = pod_spec(&r.pod_sets[0]);
        let requests = |c: &Container| c.resources.as_ref().and_then(|r| r.requests.clone());
        assert_eq!(
            requests(&spec.containers[0]),
            resources(&[("cpu", "500m"), ("memory", "1Gi")])
        );
        let init = &spec.init_containers.as_ref().expect("init")[0];
        assert_eq!(requests(init), resources(&[("cpu", "1")]));
        assert_eq!(
            spec.resources.as_ref().and_then(|r| r.requests.clone()),
            resources(&[("memory", "4Gi")])
        );
        // The Workload itself is untouched.
        assert_eq!(
            requests(
                &wl.spec.pod_sets[0]
                    .template
                    .spec
                    .as_ref()
                    .expect("spec")
                    .containers[0]
            ),
            resources(&[("cpu", "500m")])
        );
    }

    #[test]
    fn without_a_policy_nothing_is_merged() {
        let wl = workload(vec![cpu_pod_set("a", 1), cpu_pod_set("b", 2)], "default");
        assert_eq!(
            members(&request(&wl, &config())),
            vec![(vec!["a"], 1), (vec!["b"], 2)]
        );
    }

    #[test]
    fn identical_pod_templates_merge_into_the_first_match() {
        let big = pod_set("b", 2, vec![container("main", &[("cpu", "4")], &[])]);
        let wl = workload(vec![cpu_pod_set("a", 1), big, cpu_pod_set("c", 3)], "spot");
        let r = request(&wl, &with_policy("IdenticalPodTemplates"));
        assert_eq!(members(&r), vec![(vec!["a", "c"], 4), (vec!["b"], 2)]);
        assert_eq!(r.pod_sets[0].template_name, "ppt-job-1-prov-1-a");
        assert_eq!(r.pod_sets[1].template_name, "ppt-job-1-prov-1-b");
        // The merged template is the first member's, with the flavor's additions.
        let selector = pod_spec(&r.pod_sets[0]).node_selector.clone();
        assert_eq!(
            selector.and_then(|s| s.get("pool").cloned()),
            Some("spot".into())
        );
    }

    #[test]
    fn identical_pod_templates_compare_the_whole_template() {
        let a = cpu_pod_set("a", 1);
        let mut b = cpu_pod_set("b", 1);
        spec_of(&mut b).containers[0].image = Some("other".into());
        let wl = workload(vec![a, b], "default");
        let r = request(&wl, &with_policy("IdenticalPodTemplates"));
        assert_eq!(members(&r).len(), 2);
    }

    #[test]
    fn identical_pod_templates_compare_quantities_by_value() {
        let a = pod_set(
            "a",
            1,
            vec![container("main", &[("cpu", "1"), ("memory", "1Gi")], &[])],
        );
        let b = pod_set(
            "b",
            2,
            vec![container(
                "main",
                &[("cpu", "1000m"), ("memory", "1024Mi")],
                &[],
            )],
        );
        let wl = workload(vec![a, b], "default");
        let r = request(&wl, &with_policy("IdenticalPodTemplates"));
        assert_eq!(members(&r), vec![(vec!["a", "b"], 3)]);
    }

    #[test]
    fn templates_are_compared_before_the_flavor_additions() {
        // b writes in its template what a's flavor adds; Kueue compares the templates as the
        // Workload holds them, so they differ.
        let a = cpu_pod_set("a", 1);
        let mut b = cpu_pod_set("b", 1);
        let spec = spec_of(&mut b);
        spec.node_selector = Some(BTreeMap::from([
            ("pool".to_string(), "spot".to_string()),
            ("zone".to_string(), "a".to_string()),
        ]));
        spec.tolerations = Some(vec![toleration("spot", "true")]);
        let wl = workload(vec![a, b], "spot");
        let r = request(&wl, &with_policy("IdenticalPodTemplates"));
        assert_eq!(members(&r).len(), 2);
        assert_eq!(r.pod_sets[0].template, r.pod_sets[1].template);
    }

    #[test]
    fn podsets_on_different_flavors_are_not_merged() {
        let mut wl = workload(vec![cpu_pod_set("a", 1), cpu_pod_set("b", 1)], "default");
        assignment_mut(&mut wl, "b")
            .flavors
            .insert("cpu".into(), "spot".into());
        for policy in [
            "IdenticalPodTemplates",
            "IdenticalWorkloadSchedulingRequirements",
        ] {
            assert_eq!(members(&request(&wl, &with_policy(policy))).len(), 2);
        }
    }

    #[test]
    fn scheduling_requirements_ignore_what_does_not_schedule() {
        let a = pod_set(
            "a",
            1,
            vec![
                container("x", &[("cpu", "1")], &[]),
                container("y", &[("memory", "1Gi")], &[]),
            ],
        );
        // Other names, images and limits, the same requests in the same order.
        let b = pod_set(
            "b",
            2,
            vec![
                container("p", &[("cpu", "1000m")], &[("cpu", "2")]),
                container("q", &[("memory", "1Gi")], &[]),
            ],
        );
        let c = pod_set("c", 4, vec![container("x", &[("cpu", "2")], &[])]);
        let d = pod_set(
            "d",
            8,
            vec![
                container("x", &[("cpu", "1")], &[]),
                container("y", &[("memory", "1Gi")], &[]),
            ],
        );
        let wl = workload(vec![a, b, c, d], "default");
        let r = request(&wl, &with_policy("IdenticalWorkloadSchedulingRequirements"));
        assert_eq!(members(&r), vec![(vec!["a", "b", "d"], 11), (vec!["c"], 4)]);
        // Under IdenticalPodTemplates only a and d are alike.
        let r = request(&wl, &with_policy("IdenticalPodTemplates"));
        assert_eq!(
            members(&r),
            vec![(vec!["a", "d"], 9), (vec!["b"], 2), (vec!["c"], 4)]
        );
    }

    #[test]
    fn scheduling_requirements_compare_each_field() {
        let policy = with_policy("IdenticalWorkloadSchedulingRequirements");
        type Change = Box<dyn Fn(&mut PodSpec)>;
        let changes: Vec<(&str, Change)> = vec![
            (
                "container count",
                Box::new(|s| s.containers.push(container("extra", &[], &[]))),
            ),
            (
                "init containers",
                Box::new(|s| s.init_containers = Some(vec![container("i", &[("cpu", "1")], &[])])),
            ),
            (
                "pod-level resources",
                Box::new(|s| {
                    s.resources = Some(ResourceRequirements {
                        requests: resources(&[("cpu", "2")]),
                        ..Default::default()
                    })
                }),
            ),
            (
                "nodeSelector",
                Box::new(|s| {
                    s.node_selector = Some(BTreeMap::from([("k".to_string(), "v".to_string())]))
                }),
            ),
            (
                "tolerations",
                Box::new(|s| s.tolerations = Some(vec![toleration("k", "v")])),
            ),
            (
                "affinity",
                Box::new(|s| {
                    s.affinity = Some(Affinity {
                        node_affinity: Some(NodeAffinity {
                            required_during_scheduling_ignored_during_execution: Some(
                                NodeSelector {
                                    node_selector_terms: vec![NodeSelectorTerm {
                                        match_expressions: Some(vec![NodeSelectorRequirement {
                                            key: "k".into(),
                                            operator: "Exists".into(),
                                            values: None,
                                        }]),
                                        match_fields: None,
                                    }],
                                },
                            ),
                            ..Default::default()
                        }),
                        ..Default::default()
                    })
                }),
            ),
            (
                "resourceClaims",
                Box::new(|s| {
                    s.resource_claims = Some(vec![k8s_openapi::api::core::v1::PodResourceClaim {
                        name: "gpu".into(),
                        ..Default::default()
                    }])
                }),
            ),
        ];
        for (what, change) in changes {
            let mut b = cpu_pod_set("b", 1);
            change(spec_of(&mut b));
            let wl = workload(vec![cpu_pod_set("a", 1), b], "default");
            assert_eq!(members(&request(&wl, &policy)).len(), 2, "{what}");
        }
        // Unchanged, or changed only where scheduling does not look: merged.
        let mut b = cpu_pod_set("b", 1);
        spec_of(&mut b).restart_policy = Some("Never".into());
        let wl = workload(vec![cpu_pod_set("a", 1), b], "default");
        assert_eq!(members(&request(&wl, &policy)), vec![(vec!["a", "b"], 2)]);
    }

    #[test]
    fn parameters_are_overlaid_by_annotations() {
        let mut wl = workload(vec![cpu_pod_set("a", 1)], "default");
        wl.metadata.annotations = Some(BTreeMap::from([
            (
                "provreq.kueue.x-k8s.io/ValidUntilSeconds".to_string(),
                "60".to_string(),
            ),
            (
                "provreq.kueue.x-k8s.io/extra".to_string(),
                "yes".to_string(),
            ),
            ("kueue.x-k8s.io/other".to_string(), "ignored".to_string()),
        ]));
        let config = ProvisioningRequestConfigSpec {
            parameters: BTreeMap::from([
                ("ValidUntilSeconds".to_string(), "3600".to_string()),
                ("BookingTime".to_string(), "5m".to_string()),
            ]),
            ..config()
        };
        let r = request(&wl, &config);
        assert_eq!(
            r.parameters,
            BTreeMap::from([
                ("BookingTime".to_string(), "5m".to_string()),
                ("ValidUntilSeconds".to_string(), "60".to_string()),
                ("extra".to_string(), "yes".to_string()),
            ])
        );
    }

    #[test]
    fn parameter_limits() {
        let mut wl = workload(vec![cpu_pod_set("a", 1)], "default");
        wl.metadata.annotations = Some(BTreeMap::from([(
            "provreq.kueue.x-k8s.io/long".to_string(),
            "x".repeat(256),
        )]));
        assert_eq!(
            run(&wl, &config()),
            Err(PlanError::ParameterTooLong {
                key: "long".into(),
                len: 256,
                from: ParameterSource::WorkloadAnnotation,
            })
        );
        // The annotation wins over the config, and so does its length.
        let with_long_default = ProvisioningRequestConfigSpec {
            parameters: BTreeMap::from([("long".to_string(), "short".to_string())]),
            ..config()
        };
        assert!(matches!(
            run(&wl, &with_long_default),
            Err(PlanError::ParameterTooLong {
                from: ParameterSource::WorkloadAnnotation,
                ..
            })
        ));
        // Exactly at the limit, counted in characters (the CRD's maxLength counts characters,
        // not bytes): 255 two-byte characters pass.
        wl.metadata.annotations = Some(BTreeMap::from([(
            "provreq.kueue.x-k8s.io/long".to_string(),
            "é".repeat(255),
        )]));
        assert_eq!(
            request(&wl, &config()).parameters["long"].chars().count(),
            255
        );
        // A config value (the CRD refuses it, but a config is read as it is): named as such.
        wl.metadata.annotations = None;
        let long_config = ProvisioningRequestConfigSpec {
            parameters: BTreeMap::from([("c".to_string(), "x".repeat(300))]),
            ..config()
        };
        assert_eq!(
            run(&wl, &long_config),
            Err(PlanError::ParameterTooLong {
                key: "c".into(),
                len: 300,
                from: ParameterSource::Config,
            })
        );
        let config = ProvisioningRequestConfigSpec {
            parameters: (0..100)
                .map(|i| (format!("p{i}"), "v".to_string()))
                .collect(),
            ..config()
        };
        assert!(run(&wl, &config).is_ok(), "100 parameters are allowed");
        // Annotations that override a config key add nothing; a new key is the 101st.
        wl.metadata.annotations = Some(BTreeMap::from([
            ("provreq.kueue.x-k8s.io/p0".to_string(), "w".to_string()),
            ("provreq.kueue.x-k8s.io/new".to_string(), "w".to_string()),
        ]));
        assert_eq!(
            run(&wl, &config),
            Err(PlanError::TooManyParameters {
                count: 101,
                from_annotations: 1
            })
        );
    }

    #[test]
    fn objects_carry_identification_and_no_owner() {
        let mut wl = workload(vec![cpu_pod_set("a", 2), cpu_pod_set("b", 3)], "default");
        wl.metadata.annotations = Some(BTreeMap::from([(
            "provreq.kueue.x-k8s.io/p".to_string(),
            "v".to_string(),
        )]));
        let r = request(&wl, &config());
        let pr = request_object(&r, &wl, "prov", 1, "me");
        assert_eq!(pr.metadata.name.as_deref(), Some("job-1-prov-1"));
        assert_eq!(pr.metadata.namespace.as_deref(), Some("team-a"));
        assert_eq!(pr.metadata.owner_references, None);
        let labels = pr.metadata.labels.clone().expect("labels");
        assert_eq!(labels.get(MANAGED_BY_LABEL).map(String::as_str), Some("me"));
        assert_eq!(
            labels.get(WORKLOAD_UID_LABEL).map(String::as_str),
            Some("uid-1")
        );
        let annotations = pr.metadata.annotations.clone().expect("annotations");
        assert_eq!(
            annotations.get(WORKLOAD_ANNOTATION).map(String::as_str),
            Some("job-1")
        );
        assert_eq!(
            annotations.get(CHECK_ANNOTATION).map(String::as_str),
            Some("prov")
        );
        assert_eq!(
            annotations.get(ATTEMPT_ANNOTATION).map(String::as_str),
            Some("1")
        );
        assert!(!annotations.contains_key(REQUEST_ANNOTATION));
        assert_eq!(pr.spec.provisioning_class_name, r.provisioning_class_name);
        assert_eq!(pr.spec.parameters, r.parameters);
        let refs: Vec<_> = pr
            .spec
            .pod_sets
            .iter()
            .map(|p| (p.pod_template_ref.name.as_str(), p.count))
            .collect();
        assert_eq!(
            refs,
            vec![("ppt-job-1-prov-1-a", 2), ("ppt-job-1-prov-1-b", 3)]
        );

        let templates = pod_template_objects(&r, &wl, "prov", 1, "me");
        assert_eq!(templates.len(), 2);
        for (pt, planned) in templates.iter().zip(&r.pod_sets) {
            assert_eq!(pt.metadata.name.as_ref(), Some(&planned.template_name));
            assert_eq!(pt.metadata.namespace.as_deref(), Some("team-a"));
            assert_eq!(pt.metadata.owner_references, None);
            assert_eq!(pt.metadata.labels, Some(labels.clone()));
            let a = pt.metadata.annotations.clone().expect("annotations");
            assert_eq!(
                a.get(REQUEST_ANNOTATION).map(String::as_str),
                Some("job-1-prov-1")
            );
            assert_eq!(a.get(ATTEMPT_ANNOTATION).map(String::as_str), Some("1"));
            assert_eq!(pt.template.as_ref(), Some(&planned.template));
        }
    }

    #[test]
    fn workload_without_uid_gets_no_uid_label() {
        let mut wl = workload(vec![cpu_pod_set("a", 1)], "default");
        wl.metadata.uid = None;
        let r = request(&wl, &config());
        let pr = request_object(&r, &wl, "prov", 1, "me");
        assert!(
            !pr.metadata
                .labels
                .expect("labels")
                .contains_key(WORKLOAD_UID_LABEL)
        );
    }

    #[test]
    fn quantities_in_canonical_form() {
        let c = |s: &str| canonical_quantity(s);
        assert_eq!(c("1"), c("1000m"));
        assert_eq!(c("1e3"), c("1k"));
        assert_eq!(c("1e-3"), c("1m"));
        assert_eq!(c("1Gi"), c("1024Mi"));
        assert_eq!(c("1Gi"), c("1073741824"));
        assert_eq!(c("0.5"), c("500m"));
        assert_eq!(c("1.5k"), c("1500"));
        assert_eq!(c("1E3"), c("1k"));
        assert_eq!(c("1E"), c("1e18"));
        assert_eq!(c("0"), c("0m"));
        assert_eq!(c("+2"), c("2"));
        assert_ne!(c("1"), c("1Ki"));
        assert_ne!(c("-1"), c("1"));
        assert_eq!(c("1"), "1e0");
        // Not a quantity: unchanged.
        assert_eq!(c("lots"), "lots");
        assert_eq!(c("1..2"), "1..2");
        assert_eq!(c("1Xi"), "1Xi");
    }

    #[test]
    fn semantic_equality_treats_empty_maps_as_absent() {
        let a = PodTemplateSpec {
            metadata: Some(ObjectMeta::default()),
            spec: Some(PodSpec {
                node_selector: Some(BTreeMap::new()),
                tolerations: Some(vec![]),
                ..Default::default()
            }),
        };
        let b = PodTemplateSpec {
            metadata: None,
            spec: Some(PodSpec::default()),
        };
        assert_eq!(semantic("template", &a), semantic("template", &b));
        // An empty struct behind a pointer is not the same as none.
        let c = PodTemplateSpec {
            spec: Some(PodSpec {
                affinity: Some(Affinity::default()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_ne!(semantic("template", &b), semantic("template", &c));
    }
}

//! A podset's PodTemplate: its template plus, from every ResourceFlavor assigned to it, the node
//! labels (as nodeSelector) and the tolerations, with limits copied into missing requests.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{PodSpec, PodTemplateSpec, ResourceRequirements, Toleration};
use kueue_admission_sdk::api::{PodSet, ResourceFlavorSpec};

use super::{LabelConflict, PlanError};

/// Node labels and tolerations the flavors assigned to a podset add to its template.
#[derive(Debug, Default)]
pub(super) struct FlavorAdditions {
    /// Label key → (value, flavor it comes from).
    node_labels: BTreeMap<String, (String, String)>,
    tolerations: Vec<Toleration>,
}

impl FlavorAdditions {
    pub(super) fn of<'f>(
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

    pub(super) fn is_empty(&self) -> bool {
        self.node_labels.is_empty() && self.tolerations.is_empty()
    }

    /// Whether both add the same labels and tolerations, whichever flavors they come from.
    pub(super) fn same_as(&self, other: &FlavorAdditions) -> bool {
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
pub(super) fn add_toleration(tolerations: &mut Vec<Toleration>, toleration: &Toleration) {
    if !tolerations.iter().any(|t| same_toleration(t, toleration)) {
        tolerations.push(toleration.clone());
    }
}

/// Kubernetes' toleration equality: key, effect, operator (empty meaning `Equal`) and value;
/// `tolerationSeconds` is not compared.
pub(super) fn same_toleration(a: &Toleration, b: &Toleration) -> bool {
    pub(super) fn text(s: &Option<String>) -> &str {
        s.as_deref().unwrap_or("")
    }
    pub(super) fn operator(t: &Toleration) -> &str {
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
pub(super) fn build_template(
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
pub(super) fn limits_as_missing_requests(spec: &mut PodSpec) {
    pub(super) fn fill(resources: &mut ResourceRequirements) {
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

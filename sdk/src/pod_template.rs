//! A podset's pod template as its pods will ask for capacity: its template plus, from every
//! ResourceFlavor assigned to it, the node labels (as nodeSelector) and the tolerations, with
//! limits copied into missing requests. What a check that asks an autoscaler for capacity
//! (a ProvisioningRequest's PodTemplates, a CapacityBuffer's) shapes its request from.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::core::v1::{PodSpec, PodTemplateSpec, ResourceRequirements, Toleration};

use crate::api::{PodSet, ResourceFlavorSpec};

/// Why a podset's template cannot be built. The messages are meant for the Workload's check
/// message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
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
}

/// Details of [`TemplateError::NodeLabelConflict`].
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

/// Node labels and tolerations the flavors assigned to a podset add to its template.
#[derive(Debug, Default)]
pub struct FlavorAdditions {
    /// Label key → (value, flavor it comes from).
    node_labels: BTreeMap<String, (String, String)>,
    tolerations: Vec<Toleration>,
}

impl FlavorAdditions {
    /// What the flavors `assigned` to `pod_set` (by name, repeats ignored) add, read from
    /// `flavors`; an unknown flavor or two flavors giving one label two values is an error.
    pub fn of<'f>(
        pod_set: &str,
        assigned: impl IntoIterator<Item = &'f String>,
        flavors: &BTreeMap<String, ResourceFlavorSpec>,
    ) -> Result<Self, TemplateError> {
        let mut additions = FlavorAdditions::default();
        let mut seen = BTreeSet::new();
        for flavor in assigned {
            if !seen.insert(flavor) {
                continue;
            }
            let spec = flavors
                .get(flavor)
                .ok_or_else(|| TemplateError::UnknownFlavor {
                    pod_set: pod_set.to_string(),
                    flavor: flavor.clone(),
                })?;
            for (key, value) in &spec.node_labels {
                match additions.node_labels.get(key) {
                    Some((existing, from)) if existing != value => {
                        return Err(TemplateError::NodeLabelConflict(Box::new(LabelConflict {
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

    /// Whether the flavors add nothing.
    pub fn is_empty(&self) -> bool {
        self.node_labels.is_empty() && self.tolerations.is_empty()
    }

    /// Whether both add the same labels and tolerations, whichever flavors they come from.
    pub fn same_as(&self, other: &FlavorAdditions) -> bool {
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
pub fn add_toleration(tolerations: &mut Vec<Toleration>, toleration: &Toleration) {
    if !tolerations.iter().any(|t| same_toleration(t, toleration)) {
        tolerations.push(toleration.clone());
    }
}

/// Kubernetes' toleration equality: key, effect, operator (empty meaning `Equal`) and value;
/// `tolerationSeconds` is not compared.
pub fn same_toleration(a: &Toleration, b: &Toleration) -> bool {
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
pub fn build_template(
    pod_set: &PodSet,
    additions: &FlavorAdditions,
) -> Result<PodTemplateSpec, TemplateError> {
    let mut template = pod_set.template.clone();
    if !additions.is_empty() {
        let spec = template.spec.get_or_insert_with(PodSpec::default);
        if !additions.node_labels.is_empty() {
            let selector = spec.node_selector.get_or_insert_with(BTreeMap::new);
            for (key, (value, flavor)) in &additions.node_labels {
                match selector.get(key) {
                    Some(existing) if existing != value => {
                        return Err(TemplateError::NodeLabelConflict(Box::new(LabelConflict {
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
pub fn limits_as_missing_requests(spec: &mut PodSpec) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Container;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn pod_set(selector: &[(&str, &str)]) -> PodSet {
        let container = Container {
            name: "c".into(),
            resources: Some(ResourceRequirements {
                limits: Some(BTreeMap::from([("cpu".into(), Quantity("2".into()))])),
                ..Default::default()
            }),
            ..Default::default()
        };
        let selector = selector.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        PodSet {
            name: "main".into(),
            count: 1,
            template: PodTemplateSpec {
                spec: Some(PodSpec {
                    containers: vec![container],
                    node_selector: Some(selector.collect()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn flavor(labels: &[(&str, &str)], taint_key: &str) -> ResourceFlavorSpec {
        ResourceFlavorSpec {
            node_labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            tolerations: vec![Toleration {
                key: Some(taint_key.into()),
                operator: Some("Exists".into()),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn the_flavors_labels_and_tolerations_are_added_and_limits_become_requests() {
        let flavors = BTreeMap::from([
            ("spot".to_string(), flavor(&[("pool", "spot")], "spot")),
            ("big".to_string(), flavor(&[("size", "big")], "spot")),
        ]);
        let assigned = ["spot".to_string(), "big".to_string(), "spot".to_string()];
        let additions = FlavorAdditions::of("main", &assigned, &flavors).expect("known");
        let template = build_template(&pod_set(&[("team", "a")]), &additions).expect("no conflict");
        let spec = template.spec.expect("spec");
        let selector = spec.node_selector.expect("selector");
        assert_eq!(selector.len(), 3, "{selector:?}");
        assert_eq!(
            (selector["pool"].as_str(), selector["size"].as_str()),
            ("spot", "big")
        );
        assert_eq!(
            spec.tolerations.expect("tolerations").len(),
            1,
            "equal ones once"
        );
        let requests = spec.containers[0]
            .resources
            .as_ref()
            .and_then(|r| r.requests.clone());
        assert_eq!(requests.expect("requests")["cpu"], Quantity("2".into()));
    }

    #[test]
    fn a_missing_flavor_or_a_label_given_two_values_is_refused_with_what_to_fix() {
        let flavors = BTreeMap::from([("spot".to_string(), flavor(&[("pool", "spot")], "t"))]);
        let err =
            FlavorAdditions::of("main", &["gone".to_string()], &flavors).expect_err("unknown");
        assert!(err.to_string().contains("\"gone\""), "{err}");
        let additions =
            FlavorAdditions::of("main", &["spot".to_string()], &flavors).expect("known");
        let err =
            build_template(&pod_set(&[("pool", "ondemand")]), &additions).expect_err("conflict");
        assert_eq!(
            err.to_string(),
            "podset \"main\": node label pool=spot of ResourceFlavor \"spot\" conflicts with pool=ondemand from the podset's nodeSelector"
        );
    }
}

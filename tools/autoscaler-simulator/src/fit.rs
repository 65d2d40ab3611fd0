//! Whether a pod fits a node, as kube-scheduler's filters (and so cluster-autoscaler's
//! simulations) decide it, for the filters the simulator models:
//!
//! - **resources**: the pod's requests (the sum of its containers', at least each init
//!   container's, restartable init containers added to both, plus `spec.overhead`; pod-level
//!   `spec.resources.requests` win where set; a container's limit stands in for a missing
//!   request, as the API server defaults it), plus one `pods` slot, must not exceed the node's
//!   allocatable minus what is already placed there. A resource the node does not list counts
//!   as 0 (so a node without a `pods` allocatable takes no pod, as in kube-scheduler);
//! - **nodeSelector**: every entry must be a label of the node;
//! - **required node affinity**: one term of `requiredDuringSchedulingIgnoredDuringExecution`
//!   must match the node (`In`, `NotIn`, `Exists`, `DoesNotExist`, `Gt`, `Lt` on labels;
//!   `metadata.name` fields);
//! - **taints**: every `NoSchedule` and `NoExecute` taint must be tolerated (`Equal`/`Exists`;
//!   `PreferNoSchedule` is ignored);
//! - **unschedulable**: a cordoned node (`spec.unschedulable`) takes no pod.
//!
//! Not modelled: pod (anti-)affinity, topology spread, host ports, volumes, DRA claims.
//!
//! All pure: the snapshot and the estimators build on [`NodeRoom`] and [`PodShape`].

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, NodeSelector, NodeSelectorRequirement, PodSpec, Taint, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::quantity::parse_milli;

/// The resource every pod takes one of.
pub const PODS: &str = "pods";

/// Amounts by resource name, in milli-units (see [`crate::quantity`]).
pub type Resources = BTreeMap<String, i128>;

/// `quantities` in milli-units; a malformed quantity (the API server refuses them) counts as 0.
pub fn resources_of(quantities: Option<&BTreeMap<String, Quantity>>) -> Resources {
    quantities
        .into_iter()
        .flatten()
        .map(|(name, q)| (name.clone(), parse_milli(&q.0).unwrap_or(0)))
        .collect()
}

fn add_into(total: &mut Resources, more: &Resources) {
    for (name, amount) in more {
        *total.entry(name.clone()).or_insert(0) += amount;
    }
}

fn max_into(total: &mut Resources, other: &Resources) {
    for (name, amount) in other {
        let slot = total.entry(name.clone()).or_insert(0);
        *slot = (*slot).max(*amount);
    }
}

/// A container's requests, its limits standing in for missing requests.
fn container_requests(container: &Container) -> Resources {
    let resources = container.resources.as_ref();
    let mut requests = resources_of(resources.and_then(|r| r.limits.as_ref()));
    requests.extend(resources_of(resources.and_then(|r| r.requests.as_ref())));
    requests
}

/// What a pod of `spec` requests, one `pods` slot included.
pub fn pod_requests(spec: &PodSpec) -> Resources {
    let mut containers = Resources::new();
    for container in &spec.containers {
        add_into(&mut containers, &container_requests(container));
    }
    let mut sidecars = Resources::new();
    let mut init_peak = Resources::new();
    for init in spec.init_containers.iter().flatten() {
        let requests = container_requests(init);
        if init.restart_policy.as_deref() == Some("Always") {
            add_into(&mut sidecars, &requests);
            max_into(&mut init_peak, &sidecars);
        } else {
            let mut during = requests;
            add_into(&mut during, &sidecars);
            max_into(&mut init_peak, &during);
        }
    }
    add_into(&mut containers, &sidecars);
    max_into(&mut containers, &init_peak);
    let pod_level = spec.resources.as_ref().and_then(|r| r.requests.as_ref());
    containers.extend(resources_of(pod_level));
    add_into(&mut containers, &resources_of(spec.overhead.as_ref()));
    containers.insert(PODS.to_string(), 1000);
    containers
}

/// What placement needs to know of a pod.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodShape {
    /// Requests, one `pods` slot included.
    pub requests: Resources,
    /// `spec.nodeSelector`.
    pub node_selector: BTreeMap<String, String>,
    /// `spec.tolerations`.
    pub tolerations: Vec<Toleration>,
    /// `spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution`.
    pub required_affinity: Option<NodeSelector>,
}

impl PodShape {
    /// The shape of a pod of `spec`.
    pub fn of(spec: &PodSpec) -> Self {
        Self {
            requests: pod_requests(spec),
            node_selector: spec.node_selector.clone().unwrap_or_default(),
            tolerations: spec.tolerations.clone().unwrap_or_default(),
            required_affinity: spec
                .affinity
                .as_ref()
                .and_then(|a| a.node_affinity.as_ref())
                .and_then(|n| {
                    n.required_during_scheduling_ignored_during_execution
                        .clone()
                }),
        }
    }
}

/// Whether `toleration` tolerates `taint` (kube's `ToleratesTaint`).
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    if let Some(effect) = toleration.effect.as_deref().filter(|e| !e.is_empty())
        && effect != taint.effect
    {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or("");
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or("Equal") {
        // With an empty key, Exists tolerates every taint.
        "Exists" => true,
        "Equal" | "" => {
            toleration.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
        _ => false,
    }
}

/// Whether every `NoSchedule`/`NoExecute` taint is tolerated.
pub fn taints_tolerated(taints: &[Taint], tolerations: &[Toleration]) -> bool {
    taints
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .all(|taint| tolerations.iter().any(|t| tolerates(t, taint)))
}

fn requirement_matches(requirement: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = requirement.values.as_deref().unwrap_or(&[]);
    let number = |v: &str| v.parse::<i64>().ok();
    match requirement.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| values.iter().all(|x| x != v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(actual), [bound]) = (value.and_then(number), values) else {
                return false;
            };
            let Some(bound) = number(bound) else {
                return false;
            };
            if requirement.operator == "Gt" {
                actual > bound
            } else {
                actual < bound
            }
        }
        _ => false,
    }
}

/// Whether a node with `name` and `labels` matches the required affinity (terms are ORed, the
/// requirements of a term ANDed; an empty term matches nothing).
pub fn affinity_matches(
    selector: &NodeSelector,
    name: &str,
    labels: &BTreeMap<String, String>,
) -> bool {
    selector.node_selector_terms.iter().any(|term| {
        let expressions = term.match_expressions.as_deref().unwrap_or(&[]);
        let fields = term.match_fields.as_deref().unwrap_or(&[]);
        if expressions.is_empty() && fields.is_empty() {
            return false;
        }
        expressions
            .iter()
            .all(|r| requirement_matches(r, labels.get(&r.key).map(String::as_str)))
            && fields.iter().all(|r| {
                let value = (r.key == "metadata.name").then_some(name);
                requirement_matches(r, value)
            })
    })
}

/// A node as placement sees it: what it accepts and how much room is left.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeRoom {
    /// The Node's name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its taints.
    pub taints: Vec<Taint>,
    /// `spec.unschedulable`.
    pub unschedulable: bool,
    /// `status.allocatable`, in milli-units.
    pub allocatable: Resources,
    /// What the pods placed on it request.
    pub used: Resources,
}

impl NodeRoom {
    /// Whether the node accepts the pod, room aside (selector, affinity, taints, cordon).
    pub fn admits(&self, pod: &PodShape) -> bool {
        !self.unschedulable
            && pod
                .node_selector
                .iter()
                .all(|(k, v)| self.labels.get(k) == Some(v))
            && pod
                .required_affinity
                .as_ref()
                .is_none_or(|a| affinity_matches(a, &self.name, &self.labels))
            && taints_tolerated(&self.taints, &pod.tolerations)
    }

    /// Whether the pod's requests fit the room left.
    pub fn has_room(&self, pod: &PodShape) -> bool {
        pod.requests.iter().all(|(name, amount)| {
            let free = self.allocatable.get(name).copied().unwrap_or(0)
                - self.used.get(name).copied().unwrap_or(0);
            *amount <= 0 || *amount <= free
        })
    }

    /// [`Self::admits`] and [`Self::has_room`].
    pub fn fits(&self, pod: &PodShape) -> bool {
        self.admits(pod) && self.has_room(pod)
    }

    /// Counts the pod's requests as used (whether or not they fit).
    pub fn place(&mut self, pod: &PodShape) {
        add_into(&mut self.used, &pod.requests);
    }
}

/// Places the pod on the first node, in order, that fits it; the node's index, if any.
pub fn place_first_fit(nodes: &mut [NodeRoom], pod: &PodShape) -> Option<usize> {
    let index = nodes.iter().position(|n| n.fits(pod))?;
    nodes[index].place(pod);
    Some(index)
}

/// What bin-packing pods onto fresh nodes of one template gives.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Binpack {
    /// Fresh nodes used.
    pub nodes: usize,
    /// Indices (into the given pods) of the pods placed.
    pub placed: Vec<usize>,
}

/// How cluster-autoscaler's estimator orders pods: largest first, by the sum of their cpu and
/// memory shares of the template's allocatable.
fn size_score(pod: &PodShape, template: &NodeRoom) -> f64 {
    ["cpu", "memory"]
        .iter()
        .map(|r| {
            let request = pod.requests.get(*r).copied().unwrap_or(0);
            let allocatable = template.allocatable.get(*r).copied().unwrap_or(0);
            if allocatable > 0 {
                request as f64 / allocatable as f64
            } else {
                0.0
            }
        })
        .sum()
}

/// Bin-packs `pods` onto fresh copies of `template` (its `used` is what a fresh node already
/// carries), largest first, each pod on the first fresh node with room, opening a new node when
/// none has room, using at most `max_nodes`. Pods the template never admits, or that do not fit
/// even an empty node, are left out; so are pods that would need node `max_nodes + 1`.
pub fn binpack(template: &NodeRoom, pods: &[PodShape], max_nodes: usize) -> Binpack {
    let mut order: Vec<usize> = (0..pods.len()).collect();
    order.sort_by(|a, b| {
        size_score(&pods[*b], template).total_cmp(&size_score(&pods[*a], template))
    });
    let mut fresh: Vec<NodeRoom> = Vec::new();
    let mut result = Binpack::default();
    for index in order {
        let pod = &pods[index];
        if !template.fits(pod) {
            continue;
        }
        if place_first_fit(&mut fresh, pod).is_none() {
            if fresh.len() >= max_nodes {
                continue;
            }
            let mut node = template.clone();
            node.place(pod);
            fresh.push(node);
        }
        result.placed.push(index);
    }
    result.placed.sort_unstable();
    result.nodes = fresh.len();
    result
}

#[cfg(test)]
#[path = "fit_tests.rs"]
mod tests;

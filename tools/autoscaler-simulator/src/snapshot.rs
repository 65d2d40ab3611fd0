//! The cluster as one autoscaler loop sees it ([`ClusterView`]: cached objects), and the
//! in-memory scheduling snapshot a loop places pods into ([`Snapshot`]). Pure.
//!
//! Nodes are visited in name order, so placement (first fit) is deterministic; kube-scheduler
//! and cluster-autoscaler's simulator pick among fitting nodes differently, which changes where
//! pods land but not whether they fit when room is plentiful or clearly short.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod, PodTemplate};
use kube::ResourceExt;
use kueue_admission_sdk::api::ProvisioningRequest;

use crate::conditions::{CONSUME_ANNOTATION, DEPRECATED_CONSUME_ANNOTATION};
use crate::fit::{NodeRoom, PodShape, place_first_fit};
use crate::node_groups::allocatable_of;
use crate::script::SCRIPT_ANNOTATION;

/// The objects one loop decides on.
#[derive(Clone, Debug, Default)]
pub struct ClusterView {
    /// Nodes (with those the simulator just created and the watch has not shown yet).
    pub nodes: Vec<Node>,
    /// Pods, bound or pending.
    pub pods: Vec<Pod>,
    /// ProvisioningRequests, in no particular order (the order a loop scans them in).
    pub requests: Vec<ProvisioningRequest>,
    /// PodTemplates.
    pub templates: Vec<PodTemplate>,
}

impl ClusterView {
    /// The PodTemplate `namespace/name`.
    pub fn template(&self, namespace: &str, name: &str) -> Option<&PodTemplate> {
        self.templates
            .iter()
            .find(|t| t.namespace().as_deref() == Some(namespace) && t.name_any() == name)
    }

    /// The annotations of a request's first pod template (the PodTemplate object's, overridden
    /// by its `template.metadata`'s); `None` if it has no podset or the template is missing.
    pub fn first_template_annotations(
        &self,
        request: &ProvisioningRequest,
    ) -> Option<BTreeMap<String, String>> {
        let podset = request.spec.pod_sets.first()?;
        let namespace = request.namespace().unwrap_or_default();
        let template = self.template(&namespace, &podset.pod_template_ref.name)?;
        Some(template_annotations(template))
    }

    /// Whether the request's first pod template names a script.
    pub fn has_script_annotation(&self, request: &ProvisioningRequest) -> bool {
        self.first_template_annotations(request)
            .is_some_and(|a| a.contains_key(SCRIPT_ANNOTATION))
    }

    /// The pods a request asks room for (`count` copies of each podset's template), or the
    /// names of its missing PodTemplates.
    pub fn request_pods(
        &self,
        request: &ProvisioningRequest,
    ) -> Result<Vec<PodShape>, Vec<String>> {
        let namespace = request.namespace().unwrap_or_default();
        let mut pods = Vec::new();
        let mut missing = Vec::new();
        for podset in &request.spec.pod_sets {
            let name = &podset.pod_template_ref.name;
            match self.template(&namespace, name) {
                None => missing.push(name.clone()),
                Some(template) => {
                    let spec = template.template.as_ref().and_then(|t| t.spec.clone());
                    let shape = PodShape::of(&spec.unwrap_or_default());
                    let count = usize::try_from(podset.count).unwrap_or(0);
                    pods.extend(std::iter::repeat_n(shape, count));
                }
            }
        }
        if missing.is_empty() {
            Ok(pods)
        } else {
            Err(missing)
        }
    }

    /// Pods kube-scheduler marked unschedulable (`PodScheduled=False`, reason `Unschedulable`),
    /// each with whether it carries either consume annotation (such pods never get a scale-up,
    /// whatever the request they name: rule 17).
    pub fn unschedulable_pods(&self) -> Vec<(PodShape, bool)> {
        self.pods
            .iter()
            .filter(|p| !is_terminal(p) && bound_node(p).is_none())
            .filter(|p| p.metadata.deletion_timestamp.is_none() && marked_unschedulable(p))
            .map(|p| {
                let shape = PodShape::of(&p.spec.clone().unwrap_or_default());
                (shape, consumes_a_request(p))
            })
            .collect()
    }
}

/// The annotations of a PodTemplate, its pod template's own winning.
pub fn template_annotations(template: &PodTemplate) -> BTreeMap<String, String> {
    let mut annotations = template.metadata.annotations.clone().unwrap_or_default();
    annotations.extend(
        template
            .template
            .as_ref()
            .and_then(|t| t.metadata.as_ref())
            .and_then(|m| m.annotations.clone())
            .unwrap_or_default(),
    );
    annotations
}

fn is_terminal(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    matches!(phase, Some("Succeeded" | "Failed"))
}

fn bound_node(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

fn marked_unschedulable(pod: &Pod) -> bool {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.into_iter().flatten().any(|c| {
        c.type_ == "PodScheduled"
            && c.status == "False"
            && c.reason.as_deref() == Some("Unschedulable")
    })
}

/// Whether the pod carries either consume annotation.
pub fn consumes_a_request(pod: &Pod) -> bool {
    let annotations = pod.metadata.annotations.as_ref();
    annotations.is_some_and(|a| {
        a.contains_key(CONSUME_ANNOTATION) || a.contains_key(DEPRECATED_CONSUME_ANNOTATION)
    })
}

/// Whether scale-down may move the pod away without a thought: DaemonSet and mirror pods.
fn moves_freely(pod: &Pod) -> bool {
    let daemon = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "DaemonSet");
    let mirror = pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"));
    daemon || mirror
}

/// The in-memory scheduling snapshot of one loop.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// The Nodes, by name.
    pub nodes: Vec<NodeRoom>,
    /// For each node, how many pods on it keep it from being unneeded (bound pods other than
    /// DaemonSet and mirror pods, and pods the loop placed: booked or soon-scheduled ones).
    pub blockers: Vec<usize>,
}

impl Snapshot {
    /// The Nodes of `view` with their bound non-terminal pods.
    pub fn of(view: &ClusterView) -> Self {
        let mut nodes: Vec<&Node> = view.nodes.iter().collect();
        nodes.sort_by_key(|n| n.name_any());
        nodes.dedup_by_key(|n| n.name_any());
        let mut snapshot = Snapshot {
            nodes: nodes.iter().map(|n| room_of(n)).collect(),
            blockers: vec![0; nodes.len()],
        };
        let index: BTreeMap<String, usize> = snapshot
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.clone(), i))
            .collect();
        for pod in view.pods.iter().filter(|p| !is_terminal(p)) {
            let Some(&i) = bound_node(pod).and_then(|n| index.get(n)) else {
                continue;
            };
            snapshot.nodes[i].place(&PodShape::of(&pod.spec.clone().unwrap_or_default()));
            if !moves_freely(pod) {
                snapshot.blockers[i] += 1;
            }
        }
        snapshot
    }

    /// Places the pod on the first node that fits it; whether one did.
    pub fn place(&mut self, pod: &PodShape) -> bool {
        match place_first_fit(&mut self.nodes, pod) {
            Some(i) => {
                self.blockers[i] += 1;
                true
            }
            None => false,
        }
    }

    /// Places every pod, or none (the snapshot is unchanged then); whether all fit.
    pub fn place_all(&mut self, pods: &[PodShape]) -> bool {
        let mut fork = self.clone();
        if pods.iter().all(|p| fork.place(p)) {
            *self = fork;
            true
        } else {
            false
        }
    }

    /// Places each pod that fits; returns those that do not, in order.
    pub fn place_each(&mut self, pods: &[PodShape]) -> Vec<PodShape> {
        pods.iter().filter(|p| !self.place(p)).cloned().collect()
    }

    /// The index of the node named `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }
}

/// A Node as placement sees it, empty.
pub fn room_of(node: &Node) -> NodeRoom {
    let spec = node.spec.as_ref();
    NodeRoom {
        name: node.name_any(),
        labels: node.labels().clone(),
        taints: spec.and_then(|s| s.taints.clone()).unwrap_or_default(),
        unschedulable: spec.and_then(|s| s.unschedulable).unwrap_or(false),
        allocatable: allocatable_of(node),
        used: Default::default(),
    }
}

//! Node groups as cluster-autoscaler 1.36.1's kwok cloud provider builds them (rule 18), read
//! from Node templates: the YAML its templates ConfigMap holds (a `kind: List`, a YAML sequence,
//! or several `---` documents of `v1.Node`).
//!
//! - A template belongs to the group named by its grouping label (default `kwok-nodegroup`; the
//!   annotation [`GROUP_NAME_ANNOTATION`] overrides the name). Templates without the label are
//!   skipped with a warning; a second template of a group is ignored with a warning.
//! - [`MIN_COUNT_ANNOTATION`] (default 0) and [`MAX_COUNT_ANNOTATION`] (default 200) bound the
//!   group's size; the simulator refuses a max of 0 or a min above the max.
//! - The template gets the taint `kwok-provider=true:NoSchedule` unless `skip_taint`, and the
//!   annotations [`KWOK_NODE_ANNOTATION`]`=fake` and the group name.
//! - A created Node ([`new_node`]) is named `<group>-<5 random characters>`, carries the
//!   template's labels (plus `kubernetes.io/hostname`), annotations, taints and status capacity
//!   and allocatable, and `spec.providerID = kwok:<name>`. Creation is instant and never fails
//!   on the provider side: the kwok controller of the cluster then keeps the Node Ready.
//! - A group's size is the number of live Nodes of the group ([`group_of`]).
//!
//! Pure: reading the file and creating Nodes is the shell's.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

use crate::fit::{NodeRoom, PODS, Resources, resources_of};
use crate::quantity::{QuantityError, parse_milli};

/// The grouping label cluster-autoscaler's kwok provider is usually configured with.
pub const DEFAULT_GROUP_LABEL: &str = "kwok-nodegroup";
/// Annotation naming a template's (or Node's) group, over the grouping label.
pub const GROUP_NAME_ANNOTATION: &str = "cluster-autoscaler.kwok.nodegroup/name";
/// Annotation on a template: the group's minimum size.
pub const MIN_COUNT_ANNOTATION: &str = "cluster-autoscaler.kwok.nodegroup/min-count";
/// Annotation on a template: the group's maximum size.
pub const MAX_COUNT_ANNOTATION: &str = "cluster-autoscaler.kwok.nodegroup/max-count";
/// Annotation marking a Node the kwok controller manages; the simulator only deletes those.
pub const KWOK_NODE_ANNOTATION: &str = "kwok.x-k8s.io/node";
/// The taint key of the kwok provider's taint.
pub const PROVIDER_TAINT_KEY: &str = "kwok-provider";
/// A group's maximum size without [`MAX_COUNT_ANNOTATION`].
pub const DEFAULT_MAX_COUNT: u32 = 200;
/// The cpu (in millis) of the kube-proxy pod cluster-autoscaler puts on a group's template node
/// when it has no live Node of the group to copy.
pub const KUBE_PROXY_CPU_MILLIS: i128 = 100;

/// One node group: its bounds and the template of its Nodes.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeGroup {
    /// The group's name (its grouping label's value).
    pub name: String,
    /// Never scaled down below this many Nodes.
    pub min_count: u32,
    /// Never scaled up beyond this many Nodes.
    pub max_count: u32,
    /// The template, prepared (taint and annotations added).
    pub template: Node,
}

/// Why a node-groups file is refused.
#[derive(Debug, thiserror::Error)]
pub enum NodeGroupError {
    /// A document is not YAML.
    #[error("document {document}: not valid YAML: {source}")]
    Yaml {
        /// 1-based document number.
        document: usize,
        /// The parser's complaint.
        source: serde_yaml_ng::Error,
    },
    /// An object is not a `v1` Node.
    #[error("document {document}: expected a v1 Node (or a List of them), found kind {kind:?}")]
    NotANode {
        /// 1-based document number.
        document: usize,
        /// The kind found.
        kind: String,
    },
    /// A Node does not decode.
    #[error("document {document}: not a valid Node: {source}")]
    Decode {
        /// 1-based document number.
        document: usize,
        /// The decoder's complaint.
        source: serde_json::Error,
    },
    /// A template has no `metadata.name`.
    #[error("document {document}: a node template has no metadata.name")]
    Unnamed {
        /// 1-based document number.
        document: usize,
    },
    /// A count annotation is not a whole number.
    #[error("node group {group:?}: annotation {annotation} is {value:?}, not a whole number")]
    BadCount {
        /// The group.
        group: String,
        /// The annotation.
        annotation: &'static str,
        /// Its value.
        value: String,
    },
    /// A max count of 0: the group could never have a Node.
    #[error("node group {group:?}: the max count is 0")]
    ZeroMax {
        /// The group.
        group: String,
    },
    /// min > max.
    #[error("node group {group:?}: the min count {min} is above the max count {max}")]
    MinAboveMax {
        /// The group.
        group: String,
        /// The min count.
        min: u32,
        /// The max count.
        max: u32,
    },
    /// A capacity or allocatable quantity does not parse.
    #[error("node group {group:?}: {source}")]
    Quantity {
        /// The group.
        group: String,
        /// The bad quantity.
        source: QuantityError,
    },
    /// The file holds no Node at all.
    #[error("the file holds no node template")]
    Empty,
}

/// The groups of a file, and what was skipped.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoadedGroups {
    /// The groups, in file order.
    pub groups: Vec<NodeGroup>,
    /// One line per template skipped or doubtful.
    pub warnings: Vec<String>,
}

#[derive(Deserialize)]
struct Kind {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    items: Vec<serde_json::Value>,
}

/// The Node objects of every document, with their document number.
fn node_values(text: &str) -> Result<Vec<(usize, serde_json::Value)>, NodeGroupError> {
    let mut values = Vec::new();
    for (i, document) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let document_number = i + 1;
        let value =
            serde_json::Value::deserialize(document).map_err(|source| NodeGroupError::Yaml {
                document: document_number,
                source,
            })?;
        let items = match value {
            serde_json::Value::Null => continue,
            serde_json::Value::Array(items) => items,
            object => {
                let Kind { kind, items } =
                    Kind::deserialize(&object).map_err(|source| NodeGroupError::Decode {
                        document: document_number,
                        source,
                    })?;
                match kind.as_str() {
                    "List" | "NodeList" => items,
                    _ => vec![object],
                }
            }
        };
        values.extend(items.into_iter().map(|v| (document_number, v)));
    }
    Ok(values)
}

fn count(
    node: &Node,
    group: &str,
    annotation: &'static str,
    default: u32,
) -> Result<u32, NodeGroupError> {
    let annotations = node.metadata.annotations.as_ref();
    match annotations
        .and_then(|a| a.get(annotation))
        .filter(|v| !v.is_empty())
    {
        None => Ok(default),
        Some(value) => value.trim().parse().map_err(|_| NodeGroupError::BadCount {
            group: group.to_string(),
            annotation,
            value: value.clone(),
        }),
    }
}

/// Reads node groups from Node templates grouped by the label `group_label`.
pub fn parse_node_groups(
    text: &str,
    group_label: &str,
    skip_taint: bool,
) -> Result<LoadedGroups, NodeGroupError> {
    let mut loaded = LoadedGroups::default();
    let values = node_values(text)?;
    if values.is_empty() {
        return Err(NodeGroupError::Empty);
    }
    for (document, value) in values {
        let kind = value.get("kind").and_then(|k| k.as_str()).unwrap_or("Node");
        if kind != "Node" {
            return Err(NodeGroupError::NotANode {
                document,
                kind: kind.to_string(),
            });
        }
        let node: Node = serde_json::from_value(value)
            .map_err(|source| NodeGroupError::Decode { document, source })?;
        let template_name = node.metadata.name.clone().unwrap_or_default();
        if template_name.is_empty() {
            return Err(NodeGroupError::Unnamed { document });
        }
        let label = node
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(group_label));
        if label.is_none_or(String::is_empty) {
            loaded.warnings.push(format!(
                "node template {template_name:?} has no label {group_label:?}: skipped"
            ));
            continue;
        }
        let group = group_of(&node, group_label).unwrap_or_default();
        if loaded.groups.iter().any(|g| g.name == group) {
            loaded.warnings.push(format!(
                "node template {template_name:?}: node group {group:?} already has a template: skipped"
            ));
            continue;
        }
        loaded
            .groups
            .push(node_group(node, group, skip_taint, &mut loaded.warnings)?);
    }
    Ok(loaded)
}

/// One group from its template.
fn node_group(
    mut node: Node,
    name: String,
    skip_taint: bool,
    warnings: &mut Vec<String>,
) -> Result<NodeGroup, NodeGroupError> {
    let min_count = count(&node, &name, MIN_COUNT_ANNOTATION, 0)?;
    let max_count = count(&node, &name, MAX_COUNT_ANNOTATION, DEFAULT_MAX_COUNT)?;
    if max_count == 0 {
        return Err(NodeGroupError::ZeroMax { group: name });
    }
    if min_count > max_count {
        return Err(NodeGroupError::MinAboveMax {
            group: name,
            min: min_count,
            max: max_count,
        });
    }
    let status = node.status.get_or_insert_with(NodeStatus::default);
    for quantities in [&status.capacity, &status.allocatable]
        .into_iter()
        .flatten()
    {
        for q in quantities.values() {
            parse_milli(&q.0).map_err(|source| NodeGroupError::Quantity {
                group: name.clone(),
                source,
            })?;
        }
    }
    if status.allocatable.is_none() {
        status.allocatable = status.capacity.clone();
    }
    if !status
        .allocatable
        .as_ref()
        .is_some_and(|a| a.contains_key(PODS))
    {
        warnings.push(format!(
            "node group {name:?}: the template's allocatable has no \"pods\": its Nodes take no pod"
        ));
    }
    let annotations = node.metadata.annotations.get_or_insert_with(BTreeMap::new);
    annotations.insert(KWOK_NODE_ANNOTATION.into(), "fake".into());
    annotations.insert(GROUP_NAME_ANNOTATION.into(), name.clone());
    if !skip_taint {
        let spec = node.spec.get_or_insert_with(NodeSpec::default);
        spec.taints.get_or_insert_with(Vec::new).push(Taint {
            key: PROVIDER_TAINT_KEY.into(),
            value: Some("true".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        });
    }
    Ok(NodeGroup {
        name,
        min_count,
        max_count,
        template: node,
    })
}

/// The group a Node belongs to: its [`GROUP_NAME_ANNOTATION`], else its grouping label.
pub fn group_of(node: &Node, group_label: &str) -> Option<String> {
    let meta = &node.metadata;
    let annotation = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(GROUP_NAME_ANNOTATION));
    let label = meta.labels.as_ref().and_then(|l| l.get(group_label));
    annotation
        .filter(|v| !v.is_empty())
        .or(label.filter(|v| !v.is_empty()))
        .cloned()
}

/// Whether the kwok provider may delete this Node: kwok-managed, with a `kwok` providerID.
pub fn is_kwok_managed(node: &Node) -> bool {
    let annotations = node.metadata.annotations.as_ref();
    annotations
        .and_then(|a| a.get(KWOK_NODE_ANNOTATION))
        .map(String::as_str)
        == Some("fake")
        && node
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .is_some_and(|p| p.starts_with("kwok"))
}

/// The Node `name` the group creates.
pub fn new_node(group: &NodeGroup, name: &str) -> Node {
    let template = &group.template;
    let mut labels = template.metadata.labels.clone().unwrap_or_default();
    labels.insert("kubernetes.io/hostname".into(), name.to_string());
    let mut annotations = template.metadata.annotations.clone().unwrap_or_default();
    annotations.insert(
        "metrics.k8s.io/resource-metrics-path".into(),
        format!("/metrics/nodes/{name}/metrics/resource"),
    );
    let mut spec = template.spec.clone().unwrap_or_default();
    spec.provider_id = Some(format!("kwok:{name}"));
    let status = template.status.as_ref();
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: Some(NodeStatus {
            capacity: status.and_then(|s| s.capacity.clone()),
            allocatable: status.and_then(|s| s.allocatable.clone()),
            ..NodeStatus::default()
        }),
    }
}

/// The allocatable of a Node, in milli-units.
pub fn allocatable_of(node: &Node) -> Resources {
    resources_of(node.status.as_ref().and_then(|s| s.allocatable.as_ref()))
}

/// A fresh Node of the group as scale-up estimates see it. Without a live Node of the group to
/// copy (`copies_live_node` false), cluster-autoscaler builds it from the template and puts a
/// kube-proxy pod of [`KUBE_PROXY_CPU_MILLIS`] on it.
pub fn fresh_room(group: &NodeGroup, copies_live_node: bool) -> NodeRoom {
    let template = &group.template;
    let mut used = Resources::new();
    if !copies_live_node {
        used.insert("cpu".into(), KUBE_PROXY_CPU_MILLIS);
        used.insert(PODS.into(), 1000);
    }
    NodeRoom {
        name: format!("{}-template", group.name),
        labels: template.metadata.labels.clone().unwrap_or_default(),
        taints: template
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default(),
        unschedulable: false,
        allocatable: allocatable_of(template),
        used,
    }
}

#[cfg(test)]
#[path = "node_groups_tests.rs"]
mod tests;

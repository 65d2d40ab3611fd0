//! Karpenter's objects this check creates or reads, as far as it reads them: the
//! `autoscaling.x-k8s.io/v1beta1` CapacityBuffer (Karpenter v1.14, feature gate
//! `CapacityBuffer`), and `karpenter.sh/v1` NodeClaims and NodePools. Fields this check does
//! not use are left out; unknown fields are ignored when read.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// `CapacityBuffer.spec`: capacity Karpenter keeps ready for `replicas` pods shaped like a
/// PodTemplate ("virtual pods", simulated beside the real pending ones).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "autoscaling.x-k8s.io",
    version = "v1beta1",
    kind = "CapacityBuffer",
    plural = "capacitybuffers",
    namespaced,
    status = "CapacityBufferStatus",
    schema = "disabled",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct CapacityBufferSpec {
    /// The PodTemplate (same namespace) each virtual pod is made from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_template_ref: Option<LocalObjectRef>,
    /// How many virtual pods; 0 keeps the buffer but provisions nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Karpenter's strategy; absent means `buffer.x-k8s.io/active-capacity`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioning_strategy: Option<String>,
}

/// A reference by name in the same namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct LocalObjectRef {
    /// The object's name.
    pub name: String,
}

/// `CapacityBuffer.status`, written by Karpenter.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct CapacityBufferStatus {
    /// `ReadyForProvisioning` (the template resolved) and `Provisioning` (where the virtual
    /// pods fit, after every provisioning pass).
    pub conditions: Vec<Condition>,
    /// The replicas Karpenter resolved.
    pub replicas: Option<i32>,
}

/// Condition types and reasons of a CapacityBuffer (Karpenter v1.14,
/// `pkg/controllers/capacitybuffer`).
pub mod buffer_condition {
    /// The template resolved (`True`, reason `Resolved`) or not.
    pub const READY_FOR_PROVISIONING: &str = "ReadyForProvisioning";
    /// Where the last provisioning pass put the virtual pods.
    pub const PROVISIONING: &str = "Provisioning";
    /// `Provisioning=True`: every virtual pod fits on capacity that exists (or is launching).
    pub const FITS_EXISTING_CAPACITY: &str = "FitsExistingCapacity";
    /// `Provisioning=False`: some virtual pods needed new NodeClaims, or could not be placed.
    pub const REQUIRES_NEW_CAPACITY: &str = "RequiresNewCapacity";
    /// `Provisioning=False`: the buffer has no replicas.
    pub const BUFFER_EMPTY: &str = "BufferEmpty";
    /// `ReadyForProvisioning=False`: the PodTemplate does not exist.
    pub const POD_TEMPLATE_NOT_FOUND: &str = "PodTemplateNotFound";
}

/// `NodeClaim.spec`, of which nothing is read.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "karpenter.sh",
    version = "v1",
    kind = "NodeClaim",
    plural = "nodeclaims",
    status = "NodeClaimStatus",
    schema = "disabled",
    derive = "PartialEq"
)]
pub struct NodeClaimSpec {}

/// `NodeClaim.status`, as far as read: its conditions and the Node it became.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct NodeClaimStatus {
    /// `Launched`, `Registered`, `Initialized`, `Ready`, ...
    pub conditions: Vec<Condition>,
    /// The Node's name, once registered.
    pub node_name: Option<String>,
}

/// `NodePool.spec`, as far as read: the requirements its NodeClaims get.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "karpenter.sh",
    version = "v1",
    kind = "NodePool",
    plural = "nodepools",
    schema = "disabled",
    derive = "PartialEq"
)]
#[serde(default)]
pub struct NodePoolSpec {
    /// The template of its NodeClaims.
    pub template: NodePoolTemplate,
}

/// `NodePool.spec.template`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct NodePoolTemplate {
    /// Its spec.
    pub spec: NodePoolTemplateSpec,
}

/// `NodePool.spec.template.spec`, as far as read.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct NodePoolTemplateSpec {
    /// Node selector requirements (`key`, `operator`, `values`).
    pub requirements: Vec<NodeSelectorRequirement>,
}

/// A requirement of a NodePool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(default)]
pub struct NodeSelectorRequirement {
    /// The label key.
    pub key: String,
    /// `In`, `NotIn`, `Exists`, `DoesNotExist`, `Gt`, `Lt`.
    pub operator: String,
    /// Values for `In` and `NotIn`.
    pub values: Vec<String>,
}

/// Node annotation that keeps Karpenter from disrupting (consolidating) a Node.
pub const DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";
/// Label Karpenter puts on a Node it launched: its NodePool.
pub const NODEPOOL_LABEL: &str = "karpenter.sh/nodepool";

/// Whether a condition of `type_` is `True` among `conditions`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == "True")
}

/// The condition of `type_`, if any.
pub fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// A NodePool's requirements by key (for a message naming what is missing).
pub fn requirements_by_key(pool: &NodePool) -> BTreeMap<&str, &NodeSelectorRequirement> {
    pool.spec
        .template
        .spec
        .requirements
        .iter()
        .map(|r| (r.key.as_str(), r))
        .collect()
}

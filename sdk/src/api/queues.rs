use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Toleration;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use serde::{Deserialize, Serialize};

kueue_kind! {
    [kind = "ResourceFlavor"]
    /// `ResourceFlavor.spec`: the node labels and tolerations a flavor stands for, and its
    /// Topology if it is topology-aware. Cluster scoped.
    #[serde(default, rename_all = "camelCase")]
    pub struct ResourceFlavorSpec {
        /// Labels of the nodes that provide this flavor.
        #[serde(skip_serializing_if = "BTreeMap::is_empty")]
        pub node_labels: BTreeMap<String, String>,
        /// Tolerations that pods of this flavor need.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        pub tolerations: Vec<Toleration>,
        /// The Topology of a topology-aware flavor: Kueue assigns the pods of a Workload on it
        /// to topology domains of existing Nodes when it reserves quota (after provisioning
        /// only for its own ProvisioningRequest check).
        #[serde(skip_serializing_if = "Option::is_none")]
        pub topology_name: Option<String>,
    }
}

kueue_kind! {
    [kind = "ClusterQueue", status = "ClusterQueueStatus"]
    /// `ClusterQueue.spec`, the part an admission check cares about. Cluster scoped.
    #[serde(default, rename_all = "camelCase")]
    pub struct ClusterQueueSpec {
        /// Which namespaces may submit to this queue; `{}` means all.
        pub namespace_selector: Option<LabelSelector>,
        /// Quotas, per group of covered resources and per flavor.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        pub resource_groups: Vec<ResourceGroup>,
        /// Admission checks every Workload admitted through this queue must pass.
        pub admission_checks_strategy: Option<AdmissionChecksStrategy>,
    }
}

/// `ClusterQueue.spec.resourceGroups[]`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct ResourceGroup {
    /// Resources (e.g. `cpu`) whose quota this group defines.
    pub covered_resources: Vec<String>,
    /// Per-flavor quotas, tried in order.
    pub flavors: Vec<FlavorQuotas>,
}

/// `ClusterQueue.spec.resourceGroups[].flavors[]`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FlavorQuotas {
    /// ResourceFlavor name.
    pub name: String,
    /// Quota per covered resource.
    #[serde(default)]
    pub resources: Vec<ResourceQuota>,
}

/// `ClusterQueue.spec.resourceGroups[].flavors[].resources[]`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ResourceQuota {
    /// Resource name.
    pub name: String,
    /// Quota this queue owns for the resource in the flavor.
    pub nominal_quota: Quantity,
}

/// `ClusterQueue.spec.admissionChecksStrategy` (v1beta2 removed the plain `admissionChecks` list).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct AdmissionChecksStrategy {
    /// One rule per admission check.
    pub admission_checks: Vec<AdmissionCheckStrategyRule>,
}

/// One check of a ClusterQueue, optionally only for some flavors.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionCheckStrategyRule {
    /// AdmissionCheck name.
    pub name: String,
    /// Flavors the check applies to; empty means all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub on_flavors: Vec<String>,
}

/// `ClusterQueue.status`, the conditions only.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct ClusterQueueStatus {
    /// `Active` is False (e.g. reason `AdmissionCheckInactive`) while the queue reserves nothing.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

kueue_kind! {
    [kind = "LocalQueue", namespaced]
    /// `LocalQueue.spec`: the namespaced entry point that feeds a ClusterQueue.
    #[serde(rename_all = "camelCase")]
    pub struct LocalQueueSpec {
        /// The ClusterQueue this queue submits to.
        pub cluster_queue: String,
    }
}

//! Kueue's `ProvisioningRequestConfig` (the parameters of a provisioning check) and
//! cluster-autoscaler's `autoscaling.x-k8s.io/v1` `ProvisioningRequest`.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

kueue_kind! {
    [kind = "ProvisioningRequestConfig", plural = "provisioningrequestconfigs"]
    /// `ProvisioningRequestConfig.spec`: how a provisioning check builds its requests. Cluster
    /// scoped. Every field is optional in Kueue's schema; absent fields take Kueue's defaults.
    #[serde(default, rename_all = "camelCase")]
    pub struct ProvisioningRequestConfigSpec {
        /// The `provisioningClassName` of the requests (e.g. `check-capacity.autoscaling.x-k8s.io`).
        #[serde(skip_serializing_if = "String::is_empty")]
        pub provisioning_class_name: String,
        /// Parameters passed to the provisioning class (values up to 255 characters).
        #[serde(skip_serializing_if = "BTreeMap::is_empty")]
        pub parameters: BTreeMap<String, String>,
        /// Only podsets requesting one of these resources need capacity; empty means all do.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        pub managed_resources: Vec<String>,
        /// Retries of failed or expired requests.
        pub retry_strategy: Option<ProvisioningRequestRetryStrategy>,
        /// Updates to add to the podsets once capacity is provisioned.
        pub pod_set_updates: Option<ProvisioningRequestPodSetUpdates>,
        /// `IdenticalPodTemplates` or `IdenticalWorkloadSchedulingRequirements`: merge podsets into
        /// one request podset when they are alike; absent means never merge.
        pub pod_set_merge_policy: Option<String>,
    }
}

/// `ProvisioningRequestConfig.spec.retryStrategy`. Kueue's defaults when absent: 3 retries,
/// 60 s base, 1800 s cap; delay of retry n = min(base · 2^(n−1), max).
#[skip_serializing_none]
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct ProvisioningRequestRetryStrategy {
    /// Retries after the first attempt; 0 means none.
    pub backoff_limit_count: Option<i32>,
    /// Delay before the first retry, in seconds.
    pub backoff_base_seconds: Option<i32>,
    /// Longest delay, in seconds.
    pub backoff_max_seconds: Option<i32>,
}

/// `ProvisioningRequestConfig.spec.podSetUpdates`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct ProvisioningRequestPodSetUpdates {
    /// Node selector entries whose values come from the request's `provisioningClassDetails`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub node_selector: Vec<ProvisioningRequestPodSetUpdatesNodeSelector>,
}

/// One node selector entry of [`ProvisioningRequestPodSetUpdates`].
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct ProvisioningRequestPodSetUpdatesNodeSelector {
    /// The node label key.
    pub key: String,
    /// The `provisioningClassDetails` key whose value becomes the label value.
    pub value_from_provisioning_class_detail: String,
}

/// `ProvisioningRequest.spec` (`autoscaling.x-k8s.io/v1`, namespaced): capacity asked of
/// cluster-autoscaler for a set of pods.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "autoscaling.x-k8s.io",
    version = "v1",
    kind = "ProvisioningRequest",
    plural = "provisioningrequests",
    namespaced,
    status = "ProvisioningRequestStatus",
    schema = "disabled",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct ProvisioningRequestSpec {
    /// Pods to provision for, each by a PodTemplate in the same namespace (immutable).
    pub pod_sets: Vec<ProvisioningRequestPodSet>,
    /// The provisioning class (immutable).
    pub provisioning_class_name: String,
    /// Class parameters (immutable).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub parameters: BTreeMap<String, String>,
}

/// One podset of a [`ProvisioningRequest`].
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ProvisioningRequestPodSet {
    /// The PodTemplate describing the pods.
    pub pod_template_ref: PodTemplateReference,
    /// How many such pods.
    pub count: i32,
}

/// A reference to a PodTemplate by name.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct PodTemplateReference {
    /// The PodTemplate's name.
    pub name: String,
}

/// `ProvisioningRequest.status`, written by cluster-autoscaler.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct ProvisioningRequestStatus {
    /// `Accepted`, `Provisioned`, `Failed`, `BookingExpired`, `CapacityRevoked`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Class-specific details of the provisioned capacity (e.g. a node pool name).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub provisioning_class_details: BTreeMap<String, String>,
}

/// Condition types of a [`ProvisioningRequest`].
pub mod provisioning_condition {
    /// cluster-autoscaler took the request.
    pub const ACCEPTED: &str = "Accepted";
    /// The capacity exists and is booked for the pods.
    pub const PROVISIONED: &str = "Provisioned";
    /// The capacity could not be provisioned.
    pub const FAILED: &str = "Failed";
    /// The booking lapsed before the pods were created.
    pub const BOOKING_EXPIRED: &str = "BookingExpired";
    /// The capacity was taken back.
    pub const CAPACITY_REVOKED: &str = "CapacityRevoked";
}

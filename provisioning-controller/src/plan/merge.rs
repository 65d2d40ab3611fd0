//! When two podsets may share one PodTemplate (`podSetMergePolicy`), and the semantic equality
//! of Kubernetes objects it rests on: no nulls, no empty lists or maps, quantities compared by
//! amount.

use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
use kueue_admission_sdk::api::ExactQuantity;
use serde::Serialize;
use serde_json::Value;

use super::PlanError;

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

/// `IdenticalWorkloadSchedulingRequirements`.
pub(super) fn same_scheduling_requirements(a: &PodTemplateSpec, b: &PodTemplateSpec) -> bool {
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
pub(super) fn same_requests(a: &[Container], b: &[Container]) -> bool {
    let requests = |c: &Container| {
        let requests = c.resources.as_ref().and_then(|r| r.requests.as_ref());
        semantic("requests", &requests)
    };
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| requests(x) == requests(y))
}

/// Object keys whose value, when empty, means the same as no value: Go maps (which Kubernetes
/// omits when empty) and structs held by value.
pub(super) const EMPTY_MEANS_ABSENT: &[&str] = &[
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
pub(super) const QUANTITY_MAPS: &[&str] = &["limits", "overhead", "requests"];

/// A value reduced to what Kubernetes' semantic equality compares: no nulls, no empty lists,
/// no empty maps, and quantities in canonical form (`1` equals `1000m`). `None` for nothing.
pub(super) fn semantic<T: Serialize + ?Sized>(key: &str, value: &T) -> Option<Value> {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| normalize(key, v))
}

pub(super) fn normalize(key: &str, value: Value) -> Option<Value> {
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
pub(super) fn canonical_quantity(text: &str) -> String {
    text.parse::<ExactQuantity>()
        .map_or_else(|_| text.to_string(), |q| q.to_string())
}

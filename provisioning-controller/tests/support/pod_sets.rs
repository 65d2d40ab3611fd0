//! Podset builders shared by the planner's unit tests (`src/plan/tests.rs`) and its property
//! tests (`tests/plan_properties.rs`), included by path in both.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kueue_admission_sdk::api::PodSet;

/// A resource list from `(resource, quantity)` pairs; `None` when there are none, as an unset
/// field reads.
pub fn resources(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, Quantity>> {
    (!pairs.is_empty()).then(|| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
            .collect()
    })
}

/// A container `name` of image `img-<name>` with these requests and limits.
pub fn container(name: &str, requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Container {
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

/// A podset of `count` pods running `containers`.
pub fn pod_set(name: &str, count: i32, containers: Vec<Container>) -> PodSet {
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

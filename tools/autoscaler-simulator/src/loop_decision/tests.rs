//! The rules of `docs/autoscaler-contract.md` ("What a faithful simulator must do"), each
//! pinned by tests named `rule_<n>_…`. Time is an input: every test drives `now`.
//!
//! Rule 1 (CRD limits; podSets, class and parameters immutable on v1 and v1beta1) is enforced
//! by the API server through the CRD, not by the simulator; the end-to-end tests pin it.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod, PodTemplate};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kueue_admission_sdk::api::ProvisioningRequest;
use kueue_admission_sdk::api::provisioning_condition::{
    ACCEPTED, BOOKING_EXPIRED, CAPACITY_REVOKED, FAILED, PROVISIONED,
};
use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::conditions::{
    BEST_EFFORT_CLASS, CHECK_CAPACITY_CLASS, CONSUME_ANNOTATION, DEPRECATED_CONSUME_ANNOTATION,
    reason,
};
use crate::node_groups::parse_node_groups;

const NS: &str = "ns";
const MINUTE: i64 = 60;
const DAY: i64 = 24 * 3600;

fn at(second: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + second).expect("in range")
}

fn time(second: i64) -> String {
    at(second).to_string()
}

fn node(name: &str, group: Option<&str>, cpu: &str) -> Node {
    let mut value = json!({
        "metadata": {"name": name, "labels": {}, "annotations": {}},
        "spec": {},
        "status": {
            "allocatable": {"cpu": cpu, "memory": "64Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    });
    if let Some(group) = group {
        value["metadata"]["labels"]["kwok-nodegroup"] = json!(group);
        value["metadata"]["annotations"]["kwok.x-k8s.io/node"] = json!("fake");
        value["spec"]["providerID"] = json!(format!("kwok:{name}"));
    }
    serde_json::from_value(value).expect("node")
}

fn template(name: &str, cpu: &str) -> PodTemplate {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS},
        "template": {"spec": {
            "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}],
            "tolerations": [{"key": "kwok-provider", "operator": "Exists"}],
        }},
    }))
    .expect("template")
}

fn request(name: &str, class: &str, podsets: &[(&str, i32)]) -> ProvisioningRequest {
    let pod_sets: Vec<Value> = podsets
        .iter()
        .map(|(t, count)| json!({"podTemplateRef": {"name": t}, "count": count}))
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "autoscaling.x-k8s.io/v1",
        "kind": "ProvisioningRequest",
        "metadata": {
            "name": name, "namespace": NS, "uid": format!("uid-{name}"), "generation": 1,
            "creationTimestamp": time(0), "resourceVersion": "1",
        },
        "spec": {"podSets": pod_sets, "provisioningClassName": class},
    }))
    .expect("request")
}

fn with_parameter(mut r: ProvisioningRequest, key: &str, value: &str) -> ProvisioningRequest {
    r.spec.parameters.insert(key.into(), value.into());
    r
}

fn with_conditions(
    mut r: ProvisioningRequest,
    conditions: &[(&str, &str, i64)],
) -> ProvisioningRequest {
    let conditions = conditions
        .iter()
        .map(|(t, s, second)| {
            serde_json::from_value(json!({
                "type": t, "status": s, "reason": "Earlier", "message": "",
                "lastTransitionTime": time(*second),
            }))
            .expect("condition")
        })
        .collect();
    r.status = Some(kueue_admission_sdk::api::ProvisioningRequestStatus {
        conditions,
        ..Default::default()
    });
    r
}

fn bound_pod(name: &str, node: &str, cpu: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
        "status": {"phase": "Running"},
    }))
    .expect("pod")
}

fn pending_pod(name: &str, cpu: &str, annotations: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS, "annotations": annotations},
        "spec": {
            "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}],
            "tolerations": [{"key": "kwok-provider", "operator": "Exists"}],
        },
        "status": {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"},
        ]},
    }))
    .expect("pod")
}

/// Group `g`: Nodes of 4 cpu, `min`..`max` of them.
fn settings_with_group(min: u32, max: u32) -> Settings {
    let yaml = format!(
        "kind: Node\nmetadata:\n  name: g-template\n  labels: {{kwok-nodegroup: g}}\n  annotations:\n    \
         cluster-autoscaler.kwok.nodegroup/min-count: '{min}'\n    cluster-autoscaler.kwok.nodegroup/max-count: '{max}'\n\
         status:\n  allocatable: {{cpu: '4', memory: 64Gi, pods: '110'}}\n"
    );
    let loaded = parse_node_groups(&yaml, "kwok-nodegroup", false).expect("valid");
    Settings {
        node_groups: loaded.groups,
        ..Settings::default()
    }
}

fn view(
    nodes: Vec<Node>,
    pods: Vec<Pod>,
    requests: Vec<ProvisioningRequest>,
    templates: Vec<PodTemplate>,
) -> ClusterView {
    ClusterView {
        nodes,
        pods,
        requests,
        templates,
    }
}

fn written<'a>(actions: &'a LoopActions, name: &str) -> Option<&'a [Condition]> {
    actions
        .status_writes
        .iter()
        .find(|w| w.request.name == name)
        .map(|w| &w.conditions[..])
}

/// `(status, reason)` of the condition `type_` written on `name`.
fn outcome<'a>(actions: &'a LoopActions, name: &str, type_: &str) -> Option<(&'a str, &'a str)> {
    written(actions, name)?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.as_str(), c.reason.as_str()))
}

/// `view` with the loop's status writes applied, as the next loop sees them.
fn apply(mut view: ClusterView, actions: &LoopActions) -> ClusterView {
    for write in &actions.status_writes {
        if let Some(r) = view
            .requests
            .iter_mut()
            .find(|r| r.metadata.uid.as_deref() == Some(&write.request.uid))
        {
            r.status.get_or_insert_with(Default::default).conditions = write.conditions.clone();
        }
    }
    view.requests.retain(|r| {
        !actions
            .request_deletions
            .iter()
            .any(|d| Some(&d.uid) == r.metadata.uid.as_ref())
    });
    view
}

fn run(settings: &Settings, view: &ClusterView, now: i64) -> LoopActions {
    run_loop(settings, view, &mut LoopState::default(), at(now))
}

#[path = "tests_capacity.rs"]
mod capacity_rules;
#[path = "tests_lifecycle.rs"]
mod lifecycle_rules;
#[path = "tests_requests.rs"]
mod requests_rules;

//! The exact JSON of the API types. The runtime server-side-applies them, so what a field
//! serializes to (absent or present, empty or skipped) is ownership on the API server: these
//! golden strings pin it, and what is missing on the wire must still read back.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Toleration;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::*;

fn time() -> Time {
    Time(
        "2026-01-02T03:04:05Z"
            .parse::<Timestamp>()
            .expect("a timestamp"),
    )
}

fn condition(type_: &str) -> Condition {
    Condition {
        last_transition_time: time(),
        message: "m".into(),
        observed_generation: Some(2),
        reason: "R".into(),
        status: "True".into(),
        type_: type_.into(),
    }
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// `value` serializes to `golden` exactly, and reads back from it unchanged.
#[track_caller]
fn assert_wire<T>(value: &T, golden: &str)
where
    T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let json = serde_json::to_string(value).expect("serializes");
    assert_eq!(json, golden);
    let back: T = serde_json::from_str(&json).expect("reads back");
    assert_eq!(&back, value);
}

/// `json` (fields left out) reads as `expected`.
#[track_caller]
fn assert_reads<T>(json: &str, expected: &T)
where
    T: DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let read: T = serde_json::from_str(json).expect("reads");
    assert_eq!(&read, expected);
}

/// `json`, which lacks a field the API requires, is refused.
#[track_caller]
fn assert_refused<T: DeserializeOwned + std::fmt::Debug>(json: &str) {
    let read = serde_json::from_str::<T>(json);
    assert!(read.is_err(), "{json} read as {read:?}");
}

fn full_check_state() -> AdmissionCheckState {
    AdmissionCheckState {
        name: "ac".into(),
        state: CheckState::Retry,
        last_transition_time: Some(time()),
        message: "later".into(),
        requeue_after_seconds: Some(30),
        retry_count: Some(1),
        pod_set_updates: vec![PodSetUpdate {
            name: "main".into(),
            labels: map(&[("l", "1")]),
            annotations: map(&[("a", "2")]),
            node_selector: map(&[("n", "3")]),
            tolerations: vec![Toleration {
                key: Some("k".into()),
                ..Toleration::default()
            }],
        }],
    }
}

fn full_workload() -> Workload {
    let mut wl = Workload::new(
        "wl",
        WorkloadSpec {
            pod_sets: vec![PodSet {
                name: "main".into(),
                template: Default::default(),
                count: 3,
                min_count: Some(1),
            }],
            queue_name: Some("lq".into()),
            priority: Some(5),
            active: Some(false),
            maximum_execution_time_seconds: Some(60),
        },
    );
    wl.status = Some(WorkloadStatus {
        conditions: vec![condition("QuotaReserved")],
        admission: Some(Admission {
            cluster_queue: "cq".into(),
            pod_set_assignments: vec![PodSetAssignment {
                name: "main".into(),
                flavors: map(&[("cpu", "default")]),
                resource_usage: [("cpu".to_string(), Quantity("3".into()))].into(),
                count: Some(3),
            }],
        }),
        requeue_state: Some(RequeueState {
            count: Some(1),
            requeue_at: Some(time()),
        }),
        admission_checks: vec![full_check_state()],
        scheduling_stats: Some(SchedulingStats {
            evictions: vec![EvictionCount {
                reason: "AdmissionCheck".into(),
                underlying_cause: "".into(),
                count: 2,
            }],
        }),
    });
    wl
}

#[test]
fn workload_wire_format() {
    assert_wire(
        &full_workload(),
        r#"{"apiVersion":"kueue.x-k8s.io/v1beta2","kind":"Workload","metadata":{"name":"wl"},"spec":{"podSets":[{"name":"main","template":{},"count":3,"minCount":1}],"queueName":"lq","priority":5,"active":false,"maximumExecutionTimeSeconds":60},"status":{"conditions":[{"lastTransitionTime":"2026-01-02T03:04:05Z","message":"m","observedGeneration":2,"reason":"R","status":"True","type":"QuotaReserved"}],"admission":{"clusterQueue":"cq","podSetAssignments":[{"name":"main","flavors":{"cpu":"default"},"resourceUsage":{"cpu":"3"},"count":3}]},"requeueState":{"count":1,"requeueAt":"2026-01-02T03:04:05Z"},"admissionChecks":[{"name":"ac","state":"Retry","lastTransitionTime":"2026-01-02T03:04:05Z","message":"later","requeueAfterSeconds":30,"retryCount":1,"podSetUpdates":[{"name":"main","labels":{"l":"1"},"annotations":{"a":"2"},"nodeSelector":{"n":"3"},"tolerations":[{"key":"k"}]}]}],"schedulingStats":{"evictions":[{"reason":"AdmissionCheck","underlyingCause":"","count":2}]}}}"#,
    );
    let mut bare = Workload::new("wl", WorkloadSpec::default());
    bare.status = Some(WorkloadStatus::default());
    assert_wire(
        &bare,
        r#"{"apiVersion":"kueue.x-k8s.io/v1beta2","kind":"Workload","metadata":{"name":"wl"},"spec":{"podSets":[]},"status":{}}"#,
    );
    assert_wire(
        &WorkloadSpec {
            pod_sets: vec![PodSet::default()],
            ..WorkloadSpec::default()
        },
        r#"{"podSets":[{"name":"","template":{},"count":0}]}"#,
    );
    assert_wire(
        &Admission {
            cluster_queue: "cq".into(),
            pod_set_assignments: vec![PodSetAssignment {
                name: "main".into(),
                ..PodSetAssignment::default()
            }],
        },
        r#"{"clusterQueue":"cq","podSetAssignments":[{"name":"main"}]}"#,
    );
    assert_wire(&RequeueState::default(), "{}");
    assert_wire(&SchedulingStats::default(), "{}");
}

#[test]
fn workload_reads_with_optional_fields_left_out() {
    // (What is left out of the wire format reads back in the `*_wire_format` tests.)
    assert_reads(
        r#"{"clusterQueue":"cq"}"#,
        &Admission {
            cluster_queue: "cq".into(),
            ..Admission::default()
        },
    );
    assert_reads(
        r#"{"reason":"Deactivated","count":1}"#,
        &EvictionCount {
            reason: "Deactivated".into(),
            underlying_cause: String::new(),
            count: 1,
        },
    );
    // A status write with no message and no time still reads (Kueue requires neither on read).
    assert_reads(
        r#"{"name":"ac","state":"Ready"}"#,
        &AdmissionCheckState {
            name: "ac".into(),
            state: CheckState::Ready,
            ..AdmissionCheckState::default()
        },
    );
}

#[test]
fn workload_required_fields_stay_required() {
    assert_refused::<Admission>(r#"{}"#);
    assert_refused::<PodSetAssignment>(r#"{}"#);
    assert_refused::<EvictionCount>(r#"{"reason":"Deactivated"}"#);
    assert_refused::<EvictionCount>(r#"{"count":1}"#);
    assert_refused::<AdmissionCheckState>(r#"{"name":"ac"}"#);
    assert_refused::<AdmissionCheckState>(r#"{"state":"Ready"}"#);
    assert_refused::<PodSetUpdate>(r#"{}"#);
}

#[test]
fn check_state_wire_format() {
    assert_wire(
        &AdmissionCheckState {
            name: "ac".into(),
            ..AdmissionCheckState::default()
        },
        r#"{"name":"ac","state":"Pending","message":""}"#,
    );
    assert_wire(
        &PodSetUpdate {
            name: "main".into(),
            ..PodSetUpdate::default()
        },
        r#"{"name":"main"}"#,
    );
}

#[test]
fn admission_check_wire_format() {
    let mut full = AdmissionCheck::new(
        "ac",
        AdmissionCheckSpec {
            controller_name: "example.com/check".into(),
            parameters: Some(AdmissionCheckParametersReference {
                api_group: "example.com".into(),
                kind: "Params".into(),
                name: "p".into(),
            }),
        },
    );
    full.status = Some(AdmissionCheckStatus {
        conditions: vec![condition(ADMISSION_CHECK_ACTIVE)],
    });
    assert_wire(
        &full,
        r#"{"apiVersion":"kueue.x-k8s.io/v1beta2","kind":"AdmissionCheck","metadata":{"name":"ac"},"spec":{"controllerName":"example.com/check","parameters":{"apiGroup":"example.com","kind":"Params","name":"p"}},"status":{"conditions":[{"lastTransitionTime":"2026-01-02T03:04:05Z","message":"m","observedGeneration":2,"reason":"R","status":"True","type":"Active"}]}}"#,
    );
    let mut bare = AdmissionCheck::new("ac", AdmissionCheckSpec::default());
    bare.status = Some(AdmissionCheckStatus::default());
    assert_wire(
        &bare,
        r#"{"apiVersion":"kueue.x-k8s.io/v1beta2","kind":"AdmissionCheck","metadata":{"name":"ac"},"spec":{"controllerName":""},"status":{}}"#,
    );
    assert_wire(
        &AdmissionCheckParametersReference::default(),
        r#"{"apiGroup":"","kind":"","name":""}"#,
    );
    assert_reads(
        r#"{"controllerName":"c"}"#,
        &AdmissionCheckSpec {
            controller_name: "c".into(),
            parameters: None,
        },
    );
    assert_refused::<AdmissionCheckSpec>(r#"{}"#);
}

#[test]
fn queue_wire_format() {
    let mut cq = ClusterQueue::new(
        "cq",
        ClusterQueueSpec {
            namespace_selector: Some(LabelSelector::default()),
            resource_groups: vec![ResourceGroup {
                covered_resources: vec!["cpu".into()],
                flavors: vec![FlavorQuotas {
                    name: "default".into(),
                    resources: vec![ResourceQuota {
                        name: "cpu".into(),
                        nominal_quota: Quantity("4".into()),
                    }],
                }],
            }],
            admission_checks_strategy: Some(AdmissionChecksStrategy {
                admission_checks: vec![AdmissionCheckStrategyRule {
                    name: "ac".into(),
                    on_flavors: vec!["default".into()],
                }],
            }),
        },
    );
    cq.status = Some(ClusterQueueStatus {
        conditions: vec![condition("Active")],
    });
    assert_wire(
        &cq,
        r#"{"apiVersion":"kueue.x-k8s.io/v1beta2","kind":"ClusterQueue","metadata":{"name":"cq"},"spec":{"namespaceSelector":{},"resourceGroups":[{"coveredResources":["cpu"],"flavors":[{"name":"default","resources":[{"name":"cpu","nominalQuota":"4"}]}]}],"admissionChecksStrategy":{"admissionChecks":[{"name":"ac","onFlavors":["default"]}]}},"status":{"conditions":[{"lastTransitionTime":"2026-01-02T03:04:05Z","message":"m","observedGeneration":2,"reason":"R","status":"True","type":"Active"}]}}"#,
    );
    let mut bare = ClusterQueue::new("cq", ClusterQueueSpec::default());
    bare.status = Some(ClusterQueueStatus::default());
    assert_wire(
        &bare,
        r#"{"apiVersion":"kueue.x-k8s.io/v1beta2","kind":"ClusterQueue","metadata":{"name":"cq"},"spec":{},"status":{}}"#,
    );
    assert_wire(
        &ResourceGroup::default(),
        r#"{"coveredResources":[],"flavors":[]}"#,
    );
    assert_wire(&FlavorQuotas::default(), r#"{"name":"","resources":[]}"#);
    assert_wire(
        &AdmissionChecksStrategy::default(),
        r#"{"admissionChecks":[]}"#,
    );
    assert_wire(&AdmissionCheckStrategyRule::default(), r#"{"name":""}"#);
    let flavor = ResourceFlavor::new(
        "default",
        ResourceFlavorSpec {
            node_labels: map(&[("zone", "a")]),
            tolerations: vec![Toleration::default()],
            topology_name: Some("racks".into()),
        },
    );
    assert_wire(
        &flavor,
        r#"{"apiVersion":"kueue.x-k8s.io/v1beta2","kind":"ResourceFlavor","metadata":{"name":"default"},"spec":{"nodeLabels":{"zone":"a"},"tolerations":[{}],"topologyName":"racks"}}"#,
    );
    assert_wire(&ResourceFlavorSpec::default(), "{}");
    let lq = LocalQueue::new(
        "lq",
        LocalQueueSpec {
            cluster_queue: "cq".into(),
        },
    );
    assert_wire(
        &lq,
        r#"{"apiVersion":"kueue.x-k8s.io/v1beta2","kind":"LocalQueue","metadata":{"name":"lq"},"spec":{"clusterQueue":"cq"}}"#,
    );
    assert_reads(
        r#"{"name":"f"}"#,
        &FlavorQuotas {
            name: "f".into(),
            resources: vec![],
        },
    );
    assert_reads(
        r#"{"name":"ac"}"#,
        &AdmissionCheckStrategyRule {
            name: "ac".into(),
            on_flavors: vec![],
        },
    );
    assert_refused::<FlavorQuotas>(r#"{}"#);
    assert_refused::<ResourceQuota>(r#"{"name":"cpu"}"#);
    assert_refused::<ResourceQuota>(r#"{"nominalQuota":"1"}"#);
    assert_refused::<AdmissionCheckStrategyRule>(r#"{}"#);
    assert_refused::<LocalQueueSpec>(r#"{}"#);
}

#[test]
fn provisioning_wire_format() {
    let config = ProvisioningRequestConfig::new(
        "prc",
        ProvisioningRequestConfigSpec {
            provisioning_class_name: "check-capacity.autoscaling.x-k8s.io".into(),
            parameters: map(&[("p", "v")]),
            managed_resources: vec!["nvidia.com/gpu".into()],
            retry_strategy: Some(ProvisioningRequestRetryStrategy {
                backoff_limit_count: Some(3),
                backoff_base_seconds: Some(60),
                backoff_max_seconds: Some(1800),
            }),
            pod_set_updates: Some(ProvisioningRequestPodSetUpdates {
                node_selector: vec![ProvisioningRequestPodSetUpdatesNodeSelector {
                    key: "pool".into(),
                    value_from_provisioning_class_detail: "node-pool".into(),
                }],
            }),
            pod_set_merge_policy: Some("IdenticalPodTemplates".into()),
        },
    );
    assert_wire(
        &config,
        r#"{"apiVersion":"kueue.x-k8s.io/v1beta2","kind":"ProvisioningRequestConfig","metadata":{"name":"prc"},"spec":{"provisioningClassName":"check-capacity.autoscaling.x-k8s.io","parameters":{"p":"v"},"managedResources":["nvidia.com/gpu"],"retryStrategy":{"backoffLimitCount":3,"backoffBaseSeconds":60,"backoffMaxSeconds":1800},"podSetUpdates":{"nodeSelector":[{"key":"pool","valueFromProvisioningClassDetail":"node-pool"}]},"podSetMergePolicy":"IdenticalPodTemplates"}}"#,
    );
    assert_wire(&ProvisioningRequestConfigSpec::default(), "{}");
    assert_wire(&ProvisioningRequestRetryStrategy::default(), "{}");
    assert_wire(&ProvisioningRequestPodSetUpdates::default(), "{}");
    assert_wire(
        &ProvisioningRequestPodSetUpdatesNodeSelector::default(),
        r#"{"key":"","valueFromProvisioningClassDetail":""}"#,
    );

    let mut request = ProvisioningRequest::new(
        "pr",
        ProvisioningRequestSpec {
            pod_sets: vec![ProvisioningRequestPodSet {
                pod_template_ref: PodTemplateReference { name: "t".into() },
                count: 2,
            }],
            provisioning_class_name: "check-capacity.autoscaling.x-k8s.io".into(),
            parameters: map(&[("p", "v")]),
        },
    );
    request.status = Some(ProvisioningRequestStatus {
        conditions: vec![condition(provisioning_condition::PROVISIONED)],
        provisioning_class_details: map(&[("node-pool", "a")]),
    });
    assert_wire(
        &request,
        r#"{"apiVersion":"autoscaling.x-k8s.io/v1","kind":"ProvisioningRequest","metadata":{"name":"pr"},"spec":{"podSets":[{"podTemplateRef":{"name":"t"},"count":2}],"provisioningClassName":"check-capacity.autoscaling.x-k8s.io","parameters":{"p":"v"}},"status":{"conditions":[{"lastTransitionTime":"2026-01-02T03:04:05Z","message":"m","observedGeneration":2,"reason":"R","status":"True","type":"Provisioned"}],"provisioningClassDetails":{"node-pool":"a"}}}"#,
    );
    let mut bare = ProvisioningRequest::new("pr", ProvisioningRequestSpec::default());
    bare.status = Some(ProvisioningRequestStatus::default());
    assert_wire(
        &bare,
        r#"{"apiVersion":"autoscaling.x-k8s.io/v1","kind":"ProvisioningRequest","metadata":{"name":"pr"},"spec":{"podSets":[],"provisioningClassName":""},"status":{}}"#,
    );

    assert_reads(
        r#"{"podSets":[],"provisioningClassName":"c"}"#,
        &ProvisioningRequestSpec {
            provisioning_class_name: "c".into(),
            ..ProvisioningRequestSpec::default()
        },
    );
    assert_refused::<ProvisioningRequestSpec>(r#"{"podSets":[]}"#);
    assert_refused::<ProvisioningRequestSpec>(r#"{"provisioningClassName":"c"}"#);
    assert_refused::<ProvisioningRequestPodSet>(r#"{"count":1}"#);
    assert_refused::<ProvisioningRequestPodSet>(r#"{"podTemplateRef":{}}"#);
}

/// The structs whose every field may be missing read `{}` as their `Default`.
#[test]
fn all_optional_structs_read_an_empty_object_as_their_default() {
    fn reads_empty_as_default<T: DeserializeOwned + Default + PartialEq + std::fmt::Debug>() {
        assert_reads("{}", &T::default());
    }
    reads_empty_as_default::<WorkloadSpec>();
    reads_empty_as_default::<WorkloadStatus>();
    reads_empty_as_default::<PodSet>();
    reads_empty_as_default::<RequeueState>();
    reads_empty_as_default::<SchedulingStats>();
    reads_empty_as_default::<AdmissionCheckParametersReference>();
    reads_empty_as_default::<AdmissionCheckStatus>();
    reads_empty_as_default::<ClusterQueueSpec>();
    reads_empty_as_default::<ClusterQueueStatus>();
    reads_empty_as_default::<ResourceFlavorSpec>();
    reads_empty_as_default::<ResourceGroup>();
    reads_empty_as_default::<AdmissionChecksStrategy>();
    reads_empty_as_default::<ProvisioningRequestConfigSpec>();
    reads_empty_as_default::<ProvisioningRequestRetryStrategy>();
    reads_empty_as_default::<ProvisioningRequestPodSetUpdates>();
    reads_empty_as_default::<ProvisioningRequestPodSetUpdatesNodeSelector>();
    reads_empty_as_default::<PodTemplateReference>();
    reads_empty_as_default::<ProvisioningRequestStatus>();
}

/// `kueue_kind!` spells the group and version as literals (the derive takes no constants):
/// they must say what the crate's public constants say.
#[test]
fn every_kueue_kind_speaks_the_published_group_and_version() {
    use kube::Resource;
    let expected = format!("{KUEUE_GROUP}/{KUEUE_VERSION}");
    for api_version in [
        Workload::api_version(&()),
        AdmissionCheck::api_version(&()),
        ClusterQueue::api_version(&()),
        LocalQueue::api_version(&()),
        ResourceFlavor::api_version(&()),
        ProvisioningRequestConfig::api_version(&()),
    ] {
        assert_eq!(api_version, expected);
    }
}

//! The planner's unit tests.

use super::merge::{canonical_quantity, semantic};
use super::*;

#[path = "../../tests/support/pod_sets.rs"]
mod pod_sets;
use pod_sets::{container, pod_set, resources};

use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PodSpec,
    ResourceRequirements, Toleration,
};
use kueue_admission_sdk::api::PodSetAssignment;
use kueue_admission_sdk::testing::WorkloadBuilder;

/// A podset whose pods run one container, `main`, with these requests and limits.
fn main_pod_set(
    name: &str,
    count: i32,
    requests: &[(&str, &str)],
    limits: &[(&str, &str)],
) -> PodSet {
    pod_set(name, count, vec![container("main", requests, limits)])
}

fn cpu_pod_set(name: &str, count: i32) -> PodSet {
    main_pod_set(name, count, &[("cpu", "1")], &[])
}

/// The test config, with `nvidia.com/gpu` its only managed resource.
fn gpu_managed() -> ProvisioningRequestConfigSpec {
    ProvisioningRequestConfigSpec {
        managed_resources: vec!["nvidia.com/gpu".into()],
        ..config()
    }
}

fn spec_of(ps: &mut PodSet) -> &mut PodSpec {
    ps.template.spec.get_or_insert_with(Default::default)
}

/// A Workload holding quota: every podset assigned `flavor` for cpu, with its own count.
fn workload(pod_sets: Vec<PodSet>, flavor: &str) -> Workload {
    WorkloadBuilder::new("team-a", "job-1")
        .uid("uid-1")
        .with(|wl| wl.spec.pod_sets = pod_sets)
        .quota_reserved("cq", flavor)
        .build()
}

fn assignment_mut<'a>(wl: &'a mut Workload, name: &str) -> &'a mut PodSetAssignment {
    wl.status
        .as_mut()
        .and_then(|s| s.admission.as_mut())
        .and_then(|a| a.pod_set_assignments.iter_mut().find(|p| p.name == name))
        .expect("assignment")
}

/// One podset, `main`, of one pod requesting a cpu, assigned flavor `spot`, and `quantity` of
/// `resource`, assigned `flavor`.
fn spot_cpu_and(resource: &str, quantity: &str, flavor: &str) -> Workload {
    let ps = main_pod_set("main", 1, &[("cpu", "1"), (resource, quantity)], &[]);
    let mut wl = workload(vec![ps], "spot");
    assign_flavor(&mut wl, "main", resource, flavor);
    wl
}

/// Removes every podset assignment but `name`'s.
fn keep_only_assignment_of(wl: &mut Workload, name: &str) {
    let admission = wl.status.as_mut().and_then(|s| s.admission.as_mut());
    admission
        .expect("admission")
        .pod_set_assignments
        .retain(|a| a.name == name);
}

/// Assigns `flavor` to `resource` of podset `pod_set`.
fn assign_flavor(wl: &mut Workload, pod_set: &str, resource: &str, flavor: &str) {
    let assignment = assignment_mut(wl, pod_set);
    assignment.flavors.insert(resource.into(), flavor.into());
}

fn config() -> ProvisioningRequestConfigSpec {
    ProvisioningRequestConfigSpec {
        provisioning_class_name: "check-capacity.autoscaling.x-k8s.io".into(),
        ..Default::default()
    }
}

fn toleration(key: &str, value: &str) -> Toleration {
    Toleration {
        key: Some(key.into()),
        operator: Some("Equal".into()),
        value: Some(value.into()),
        effect: Some("NoSchedule".into()),
        toleration_seconds: None,
    }
}

fn flavors() -> BTreeMap<String, ResourceFlavorSpec> {
    BTreeMap::from([
        ("default".to_string(), ResourceFlavorSpec::default()),
        (
            "spot".to_string(),
            ResourceFlavorSpec {
                node_labels: BTreeMap::from([
                    ("pool".to_string(), "spot".to_string()),
                    ("zone".to_string(), "a".to_string()),
                ]),
                tolerations: vec![toleration("spot", "true")],
                topology_name: None,
            },
        ),
        (
            "gpu".to_string(),
            ResourceFlavorSpec {
                node_labels: BTreeMap::from([("accelerator".to_string(), "a100".to_string())]),
                tolerations: vec![toleration("nvidia.com/gpu", "present")],
                topology_name: None,
            },
        ),
        (
            "other-pool".to_string(),
            ResourceFlavorSpec {
                node_labels: BTreeMap::from([("pool".to_string(), "other".to_string())]),
                tolerations: vec![],
                topology_name: None,
            },
        ),
    ])
}

fn run(wl: &Workload, config: &ProvisioningRequestConfigSpec) -> Result<Plan, PlanError> {
    plan(&PlanInput {
        workload: wl,
        check: "prov",
        attempt: 1,
        config,
        flavors: &flavors(),
    })
}

fn request(wl: &Workload, config: &ProvisioningRequestConfigSpec) -> RequestPlan {
    match run(wl, config) {
        Ok(Plan::Request(r)) => r,
        other => panic!("expected a request, got {other:?}"),
    }
}

fn members(r: &RequestPlan) -> Vec<(Vec<&str>, i32)> {
    r.pod_sets
        .iter()
        .map(|p| (p.members.iter().map(String::as_str).collect(), p.count))
        .collect()
}

fn with_policy(policy: &str) -> ProvisioningRequestConfigSpec {
    ProvisioningRequestConfigSpec {
        pod_set_merge_policy: Some(policy.into()),
        ..config()
    }
}

fn pod_spec(p: &PlannedPodSet) -> &PodSpec {
    p.template.spec.as_ref().expect("spec")
}

#[test]
fn one_podset_one_request() {
    let wl = workload(vec![cpu_pod_set("main", 4)], "default");
    let r = request(&wl, &config());
    assert_eq!(r.name, "job-1-prov-1");
    assert_eq!(
        r.provisioning_class_name,
        "check-capacity.autoscaling.x-k8s.io"
    );
    assert!(r.parameters.is_empty());
    assert_eq!(members(&r), vec![(vec!["main"], 4)]);
    assert_eq!(r.pod_sets[0].template_name, "ppt-job-1-prov-1-main");
    assert_eq!(r.pod_sets[0].template, wl.spec.pod_sets[0].template);
}

#[test]
fn attempt_goes_into_the_names() {
    let wl = workload(vec![cpu_pod_set("main", 1)], "default");
    let r = match plan(&PlanInput {
        workload: &wl,
        check: "prov",
        attempt: 3,
        config: &config(),
        flavors: &flavors(),
    }) {
        Ok(Plan::Request(r)) => r,
        other => panic!("{other:?}"),
    };
    assert_eq!(r.name, names::request_name("job-1", "prov", 3));
    assert_eq!(r.pod_sets[0].template_name, "ppt-job-1-prov-3-main");
}

#[test]
fn not_needed_when_every_count_is_zero() {
    let wl = workload(vec![cpu_pod_set("a", 0), cpu_pod_set("b", 0)], "default");
    assert_eq!(run(&wl, &config()), Ok(Plan::NotNeeded));
}

#[test]
fn zero_assigned_count_is_skipped() {
    let mut wl = workload(vec![cpu_pod_set("a", 3), cpu_pod_set("b", 2)], "default");
    assignment_mut(&mut wl, "a").count = Some(0);
    assert_eq!(members(&request(&wl, &config())), vec![(vec!["b"], 2)]);
    assignment_mut(&mut wl, "b").count = Some(0);
    assert_eq!(run(&wl, &config()), Ok(Plan::NotNeeded));
}

#[test]
fn counts_come_from_the_assignment_then_the_podset() {
    let mut wl = workload(vec![cpu_pod_set("a", 5), cpu_pod_set("b", 7)], "default");
    assignment_mut(&mut wl, "a").count = Some(3); // partial admission
    assignment_mut(&mut wl, "b").count = None;
    assert_eq!(
        members(&request(&wl, &config())),
        vec![(vec!["a"], 3), (vec!["b"], 7)]
    );
}

#[test]
fn managed_resources_select_podsets() {
    let gpu = main_pod_set("gpu", 2, &[("cpu", "1"), ("nvidia.com/gpu", "1")], &[]);
    let wl = workload(vec![cpu_pod_set("cpu", 3), gpu], "default");
    let config = gpu_managed();
    assert_eq!(members(&request(&wl, &config)), vec![(vec!["gpu"], 2)]);
}

#[test]
fn managed_resources_count_limits_and_init_containers() {
    let limits_only = main_pod_set("limits", 1, &[("cpu", "1")], &[("nvidia.com/gpu", "1")]);
    let mut init = cpu_pod_set("init", 2);
    spec_of(&mut init).init_containers =
        Some(vec![container("setup", &[("nvidia.com/gpu", "1")], &[])]);
    let wl = workload(vec![limits_only, cpu_pod_set("cpu", 3), init], "default");
    let config = gpu_managed();
    assert_eq!(
        members(&request(&wl, &config)),
        vec![(vec!["limits"], 1), (vec!["init"], 2)]
    );
}

#[test]
fn not_needed_when_no_podset_uses_managed_resources() {
    let wl = workload(vec![cpu_pod_set("a", 3)], "default");
    let config = gpu_managed();
    assert_eq!(run(&wl, &config), Ok(Plan::NotNeeded));
}

#[test]
fn skipped_podsets_need_no_assignment() {
    let mut wl = workload(vec![cpu_pod_set("a", 3), cpu_pod_set("b", 0)], "default");
    keep_only_assignment_of(&mut wl, "a");
    assert_eq!(members(&request(&wl, &config())), vec![(vec!["a"], 3)]);
}

#[test]
fn flavor_node_labels_and_tolerations_are_added() {
    let mut ps = cpu_pod_set("main", 2);
    let spec = spec_of(&mut ps);
    spec.node_selector = Some(BTreeMap::from([("zone".to_string(), "a".to_string())]));
    // Already there, written with the default operator: not added twice.
    spec.tolerations = Some(vec![Toleration {
        operator: None,
        ..toleration("spot", "true")
    }]);
    let wl = workload(vec![ps], "spot");
    let r = request(&wl, &config());
    let spec = pod_spec(&r.pod_sets[0]);
    assert_eq!(
        spec.node_selector,
        Some(BTreeMap::from([
            ("pool".to_string(), "spot".to_string()),
            ("zone".to_string(), "a".to_string()),
        ]))
    );
    assert_eq!(spec.tolerations.as_ref().map(Vec::len), Some(1));
}

#[test]
fn every_assigned_flavor_contributes() {
    let wl = spot_cpu_and("nvidia.com/gpu", "1", "gpu");
    let r = request(&wl, &config());
    let spec = pod_spec(&r.pod_sets[0]);
    let selector = spec.node_selector.as_ref().expect("nodeSelector");
    assert_eq!(
        selector.get("accelerator").map(String::as_str),
        Some("a100")
    );
    assert_eq!(selector.get("pool").map(String::as_str), Some("spot"));
    let keys: Vec<_> = spec
        .tolerations
        .iter()
        .flatten()
        .map(|t| t.key.as_deref().unwrap_or(""))
        .collect();
    // Flavors in the order of their resource names: cpu, then nvidia.com/gpu.
    assert_eq!(keys, vec!["spot", "nvidia.com/gpu"]);
}

#[test]
fn template_node_selector_conflicting_with_a_flavor_is_an_error() {
    let mut ps = cpu_pod_set("main", 1);
    spec_of(&mut ps).node_selector = Some(BTreeMap::from([(
        "pool".to_string(),
        "on-demand".to_string(),
    )]));
    let wl = workload(vec![ps], "spot");
    let err = run(&wl, &config()).expect_err("conflict");
    assert!(matches!(err, PlanError::NodeLabelConflict(ref c) if c.key == "pool"));
    let message = err.to_string();
    assert!(message.contains("pool=spot"), "{message}");
    assert!(message.contains("pool=on-demand"), "{message}");
    assert!(message.contains("nodeSelector"), "{message}");
}

#[test]
fn flavors_with_conflicting_labels_are_an_error() {
    let wl = spot_cpu_and("memory", "1Gi", "other-pool");
    let err = run(&wl, &config()).expect_err("conflict");
    assert_eq!(
        err,
        PlanError::NodeLabelConflict(Box::new(LabelConflict {
            pod_set: "main".into(),
            key: "pool".into(),
            value: "other".into(),
            flavor: "other-pool".into(),
            existing: "spot".into(),
            existing_flavor: Some("spot".into()),
        }))
    );
    assert!(
        err.to_string().contains("from ResourceFlavor \"spot\""),
        "{err}"
    );
}

#[test]
fn unknown_flavor_is_named() {
    let wl = workload(vec![cpu_pod_set("main", 1)], "vanished");
    let err = run(&wl, &config()).expect_err("unknown flavor");
    assert_eq!(
        err,
        PlanError::UnknownFlavor {
            pod_set: "main".into(),
            flavor: "vanished".into()
        }
    );
    assert!(err.to_string().contains("\"vanished\""));
}

#[test]
fn missing_assignment_is_an_error() {
    let mut wl = workload(vec![cpu_pod_set("a", 1), cpu_pod_set("b", 1)], "default");
    keep_only_assignment_of(&mut wl, "a");
    assert_eq!(
        run(&wl, &config()),
        Err(PlanError::MissingAssignment {
            pod_set: "b".into()
        })
    );
}

#[test]
fn no_quota_reservation_is_an_error() {
    let mut wl = workload(vec![cpu_pod_set("a", 1)], "default");
    wl.status = None;
    assert_eq!(run(&wl, &config()), Err(PlanError::NoQuotaReservation));
}

#[test]
fn config_errors() {
    let wl = workload(vec![cpu_pod_set("a", 1)], "default");
    let no_class = ProvisioningRequestConfigSpec::default();
    assert_eq!(
        run(&wl, &no_class),
        Err(PlanError::MissingProvisioningClass)
    );
    let err = run(&wl, &with_policy("Sometimes")).expect_err("bad policy");
    assert_eq!(err, PlanError::UnknownMergePolicy("Sometimes".into()));
    assert!(err.to_string().contains("IdenticalPodTemplates"));
    assert!(run(&wl, &with_policy("")).is_ok());
}

#[test]
fn limits_are_copied_into_missing_requests() {
    let mut ps = main_pod_set(
        "main",
        1,
        &[("cpu", "500m")],
        &[("cpu", "2"), ("memory", "1Gi")],
    );
    let spec = spec_of(&mut ps);
    spec.init_containers = Some(vec![container("init", &[], &[("cpu", "1")])]);
    spec.resources = Some(ResourceRequirements {
        limits: resources(&[("memory", "4Gi")]),
        ..Default::default()
    });
    let wl = workload(vec![ps], "default");
    let r = request(&wl, &config());
    let spec = pod_spec(&r.pod_sets[0]);
    let requests = |c: &Container| c.resources.as_ref().and_then(|r| r.requests.clone());
    assert_eq!(
        requests(&spec.containers[0]),
        resources(&[("cpu", "500m"), ("memory", "1Gi")])
    );
    let init = &spec.init_containers.as_ref().expect("init")[0];
    assert_eq!(requests(init), resources(&[("cpu", "1")]));
    assert_eq!(
        spec.resources.as_ref().and_then(|r| r.requests.clone()),
        resources(&[("memory", "4Gi")])
    );
    // The Workload itself is untouched.
    assert_eq!(
        requests(
            &wl.spec.pod_sets[0]
                .template
                .spec
                .as_ref()
                .expect("spec")
                .containers[0]
        ),
        resources(&[("cpu", "500m")])
    );
}

#[test]
fn without_a_policy_nothing_is_merged() {
    let wl = workload(vec![cpu_pod_set("a", 1), cpu_pod_set("b", 2)], "default");
    assert_eq!(
        members(&request(&wl, &config())),
        vec![(vec!["a"], 1), (vec!["b"], 2)]
    );
}

#[test]
fn identical_pod_templates_merge_into_the_first_match() {
    let big = main_pod_set("b", 2, &[("cpu", "4")], &[]);
    let wl = workload(vec![cpu_pod_set("a", 1), big, cpu_pod_set("c", 3)], "spot");
    let r = request(&wl, &with_policy("IdenticalPodTemplates"));
    assert_eq!(members(&r), vec![(vec!["a", "c"], 4), (vec!["b"], 2)]);
    assert_eq!(r.pod_sets[0].template_name, "ppt-job-1-prov-1-a");
    assert_eq!(r.pod_sets[1].template_name, "ppt-job-1-prov-1-b");
    // The merged template is the first member's, with the flavor's additions.
    let selector = pod_spec(&r.pod_sets[0]).node_selector.clone();
    assert_eq!(
        selector.and_then(|s| s.get("pool").cloned()),
        Some("spot".into())
    );
}

#[test]
fn identical_pod_templates_compare_the_whole_template() {
    let a = cpu_pod_set("a", 1);
    let mut b = cpu_pod_set("b", 1);
    spec_of(&mut b).containers[0].image = Some("other".into());
    let wl = workload(vec![a, b], "default");
    let r = request(&wl, &with_policy("IdenticalPodTemplates"));
    assert_eq!(members(&r).len(), 2);
}

#[test]
fn identical_pod_templates_compare_quantities_by_value() {
    let a = main_pod_set("a", 1, &[("cpu", "1"), ("memory", "1Gi")], &[]);
    let b = main_pod_set("b", 2, &[("cpu", "1000m"), ("memory", "1024Mi")], &[]);
    let wl = workload(vec![a, b], "default");
    let r = request(&wl, &with_policy("IdenticalPodTemplates"));
    assert_eq!(members(&r), vec![(vec!["a", "b"], 3)]);
}

#[test]
fn templates_are_compared_before_the_flavor_additions() {
    // b writes in its template what a's flavor adds; Kueue compares the templates as the
    // Workload holds them, so they differ.
    let a = cpu_pod_set("a", 1);
    let mut b = cpu_pod_set("b", 1);
    let spec = spec_of(&mut b);
    spec.node_selector = Some(BTreeMap::from([
        ("pool".to_string(), "spot".to_string()),
        ("zone".to_string(), "a".to_string()),
    ]));
    spec.tolerations = Some(vec![toleration("spot", "true")]);
    let wl = workload(vec![a, b], "spot");
    let r = request(&wl, &with_policy("IdenticalPodTemplates"));
    assert_eq!(members(&r).len(), 2);
    assert_eq!(r.pod_sets[0].template, r.pod_sets[1].template);
}

#[test]
fn podsets_on_different_flavors_are_not_merged() {
    let mut wl = workload(vec![cpu_pod_set("a", 1), cpu_pod_set("b", 1)], "default");
    assign_flavor(&mut wl, "b", "cpu", "spot");
    for policy in [
        "IdenticalPodTemplates",
        "IdenticalWorkloadSchedulingRequirements",
    ] {
        assert_eq!(members(&request(&wl, &with_policy(policy))).len(), 2);
    }
}

#[test]
fn scheduling_requirements_ignore_what_does_not_schedule() {
    let a = pod_set(
        "a",
        1,
        vec![
            container("x", &[("cpu", "1")], &[]),
            container("y", &[("memory", "1Gi")], &[]),
        ],
    );
    // Other names, images and limits, the same requests in the same order.
    let b = pod_set(
        "b",
        2,
        vec![
            container("p", &[("cpu", "1000m")], &[("cpu", "2")]),
            container("q", &[("memory", "1Gi")], &[]),
        ],
    );
    let c = pod_set("c", 4, vec![container("x", &[("cpu", "2")], &[])]);
    let d = pod_set(
        "d",
        8,
        vec![
            container("x", &[("cpu", "1")], &[]),
            container("y", &[("memory", "1Gi")], &[]),
        ],
    );
    let wl = workload(vec![a, b, c, d], "default");
    let r = request(&wl, &with_policy("IdenticalWorkloadSchedulingRequirements"));
    assert_eq!(members(&r), vec![(vec!["a", "b", "d"], 11), (vec!["c"], 4)]);
    // Under IdenticalPodTemplates only a and d are alike.
    let r = request(&wl, &with_policy("IdenticalPodTemplates"));
    assert_eq!(
        members(&r),
        vec![(vec!["a", "d"], 9), (vec!["b"], 2), (vec!["c"], 4)]
    );
}

#[test]
fn scheduling_requirements_compare_each_field() {
    let policy = with_policy("IdenticalWorkloadSchedulingRequirements");
    type Change = Box<dyn Fn(&mut PodSpec)>;
    let changes: Vec<(&str, Change)> = vec![
        (
            "container count",
            Box::new(|s| s.containers.push(container("extra", &[], &[]))),
        ),
        (
            "init containers",
            Box::new(|s| s.init_containers = Some(vec![container("i", &[("cpu", "1")], &[])])),
        ),
        (
            "pod-level resources",
            Box::new(|s| {
                s.resources = Some(ResourceRequirements {
                    requests: resources(&[("cpu", "2")]),
                    ..Default::default()
                })
            }),
        ),
        (
            "nodeSelector",
            Box::new(|s| {
                s.node_selector = Some(BTreeMap::from([("k".to_string(), "v".to_string())]))
            }),
        ),
        (
            "tolerations",
            Box::new(|s| s.tolerations = Some(vec![toleration("k", "v")])),
        ),
        (
            "affinity",
            Box::new(|s| {
                s.affinity = Some(Affinity {
                    node_affinity: Some(NodeAffinity {
                        required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                            node_selector_terms: vec![NodeSelectorTerm {
                                match_expressions: Some(vec![NodeSelectorRequirement {
                                    key: "k".into(),
                                    operator: "Exists".into(),
                                    values: None,
                                }]),
                                match_fields: None,
                            }],
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                })
            }),
        ),
        (
            "resourceClaims",
            Box::new(|s| {
                s.resource_claims = Some(vec![k8s_openapi::api::core::v1::PodResourceClaim {
                    name: "gpu".into(),
                    ..Default::default()
                }])
            }),
        ),
    ];
    for (what, change) in changes {
        let mut b = cpu_pod_set("b", 1);
        change(spec_of(&mut b));
        let wl = workload(vec![cpu_pod_set("a", 1), b], "default");
        assert_eq!(members(&request(&wl, &policy)).len(), 2, "{what}");
    }
    // Unchanged, or changed only where scheduling does not look: merged.
    let mut b = cpu_pod_set("b", 1);
    spec_of(&mut b).restart_policy = Some("Never".into());
    let wl = workload(vec![cpu_pod_set("a", 1), b], "default");
    assert_eq!(members(&request(&wl, &policy)), vec![(vec!["a", "b"], 2)]);
}

#[test]
fn parameters_are_overlaid_by_annotations() {
    let mut wl = workload(vec![cpu_pod_set("a", 1)], "default");
    wl.metadata.annotations = Some(BTreeMap::from([
        (
            "provreq.kueue.x-k8s.io/ValidUntilSeconds".to_string(),
            "60".to_string(),
        ),
        (
            "provreq.kueue.x-k8s.io/extra".to_string(),
            "yes".to_string(),
        ),
        ("kueue.x-k8s.io/other".to_string(), "ignored".to_string()),
    ]));
    let config = ProvisioningRequestConfigSpec {
        parameters: BTreeMap::from([
            ("ValidUntilSeconds".to_string(), "3600".to_string()),
            ("BookingTime".to_string(), "5m".to_string()),
        ]),
        ..config()
    };
    let r = request(&wl, &config);
    assert_eq!(
        r.parameters,
        BTreeMap::from([
            ("BookingTime".to_string(), "5m".to_string()),
            ("ValidUntilSeconds".to_string(), "60".to_string()),
            ("extra".to_string(), "yes".to_string()),
        ])
    );
}

#[test]
fn parameter_limits() {
    let mut wl = workload(vec![cpu_pod_set("a", 1)], "default");
    wl.metadata.annotations = Some(BTreeMap::from([(
        "provreq.kueue.x-k8s.io/long".to_string(),
        "x".repeat(256),
    )]));
    assert_eq!(
        run(&wl, &config()),
        Err(PlanError::ParameterTooLong {
            key: "long".into(),
            len: 256,
            from: ParameterSource::WorkloadAnnotation,
        })
    );
    // The annotation wins over the config, and so does its length.
    let with_long_default = ProvisioningRequestConfigSpec {
        parameters: BTreeMap::from([("long".to_string(), "short".to_string())]),
        ..config()
    };
    assert!(matches!(
        run(&wl, &with_long_default),
        Err(PlanError::ParameterTooLong {
            from: ParameterSource::WorkloadAnnotation,
            ..
        })
    ));
    // Exactly at the limit, counted in characters (the CRD's maxLength counts characters,
    // not bytes): 255 two-byte characters pass.
    wl.metadata.annotations = Some(BTreeMap::from([(
        "provreq.kueue.x-k8s.io/long".to_string(),
        "é".repeat(255),
    )]));
    assert_eq!(
        request(&wl, &config()).parameters["long"].chars().count(),
        255
    );
    // A config value (the CRD refuses it, but a config is read as it is): named as such.
    wl.metadata.annotations = None;
    let long_config = ProvisioningRequestConfigSpec {
        parameters: BTreeMap::from([("c".to_string(), "x".repeat(300))]),
        ..config()
    };
    assert_eq!(
        run(&wl, &long_config),
        Err(PlanError::ParameterTooLong {
            key: "c".into(),
            len: 300,
            from: ParameterSource::Config,
        })
    );
    let config = ProvisioningRequestConfigSpec {
        parameters: (0..100)
            .map(|i| (format!("p{i}"), "v".to_string()))
            .collect(),
        ..config()
    };
    assert!(run(&wl, &config).is_ok(), "100 parameters are allowed");
    // Annotations that override a config key add nothing; a new key is the 101st.
    wl.metadata.annotations = Some(BTreeMap::from([
        ("provreq.kueue.x-k8s.io/p0".to_string(), "w".to_string()),
        ("provreq.kueue.x-k8s.io/new".to_string(), "w".to_string()),
    ]));
    assert_eq!(
        run(&wl, &config),
        Err(PlanError::TooManyParameters {
            count: 101,
            from_annotations: 1
        })
    );
}

#[test]
fn objects_carry_identification_and_only_templates_are_owned_by_the_workload() {
    let mut wl = workload(vec![cpu_pod_set("a", 2), cpu_pod_set("b", 3)], "default");
    wl.metadata.annotations = Some(BTreeMap::from([(
        "provreq.kueue.x-k8s.io/p".to_string(),
        "v".to_string(),
    )]));
    let r = request(&wl, &config());
    let pr = request_object(&r, &wl, "prov", 1, "me", &[]);
    assert_eq!(pr.metadata.name.as_deref(), Some("job-1-prov-1"));
    assert_eq!(pr.metadata.namespace.as_deref(), Some("team-a"));
    // No Workload among the request's owners (Kueue's built-in check would delete it), and
    // without templates made, no owner at all.
    assert_eq!(pr.metadata.owner_references, None);
    let labels = pr.metadata.labels.clone().expect("labels");
    assert_eq!(labels.get(MANAGED_BY_LABEL).map(String::as_str), Some("me"));
    assert_eq!(
        labels.get(WORKLOAD_UID_LABEL).map(String::as_str),
        Some("uid-1")
    );
    let annotations = pr.metadata.annotations.clone().expect("annotations");
    assert_eq!(
        annotations.get(WORKLOAD_ANNOTATION).map(String::as_str),
        Some("job-1")
    );
    assert_eq!(
        annotations.get(CHECK_ANNOTATION).map(String::as_str),
        Some("prov")
    );
    assert_eq!(
        annotations.get(ATTEMPT_ANNOTATION).map(String::as_str),
        Some("1")
    );
    assert!(!annotations.contains_key(REQUEST_ANNOTATION));
    assert_eq!(pr.spec.provisioning_class_name, r.provisioning_class_name);
    assert_eq!(pr.spec.parameters, r.parameters);
    let refs: Vec<_> = pr
        .spec
        .pod_sets
        .iter()
        .map(|p| (p.pod_template_ref.name.as_str(), p.count))
        .collect();
    assert_eq!(
        refs,
        vec![("ppt-job-1-prov-1-a", 2), ("ppt-job-1-prov-1-b", 3)]
    );

    let templates = pod_template_objects(&r, &wl, "prov", 1, "me");
    assert_eq!(templates.len(), 2);
    for (pt, planned) in templates.iter().zip(&r.pod_sets) {
        assert_eq!(pt.metadata.name.as_ref(), Some(&planned.template_name));
        assert_eq!(pt.metadata.namespace.as_deref(), Some("team-a"));
        // The Workload owns the templates (garbage collection), never as their controller and
        // never blocking its deletion.
        let owners = pt.metadata.owner_references.clone().unwrap_or_default();
        let owners: Vec<_> = owners
            .iter()
            .map(|o| {
                let flags = (o.controller, o.block_owner_deletion);
                (o.kind.as_str(), o.name.as_str(), o.uid.as_str(), flags)
            })
            .collect();
        let not = Some(false);
        assert_eq!(owners, [("Workload", "job-1", "uid-1", (not, not))]);
        assert_eq!(pt.metadata.labels, Some(labels.clone()));
        let a = pt.metadata.annotations.clone().expect("annotations");
        assert_eq!(
            a.get(REQUEST_ANNOTATION).map(String::as_str),
            Some("job-1-prov-1")
        );
        assert_eq!(a.get(ATTEMPT_ANNOTATION).map(String::as_str), Some("1"));
        assert_eq!(pt.template.as_ref(), Some(&planned.template));
    }
}

#[test]
fn workload_without_uid_gets_no_uid_label() {
    let mut wl = workload(vec![cpu_pod_set("a", 1)], "default");
    wl.metadata.uid = None;
    let r = request(&wl, &config());
    let pr = request_object(&r, &wl, "prov", 1, "me", &[]);
    assert!(
        !pr.metadata
            .labels
            .expect("labels")
            .contains_key(WORKLOAD_UID_LABEL)
    );
}

#[test]
fn quantities_in_canonical_form() {
    let c = |s: &str| canonical_quantity(s);
    for (a, b) in [
        ("1", "1000m"),
        ("1e3", "1k"),
        ("1e-3", "1m"),
        ("1Gi", "1024Mi"),
        ("1Gi", "1073741824"),
        ("0.5", "500m"),
        ("1.5k", "1500"),
        ("1E3", "1k"),
        ("1E", "1e18"),
        ("0", "0m"),
        ("+2", "2"),
    ] {
        assert_eq!(c(a), c(b), "{a} = {b}");
    }
    for (a, b) in [("1", "1Ki"), ("-1", "1")] {
        assert_ne!(c(a), c(b), "{a} != {b}");
    }
    assert_eq!(c("1"), "1e0");
    // Not a quantity: unchanged.
    for not_a_quantity in ["lots", "1..2", "1Xi"] {
        assert_eq!(c(not_a_quantity), not_a_quantity);
    }
}

#[test]
fn semantic_equality_treats_empty_maps_as_absent() {
    let a = PodTemplateSpec {
        metadata: Some(ObjectMeta::default()),
        spec: Some(PodSpec {
            node_selector: Some(BTreeMap::new()),
            tolerations: Some(vec![]),
            ..Default::default()
        }),
    };
    let b = PodTemplateSpec {
        metadata: None,
        spec: Some(PodSpec::default()),
    };
    assert_eq!(semantic("template", &a), semantic("template", &b));
    // An empty struct behind a pointer is not the same as none.
    let c = PodTemplateSpec {
        spec: Some(PodSpec {
            affinity: Some(Affinity::default()),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_ne!(semantic("template", &b), semantic("template", &c));
}

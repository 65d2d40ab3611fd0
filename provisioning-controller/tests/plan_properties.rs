//! Properties of plans: every podset that needs capacity is in exactly one request podset, the
//! counts add up, and merging follows the first-match rule.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Container;
use kueue_admission_sdk::api::{
    PodSet, ProvisioningRequestConfigSpec, ResourceFlavorSpec, Workload,
};
use kueue_admission_sdk::testing::WorkloadBuilder;
use kueue_provisioning_controller::plan::{Plan, PlanInput, plan};
use proptest::prelude::*;

#[path = "support/pod_sets.rs"]
mod pod_sets;
use pod_sets::{container, pod_set};

#[derive(Clone, Debug)]
struct GenPodSet {
    count: i32,
    assigned: Option<i32>,
    requests: Resources,
    limits: Resources,
    image: &'static str,
    disk: Option<&'static str>,
    flavor: &'static str,
}

type Resources = Vec<(&'static str, &'static str)>;

/// Few distinct values, so that podsets are often alike and get merged.
fn gen_pod_set() -> impl Strategy<Value = GenPodSet> {
    let requests: Vec<Resources> = vec![
        vec![("cpu", "1")],
        vec![("cpu", "1"), ("nvidia.com/gpu", "1")],
        vec![],
    ];
    let limits = prop_oneof![3 => Just(Resources::new()), 1 => Just(vec![("nvidia.com/gpu", "1")])];
    (
        0i32..4,
        prop::option::of(0i32..4),
        prop::sample::select(requests),
        limits,
        prop_oneof![3 => Just("a"), 1 => Just("b")],
        prop_oneof![3 => Just(None), 1 => Just(Some("ssd"))],
        prop_oneof![3 => Just("default"), 1 => Just("spot")],
    )
        .prop_map(
            |(count, assigned, requests, limits, image, disk, flavor)| GenPodSet {
                count,
                assigned,
                requests,
                limits,
                image,
                disk,
                flavor,
            },
        )
}

fn workload(specs: &[GenPodSet]) -> Workload {
    let pod_sets: Vec<PodSet> = specs
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let main = Container {
                image: Some(g.image.into()),
                ..container("main", &g.requests, &g.limits)
            };
            let mut generated = pod_set(&format!("ps{i}"), g.count, vec![main]);
            if let Some(spec) = &mut generated.template.spec {
                spec.node_selector = g
                    .disk
                    .map(|d| BTreeMap::from([("disk".to_string(), d.to_string())]));
            }
            generated
        })
        .collect();
    let mut wl = WorkloadBuilder::new("ns", "wl")
        .with(|wl| wl.spec.pod_sets = pod_sets)
        .quota_reserved("cq", "default")
        .build();
    // Each podset's own flavor and assigned count (none: Kueue's count is the podset's).
    let admission = wl.status.as_mut().and_then(|s| s.admission.as_mut());
    let assignments = &mut admission.expect("quota reserved").pod_set_assignments;
    for (assignment, g) in assignments.iter_mut().zip(specs) {
        assignment.flavors = BTreeMap::from([("cpu".to_string(), g.flavor.to_string())]);
        assignment.count = g.assigned;
    }
    wl
}

fn flavors() -> BTreeMap<String, ResourceFlavorSpec> {
    BTreeMap::from([
        ("default".to_string(), ResourceFlavorSpec::default()),
        (
            "spot".to_string(),
            ResourceFlavorSpec {
                node_labels: BTreeMap::from([("pool".to_string(), "spot".to_string())]),
                tolerations: vec![],
                topology_name: None,
            },
        ),
    ])
}

/// The rule, restated: positive count and assigned count, and a managed resource if any.
fn needs_capacity(g: &GenPodSet, managed: &[String]) -> bool {
    let uses = managed.is_empty()
        || g.requests
            .iter()
            .chain(&g.limits)
            .any(|(r, _)| managed.iter().any(|m| m == r));
    g.count > 0 && g.assigned.unwrap_or(g.count) > 0 && uses
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn needed_podsets_are_in_exactly_one_group(
        specs in prop::collection::vec(gen_pod_set(), 1..8),
        managed in prop::sample::subsequence(vec!["cpu".to_string(), "nvidia.com/gpu".to_string()], 0..=2),
        policy in prop::option::of(prop::sample::select(vec![
            "IdenticalPodTemplates",
            "IdenticalWorkloadSchedulingRequirements",
        ])),
        attempt in 1u32..5,
    ) {
        let wl = workload(&specs);
        let config = ProvisioningRequestConfigSpec {
            provisioning_class_name: "check-capacity.autoscaling.x-k8s.io".into(),
            managed_resources: managed.clone(),
            pod_set_merge_policy: policy.map(str::to_string),
            ..Default::default()
        };
        let flavors = flavors();
        let result = plan(&PlanInput { workload: &wl, check: "prov", attempt, config: &config, flavors: &flavors });
        let needed: Vec<(String, i32)> = specs
            .iter()
            .enumerate()
            .filter(|(_, g)| needs_capacity(g, &managed))
            .map(|(i, g)| (format!("ps{i}"), g.assigned.unwrap_or(g.count)))
            .collect();

        let request = match result {
            Ok(Plan::NotNeeded) => {
                prop_assert!(needed.is_empty());
                return Ok(());
            }
            Ok(Plan::Request(r)) => r,
            Err(e) => return Err(TestCaseError::fail(format!("unexpected error: {e}"))),
        };
        prop_assert!(!needed.is_empty());
        prop_assert_eq!(&request.name, &format!("wl-prov-{attempt}"));

        // Each needed podset in exactly one group, nothing else in any group.
        let mut seen: Vec<&str> = request.pod_sets.iter().flat_map(|p| p.members.iter().map(String::as_str)).collect();
        seen.sort_unstable();
        let mut expected: Vec<&str> = needed.iter().map(|(n, _)| n.as_str()).collect();
        expected.sort_unstable();
        prop_assert_eq!(seen, expected);

        // Counts: per group the sum of its members, in total the sum of the needed podsets.
        let assigned: BTreeMap<&str, i32> = needed.iter().map(|(n, c)| (n.as_str(), *c)).collect();
        for group in &request.pod_sets {
            let sum: i32 = group.members.iter().map(|m| assigned[m.as_str()]).sum();
            prop_assert_eq!(group.count, sum);
            prop_assert!(group.count > 0);
            prop_assert_eq!(&group.template_name, &format!("ppt-{}-{}", request.name, group.members[0]));
            // Members in Workload order.
            let mut sorted = group.members.clone();
            sorted.sort_by_key(|m| m[2..].parse::<usize>().unwrap_or(usize::MAX));
            prop_assert_eq!(&sorted, &group.members);
        }
        let total: i32 = request.pod_sets.iter().map(|p| p.count).sum();
        prop_assert_eq!(total, needed.iter().map(|(_, c)| c).sum::<i32>());

        // Groups in Workload order of their first member.
        let owners: Vec<usize> = request
            .pod_sets
            .iter()
            .map(|p| p.members[0][2..].parse::<usize>().unwrap_or(usize::MAX))
            .collect();
        prop_assert!(owners.windows(2).all(|w| w[0] < w[1]));

        match policy {
            None => prop_assert!(request.pod_sets.iter().all(|p| p.members.len() == 1)),
            Some("IdenticalPodTemplates") => {
                // Same template and flavor within a group; a group's first podset matches no
                // earlier group (else it would have joined it).
                let key = |name: &str| {
                    let i: usize = name[2..].parse().unwrap_or(usize::MAX);
                    (wl.spec.pod_sets[i].template.clone(), specs[i].flavor)
                };
                for group in &request.pod_sets {
                    for member in &group.members {
                        prop_assert_eq!(key(member), key(&group.members[0]));
                    }
                }
                for (j, later) in request.pod_sets.iter().enumerate() {
                    for earlier in &request.pod_sets[..j] {
                        prop_assert_ne!(key(&later.members[0]), key(&earlier.members[0]));
                    }
                }
            }
            Some(_) => {}
        }
    }
}

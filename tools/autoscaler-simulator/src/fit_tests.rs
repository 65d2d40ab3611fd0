use super::*;
use k8s_openapi::api::core::v1::{NodeSelectorTerm, ResourceRequirements};
use proptest::prelude::*;

fn quantities(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, Quantity>> {
    Some(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
            .collect(),
    )
}

fn container(requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Container {
    Container {
        name: "c".into(),
        resources: Some(ResourceRequirements {
            requests: quantities(requests),
            limits: quantities(limits),
            ..ResourceRequirements::default()
        }),
        ..Container::default()
    }
}

fn milli(pairs: &[(&str, i128)]) -> Resources {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

fn node(cpu: i128, memory: i128, pods: i128) -> NodeRoom {
    NodeRoom {
        name: "n".into(),
        allocatable: milli(&[("cpu", cpu), ("memory", memory), (PODS, pods)]),
        ..NodeRoom::default()
    }
}

fn pod(cpu: i128, memory: i128) -> PodShape {
    PodShape {
        requests: milli(&[("cpu", cpu), ("memory", memory), (PODS, 1000)]),
        ..PodShape::default()
    }
}

fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
    Taint {
        key: key.into(),
        value: value.map(Into::into),
        effect: effect.into(),
        time_added: None,
    }
}

fn toleration(
    key: Option<&str>,
    operator: &str,
    value: Option<&str>,
    effect: Option<&str>,
) -> Toleration {
    Toleration {
        key: key.map(Into::into),
        operator: Some(operator.into()),
        value: value.map(Into::into),
        effect: effect.map(Into::into),
        toleration_seconds: None,
    }
}

#[test]
fn pod_requests_sum_containers_take_init_peaks_and_add_a_pod_slot() {
    let spec = PodSpec {
        containers: vec![
            container(&[("cpu", "100m"), ("memory", "1Gi")], &[]),
            // A limit without a request stands for the request.
            container(&[], &[("cpu", "250m")]),
        ],
        init_containers: Some(vec![container(&[("cpu", "2"), ("memory", "10Mi")], &[])]),
        overhead: quantities(&[("memory", "1Mi")]),
        ..PodSpec::default()
    };
    assert_eq!(
        pod_requests(&spec),
        milli(&[
            ("cpu", 2000),
            ("memory", ((1 << 30) + (1 << 20)) * 1000),
            (PODS, 1000)
        ])
    );
}

#[test]
fn sidecars_add_to_the_containers_and_to_later_init_containers() {
    let mut sidecar = container(&[("cpu", "1")], &[]);
    sidecar.restart_policy = Some("Always".into());
    let spec = PodSpec {
        containers: vec![container(&[("cpu", "500m")], &[])],
        init_containers: Some(vec![sidecar, container(&[("cpu", "1")], &[])]),
        ..PodSpec::default()
    };
    // max(500m + 1 (sidecar), 1 + 1 (init beside the sidecar)) = 2.
    assert_eq!(pod_requests(&spec)["cpu"], 2000);
}

#[test]
fn pod_level_requests_win() {
    let spec = PodSpec {
        containers: vec![container(&[("cpu", "100m")], &[])],
        resources: Some(ResourceRequirements {
            requests: quantities(&[("cpu", "3")]),
            ..ResourceRequirements::default()
        }),
        ..PodSpec::default()
    };
    assert_eq!(pod_requests(&spec)["cpu"], 3000);
}

#[test]
fn room_counts_every_resource_and_the_pod_slots() {
    let mut n = node(1000, 1000, 2000);
    assert!(n.fits(&pod(600, 10)));
    n.place(&pod(600, 10));
    assert!(!n.fits(&pod(600, 10)), "cpu is short");
    assert!(n.fits(&pod(400, 10)));
    n.place(&pod(100, 10));
    assert!(!n.fits(&pod(0, 0)), "no pod slot left");
    let mut gpu = pod(0, 0);
    gpu.requests.insert("nvidia.com/gpu".into(), 1000);
    assert!(
        !node(1000, 1000, 2000).fits(&gpu),
        "a resource the node lacks is 0"
    );
    let mut no_slots = node(1000, 1000, 0);
    no_slots.allocatable.remove(PODS);
    assert!(!no_slots.fits(&pod(1, 1)));
}

#[test]
fn selectors_and_cordons_decide_admission() {
    let mut n = node(1000, 1000, 10_000);
    n.labels.insert("pool".into(), "a".into());
    let mut p = pod(1, 1);
    p.node_selector.insert("pool".into(), "a".into());
    assert!(n.admits(&p));
    p.node_selector.insert("zone".into(), "x".into());
    assert!(!n.admits(&p));
    p.node_selector.clear();
    n.unschedulable = true;
    assert!(!n.admits(&p));
}

#[test]
fn taints_need_tolerations_with_equal_and_exists() {
    let taints = [taint("kwok-provider", Some("true"), "NoSchedule")];
    assert!(!taints_tolerated(&taints, &[]));
    let equal = toleration(
        Some("kwok-provider"),
        "Equal",
        Some("true"),
        Some("NoSchedule"),
    );
    assert!(taints_tolerated(&taints, &[equal]));
    let wrong_value = toleration(Some("kwok-provider"), "Equal", Some("false"), None);
    assert!(!taints_tolerated(&taints, &[wrong_value]));
    let exists = toleration(Some("kwok-provider"), "Exists", None, None);
    assert!(taints_tolerated(&taints, &[exists]));
    let wrong_effect = toleration(Some("kwok-provider"), "Exists", None, Some("NoExecute"));
    assert!(!taints_tolerated(&taints, &[wrong_effect]));
    let everything = toleration(None, "Exists", None, None);
    assert!(taints_tolerated(&taints, &[everything]));
    let soft = [taint("x", None, "PreferNoSchedule")];
    assert!(taints_tolerated(&soft, &[]));
    let hard = [taint("x", None, "NoExecute")];
    assert!(!taints_tolerated(&hard, &[]));
}

fn requirement(key: &str, operator: &str, values: &[&str]) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: key.into(),
        operator: operator.into(),
        values: Some(values.iter().map(|v| v.to_string()).collect()),
    }
}

fn selector(terms: Vec<Vec<NodeSelectorRequirement>>) -> NodeSelector {
    NodeSelector {
        node_selector_terms: terms
            .into_iter()
            .map(|r| NodeSelectorTerm {
                match_expressions: Some(r),
                match_fields: None,
            })
            .collect(),
    }
}

#[test]
fn required_affinity_operators() {
    let labels: BTreeMap<String, String> = [("zone", "a"), ("cores", "8")]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    for (req, expected) in [
        (requirement("zone", "In", &["a", "b"]), true),
        (requirement("zone", "In", &["b"]), false),
        (requirement("zone", "NotIn", &["b"]), true),
        (requirement("zone", "NotIn", &["a"]), false),
        (requirement("absent", "NotIn", &["a"]), true),
        (requirement("zone", "Exists", &[]), true),
        (requirement("absent", "Exists", &[]), false),
        (requirement("absent", "DoesNotExist", &[]), true),
        (requirement("zone", "DoesNotExist", &[]), false),
        (requirement("cores", "Gt", &["4"]), true),
        (requirement("cores", "Lt", &["4"]), false),
        (requirement("zone", "Gt", &["4"]), false),
    ] {
        let s = selector(vec![vec![req.clone()]]);
        assert_eq!(affinity_matches(&s, "n", &labels), expected, "{req:?}");
    }
    // Terms are ORed, requirements ANDed.
    let either = selector(vec![
        vec![requirement("zone", "In", &["b"])],
        vec![
            requirement("zone", "In", &["a"]),
            requirement("cores", "Exists", &[]),
        ],
    ]);
    assert!(affinity_matches(&either, "n", &labels));
    let both = selector(vec![vec![
        requirement("zone", "In", &["a"]),
        requirement("cores", "DoesNotExist", &[]),
    ]]);
    assert!(!affinity_matches(&both, "n", &labels));
    let by_name = NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_expressions: None,
            match_fields: Some(vec![requirement("metadata.name", "In", &["n"])]),
        }],
    };
    assert!(affinity_matches(&by_name, "n", &labels));
    assert!(!affinity_matches(&by_name, "m", &labels));
}

#[test]
fn binpacking_opens_nodes_only_when_needed() {
    let template = node(4000, 4000, 110_000);
    let pods = vec![pod(1000, 0); 9];
    assert_eq!(binpack(&template, &pods, 100).nodes, 3);
    // Capped: the pods beyond two nodes are left out.
    let capped = binpack(&template, &pods, 2);
    assert_eq!((capped.nodes, capped.placed.len()), (2, 8));
    // A pod too large for the template is left out, not given a node.
    let mixed = vec![pod(5000, 0), pod(1000, 0)];
    assert_eq!(
        binpack(&template, &mixed, 100),
        Binpack {
            nodes: 1,
            placed: vec![1]
        }
    );
}

#[test]
fn binpacking_places_large_pods_first() {
    // In arrival order first-fit would need 3 nodes (1+1, 3, 3); largest first packs 3+1 and
    // 3+1.
    let template = node(4000, 4000, 110_000);
    let pods = vec![pod(1000, 0), pod(1000, 0), pod(3000, 0), pod(3000, 0)];
    assert_eq!(binpack(&template, &pods, 100).nodes, 2);
}

proptest! {
    /// Bin-packing never overfills: the placed pods' requests fit in `nodes` fresh nodes' worth
    /// of allocatable, at least ceil(total / allocatable) nodes are used, no more than the cap,
    /// and every pod that fits an empty template is placed when the cap is loose.
    #[test]
    fn binpacking_invariants(
        cpus in prop::collection::vec(1i128..5000, 0..40),
        allocatable in 1000i128..8000,
        cap in 0usize..50,
    ) {
        let template = node(allocatable, 1_000_000, 110_000);
        let pods: Vec<PodShape> = cpus.iter().map(|c| pod(*c, 0)).collect();
        let packed = binpack(&template, &pods, cap);
        let placed_cpu: i128 = packed.placed.iter().map(|i| cpus[*i]).sum();
        prop_assert!(packed.nodes <= cap);
        prop_assert!(packed.nodes <= packed.placed.len());
        prop_assert!(placed_cpu <= allocatable * packed.nodes as i128);
        let lower = (placed_cpu + allocatable - 1) / allocatable;
        prop_assert!(packed.nodes as i128 >= lower);
        if cap >= pods.len() {
            let fitting = cpus.iter().filter(|c| **c <= allocatable).count();
            prop_assert_eq!(packed.placed.len(), fitting);
        }
    }

    /// First-fit placement never lets a node's use exceed its allocatable.
    #[test]
    fn first_fit_never_overfills(
        cpus in prop::collection::vec(0i128..3000, 0..40),
        sizes in prop::collection::vec(0i128..6000, 1..6),
    ) {
        let mut nodes: Vec<NodeRoom> = sizes.iter().map(|s| node(*s, 1_000_000, 110_000)).collect();
        for c in &cpus {
            if let Some(i) = place_first_fit(&mut nodes, &pod(*c, 0)) {
                prop_assert!(nodes[i].used["cpu"] <= nodes[i].allocatable["cpu"]);
            } else {
                prop_assert!(nodes.iter().all(|n| !n.fits(&pod(*c, 0))));
            }
        }
    }
}

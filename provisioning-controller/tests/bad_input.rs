//! Workloads at the edges of what Kueue accepts, through the request plan: what the controller
//! creates for them, or what it says. Part of the bad-input catalogue in docs/reliability.md.

use std::collections::BTreeMap;

use kueue_admission_sdk::api::{CheckState, ProvisioningRequestConfigSpec, ResourceFlavorSpec};
use kueue_admission_sdk::testing::WorkloadBuilder;
use kueue_provisioning_controller::names;
use kueue_provisioning_controller::plan::{self, Plan, PlanError, PlanInput};

fn config(merge: Option<&str>) -> ProvisioningRequestConfigSpec {
    ProvisioningRequestConfigSpec {
        provisioning_class_name: "check-capacity.autoscaling.x-k8s.io".into(),
        pod_set_merge_policy: merge.map(String::from),
        ..Default::default()
    }
}

fn flavors() -> BTreeMap<String, ResourceFlavorSpec> {
    BTreeMap::from([("f".to_string(), ResourceFlavorSpec::default())])
}

fn run(b: WorkloadBuilder, merge: Option<&str>) -> Result<Plan, PlanError> {
    let wl = b
        .check("prov", CheckState::Pending)
        .quota_reserved("cq", "f")
        .build();
    plan::plan(&PlanInput {
        workload: &wl,
        check: "prov",
        attempt: 1,
        config: &config(merge),
        flavors: &flavors(),
    })
}

#[test]
fn a_workload_without_podsets_needs_no_request() {
    let plan = run(WorkloadBuilder::new("ns", "wl"), None);
    assert_eq!(plan, Ok(Plan::NotNeeded));
}

#[test]
fn eight_podsets_with_a_253_character_name_get_eight_valid_distinct_templates() {
    // Kueue allows at most 8 podsets, of names up to 63 characters.
    let name = "w".repeat(253);
    let mut b = WorkloadBuilder::new("ns", &name);
    for i in 0..8 {
        b = b.pod_set(
            &format!("{i}{}", "p".repeat(62)),
            i + 1,
            &format!("{}", i + 1),
        );
    }
    let Ok(Plan::Request(r)) = run(b, None) else {
        panic!("a request is needed");
    };
    assert_eq!(r.pod_sets.len(), 8);
    assert!(r.name.len() <= names::MAX_NAME_LEN);
    assert_eq!(names::request_attempt(&r.name, &name, "prov"), Some(1));
    let mut templates: Vec<&str> = r
        .pod_sets
        .iter()
        .map(|p| p.template_name.as_str())
        .collect();
    assert!(templates.iter().all(|t| t.len() <= names::MAX_NAME_LEN));
    templates.sort();
    templates.dedup();
    assert_eq!(templates.len(), 8, "two podsets share a template name");
}

#[test]
fn merged_counts_past_int32_are_refused_with_the_podset_named() {
    // Identical templates merge; their counts are summed into one podset of the request.
    let b = WorkloadBuilder::new("ns", "wl")
        .pod_set("a", i32::MAX, "1")
        .pod_set("b", 1, "1");
    let err = run(b, Some("IdenticalPodTemplates")).expect_err("too many pods");
    assert!(err.to_string().contains("exceed"), "{err}");
    assert!(err.to_string().contains("\"a\""), "{err}");
}

#[test]
fn zero_pod_podsets_need_no_capacity() {
    let b = WorkloadBuilder::new("ns", "wl").pod_set("a", 0, "1");
    assert_eq!(run(b, None), Ok(Plan::NotNeeded));
}

//! The API types against objects exactly as the real Kueue v0.19.2 wrote them (captured from the
//! local control plane with `kubectl get -o json`, managedFields removed).

use kueue_admission_sdk::api::{
    ADMISSION_CHECK_ACTIVE, AdmissionCheck, CheckState, ClusterQueue, Workload, find_condition,
    workload_condition as cond,
};
use serde::de::DeserializeOwned;

fn fixture<T: DeserializeOwned>(name: &str) -> (T, serde_json::Value) {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let raw: serde_json::Value = serde_json::from_str(&text).expect("fixture is JSON");
    let typed = serde_json::from_value(raw.clone())
        .unwrap_or_else(|e| panic!("{name} does not parse: {e}"));
    (typed, raw)
}

/// Every field we model survives serialize → deserialize unchanged.
fn assert_round_trips<T>(obj: &T)
where
    T: serde::Serialize + DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let json = serde_json::to_value(obj).expect("serializes");
    let back: T = serde_json::from_value(json).expect("deserializes");
    assert_eq!(&back, obj);
}

#[test]
fn admitted_workload_reads_as_kueue_wrote_it() {
    let (wl, raw): (Workload, _) = fixture("workload-admitted-v0.19.2.json");
    assert!(wl.condition_is_true(cond::QUOTA_RESERVED));
    assert!(wl.condition_is_true(cond::ADMITTED));
    assert!(!wl.condition_is_true(cond::EVICTED));
    assert!(wl.is_active(), "spec.active is absent, which means true");
    assert_eq!(wl.spec.pod_sets.len(), 1);
    assert_eq!(wl.spec.pod_sets[0].name, "main");
    assert_eq!(wl.spec.pod_sets[0].count, 1);

    let status = wl.status.as_ref().expect("status");
    let admission = status.admission.as_ref().expect("admission");
    let assignment = &admission.pod_set_assignments[0];
    assert_eq!(assignment.count, Some(1));
    assert!(assignment.flavors["cpu"].ends_with("-default"));
    assert_eq!(assignment.resource_usage["cpu"].0, "1");

    let check_name = raw["status"]["admissionChecks"][0]["name"]
        .as_str()
        .expect("entry name");
    let entry = wl.admission_check(check_name).expect("our entry");
    assert_eq!(entry.state, CheckState::Ready);
    assert_eq!(entry.message, "approved by the demo");
    assert!(entry.last_transition_time.is_some());
    assert_eq!(entry.retry_count, None);
    assert!(wl.admission_check("no-such-check").is_none());
    assert_round_trips(&wl);
}

#[test]
fn workload_after_a_retry_carries_retry_count_and_eviction_stats() {
    let (wl, _): (Workload, _) = fixture("workload-admitted-after-retry-v0.19.2.json");
    let entry = &wl.status.as_ref().expect("status").admission_checks[0];
    assert_eq!(entry.state, CheckState::Ready);
    assert_eq!(
        entry.retry_count,
        Some(1),
        "Kueue keeps retryCount after Ready"
    );
    assert_eq!(wl.evictions("AdmissionCheck"), 1);
    assert_eq!(wl.evictions("Preempted"), 0);
    let evicted = wl
        .condition(cond::EVICTED)
        .expect("Evicted condition stays, False");
    assert_eq!(evicted.status, "False");
    assert!(wl.condition_is_true(cond::REQUEUED));
    assert_round_trips(&wl);
}

#[test]
fn admission_check_and_cluster_queue_read_as_kueue_wrote_them() {
    let (ac, _): (AdmissionCheck, _) = fixture("admissioncheck-active-v0.19.2.json");
    assert_eq!(
        ac.spec.controller_name,
        "demo.kueue-admission-checks.dev/approve-all"
    );
    assert!(ac.spec.parameters.is_none());
    let conds = &ac.status.as_ref().expect("status").conditions;
    assert_eq!(
        find_condition(conds, ADMISSION_CHECK_ACTIVE).map(|c| c.status.as_str()),
        Some("True")
    );
    assert_round_trips(&ac);

    let (cq, _): (ClusterQueue, _) = fixture("clusterqueue-v0.19.2.json");
    let rules = &cq
        .spec
        .admission_checks_strategy
        .as_ref()
        .expect("strategy")
        .admission_checks;
    assert_eq!(rules.len(), 1);
    assert!(rules[0].on_flavors.is_empty());
    assert_eq!(
        cq.spec.resource_groups[0].flavors[0].resources[0]
            .nominal_quota
            .0,
        "4"
    );
    assert_round_trips(&cq);
}

#[test]
fn unknown_fields_and_states_do_not_break_reading() {
    let (mut raw, _): (serde_json::Value, _) = fixture("workload-admitted-v0.19.2.json");
    raw["status"]["someFutureField"] = serde_json::json!({"x": 1});
    raw["spec"]["podSets"][0]["someFutureField"] = serde_json::json!(true);
    let wl: Workload = serde_json::from_value(raw.clone()).expect("unknown fields are ignored");
    assert!(wl.condition_is_true(cond::ADMITTED));

    raw["status"]["admissionChecks"][0]["state"] = serde_json::json!("SomeFutureState");
    let err = serde_json::from_value::<Workload>(raw).expect_err("an unknown state is not guessed");
    assert!(err.to_string().contains("SomeFutureState"), "{err}");
}

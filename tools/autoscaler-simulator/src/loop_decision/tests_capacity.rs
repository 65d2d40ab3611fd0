//! Rules 6, 7, 8, 9, 12, 17 and 18: capacity, scale-ups and bookings.

use super::*;

/// Rule 6: check-capacity is Provisioned=True/`CapacityIsFound` only when all the pods fit the
/// Nodes (upcoming ones included) minus running pods; it never adds Nodes, even with a group
/// that could take them.
#[test]
fn rule_06_check_capacity_needs_every_pod_to_fit() {
    let settings = settings_with_group(0, 10);
    let nodes = vec![node("n1", None, "4"), node("n2", Some("g"), "4")];
    let pods = vec![bound_pod("busy", "n1", "3")];
    let templates = vec![template("t", "1")];
    // 1 free on n1 + 4 on n2 = 5 pods of 1 cpu.
    let fits = view(
        nodes.clone(),
        pods.clone(),
        vec![request("r", CHECK_CAPACITY_CLASS, &[("t", 5)])],
        templates.clone(),
    );
    let actions = run(&settings, &fits, 10);
    assert_eq!(
        outcome(&actions, "r", PROVISIONED),
        Some(("True", reason::CAPACITY_IS_FOUND))
    );
    let too_many = view(
        nodes.clone(),
        pods.clone(),
        vec![request("r", CHECK_CAPACITY_CLASS, &[("t", 6)])],
        templates.clone(),
    );
    let actions = run(&settings, &too_many, 10);
    assert_eq!(
        outcome(&actions, "r", PROVISIONED),
        Some(("False", reason::CAPACITY_IS_NOT_FOUND))
    );
    assert!(
        actions.node_creations.is_empty(),
        "check-capacity never scales up"
    );
    // Two podsets count together; terminal pods free their room.
    let mut done = bound_pod("done", "n1", "3");
    done.status.as_mut().expect("status").phase = Some("Succeeded".into());
    let two_sets = view(
        nodes,
        vec![done],
        vec![request("r", CHECK_CAPACITY_CLASS, &[("t", 4), ("big", 1)])],
        vec![template("t", "1"), template("big", "4")],
    );
    let actions = run(&settings, &two_sets, 10);
    assert_eq!(
        outcome(&actions, "r", PROVISIONED),
        Some(("True", reason::CAPACITY_IS_FOUND))
    );
}

/// Rule 7: without room, Provisioned=False/`CapacityIsNotFound` (retried), or
/// Failed=True/`CapacityIsNotFound` when `noRetry` is exactly "true".
#[test]
fn rule_07_check_capacity_without_room() {
    let nodes = vec![node("n1", None, "1")];
    for (no_retry, expected) in [
        (None, (PROVISIONED, "False")),
        (Some("true"), (FAILED, "True")),
        (Some("false"), (PROVISIONED, "False")),
        (Some("yes"), (PROVISIONED, "False")),
        (Some("True"), (PROVISIONED, "False")),
    ] {
        let mut r = request("r", CHECK_CAPACITY_CLASS, &[("t", 2)]);
        if let Some(value) = no_retry {
            r = with_parameter(r, "noRetry", value);
        }
        let v = view(nodes.clone(), vec![], vec![r], vec![template("t", "1")]);
        let actions = run(&Settings::default(), &v, 10);
        assert_eq!(
            outcome(&actions, "r", expected.0),
            Some((expected.1, reason::CAPACITY_IS_NOT_FOUND)),
            "{no_retry:?}"
        );
        let other = if expected.0 == FAILED {
            PROVISIONED
        } else {
            FAILED
        };
        assert_eq!(outcome(&actions, "r", other), None, "{no_retry:?}");
    }
}

/// Rule 8: best-effort writes Provisioned=True/`CapacityIsProvisioned` in the very loop that
/// asks for the Nodes (with what to write instead if the creation is refused); if the pods fit
/// existing capacity, `CapacityIsFound` and no Node.
#[test]
fn rule_08_best_effort_provisions_when_it_asks_for_nodes() {
    let settings = settings_with_group(0, 3);
    // A template Node of 4 cpu, less the 100m kube-proxy pod of an empty group: 3 pods of 1 cpu.
    let v = view(
        vec![],
        vec![],
        vec![request("r", BEST_EFFORT_CLASS, &[("t", 5)])],
        vec![template("t", "1")],
    );
    let actions = run(&settings, &v, 10);
    assert_eq!(
        outcome(&actions, "r", PROVISIONED),
        Some(("True", reason::CAPACITY_IS_PROVISIONED))
    );
    assert_eq!(
        outcome(&actions, "r", ACCEPTED),
        Some(("True", reason::ACCEPTED))
    );
    let creation = &actions.node_creations[..];
    assert_eq!(creation.len(), 1);
    assert_eq!((creation[0].group.as_str(), creation[0].count), ("g", 2));
    let refused = creation[0].if_refused.as_ref().expect("fallback");
    let provisioned = refused
        .conditions
        .iter()
        .find(|c| c.type_ == PROVISIONED)
        .expect("provisioned");
    assert_eq!(
        (provisioned.status.as_str(), provisioned.reason.as_str()),
        ("False", reason::CAPACITY_IS_NOT_FOUND)
    );
    assert_eq!(actions.next_loop, at(10));
    // With a live Ready Node of the group, fresh Nodes are copies of it: 4 pods per Node.
    let live = view(
        vec![node("g-live", Some("g"), "4")],
        vec![bound_pod("p", "g-live", "4")],
        v.requests.clone(),
        v.templates.clone(),
    );
    let actions = run(&settings, &live, 10);
    assert_eq!(
        actions.node_creations[0].count, 2,
        "5 pods of 1 cpu on Nodes of 4"
    );
    let live = view(
        live.nodes,
        live.pods,
        vec![request("r", BEST_EFFORT_CLASS, &[("t", 4)])],
        v.templates.clone(),
    );
    assert_eq!(run(&settings, &live, 10).node_creations[0].count, 1);
    // Room enough already: found, nothing created.
    let roomy = view(
        vec![node("n1", None, "8")],
        vec![],
        v.requests.clone(),
        v.templates.clone(),
    );
    let actions = run(&settings, &roomy, 10);
    assert_eq!(
        outcome(&actions, "r", PROVISIONED),
        Some(("True", reason::CAPACITY_IS_FOUND))
    );
    assert!(actions.node_creations.is_empty());
}

/// Rule 8: the pods that fit existing Nodes need no new Node; only the rest are scaled up for.
#[test]
fn rule_08_best_effort_scales_up_only_for_what_does_not_fit() {
    let settings = settings_with_group(0, 5);
    let v = view(
        vec![node("n1", None, "3")],
        vec![],
        vec![request("r", BEST_EFFORT_CLASS, &[("t", 6)])],
        vec![template("t", "1")],
    );
    let actions = run(&settings, &v, 10);
    assert_eq!(
        actions.node_creations[0].count, 1,
        "3 fit n1, 3 fit one fresh Node"
    );
}

/// Rule 9: never a partial scale-up: when no group takes all the remaining pods within its
/// max count (and `max_nodes_per_scaleup`), or the pods do not tolerate the kwok taint, no Node
/// is created and Provisioned=False/`CapacityIsNotFound`; `noRetry` is ignored.
#[test]
fn rule_09_best_effort_is_all_or_nothing() {
    let templates = vec![template("t", "1")];
    // 10 pods need 4 fresh Nodes of 3 pods; the group may grow by 3.
    let r = with_parameter(
        request("r", BEST_EFFORT_CLASS, &[("t", 10)]),
        "noRetry",
        "true",
    );
    let v = view(vec![], vec![], vec![r], templates.clone());
    let actions = run(&settings_with_group(0, 3), &v, 10);
    assert!(actions.node_creations.is_empty());
    assert_eq!(
        outcome(&actions, "r", PROVISIONED),
        Some(("False", reason::CAPACITY_IS_NOT_FOUND))
    );
    assert_eq!(
        outcome(&actions, "r", FAILED),
        None,
        "noRetry is check-capacity's only"
    );
    // Live Nodes count toward the max.
    let bigger = settings_with_group(0, 5);
    // Full live Nodes: fresh ones are copies (4 pods each), so 10 pods need 3 of them.
    let live = |n: usize| {
        let nodes = (0..n)
            .map(|i| node(&format!("g-{i}"), Some("g"), "4"))
            .collect();
        let pods = (0..n)
            .map(|i| bound_pod(&format!("p{i}"), &format!("g-{i}"), "4"))
            .collect();
        view(nodes, pods, v.requests.clone(), templates.clone())
    };
    assert!(
        run(&bigger, &live(3), 10).node_creations.is_empty(),
        "3 live + 3 > 5"
    );
    assert_eq!(run(&bigger, &live(2), 10).node_creations[0].count, 3);
    assert_eq!(run(&bigger, &v, 10).node_creations[0].count, 4);
    // --max-nodes-per-scaleup bounds it too.
    let capped = Settings {
        max_nodes_per_scaleup: 3,
        ..bigger.clone()
    };
    assert!(run(&capped, &v, 10).node_creations.is_empty());
    // Pods that do not tolerate the kwok taint fit no group.
    let mut intolerant = template("t", "1");
    intolerant
        .template
        .as_mut()
        .and_then(|t| t.spec.as_mut())
        .expect("spec")
        .tolerations = None;
    let v = view(
        vec![],
        vec![],
        vec![request("r", BEST_EFFORT_CLASS, &[("t", 1)])],
        vec![intolerant],
    );
    let actions = run(&bigger, &v, 10);
    assert!(actions.node_creations.is_empty());
    assert_eq!(
        outcome(&actions, "r", PROVISIONED),
        Some(("False", reason::CAPACITY_IS_NOT_FOUND))
    );
}

/// Rule 12: a booked request's pods take their room from other requests, whether or not its
/// consumer pods run (cluster-autoscaler 1.36.1 counts running consumers twice:
/// kubernetes/autoscaler#9805); once BookingExpired, the room is free again.
#[test]
fn rule_12_bookings_hold_room_against_other_requests() {
    let templates = vec![template("t", "1")];
    let booked = with_conditions(
        request("booked", CHECK_CAPACITY_CLASS, &[("t", 3)]),
        &[(PROVISIONED, "True", 0)],
    );
    let other = request("other", CHECK_CAPACITY_CLASS, &[("t", 2)]);
    let nodes = vec![node("n1", None, "4")];
    let v = view(
        nodes.clone(),
        vec![],
        vec![booked.clone(), other.clone()],
        templates.clone(),
    );
    let actions = run(&Settings::default(), &v, 60);
    assert_eq!(
        outcome(&actions, "other", PROVISIONED),
        Some(("False", reason::CAPACITY_IS_NOT_FOUND))
    );
    // Its 3 consumers running on n1 count beside the booking: only 1 cpu... minus 3 again.
    let consumers: Vec<_> = (0..3)
        .map(|i| bound_pod(&format!("c{i}"), "n1", "1"))
        .collect();
    let one = request("one", CHECK_CAPACITY_CLASS, &[("t", 1)]);
    let v = view(
        nodes.clone(),
        consumers,
        vec![booked.clone(), one.clone()],
        templates.clone(),
    );
    let actions = run(&Settings::default(), &v, 60);
    assert_eq!(
        outcome(&actions, "one", PROVISIONED),
        Some(("False", reason::CAPACITY_IS_NOT_FOUND)),
        "double counted"
    );
    // Expired or failed bookings hold nothing.
    for gone in [
        &[(PROVISIONED, "True", 0), (BOOKING_EXPIRED, "True", 0)][..],
        &[(PROVISIONED, "True", 0), (FAILED, "True", 0)],
    ] {
        let released = with_conditions(request("booked", CHECK_CAPACITY_CLASS, &[("t", 3)]), gone);
        let v = view(
            nodes.clone(),
            vec![],
            vec![released, other.clone()],
            templates.clone(),
        );
        let actions = run(&Settings::default(), &v, 60);
        assert_eq!(
            outcome(&actions, "other", PROVISIONED),
            Some(("True", reason::CAPACITY_IS_FOUND))
        );
    }
}

/// Rule 12: bookings do not hold room against unannotated pods: a pending pod that fits only
/// the booked room gets no scale-up (cluster-autoscaler counts on the scheduler placing it
/// there), while a booking does keep its Nodes from scale-down (see the scale-down tests).
#[test]
fn rule_12_bookings_do_not_hold_room_against_ordinary_pods() {
    let settings = settings_with_group(0, 3);
    let booked = with_conditions(
        request("booked", CHECK_CAPACITY_CLASS, &[("t", 4)]),
        &[(PROVISIONED, "True", 0)],
    );
    let v = view(
        vec![node("n1", None, "4")],
        vec![pending_pod("p", "1", json!({}))],
        vec![booked],
        vec![template("t", "1")],
    );
    let actions = run(&settings, &v, 60);
    assert!(actions.node_creations.is_empty(), "{actions:?}");
}

/// Rule 17: pending pods carrying either consume annotation never trigger a scale-up, whatever
/// the request they name; the same pods without it do (an ordinary, non-atomic scale-up).
#[test]
fn rule_17_consumers_never_trigger_scale_up() {
    let settings = settings_with_group(0, 3);
    for key in [CONSUME_ANNOTATION, DEPRECATED_CONSUME_ANNOTATION] {
        let pods = vec![pending_pod("p", "2", json!({ key: "no-such-request" }))];
        let v = view(vec![], pods, vec![], vec![]);
        let actions = run(&settings, &v, 10);
        assert!(actions.node_creations.is_empty(), "{key}");
    }
    let v = view(
        vec![],
        vec![pending_pod("p", "2", json!({}))],
        vec![],
        vec![],
    );
    let actions = run(&settings, &v, 10);
    assert_eq!(actions.node_creations.len(), 1);
    assert_eq!(
        (
            actions.node_creations[0].group.as_str(),
            actions.node_creations[0].count
        ),
        ("g", 1)
    );
    // A pending pod the scheduler has not marked unschedulable waits for the scheduler.
    let mut unmarked = pending_pod("p", "2", json!({}));
    unmarked.status.as_mut().expect("status").conditions = None;
    assert!(
        run(&settings, &view(vec![], vec![unmarked], vec![], vec![]), 10)
            .node_creations
            .is_empty()
    );
}

/// Rule 18: the ordinary scale-up is non-atomic: bounded by the group's max count, it adds what
/// it may even when that is not enough for every pod.
#[test]
fn rule_18_ordinary_scale_up_is_capped_by_max_count() {
    let settings = settings_with_group(0, 2);
    let pods: Vec<_> = (0..12)
        .map(|i| pending_pod(&format!("p{i}"), "1", json!({})))
        .collect();
    let v = view(vec![node("g-a", Some("g"), "4")], pods, vec![], vec![]);
    let actions = run(&settings, &v, 10);
    assert_eq!(actions.node_creations.len(), 1);
    assert_eq!(
        actions.node_creations[0].count, 1,
        "the group may grow by one Node only"
    );
    assert!(actions.node_creations[0].if_refused.is_none());
    let full = view(
        vec![node("g-a", Some("g"), "4"), node("g-b", Some("g"), "4")],
        v.pods.clone(),
        vec![],
        vec![],
    );
    assert!(run(&settings, &full, 10).node_creations.is_empty());
}

/// Pods with selectors go to the group whose template matches; requests and ordinary pods take
/// turns when both wait.
#[test]
fn loops_alternate_between_requests_and_ordinary_pods() {
    let settings = settings_with_group(0, 10);
    let v = view(
        vec![],
        vec![pending_pod("p", "1", json!({}))],
        vec![request("r", BEST_EFFORT_CLASS, &[("t", 1)])],
        vec![template("t", "1")],
    );
    let mut state = LoopState::default();
    let first = run_loop(&settings, &v, &mut state, at(10));
    // The pick is Accepted, but the ordinary pods have this turn.
    assert_eq!(
        outcome(&first, "r", ACCEPTED),
        Some(("True", reason::ACCEPTED))
    );
    assert_eq!(outcome(&first, "r", PROVISIONED), None);
    assert_eq!(first.node_creations.len(), 1);
    let second = run_loop(&settings, &apply(v, &first), &mut state, at(11));
    assert_eq!(
        outcome(&second, "r", PROVISIONED),
        Some(("True", reason::CAPACITY_IS_PROVISIONED))
    );
}

proptest! {
    /// Rules 6, 8, 9 and 18 together, on arbitrary clusters: a check-capacity request never
    /// creates a Node; a best-effort one creates Nodes only with Provisioned=True/
    /// `CapacityIsProvisioned`, in one group, never beyond its max count, and enough of them
    /// for every pod that did not fit (checked by packing the pods onto the result); otherwise
    /// it creates none.
    #[test]
    fn scale_ups_stay_within_bounds_and_are_all_or_nothing(
        best_effort in any::<bool>(),
        count in 1i32..30,
        cpu in 1u32..5,
        live in prop::collection::vec(0u32..5, 0..4),
        max in 1u32..8,
    ) {
        let settings = settings_with_group(0, max);
        let nodes: Vec<_> = live.iter().enumerate().map(|(i, _)| node(&format!("g-{i}"), Some("g"), "4")).collect();
        let pods: Vec<_> = live
            .iter()
            .enumerate()
            .filter(|(_, used)| **used > 0)
            .map(|(i, used)| bound_pod(&format!("p{i}"), &format!("g-{i}"), &used.to_string()))
            .collect();
        let class = if best_effort { BEST_EFFORT_CLASS } else { CHECK_CAPACITY_CLASS };
        let v = view(nodes.clone(), pods.clone(), vec![request("r", class, &[("t", count)])], vec![template("t", &cpu.to_string())]);
        let actions = run(&settings, &v, 10);
        let provisioned = outcome(&actions, "r", PROVISIONED);
        if !best_effort {
            prop_assert!(actions.node_creations.is_empty());
            return Ok(());
        }
        match &actions.node_creations[..] {
            [] => prop_assert_ne!(provisioned, Some(("True", reason::CAPACITY_IS_PROVISIONED))),
            [creation] => {
                prop_assert_eq!(provisioned, Some(("True", reason::CAPACITY_IS_PROVISIONED)));
                prop_assert!(live.len() + creation.count <= max as usize);
                // The cluster with the new Nodes (Ready copies of the template) takes every pod.
                let mut grown = nodes.clone();
                grown.extend((0..creation.count).map(|i| node(&format!("g-new-{i}"), Some("g"), "4")));
                let after = view(grown, pods, vec![request("again", CHECK_CAPACITY_CLASS, &[("t", count)])], vec![template("t", &cpu.to_string())]);
                let check = run(&Settings::default(), &after, 10);
                prop_assert_eq!(outcome(&check, "again", PROVISIONED), Some(("True", reason::CAPACITY_IS_FOUND)));
            }
            more => prop_assert!(false, "more than one group: {:?}", more),
        }
    }
}

//! Rules 12 (scale-down side), 13, 15 and 16: what happens to requests and Nodes over time.

use super::*;

/// Rule 13: ten minutes after Provisioned=True, BookingExpired=True/
/// `CapacityReservationTimeExpired`, Provisioned staying True; not a second earlier.
#[test]
fn rule_13_bookings_expire_after_the_window() {
    let booked = with_conditions(
        request("r", BEST_EFFORT_CLASS, &[("t", 1)]),
        &[(ACCEPTED, "True", 0), (PROVISIONED, "True", 100)],
    );
    let v = view(vec![], vec![], vec![booked], vec![template("t", "1")]);
    let settings = Settings::default();
    assert!(
        run(&settings, &v, 100 + 10 * MINUTE)
            .status_writes
            .is_empty()
    );
    let actions = run(&settings, &v, 100 + 10 * MINUTE + 1);
    assert_eq!(
        outcome(&actions, "r", BOOKING_EXPIRED),
        Some(("True", reason::CAPACITY_RESERVATION_TIME_EXPIRED))
    );
    let provisioned = written(&actions, "r")
        .expect("written")
        .iter()
        .find(|c| c.type_ == PROVISIONED)
        .expect("kept");
    assert_eq!(
        (
            provisioned.status.as_str(),
            provisioned.last_transition_time.0
        ),
        ("True", at(100))
    );
    // A shorter window applies.
    let short = Settings {
        booking_duration: Duration::from_secs(5),
        ..Settings::default()
    };
    assert_eq!(run(&short, &v, 106).status_writes.len(), 1);
    // Expired: never again.
    let after = apply(v, &actions);
    assert!(run(&settings, &after, DAY).status_writes.is_empty());
}

/// Rule 13: at most 20 expiry writes per loop; the rest wait for the next loop.
#[test]
fn rule_13_at_most_twenty_expiry_writes_per_loop() {
    let requests: Vec<_> = (0..25)
        .map(|i| {
            with_conditions(
                request(&format!("r{i}"), CHECK_CAPACITY_CLASS, &[("t", 1)]),
                &[(PROVISIONED, "True", 0)],
            )
        })
        .collect();
    let v = view(vec![], vec![], requests, vec![template("t", "1")]);
    let actions = run(&Settings::default(), &v, 20 * MINUTE);
    assert_eq!(actions.status_writes.len(), 20);
    let next = run(&Settings::default(), &apply(v, &actions), 20 * MINUTE + 1);
    assert_eq!(next.status_writes.len(), 5);
}

/// Rule 12 (templates): a booked request whose PodTemplate is gone fails
/// Failed=True/`FailedToBookCapacity`.
#[test]
fn rule_12_booking_without_template_fails() {
    let booked = with_conditions(
        request("r", CHECK_CAPACITY_CLASS, &[("gone", 1)]),
        &[(PROVISIONED, "True", 0)],
    );
    let v = view(vec![], vec![], vec![booked], vec![]);
    let actions = run(&Settings::default(), &v, 60);
    assert_eq!(
        outcome(&actions, "r", FAILED),
        Some(("True", reason::FAILED_TO_BOOK_CAPACITY))
    );
}

/// Rule 15: a request never provisioned (no Provisioned, or Provisioned=False in its backoff)
/// fails Failed=True/`Expired` seven days after its creation; not a second earlier.
#[test]
fn rule_15_never_provisioned_requests_expire() {
    let settings = Settings::default();
    let waiting = with_conditions(
        request("w", CHECK_CAPACITY_CLASS, &[("t", 1)]),
        &[(PROVISIONED, "False", 7 * DAY - 30)],
    );
    let v = view(vec![], vec![], vec![waiting], vec![template("t", "1")]);
    assert!(run(&settings, &v, 7 * DAY).status_writes.is_empty());
    let actions = run(&settings, &v, 7 * DAY + 1);
    assert_eq!(
        outcome(&actions, "w", FAILED),
        Some(("True", reason::EXPIRED))
    );
    assert_eq!(
        outcome(&actions, "w", PROVISIONED).map(|p| p.0),
        Some("False")
    );
    // Provisioned ones do not expire this way.
    let provisioned = with_conditions(
        request("p", CHECK_CAPACITY_CLASS, &[("t", 1)]),
        &[(PROVISIONED, "True", 7 * DAY)],
    );
    let v = view(vec![], vec![], vec![provisioned], vec![template("t", "1")]);
    assert_eq!(outcome(&run(&settings, &v, 7 * DAY + 1), "p", FAILED), None);
}

/// Rule 16: requests whose Provisioned or Failed condition, whatever its status, is more than
/// seven days old are deleted, whatever their class (scripted ones aside).
#[test]
fn rule_16_old_requests_are_deleted() {
    let old = 7 * DAY + 1;
    let requests = vec![
        with_conditions(
            request("provisioned", CHECK_CAPACITY_CLASS, &[("t", 1)]),
            &[(PROVISIONED, "True", 0), (BOOKING_EXPIRED, "True", 600)],
        ),
        with_conditions(
            request("failed", BEST_EFFORT_CLASS, &[("t", 1)]),
            &[(FAILED, "True", 0)],
        ),
        with_conditions(
            request("unknown-class", "x.example.com", &[("t", 1)]),
            &[(PROVISIONED, "False", 0)],
        ),
        with_conditions(
            request("young", CHECK_CAPACITY_CLASS, &[("t", 1)]),
            &[(PROVISIONED, "True", 1)],
        ),
        with_conditions(
            request("accepted-only", CHECK_CAPACITY_CLASS, &[("t", 1)]),
            &[(ACCEPTED, "True", 0)],
        ),
    ];
    let v = view(vec![], vec![], requests, vec![template("t", "1")]);
    let actions = run(&Settings::default(), &v, old);
    let deleted: Vec<_> = actions
        .request_deletions
        .iter()
        .map(|k| k.name.as_str())
        .collect();
    assert_eq!(deleted, ["provisioned", "failed", "unknown-class"]);
    assert_eq!(actions.request_deletions[0].uid, "uid-provisioned");
    assert!(
        written(&actions, "provisioned").is_none(),
        "a deleted request gets no write"
    );
}

/// Scale-down: an empty Node of a group is deleted once unneeded for the unneeded time, down to
/// the group's min count; a bound pod, a booked pod (rule 12: bookings hold against
/// scale-down) or a soon-scheduled pod keeps it.
#[test]
fn empty_nodes_are_deleted_after_the_unneeded_time() {
    let settings = settings_with_group(1, 5);
    let nodes = vec![
        node("g-a", Some("g"), "4"),
        node("g-b", Some("g"), "4"),
        node("plain", None, "4"),
    ];
    let v = view(nodes, vec![], vec![], vec![]);
    let mut state = LoopState::default();
    assert!(
        run_loop(&settings, &v, &mut state, at(0))
            .node_deletions
            .is_empty()
    );
    assert!(
        run_loop(&settings, &v, &mut state, at(10 * MINUTE - 1))
            .node_deletions
            .is_empty()
    );
    let actions = run_loop(&settings, &v, &mut state, at(10 * MINUTE));
    assert_eq!(
        actions.node_deletions,
        ["g-a"],
        "the min count keeps g-b; plain is no group's"
    );
    assert_eq!(actions.next_loop, at(10 * MINUTE));

    // Whatever sits on a Node keeps it: a pod, a booking, a pending pod about to land there.
    let booked = with_conditions(
        request("b", CHECK_CAPACITY_CLASS, &[("t", 1)]),
        &[(PROVISIONED, "True", 0)],
    );
    for (pods, requests) in [
        (vec![bound_pod("p", "g-a", "1")], vec![]),
        (vec![], vec![booked]),
        (vec![pending_pod("p", "1", json!({}))], vec![]),
    ] {
        let settings = settings_with_group(0, 5);
        let v = view(
            vec![node("g-a", Some("g"), "4")],
            pods,
            requests,
            vec![template("t", "1")],
        );
        let mut state = LoopState::default();
        run_loop(&settings, &v, &mut state, at(0));
        let actions = run_loop(&settings, &v, &mut state, at(5 * MINUTE));
        assert!(actions.node_deletions.is_empty(), "{:?}", v.pods);
    }
}

/// Scale-down: a Node that gets a pod stops being unneeded, and its clock starts over; Nodes
/// not managed by kwok are never deleted; DaemonSet pods do not keep a Node.
#[test]
fn unneeded_clocks_restart_and_only_kwok_nodes_go() {
    let settings = settings_with_group(0, 5);
    let empty = view(vec![node("g-a", Some("g"), "4")], vec![], vec![], vec![]);
    let busy = view(
        empty.nodes.clone(),
        vec![bound_pod("p", "g-a", "1")],
        vec![],
        vec![],
    );
    let mut state = LoopState::default();
    run_loop(&settings, &empty, &mut state, at(0));
    run_loop(&settings, &busy, &mut state, at(5 * MINUTE));
    run_loop(&settings, &empty, &mut state, at(6 * MINUTE));
    assert!(
        run_loop(&settings, &empty, &mut state, at(11 * MINUTE))
            .node_deletions
            .is_empty()
    );
    assert_eq!(
        run_loop(&settings, &empty, &mut state, at(16 * MINUTE)).node_deletions,
        ["g-a"]
    );

    let mut unmanaged = node("g-x", Some("g"), "4");
    unmanaged.metadata.annotations = None;
    let v = view(vec![unmanaged], vec![], vec![], vec![]);
    let mut state = LoopState::default();
    run_loop(&settings, &v, &mut state, at(0));
    assert!(
        run_loop(&settings, &v, &mut state, at(DAY))
            .node_deletions
            .is_empty()
    );

    let mut daemon = bound_pod("d", "g-a", "1");
    daemon.metadata.owner_references = Some(vec![
        serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "u",
        }))
        .expect("owner"),
    ]);
    let v = view(empty.nodes.clone(), vec![daemon], vec![], vec![]);
    let mut state = LoopState::default();
    run_loop(&settings, &v, &mut state, at(0));
    assert_eq!(
        run_loop(&settings, &v, &mut state, at(10 * MINUTE)).node_deletions,
        ["g-a"]
    );
}

/// Rule 19: scale-down waits `--scale-down-delay-after-add` after a scale-up, and a
/// check-capacity request found to fit counts as one (cluster-autoscaler records it as a
/// successful scale-up). Nodes still become unneeded meanwhile.
#[test]
fn a_check_capacity_found_to_fit_delays_scale_down_like_a_scale_up() {
    let settings = settings_with_group(0, 5);
    let nodes = vec![node("g-a", Some("g"), "4"), node("big", None, "16")];
    // Pods of 8 cpu fit only the Node of no group: g-a stays empty, unneeded from 0.
    let found = request("c", CHECK_CAPACITY_CLASS, &[("t", 1)]);
    let with_request = view(nodes.clone(), vec![], vec![found], vec![template("t", "8")]);
    let mut state = LoopState::default();
    let first = run_loop(&settings, &with_request, &mut state, at(0));
    assert_eq!(
        outcome(&first, "c", PROVISIONED),
        Some(("True", reason::CAPACITY_IS_FOUND))
    );
    let after = apply(with_request, &first);
    for second in [10 * MINUTE - 1, 10 * MINUTE] {
        let actions = run_loop(&settings, &after, &mut state, at(second));
        assert!(
            actions.node_deletions.is_empty(),
            "in the cooldown at {second}s"
        );
    }
    let actions = run_loop(&settings, &after, &mut state, at(10 * MINUTE + 1));
    assert_eq!(
        actions.node_deletions,
        ["g-a"],
        "unneeded since 0, cooled down"
    );

    // Without the request, the same Node goes at the unneeded time itself.
    let alone = view(nodes, vec![], vec![], vec![]);
    let mut state = LoopState::default();
    run_loop(&settings, &alone, &mut state, at(0));
    assert_eq!(
        run_loop(&settings, &alone, &mut state, at(10 * MINUTE)).node_deletions,
        ["g-a"]
    );

    // A scale-up of Nodes starts the cooldown too: a shorter delay shows it ending.
    let quick = Settings {
        scale_down_delay_after_add: Duration::from_secs(30),
        scale_down_unneeded_time: Duration::from_secs(10),
        ..settings_with_group(0, 5)
    };
    let mut state = LoopState {
        last_scale_up: Some(at(100)),
        ..LoopState::default()
    };
    let empty = view(vec![node("g-a", Some("g"), "4")], vec![], vec![], vec![]);
    run_loop(&quick, &empty, &mut state, at(100));
    assert!(
        run_loop(&quick, &empty, &mut state, at(130))
            .node_deletions
            .is_empty()
    );
    assert_eq!(
        run_loop(&quick, &empty, &mut state, at(131)).node_deletions,
        ["g-a"]
    );
}

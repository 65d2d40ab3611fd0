//! Rules 2, 3, 4, 5, 10, 11 and 14: which requests a loop takes, and how it writes.

use super::*;

fn roomy() -> Vec<Node> {
    vec![node("n1", None, "8")]
}

/// Rule 2: requests of another class, or carrying `processorInstance`, get no status write —
/// not an outcome, not an expiry — while a supported one beside them is processed.
#[test]
fn rule_02_unknown_classes_get_no_status_write() {
    let v = view(
        roomy(),
        vec![],
        vec![
            request("other", "queued-provisioning.gke.io", &[("t", 1)]),
            with_parameter(
                request("routed", CHECK_CAPACITY_CLASS, &[("t", 1)]),
                "processorInstance",
                "x",
            ),
            request("real", CHECK_CAPACITY_CLASS, &[("t", 1)]),
        ],
        vec![template("t", "1")],
    );
    let actions = run(&Settings::default(), &v, 10);
    assert_eq!(
        outcome(&actions, "real", PROVISIONED),
        Some(("True", reason::CAPACITY_IS_FOUND))
    );
    assert!(written(&actions, "other").is_none());
    assert!(written(&actions, "routed").is_none());
    // Alone, for ever: nothing, however many loops.
    let alone = view(
        roomy(),
        vec![],
        vec![request("other", "x.example.com", &[("t", 1)])],
        vec![],
    );
    let mut state = LoopState::default();
    for now in [0, 60, 8 * DAY] {
        let actions = run_loop(&Settings::default(), &alone, &mut state, at(now));
        assert!(actions.status_writes.is_empty());
    }
}

/// Rule 3: one request per loop, the first available in the order given (the watch cache's,
/// i.e. no guaranteed order); the next loop runs at once and takes the next one.
#[test]
fn rule_03_one_request_per_loop() {
    let mut v = view(
        roomy(),
        vec![],
        vec![
            request("a", CHECK_CAPACITY_CLASS, &[("t", 1)]),
            request("b", BEST_EFFORT_CLASS, &[("t", 1)]),
            request("c", CHECK_CAPACITY_CLASS, &[("t", 1)]),
        ],
        vec![template("t", "1")],
    );
    let settings = Settings::default();
    let mut state = LoopState::default();
    let mut order = Vec::new();
    for _ in 0..4 {
        let actions = run_loop(&settings, &v, &mut state, at(10));
        assert!(actions.status_writes.len() <= 1, "{actions:?}");
        if let Some(w) = actions.status_writes.first() {
            order.push(w.request.name.clone());
            assert_eq!(
                actions.next_loop,
                at(10),
                "frequent loops: at once after a processed request"
            );
        } else {
            assert_eq!(actions.next_loop, at(20), "idle: one scan interval later");
        }
        v = apply(v, &actions);
    }
    assert_eq!(order, ["a", "b", "c"]);
    // The order given is the order taken.
    v = view(
        roomy(),
        vec![],
        vec![
            request("c", CHECK_CAPACITY_CLASS, &[("t", 1)]),
            request("a", CHECK_CAPACITY_CLASS, &[("t", 1)]),
        ],
        vec![template("t", "1")],
    );
    assert_eq!(run(&settings, &v, 10).status_writes[0].request.name, "c");
}

/// Rule 3: with batching, up to the batch size of check-capacity requests per loop, each seeing
/// the pods of those before it.
#[test]
fn rule_03_check_capacity_batches() {
    let requests: Vec<_> = ["a", "b", "c", "d"]
        .iter()
        .map(|n| request(n, CHECK_CAPACITY_CLASS, &[("t", 1)]))
        .collect();
    let v = view(
        vec![node("n1", None, "2")],
        vec![],
        requests,
        vec![template("t", "1")],
    );
    let settings = Settings {
        check_capacity_batch_size: 3,
        ..Settings::default()
    };
    let actions = run(&settings, &v, 10);
    let outcomes: Vec<_> = ["a", "b", "c", "d"]
        .iter()
        .map(|n| outcome(&actions, n, PROVISIONED))
        .collect();
    assert_eq!(
        outcomes,
        [
            Some(("True", reason::CAPACITY_IS_FOUND)),
            Some(("True", reason::CAPACITY_IS_FOUND)),
            Some(("False", reason::CAPACITY_IS_NOT_FOUND)),
            None,
        ]
    );
    for n in ["a", "b", "c"] {
        assert_eq!(
            outcome(&actions, n, ACCEPTED),
            Some(("True", reason::ACCEPTED)),
            "{n}"
        );
    }
}

/// Rule 4: a missing PodTemplate fails the request at once (no Accepted), it is never taken
/// again, and the same loop goes on to the next request.
#[test]
fn rule_04_missing_template_fails_at_once() {
    let v = view(
        roomy(),
        vec![],
        vec![
            request("orphan", BEST_EFFORT_CLASS, &[("t", 1), ("gone", 2)]),
            request("next", CHECK_CAPACITY_CLASS, &[("t", 1)]),
        ],
        vec![template("t", "1")],
    );
    let settings = Settings::default();
    let mut state = LoopState::default();
    let actions = run_loop(&settings, &v, &mut state, at(5));
    assert_eq!(
        outcome(&actions, "orphan", FAILED),
        Some(("True", reason::FAILED_TO_CREATE_PODS))
    );
    assert_eq!(outcome(&actions, "orphan", ACCEPTED), None);
    let message = &written(&actions, "orphan").expect("written")[0].message;
    assert!(message.contains("gone"), "{message}");
    assert_eq!(
        outcome(&actions, "next", PROVISIONED),
        Some(("True", reason::CAPACITY_IS_FOUND))
    );
    // Never retried, even once the template exists.
    let mut later = apply(v, &actions);
    later.templates.push(template("gone", "1"));
    let actions = run_loop(&settings, &later, &mut state, at(5 + DAY));
    assert!(written(&actions, "orphan").is_none());
}

/// Rules 5 and 11: Accepted comes with the first outcome, and is rewritten (restamped) on every
/// retry; every written condition carries the loop's time; other conditions keep their place.
#[test]
fn rule_05_and_11_accepted_is_rewritten_on_every_retry() {
    let settings = Settings::default();
    let r = with_conditions(
        request("r", CHECK_CAPACITY_CLASS, &[("t", 3)]),
        &[
            (ACCEPTED, "True", 0),
            ("Custom", "True", 0),
            (PROVISIONED, "False", 0),
        ],
    );
    let v = view(
        vec![node("n1", None, "2")],
        vec![],
        vec![r],
        vec![template("t", "1")],
    );
    let actions = run(&settings, &v, 2 * MINUTE);
    let conditions = written(&actions, "r").expect("retried");
    let seen: Vec<_> = conditions
        .iter()
        .map(|c| {
            (
                c.type_.as_str(),
                c.status.as_str(),
                c.last_transition_time.0,
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (ACCEPTED, "True", at(2 * MINUTE)),
            ("Custom", "True", at(0)),
            (PROVISIONED, "False", at(2 * MINUTE)),
        ]
    );
    assert!(
        conditions
            .iter()
            .filter(|c| c.type_ != "Custom")
            .all(|c| c.observed_generation == Some(1))
    );
    // A first outcome: Accepted is written with it.
    let fresh = view(
        vec![node("n1", None, "2")],
        vec![],
        vec![request("f", BEST_EFFORT_CLASS, &[("t", 1)])],
        vec![template("t", "1")],
    );
    let actions = run(&settings, &fresh, 1);
    let types: Vec<_> = written(&actions, "f")
        .expect("written")
        .iter()
        .map(|c| c.type_.as_str())
        .collect();
    assert_eq!(types, [ACCEPTED, PROVISIONED]);
}

/// Rule 10: a Provisioned=False request is retried once that condition is older than its
/// backoff: 1 min, then 2, 4, 8, then 10 (the max); never earlier. The backoff lives in memory
/// per UID and is lost with it.
#[test]
fn rule_10_retries_back_off_from_the_last_transition() {
    let settings = Settings::default();
    let mut state = LoopState::default();
    let mut since = 0;
    let mut waits = Vec::new();
    for _ in 0..6 {
        let r = with_conditions(
            request("r", CHECK_CAPACITY_CLASS, &[("t", 9)]),
            &[(PROVISIONED, "False", since)],
        );
        let v = view(roomy(), vec![], vec![r], vec![template("t", "1")]);
        // Find the first second (in steps of 1 s) the retry happens.
        let mut now = since;
        let actions = loop {
            now += 1;
            let actions = run_loop(&settings, &v, &mut state, at(now));
            if !actions.status_writes.is_empty() {
                break actions;
            }
            assert!(now - since < 20 * MINUTE, "never retried");
        };
        assert_eq!(
            outcome(&actions, "r", PROVISIONED),
            Some(("False", reason::CAPACITY_IS_NOT_FOUND))
        );
        waits.push(now - since - 1);
        since = now;
    }
    assert_eq!(
        waits,
        [
            MINUTE,
            2 * MINUTE,
            4 * MINUTE,
            8 * MINUTE,
            10 * MINUTE,
            10 * MINUTE
        ]
    );
    // A restart forgets: 1 min again.
    let r = with_conditions(
        request("r", CHECK_CAPACITY_CLASS, &[("t", 9)]),
        &[(PROVISIONED, "False", since)],
    );
    let v = view(roomy(), vec![], vec![r], vec![template("t", "1")]);
    assert!(run(&settings, &v, since + MINUTE + 1).status_writes.len() == 1);
    assert!(run(&settings, &v, since + MINUTE).status_writes.is_empty());
    // Custom backoffs apply.
    let quick = Settings {
        initial_backoff: Duration::from_secs(1),
        ..Settings::default()
    };
    assert!(run(&quick, &v, since + 2).status_writes.len() == 1);
}

/// Rule 10: Provisioned=True, Failed=True or a Provisioned of another status are never taken
/// again.
#[test]
fn rule_10_final_requests_are_not_retried() {
    for conditions in [
        &[(PROVISIONED, "True", 0)][..],
        &[(FAILED, "True", 0), (PROVISIONED, "False", 0)],
        &[(PROVISIONED, "Unknown", 0)],
    ] {
        let r = with_conditions(request("r", BEST_EFFORT_CLASS, &[("t", 1)]), conditions);
        let v = view(roomy(), vec![], vec![r], vec![template("t", "1")]);
        let actions = run(&Settings::default(), &v, DAY);
        assert!(outcome(&actions, "r", ACCEPTED).is_none(), "{conditions:?}");
    }
}

/// The backoff cache forgets the least recently used UID beyond its size.
#[test]
fn rule_10_backoff_cache_is_bounded() {
    let mut backoff = Backoff::default();
    for i in 0..crate::settings::BACKOFF_CACHE_SIZE + 5 {
        backoff.set(&format!("u{i}"), Duration::from_secs(1));
    }
    assert_eq!(backoff.len(), crate::settings::BACKOFF_CACHE_SIZE);
    assert_eq!(backoff.get("u0"), None);
    assert_eq!(backoff.get("u5"), Some(Duration::from_secs(1)));
}

/// Scripted requests (by class or by their template's annotation) are left to the script:
/// the default mode neither processes, expires nor deletes them.
#[test]
fn scripted_requests_are_left_alone() {
    let mut annotated = template("s", "1");
    annotated.metadata.annotations = Some(
        [(
            crate::script::SCRIPT_ANNOTATION.to_string(),
            "fail".to_string(),
        )]
        .into(),
    );
    let v = view(
        roomy(),
        vec![],
        vec![
            request("by-annotation", CHECK_CAPACITY_CLASS, &[("s", 1)]),
            with_conditions(
                request("by-class", BEST_EFFORT_CLASS, &[("t", 1)]),
                &[(PROVISIONED, "True", 0)],
            ),
        ],
        vec![annotated, template("t", "1")],
    );
    let settings = Settings {
        scripted_classes: vec![BEST_EFFORT_CLASS.into()],
        ..Settings::default()
    };
    let actions = run(&settings, &v, 30 * DAY);
    assert!(
        actions.status_writes.is_empty() && actions.request_deletions.is_empty(),
        "{actions:?}"
    );
}

fn arbitrary_conditions() -> impl Strategy<Value = Vec<(&'static str, &'static str, i64)>> {
    let type_ = prop::sample::select(vec![ACCEPTED, PROVISIONED, FAILED, BOOKING_EXPIRED]);
    let status = prop::sample::select(vec!["True", "False"]);
    prop::collection::vec((type_, status, 0i64..(10 * DAY)), 0..4)
}

proptest! {
    /// Rule 14: whatever the cluster and the requests' history, a loop never writes
    /// CapacityRevoked, a status other than True/False, or Accepted=False; and (rule 11) every
    /// condition it writes anew is stamped with the loop's time.
    #[test]
    fn rule_14_never_writes_what_cluster_autoscaler_never_does(
        histories in prop::collection::vec((arbitrary_conditions(), any::<bool>(), 1i32..6), 1..6),
        node_cpus in prop::collection::vec(1u32..8, 0..3),
        now in 0i64..(20 * DAY),
    ) {
        let requests: Vec<_> = histories
            .iter()
            .enumerate()
            .map(|(i, (conditions, best_effort, count))| {
                let class = if *best_effort { BEST_EFFORT_CLASS } else { CHECK_CAPACITY_CLASS };
                with_conditions(request(&format!("r{i}"), class, &[("t", *count)]), conditions)
            })
            .collect();
        let nodes = node_cpus.iter().enumerate().map(|(i, c)| node(&format!("n{i}"), Some("g"), &c.to_string())).collect();
        let v = view(nodes, vec![], requests, vec![template("t", "1")]);
        let actions = run(&settings_with_group(0, 3), &v, now);
        for write in &actions.status_writes {
            let before = v.requests.iter().find(|r| r.metadata.name.as_deref() == Some(&write.request.name)).expect("known");
            let old = &before.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
            for c in write.conditions.iter().filter(|c| !old.contains(c)) {
                prop_assert!(c.type_ != CAPACITY_REVOKED);
                prop_assert!(c.status == "True" || c.status == "False");
                prop_assert!(!(c.type_ == ACCEPTED && c.status == "False"));
                prop_assert_eq!(c.last_transition_time.0, at(now));
            }
            // Conditions are replaced in place, never dropped or duplicated.
            let types: Vec<_> = write.conditions.iter().map(|c| c.type_.as_str()).collect();
            let old_types: Vec<_> = old.iter().map(|c| c.type_.as_str()).collect();
            prop_assert_eq!(&types[..old_types.len()], &old_types[..]);
        }
    }
}

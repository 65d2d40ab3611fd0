//! The pure decision layer: when a check may be asked, and what a decision may write.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::*;
use crate::api::PodSetUpdate;
use crate::retry;
use crate::testing::WorkloadBuilder;

mod properties;

const CHECK: &str = "budget";

fn now() -> Timestamp {
    "2026-11-22T12:00:00Z".parse().expect("timestamp")
}

/// A Workload holding quota whose entry for CHECK is Pending: the moment a check decides.
fn deciding() -> WorkloadBuilder {
    WorkloadBuilder::new("team-a", "wl")
        .pod_set("main", 2, "1")
        .pod_set("workers", 4, "2")
        .check(CHECK, CheckState::Pending)
        .quota_reserved("cq", "on-demand")
}

/// What the runtime plans for CHECK on `wl` at [`now`]: its attempt, the largest ceiling, no
/// revalidation, no jitter. Tests change a field with `PlanInput { .., ..input(..) }`.
fn input<'a>(wl: &'a Workload, decision: Decision, policy: &'a RetryPolicy) -> PlanInput<'a> {
    PlanInput {
        workload: wl,
        check: CHECK,
        decision,
        attempt: attempts::attempt(wl, CHECK),
        policy,
        max_retry_delay: retry::MAX_DELAY,
        revalidate_ready: false,
        now: now(),
        jitter_sample: 0.0,
    }
}

/// What is planned for `decision` on `wl` under Kueue's default retry policy.
fn plan_for(wl: &Workload, decision: Decision) -> Plan {
    plan(input(wl, decision, &RetryPolicy::default()))
}

fn written(plan: Plan) -> Write {
    match plan {
        Plan::Write(w) => w,
        other => panic!("expected a write, got {other:?}"),
    }
}

/// The write planned for `decision` on `wl` under Kueue's default retry policy.
fn write_for(wl: &Workload, decision: Decision) -> Write {
    written(plan_for(wl, decision))
}

/// The write planned for `decision` on a [`deciding`] Workload at `attempt` (Kueue's
/// `retryCount` is one less), under Kueue's default retry policy.
fn write_at_attempt(attempt: i32, decision: Decision) -> Write {
    write_for(
        &deciding().retry_count(CHECK, attempt - 1).build(),
        decision,
    )
}

#[test]
fn eligibility_follows_the_workload_lifecycle() {
    use Eligibility::*;
    let no_quota = WorkloadBuilder::new("ns", "wl")
        .pod_set("main", 1, "1")
        .check(CHECK, CheckState::Pending);
    assert_eq!(
        eligibility(&no_quota.clone().build(), CHECK, false),
        Idle(ReleaseReason::QuotaReleased)
    );
    assert_eq!(
        eligibility(&deciding().build(), CHECK, false),
        Decide {
            revalidating: false
        }
    );
    assert_eq!(
        eligibility(&deciding().build(), "other-check", false),
        Idle(ReleaseReason::CheckRemoved)
    );

    let ready = deciding()
        .check(CHECK, CheckState::Ready)
        .admitted()
        .build();
    assert_eq!(eligibility(&ready, CHECK, false), Wait(CheckState::Ready));
    assert_eq!(
        eligibility(&ready, CHECK, true),
        Decide { revalidating: true }
    );
    let retry = deciding().check(CHECK, CheckState::Retry).build();
    assert_eq!(eligibility(&retry, CHECK, true), Wait(CheckState::Retry));

    assert_eq!(
        eligibility(&deciding().evicted("Preempted").build(), CHECK, false),
        Idle(ReleaseReason::Evicted)
    );
    assert_eq!(
        eligibility(&deciding().finished().build(), CHECK, false),
        Idle(ReleaseReason::Finished)
    );
    assert_eq!(
        eligibility(&deciding().deactivated().build(), CHECK, false),
        Idle(ReleaseReason::Deactivated)
    );
    let mut deleting = deciding().build();
    deleting.metadata.deletion_timestamp = Some(Time(now()));
    assert_eq!(
        eligibility(&deleting, CHECK, false),
        Idle(ReleaseReason::Deleted)
    );
}

#[test]
fn ready_writes_a_complete_entry_and_never_retry_count() {
    let update = PodSetUpdate {
        name: "workers".into(),
        ..Default::default()
    };
    let w = write_at_attempt(3, Decision::ready_with_updates("ok", vec![update.clone()]));
    assert_eq!(
        w.entry,
        AdmissionCheckState {
            name: CHECK.into(),
            state: CheckState::Ready,
            last_transition_time: Some(Time(now())),
            message: "ok".into(),
            requeue_after_seconds: None,
            retry_count: None,
            pod_set_updates: vec![update],
        }
    );
    assert_eq!(w.attempt, 3);
    assert!(w.state_changed);
    assert!(!w.gave_up);
}

#[test]
fn retry_follows_the_policy_and_tells_the_user_attempt_and_time() {
    let wl = deciding().build();
    let w = write_for(&wl, Decision::retry("over budget"));
    assert_eq!(w.entry.state, CheckState::Retry);
    assert_eq!(w.entry.requeue_after_seconds, Some(60));
    assert_eq!(w.retry_delay, Some(Duration::from_secs(60)));
    assert_eq!(
        w.entry.last_transition_time,
        Some(Time(now())),
        "the delay counts from this decision"
    );
    assert_eq!(
        w.entry.message,
        "over budget (attempt 1 of 4; next attempt not before 2026-11-22T12:01:00Z)"
    );

    let w = write_at_attempt(3, Decision::retry("over budget"));
    assert_eq!(w.entry.requeue_after_seconds, Some(240));
    assert!(
        w.entry.message.contains("attempt 3 of 4"),
        "{}",
        w.entry.message
    );
}

#[test]
fn retry_past_the_limit_becomes_rejected() {
    let w = write_at_attempt(
        4,
        Decision::retry_after("still over budget", Duration::from_secs(5)),
    );
    assert_eq!(w.entry.state, CheckState::Rejected);
    assert!(w.gave_up);
    assert_eq!(w.entry.requeue_after_seconds, None);
    assert_eq!(
        w.entry.message,
        "still over budget (attempt 4: no retries left after 3)"
    );
}

#[test]
fn explicit_and_immediate_retry_delays() {
    let wl = deciding().retry_count(CHECK, 1).build();
    let w = write_for(
        &wl,
        Decision::retry_after("window closed", Duration::from_millis(90_500)),
    );
    assert_eq!(
        w.entry.requeue_after_seconds,
        Some(91),
        "rounded up, never shorter than asked"
    );

    let w = written(plan(input(
        &wl,
        Decision::retry("flaky"),
        &RetryPolicy::immediate(),
    )));
    assert_eq!(
        w.entry.requeue_after_seconds,
        Some(0),
        "explicit 0 so no earlier delay lingers"
    );
    assert!(
        w.entry
            .message
            .ends_with("(attempt 2; next attempt as soon as Kueue requeues the workload)"),
        "{}",
        w.entry.message
    );
}

/// The stuck-Workload hazard: nothing is written to a Workload that does not hold quota, is
/// evicted, finished or deactivated, whatever the check answered.
#[test]
fn no_write_outside_a_quota_reservation() {
    let cases = [
        (
            deciding().evicted("Preempted").build(),
            ReleaseReason::Evicted,
        ),
        (
            WorkloadBuilder::new("ns", "wl")
                .pod_set("main", 1, "1")
                .check(CHECK, CheckState::Pending)
                .build(),
            ReleaseReason::QuotaReleased,
        ),
        (deciding().finished().build(), ReleaseReason::Finished),
        (deciding().deactivated().build(), ReleaseReason::Deactivated),
    ];
    for (wl, reason) in cases {
        for decision in [
            Decision::retry("x"),
            Decision::rejected("x"),
            Decision::ready("x"),
            Decision::pending("x"),
        ] {
            assert_eq!(
                plan_for(&wl, decision.clone()),
                Plan::Refused(Refusal::NotEligible(Eligibility::Idle(reason))),
                "{decision:?} on a workload that is {reason:?}"
            );
        }
    }
}

#[test]
fn pending_writes_only_changes() {
    let entry = AdmissionCheckState {
        name: CHECK.into(),
        state: CheckState::Pending,
        last_transition_time: Some(Time("2026-11-22T11:00:00Z".parse().expect("ts"))),
        message: "waiting for the budget service".into(),
        ..Default::default()
    };
    let wl = deciding().check_entry(entry.clone()).build();
    let again =
        Decision::pending_recheck_after("waiting for the budget service", Duration::from_secs(30));
    assert_eq!(
        plan_for(&wl, again),
        Plan::Unchanged {
            recheck_after: Some(Duration::from_secs(30))
        }
    );

    let w = write_for(&wl, Decision::pending("budget service answered slowly"));
    assert!(!w.state_changed);
    assert_eq!(
        w.entry.last_transition_time, entry.last_transition_time,
        "same state keeps its transition time"
    );
}

#[test]
fn invalid_decisions_are_refused_with_a_reason() {
    let wl = deciding().build();
    let refusal = |decision| match plan_for(&wl, decision) {
        Plan::Refused(Refusal::InvalidDecision(why)) => why,
        other => panic!("expected a refusal, got {other:?}"),
    };
    let update = |name: &str| PodSetUpdate {
        name: name.into(),
        ..Default::default()
    };
    assert!(refusal(Decision::ready_with_updates("", vec![update("nope")])).contains("\"nope\""));
    assert!(
        refusal(Decision::ready_with_updates(
            "",
            vec![update("main"), update("main")]
        ))
        .contains("two podSetUpdates")
    );
    assert!(
        refusal(Decision::ready_with_updates("", vec![update("main"); 19])).contains("at most 18")
    );
    // What Kueue's webhook refuses with 403 (the 70-character name part) is refused
    // here, with the podset and the key named.
    let key = format!("example.com/{}", "z".repeat(70));
    let mut bad_key = update("main");
    bad_key.node_selector.insert(key.clone(), "a".into());
    let why = refusal(Decision::ready_with_updates("", vec![bad_key]));
    assert!(
        why.contains("podset \"main\"") && why.contains(&key) && why.contains("70 characters"),
        "{why}"
    );
}

/// Kueue merges every Ready entry's podSetUpdates into the pods when it starts the job, and a
/// key given two values finishes the admitted Workload as FailedToStart: a new Ready that would
/// do that is refused, naming the podset, the key and the other check; the same value, another
/// podset, or another check's entry that is not Ready, is no conflict.
#[test]
fn a_ready_whose_updates_conflict_with_another_checks_ready_is_refused() {
    let consume = "autoscaling.x-k8s.io/consume-provisioning-request";
    let update = |pod_set: &str, value: &str| {
        let mut u = PodSetUpdate {
            name: pod_set.into(),
            ..Default::default()
        };
        u.annotations.insert(consume.into(), value.into());
        u
    };
    let other = |state, updates| AdmissionCheckState {
        name: "capacity-b".into(),
        state,
        message: "provisioned".into(),
        pod_set_updates: updates,
        ..Default::default()
    };
    let theirs = deciding()
        .check_entry(other(CheckState::Ready, vec![update("main", "req-b")]))
        .build();
    match plan_for(
        &theirs,
        Decision::ready_with_updates("ok", vec![update("main", "req-a")]),
    ) {
        Plan::Refused(Refusal::InvalidDecision(why)) => assert!(
            why.contains("podset \"main\"")
                && why.contains(consume)
                && why.contains("check \"capacity-b\"")
                && why.contains("FailedToStart")
                && !why.contains("req-"),
            "{why}"
        ),
        other => panic!("expected a refusal, got {other:?}"),
    }
    for (wl, ours, why) in [
        (&theirs, update("main", "req-b"), "the same value"),
        (&theirs, update("workers", "req-a"), "another podset"),
        (
            &deciding()
                .check_entry(other(CheckState::Pending, vec![update("main", "req-b")]))
                .build(),
            update("main", "req-a"),
            "the other entry is not Ready",
        ),
    ] {
        let plan = plan_for(wl, Decision::ready_with_updates("ok", vec![ours]));
        assert!(matches!(plan, Plan::Write(_)), "{why}: {plan:?}");
    }
}

#[test]
fn the_updates_of_a_ready_entry_stay_as_they_are() {
    let mut given = PodSetUpdate {
        name: "main".into(),
        ..Default::default()
    };
    given.node_selector.insert("zone".into(), "a".into());
    let wl = deciding()
        .check_entry(AdmissionCheckState {
            name: CHECK.into(),
            state: CheckState::Ready,
            message: "ok".into(),
            pod_set_updates: vec![given.clone()],
            ..Default::default()
        })
        .admitted()
        .build();
    let policy = RetryPolicy::default();
    let revalidate = |decision| {
        plan(PlanInput {
            revalidate_ready: true,
            ..input(&wl, decision, &policy)
        })
    };
    assert_eq!(
        revalidate(Decision::ready_with_updates("ok", vec![given.clone()])),
        Plan::Unchanged {
            recheck_after: None
        }
    );
    let mut changed = given;
    changed.node_selector.insert("zone".into(), "b".into());
    match revalidate(Decision::ready_with_updates("ok", vec![changed])) {
        Plan::Refused(Refusal::InvalidDecision(why)) => {
            assert!(why.contains("cannot change"), "{why}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn revalidation_may_keep_retry_or_reject_but_not_unready() {
    let wl = deciding()
        .check(CHECK, CheckState::Ready)
        .admitted()
        .build();
    let policy = RetryPolicy::default();
    let revalidate = |decision| {
        plan(PlanInput {
            revalidate_ready: true,
            ..input(&wl, decision, &policy)
        })
    };
    assert_eq!(
        revalidate(Decision::ready("")),
        Plan::Unchanged {
            recheck_after: None
        }
    );
    assert!(matches!(
        revalidate(Decision::pending("hm")),
        Plan::Refused(Refusal::InvalidDecision(_))
    ));
    assert!(
        matches!(revalidate(Decision::retry("budget ran out")), Plan::Write(w) if w.entry.state == CheckState::Retry)
    );
}

#[test]
fn long_messages_are_cut_to_kueues_limit() {
    let wl = deciding().build();
    let w = write_for(&wl, Decision::rejected("é".repeat(40_000)));
    assert_eq!(
        w.entry.message.chars().count(),
        AdmissionCheckState::MAX_MESSAGE_CHARS
    );
    assert!(w.entry.message.ends_with('…'));
}

#[test]
fn the_apply_patch_carries_the_resource_version_and_only_our_entry() {
    let wl = deciding().check("someone-elses", CheckState::Ready).build();
    let w = write_for(&wl, Decision::ready("ok"));
    let patch = status_apply_patch(&wl, &w.entry).expect("read from the API server");
    assert_eq!(patch["metadata"]["resourceVersion"], "1");
    assert_eq!(patch["metadata"]["namespace"], "team-a");
    let entries = patch["status"]["admissionChecks"].as_array().expect("list");
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0]["name"], CHECK);
    assert_eq!(entries[0]["message"], "ok");
    assert_eq!(entries[0]["lastTransitionTime"], "2026-11-22T12:00:00Z");
    assert!(entries[0].get("retryCount").is_none());

    let mut unread = wl.clone();
    unread.metadata.resource_version = None;
    assert_eq!(
        status_apply_patch(&unread, &w.entry),
        None,
        "never an unconditioned write"
    );
}

/// lastTransitionTime is stored at whole seconds; the delay must still be honoured in full.
#[test]
fn retry_delay_survives_whole_second_timestamps() {
    let wl = deciding().build();
    let policy = RetryPolicy::fixed(Duration::from_secs(10));
    let at: Timestamp = "2026-11-22T12:00:00.700Z".parse().expect("ts");
    let w = written(plan(PlanInput {
        now: at,
        ..input(&wl, Decision::retry("later"), &policy)
    }));
    // Kueue retries at 12:00:00 (stored) + requeueAfterSeconds, which must be >= 12:00:10.7.
    assert_eq!(w.entry.requeue_after_seconds, Some(11));
    assert!(
        w.entry
            .message
            .ends_with("next attempt not before 2026-11-22T12:00:11Z)"),
        "{}",
        w.entry.message
    );
    assert_eq!(w.retry_delay, Some(Duration::from_secs(10)));
}

#[test]
fn a_late_retry_keeps_what_is_left_of_its_delay() {
    let wl = deciding().build();
    let w = write_for(
        &wl,
        Decision::retry_after("window full", Duration::from_secs(40)),
    );
    let late = LateRetry::from_refused(&w, "window full", now()).expect("a delayed Retry");
    assert_eq!(late.attempt, 1);
    assert_eq!(late.not_before, "2026-11-22T12:00:40Z".parse().expect("ts"));

    let later: Timestamp = "2026-11-22T12:00:15Z".parse().expect("ts");
    match late.decision(later) {
        Some(Decision::Retry {
            message,
            delay: RetryDelay::After(d),
        }) => {
            assert_eq!(d, Duration::from_secs(25), "only what is left");
            assert!(
                message.starts_with("window full [decided for attempt 1"),
                "{message}"
            );
        }
        other => panic!("expected a Retry after 25 s, got {other:?}"),
    }
    // Once the delay is over (or under a second is left) the check is asked again.
    assert_eq!(
        late.decision("2026-11-22T12:00:39.5Z".parse().expect("ts")),
        None
    );
    assert_eq!(
        late.decision("2026-11-22T12:05:00Z".parse().expect("ts")),
        None
    );
}

#[test]
fn only_delayed_retries_are_carried_over() {
    let wl = deciding().build();
    for decision in [
        Decision::ready("ok"),
        Decision::pending("wait"),
        Decision::rejected("no"),
        Decision::retry_after("now", Duration::ZERO),
    ] {
        let w = write_for(&wl, decision.clone());
        assert_eq!(
            LateRetry::from_refused(&w, decision.message(), now()),
            None,
            "{decision:?}"
        );
    }
    // Past the retry limit the Retry became Rejected: nothing to carry.
    let w = write_at_attempt(4, Decision::retry("again"));
    assert_eq!(w.entry.state, CheckState::Rejected);
    assert_eq!(LateRetry::from_refused(&w, "again", now()), None);
}

mod flavor_rule {
    //! Which checks Kueue gives a Workload with a reservation, by version, as read from its
    //! `AdmissionChecksForWorkload` (v0.15.0 to v0.19.2); pinned on the real Kueue by the
    //! end-to-end contract test `kueue_flavor_rule`.

    use super::super::FlavorRule::{self, *};
    use crate::api::{ClusterQueueSpec, Workload};
    use crate::testing::{WorkloadBuilder, cluster_queue};

    fn queue(flavors: &[&str], rules: &[(&str, &[&str])]) -> ClusterQueueSpec {
        cluster_queue("cq", flavors, rules).spec
    }

    /// A Workload reserved on `flavor`, or, with `None`, whose podsets request nothing the
    /// queue covers (no flavor assigned).
    fn reserved(flavor: Option<&str>) -> Workload {
        let b = WorkloadBuilder::new("ns", "w")
            .pod_set("main", 1, "1")
            .quota_reserved("cq", flavor.unwrap_or("none"));
        match flavor {
            Some(_) => b.build(),
            None => b
                .with(|w| {
                    for p in &mut w
                        .status
                        .as_mut()
                        .expect("status")
                        .admission
                        .as_mut()
                        .expect("admission")
                        .pod_set_assignments
                    {
                        p.flavors.clear();
                    }
                })
                .build(),
        }
    }

    const RULES: [FlavorRule; 3] = [
        EveryCheckWhenAllCoverAll,
        EveryCheckWhenFlavorless,
        Intersection,
    ];

    /// Whether `check` applies under each of [`RULES`].
    fn by_rule(q: &ClusterQueueSpec, check: &str, wl: &Workload) -> [bool; 3] {
        RULES.map(|r| r.applies(q, check, wl))
    }

    #[test]
    fn the_rule_of_each_kueue_version() {
        for (minor, patch, rule) in [
            (15, 0, EveryCheckWhenAllCoverAll),
            (15, 8, EveryCheckWhenAllCoverAll),
            (16, 5, EveryCheckWhenAllCoverAll),
            (16, 6, EveryCheckWhenFlavorless),
            (16, 9, EveryCheckWhenFlavorless),
            (17, 0, EveryCheckWhenAllCoverAll),
            (17, 1, EveryCheckWhenFlavorless),
            (17, 8, EveryCheckWhenFlavorless),
            (18, 0, Intersection),
            (19, 2, Intersection),
            (20, 0, Intersection),
        ] {
            assert_eq!(
                FlavorRule::of_kueue(minor, patch),
                rule,
                "v0.{minor}.{patch}"
            );
        }
    }

    #[test]
    fn an_assigned_flavor_a_rule_names_gets_the_check_in_every_version() {
        let q = queue(&["cpu", "gpu"], &[("c", &[]), ("g", &["gpu"])]);
        assert_eq!(by_rule(&q, "c", &reserved(Some("gpu"))), [true; 3]);
        assert_eq!(by_rule(&q, "g", &reserved(Some("gpu"))), [true; 3]);
        // Not one the rule leaves out, whichever version: not every rule covers every flavor.
        assert_eq!(by_rule(&q, "g", &reserved(Some("cpu"))), [false; 3]);
        // Nor a check the queue does not list, nor a Workload without a reservation.
        assert_eq!(by_rule(&q, "x", &reserved(Some("cpu"))), [false; 3]);
        let queued = WorkloadBuilder::new("ns", "w")
            .pod_set("main", 1, "1")
            .build();
        assert_eq!(by_rule(&q, "c", &queued), [false; 3]);
    }

    #[test]
    fn a_workload_without_an_assigned_flavor_gets_the_checks_only_before_v0_18() {
        let all_cover_all = queue(&["cpu"], &[("c", &[])]);
        assert_eq!(
            by_rule(&all_cover_all, "c", &reserved(None)),
            [true, true, false]
        );
        // With a flavor-specific rule, v0.15's shortcut is off: nothing meets.
        let specific = queue(&["cpu", "gpu"], &[("c", &[]), ("g", &["gpu"])]);
        assert_eq!(
            by_rule(&specific, "c", &reserved(None)),
            [false, true, false]
        );
    }

    #[test]
    fn a_flavor_that_left_the_queue_gets_the_checks_only_by_v0_15s_shortcut() {
        let q = queue(&["new"], &[("c", &[])]);
        assert_eq!(
            by_rule(&q, "c", &reserved(Some("old"))),
            [true, false, false]
        );
    }

    #[test]
    fn the_early_start_assumes_the_rule_every_version_agrees_on() {
        // Intersection never applies where an older rule does not: nothing is started for an
        // entry that will not come, whatever Kueue runs.
        let queues = [
            queue(&["cpu"], &[("c", &[])]),
            queue(&["cpu", "gpu"], &[("c", &[]), ("g", &["gpu"])]),
            queue(&["new"], &[("c", &[])]),
        ];
        let workloads = [
            reserved(None),
            reserved(Some("cpu")),
            reserved(Some("gpu")),
            reserved(Some("old")),
        ];
        for q in &queues {
            for wl in &workloads {
                for check in ["c", "g"] {
                    if FlavorRule::EARLY_START.applies(q, check, wl) {
                        assert!(RULES.iter().all(|r| r.applies(q, check, wl)));
                    }
                }
            }
        }
    }
}

//! The rows of the table in `docs/state-machine.md` ("When the check is called"), one test
//! each, and a test that the table and these rows say the same; the holds read from the
//! cluster.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::*;
use crate::api::AdmissionCheckState;
use crate::testing::WorkloadBuilder;

mod properties;

const CHECK: &str = "budget";
const WAIT: Duration = Duration::from_secs(20);
const HOLD: Duration = Duration::from_secs(120);

fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).expect("valid")
}

/// A Workload of two pods that got quota at `t(0)`.
fn reserved() -> WorkloadBuilder {
    WorkloadBuilder::new("team-a", "wl")
        .at(t(0))
        .pod_set("main", 2, "1")
        .quota_reserved("cq", "on-demand")
}

/// What the runtime observes for CHECK on `wl` at `t(10)` with nothing remembered: an active
/// check that starts early and whose ClusterQueue applies it.
fn observed(wl: &Workload) -> Observed<'_> {
    Observed {
        workload: wl,
        check: CHECK,
        answering: Answering::Yes,
        revalidate: false,
        starts_early: true,
        queue_rule: QueueRule::Applies,
        asked: None,
        early: None,
        own_write_pending: None,
        early_start_wait: WAIT,
        now: t(10),
    }
}

fn step(step: Step) -> Next {
    Next {
        remember: None,
        release: None,
        forget_early: false,
        step,
    }
}

/// One test per row of the table, named; `ROWS` lists the table's cells in the same order.
macro_rules! rows {
    ($( $name:ident: [$workload:expr, $entry:expr, $runtime:expr] => $body:block )*) => {
        $( #[test] fn $name() $body )*
        const ROWS: &[[&str; 3]] = &[ $( [$workload, $entry, $runtime] ),* ];
    };
}

rows! {
    row_quota_without_the_entry_starts_early: [
        "quota reserved, active, not evicted, not admitted, its ClusterQueue lists the check for the flavors assigned",
        "none yet",
        "calls `start_early` once per attempt, if the check `starts_early()`; writes nothing"
    ] => {
        let wl = reserved().build();
        assert_eq!(next(&observed(&wl)), step(Step::StartEarly));
        // Not for a check that does not start early, nor one the ClusterQueue does not apply.
        let no_early = Observed { starts_early: false, ..observed(&wl) };
        assert_eq!(next(&no_early), step(Step::Idle));
        let not_applied = Observed { queue_rule: QueueRule::DoesNotApply, ..observed(&wl) };
        assert_eq!(next(&not_applied), step(Step::Idle));
        // Nor for an admitted Workload (the check came after the admission).
        let admitted = reserved().admitted().build();
        assert_eq!(next(&observed(&admitted)), step(Step::Idle));
        // Once per attempt: started in this attempt, it waits.
        let at = AskedAt::expected(&wl, CHECK);
        let started = Observed { early: Some(EarlyStart { at, abandoned: false }), ..observed(&wl) };
        assert_ne!(next(&started).step, Step::StartEarly);
    }

    row_unknown_queues_start_nothing: [
        "same, but the ClusterQueues not known (their watch has not listed them yet, or is refused)",
        "none yet",
        "starts nothing and releases only what it started; the watch wakes the Workload once they are known"
    ] => {
        let wl = reserved().build();
        fn unknown(o: Observed<'_>) -> Observed<'_> {
            Observed { queue_rule: QueueRule::Unknown, ..o }
        }
        assert_eq!(next(&unknown(observed(&wl))), step(Step::Idle));
        // Not after the wait either: nothing was started, nothing is abandoned.
        let late = Observed { now: t(25), ..observed(&wl) };
        assert_eq!(next(&unknown(late)), step(Step::Idle));
        // Work this process started before the queues became unknown keeps its bound.
        let at = AskedAt::expected(&wl, CHECK);
        let started = Observed {
            early: Some(EarlyStart { at, abandoned: false }),
            asked: Some(at),
            ..observed(&wl)
        };
        assert_eq!(
            next(&unknown(started.clone())),
            step(Step::AwaitEntry(Duration::from_secs(10)))
        );
        let over = Observed { now: t(20), ..started };
        assert_eq!(next(&unknown(over)), step(Step::AbandonEarly));
        // Once known again, the Workload starts.
        assert_eq!(next(&observed(&wl)), step(Step::StartEarly));
    }

    row_started_early_waits_for_the_entry: [
        "same, started early, within `--early-start-wait-seconds` of the quota reservation",
        "none yet",
        "waits for the entry"
    ] => {
        let wl = reserved().build();
        let at = AskedAt::expected(&wl, CHECK);
        let started = Observed {
            early: Some(EarlyStart { at, abandoned: false }),
            asked: Some(at),
            ..observed(&wl)
        };
        // Counted from the reservation (t(0)), not from when this process started it.
        assert_eq!(next(&started), step(Step::AwaitEntry(Duration::from_secs(10))));
    }

    row_the_entry_missing_after_the_wait_abandons_the_early_start: [
        "same, the entry still missing `--early-start-wait-seconds` after the quota reservation",
        "none yet",
        "calls `release(EntryNotAdded)` once; starts again only when the entry comes"
    ] => {
        let wl = reserved().build();
        let at = AskedAt::expected(&wl, CHECK);
        let late = Observed {
            early: Some(EarlyStart { at, abandoned: false }),
            asked: Some(at),
            now: t(20),
            ..observed(&wl)
        };
        assert_eq!(next(&late), step(Step::AbandonEarly));
        // A process that starts after the wait (a restart) does not start it, only releases.
        let restarted = Observed { now: t(25), ..observed(&wl) };
        assert_eq!(next(&restarted), step(Step::AbandonEarly));
        // Once: abandoned in this attempt, nothing more.
        let abandoned = Observed {
            early: Some(EarlyStart { at, abandoned: true }),
            now: t(30),
            ..observed(&wl)
        };
        assert_eq!(next(&abandoned), step(Step::Idle));
        // Bounded on every path: work started before the check turned inactive is released
        // after the wait too, and an inactive check never starts.
        let inactive = Answering::No("inactive".into());
        let turned = Observed {
            answering: inactive.clone(),
            early: Some(EarlyStart { at, abandoned: false }),
            now: t(20),
            ..observed(&wl)
        };
        assert_eq!(next(&turned), step(Step::AbandonEarly));
        let within = Observed { answering: inactive, ..observed(&wl) };
        assert_eq!(next(&within), step(Step::AwaitEntry(Duration::from_secs(10))));
        // A check no longer ours (another deployment may answer it now): only what this
        // process started is released.
        let gone = Observed { answering: Answering::Gone, now: t(20), ..observed(&wl) };
        assert_eq!(next(&gone), step(Step::Idle));
        let gone_started = Observed { early: Some(EarlyStart { at, abandoned: false }), ..gone };
        assert_eq!(next(&gone_started), step(Step::AbandonEarly));
        // The entry came: decided as usual.
        let came = reserved().check(CHECK, CheckState::Pending).build();
        assert_eq!(next(&Observed { now: t(30), ..observed(&came) }).step, Step::Ask { revalidating: false });
    }

    row_pending_with_quota_asks_the_check: [
        "quota reserved, active, not evicted, not finished",
        "`Pending`",
        "calls `decide`"
    ] => {
        let wl = reserved().check(CHECK, CheckState::Pending).build();
        assert_eq!(next(&observed(&wl)), step(Step::Ask { revalidating: false }));
        // Also admitted (Kueue does not un-admit for a Pending entry added later).
        let admitted = reserved().admitted().check(CHECK, CheckState::Pending).build();
        assert_eq!(next(&observed(&admitted)), step(Step::Ask { revalidating: false }));
    }

    row_pending_with_our_write_not_in_the_cache_waits: [
        "same, the runtime's last write not in the cache yet",
        "`Pending`",
        "waits for the watch to bring it (at most 30 s): asking now would answer the attempt twice"
    ] => {
        let wl = reserved().check(CHECK, CheckState::Pending).build();
        let lagging = Observed { own_write_pending: Some(Duration::from_secs(3)), ..observed(&wl) };
        assert_eq!(next(&lagging), step(Step::AwaitOwnWrite(Duration::from_secs(3))));
    }

    row_pending_for_a_check_that_cannot_answer_is_held: [
        "same, the check inactive or in shadow mode",
        "`Pending`",
        "writes why it cannot answer; after the hold, `Retry` (above)"
    ] => {
        let wl = reserved().check(CHECK, CheckState::Pending).build();
        let inactive = Observed { answering: Answering::No("inactive".into()), ..observed(&wl) };
        assert_eq!(next(&inactive), step(Step::HoldUnanswered("inactive".into())));
        // A Ready entry of such a check stands; a check no longer ours is only released.
        let ready = reserved().check(CHECK, CheckState::Ready).build();
        let asked = Some(AskedAt { attempt: 1, evictions: 0 });
        let inactive_ready = Observed { answering: Answering::No("x".into()), revalidate: true, asked, ..observed(&ready) };
        assert_eq!(next(&inactive_ready), step(Step::KueueActs(CheckState::Ready)));
        let gone = Observed { answering: Answering::Gone, ..observed(&wl) };
        assert_eq!(next(&gone), step(Step::Idle));
    }

    row_ready_is_asked_again_only_when_revalidating: [
        "same",
        "`Ready`",
        "calls `decide` again if the check's `revalidate()` is `OnChange`, or `Every(period)` (also when the period has passed); else nothing"
    ] => {
        let wl = reserved().check(CHECK, CheckState::Ready).build();
        let asked = Some(AskedAt { attempt: 1, evictions: 0 });
        let standing = Observed { asked, ..observed(&wl) };
        assert_eq!(next(&standing), step(Step::KueueActs(CheckState::Ready)));
        let revalidating = Observed { revalidate: true, asked, ..observed(&wl) };
        assert_eq!(next(&revalidating), step(Step::Ask { revalidating: true }));
        // Asked by an earlier process: remembered as well.
        let restarted = Observed { revalidate: true, ..observed(&wl) };
        assert_eq!(next(&restarted).remember, asked);
    }

    row_retry_and_rejected_wait_for_kueue: [
        "same",
        "`Retry`, `Rejected`",
        "nothing: Kueue acts next"
    ] => {
        for state in [CheckState::Retry, CheckState::Rejected] {
            let wl = reserved().check(CHECK, state).build();
            let at = AskedAt { attempt: 1, evictions: 0 };
            let revalidating = Observed { revalidate: true, asked: Some(at), ..observed(&wl) };
            assert_eq!(next(&revalidating), step(Step::KueueActs(state)));
            // An answer of ours this process did not write (before a restart or a leader
            // change) is remembered, so that the release comes when the Workload moves on.
            let restarted = Observed { revalidate: true, ..observed(&wl) };
            assert_eq!(next(&restarted).remember, Some(at));
        }
    }

    row_an_idle_workload_is_released_once: [
        "evicted, no quota, deactivated, finished, deleted, or the entry gone",
        "any",
        "calls `release` once if it asked the check about this Workload"
    ] => {
        let asked = AskedAt { attempt: 1, evictions: 0 };
        let cases = [
            (reserved().check(CHECK, CheckState::Ready).evicted("Preempted").build(), ReleaseReason::Evicted),
            (WorkloadBuilder::new("team-a", "wl").check(CHECK, CheckState::Pending).build(), ReleaseReason::QuotaReleased),
            (reserved().check(CHECK, CheckState::Rejected).deactivated().build(), ReleaseReason::Deactivated),
            (reserved().admitted().check(CHECK, CheckState::Ready).finished().build(), ReleaseReason::Finished),
            (reserved().check(CHECK, CheckState::Pending).with(|w| {
                w.metadata.deletion_timestamp = Some(Time(t(5)));
            }).build(), ReleaseReason::Deleted),
            (reserved().admitted().build(), ReleaseReason::CheckRemoved),
        ];
        for (wl, reason) in cases {
            let was_asked = Observed { asked: Some(asked), ..observed(&wl) };
            assert_eq!(next(&was_asked), Next { remember: None, release: Some(reason), forget_early: false, step: Step::Idle }, "{reason:?}");
            // Never asked (or released already): nothing.
            assert_eq!(next(&observed(&wl)), step(Step::Idle), "{reason:?}");
        }
    }

    row_readmitted_after_an_unseen_eviction_releases_then_asks: [
        "re-admitted after an eviction the runtime did not see",
        "any",
        "calls `release(Evicted)` first, then `decide`"
    ] => {
        let wl = reserved().check(CHECK, CheckState::Pending).eviction_count("Preempted", 1).build();
        let before = Observed { asked: Some(AskedAt { attempt: 1, evictions: 0 }), ..observed(&wl) };
        assert_eq!(
            next(&before),
            Next { remember: None, release: Some(ReleaseReason::Evicted), forget_early: false, step: Step::Ask { revalidating: false } }
        );
        // The same for work started early in another attempt.
        let early = reserved().eviction_count("Preempted", 1).build();
        let started = AskedAt { attempt: 1, evictions: 0 };
        let before = Observed {
            asked: Some(started),
            early: Some(EarlyStart { at: started, abandoned: false }),
            ..observed(&early)
        };
        // What this process remembers of that attempt's start is forgotten with it.
        assert_eq!(next(&before), Next { remember: None, release: Some(ReleaseReason::Evicted), forget_early: true, step: Step::StartEarly });
    }
}

/// The table under "When the check is called", as its rows' three cells.
fn documented_rows() -> Vec<[String; 3]> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/state-machine.md");
    let doc = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    let section = doc
        .split("## When the check is called")
        .nth(1)
        .expect("the section \"When the check is called\"");
    section
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2) // the header and its rule
        .map(|line| {
            let cells: Vec<String> = line
                .trim_matches('|')
                .split(" | ")
                .map(|c| c.split_whitespace().collect::<Vec<_>>().join(" "))
                .collect();
            cells
                .try_into()
                .unwrap_or_else(|c| panic!("a row of three cells: {c:?}"))
        })
        .collect()
}

#[test]
fn the_documented_table_is_the_tested_rows() {
    let tested: Vec<[String; 3]> = ROWS
        .iter()
        .map(|r| r.map(|c| c.split_whitespace().collect::<Vec<_>>().join(" ")))
        .collect();
    let documented = documented_rows();
    for (i, (doc, test)) in documented.iter().zip(&tested).enumerate() {
        assert_eq!(
            doc,
            test,
            "row {} of docs/state-machine.md differs from its test",
            i + 1
        );
    }
    assert_eq!(
        documented.len(),
        tested.len(),
        "docs/state-machine.md has {} rows, the tests {}",
        documented.len(),
        tested.len()
    );
}

/// A Workload whose CHECK entry shows `message` since `since`.
fn showing(message: &str, since: Timestamp) -> Workload {
    reserved()
        .check_entry(AdmissionCheckState {
            name: CHECK.into(),
            state: CheckState::Pending,
            last_transition_time: Some(Time(since)),
            message: message.into(),
            ..Default::default()
        })
        .build()
}

fn message(d: &Decision) -> &str {
    d.message()
}

#[test]
fn a_hold_starts_at_its_first_showing_and_its_deadline_never_moves() {
    // First seen at t(10): the hold starts now.
    let wl = reserved().check(CHECK, CheckState::Pending).build();
    let first = permanent_failure(&wl, CHECK, "bad", HOLD, t(10));
    assert!(
        message(&first).contains("keeps its quota until 2027-01-15T08:02:10Z"),
        "{first:?}"
    );
    // Shown on the entry since t(10): a restart at t(70) reads the start there.
    let shown = showing(message(&first), t(10));
    assert_eq!(hold_started(&shown, CHECK), Some(t(10)));
    let again = permanent_failure(&shown, CHECK, "bad", HOLD, t(70));
    assert_eq!(
        message(&again),
        message(&first),
        "the deadline does not move"
    );
    assert_eq!(
        again,
        Decision::pending_recheck_after(message(&first), Duration::from_secs(60))
    );
    // Over: Retry without delay.
    let over = permanent_failure(&shown, CHECK, "bad", HOLD, t(130));
    assert_eq!(over.state(), CheckState::Retry);
    assert!(message(&over).starts_with(PERMANENT_MARK), "{over:?}");
    // Another kind of hold on the same entry shares the bound.
    let refused = record_refused(
        CHECK,
        "later",
        "no patch",
        &Hold::on(&shown, CHECK, HOLD, t(100)),
    );
    assert!(refused.is_some_and(|d| d.message().contains("until 2027-01-15T08:02:10Z")));
    assert_eq!(
        record_refused(
            CHECK,
            "later",
            "no patch",
            &Hold::on(&shown, CHECK, HOLD, t(131))
        ),
        None
    );
    let unanswered = cannot_answer(&shown, CHECK, "inactive", HOLD, t(20));
    assert!(
        message(&unanswered).contains("until 2027-01-15T08:02:10Z"),
        "{unanswered:?}"
    );
}

#[test]
fn a_hold_of_an_earlier_reservation_or_a_message_without_the_mark_is_no_hold() {
    // Kueue leaves a Pending entry as it is on an eviction: a hold shown before the current
    // reservation (which began at t(0)) is another reservation's.
    let older = showing("x keeps its quota until 2027-01-15T07:59:00Z", t(-60));
    assert_eq!(hold_started(&older, CHECK), None);
    let fresh = permanent_failure(&older, CHECK, "bad", HOLD, t(10));
    assert!(
        message(&fresh).contains("until 2027-01-15T08:02:10Z"),
        "{fresh:?}"
    );
    // The check's own Pending, or a Ready entry, is no hold.
    assert_eq!(
        hold_started(&showing("waiting for budget", t(5)), CHECK),
        None
    );
    let ready = reserved().check(CHECK, CheckState::Ready).build();
    assert_eq!(hold_started(&ready, CHECK), None);
    // No quota: no hold.
    let released = WorkloadBuilder::new("team-a", "wl")
        .check_entry(AdmissionCheckState {
            name: CHECK.into(),
            state: CheckState::Pending,
            last_transition_time: Some(Time(t(5))),
            message: "keeps its quota until x".into(),
            ..Default::default()
        })
        .build();
    assert_eq!(hold_started(&released, CHECK), None);
}

#[test]
fn the_first_showing_of_a_hold_sets_the_entry_transition_time_later_ones_keep_it() {
    use crate::decide::{Plan, PlanInput, plan};
    let policy = crate::RetryPolicy::default();
    let input = |wl: &Workload, decision: Decision, now: Timestamp| {
        plan(PlanInput {
            workload: wl,
            check: CHECK,
            decision,
            attempt: 1,
            policy: &policy,
            max_retry_delay: crate::retry::MAX_DELAY,
            revalidate_ready: false,
            now,
            jitter_sample: 0.0,
        })
    };
    // Kueue's Pending since t(0); the hold is first shown at t(10).
    let wl = reserved().check(CHECK, CheckState::Pending).build();
    let Plan::Write(w) = input(
        &wl,
        permanent_failure(&wl, CHECK, "bad", HOLD, t(10)),
        t(10),
    ) else {
        panic!("a write");
    };
    assert_eq!(w.entry.last_transition_time, Some(Time(t(10))));
    // Shown: the next message of the same hold keeps the start.
    let shown = showing(&w.entry.message, t(10));
    let other = permanent_failure(&shown, CHECK, "worse", HOLD, t(30));
    let Plan::Write(w2) = input(&shown, other, t(30)) else {
        panic!("a write");
    };
    assert_eq!(w2.entry.last_transition_time, Some(Time(t(10))));
    // The same message again is no write.
    let same = permanent_failure(&shown, CHECK, "bad", HOLD, t(40));
    assert!(matches!(input(&shown, same, t(40)), Plan::Unchanged { .. }));
}

/// Which Workloads the line serves first: only a `Pending` entry on quota it may use waits for
/// the check's answer.
#[test]
fn only_a_pending_entry_on_usable_quota_awaits_the_answer() {
    let pending = reserved().check(CHECK, CheckState::Pending).build();
    assert!(awaits_answer(&pending, CHECK));
    assert!(!awaits_answer(&pending, "another"), "not its entry");
    let cases = [
        ("no entry yet (an early start)", reserved().build()),
        (
            "answered",
            reserved().check(CHECK, CheckState::Ready).build(),
        ),
        (
            "no quota",
            WorkloadBuilder::new("team-a", "wl")
                .check(CHECK, CheckState::Pending)
                .build(),
        ),
        (
            "evicted",
            reserved()
                .check(CHECK, CheckState::Pending)
                .evicted("Preempted")
                .build(),
        ),
        (
            "finished",
            reserved()
                .check(CHECK, CheckState::Pending)
                .finished()
                .build(),
        ),
        (
            "deactivated",
            reserved()
                .check(CHECK, CheckState::Pending)
                .deactivated()
                .build(),
        ),
    ];
    for (why, wl) in cases {
        assert!(!awaits_answer(&wl, CHECK), "{why}");
    }
}

/// Which Workloads the early starts' turns serve: quota held and usable, not admitted, no entry
/// yet, the queue is known to apply the check, and nothing started in this attempt.
#[test]
fn an_early_start_is_due_only_while_the_entry_is_missing_and_nothing_started() {
    let due = reserved().build();
    assert!(early_start_due(&due, CHECK, QueueRule::Applies, false));
    let cases = [
        (
            "started in this attempt",
            due.clone(),
            QueueRule::Applies,
            true,
        ),
        (
            "the queue does not apply it",
            due.clone(),
            QueueRule::DoesNotApply,
            false,
        ),
        (
            "the queues are not known yet",
            due.clone(),
            QueueRule::Unknown,
            false,
        ),
        (
            "the entry is there",
            reserved().check(CHECK, CheckState::Pending).build(),
            QueueRule::Applies,
            false,
        ),
        (
            "no quota",
            WorkloadBuilder::new("team-a", "wl").build(),
            QueueRule::Applies,
            false,
        ),
        (
            "admitted",
            reserved().admitted().build(),
            QueueRule::Applies,
            false,
        ),
        (
            "evicted",
            reserved().evicted("Preempted").build(),
            QueueRule::Applies,
            false,
        ),
    ];
    for (why, wl, rule, started) in cases {
        assert!(!early_start_due(&wl, CHECK, rule, started), "{why}");
    }
}

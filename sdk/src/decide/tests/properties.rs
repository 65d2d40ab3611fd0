//! The safety invariant of the decision layer, over arbitrary Workload states and decisions:
//! an entry is written only while the Workload holds quota, is active, not evicted, not
//! finished and the entry is Pending (or Ready under revalidation); a written entry never
//! carries Kueue's retryCount; a Retry always carries its delay and starts it now.

use proptest::prelude::*;

use super::*;
use crate::api::workload_condition as cond;

fn any_state() -> impl Strategy<Value = CheckState> {
    prop_oneof![
        Just(CheckState::Pending),
        Just(CheckState::Ready),
        Just(CheckState::Retry),
        Just(CheckState::Rejected)
    ]
}

fn any_decision() -> impl Strategy<Value = Decision> {
    let msg = "[a-z ]{0,20}";
    prop_oneof![
        msg.prop_map(Decision::ready),
        (msg, proptest::option::of(0u64..10_000)).prop_map(|(m, s)| match s {
            Some(s) => Decision::pending_recheck_after(m, Duration::from_secs(s)),
            None => Decision::pending(m),
        }),
        msg.prop_map(Decision::retry),
        (msg, 0u64..100_000).prop_map(|(m, s)| Decision::retry_after(m, Duration::from_secs(s))),
        msg.prop_map(Decision::rejected),
    ]
}

#[derive(Debug, Clone)]
struct Situation {
    quota: bool,
    evicted: bool,
    finished: bool,
    inactive: bool,
    deleting: bool,
    entry: Option<CheckState>,
    retry_count: Option<i32>,
    revalidate: bool,
}

fn any_situation() -> impl Strategy<Value = Situation> {
    (
        any::<[bool; 6]>(),
        proptest::option::of(any_state()),
        proptest::option::of(0i32..10),
    )
        .prop_map(
            |([quota, evicted, finished, inactive, deleting, revalidate], entry, retry_count)| {
                Situation {
                    quota,
                    evicted,
                    finished,
                    inactive,
                    deleting,
                    entry,
                    retry_count,
                    revalidate,
                }
            },
        )
}

proptest! {
    #[test]
    fn writes_happen_only_inside_a_reservation(s in any_situation(), decision in any_decision(), u in 0.0f64..1.0) {
        let now = now();
        let mut b = WorkloadBuilder::new("ns", "wl").pod_set("main", 1, "1");
        if let Some(state) = s.entry {
            b = b.check(CHECK, state);
            if let Some(n) = s.retry_count { b = b.retry_count(CHECK, n); }
        }
        if s.quota { b = b.quota_reserved("cq", "f"); }
        if s.evicted { b = b.evicted("Preempted"); }
        if s.finished { b = b.finished(); }
        if s.inactive { b = b.deactivated(); }
        let mut wl = b.build();
        if s.deleting { wl.metadata.deletion_timestamp = Some(Time(now)); }

        let policy = RetryPolicy::default();
        let result = plan(PlanInput {
            revalidate_ready: s.revalidate, jitter_sample: u, ..input(&wl, decision, &policy)
        });
        if let Plan::Write(w) = result {
            prop_assert!(wl.condition_is_true(cond::QUOTA_RESERVED));
            prop_assert!(!s.evicted && !s.finished && !s.inactive && !s.deleting);
            prop_assert!(s.entry == Some(CheckState::Pending) || (s.revalidate && s.entry == Some(CheckState::Ready)));
            prop_assert_eq!(w.entry.retry_count, None);
            prop_assert_eq!(w.entry.name.as_str(), CHECK);
            if w.entry.state == CheckState::Retry {
                prop_assert!(w.entry.requeue_after_seconds.is_some());
                prop_assert_eq!(w.entry.last_transition_time, Some(Time(now)));
            }
        }
    }
}

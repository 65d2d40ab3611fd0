//! Properties of retry delays over arbitrary inputs, valid or not.

use std::time::Duration;

use kueue_admission_sdk::retry::{
    Backoff, ExponentialBackoff, MAX_DELAY, RetryPolicy, requeue_after_seconds,
};
use proptest::prelude::*;

fn any_duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        (0u64..100_000).prop_map(Duration::from_millis),
        (0u64..=u64::MAX).prop_map(Duration::from_secs),
    ]
}

fn any_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        any::<f64>(),
        -10.0f64..10.0,
        Just(f64::NAN),
        Just(f64::INFINITY)
    ]
}

fn any_policy() -> impl Strategy<Value = RetryPolicy> {
    let exp = (any_duration(), any_f64(), any_duration(), any_f64()).prop_map(
        |(base, factor, max, jitter)| {
            Backoff::Exponential(ExponentialBackoff {
                base,
                factor,
                max,
                jitter,
            })
        },
    );
    let backoff = prop_oneof![
        Just(Backoff::Immediate),
        any_duration().prop_map(Backoff::Fixed),
        exp
    ];
    (backoff, proptest::option::of(any::<u32>())).prop_map(|(backoff, retry_limit)| RetryPolicy {
        backoff,
        retry_limit,
    })
}

fn valid_exponential() -> impl Strategy<Value = RetryPolicy> {
    (1u64..10_000, 1.0f64..10.0, 0u64..1_000_000, 0.0f64..=1.0).prop_map(
        |(base, factor, extra, jitter)| {
            RetryPolicy::exponential(
                Duration::from_secs(base),
                factor,
                Duration::from_secs(base + extra),
                jitter,
            )
        },
    )
}

proptest! {
    /// Whatever a user configures, computing a delay neither panics nor exceeds what Kueue can
    /// carry, and it always converts to a valid requeueAfterSeconds.
    #[test]
    fn delay_is_total_and_bounded(policy in any_policy(), attempt in any::<u32>(), u in any_f64()) {
        let d = policy.delay(attempt, u);
        prop_assert!(d <= MAX_DELAY);
        if let Some(secs) = requeue_after_seconds(d) {
            prop_assert!(secs >= 1);
        }
    }

    /// A valid exponential policy never shortens the wait as attempts grow, starts at the base
    /// and never passes max.
    #[test]
    fn valid_exponential_is_monotone_and_within_bounds(policy in valid_exponential(), attempt in 1u32..200, u in 0.0f64..1.0) {
        prop_assert!(policy.validate().is_ok());
        let Backoff::Exponential(e) = &policy.backoff else { unreachable!() };
        let now = policy.delay(attempt, u);
        let next = policy.delay(attempt + 1, u);
        prop_assert!(next >= now, "attempt {attempt}: {now:?} then {next:?}");
        prop_assert!(now >= e.base.min(e.max));
        prop_assert!(now <= e.max);
    }

    /// Rounding to Kueue's whole seconds never shortens a delay.
    #[test]
    fn requeue_after_never_shortens(ms in 0u64..10_000_000) {
        let d = Duration::from_millis(ms);
        let secs = requeue_after_seconds(d).unwrap_or(0);
        prop_assert!(Duration::from_secs(secs as u64) >= d);
        prop_assert!(Duration::from_secs(secs as u64) < d + Duration::from_secs(1));
    }
}

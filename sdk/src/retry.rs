//! Retry delays: Kueue's own backoff formula, generalised, and the attempt limit.
//!
//! Kueue counts retries itself: every eviction of a Workload whose entry said `Retry` turns the
//! entry back to `Pending` with `retryCount` one higher. The attempt a check is deciding is
//! therefore `retryCount + 1` (1 for the first). A check answers `Retry` with
//! `requeueAfterSeconds`, and Kueue requeues the Workload no earlier than the entry's
//! `lastTransitionTime` plus that many seconds.
//!
//! Everything here is pure: the runtime passes in the random sample used for jitter, so a delay
//! can be tested exactly.

use std::fmt;
use std::time::Duration;

/// The longest delay Kueue can carry: `requeueAfterSeconds` is an `int32` of seconds (~68 years).
pub const MAX_DELAY: Duration = Duration::from_secs(i32::MAX as u64);

/// The default ceiling of any retry delay the runtime writes (see
/// [`crate::RuntimeConfig::max_retry_delay`]): a day. Kueue keeps a Workload's quota for the
/// whole delay of a `Retry`, so a delay of years (an absurd configuration) would hold it for
/// years.
pub const DEFAULT_MAX_RETRY_DELAY: Duration = Duration::from_secs(24 * 3600);

/// A duration in the largest whole unit that fits, for messages: `90s`, `2m30s`, `24h`, `68y`.
pub fn human(d: Duration) -> String {
    let secs = d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0));
    let (h, m, s) = (secs / 3600, secs % 3600 / 60, secs % 60);
    let with = |big: u64, unit: &str, small: u64, small_unit: &str| {
        if small == 0 {
            format!("{big}{unit}")
        } else {
            format!("{big}{unit}{small}{small_unit}")
        }
    };
    match secs {
        s if s >= 365 * 86_400 => format!("{}y", s / (365 * 86_400)),
        s if s >= 2 * 86_400 => format!("{}d", s / 86_400),
        s if s >= 3600 => with(h, "h", m, "m"),
        s if s >= 60 => with(secs / 60, "m", s % 60, "s"),
        _ => format!("{s}s"),
    }
}

/// A policy in a few words, for messages: `exponential from 60s, doubling, at most 30m, 3
/// retries`.
pub fn describe(policy: &RetryPolicy) -> String {
    let backoff = match &policy.backoff {
        Backoff::Immediate => "no delay".to_string(),
        Backoff::Fixed(d) => format!("{} between attempts", human(*d)),
        Backoff::Exponential(e) => format!(
            "exponential from {}, factor {}, at most {}",
            human(e.base),
            e.factor,
            human(e.max)
        ),
    };
    match policy.retry_limit {
        Some(limit) => format!("{backoff}, {limit} retries"),
        None => format!("{backoff}, no retry limit"),
    }
}

/// When and how often a check may answer `Retry`.
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    /// How long Kueue waits before trying again.
    pub backoff: Backoff,
    /// How many `Retry` answers a Workload may get from this check; a `Retry` beyond that becomes
    /// `Rejected`. Same meaning as Kueue's `backoffLimitCount`: with a limit of 3, attempts 1
    /// to 3 may retry and a retry on attempt 4 rejects. `None` retries forever.
    pub retry_limit: Option<u32>,
}

/// The delay before the next attempt.
#[derive(Clone, Debug, PartialEq)]
pub enum Backoff {
    /// Retry as soon as Kueue can (no `requeueAfterSeconds`).
    Immediate,
    /// The same delay before every attempt.
    Fixed(Duration),
    /// A delay growing with each attempt.
    Exponential(ExponentialBackoff),
}

/// `min(base · factor^(attempt−1) · (1 + jitter·u), max)` with `u` uniform in `[0, 1)`.
///
/// With `factor` 2 and no jitter this is Kueue's formula for ProvisioningRequest retries,
/// `min(base · 2^(n−1), max)`. The cap applies after the jitter, so `max` is a true maximum.
#[derive(Clone, Debug, PartialEq)]
pub struct ExponentialBackoff {
    /// Delay before the second attempt (after the first `Retry`).
    pub base: Duration,
    /// Growth per attempt, at least 1.
    pub factor: f64,
    /// Upper bound of any delay.
    pub max: Duration,
    /// Fraction of random extra delay, from 0 (none) to 1 (up to double), so that Workloads
    /// that failed together do not all come back at the same second.
    pub jitter: f64,
}

impl ExponentialBackoff {
    /// Kueue's defaults for ProvisioningRequest retries: 60 s, doubling, at most 1800 s, and
    /// the tiny jitter Kueue adds (0.0001).
    pub fn kueue_default() -> Self {
        Self {
            base: Duration::from_secs(60),
            factor: 2.0,
            max: Duration::from_secs(1800),
            jitter: 0.0001,
        }
    }
}

impl Default for RetryPolicy {
    /// Kueue's defaults: exponential from 60 s to 1800 s, at most 3 retries.
    fn default() -> Self {
        Self {
            backoff: Backoff::Exponential(ExponentialBackoff::kueue_default()),
            retry_limit: Some(3),
        }
    }
}

/// Why a [`RetryPolicy`] cannot be used. The message names the field and the accepted range.
#[derive(Clone, Debug, PartialEq)]
pub struct InvalidRetryPolicy(String);

impl fmt::Display for InvalidRetryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid retry policy: {}", self.0)
    }
}

impl std::error::Error for InvalidRetryPolicy {}

impl RetryPolicy {
    /// Retry at once, forever.
    pub fn immediate() -> Self {
        Self {
            backoff: Backoff::Immediate,
            retry_limit: None,
        }
    }

    /// A fixed delay, forever.
    pub fn fixed(delay: Duration) -> Self {
        Self {
            backoff: Backoff::Fixed(delay),
            retry_limit: None,
        }
    }

    /// Exponential backoff without an attempt limit; see [`ExponentialBackoff`].
    pub fn exponential(base: Duration, factor: f64, max: Duration, jitter: f64) -> Self {
        Self {
            backoff: Backoff::Exponential(ExponentialBackoff {
                base,
                factor,
                max,
                jitter,
            }),
            retry_limit: None,
        }
    }

    /// The runtime's own backoff after a failure: 1 s doubling up to `max`, each delay up to
    /// 20 % longer so that many things failing together (an API outage) do not retry in step.
    pub(crate) fn runtime_backoff(max: Duration) -> Self {
        Self::exponential(Duration::from_secs(1), 2.0, max, 0.2)
    }

    /// The same policy, answering `Rejected` instead of a `Retry` once `limit` retries were made.
    pub fn with_retry_limit(mut self, limit: u32) -> Self {
        self.retry_limit = Some(limit);
        self
    }

    /// Checks that every delay the policy can produce fits Kueue's `int32` seconds and that the
    /// numbers make sense. A policy from user input (flags, a parameters object) must pass this
    /// before use; [`RetryPolicy::delay`] stays safe (clamped) even for one that does not.
    pub fn validate(&self) -> Result<(), InvalidRetryPolicy> {
        let bad = |msg: String| Err(InvalidRetryPolicy(msg));
        match &self.backoff {
            Backoff::Immediate => Ok(()),
            Backoff::Fixed(d) if *d > MAX_DELAY => bad(format!(
                "fixed delay {}s is longer than the {}s Kueue can carry",
                d.as_secs(),
                MAX_DELAY.as_secs()
            )),
            Backoff::Fixed(_) => Ok(()),
            Backoff::Exponential(e) => {
                if e.base.is_zero() {
                    return bad(
                        "exponential base must be above zero (use Backoff::Immediate for no delay)"
                            .into(),
                    );
                }
                if !e.factor.is_finite() || e.factor < 1.0 {
                    return bad(format!(
                        "exponential factor must be a finite number of at least 1, not {}",
                        e.factor
                    ));
                }
                if !e.jitter.is_finite() || !(0.0..=1.0).contains(&e.jitter) {
                    return bad(format!("jitter must be between 0 and 1, not {}", e.jitter));
                }
                if e.max < e.base {
                    return bad(format!(
                        "max delay {}s is below the base delay {}s",
                        e.max.as_secs(),
                        e.base.as_secs()
                    ));
                }
                if e.max > MAX_DELAY {
                    return bad(format!(
                        "max delay {}s is longer than the {}s Kueue can carry",
                        e.max.as_secs(),
                        MAX_DELAY.as_secs()
                    ));
                }
                Ok(())
            }
        }
    }

    /// The longest delay this policy can produce before its retry limit (with the largest
    /// jitter): what a ceiling must be compared with.
    pub fn longest_delay(&self) -> Duration {
        let last = self.retry_limit.unwrap_or(u32::MAX).max(1);
        self.delay(last, 1.0 - f64::EPSILON)
    }

    /// Whether a `Retry` on this attempt (1-based) is beyond the limit and must become `Rejected`.
    pub fn exhausted(&self, attempt: u32) -> bool {
        self.retry_limit.is_some_and(|limit| attempt > limit)
    }

    /// The delay after a `Retry` on `attempt` (1-based), given a sample `u` in `[0, 1)` for the
    /// jitter. Never longer than [`MAX_DELAY`], whatever the policy.
    pub fn delay(&self, attempt: u32, jitter_sample: f64) -> Duration {
        match &self.backoff {
            Backoff::Immediate => Duration::ZERO,
            Backoff::Fixed(d) => (*d).min(MAX_DELAY),
            Backoff::Exponential(e) => {
                let exponent = attempt.saturating_sub(1).min(i32::MAX as u32) as i32;
                let growth = if e.factor.is_finite() {
                    e.factor.max(1.0).powi(exponent)
                } else {
                    f64::INFINITY
                };
                let u = if jitter_sample.is_finite() {
                    jitter_sample.clamp(0.0, 1.0)
                } else {
                    0.0
                };
                let jitter = if e.jitter.is_finite() {
                    e.jitter.clamp(0.0, 1.0)
                } else {
                    0.0
                };
                let secs = e.base.as_secs_f64() * growth * (1.0 + jitter * u);
                let cap = e.max.min(MAX_DELAY).as_secs_f64();
                // NaN (0 · ∞) only when base is zero: no delay.
                let secs = if secs.is_nan() { 0.0 } else { secs.min(cap) };
                Duration::from_secs_f64(secs)
            }
        }
    }
}

/// A delay as Kueue's `requeueAfterSeconds`: whole seconds, rounded up (a check asking for 1.5 s
/// must not be retried after 1 s), at most `i32::MAX`. `None` for no delay.
pub fn requeue_after_seconds(delay: Duration) -> Option<i32> {
    if delay.is_zero() {
        return None;
    }
    let secs = delay.as_secs() + u64::from(delay.subsec_nanos() > 0);
    Some(i32::try_from(secs).unwrap_or(i32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn kueue_defaults_give_60_120_240_then_reject() {
        let policy = RetryPolicy::default();
        let delays: Vec<u64> = (1..=3).map(|n| policy.delay(n, 0.0).as_secs()).collect();
        assert_eq!(delays, [60, 120, 240]);
        assert!(!policy.exhausted(3));
        assert!(policy.exhausted(4));
        assert_eq!(policy.validate(), Ok(()));
    }

    #[test]
    fn exponential_is_capped_by_max_after_jitter() {
        let policy = RetryPolicy::exponential(S(10), 3.0, S(100), 1.0);
        assert_eq!(policy.delay(1, 0.0), S(10));
        assert_eq!(policy.delay(1, 0.5), S(15));
        assert_eq!(policy.delay(2, 0.0), S(30));
        assert_eq!(policy.delay(3, 0.0), S(90));
        assert_eq!(
            policy.delay(3, 0.99),
            S(100),
            "jitter may not push past max"
        );
        assert_eq!(policy.delay(4, 0.0), S(100));
        assert_eq!(
            policy.delay(u32::MAX, 0.0),
            S(100),
            "huge attempts do not overflow"
        );
    }

    #[test]
    fn fixed_and_immediate() {
        assert_eq!(RetryPolicy::fixed(S(7)).delay(1, 0.9), S(7));
        assert_eq!(RetryPolicy::fixed(S(7)).delay(50, 0.9), S(7));
        assert_eq!(RetryPolicy::immediate().delay(3, 0.5), Duration::ZERO);
        assert!(
            !RetryPolicy::immediate().exhausted(u32::MAX),
            "no limit means never exhausted"
        );
        assert!(
            RetryPolicy::immediate().with_retry_limit(0).exhausted(1),
            "limit 0 rejects the first retry"
        );
    }

    #[test]
    fn absurd_policies_are_refused_with_the_reason() {
        let cases = [
            (
                RetryPolicy::fixed(Duration::from_secs(u64::MAX)),
                "longer than",
            ),
            (
                RetryPolicy::exponential(Duration::ZERO, 2.0, S(10), 0.0),
                "above zero",
            ),
            (RetryPolicy::exponential(S(1), 0.5, S(10), 0.0), "factor"),
            (
                RetryPolicy::exponential(S(1), f64::NAN, S(10), 0.0),
                "factor",
            ),
            (RetryPolicy::exponential(S(1), 2.0, S(10), -0.1), "jitter"),
            (
                RetryPolicy::exponential(S(1), 2.0, S(10), f64::INFINITY),
                "jitter",
            ),
            (
                RetryPolicy::exponential(S(60), 2.0, S(10), 0.0),
                "below the base",
            ),
            (
                RetryPolicy::exponential(S(1), 2.0, Duration::from_secs(u64::MAX), 0.0),
                "longer than",
            ),
        ];
        for (policy, needle) in cases {
            let err = policy.validate().expect_err("must be refused").to_string();
            assert!(err.contains(needle), "{policy:?}: {err}");
        }
    }

    #[test]
    fn longest_delay_stops_at_the_retry_limit() {
        assert_eq!(RetryPolicy::default().longest_delay().as_secs(), 240);
        assert_eq!(
            RetryPolicy::exponential(S(60), 2.0, S(1800), 0.0).longest_delay(),
            S(1800),
            "without a limit the cap is reached"
        );
        assert_eq!(RetryPolicy::immediate().longest_delay(), Duration::ZERO);
        assert_eq!(RetryPolicy::fixed(S(9)).longest_delay(), S(9));
    }

    #[test]
    fn human_durations() {
        assert_eq!(human(Duration::ZERO), "0s");
        assert_eq!(human(S(90)), "1m30s");
        assert_eq!(human(S(24 * 3600)), "24h");
        assert_eq!(human(S(3 * 86_400 + 5)), "3d");
        assert_eq!(human(MAX_DELAY), "68y");
        assert_eq!(human(Duration::from_millis(1500)), "2s");
        assert!(human(Duration::MAX).ends_with('y'), "no overflow");
    }

    #[test]
    fn requeue_after_rounds_up_and_clamps() {
        assert_eq!(requeue_after_seconds(Duration::ZERO), None);
        assert_eq!(requeue_after_seconds(Duration::from_millis(1)), Some(1));
        assert_eq!(requeue_after_seconds(Duration::from_millis(1500)), Some(2));
        assert_eq!(requeue_after_seconds(S(60)), Some(60));
        assert_eq!(
            requeue_after_seconds(Duration::from_secs(u64::MAX)),
            Some(i32::MAX)
        );
    }
}

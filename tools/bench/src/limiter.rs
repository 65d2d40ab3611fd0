//! Pure: how close a client came to its client-side limit (a token bucket of `qps` and
//! `burst`, as client-go's and ours are), from when the API server received its requests.
//!
//! Over a window of `T` seconds such a client can send at most `burst + qps · T` requests. A
//! client that sent nearly that many, at about `qps` in most seconds, was held by its limiter:
//! its run lasted as long as draining the bucket takes, whatever else it could have done.

/// What a client sent over a window, against its limiter.
#[derive(Clone, Debug, PartialEq)]
pub struct LimiterUse {
    /// Requests received in the window.
    pub sent: usize,
    /// The most the limiter allows in the window: `burst + qps · seconds`.
    pub allowed: f64,
    /// The window, in seconds.
    pub seconds: f64,
    /// The most requests received in one whole second of the window.
    pub busiest_second: usize,
    /// Whole seconds of the window in which it sent at least 95 % of `qps`.
    pub seconds_near_qps: usize,
    /// Whole seconds in the window.
    pub whole_seconds: usize,
}

impl LimiterUse {
    /// `sent` as a share of `allowed` (0 to 1, more only if the limit was not what was
    /// assumed).
    pub fn share(&self) -> f64 {
        if self.allowed <= 0.0 {
            return 0.0;
        }
        self.sent as f64 / self.allowed
    }
}

/// The use of a limiter of `qps` and `burst` by requests received at `received` (seconds from
/// the window's start; those outside `0..seconds` are not counted).
pub fn limiter_use(received: &[f64], seconds: f64, qps: f64, burst: f64) -> LimiterUse {
    let inside: Vec<f64> = received
        .iter()
        .copied()
        .filter(|t| *t >= 0.0 && *t < seconds)
        .collect();
    let whole_seconds = seconds.max(0.0).floor() as usize;
    let mut per_second = vec![0usize; whole_seconds];
    for t in &inside {
        if let Some(slot) = per_second.get_mut(t.floor() as usize) {
            *slot += 1;
        }
    }
    LimiterUse {
        sent: inside.len(),
        allowed: burst + qps * seconds.max(0.0),
        seconds,
        busiest_second: per_second.iter().copied().max().unwrap_or(0),
        seconds_near_qps: per_second
            .iter()
            .filter(|n| **n as f64 >= 0.95 * qps)
            .count(),
        whole_seconds,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_draining_its_bucket_uses_nearly_all_it_is_allowed() {
        // A burst of 500 in the first second, then 300 a second for 9 seconds: the most a
        // 300/500 limiter lets through in 10 s is 3,500.
        let mut received: Vec<f64> = (0..500).map(|i| f64::from(i) / 500.0).collect();
        for s in 1..10 {
            received.extend((0..300).map(|i| f64::from(s) + f64::from(i) / 300.0));
        }
        let used = limiter_use(&received, 10.0, 300.0, 500.0);
        assert_eq!(used.sent, 3200);
        assert_eq!(used.allowed, 3500.0);
        assert!((used.share() - 3200.0 / 3500.0).abs() < 1e-12);
        assert_eq!(used.busiest_second, 500);
        assert_eq!((used.seconds_near_qps, used.whole_seconds), (10, 10));
    }

    #[test]
    fn a_client_with_room_to_spare_is_told_apart() {
        let received: Vec<f64> = (0..100).map(|i| f64::from(i) / 10.0).collect();
        let used = limiter_use(&received, 10.0, 300.0, 500.0);
        assert_eq!(
            (used.sent, used.busiest_second, used.seconds_near_qps),
            (100, 10, 0)
        );
        assert!(used.share() < 0.03);
        // Outside the window: not counted.
        let outside = limiter_use(&[-1.0, 10.0, 11.0], 10.0, 300.0, 500.0);
        assert_eq!(outside.sent, 0);
    }
}

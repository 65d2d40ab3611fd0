//! A check's attempt number for a Workload, kept on the Workload so that it never goes back.
//!
//! Kueue's `retryCount` is not an attempt counter a check can rely on: on every eviction Kueue
//! increments it only on entries that say `Retry` at that moment, and **drops** it from entries
//! that say `Ready` or `Rejected` (`resetChecksOnEviction`, v0.15 to v0.19). With two checks on
//! one ClusterQueue, check B's `Retry` wipes the count of check A if A was `Ready`: A's backoff
//! and retry limit would start over, and two checks retrying in turn could evict a Workload
//! forever.
//!
//! So each check counts its own `Retry` decisions in an annotation on the Workload, one key per
//! check, written by the check's own field manager **before** the `Retry` itself (with the same
//! `resourceVersion` precondition), so that no `Retry` can land uncounted. The value records how
//! many retries were counted and at which eviction count (`status.schedulingStats.evictions`,
//! which Kueue increments in the same write that resets the entries): a second `Retry` decided
//! for the same attempt (a conflict, a restart between the two writes) is not counted twice.
//!
//! The attempt a check decides is `retries + 1`, or `retries` while the last counted `Retry`
//! belongs to the current attempt; never less than Kueue's `retryCount + 1`, so Workloads that
//! retried before this annotation existed keep their count. Everything here is pure.

use std::fmt;

use kube::ResourceExt;
use sha2::{Digest, Sha256};

use crate::api::Workload;

/// The annotation prefix (a DNS subdomain) of the per-check attempt records.
pub const ANNOTATION_PREFIX: &str = "attempts.kueue-admission-checks.dev";

/// The longest name part of an annotation key Kubernetes accepts.
const MAX_NAME_PART: usize = 63;

/// The annotation key holding `check`'s attempt record: `<prefix>/<check>`, or, for a check
/// name longer than an annotation name may be, the start of the name and a stable hash of it.
pub fn annotation_key(check: &str) -> String {
    if check.len() <= MAX_NAME_PART && is_name_part(check) {
        return format!("{ANNOTATION_PREFIX}/{check}");
    }
    let digest = Sha256::digest(check.as_bytes());
    let hash: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    // Keep a readable start: letters and digits, then `-` or `.` only between them.
    let keep = MAX_NAME_PART - hash.len() - 1;
    let mut start: String = check
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .take(keep)
        .collect();
    while start.ends_with(['-', '.']) {
        start.pop();
    }
    let start = start.trim_start_matches(['-', '.']);
    if start.is_empty() {
        format!("{ANNOTATION_PREFIX}/{hash}")
    } else {
        format!("{ANNOTATION_PREFIX}/{start}-{hash}")
    }
}

/// Whether `s` is a valid name part of an annotation key (without the length limit).
fn is_name_part(s: &str) -> bool {
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    let (Some(first), Some(last)) = (s.chars().next(), s.chars().last()) else {
        return false;
    };
    first.is_ascii_alphanumeric() && last.is_ascii_alphanumeric() && s.chars().all(ok)
}

/// What a check has counted for one Workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttemptRecord {
    /// How many `Retry` decisions of the check were counted.
    pub retries: u32,
    /// The Workload's eviction count when the last one was counted; `None` for a record taken
    /// over from Kueue's `retryCount` (no `Retry` of the current attempt counted yet).
    pub evictions: Option<i32>,
}

impl AttemptRecord {
    /// Reads an annotation value: `retries=N` or `retries=N,evictions=E`.
    pub fn parse(value: &str) -> Option<Self> {
        let mut retries = None;
        let mut evictions = None;
        for part in value.split(',') {
            let (key, val) = part.trim().split_once('=')?;
            match key.trim() {
                "retries" => retries = Some(val.trim().parse().ok()?),
                "evictions" => evictions = Some(val.trim().parse().ok()?),
                _ => return None,
            }
        }
        Some(Self {
            retries: retries?,
            evictions,
        })
    }

    /// The attempt being decided for a Workload now evicted `evictions` times.
    pub fn attempt_at(&self, evictions: i32) -> u32 {
        if self.evictions == Some(evictions) {
            self.retries.max(1)
        } else {
            self.retries.saturating_add(1)
        }
    }
}

impl fmt::Display for AttemptRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "retries={}", self.retries)?;
        if let Some(e) = self.evictions {
            write!(f, ",evictions={e}")?;
        }
        Ok(())
    }
}

/// The record on the Workload for `check`, if there is a readable one.
pub fn record(wl: &Workload, check: &str) -> Option<AttemptRecord> {
    wl.annotations()
        .get(&annotation_key(check))
        .and_then(|v| AttemptRecord::parse(v))
}

/// Kueue's idea of the attempt: `retryCount + 1`.
fn kueue_attempt(wl: &Workload, check: &str) -> u32 {
    let count = wl
        .admission_check(check)
        .and_then(|e| e.retry_count)
        .unwrap_or(0);
    u32::try_from(count).unwrap_or(0).saturating_add(1)
}

/// The attempt `check` is deciding for `wl` (1 for the first): counted from the check's own
/// record, never below Kueue's `retryCount + 1`.
pub fn attempt(wl: &Workload, check: &str) -> u32 {
    let recorded = record(wl, check).map_or(1, |r| r.attempt_at(wl.total_evictions()));
    recorded.max(kueue_attempt(wl, check))
}

/// The record to write before a status write of `check` for attempt `attempt`, or `None` when
/// the Workload already carries it.
///
/// - `retry`: the write is a `Retry`: it is counted as retry number `attempt` (at least one
///   more than the record holds for an earlier attempt), at the current eviction count.
/// - otherwise the record catches up with Kueue's `retryCount` when that is ahead (a Workload
///   that retried before the record existed), so that a later reset of `retryCount` cannot take
///   the attempt back; and a `Retry` counted for the current attempt that never landed (the
///   entry is decidable again at the same eviction count) is taken back. The attempt being
///   decided never changes by either.
pub fn record_to_write(
    wl: &Workload,
    check: &str,
    attempt: u32,
    retry: bool,
) -> Option<AttemptRecord> {
    let current = record(wl, check);
    let evictions = wl.total_evictions();
    let wanted = if retry {
        AttemptRecord {
            retries: attempt.max(current.map_or(0, |c| c.retries)),
            evictions: Some(evictions),
        }
    } else {
        // A Retry counted for this very attempt whose entry write never landed (the entry would
        // say `Retry` until Kueue evicts, which moves the eviction count): not a retry after
        // all. Taking it back leaves the attempt being decided as it is.
        let base = match current {
            Some(c) if c.evictions == Some(evictions) => Some(AttemptRecord {
                retries: c.retries.saturating_sub(1),
                evictions: None,
            }),
            other => other,
        };
        let recorded = base.map_or(1, |r| r.attempt_at(evictions));
        let kueue = kueue_attempt(wl, check);
        if kueue > recorded {
            AttemptRecord {
                retries: kueue - 1,
                evictions: None,
            }
        } else {
            base?
        }
    };
    (current != Some(wanted)).then_some(wanted)
}

/// The body of the JSON merge patch that writes `record` for `check` on the Workload's
/// metadata, with the `resourceVersion` precondition of the read the decision was made on.
/// `None` if the Workload has no `resourceVersion` (it was not read from the API server).
///
/// A merge patch, not a server-side apply: an apply to a Workload deleted since the read
/// *creates* one (the API server does not hold an apply to its `resourceVersion` when the object
/// is gone), made of nothing but this annotation. The chaos soak found such a Workload, without
/// `spec`, which Kueue accepted and which then failed every typed list of Workloads in the
/// cluster. A merge patch of a deleted Workload is a 404.
pub fn annotation_patch(
    wl: &Workload,
    check: &str,
    record: AttemptRecord,
) -> Option<serde_json::Value> {
    let resource_version = wl.resource_version()?;
    Some(serde_json::json!({
        "metadata": {
            "resourceVersion": resource_version,
            "annotations": { annotation_key(check): record.to_string() },
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::CheckState;
    use crate::testing::WorkloadBuilder;

    fn with_record(b: WorkloadBuilder, value: &str) -> WorkloadBuilder {
        b.annotation(&annotation_key("a"), value)
    }

    /// A [`deciding`] Workload with attempt record `value` for check `a`, evicted `evictions`
    /// times by checks' Retries.
    fn recorded(value: &str, evictions: i32) -> Workload {
        with_record(deciding(), value)
            .eviction_count("AdmissionCheck", evictions)
            .build()
    }

    fn deciding() -> WorkloadBuilder {
        WorkloadBuilder::new("ns", "wl")
            .pod_set("main", 1, "1")
            .check("a", CheckState::Pending)
            .quota_reserved("cq", "flavor")
    }

    #[test]
    fn keys_are_valid_bounded_and_distinct() {
        assert_eq!(
            annotation_key("budget"),
            "attempts.kueue-admission-checks.dev/budget"
        );
        let long_a = format!("{}a", "x".repeat(252));
        let long_b = format!("{}b", "x".repeat(252));
        for check in [long_a.as_str(), long_b.as_str(), "-.-", "a_b", "UPPER.case"] {
            let key = annotation_key(check);
            let name = key.split_once('/').map(|(_, n)| n).unwrap_or_default();
            assert!(name.len() <= MAX_NAME_PART, "{key}");
            assert!(is_name_part(name), "{key}");
        }
        assert_ne!(annotation_key(&long_a), annotation_key(&long_b));
        assert_eq!(annotation_key(&long_a), annotation_key(&long_a), "stable");
    }

    #[test]
    fn records_round_trip_and_bad_values_are_ignored() {
        for r in [
            AttemptRecord {
                retries: 3,
                evictions: Some(7),
            },
            AttemptRecord {
                retries: 0,
                evictions: None,
            },
        ] {
            assert_eq!(AttemptRecord::parse(&r.to_string()), Some(r));
        }
        for bad in ["", "3", "retries=x", "retries=1,what=2", "evictions=2"] {
            assert_eq!(AttemptRecord::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn without_a_record_kueues_retry_count_is_the_attempt() {
        assert_eq!(attempt(&deciding().build(), "a"), 1);
        assert_eq!(attempt(&deciding().retry_count("a", 2).build(), "a"), 3);
    }

    #[test]
    fn a_reset_retry_count_does_not_take_the_attempt_back() {
        // Two retries counted; another check's eviction dropped Kueue's count.
        let wl = recorded("retries=2,evictions=3", 5);
        assert_eq!(attempt(&wl, "a"), 3);
    }

    #[test]
    fn a_retry_of_the_current_attempt_is_counted_once() {
        let wl = recorded("retries=2,evictions=4", 4);
        assert_eq!(attempt(&wl, "a"), 2, "the counted Retry is this attempt's");
        assert_eq!(record_to_write(&wl, "a", 2, true), None, "already counted");
    }

    #[test]
    fn a_retry_is_recorded_at_the_current_eviction_count() {
        let wl = recorded("retries=1,evictions=0", 2);
        assert_eq!(attempt(&wl, "a"), 2);
        assert_eq!(
            record_to_write(&wl, "a", 2, true),
            Some(AttemptRecord {
                retries: 2,
                evictions: Some(2)
            })
        );
        assert_eq!(record_to_write(&wl, "a", 2, false), None);
    }

    #[test]
    fn a_counted_retry_that_never_landed_is_taken_back_without_moving_the_attempt() {
        // The record of a Retry landed at eviction count 2, its entry write did not: the entry
        // is still Pending at 2, and the check now answers Ready.
        let wl = recorded("retries=2,evictions=2", 2);
        assert_eq!(attempt(&wl, "a"), 2);
        let back = record_to_write(&wl, "a", 2, false).expect("taken back");
        assert_eq!(
            back,
            AttemptRecord {
                retries: 1,
                evictions: None
            }
        );
        let after = recorded(&back.to_string(), 2);
        assert_eq!(attempt(&after, "a"), 2, "the attempt decided stays");
        let later = recorded(&back.to_string(), 3);
        assert_eq!(
            attempt(&later, "a"),
            2,
            "and the next eviction does not count it"
        );
    }

    #[test]
    fn a_record_catches_up_with_a_retry_count_from_before_it_existed() {
        let wl = deciding().retry_count("a", 2).build();
        let caught_up = record_to_write(&wl, "a", 3, false).expect("a catch-up");
        assert_eq!(caught_up.attempt_at(wl.total_evictions()), 3);
        // Once written, a reset of retryCount keeps attempt 3.
        let after_reset = with_record(deciding(), &caught_up.to_string())
            .eviction_count("Preempted", 1)
            .build();
        assert_eq!(attempt(&after_reset, "a"), 3);
    }
}

//! A hold on quota, as the cluster shows it. A hold (a permanent failure, a refused attempt
//! record, a check that cannot answer) is shown on the check's entry: `Pending`, a message
//! that says [`HOLD_MARK`] and the hold's end, and a `lastTransitionTime` that is the hold's
//! start (the write that first shows it sets it, see `decide::plan`). Reading the start back
//! from there, and not from process memory, is what keeps a restart or a leader change from
//! starting a hold again. A hold belongs to the current reservation only if it started no
//! earlier than Kueue's `QuotaReserved` condition last turned true: Kueue leaves a `Pending`
//! entry as it is on an eviction, so an older hold can still be shown.

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::api::{CheckState, Workload, workload_condition as cond};

/// The phrase every message of a hold carries, followed by the hold's end as
/// `%Y-%m-%dT%H:%M:%SZ`: what marks an entry as held.
pub const HOLD_MARK: &str = "keeps its quota until ";

/// When Kueue last reserved quota for the Workload: the `QuotaReserved` condition's
/// `lastTransitionTime`, while it is true.
pub fn reserved_at(wl: &Workload) -> Option<Timestamp> {
    wl.condition(cond::QUOTA_RESERVED)
        .filter(|c| c.status == "True")
        .map(|c| c.last_transition_time.0)
}

pub(crate) fn elapsed(since: Timestamp, now: Timestamp) -> Duration {
    Duration::try_from(now.duration_since(since)).unwrap_or_default()
}

/// When the hold shown on `check`'s entry started, if the entry shows one of the current
/// reservation: `Pending`, a message with [`HOLD_MARK`], and a `lastTransitionTime` no earlier
/// than the reservation.
pub fn hold_started(wl: &Workload, check: &str) -> Option<Timestamp> {
    let entry = wl.admission_check(check)?;
    if entry.state != CheckState::Pending || !entry.message.contains(HOLD_MARK) {
        return None;
    }
    let since = entry.last_transition_time.as_ref()?.0;
    let reserved = reserved_at(wl)?;
    (since >= reserved).then_some(since)
}

/// A hold on quota: since when, until when, and how long is left (`None`: over).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hold {
    /// When it started.
    pub since: Timestamp,
    /// When it ends.
    pub until: Timestamp,
    /// What is left of it at the time asked; `None` once it is over.
    pub left: Option<Duration>,
}

impl Hold {
    /// The hold of `hold_for` that `check`'s entry shows on `wl`, or one that starts `now`.
    pub fn on(wl: &Workload, check: &str, hold_for: Duration, now: Timestamp) -> Self {
        Self::from(hold_started(wl, check).unwrap_or(now), hold_for, now)
    }

    /// A hold of `hold_for` from `since`, at `now`.
    pub fn from(since: Timestamp, hold_for: Duration, now: Timestamp) -> Self {
        let until = SignedDuration::try_from(hold_for)
            .ok()
            .and_then(|h| since.checked_add(h).ok())
            .unwrap_or(now);
        let left = hold_for
            .checked_sub(elapsed(since, now))
            .filter(|l| !l.is_zero());
        Self { since, until, left }
    }

    pub(crate) fn until_text(&self) -> String {
        self.until.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
    }
}

//! The lifecycle of one (Workload, check) pair, as a pure step function: from what is observed
//! (the Workload as read, the check's standing in the registry, what this process remembers of
//! the pair, the clock) to what the runtime does next ([`next`]), and from a check's failure or
//! a refused write to the answer that bounds the quota it holds ([`permanent_failure`],
//! [`cannot_answer`], [`record_refused`]). No I/O, no clock of its own: the runtime observes,
//! calls these, and executes the [`Step`] they give.
//!
//! `docs/state-machine.md` ("When the check is called") is this module's specification: each
//! row of its table is a unit test here, and a test compares the table with those rows.
//!
//! **Bounds that survive restarts.** Every hold on quota starts at a time read from the
//! cluster, never from process memory, so a restart or a leader change neither restarts a hold
//! nor moves the deadline a message announced:
//! - a hold shown on the entry (a permanent failure, a refused attempt record, a check that
//!   cannot answer) starts at the entry's `lastTransitionTime`, which the write that first shows
//!   it sets (`decide::plan`); it is recognised by [`HOLD_MARK`] in the message and
//!   belongs to the current reservation only if it started after Kueue's `QuotaReserved`
//!   condition last turned true (Kueue leaves a `Pending` entry untouched on an eviction, so an
//!   older hold can still be there);
//! - the wait for an entry after an early start counts from that same `QuotaReserved`
//!   transition.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::api::{CheckState, Workload};
use crate::attempts;
use crate::check::{Decision, truncate_chars};
use crate::cluster_queues::QueueRule;
use crate::decide::{Eligibility, standing};
use crate::hold::elapsed;
pub use crate::hold::{HOLD_MARK, Hold, hold_started, reserved_at};
use crate::release::ReleaseReason;

/// Marks the messages of permanent failures, so that a refused write of one is not turned into
/// another.
pub const PERMANENT_MARK: &str = "Permanent failure: ";

/// How much of a permanent failure's reason goes on the entry (and into the Event).
const MAX_PERMANENT_MESSAGE: usize = 600;

/// Where a Workload stood for a check when the check was asked: the check's attempt and
/// Kueue's eviction count. Another value later means the Workload was evicted and given quota
/// again in between, whether or not that was seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct AskedAt {
    /// The check's attempt ([`attempts::attempt`]).
    pub attempt: u32,
    /// Kueue's count of the Workload's evictions.
    pub evictions: i32,
}

impl AskedAt {
    /// Where `wl` stands for `check` if it has the check's entry.
    pub fn of(wl: &Workload, check: &str) -> Option<Self> {
        let entry = wl.admission_check(check)?;
        Some(Self::expected(wl, &entry.name))
    }

    /// Where `wl` stands for `check`, whether or not it has the entry yet (the attempt the
    /// entry will have when it comes).
    pub fn expected(wl: &Workload, check: &str) -> Self {
        Self {
            attempt: attempts::attempt(wl, check),
            evictions: wl.total_evictions(),
        }
    }
}

/// Whether `wl`'s entry for `check` waits for the check's answer: Kueue added it, it is
/// `Pending`, and the Workload holds quota it may use (not deleted, finished, deactivated or
/// evicted). Only the answer stands between such a Workload and its admission, so the runtime
/// grants it a turn before other work.
pub fn awaits_answer(wl: &Workload, check: &str) -> bool {
    crate::decide::eligibility(wl, check, false)
        == Eligibility::Decide {
            revalidating: false,
        }
}

/// Whether an early start of `check` is due for `wl` (its work not yet started in this
/// attempt, as `started` says): the Workload holds quota it may use, is not admitted, has no
/// entry for the check yet, and its ClusterQueue is known to apply the check (`rule`: while the
/// queues are unknown, nothing is started). The runtime grants such a Workload a turn kept for
/// early starts.
pub fn early_start_due(wl: &Workload, check: &str, rule: QueueRule, started: bool) -> bool {
    let applies = rule == QueueRule::Applies;
    !started && applies && standing(wl, check, false, applies) == Eligibility::Early
}

/// Whether this controller can answer a check now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answering {
    /// Active, and the controller enforces: the check is asked.
    Yes,
    /// Inactive (bad parameters, an API not served), or the controller runs in shadow mode:
    /// why, as the entry says it.
    No(String),
    /// No longer one of ours (deleted, renamed, another controller's): only what it holds is
    /// released.
    Gone,
}

/// Work started before Kueue added the entry, as this process remembers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EarlyStart {
    /// Where the Workload stood when it started.
    pub at: AskedAt,
    /// Released because the entry did not come in time: not started again in this attempt.
    pub abandoned: bool,
}

/// Everything [`next`] looks at for one (Workload, check) pair.
#[derive(Clone, Debug)]
pub struct Observed<'a> {
    /// The Workload, as read (the newest cached version).
    pub workload: &'a Workload,
    /// The check.
    pub check: &'a str,
    /// Whether the controller can answer it.
    pub answering: Answering,
    /// The check revalidates `Ready` entries.
    pub revalidate: bool,
    /// The check starts its work before the entry comes.
    pub starts_early: bool,
    /// Whether the Workload's ClusterQueue applies the check to the flavors assigned (looked
    /// at only without the entry, for a check that starts early).
    pub queue_rule: QueueRule,
    /// This process asked the check about the Workload and has not released it: where the
    /// Workload stood then.
    pub asked: Option<AskedAt>,
    /// Early work this process started or abandoned.
    pub early: Option<EarlyStart>,
    /// This controller's last status write for the pair is not in the cache yet: how long to
    /// wait for it at most.
    pub own_write_pending: Option<Duration>,
    /// How long an early start waits for the entry, from the quota reservation.
    pub early_start_wait: Duration,
    /// The time.
    pub now: Timestamp,
}

/// What the runtime does next for one pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Next {
    /// Remember the pair as asked at this point first: it carries an answer of ours that this
    /// process did not write (an earlier process did, before a restart or a leader change), so
    /// that its release is not missed when the Workload goes idle or moves on.
    pub remember: Option<AskedAt>,
    /// Call `release` with this reason first: the Workload went idle, or came back for another
    /// attempt than the one the check was asked about.
    pub release: Option<ReleaseReason>,
    /// Forget the early start this process recorded for the pair: it is of another attempt
    /// than the one the Workload stands at, or the Workload went idle, so it can never matter
    /// again (an abandoned one would otherwise be kept until the Workload is deleted).
    pub forget_early: bool,
    /// Then this.
    pub step: Step,
}

/// The step after the release (if any).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing to do until the Workload changes.
    Idle,
    /// The entry says this and Kueue acts next.
    KueueActs(CheckState),
    /// Ask the check (`decide`) and write its answer; `revalidating` a `Ready` entry.
    Ask {
        /// The entry is `Ready` and the check revalidates.
        revalidating: bool,
    },
    /// The controller's own last write is not in the cache yet: asking now would answer the
    /// same attempt twice. Look again after this long at most.
    AwaitOwnWrite(Duration),
    /// The check cannot answer, for this reason: show it on the entry and hold the quota, then
    /// give it back ([`cannot_answer`]).
    HoldUnanswered(String),
    /// Call `start_early`: the Workload holds quota and the entry is due.
    StartEarly,
    /// Started early; the entry is due within this long.
    AwaitEntry(Duration),
    /// The entry did not come within the wait: release what was started
    /// (`ReleaseReason::EntryNotAdded`) and start again only when the entry comes.
    AbandonEarly,
}

/// The next step for one (Workload, check) pair.
pub fn next(o: &Observed<'_>) -> Next {
    let wl = o.workload;
    // Unknown queues are no evidence either way: the early step starts nothing then, and
    // releases nothing it did not start.
    let applies = o.starts_early && o.queue_rule != QueueRule::DoesNotApply;
    let stands = standing(wl, o.check, o.revalidate, applies);
    let answered = matches!(
        stands,
        Eligibility::Wait(_) | Eligibility::Decide { revalidating: true }
    );
    let remember = AskedAt::of(wl, o.check).filter(|_| answered && o.asked.is_none());
    let release = release_due(o, stands);
    let forget_early = o.early.is_some_and(|e| {
        matches!(stands, Eligibility::Idle(_)) || e.at != AskedAt::expected(wl, o.check)
    });
    let step = match stands {
        Eligibility::Idle(_) => Step::Idle,
        Eligibility::Wait(state) => Step::KueueActs(state),
        Eligibility::Early => early_step(o),
        Eligibility::Decide { revalidating } => match &o.answering {
            Answering::Gone => Step::Idle,
            // A Ready entry of a check that cannot answer stands: Kueue acts on it.
            Answering::No(_) if revalidating => Step::KueueActs(CheckState::Ready),
            Answering::No(why) => Step::HoldUnanswered(why.clone()),
            Answering::Yes => match o.own_write_pending {
                Some(wait) => Step::AwaitOwnWrite(wait),
                None => Step::Ask { revalidating },
            },
        },
    };
    Next {
        remember,
        release,
        forget_early,
        step,
    }
}

/// The release a pair needs before its step: once the Workload no longer needs the check, or
/// when it stands at another attempt than the one the check was asked about (evicted and given
/// quota again between two looks).
fn release_due(o: &Observed<'_>, stands: Eligibility) -> Option<ReleaseReason> {
    let asked = o.asked?;
    match stands {
        Eligibility::Idle(reason) => Some(reason),
        Eligibility::Early if AskedAt::expected(o.workload, o.check) != asked => {
            Some(ReleaseReason::Evicted)
        }
        _ if AskedAt::of(o.workload, o.check).is_some_and(|now| now != asked) => {
            Some(ReleaseReason::Evicted)
        }
        _ => None,
    }
}

/// The step of a Workload that holds quota and waits for Kueue to add the entry. Only a check
/// that can answer starts, and only while the queues are known to apply it; the wait bounds
/// what was started on every path (the check may have turned inactive since, or this process
/// may have forgotten it started). A check that is no longer ours (another deployment may
/// answer it now), or whose queues are unknown, is released only for what this process
/// started.
fn early_step(o: &Observed<'_>) -> Step {
    let at = AskedAt::expected(o.workload, o.check);
    let this_attempt = o.early.filter(|e| e.at == at);
    let unknown = o.queue_rule == QueueRule::Unknown;
    if this_attempt.is_some_and(|e| e.abandoned)
        || ((o.answering == Answering::Gone || unknown) && this_attempt.is_none())
    {
        return Step::Idle;
    }
    match entry_wait_left(o.workload, o.early_start_wait, o.now) {
        // Not started in this attempt (or this process has forgotten it): start; the check
        // makes it idempotent.
        Some(_) if this_attempt.is_none() && o.answering == Answering::Yes => Step::StartEarly,
        Some(left) => Step::AwaitEntry(left),
        // Over: whether this process or an earlier one started it, release it once.
        None => Step::AbandonEarly,
    }
}

/// What is left at `now` of a wait of `wait` for the entry, counted from the quota reservation
/// (`None`: over).
pub fn entry_wait_left(wl: &Workload, wait: Duration, now: Timestamp) -> Option<Duration> {
    let waited = reserved_at(wl)
        .map(|since| elapsed(since, now))
        .unwrap_or_default();
    wait.checked_sub(waited).filter(|l| !l.is_zero())
}

/// What to answer for a permanent failure (`message`: the check's, or why its answer cannot be
/// written): `Pending` with the reason while the hold lasts, then `Retry` without delay, which
/// gives the quota back (Kueue keeps quota for the whole delay of a delayed `Retry`, so a delay
/// would only hold it longer); past the retry limit the runtime writes that `Retry` as
/// `Rejected`. A change of the Workload (the user's fix) asks the check again meanwhile.
pub fn permanent_failure(
    wl: &Workload,
    check: &str,
    message: &str,
    hold_for: Duration,
    now: Timestamp,
) -> Decision {
    let message = truncate_chars(message, MAX_PERMANENT_MESSAGE);
    let hold = Hold::on(wl, check, hold_for, now);
    match hold.left {
        Some(left) => Decision::pending_recheck_after(
            format!(
                "{PERMANENT_MARK}{message}. Retrying will not fix this; once it is fixed the \
                 check answers again. The workload {HOLD_MARK}{} and then gives it back (Retry).",
                hold.until_text()
            ),
            left,
        ),
        None => Decision::retry_after(
            format!(
                "{PERMANENT_MARK}{message}. Not fixed within {}: the quota is given back; the \
                 next attempt asks the check again",
                crate::retry::human(hold_for)
            ),
            Duration::ZERO,
        ),
    }
}

/// What to answer for a Workload whose check cannot answer because of `why`: `Pending` with
/// the reason while the hold lasts, then `Retry` without delay (never `Rejected`: the Workload
/// did nothing wrong).
pub fn cannot_answer(
    wl: &Workload,
    check: &str,
    why: &str,
    hold_for: Duration,
    now: Timestamp,
) -> Decision {
    let hold = Hold::on(wl, check, hold_for, now);
    match hold.left {
        Some(left) => Decision::pending_recheck_after(
            format!(
                "{why}. The workload {HOLD_MARK}{}, then gives it back (Retry) and waits in its \
                 queue until the check can answer",
                hold.until_text()
            ),
            left,
        ),
        None => Decision::retry_after(
            format!(
                "{why}. Not resolved within {}: the quota is given back; the workload waits in \
                 its queue until the check can answer",
                crate::retry::human(hold_for)
            ),
            Duration::ZERO,
        ),
    }
}

/// What a refused attempt record does to a `Retry` (`answered`: the check's message; `why`:
/// the refusal; `hold`: [`Hold::on`] the entry): `Pending` with the reason while the hold lasts (the operator may still grant
/// the permission), then `None`: write the `Retry` without the record (Kueue's `retryCount`
/// still counts it). The hold is the one the entry shows, so a permanent failure that led to
/// this `Retry` and the refusal share one bound.
pub fn record_refused(check: &str, answered: &str, why: &str, hold: &Hold) -> Option<Decision> {
    let left = hold.left?;
    Some(Decision::pending_recheck_after(
        format!(
            "{PERMANENT_MARK}check {check} answered Retry ({:?}), but it cannot be counted on \
             the Workload: {why}. The workload {HOLD_MARK}{}; then the Retry is written without \
             the count (Kueue's retryCount still counts it).",
            truncate_chars(answered, 200),
            hold.until_text()
        ),
        left,
    ))
}

/// The sooner of two times to look again.
pub(crate) fn sooner(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests;

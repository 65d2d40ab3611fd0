//! The lifecycle under random sequences of what happens to one Workload with two checks, ours
//! and another controller's: Kueue reserving quota (with or without adding the entries at
//! once), evictions caused by the other check, our answers (including late ones and permanent
//! failures), a webhook refusing our `Ready`, restarts and leader changes (this process's
//! memory lost), the check turning inactive, deactivation, finishing, deletion, and the clock.
//! An executor that does what the runtime does with each step drives [`next`] and the holds;
//! a model of Kueue plays the rest. Seeded: a failure names its seed, and `PROPTEST_RNG_SEED`
//! replays it.
//!
//! Invariants, checked after every event:
//! - the attempt a check is asked about never goes back;
//! - nothing is written on the other controller's entry;
//! - a hold on quota ends in an answer within its bound, and the deadline its message
//!   announces does not move while it lasts, across restarts; work started early is released
//!   once the entry is missing past the wait, and never started after it;
//! - nothing is asked, written or started for a Workload that is gone or finished.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};

use super::super::*;
use crate::api::{AdmissionCheckState, workload_condition as cond};
use crate::decide::{Plan, PlanInput, plan};
use crate::testing::WorkloadBuilder;
use crate::{RetryPolicy, attempts};

const OURS: &str = "ours";
const OTHER: &str = "other";
const WAIT: Duration = Duration::from_secs(20);
const HOLD: Duration = Duration::from_secs(120);

/// What the check answers when it is next asked.
#[derive(Clone, Copy, Debug)]
enum Answer {
    Ready,
    Pending,
    Retry(u64),
    Rejected,
    /// A permanent failure of the check.
    Fails,
}

/// What can happen between two reconciles.
#[derive(Clone, Debug)]
enum Event {
    /// Kueue reserves quota; `with_entries`: it adds the entries in the same pass.
    Reserve { with_entries: bool },
    /// Kueue adds the entries it has not added yet.
    AddEntries,
    /// The other check answers `Retry` and Kueue evicts.
    OtherRetries,
    /// The other check answers `Ready`; Kueue admits when every entry is.
    OtherReady,
    /// Kueue acts on our entry (evicts on `Retry`, deactivates on `Rejected`).
    KueueActs,
    /// Our check will answer this from now on.
    Answers(Answer),
    /// Our check answers, but the other check's `Retry` evicts the Workload before the answer
    /// is written: the write carries the old version and is refused; a delayed `Retry` is kept
    /// for the next attempt (in memory), anything else is dropped.
    AnswerArrivesLate,
    /// An admission webhook refuses our `Ready` writes (`true`) or stops refusing.
    Webhook(bool),
    /// The check turns inactive (`false`) or active again.
    Active(bool),
    /// This process restarts or another replica takes the lead: its memory is gone.
    Restart,
    /// The ClusterQueues become known (`true`) or unknown (their watch refused, or relisting
    /// after a restart).
    QueuesKnown(bool),
    /// The job finishes (if admitted).
    Finish,
    /// The Workload is deleted.
    Delete,
    /// Time passes.
    Tick(u16),
}

fn any_answer() -> impl Strategy<Value = Answer> {
    prop_oneof![
        Just(Answer::Ready),
        Just(Answer::Pending),
        (0u64..200).prop_map(Answer::Retry),
        Just(Answer::Rejected),
        Just(Answer::Fails),
    ]
}

fn any_event() -> impl Strategy<Value = Event> {
    prop_oneof![
        4 => any::<bool>().prop_map(|with_entries| Event::Reserve { with_entries }),
        2 => Just(Event::AddEntries),
        2 => Just(Event::OtherRetries),
        2 => Just(Event::OtherReady),
        2 => Just(Event::KueueActs),
        3 => any_answer().prop_map(Event::Answers),
        2 => Just(Event::AnswerArrivesLate),
        1 => any::<bool>().prop_map(Event::Webhook),
        1 => any::<bool>().prop_map(Event::Active),
        2 => Just(Event::Restart),
        1 => any::<bool>().prop_map(Event::QueuesKnown),
        1 => Just(Event::Finish),
        1 => Just(Event::Delete),
        6 => (1u16..90).prop_map(Event::Tick),
    ]
}

/// The cluster, this process's memory, and what the invariants track.
struct World {
    wl: Workload,
    clock: i64,
    answer: Answer,
    webhook: bool,
    active: bool,
    /// Whether the ClusterQueues are known to this process.
    queues_known: bool,
    /// This process's memory of the pair.
    asked: Option<AskedAt>,
    early: Option<EarlyStart>,
    late: Option<crate::decide::LateRetry>,
    /// Work started early and not released.
    early_work: bool,
    /// The highest attempt the check was asked about.
    highest_attempt: u32,
    /// The hold shown on our entry: its deadline as first announced.
    announced: Option<String>,
    gone: bool,
}

fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).expect("valid")
}

impl World {
    fn new() -> Self {
        Self {
            wl: WorkloadBuilder::new("ns", "wl")
                .pod_set("main", 2, "1")
                .build(),
            clock: 0,
            answer: Answer::Ready,
            webhook: false,
            active: true,
            queues_known: true,
            asked: None,
            early: None,
            late: None,
            early_work: false,
            highest_attempt: 0,
            announced: None,
            gone: false,
        }
    }

    fn now(&self) -> Timestamp {
        t(self.clock)
    }

    fn set_condition(&mut self, type_: &str, status: bool) {
        let now = self.now();
        let status_text = if status { "True" } else { "False" };
        let conditions = &mut self
            .wl
            .status
            .get_or_insert_with(Default::default)
            .conditions;
        match conditions.iter_mut().find(|c| c.type_ == type_) {
            Some(c) if c.status == status_text => {}
            Some(c) => {
                c.status = status_text.into();
                c.last_transition_time = Time(now);
            }
            None => conditions.push(Condition {
                type_: type_.into(),
                status: status_text.into(),
                reason: type_.into(),
                message: String::new(),
                last_transition_time: Time(now),
                observed_generation: None,
            }),
        }
    }

    fn entries(&mut self) -> &mut Vec<AdmissionCheckState> {
        &mut self
            .wl
            .status
            .get_or_insert_with(Default::default)
            .admission_checks
    }

    fn entry(&self, check: &str) -> Option<&AdmissionCheckState> {
        self.wl.admission_check(check)
    }

    fn reserved(&self) -> bool {
        self.wl.condition_is_true(cond::QUOTA_RESERVED)
    }

    fn add_entries(&mut self) {
        let now = self.now();
        for check in [OURS, OTHER] {
            if self.wl.admission_check(check).is_none() {
                self.entries().push(AdmissionCheckState {
                    name: check.into(),
                    state: CheckState::Pending,
                    last_transition_time: Some(Time(now)),
                    ..Default::default()
                });
            }
        }
    }

    /// Kueue's eviction: every non-`Pending` entry reset (a `Retry` counted in `retryCount`,
    /// the others losing it), the eviction counted, the quota released.
    fn evict(&mut self) {
        let now = self.now();
        for e in self.entries() {
            if e.state != CheckState::Pending {
                e.retry_count = match e.state {
                    CheckState::Retry => Some(e.retry_count.unwrap_or(0) + 1),
                    _ => None,
                };
                e.state = CheckState::Pending;
                e.message = "Reset to Pending after eviction".into();
                e.last_transition_time = Some(Time(now));
                e.pod_set_updates.clear();
                e.requeue_after_seconds = None;
            }
        }
        let evictions = self.wl.total_evictions() + 1;
        let stats = self
            .wl
            .status
            .get_or_insert_with(Default::default)
            .scheduling_stats
            .get_or_insert_with(Default::default);
        stats.evictions = vec![crate::api::EvictionCount {
            reason: "AdmissionCheck".into(),
            underlying_cause: String::new(),
            count: evictions,
        }];
        self.set_condition(cond::ADMITTED, false);
        self.set_condition(cond::QUOTA_RESERVED, false);
        if let Some(status) = self.wl.status.as_mut() {
            status.admission = None;
        }
    }

    fn apply(&mut self, event: &Event) {
        match *event {
            Event::Reserve { with_entries } => {
                if !self.reserved() && self.wl.is_active() && !self.finished_or_gone() {
                    let reserved = WorkloadBuilder::new("ns", "wl")
                        .pod_set("main", 2, "1")
                        .quota_reserved("cq", "f")
                        .build();
                    let admission = reserved.status.and_then(|s| s.admission);
                    self.wl
                        .status
                        .get_or_insert_with(Default::default)
                        .admission = admission;
                    self.set_condition(cond::QUOTA_RESERVED, true);
                    if with_entries {
                        self.add_entries();
                    }
                }
            }
            Event::AddEntries => {
                if !self.finished_or_gone() {
                    self.add_entries();
                }
            }
            Event::OtherRetries | Event::OtherReady => {
                let retries = matches!(event, Event::OtherRetries);
                if self.reserved()
                    && self
                        .entry(OTHER)
                        .is_some_and(|e| e.state == CheckState::Pending)
                {
                    let now = self.now();
                    if let Some(e) = self.entries().iter_mut().find(|e| e.name == OTHER) {
                        e.state = if retries {
                            CheckState::Retry
                        } else {
                            CheckState::Ready
                        };
                        e.last_transition_time = Some(Time(now));
                    }
                    if retries {
                        self.evict();
                    } else {
                        self.admit_if_ready();
                    }
                }
            }
            Event::KueueActs => match self.entry(OURS).map(|e| e.state) {
                Some(CheckState::Retry) if self.reserved() => self.evict(),
                Some(CheckState::Rejected) if self.reserved() => {
                    self.evict();
                    self.wl.spec.active = Some(false);
                }
                _ => self.admit_if_ready(),
            },
            Event::Answers(answer) => self.answer = answer,
            Event::Webhook(on) => self.webhook = on,
            Event::Active(on) => self.active = on,
            Event::QueuesKnown(known) => self.queues_known = known,
            Event::Restart => {
                self.asked = None;
                self.early = None;
                self.late = None;
            }
            Event::AnswerArrivesLate => self.answer_late(),
            Event::Finish => {
                if self.wl.condition_is_true(cond::ADMITTED) {
                    self.set_condition(cond::FINISHED, true);
                }
            }
            Event::Delete => {
                let now = self.now();
                self.wl.metadata.deletion_timestamp = Some(Time(now));
            }
            Event::Tick(secs) => self.clock += i64::from(secs),
        }
    }

    /// The check's answer, planned on the Workload as it is, then overtaken by the other
    /// check's eviction: what the runtime keeps of it after the refused write.
    fn answer_late(&mut self) {
        let eligible = crate::decide::eligibility(&self.wl, OURS, false)
            == Eligibility::Decide {
                revalidating: false,
            };
        let other_pending = self
            .entry(OTHER)
            .is_some_and(|e| e.state == CheckState::Pending);
        if !eligible || !other_pending || self.late.is_some() {
            return;
        }
        let decision = self.decision(self.now());
        let message = decision.message().to_string();
        let input = PlanInput {
            workload: &self.wl,
            check: OURS,
            decision,
            attempt: attempts::attempt(&self.wl, OURS),
            policy: &policy(),
            max_retry_delay: crate::retry::MAX_DELAY,
            revalidate_ready: false,
            now: self.now(),
            jitter_sample: 0.0,
        };
        let late = match plan(input) {
            Plan::Write(write) => {
                crate::decide::LateRetry::from_refused(&write, &message, self.now())
            }
            _ => None,
        };
        self.apply(&Event::OtherRetries);
        self.late = late;
    }

    /// What the check answers now, as the runtime turns it into a decision.
    fn decision(&self, now: Timestamp) -> Decision {
        let decision = match self.answer {
            Answer::Ready => Decision::ready("capacity"),
            Answer::Pending => Decision::pending("waiting"),
            Answer::Retry(s) => Decision::retry_after("later", Duration::from_secs(s)),
            Answer::Rejected => Decision::rejected("never"),
            Answer::Fails => permanent_failure(&self.wl, OURS, "bad parameters", HOLD, now),
        };
        if self.webhook && decision.state() == CheckState::Ready {
            let refused = "the Ready answer of check ours cannot be written: denied";
            permanent_failure(&self.wl, OURS, refused, HOLD, now)
        } else {
            decision
        }
    }

    fn finished_or_gone(&self) -> bool {
        self.wl.condition_is_true(cond::FINISHED) || self.wl.metadata.deletion_timestamp.is_some()
    }

    fn admit_if_ready(&mut self) {
        let all_ready = [OURS, OTHER]
            .iter()
            .all(|c| self.entry(c).is_some_and(|e| e.state == CheckState::Ready));
        if self.reserved() && all_ready {
            self.set_condition(cond::ADMITTED, true);
        }
    }

    /// What the runtime does for our pair on the Workload as it is now.
    fn reconcile(&mut self) -> Result<(), TestCaseError> {
        let answering = if self.active {
            Answering::Yes
        } else {
            Answering::No("check ours cannot answer: its AdmissionCheck is not active".into())
        };
        let observed = Observed {
            workload: &self.wl,
            check: OURS,
            answering,
            revalidate: false,
            starts_early: true,
            queue_rule: match self.queues_known {
                true => QueueRule::Applies,
                false => QueueRule::Unknown,
            },
            asked: self.asked,
            early: self.early,
            own_write_pending: None,
            early_start_wait: WAIT,
            now: self.now(),
        };
        let step = next(&observed);
        if let Some(at) = step.remember {
            self.asked = Some(at);
        }
        if step.forget_early {
            self.early = None;
        }
        if self.finished_or_gone() {
            prop_assert!(
                matches!(step.step, Step::Idle | Step::KueueActs(_)),
                "a step for a Workload that is gone or finished: {step:?}"
            );
        }
        if let Some(reason) = step.release {
            if reason == ReleaseReason::Deleted {
                self.gone = true;
            }
            self.asked = None;
            self.early = None;
            self.early_work = false;
        }
        match step.step {
            Step::Idle | Step::KueueActs(_) | Step::AwaitOwnWrite(_) | Step::AwaitEntry(_) => {}
            Step::StartEarly => {
                let left = entry_wait_left(&self.wl, WAIT, self.now());
                prop_assert!(left.is_some(), "started early after the wait");
                prop_assert!(
                    self.queues_known,
                    "started early while the queues are unknown"
                );
                let at = AskedAt::expected(&self.wl, OURS);
                self.asked = Some(at);
                self.early = Some(EarlyStart {
                    at,
                    abandoned: false,
                });
                self.early_work = true;
            }
            Step::AbandonEarly => {
                self.asked = None;
                self.early = Some(EarlyStart {
                    at: AskedAt::expected(&self.wl, OURS),
                    abandoned: true,
                });
                self.early_work = false;
            }
            Step::HoldUnanswered(why) => {
                let decision = cannot_answer(&self.wl, OURS, &why, HOLD, self.now());
                self.write(decision, &RetryPolicy::default())?;
            }
            Step::Ask { .. } => {
                let at = AskedAt::of(&self.wl, OURS).expect("asked with the entry");
                prop_assert!(
                    at.attempt >= self.highest_attempt,
                    "attempt went back: {} after {}",
                    at.attempt,
                    self.highest_attempt
                );
                self.highest_attempt = at.attempt;
                self.asked = Some(at);
                self.early = None;
                // A Retry kept from an attempt overtaken by an eviction is written for what
                // is left of its delay, instead of asking the check again.
                let carried = self.late.as_ref().and_then(|l| l.decision(self.now()));
                self.late = None;
                let decision = carried.unwrap_or_else(|| self.decision(self.now()));
                let policy = policy();
                self.write(decision, &policy)?;
            }
        }
        // Nothing of an early start is remembered for a Workload that does not hold quota or
        // stands at another attempt: memory is bounded by what can still matter.
        let at = AskedAt::expected(&self.wl, OURS);
        if let Some(early) = self.early {
            prop_assert!(
                self.reserved() && !self.finished_or_gone() && early.at == at,
                "an early start remembered past its attempt: {early:?} at {at:?}"
            );
        }
        self.check_bounds()
    }

    /// Plans and applies our write, as the runtime does (the record first).
    fn write(&mut self, decision: Decision, policy: &RetryPolicy) -> Result<(), TestCaseError> {
        let other_before = self.entry(OTHER).cloned();
        let input = PlanInput {
            workload: &self.wl,
            check: OURS,
            decision,
            attempt: attempts::attempt(&self.wl, OURS),
            policy,
            max_retry_delay: crate::retry::MAX_DELAY,
            revalidate_ready: false,
            now: self.now(),
            jitter_sample: 0.0,
        };
        let Plan::Write(write) = plan(input) else {
            return Ok(());
        };
        prop_assert!(
            !self.finished_or_gone(),
            "a write for a Workload gone or finished"
        );
        prop_assert_eq!(&write.entry.name, OURS);
        if let Some(record) = write.record {
            let key = attempts::annotation_key(OURS);
            self.wl
                .metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(key, record.to_string());
        }
        let retry_count = self.entry(OURS).and_then(|e| e.retry_count);
        let entries = self.entries();
        entries.retain(|e| e.name != OURS);
        entries.push(AdmissionCheckState {
            retry_count,
            ..write.entry
        });
        prop_assert_eq!(
            self.entry(OTHER),
            other_before.as_ref(),
            "the other entry changed"
        );
        Ok(())
    }

    /// The holds' bounds after a reconcile.
    fn check_bounds(&mut self) -> Result<(), TestCaseError> {
        let now = self.now();
        // A Workload gone or finished holds nothing Kueue keeps for it.
        let live = !self.finished_or_gone();
        match hold_started(&self.wl, OURS).filter(|_| live) {
            Some(since) => {
                let message = &self.entry(OURS).expect("an entry").message;
                let deadline = message
                    .split(HOLD_MARK)
                    .nth(1)
                    .map(|rest| rest.chars().take(20).collect::<String>())
                    .unwrap_or_default();
                if let Some(first) = &self.announced {
                    prop_assert_eq!(first, &deadline, "the announced deadline moved");
                }
                self.announced = Some(deadline);
                prop_assert!(
                    now < Hold::from(since, HOLD, now).until,
                    "quota held past the hold: since {since}, now {now}"
                );
            }
            None => self.announced = None,
        }
        let entry_missing = self.entry(OURS).is_none();
        // Work an earlier process started is found again only once the queues are known.
        let forgotten = self.early.is_none() && !self.queues_known;
        if self.early_work
            && entry_missing
            && self.reserved()
            && !self.finished_or_gone()
            && !forgotten
        {
            prop_assert!(
                entry_wait_left(&self.wl, WAIT, now).is_some(),
                "early work kept past the wait for the entry"
            );
        }
        Ok(())
    }
}

/// Our check's retry policy: Kueue's default backoff, at most three retries.
fn policy() -> RetryPolicy {
    RetryPolicy {
        retry_limit: Some(3),
        ..RetryPolicy::default()
    }
}

/// Fixed unless `PROPTEST_RNG_SEED` says otherwise, so that a failure replays.
fn seeded(cases: u32) -> Config {
    let seed = std::env::var("PROPTEST_RNG_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_261_129);
    Config {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        ..Config::default()
    }
}

proptest! {
    #![proptest_config(seeded(512))]

    #[test]
    fn every_sequence_keeps_the_lifecycle_invariants(
        events in proptest::collection::vec(any_event(), 1..80)
    ) {
        let mut world = World::new();
        world.reconcile()?;
        for event in &events {
            world.apply(event);
            world.reconcile()?;
            // A requeue after the step's wait: the runtime looks again when a hold ends.
            world.clock += 1;
            world.reconcile()?;
        }
        let _ = world.gone;
    }
}

/// The late path of the property test is taken: a delayed `Retry` overtaken by the other
/// check's eviction is written on the next attempt for what is left of it, at a later attempt.
#[test]
fn a_late_retry_is_carried_to_the_next_attempt() -> Result<(), TestCaseError> {
    let mut world = World::new();
    for event in [
        Event::Answers(Answer::Retry(100)),
        Event::Reserve { with_entries: true },
    ] {
        world.apply(&event);
    }
    world.apply(&Event::AnswerArrivesLate);
    prop_assert!(world.late.is_some(), "the delayed Retry is kept");
    prop_assert_eq!(world.wl.total_evictions(), 1);
    world.apply(&Event::Tick(30));
    world.apply(&Event::Reserve { with_entries: true });
    world.reconcile()?;
    let entry = world.entry(OURS).cloned().unwrap_or_default();
    prop_assert_eq!(entry.state, CheckState::Retry);
    prop_assert!(
        entry
            .message
            .contains("decided for attempt 1 while Kueue evicted"),
        "{}",
        entry.message
    );
    prop_assert_eq!(entry.requeue_after_seconds, Some(70));
    prop_assert_eq!(world.highest_attempt, 1);
    Ok(())
}

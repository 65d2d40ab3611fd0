//! A seeded, scripted run of several SDK checks on one ClusterQueue, with an independent
//! recorder that checks the invariants of `docs/reliability.md` on every Workload version it
//! observes.
//!
//! Three parts, kept apart on purpose:
//! - [`Script`]: from a seed alone, what each check answers on its n-th call for a Workload,
//!   and so which end state each Workload must reach and how long that may take;
//! - [`ScriptedCheck`]: an SDK check (served by its own in-process `run_until`) that
//!   answers from the script and tells the recorder which attempt `ctx.attempt()` said;
//! - [`Recorder`]: a watch on the namespace's Workloads, not the controllers' metrics, that
//!   keeps every observed version as a timeline and records each invariant broken.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use futures::StreamExt;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kueue_admission_sdk::api::{CheckState, ClusterQueue, Workload, workload_condition as cond};
use kueue_admission_sdk::attempts;
use kueue_admission_sdk::{
    AdmissionCheckController, CheckContext, Decision, NoParameters, RetryPolicy, RuntimeConfig,
};
use tokio::sync::{Notify, oneshot};
use tokio::task::JoinHandle;

use crate::TestEnv;

// ---------------------------------------------------------------------------------------------
// The seed

/// SplitMix64: a tiny, well-mixed generator. Every script is drawn from its own stream, keyed
/// by the seed and a path (workload, check, call), so one Workload's script never depends on
/// how many others there are.
#[derive(Clone, Debug)]
pub struct Rng(u64);

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Rng {
    /// The stream for `path` under `seed`.
    pub fn stream(seed: u64, path: &[u64]) -> Self {
        let state = path.iter().fold(mix(seed ^ GOLDEN), |s, p| {
            mix(s ^ mix(p.wrapping_add(GOLDEN)))
        });
        Self(state)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN);
        mix(self.0)
    }

    /// Uniform in `0..n` (the modulo bias is irrelevant for n this small).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// True once in `n`.
    pub fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }

    /// A duration of `lo..=hi` milliseconds.
    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi.saturating_sub(lo) + 1))
    }
}

// ---------------------------------------------------------------------------------------------
// The script

/// A late answer sleeps this long at most before returning (Kueue may evict meanwhile).
const LATE_MS: (u64, u64) = (300, 3_000);
/// A `Pending` asks to be rechecked after this long.
const RECHECK_MS: (u64, u64) = (500, 2_000);
/// A `Retry` with an explicit delay waits this long.
const RETRY_AFTER_MS: (u64, u64) = (1_000, 3_000);

/// Allowances for (5), the time bound. Seen in the timelines of runs on the 2-core machine:
/// Job → quota → first call under 1 s, an answer written and acted on by Kueue in a fraction
/// of a second, an eviction to the next reservation 1 to 2 s. Each allowance is several times
/// that, for a CI machine that runs other end-to-end tests at the same time.
const START_ALLOWANCE: Duration = Duration::from_secs(15);
const PER_ANSWER: Duration = Duration::from_secs(2);
const PER_EVICTION: Duration = Duration::from_secs(3);
/// Kueue stores `lastTransitionTime` at whole seconds and the SDK rounds a delay up.
const ROUNDING: Duration = Duration::from_secs(1);

/// How a scripted `Retry` asks for its delay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryKind {
    /// The check's [`RetryPolicy`] delay.
    Policy,
    /// No delay: Kueue evicts and requeues at once.
    Immediate,
    /// Exactly this long.
    After(Duration),
}

/// What a check answers on one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// `Ready`.
    Ready,
    /// `Pending`, ask again after this long (or on any change of the Workload).
    Pending(Duration),
    /// `Retry`.
    Retry(RetryKind),
}

/// One scripted call: sleep `late` (a slow backend), then answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    /// How long `decide` sleeps before answering.
    pub late: Duration,
    /// The answer.
    pub answer: Answer,
}

/// What a check answers once its listed steps are used up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Then {
    /// `Ready` on every further call: the Workload is meant to be admitted.
    ReadyForever,
    /// `Retry` on every further call: the check's retry limit must turn one into `Rejected`.
    RetryForever,
}

/// One check's script for one Workload.
#[derive(Clone, Debug)]
pub struct CheckScript {
    /// The answers of the first calls, in order.
    pub steps: Vec<Step>,
    /// The answer of every later call.
    pub then: Then,
}

/// Where a Workload must end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndState {
    /// `Admitted=True` with every entry `Ready`.
    Admitted,
    /// `spec.active: false`, after check `by` (an index) answered `Rejected`.
    Deactivated {
        /// The check whose retry limit runs out.
        by: usize,
    },
}

/// The scripts of one Workload, one per check.
#[derive(Clone, Debug)]
pub struct WorkloadScript {
    /// Its scripted end state.
    pub end: EndState,
    /// Per check.
    pub checks: Vec<CheckScript>,
}

/// One check of the run.
#[derive(Clone, Debug)]
pub struct CheckSpec {
    /// Its name in the run (`c0`, `c1`, ...), suffix of the AdmissionCheck's name.
    pub short: String,
    /// `Retry` answers a Workload may get from it before the SDK answers `Rejected`.
    pub retry_limit: u32,
    /// The delay of its retry policy (zero: immediate).
    pub policy_delay: Duration,
}

impl CheckSpec {
    /// The check's retry policy.
    pub fn policy(&self) -> RetryPolicy {
        let policy = if self.policy_delay.is_zero() {
            RetryPolicy::immediate()
        } else {
            RetryPolicy::fixed(self.policy_delay)
        };
        policy.with_retry_limit(self.retry_limit)
    }

    fn longest_retry_delay(&self) -> Duration {
        self.policy_delay
            .max(Duration::from_millis(RETRY_AFTER_MS.1))
    }
}

/// Everything a run does, as a function of the seed.
#[derive(Clone, Debug)]
pub struct Script {
    /// The seed.
    pub seed: u64,
    /// The checks, all on one ClusterQueue.
    pub checks: Vec<CheckSpec>,
    /// Per Workload (index = the number in its Job's name).
    pub workloads: Vec<WorkloadScript>,
}

// Stream paths: the first element says what the stream is for.
const STREAM_CHECKS: u64 = 1;
const STREAM_DOOM: u64 = 2;
const STREAM_STEPS: u64 = 3;
const STREAM_FOREVER: u64 = 4;

impl Script {
    /// The script of a run of `workloads` Workloads; `checks` (2 or 3) overrides the seed's
    /// choice.
    pub fn generate(seed: u64, workloads: usize, checks: Option<usize>) -> Self {
        let mut rng = Rng::stream(seed, &[STREAM_CHECKS]);
        let n_checks = checks.unwrap_or(2 + rng.below(2) as usize);
        let checks: Vec<CheckSpec> = (0..n_checks)
            .map(|i| CheckSpec {
                short: format!("c{i}"),
                retry_limit: 2 + rng.below(3) as u32,
                policy_delay: Duration::from_secs(rng.below(4)),
            })
            .collect();
        // About one Workload in five runs a check past its limit, and always one of the first
        // four (so that the choice does not depend on the run's length), so every run shows
        // the Rejected path.
        let always =
            (Rng::stream(seed, &[STREAM_DOOM]).below(4) as usize).min(workloads.saturating_sub(1));
        let workloads = (0..workloads)
            .map(|w| {
                let mut rng = Rng::stream(seed, &[STREAM_DOOM, w as u64]);
                let end = if w == always || rng.one_in(5) {
                    EndState::Deactivated {
                        by: rng.below(checks.len() as u64) as usize,
                    }
                } else {
                    EndState::Admitted
                };
                let scripts = checks
                    .iter()
                    .enumerate()
                    .map(|(c, spec)| {
                        let mut rng = Rng::stream(seed, &[STREAM_STEPS, w as u64, c as u64]);
                        let doomed = end == (EndState::Deactivated { by: c });
                        check_script(&mut rng, spec, doomed)
                    })
                    .collect();
                WorkloadScript {
                    end,
                    checks: scripts,
                }
            })
            .collect();
        Self {
            seed,
            checks,
            workloads,
        }
    }

    /// What check `check` answers on its `call`-th call (0-based) for Workload `workload`: a
    /// function of the seed, the Workload, the check and the call count alone.
    pub fn step(&self, workload: usize, check: usize, call: u32) -> Step {
        let Some(script) = self
            .workloads
            .get(workload)
            .and_then(|w| w.checks.get(check))
        else {
            return Step {
                late: Duration::ZERO,
                answer: Answer::Pending(Duration::from_secs(60)),
            };
        };
        if let Some(step) = script.steps.get(call as usize) {
            return *step;
        }
        match script.then {
            // No late answers after the listed steps: a conflict makes the runtime ask again,
            // and an unbounded number of sleeps would leave the time bound without meaning.
            Then::ReadyForever => Step {
                late: Duration::ZERO,
                answer: Answer::Ready,
            },
            Then::RetryForever => {
                let path = [STREAM_FOREVER, workload as u64, check as u64, call.into()];
                Step {
                    late: Duration::ZERO,
                    answer: Answer::Retry(retry_kind(&mut Rng::stream(self.seed, &path))),
                }
            }
        }
    }

    /// (5): how long Workload `workload` may take from its Job's creation to its end state.
    /// Every listed step is charged its sleep, its delay and one answer; every possible
    /// eviction one eviction and one more answer from every check; a check retrying forever
    /// its limit plus one `Retry` of the longest delay.
    pub fn time_bound(&self, workload: usize) -> Duration {
        let Some(script) = self.workloads.get(workload) else {
            return START_ALLOWANCE;
        };
        let mut bound = START_ALLOWANCE;
        let mut evictions: u32 = 0;
        for (spec, check) in self.checks.iter().zip(&script.checks) {
            for step in &check.steps {
                bound += step.late + PER_ANSWER;
                match step.answer {
                    Answer::Ready => {}
                    Answer::Pending(d) => bound += d,
                    Answer::Retry(kind) => {
                        evictions += 1;
                        bound += ROUNDING
                            + match kind {
                                RetryKind::Policy => spec.policy_delay,
                                RetryKind::Immediate => Duration::ZERO,
                                RetryKind::After(d) => d,
                            };
                    }
                }
            }
            if check.then == Then::RetryForever {
                let retries = spec.retry_limit + 1;
                evictions += retries;
                bound += (spec.longest_retry_delay() + ROUNDING + PER_ANSWER) * retries;
            }
        }
        let per_eviction = PER_EVICTION + PER_ANSWER * self.checks.len() as u32;
        bound + per_eviction * evictions
    }

    /// One line per check and its steps, for a failure report.
    pub fn describe(&self, workload: usize) -> String {
        let mut out = String::new();
        if let Some(w) = self.workloads.get(workload) {
            let _ = writeln!(
                out,
                "  scripted end state {:?}, time bound {:?}",
                w.end,
                self.time_bound(workload)
            );
            for (spec, c) in self.checks.iter().zip(&w.checks) {
                let steps: Vec<String> = c.steps.iter().map(describe_step).collect();
                let _ = writeln!(
                    out,
                    "  {} (limit {}, policy delay {:?}): [{}] then {:?}",
                    spec.short,
                    spec.retry_limit,
                    spec.policy_delay,
                    steps.join(", "),
                    c.then
                );
            }
        }
        out
    }
}

fn describe_step(s: &Step) -> String {
    let answer = match s.answer {
        Answer::Ready => "Ready".to_string(),
        Answer::Pending(d) => format!("Pending({}ms)", d.as_millis()),
        Answer::Retry(RetryKind::Policy) => "Retry(policy)".into(),
        Answer::Retry(RetryKind::Immediate) => "Retry(now)".into(),
        Answer::Retry(RetryKind::After(d)) => format!("Retry({}ms)", d.as_millis()),
    };
    if s.late.is_zero() {
        answer
    } else {
        format!("late {}ms {answer}", s.late.as_millis())
    }
}

fn retry_kind(rng: &mut Rng) -> RetryKind {
    match rng.below(3) {
        0 => RetryKind::Policy,
        1 => RetryKind::Immediate,
        _ => RetryKind::After(rng.millis(RETRY_AFTER_MS.0, RETRY_AFTER_MS.1)),
    }
}

/// A check's steps. One meant to pass retries at most its limit and ends `Ready`, with a
/// `Ready` sometimes before a `Retry`: that `Ready` only gives way to the `Retry` if another
/// check evicts the Workload meanwhile, which is exactly when Kueue forgets its `retryCount`.
/// A doomed check never answers `Ready` (one would admit the Workload) and retries forever.
fn check_script(rng: &mut Rng, spec: &CheckSpec, doomed: bool) -> CheckScript {
    let mut steps = Vec::new();
    let step = |rng: &mut Rng, answer: Answer| {
        let late = if rng.one_in(4) {
            rng.millis(LATE_MS.0, LATE_MS.1)
        } else {
            Duration::ZERO
        };
        Step { late, answer }
    };
    let retries = if doomed {
        rng.below(u64::from(spec.retry_limit))
    } else {
        rng.below(u64::from(spec.retry_limit) + 1)
    };
    for _ in 0..retries {
        if rng.one_in(3) {
            let d = rng.millis(RECHECK_MS.0, RECHECK_MS.1);
            steps.push(step(rng, Answer::Pending(d)));
        }
        if !doomed && !rng.one_in(3) {
            steps.push(step(rng, Answer::Ready));
        }
        let kind = retry_kind(rng);
        steps.push(step(rng, Answer::Retry(kind)));
    }
    if rng.one_in(3) {
        let d = rng.millis(RECHECK_MS.0, RECHECK_MS.1);
        steps.push(step(rng, Answer::Pending(d)));
    }
    if !doomed {
        steps.push(step(rng, Answer::Ready));
    }
    CheckScript {
        steps,
        then: if doomed {
            Then::RetryForever
        } else {
            Then::ReadyForever
        },
    }
}

impl Answer {
    fn decision(self) -> Decision {
        match self {
            Answer::Ready => Decision::ready("scripted Ready"),
            // One message for every Pending: a second Pending in a row writes nothing, so the
            // runtime really waits for the recheck (or the next change of the Workload).
            Answer::Pending(d) => Decision::pending_recheck_after("scripted Pending", d),
            Answer::Retry(RetryKind::Policy) => Decision::retry("scripted Retry (policy delay)"),
            Answer::Retry(RetryKind::Immediate) => {
                Decision::retry_after("scripted Retry (no delay)", Duration::ZERO)
            }
            Answer::Retry(RetryKind::After(d)) => {
                Decision::retry_after(format!("scripted Retry ({} ms)", d.as_millis()), d)
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The recorder

/// The invariants of `docs/reliability.md`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Invariant {
    /// (1) No entry of ours is `Retry` or `Ready` while the Workload holds no quota.
    NoAnswerWithoutQuota,
    /// (2) Per Workload and check, the attempt never decreases.
    AttemptsNeverDecrease,
    /// (3) Admitted exactly when every entry is `Ready`.
    AdmittedIffAllReady,
    /// (4) A check's entry enters `Retry` at most its limit times; past it, `Rejected`.
    LimitsHonoured,
    /// (5) Every Workload reaches its scripted end state within its time bound.
    EndStateInTime,
}

impl Invariant {
    fn number(self) -> u8 {
        self as u8 + 1
    }
}

/// One broken invariant.
#[derive(Clone, Debug)]
pub struct Violation {
    /// Which.
    pub invariant: Invariant,
    /// The Workload (script index).
    pub workload: usize,
    /// What was seen.
    pub what: String,
}

/// How often each invariant was checked (and so could have failed).
#[derive(Clone, Debug, Default)]
pub struct Counts {
    /// Workload versions observed (each checked for 1, 3 and 4).
    pub versions: u64,
    /// Entries of our checks checked for (1).
    pub entries: u64,
    /// `decide` calls, each checked for (2).
    pub calls: u64,
    /// Attempts read from the Workload, each checked for (2) (0 until the SDK stores them).
    pub stored_attempts: u64,
    /// Versions with `Admitted=True`, each checked for (3).
    pub admitted_versions: u64,
    /// Entries observed entering `Retry`, each counted against (4).
    pub retries: u64,
    /// Entries observed `Rejected`.
    pub rejections: u64,
    /// Evictions seen in `schedulingStats`.
    pub evictions: u64,
    /// Workloads that reached their end state in time, checked for (5).
    pub ended_admitted: u64,
    /// Same, deactivated.
    pub ended_deactivated: u64,
    /// Watch errors (the watcher lists again; versions in between may be missed).
    pub watch_errors: u64,
}

/// What one check went through on one Workload, as observed.
#[derive(Clone, Debug, Default)]
struct CheckTrack {
    state: Option<CheckState>,
    retries_entered: u32,
    rejected_seen: bool,
    calls: u32,
    last_call_attempt: Option<u32>,
    last_stored_attempt: Option<u32>,
}

#[derive(Debug, Default)]
struct WorkloadTrack {
    name: String,
    uid: String,
    submitted: Option<Instant>,
    last_rv: String,
    evictions: i64,
    checks: Vec<CheckTrack>,
    timeline: Vec<String>,
    last: Option<Workload>,
    admitted_at: Option<Instant>,
    deactivated_at: Option<Instant>,
    /// When the scripted end state was reached (or the run gave up on it).
    ended: Option<Instant>,
}

#[derive(Debug, Default)]
struct State {
    workloads: BTreeMap<usize, WorkloadTrack>,
    violations: Vec<Violation>,
    counts: Counts,
}

/// Watches the namespace's Workloads and checks the invariants on every version.
#[derive(Debug)]
pub struct Recorder {
    script: Arc<Script>,
    /// Full AdmissionCheck names, by check index.
    check_names: Vec<String>,
    started: Instant,
    state: Mutex<State>,
    changed: Notify,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The Job of Workload `index` is called `wl-NNNN`.
fn job_name(index: usize) -> String {
    format!("wl-{index:04}")
}

fn index_of(wl: &Workload) -> Option<usize> {
    wl.owner_references()
        .iter()
        .find_map(|o| o.name.strip_prefix("wl-")?.parse().ok())
}

/// Holding quota: `QuotaReserved=True`; an admitted Workload holds it too.
fn holds_quota(wl: &Workload) -> bool {
    wl.condition_is_true(cond::QUOTA_RESERVED) || wl.condition_is_true(cond::ADMITTED)
}

/// The attempt the SDK stored on the Workload for `check` (its attempt record, see
/// `kueue_admission_sdk::attempts`), once the check has written one.
fn stored_attempt(wl: &Workload, check: &str) -> Option<u32> {
    attempts::record(wl, check).map(|_| attempts::attempt(wl, check))
}

/// One observed Workload version, as [`Recorder::observe`] checks it.
struct Version<'a> {
    wl: &'a Workload,
    /// Its script index.
    index: usize,
    rv: &'a str,
    quota: bool,
}

/// What one version broke, and what it was checked for.
#[derive(Default)]
struct Findings {
    violations: Vec<(Invariant, String)>,
    counts: Counts,
}

/// (3): admitted only with every entry `Ready`; notes when it was first admitted, or
/// deactivated.
fn check_admitted(
    v: &Version,
    track: &mut WorkloadTrack,
    all_ready: bool,
    entries: &[String],
    found: &mut Findings,
    now: Instant,
) {
    if v.wl.condition_is_true(cond::ADMITTED) {
        found.counts.admitted_versions += 1;
        if !all_ready {
            found.violations.push((
                Invariant::AdmittedIffAllReady,
                format!(
                    "Admitted=True at rv {} with entries {}",
                    v.rv,
                    entries.join(" ")
                ),
            ));
        }
        track.admitted_at.get_or_insert(now);
    }
    if !v.wl.is_active() {
        track.deactivated_at.get_or_insert(now);
    }
}

/// A version's line in the timeline: Kueue's conditions, evictions, our entries.
fn version_line(wl: &Workload, rv: &str, evictions: i64, entries: &[String]) -> String {
    let flag = |t: &str| {
        wl.condition(t)
            .map_or("-", |c| if c.status == "True" { "T" } else { "F" })
    };
    let evicted_reason = wl
        .condition(cond::EVICTED)
        .filter(|c| c.status == "True")
        .map(|c| format!("({})", c.reason))
        .unwrap_or_default();
    let requeue_at = wl
        .requeue_at()
        .map(|t| format!(" requeueAt={}", t))
        .unwrap_or_default();
    format!(
        "rv {rv}: QuotaReserved={} Admitted={} Evicted={}{evicted_reason} Requeued={} \
         active={} evictions={evictions}{requeue_at} | {}",
        flag(cond::QUOTA_RESERVED),
        flag(cond::ADMITTED),
        flag(cond::EVICTED),
        flag(cond::REQUEUED),
        wl.is_active(),
        entries.join(" ")
    )
}

impl Recorder {
    fn new(script: Arc<Script>, check_names: Vec<String>) -> Self {
        Self {
            script,
            check_names,
            started: Instant::now(),
            state: Mutex::default(),
            changed: Notify::new(),
        }
    }

    fn secs(&self, at: Instant) -> String {
        format!("{:7.2}s", at.duration_since(self.started).as_secs_f64())
    }

    fn track<'a>(&self, state: &'a mut State, index: usize) -> &'a mut WorkloadTrack {
        let n = self.check_names.len();
        state
            .workloads
            .entry(index)
            .or_insert_with(|| WorkloadTrack {
                checks: vec![CheckTrack::default(); n],
                ..Default::default()
            })
    }

    fn submitted(&self, index: usize) {
        let mut state = lock(&self.state);
        let at = Instant::now();
        let line = format!("{} Job {} created", self.secs(at), job_name(index));
        let track = self.track(&mut state, index);
        track.submitted = Some(at);
        track.timeline.push(line);
    }

    /// A `decide` call: returns its number (0-based) for this Workload and check.
    fn called(&self, index: usize, uid: &str, check: usize, attempt: u32, rv: &str) -> u32 {
        let mut state = lock(&self.state);
        let at = self.secs(Instant::now());
        state.counts.calls += 1;
        let track = self.track(&mut state, index);
        let same_uid = track.uid.is_empty() || track.uid == uid;
        let Some(c) = track.checks.get_mut(check) else {
            return 0;
        };
        let n = c.calls;
        c.calls += 1;
        let before = c.last_call_attempt.replace(attempt);
        let step = self.script.step(index, check, n);
        track.timeline.push(format!(
            "{at} call   {} #{n} ctx.attempt()={attempt} (from rv {rv}) -> {}",
            self.script.checks[check].short,
            describe_step(&step)
        ));
        if let Some(before) = before
            && attempt < before
            && same_uid
        {
            let what = format!(
                "{}: decide call #{n} got attempt {attempt} after attempt {before}",
                self.script.checks[check].short
            );
            track.timeline.push(format!("{at} VIOLATION (2) {what}"));
            state.violations.push(Violation {
                invariant: Invariant::AttemptsNeverDecrease,
                workload: index,
                what,
            });
        }
        n
    }

    /// One Workload version from the watch.
    fn observe(&self, wl: &Workload) {
        let Some(index) = index_of(wl) else { return };
        let rv = wl.resource_version().unwrap_or_default();
        let now = Instant::now();
        let at = self.secs(now);
        let mut guard = lock(&self.state);
        let state = &mut *guard;
        let track = self.track(state, index);
        if track.last_rv == rv {
            return; // the same version again, after the watcher listed anew
        }
        track.last_rv.clone_from(&rv);
        track.name = wl.name_any();
        track.uid = wl.uid().unwrap_or_default();
        let v = Version {
            wl,
            index,
            rv: &rv,
            quota: holds_quota(wl),
        };
        let mut found = Findings::default();
        found.counts.versions += 1;
        let (entries, all_ready) = self.check_entries(&v, track, &mut found);
        check_admitted(&v, track, all_ready, &entries, &mut found, now);
        let evictions = i64::from(wl.total_evictions());
        found.counts.evictions += u64::try_from(evictions - track.evictions).unwrap_or(0);
        track.evictions = evictions;
        let line = version_line(wl, &rv, evictions, &entries);
        track.timeline.push(format!("{at} {line}"));
        for (invariant, what) in &found.violations {
            track
                .timeline
                .push(format!("{at} VIOLATION ({}) {what}", invariant.number()));
        }
        track.last = Some(wl.clone());
        state.violations.extend(
            found
                .violations
                .into_iter()
                .map(|(invariant, what)| Violation {
                    invariant,
                    workload: index,
                    what,
                }),
        );
        state.counts.add(&found.counts);
        drop(guard);
        self.changed.notify_waiters();
    }

    /// Checks each of our entries of `v` (invariants 1, 2 and 4); returns them for the timeline
    /// and whether every one is `Ready`.
    fn check_entries(
        &self,
        v: &Version,
        track: &mut WorkloadTrack,
        found: &mut Findings,
    ) -> (Vec<String>, bool) {
        let mut all_ready = true;
        let mut entries = Vec::new();
        for (c, name) in self.check_names.iter().enumerate() {
            let short = &self.script.checks[c].short;
            let Some(entry) = v.wl.admission_check(name) else {
                all_ready = false;
                entries.push(format!("{short}=absent"));
                continue;
            };
            found.counts.entries += 1;
            all_ready &= entry.state == CheckState::Ready;
            let msg: String = entry.message.chars().take(60).collect();
            entries.push(format!(
                "{short}={}(rc={},{:?})",
                entry.state,
                entry.retry_count.map_or("-".into(), |r| r.to_string()),
                msg
            ));
            self.check_entry(v, c, entry.state, &mut track.checks[c], found);
        }
        (entries, all_ready)
    }

    /// Invariants 1, 4 and 2 on check `c`'s entry, in `state_now`.
    fn check_entry(
        &self,
        v: &Version,
        c: usize,
        state_now: CheckState,
        ct: &mut CheckTrack,
        found: &mut Findings,
    ) {
        let (short, rv) = (&self.script.checks[c].short, v.rv);
        let limit = self.script.checks[c].retry_limit;
        // (1): Kueue resets the entries and starts dropping the quota in one write, so no
        // version may show an answer of ours without the quota it was given for.
        if matches!(state_now, CheckState::Ready | CheckState::Retry) && !v.quota {
            found.violations.push((
                Invariant::NoAnswerWithoutQuota,
                format!("{short} is {state_now} at rv {rv} without QuotaReserved=True"),
            ));
        }
        // (4)
        if state_now == CheckState::Retry && ct.state != Some(CheckState::Retry) {
            ct.retries_entered += 1;
            found.counts.retries += 1;
            if ct.retries_entered > limit {
                found.violations.push((
                    Invariant::LimitsHonoured,
                    format!(
                        "{short} entered Retry for the {} time at rv {rv}; its limit is {limit}",
                        ct.retries_entered
                    ),
                ));
            }
        }
        if state_now == CheckState::Rejected && ct.state != Some(CheckState::Rejected) {
            ct.rejected_seen = true;
            found.counts.rejections += 1;
            let doomed = self.script.workloads.get(v.index).map(|w| w.end)
                == Some(EndState::Deactivated { by: c });
            if !doomed {
                found.violations.push((
                    Invariant::LimitsHonoured,
                    format!("{short} Rejected at rv {rv}, but it was scripted within its limit"),
                ));
            }
        }
        // (2), on what the Workload stores.
        if let Some(stored) = stored_attempt(v.wl, &self.check_names[c]) {
            found.counts.stored_attempts += 1;
            if let Some(before) = ct.last_stored_attempt
                && stored < before
            {
                found.violations.push((
                    Invariant::AttemptsNeverDecrease,
                    format!("{short}: stored attempt {stored} after {before} at rv {rv}"),
                ));
            }
            ct.last_stored_attempt = Some(stored);
        }
        ct.state = Some(state_now);
    }

    fn watch_error(&self, e: &watcher::Error) {
        let mut state = lock(&self.state);
        state.counts.watch_errors += 1;
        eprintln!("multi_check: Workload watch error (it lists again): {e}");
    }

    /// Whether Workload `index` is at its scripted end state; a wrong end state is recorded as
    /// a (5) violation and ends the Workload too.
    fn check_end(&self, state: &mut State, index: usize, now: Instant) -> bool {
        let Some(end) = self.script.workloads.get(index).map(|w| w.end) else {
            return true;
        };
        let Some(track) = state.workloads.get_mut(&index) else {
            return false;
        };
        if track.ended.is_some() {
            return true;
        }
        let rejected_by = |c: usize| {
            track.checks.get(c).is_some_and(|t| t.rejected_seen)
                // After deactivating, Kueue evicts and resets the entry to Pending, saying so;
                // that message stands in for a Rejected version the watch might have missed.
                || track.last.as_ref().is_some_and(|wl| {
                    wl.admission_check(&self.check_names[c]).is_some_and(|e| {
                        e.message.ends_with("Previously: Rejected")
                    })
                })
        };
        let (reached, wrong) = match end {
            EndState::Admitted => (
                track.admitted_at.is_some(),
                track.deactivated_at.map(|_| "deactivated"),
            ),
            EndState::Deactivated { by } => (
                track.deactivated_at.is_some() && rejected_by(by),
                track.admitted_at.map(|_| "admitted"),
            ),
        };
        if let Some(wrong) = wrong {
            let what = format!("scripted to end {end:?}, but it was {wrong}");
            self.missed_end(Some(track), &mut state.violations, index, what, now);
            return true;
        }
        if !reached {
            return false;
        }
        track.ended = Some(now);
        match end {
            EndState::Admitted => state.counts.ended_admitted += 1,
            EndState::Deactivated { .. } => state.counts.ended_deactivated += 1,
        }
        true
    }

    /// A Workload that missed its bound: a (5) violation, and the run stops waiting for it.
    fn give_up(&self, state: &mut State, index: usize, bound: Duration, now: Instant) {
        let end = self.script.workloads.get(index).map(|w| w.end);
        let what = format!("not at its scripted end state {end:?} within its bound of {bound:?}");
        let track = state.workloads.get_mut(&index);
        self.missed_end(track, &mut state.violations, index, what, now);
    }

    /// Records a (5) violation on the Workload's timeline and in the list; the run stops
    /// waiting for it.
    fn missed_end(
        &self,
        track: Option<&mut WorkloadTrack>,
        violations: &mut Vec<Violation>,
        index: usize,
        what: String,
        now: Instant,
    ) {
        if let Some(track) = track {
            track
                .timeline
                .push(format!("{} VIOLATION (5) {what}", self.secs(now)));
            track.ended = Some(now);
        }
        violations.push(Violation {
            invariant: Invariant::EndStateInTime,
            workload: index,
            what,
        });
    }

    /// At the end: (3) the other way round, on each Workload's last version.
    fn final_checks(&self) {
        let mut state = lock(&self.state);
        let mut found = Vec::new();
        for (index, track) in &state.workloads {
            let Some(wl) = &track.last else { continue };
            let all_ready = self.check_names.iter().all(|name| {
                wl.admission_check(name)
                    .is_some_and(|e| e.state == CheckState::Ready)
            });
            if all_ready && holds_quota(wl) && !wl.condition_is_true(cond::ADMITTED) {
                found.push(Violation {
                    invariant: Invariant::AdmittedIffAllReady,
                    workload: *index,
                    what: format!(
                        "every entry Ready with quota at rv {}, yet not Admitted at the end",
                        track.last_rv
                    ),
                });
            }
        }
        state.violations.extend(found);
    }
}

impl Counts {
    fn add(&mut self, o: &Counts) {
        self.versions += o.versions;
        self.entries += o.entries;
        self.calls += o.calls;
        self.stored_attempts += o.stored_attempts;
        self.admitted_versions += o.admitted_versions;
        self.retries += o.retries;
        self.rejections += o.rejections;
        self.evictions += o.evictions;
        self.ended_admitted += o.ended_admitted;
        self.ended_deactivated += o.ended_deactivated;
        self.watch_errors += o.watch_errors;
    }
}

/// Starts the watch; returns once its first list is complete, so no version is missed.
async fn start_recorder(env: &TestEnv, recorder: Arc<Recorder>) -> Result<JoinHandle<()>> {
    let (ready, listed) = oneshot::channel::<()>();
    let stream = watcher(env.workloads(), watcher::Config::default()).default_backoff();
    let task = tokio::spawn(async move {
        let mut ready = Some(ready);
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Apply(wl) | watcher::Event::InitApply(wl)) => {
                    recorder.observe(&wl);
                }
                Ok(watcher::Event::InitDone) => {
                    if let Some(ready) = ready.take() {
                        let _ = ready.send(());
                    }
                }
                Ok(watcher::Event::Init | watcher::Event::Delete(_)) => {}
                Err(e) => recorder.watch_error(&e),
            }
        }
    });
    tokio::time::timeout(crate::DEFAULT_TIMEOUT, listed)
        .await
        .context("the Workload watch never completed its first list")?
        .context("the Workload watch ended")?;
    Ok(task)
}

// ---------------------------------------------------------------------------------------------
// The checks

/// An SDK check that answers from the script and reports every call to the recorder.
#[derive(Debug)]
pub struct ScriptedCheck {
    controller_name: String,
    index: usize,
    policy: RetryPolicy,
    script: Arc<Script>,
    recorder: Arc<Recorder>,
}

impl AdmissionCheckController for ScriptedCheck {
    type Parameters = NoParameters;
    type Error = std::convert::Infallible;

    fn controller_name(&self) -> &str {
        &self.controller_name
    }

    fn retry_policy(&self, _: &NoParameters) -> RetryPolicy {
        self.policy.clone()
    }

    async fn decide(
        &self,
        ctx: &CheckContext<'_, NoParameters>,
    ) -> Result<Decision, std::convert::Infallible> {
        let Some(workload) = index_of(ctx.workload) else {
            return Ok(Decision::pending("not a Workload of this run"));
        };
        let uid = ctx.workload.uid().unwrap_or_default();
        let rv = ctx.workload.resource_version().unwrap_or_default();
        let call = self
            .recorder
            .called(workload, &uid, self.index, ctx.attempt(), &rv);
        let step = self.script.step(workload, self.index, call);
        if !step.late.is_zero() {
            tokio::time::sleep(step.late).await;
        }
        Ok(step.answer.decision())
    }
}

// ---------------------------------------------------------------------------------------------
// A run

/// A run's settings, from the environment.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// `MULTI_CHECK_SEED` (decimal or 0x-hex); a fresh one when unset.
    pub seed: u64,
    /// `MULTI_CHECK_WORKLOADS`.
    pub workloads: usize,
    /// `MULTI_CHECK_IN_FLIGHT`: Workloads under way at once; the next Job is created when one
    /// reaches its end state, so a long run loads the control plane like a short one.
    pub in_flight: usize,
    /// `MULTI_CHECK_CHECKS` (2 or 3); the seed decides when unset.
    pub checks: Option<usize>,
}

fn env_var<T: std::str::FromStr>(name: &str) -> Result<Option<T>> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| anyhow::anyhow!("{name}={v:?} is not a valid value")),
        _ => Ok(None),
    }
}

fn parse_seed(v: &str) -> Option<u64> {
    let v = v.trim();
    match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => v.parse().ok(),
    }
}

impl RunConfig {
    /// From the environment, with `workloads` Workloads unless `MULTI_CHECK_WORKLOADS` says.
    pub fn from_env(workloads: usize) -> Result<Self> {
        let seed = match std::env::var("MULTI_CHECK_SEED") {
            Ok(v) if !v.trim().is_empty() => parse_seed(&v)
                .ok_or_else(|| anyhow::anyhow!("MULTI_CHECK_SEED={v:?} is not a number"))?,
            _ => fresh_seed(),
        };
        let workloads = env_var("MULTI_CHECK_WORKLOADS")?
            .unwrap_or(workloads)
            .max(1);
        let in_flight = env_var("MULTI_CHECK_IN_FLIGHT")?.unwrap_or(16).max(1);
        let checks: Option<usize> = env_var("MULTI_CHECK_CHECKS")?;
        if let Some(c) = checks
            && !(2..=3).contains(&c)
        {
            bail!("MULTI_CHECK_CHECKS must be 2 or 3, not {c}");
        }
        Ok(Self {
            seed,
            workloads,
            in_flight,
            checks,
        })
    }
}

fn fresh_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default();
    mix(nanos ^ (u64::from(std::process::id()) << 32))
}

/// What a run saw.
#[derive(Debug)]
pub struct Report {
    /// The settings.
    pub config: RunConfig,
    /// The script.
    pub script: Arc<Script>,
    /// Wall time of the run, from the first Job to the last end state.
    pub duration: Duration,
    /// How often each invariant was checked.
    pub counts: Counts,
    /// Every invariant broken.
    pub violations: Vec<Violation>,
    /// Per Workload: name, timeline, time to end state.
    timelines: BTreeMap<usize, (String, Vec<String>, Option<Duration>)>,
}

/// Runs the script against the shared control plane in a namespace of its own: the checks
/// and their queue, the recorder, the checks' runtimes, then the Jobs.
pub async fn run(test: &str, config: RunConfig) -> Result<Report> {
    let script = Arc::new(Script::generate(
        config.seed,
        config.workloads,
        config.checks,
    ));
    announce(&config, &script);
    let env = TestEnv::new(test).await?;
    let (check_names, controllers, cq) = create_checks(&env, &script, config.workloads).await?;
    let recorder = Arc::new(Recorder::new(script.clone(), check_names));
    let watch = start_recorder(&env, recorder.clone()).await?;
    let runtimes = start_checks(&env, &script, &recorder, controllers, config.in_flight);
    // The runtimes mark their checks Active; until all are, Kueue reserves nothing, and that
    // wait must not count against any Workload's bound.
    let cqs = Api::<ClusterQueue>::all(env.client.clone());
    crate::wait_for(cqs, &cq, "Active=True (every check Active)", |q| {
        q.status
            .as_ref()
            .is_some_and(|s| kueue_admission_sdk::api::is_condition_true(&s.conditions, "Active"))
    })
    .await?;

    let started = Instant::now();
    let result = drive(&env, &script, &recorder, config.in_flight).await;
    let duration = started.elapsed();
    recorder.final_checks();

    for runtime in runtimes {
        if let Err(e) = runtime.stop().await {
            eprintln!("multi_check: a check runtime: {e:#}");
        }
    }
    watch.abort();
    result?;
    Ok(Report::new(config, script, duration, &recorder))
}

/// The settings and the script's checks, first thing (the seed reproduces the run).
fn announce(config: &RunConfig, script: &Script) {
    println!(
        "multi_check: seed={} (0x{:x}) workloads={} in_flight={} checks={} limits={:?} policy delays={:?}\n\
         multi_check: reproduce with MULTI_CHECK_SEED={} MULTI_CHECK_WORKLOADS={}",
        config.seed,
        config.seed,
        config.workloads,
        config.in_flight,
        script.checks.len(),
        script
            .checks
            .iter()
            .map(|c| c.retry_limit)
            .collect::<Vec<_>>(),
        script
            .checks
            .iter()
            .map(|c| c.policy_delay)
            .collect::<Vec<_>>(),
        config.seed,
        config.workloads,
    );
}

/// One flavor, one ClusterQueue guarded by every check, room for every Workload at once
/// (admitted Jobs never finish here: no pods run). Returns the AdmissionChecks' names, their
/// controllers' names and the ClusterQueue's name.
async fn create_checks(
    env: &TestEnv,
    script: &Script,
    workloads: usize,
) -> Result<(Vec<String>, Vec<String>, String)> {
    let flavor = env.resource_flavor("default").await?.name_any();
    let mut check_names = Vec::new();
    let mut controllers = Vec::new();
    for spec in &script.checks {
        let controller = format!("e2e.kueue-admission-checks.dev/{}-{}", env.ns, spec.short);
        let name = env
            .admission_check(&spec.short, &controller)
            .await?
            .name_any();
        check_names.push(name);
        controllers.push(controller);
    }
    let refs: Vec<&str> = check_names.iter().map(String::as_str).collect();
    let quota = workloads.to_string();
    let cq = env.queues_on(&flavor, &quota, &refs).await?;
    Ok((check_names, controllers, cq))
}

/// Runs each scripted check with the SDK runtime, as its own `controllers` entry.
fn start_checks(
    env: &TestEnv,
    script: &Arc<Script>,
    recorder: &Arc<Recorder>,
    controllers: Vec<String>,
    in_flight: usize,
) -> Vec<crate::Running> {
    let mut runtimes = Vec::new();
    for (index, (spec, controller)) in script.checks.iter().zip(controllers).enumerate() {
        let check = ScriptedCheck {
            controller_name: controller,
            index,
            policy: spec.policy(),
            script: script.clone(),
            recorder: recorder.clone(),
        };
        let config = RuntimeConfig {
            field_manager: format!("e2e-{}-{}", env.ns, spec.short),
            // Late answers sleep inside a reconcile: enough room that no Workload waits for
            // another one's sleep.
            concurrency: u16::try_from(in_flight * 2).unwrap_or(u16::MAX),
            ..env.runtime_config()
        };
        runtimes.push(crate::Running::check(env.client.clone(), check, config));
    }
    runtimes
}

/// Creates the Jobs, at most `in_flight` under way at once, and waits until each Workload is
/// at its end state or past its bound.
async fn drive(
    env: &TestEnv,
    script: &Script,
    recorder: &Recorder,
    in_flight: usize,
) -> Result<()> {
    let total = script.workloads.len();
    let mut next = 0;
    let mut under_way: BTreeMap<usize, Instant> = BTreeMap::new();
    loop {
        // Register interest before looking, so a version observed meanwhile still wakes us.
        let changed = recorder.changed.notified();
        let now = Instant::now();
        {
            let mut state = lock(&recorder.state);
            under_way.retain(|&index, &mut deadline| {
                if recorder.check_end(&mut state, index, now) {
                    return false;
                }
                if now >= deadline {
                    let bound = script.time_bound(index);
                    recorder.give_up(&mut state, index, bound, now);
                    return false;
                }
                true
            });
        }
        if next == total && under_way.is_empty() {
            return Ok(());
        }
        while next < total && under_way.len() < in_flight {
            recorder.submitted(next);
            env.suspended_job(&job_name(next), "lq", "1").await?;
            under_way.insert(next, Instant::now() + script.time_bound(next));
            next += 1;
        }
        let earliest = under_way.values().min().copied();
        let wait = earliest
            .map(|d| d.saturating_duration_since(Instant::now()))
            .unwrap_or_default()
            .min(Duration::from_secs(1));
        let _ = tokio::time::timeout(wait, changed).await;
    }
}

impl Report {
    /// What `recorder` saw of a run of `script`.
    fn new(
        config: RunConfig,
        script: Arc<Script>,
        duration: Duration,
        recorder: &Recorder,
    ) -> Self {
        let state = lock(&recorder.state);
        let timelines = state
            .workloads
            .iter()
            .map(|(i, t)| {
                let took = t
                    .ended
                    .zip(t.submitted)
                    .map(|(end, start)| end.duration_since(start));
                (*i, (t.name.clone(), t.timeline.clone(), took))
            })
            .collect();
        Report {
            config,
            script,
            duration,
            counts: state.counts.clone(),
            violations: state.violations.clone(),
            timelines,
        }
    }

    /// The figures per invariant, as the table of `docs/reliability.md`.
    pub fn summary(&self) -> String {
        let c = &self.counts;
        let broken = |i: Invariant| self.violations.iter().filter(|v| v.invariant == i).count();
        let mut out = String::new();
        let _ = writeln!(
            out,
            "seed {} (0x{:x}), {} Workloads, {} checks (limits {:?}), in flight {}, {:.0} s",
            self.config.seed,
            self.config.seed,
            self.config.workloads,
            self.script.checks.len(),
            self.script
                .checks
                .iter()
                .map(|c| c.retry_limit)
                .collect::<Vec<_>>(),
            self.config.in_flight,
            self.duration.as_secs_f64()
        );
        let _ = writeln!(out, "| Invariant | Checked | Violations |");
        let _ = writeln!(out, "|---|---|---|");
        for (invariant, checked) in self.checked() {
            let _ = writeln!(
                out,
                "| ({}) {invariant:?} | {checked} | {} |",
                invariant.number(),
                broken(invariant)
            );
        }
        if c.watch_errors > 0 {
            let _ = writeln!(
                out,
                "({} watch errors: versions may have been missed)",
                c.watch_errors
            );
        }
        out
    }

    /// How often each invariant was checked, in the order of the table.
    fn checked(&self) -> [(Invariant, String); 5] {
        let c = &self.counts;
        let worst = self
            .timelines
            .iter()
            .filter_map(|(i, (_, _, took))| {
                Some(took.as_ref()?.as_secs_f64() / self.script.time_bound(*i).as_secs_f64())
            })
            .fold(0.0_f64, f64::max);
        let longest = self
            .timelines
            .values()
            .filter_map(|(_, _, took)| *took)
            .max()
            .unwrap_or_default();
        [
            (
                Invariant::NoAnswerWithoutQuota,
                format!("{} versions, {} entries", c.versions, c.entries),
            ),
            (
                Invariant::AttemptsNeverDecrease,
                format!(
                    "{} decide calls, {} stored attempts",
                    c.calls, c.stored_attempts
                ),
            ),
            (
                Invariant::AdmittedIffAllReady,
                format!("{} Admitted versions", c.admitted_versions),
            ),
            (
                Invariant::LimitsHonoured,
                format!(
                    "{} entries into Retry, {} Rejected, {} evictions",
                    c.retries, c.rejections, c.evictions
                ),
            ),
            (
                Invariant::EndStateInTime,
                format!(
                    "{} admitted, {} deactivated; longest {:.1} s, at most {:.0} % of its bound",
                    c.ended_admitted,
                    c.ended_deactivated,
                    longest.as_secs_f64(),
                    worst * 100.0
                ),
            ),
        ]
    }

    /// Fails with the seed, every violation and the timelines of the Workloads concerned
    /// (at most five); also fails a run that checked too little to mean anything.
    pub fn check(&self) -> Result<()> {
        let c = &self.counts;
        let hollow = [
            (c.versions == 0, "no Workload version was observed"),
            (c.calls == 0, "no check was ever called"),
            (c.retries == 0, "no entry was ever observed in Retry"),
            (c.evictions == 0, "no eviction was observed"),
            (c.ended_deactivated == 0, "no Workload ended deactivated"),
        ];
        let hollow: Vec<&str> = hollow
            .iter()
            .filter(|(bad, _)| *bad)
            .map(|(_, why)| *why)
            .collect();
        if self.violations.is_empty() && hollow.is_empty() {
            return Ok(());
        }
        let mut out = format!(
            "multi_check FAILED with seed {} (reproduce: MULTI_CHECK_SEED={} MULTI_CHECK_WORKLOADS={} \
             cargo test -p e2e --test multi_check -- --nocapture)\n",
            self.config.seed, self.config.seed, self.config.workloads
        );
        for why in hollow {
            let _ = writeln!(out, "HOLLOW RUN: {why}");
        }
        for v in &self.violations {
            let _ = writeln!(
                out,
                "VIOLATION ({}) {:?} on {}: {}",
                v.invariant.number(),
                v.invariant,
                job_name(v.workload),
                v.what
            );
        }
        let mut shown: Vec<usize> = self.violations.iter().map(|v| v.workload).collect();
        shown.sort_unstable();
        shown.dedup();
        for index in shown.iter().take(5) {
            let Some((name, timeline, _)) = self.timelines.get(index) else {
                continue;
            };
            let _ = writeln!(
                out,
                "\n--- Job {} (Workload {name}) ---\n{}",
                job_name(*index),
                self.script.describe(*index)
            );
            for line in timeline {
                let _ = writeln!(out, "  {line}");
            }
        }
        let _ = writeln!(out, "\n{}", self.summary());
        let _ = writeln!(out, "multi_check FAILED with seed {}", self.config.seed);
        bail!(out)
    }

    /// One line per Workload: end state, time taken, bound.
    pub fn per_workload(&self) -> String {
        let mut out = String::new();
        for (index, (name, _, took)) in &self.timelines {
            let end = self.script.workloads.get(*index).map(|w| w.end);
            let _ = writeln!(
                out,
                "  {} {name}: {end:?} after {}, bound {:.0} s",
                job_name(*index),
                took.map_or("-".into(), |t| format!("{:.1} s", t.as_secs_f64())),
                self.script.time_bound(*index).as_secs_f64()
            );
        }
        out
    }
}

/// Checks that the script keeps its own promises for `seed`: each Workload meant to be admitted
/// has at most the limit of `Retry` answers per check and ends `Ready`, a doomed check never
/// answers `Ready`, and a step depends on nothing but its coordinates.
pub fn check_script_promises(seed: u64, workloads: usize) -> Result<()> {
    let a = Script::generate(seed, workloads, None);
    let b = Script::generate(seed, workloads + 7, None);
    for w in 0..workloads {
        for (c, spec) in a.checks.iter().enumerate() {
            for call in 0..40 {
                if a.step(w, c, call) != b.step(w, c, call) {
                    bail!("step ({w}, {c}, {call}) depends on the number of Workloads");
                }
            }
            let script = &a.workloads[w].checks[c];
            let retries = script
                .steps
                .iter()
                .filter(|s| matches!(s.answer, Answer::Retry(_)))
                .count() as u32;
            let doomed = a.workloads[w].end == (EndState::Deactivated { by: c });
            if doomed {
                if script.steps.iter().any(|s| s.answer == Answer::Ready) {
                    bail!("doomed check {c} of Workload {w} answers Ready");
                }
                if script.then != Then::RetryForever {
                    bail!("doomed check {c} of Workload {w} stops retrying");
                }
            } else {
                if retries > spec.retry_limit {
                    bail!("check {c} of Workload {w} retries {retries} times, past its limit");
                }
                if script.then != Then::ReadyForever {
                    bail!("check {c} of Workload {w} does not end Ready");
                }
            }
        }
    }
    if !a.workloads.iter().any(|w| w.end != EndState::Admitted) {
        bail!("no Workload is scripted past a limit");
    }
    Ok(())
}

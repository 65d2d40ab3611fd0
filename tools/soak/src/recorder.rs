//! The soak's independent witness: watches of the run namespace's Workloads, ProvisioningRequests
//! and license ledger, kept apart from the controllers (it never reads their metrics or logs),
//! that check the invariants on every version they observe and keep each Workload's timeline.
//! The capacity-buffer check and the pods have witnesses of their own ([`super::buffers`],
//! [`super::pods`]) that report here.
//!
//! A watch that ends (the apiserver restarted) lists again; what changed in between is seen as
//! its end result only. A Workload missing from such a new list was deleted meanwhile.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use autoscaler_simulator::attempt_of_name;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use kueue_admission_sdk::api::{
    CheckState, ProvisioningRequest, Workload, workload_condition as cond,
};
use kueue_admission_sdk::attempts;
use kueue_provisioning_controller::identity::{CHECK_ANNOTATION, WORKLOAD_UID_LABEL};
use tokio::sync::watch;

use super::plan::{End, LICENSE_POOL, Plan, Queue};
use super::witness::LiveOnce;

/// The invariants, in the order of the results table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Invariant {
    /// Every Workload reaches its planned end state within [`END_BOUND`] of its submission.
    EndStateInTime,
    /// No Workload holds quota without progress for [`STALL_BOUND`].
    NotStuck,
    /// No entry of ours is `Retry` or `Ready` on a version without quota (finished ones aside).
    NoAnswerWithoutQuota,
    /// Per Workload uid and check, the attempt never decreases.
    AttemptsNeverDecrease,
    /// At most one live ProvisioningRequest per Workload uid, check and attempt.
    NoDuplicateRequests,
    /// Never more licenses booked, or held by admitted Workloads, than the pool has.
    NoDoubleBooking,
    /// Nothing of ours left once the Workloads are gone.
    NoLeaks,
    /// No controller panicked or exited unexpectedly.
    NoPanics,
    /// The controllers' metrics agree with what the recorder saw.
    MetricsAgree,
    /// Every pod of a Job runs on capacity provisioned for its own request (or none was needed).
    PodsOnTheirCapacity,
    /// No NodeClaim made for a Workload while the capacity-buffer check's entry stands `Ready`.
    NoCapacityTwice,
    /// No Node kept by the capacity-buffer check past the end its protection states, or past
    /// its Workload.
    ProtectionWithinBound,
}

impl Invariant {
    /// Every invariant.
    pub const ALL: [Invariant; 12] = [
        Invariant::EndStateInTime,
        Invariant::NotStuck,
        Invariant::NoAnswerWithoutQuota,
        Invariant::AttemptsNeverDecrease,
        Invariant::NoDuplicateRequests,
        Invariant::NoDoubleBooking,
        Invariant::NoLeaks,
        Invariant::NoPanics,
        Invariant::MetricsAgree,
        Invariant::PodsOnTheirCapacity,
        Invariant::NoCapacityTwice,
        Invariant::ProtectionWithinBound,
    ];

    /// Its line in the table.
    pub fn describe(self) -> &'static str {
        match self {
            Invariant::EndStateInTime => {
                "every Workload at its planned end state, within 600 s and 240 s of quota"
            }
            Invariant::NotStuck => "no Workload holding quota without progress",
            Invariant::NoAnswerWithoutQuota => "no Ready/Retry entry without quota",
            Invariant::AttemptsNeverDecrease => "attempts never decrease",
            Invariant::NoDuplicateRequests => "no duplicate live request per attempt",
            Invariant::NoDoubleBooking => "no double-booked license",
            Invariant::NoLeaks => "nothing leaked after the Workloads are gone",
            Invariant::NoPanics => "no panic, no unexpected exit",
            Invariant::MetricsAgree => "metrics agree with the recorder",
            Invariant::PodsOnTheirCapacity => {
                "every pod of a Job consumes a request provisioned for its own Workload, on its flavor's Nodes (none where no check asks); through the capacity-buffer check, on a Node Karpenter made for its own Workload"
            }
            Invariant::NoCapacityTwice => {
                "no NodeClaim made for a Workload while the capacity-buffer check's entry stands Ready"
            }
            Invariant::ProtectionWithinBound => {
                "no Node kept by the capacity-buffer check past its protection's end or its Workload"
            }
        }
    }
}

/// How long a Workload may hold quota, in all, before it reaches its end state: the checks'
/// share of its time (Kueue's queueing for quota between attempts is not counted). The slowest
/// planned paths: a doomed Workload through five attempts, each of which may straddle a leader
/// handover (a 6 s Lease, then a backlog) or an apiserver restart, held quota up to 190 s in the
/// soak; a licensed Workload losing the race for a license again and again (the license check
/// has no queue) up to 230 s, each lost race a few seconds of quota.
pub const QUOTA_BOUND: Duration = Duration::from_secs(240);

/// How long after its submission a Workload may take to reach its end state, queueing for quota
/// included (a doomed Workload waits its turn again after each of its five attempts).
pub const END_BOUND: Duration = Duration::from_secs(600);

/// How long a Workload may hold quota, unadmitted, without a new version. Every planned wait is
/// shorter (the provisioning timeout, a lease handover, a backoff), and so are three leader
/// generations in a row; the time of an outage (the apiserver or Kueue restarting, the simulator
/// paused) is not counted.
pub const STALL_BOUND: Duration = Duration::from_secs(90);

/// One broken invariant.
#[derive(Clone, Debug)]
pub struct Violation {
    /// Which.
    pub invariant: Invariant,
    /// The Workload (plan index), if one.
    pub workload: Option<usize>,
    /// Other Workloads whose timelines explain it (the holders of a double-booked pool).
    pub others: Vec<usize>,
    /// What was seen.
    pub what: String,
}

impl Violation {
    /// Its line: the invariant, the Workload's name (if one) and what was seen.
    pub fn line(&self, plan: &Plan) -> String {
        let who = self
            .workload
            .map(|i| plan.workloads[i].name())
            .unwrap_or_default();
        format!("{:?} {who}: {}", self.invariant, self.what)
    }
}

/// What the driver needs to know of a Workload, as observed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    /// The Workload's name (for a Job's, once Kueue made it).
    pub name: Option<String>,
    /// Admitted in its latest version.
    pub admitted: bool,
    /// When it was first seen admitted.
    pub first_admitted: Option<Instant>,
    /// Times it became admitted.
    pub admissions: u32,
    /// Deactivated after a `Rejected` entry.
    pub rejected: bool,
    /// `Finished=True`.
    pub finished: bool,
    /// Deleted (after having existed).
    pub deleted: bool,
}

#[derive(Debug, Default)]
struct Track {
    uid: String,
    last_rv: String,
    versions: u64,
    timeline: Vec<String>,
    last_change: Option<Instant>,
    holds_quota_unadmitted: bool,
    /// Attempt per (uid, check).
    attempts: HashMap<(String, String), u32>,
    submitted: Option<Instant>,
    ended: Option<(End, Instant)>,
    /// Since when it holds quota (in the latest version), and how long it held quota before.
    quota_since: Option<Instant>,
    quota_held: Duration,
    /// Quota held in all when it reached its end state.
    quota_at_end: Option<Duration>,
    rejected_by: Option<String>,
    /// Admitted by Kueue while an entry of a check guarding its queue was missing: these
    /// checks' (short names). Kueue's doing, not an answer of ours (docs/kueue-behaviour.md).
    admitted_without: Option<Vec<String>>,
}

/// Counters of what was checked (so that a table of zeros means something).
#[derive(Clone, Debug, Default)]
pub struct Counts {
    /// Workload versions observed.
    pub versions: u64,
    /// Entries of our checks checked against quota.
    pub entries: u64,
    /// Attempts read and compared.
    pub attempts: u64,
    /// ProvisioningRequest versions observed.
    pub requests: u64,
    /// Distinct requests seen.
    pub distinct_requests: u64,
    /// Ledger versions observed.
    pub ledger_versions: u64,
    /// Versions where the admitted licensed Workloads were counted.
    pub license_checks: u64,
    /// Highest licenses held by admitted Workloads at once.
    pub peak_licenses: u32,
    /// Admissions seen.
    pub admissions: u64,
    /// Admissions lost again (evicted after admission: revoked capacity).
    pub readmissions: u64,
    /// Admissions Kueue made while an entry of a check guarding the queue was missing.
    pub admitted_without_entry: u64,
    /// Rejections seen.
    pub rejections: u64,
    /// Stall checks made.
    pub stall_checks: u64,
    /// Longest time a Workload held quota without a new version (outages excluded).
    pub longest_stall: Duration,
    /// The Workload (index) that waited [`Counts::longest_stall`], to trace it in the logs.
    pub longest_stall_workload: Option<usize>,
    /// Watch errors (each followed by a new list).
    pub watch_errors: u64,
    /// Workloads found deleted by a new list rather than a delete event.
    pub deleted_while_away: u64,
}

struct State {
    tracks: Vec<Track>,
    /// Index by Workload name.
    by_name: HashMap<String, usize>,
    counts: Counts,
    violations: Vec<Violation>,
    /// Live requests, each keyed by (uid, check, attempt).
    requests: LiveOnce<(String, String, u32)>,
    seen_requests: BTreeSet<String>,
    /// Licenses held by admitted, unfinished Workloads of the licensed queue, by index.
    licensed_admitted: BTreeMap<usize, u32>,
    /// Workload names present in the list under way (to find those deleted while away).
    relisted: Option<BTreeSet<String>>,
    /// When the last outage ended (or is ongoing: `None` end).
    outage_until: Option<Instant>,
    outage_ongoing: u32,
}

/// The recorder; cheap to share.
pub struct Recorder {
    plan: Arc<Plan>,
    /// Full AdmissionCheck names of our three checks, by short name.
    checks: Vec<(String, String)>,
    licensed_check: String,
    started: Instant,
    state: Mutex<State>,
    observed: Vec<watch::Sender<Observed>>,
    /// Where plain Workloads evicted with their quota still reserved are announced.
    evicted_plain: Mutex<Option<tokio::sync::mpsc::UnboundedSender<String>>>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder").finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The plan index of a Workload: its own name (`w-NNNN`) or its Job's.
pub(crate) fn index_of(wl: &Workload) -> Option<usize> {
    let from = |name: &str| name.strip_prefix("w-").and_then(|n| n.parse().ok());
    from(&wl.name_any()).or_else(|| wl.owner_references().iter().find_map(|o| from(&o.name)))
}

fn holds_quota(wl: &Workload) -> bool {
    wl.condition_is_true(cond::QUOTA_RESERVED) || wl.condition_is_true(cond::ADMITTED)
}

fn deactivated(wl: &Workload) -> bool {
    wl.spec.active == Some(false)
}

/// One observed Workload version, as [`Recorder::observe`] reads it.
struct Version<'a> {
    wl: &'a Workload,
    /// Its plan index.
    index: usize,
    rv: String,
    uid: String,
    name: String,
    quota: bool,
    admitted: bool,
    finished: bool,
    /// Has a deletionTimestamp: Kueue has freed its quota and the checks release what they gave.
    deleting: bool,
}

impl Version<'_> {
    /// Its line in the timeline: conditions, whether active, our entries.
    fn timeline_line(&self, entries: &[String]) -> String {
        let conditions: Vec<&str> = [
            (cond::QUOTA_RESERVED, "quota"),
            (cond::ADMITTED, "admitted"),
            (cond::EVICTED, "evicted"),
            (cond::FINISHED, "finished"),
        ]
        .iter()
        .filter(|(c, _)| self.wl.condition_is_true(c))
        .map(|(_, s)| *s)
        .collect();
        format!(
            "rv {} {} [{}]{}{} {}",
            self.rv,
            self.name,
            conditions.join(","),
            if self.deleting { " deleting" } else { "" },
            if deactivated(self.wl) {
                " inactive"
            } else {
                ""
            },
            entries.join(" ")
        )
    }
}

/// How long a Workload held quota: a span opens with quota (unfinished) and adds up as it
/// closes; holding it unadmitted and active is what the stall sweep watches.
fn account_quota(t: &mut Track, v: &Version, now: Instant) {
    match (v.quota && !v.finished, t.quota_since) {
        (true, None) => t.quota_since = Some(now),
        (false, Some(since)) => {
            t.quota_held += now.duration_since(since);
            t.quota_since = None;
        }
        _ => {}
    }
    t.holds_quota_unadmitted = v.quota && !v.admitted && !v.finished && !deactivated(v.wl);
}

impl Recorder {
    /// A recorder for `plan`; `checks` are (short name, AdmissionCheck name) of the checks whose
    /// entries it checks, `licensed_check` the license check's name.
    pub fn new(plan: Arc<Plan>, checks: Vec<(String, String)>, licensed_check: String) -> Self {
        let n = plan.workloads.len();
        Self {
            plan,
            checks,
            licensed_check,
            started: Instant::now(),
            state: Mutex::new(State {
                tracks: (0..n).map(|_| Track::default()).collect(),
                by_name: HashMap::new(),
                counts: Counts::default(),
                violations: Vec::new(),
                requests: LiveOnce::default(),
                seen_requests: BTreeSet::new(),
                licensed_admitted: BTreeMap::new(),
                relisted: None,
                outage_until: None,
                outage_ongoing: 0,
            }),
            observed: (0..n)
                .map(|_| watch::channel(Observed::default()).0)
                .collect(),
            evicted_plain: Mutex::new(None),
        }
    }

    /// Announces on `to` the name of every Workload without an owner that Kueue evicted while
    /// it still reserves quota: for those, releasing the quota is the owner's part.
    pub fn on_evicted_plain(&self, to: tokio::sync::mpsc::UnboundedSender<String>) {
        *lock(&self.evicted_plain) = Some(to);
    }

    /// What the driver watches of Workload `index`.
    pub fn subscribe(&self, index: usize) -> watch::Receiver<Observed> {
        self.observed[index].subscribe()
    }

    fn at(&self) -> String {
        format!("{:>8.1}s", self.started.elapsed().as_secs_f64())
    }

    fn note(&self, state: &mut State, index: usize, line: String) {
        let at = self.at();
        state.tracks[index].timeline.push(format!("{at} {line}"));
    }

    fn violate(
        &self,
        state: &mut State,
        invariant: Invariant,
        workload: Option<usize>,
        what: String,
    ) {
        self.violate_among(state, invariant, workload, Vec::new(), what);
    }

    /// [`Self::violate`], naming `others` whose timelines the report shows beside.
    fn violate_among(
        &self,
        state: &mut State,
        invariant: Invariant,
        workload: Option<usize>,
        others: Vec<usize>,
        what: String,
    ) {
        let violation = Violation {
            invariant,
            workload,
            others,
            what,
        };
        if state.violations.len() < 20 {
            println!(
                "soak: {} VIOLATION {}",
                self.at(),
                violation.line(&self.plan)
            );
        }
        if let Some(i) = workload {
            let what = &violation.what;
            self.note(state, i, format!("VIOLATION {invariant:?}: {what}"));
        }
        state.violations.push(violation);
    }

    /// The driver submitted Workload `index`.
    pub fn submitted(&self, index: usize) {
        let mut state = lock(&self.state);
        state.tracks[index].submitted = Some(Instant::now());
        state.tracks[index].last_change = Some(Instant::now());
        self.note(&mut state, index, "submitted".into());
    }

    /// The driver's own account of a step (finished, deleted, a retried call), for the timeline.
    pub fn driver_note(&self, index: usize, what: &str) {
        let mut state = lock(&self.state);
        self.note(&mut state, index, format!("driver: {what}"));
    }

    /// A witness's account of something of Workload `index` (a NodeClaim made for it), for
    /// the timeline.
    pub fn witness_note(&self, index: usize, what: &str) {
        let mut state = lock(&self.state);
        self.note(&mut state, index, what.to_string());
    }

    /// An outage (apiserver or Kueue restarting, the simulator paused) begins.
    pub fn outage_begins(&self) {
        lock(&self.state).outage_ongoing += 1;
    }

    /// When the control plane was last whole again: `None` while an outage is under way, the
    /// recorder's start if none happened.
    pub fn calm_since(&self) -> Option<Instant> {
        let state = lock(&self.state);
        if state.outage_ongoing > 0 {
            return None;
        }
        Some(state.outage_until.unwrap_or(self.started))
    }

    /// It ended.
    pub fn outage_ends(&self) {
        let mut state = lock(&self.state);
        state.outage_ongoing = state.outage_ongoing.saturating_sub(1);
        state.outage_until = Some(Instant::now());
    }

    fn reach(&self, state: &mut State, index: usize, end: End) {
        if state.tracks[index].ended.is_some() {
            return;
        }
        let planned = self.plan.workloads[index].end;
        // Admitted is the way to Revoked, not the end of it.
        if planned == End::Revoked && end == End::Admitted {
            return;
        }
        let now = Instant::now();
        state.tracks[index].ended = Some((end, now));
        self.note(state, index, format!("END {end} (planned {planned})"));
        // A capacity revoked before the Workload was admitted rejects it too (so does Kueue's
        // built-in check): which of the two comes first is the machine's timing.
        let revoked_early = planned == End::Revoked && end == End::Rejected;
        if end == End::Admitted
            && end != planned
            && let Some(missing) = state.tracks[index].admitted_without.clone()
        {
            self.note(
                state,
                index,
                format!(
                    "not judged: Kueue admitted it with no entry of {} (reported apart)",
                    missing.join(", ")
                ),
            );
            return;
        }
        if end != planned && !revoked_early {
            self.violate(
                state,
                Invariant::EndStateInTime,
                Some(index),
                format!("ended {end}, planned {planned}"),
            );
            return;
        }
        let t = &mut state.tracks[index];
        let held = t.quota_held
            + t.quota_since
                .map_or(Duration::ZERO, |s| now.duration_since(s));
        t.quota_at_end = Some(held);
        if held > QUOTA_BOUND {
            self.violate(
                state,
                Invariant::EndStateInTime,
                Some(index),
                format!(
                    "{end} after holding quota for {held:.1?}, over the bound of {QUOTA_BOUND:?}"
                ),
            );
        }
        let took = state.tracks[index]
            .submitted
            .map_or(Duration::ZERO, |s| now.duration_since(s));
        if took > END_BOUND {
            self.violate(
                state,
                Invariant::EndStateInTime,
                Some(index),
                format!("{end} after {took:.1?}, over the bound of {END_BOUND:?}"),
            );
        }
    }

    /// One Workload version: the invariants it may break, its line in the timeline, and what
    /// the driver learns of it.
    fn observe(&self, wl: &Workload) {
        let Some(index) = index_of(wl).filter(|i| *i < self.plan.workloads.len()) else {
            return;
        };
        let v = Version {
            wl,
            index,
            rv: wl.resource_version().unwrap_or_default(),
            uid: wl.uid().unwrap_or_default(),
            name: wl.name_any(),
            quota: holds_quota(wl),
            admitted: wl.condition_is_true(cond::ADMITTED),
            finished: wl.condition_is_true(cond::FINISHED),
            deleting: wl.metadata.deletion_timestamp.is_some(),
        };
        let mut guard = lock(&self.state);
        let state = &mut *guard;
        let Some(now) = self.new_version(state, &v) else {
            return;
        };
        self.announce_evicted_plain(&v);
        let (entries, rejected_by) = self.check_entries(state, &v);
        self.note(state, index, v.timeline_line(&entries));
        if self.plan.workloads[index].queue == Queue::Licensed {
            self.count_licenses(state, &v);
        }
        let t = &mut state.tracks[index];
        account_quota(t, &v, now);
        let rejected = rejected_by.is_some() && deactivated(wl);
        if rejected && t.rejected_by.is_none() {
            t.rejected_by.clone_from(&rejected_by);
            state.counts.rejections += 1;
        }
        self.publish(state, &v, now, rejected);
    }

    /// Notes a version not seen before (a new list repeats the last one): when it was seen.
    fn new_version(&self, state: &mut State, v: &Version) -> Option<Instant> {
        if let Some(listed) = state.relisted.as_mut() {
            listed.insert(v.name.clone());
        }
        if state.tracks[v.index].last_rv == v.rv {
            return None;
        }
        state.by_name.insert(v.name.clone(), v.index);
        state.counts.versions += 1;
        let now = Instant::now();
        let t = &mut state.tracks[v.index];
        t.last_rv.clone_from(&v.rv);
        t.uid.clone_from(&v.uid);
        t.versions += 1;
        t.last_change = Some(now);
        Some(now)
    }

    /// An evicted Workload without an owner that still reserves quota goes to whoever plays
    /// its owner.
    fn announce_evicted_plain(&self, v: &Version) {
        if v.wl.owner_references().is_empty()
            && v.wl.condition_is_true(cond::EVICTED)
            && v.wl.condition_is_true(cond::QUOTA_RESERVED)
            && !v.finished
            && let Some(to) = lock(&self.evicted_plain).as_ref()
        {
            let _ = to.send(v.name.clone());
        }
    }

    /// Checks our checks' entries: none answers without quota, no attempt decreases. Returns
    /// the entries for the timeline and the check that rejected, if one did.
    fn check_entries(&self, state: &mut State, v: &Version) -> (Vec<String>, Option<String>) {
        let (index, rv) = (v.index, &v.rv);
        let mut entries = Vec::new();
        let mut rejected_by = None;
        for (short, check) in &self.checks {
            let Some(entry) = v.wl.admission_check(check) else {
                continue;
            };
            let attempt = attempts::attempt(v.wl, check);
            entries.push(format!(
                "{short}={}#{attempt}{}",
                entry.state,
                entry
                    .retry_count
                    .map_or(String::new(), |r| format!("(rc{r})"))
            ));
            if entry.state == CheckState::Rejected {
                rejected_by = Some(short.clone());
            }
            if !v.finished {
                state.counts.entries += 1;
                if matches!(entry.state, CheckState::Ready | CheckState::Retry) && !v.quota {
                    self.violate(
                        state,
                        Invariant::NoAnswerWithoutQuota,
                        Some(index),
                        format!("{short} is {} at rv {rv} without quota", entry.state),
                    );
                }
            }
            state.counts.attempts += 1;
            let key = (v.uid.clone(), short.clone());
            let before = state.tracks[index].attempts.insert(key, attempt);
            if let Some(before) = before.filter(|b| attempt < *b) {
                self.violate(
                    state,
                    Invariant::AttemptsNeverDecrease,
                    Some(index),
                    format!("{short}: attempt {attempt} after {before} at rv {rv}"),
                );
            }
        }
        (entries, rejected_by)
    }

    /// Double booking, as Workloads see it: licenses of admitted, unfinished Workloads not being
    /// deleted. A deleted Job's Workload stays admitted until Kueue removes its finalizer (seconds
    /// while Kueue restarts), but the license check releases it at once, as Kueue frees its quota.
    fn count_licenses(&self, state: &mut State, v: &Version) {
        let index = v.index;
        let holds = v.admitted
            && !v.finished
            && !v.deleting
            && v.wl.admission_check(&self.licensed_check).is_some();
        if holds {
            state
                .licensed_admitted
                .insert(index, self.plan.workloads[index].licenses);
        } else {
            state.licensed_admitted.remove(&index);
        }
        state.counts.license_checks += 1;
        let total: u32 = state.licensed_admitted.values().sum();
        state.counts.peak_licenses = state.counts.peak_licenses.max(total);
        if total > LICENSE_POOL {
            let holders: Vec<usize> = state.licensed_admitted.keys().copied().collect();
            let who: Vec<String> = holders
                .iter()
                .map(|i| self.plan.workloads[*i].name())
                .collect();
            self.violate_among(
                state,
                Invariant::NoDoubleBooking,
                Some(index),
                holders,
                format!(
                    "{total} licenses held by admitted Workloads at rv {}, pool {LICENSE_POOL}: {who:?}",
                    v.rv
                ),
            );
        }
    }

    /// Tells the driver what it waits for, counts admissions, and reaches an end state.
    fn publish(&self, state: &mut State, v: &Version, now: Instant, rejected: bool) {
        let mut end = None;
        self.observed[v.index].send_modify(|o| {
            o.name = Some(v.name.clone());
            if v.admitted && !o.admitted {
                o.admissions += 1;
                o.first_admitted.get_or_insert(now);
                end = Some(End::Admitted);
            }
            o.admitted = v.admitted;
            o.finished |= v.finished;
            o.rejected |= rejected;
            if rejected {
                end = Some(if o.admissions > 0 {
                    End::Revoked
                } else {
                    End::Rejected
                });
            }
        });
        let admissions = self.observed[v.index].borrow().admissions;
        if end == Some(End::Admitted) {
            state.counts.admissions += 1;
            if admissions > 1 {
                state.counts.readmissions += 1;
            }
            self.note_admission_without_entry(state, v);
        }
        if let Some(end) = end {
            self.reach(state, v.index, end);
        }
    }

    /// An admission while a check guarding the queue has no entry on the Workload: none of our
    /// checks answered it, Kueue admitted it on its own (seen when Kueue restarted between a
    /// reservation and writing the entries). Noted, counted and reported apart; the Workload's
    /// end state is then Kueue's, not a violation of ours.
    fn note_admission_without_entry(&self, state: &mut State, v: &Version) {
        let queue = self.plan.workloads[v.index].queue;
        let missing: Vec<String> = queue
            .guarded_by()
            .iter()
            .filter(|short| {
                let check = self
                    .checks
                    .iter()
                    .find(|(s, _)| s == *short)
                    .map(|(_, c)| c);
                check.is_none_or(|c| v.wl.admission_check(c).is_none())
            })
            .map(|s| (*s).to_string())
            .collect();
        if missing.is_empty() {
            return;
        }
        state.counts.admitted_without_entry += 1;
        println!(
            "soak: {} {} admitted by Kueue with no entry of {} (rv {}): not an answer of ours",
            self.at(),
            self.plan.workloads[v.index].name(),
            missing.join(", "),
            v.rv
        );
        self.note(
            state,
            v.index,
            format!(
                "admitted by Kueue with no entry of {}: not an answer of ours",
                missing.join(", ")
            ),
        );
        state.tracks[v.index].admitted_without = Some(missing);
    }

    fn deleted(&self, state: &mut State, name: &str, how: &str) {
        let Some(&index) = state.by_name.get(name) else {
            return;
        };
        self.note(state, index, format!("{name} deleted ({how})"));
        state.licensed_admitted.remove(&index);
        state.tracks[index].holds_quota_unadmitted = false;
        self.observed[index].send_modify(|o| {
            o.deleted = true;
            o.admitted = false;
        });
        if self.plan.workloads[index].end == End::Deleted {
            self.reach(state, index, End::Deleted);
        }
    }

    /// The driver knows a Workload was never created (its Job deleted before Kueue made one).
    pub fn never_created(&self, index: usize) {
        let mut state = lock(&self.state);
        self.note(
            &mut state,
            index,
            "never created (Job deleted first)".into(),
        );
        self.observed[index].send_modify(|o| o.deleted = true);
        if self.plan.workloads[index].end == End::Deleted {
            self.reach(&mut state, index, End::Deleted);
        }
    }

    fn workload_event(&self, event: watcher::Event<Workload>) {
        match event {
            watcher::Event::Apply(wl) | watcher::Event::InitApply(wl) => self.observe(&wl),
            watcher::Event::Delete(wl) => {
                let mut state = lock(&self.state);
                self.deleted(&mut state, &wl.name_any(), "delete event");
            }
            watcher::Event::Init => lock(&self.state).relisted = Some(BTreeSet::new()),
            watcher::Event::InitDone => {
                let mut guard = lock(&self.state);
                let state = &mut *guard;
                let Some(listed) = state.relisted.take() else {
                    return;
                };
                let gone: Vec<String> = state
                    .by_name
                    .keys()
                    .filter(|n| !listed.contains(*n))
                    .filter(|n| !self.observed[state.by_name[*n]].borrow().deleted)
                    .cloned()
                    .collect();
                for name in gone {
                    state.counts.deleted_while_away += 1;
                    self.deleted(state, &name, "missing from a new list");
                }
            }
        }
    }

    fn request_event(&self, event: watcher::Event<ProvisioningRequest>) {
        let mut guard = lock(&self.state);
        let state = &mut *guard;
        match event {
            watcher::Event::Apply(pr) | watcher::Event::InitApply(pr) => {
                state.counts.requests += 1;
                let name = pr.name_any();
                if state.seen_requests.insert(name.clone()) {
                    state.counts.distinct_requests += 1;
                }
                let uid = pr
                    .labels()
                    .get(WORKLOAD_UID_LABEL)
                    .cloned()
                    .unwrap_or_default();
                let check = pr
                    .annotations()
                    .get(CHECK_ANNOTATION)
                    .cloned()
                    .unwrap_or_default();
                let key = (uid, check, attempt_of_name(&name));
                let twins = state.requests.insert(&name, key.clone());
                if !twins.is_empty() {
                    let index = pr
                        .annotations()
                        .get(kueue_provisioning_controller::identity::WORKLOAD_ANNOTATION)
                        .and_then(|w| state.by_name.get(w).copied());
                    self.violate(
                        state,
                        Invariant::NoDuplicateRequests,
                        index,
                        format!("request {name} is live beside {twins:?} for {key:?}"),
                    );
                }
            }
            watcher::Event::Delete(pr) => {
                state.requests.remove(&pr.name_any());
            }
            // A new list replaces what was live.
            watcher::Event::Init => state.requests.clear(),
            watcher::Event::InitDone => {}
        }
    }

    fn ledger_event(&self, event: watcher::Event<ConfigMap>) {
        let (watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) = event else {
            return;
        };
        let mut guard = lock(&self.state);
        let state = &mut *guard;
        state.counts.ledger_versions += 1;
        let data = cm.data.unwrap_or_default();
        match license_check::ledger::Ledger::from_config_map_data(&data) {
            Ok(ledger) => {
                let in_use = ledger.in_use().get("solver").copied().unwrap_or(0);
                if in_use > LICENSE_POOL {
                    self.violate(
                        state,
                        Invariant::NoDoubleBooking,
                        None,
                        format!(
                            "ledger version {:?} books {in_use} solver licenses of {LICENSE_POOL}",
                            cm.metadata.resource_version
                        ),
                    );
                }
            }
            Err(e) => self.violate(
                state,
                Invariant::NoDoubleBooking,
                None,
                format!("a ledger version that cannot be read: {e}"),
            ),
        }
    }

    /// Counts a watch's error (the watch lists again); the first few are printed.
    pub fn watch_error(&self, what: &str, e: &watcher::Error) {
        let mut state = lock(&self.state);
        state.counts.watch_errors += 1;
        if state.counts.watch_errors <= 5 {
            eprintln!("soak recorder: the {what} watch failed (it lists again): {e}");
        }
    }

    /// Checks every Workload holding quota unadmitted for progress; call periodically.
    pub fn check_stalls(&self) {
        let mut guard = lock(&self.state);
        let state = &mut *guard;
        if state.outage_ongoing > 0 {
            return;
        }
        let now = Instant::now();
        state.counts.stall_checks += 1;
        let mut stuck = Vec::new();
        for (i, t) in state.tracks.iter().enumerate() {
            if !t.holds_quota_unadmitted || t.ended.is_some() {
                continue;
            }
            let since = t.last_change.into_iter().chain(state.outage_until).max();
            let Some(since) = since else { continue };
            let stalled = now.duration_since(since);
            if stalled > state.counts.longest_stall {
                state.counts.longest_stall = stalled;
                state.counts.longest_stall_workload = Some(i);
            }
            if stalled > STALL_BOUND {
                stuck.push((i, stalled));
            }
        }
        for (i, stalled) in stuck {
            // Once per Workload: its progress clock restarts so it is not counted again and again.
            state.tracks[i].last_change = Some(now);
            self.violate(
                state,
                Invariant::NotStuck,
                Some(i),
                format!("holds quota unadmitted, no new version for {stalled:.0?}"),
            );
        }
    }

    /// Records a violation found outside the watches (leaks, panics, metrics).
    pub fn record(&self, invariant: Invariant, workload: Option<usize>, what: String) {
        let mut state = lock(&self.state);
        self.violate(&mut state, invariant, workload, what);
    }

    /// Workloads not at an end state; each is recorded as an [`Invariant::EndStateInTime`]
    /// violation. Call once, when the run stops waiting.
    pub fn give_up_on_unfinished(&self) -> usize {
        let mut guard = lock(&self.state);
        let state = &mut *guard;
        let open: Vec<usize> = (0..state.tracks.len())
            .filter(|i| state.tracks[*i].ended.is_none())
            .collect();
        for &i in &open {
            let planned = self.plan.workloads[i].end;
            self.violate(
                state,
                Invariant::EndStateInTime,
                Some(i),
                format!("never reached its planned end state ({planned})"),
            );
        }
        open.len()
    }

    /// Workloads seen `Finished=True`.
    pub fn finished_count(&self) -> usize {
        self.observed.iter().filter(|o| o.borrow().finished).count()
    }

    /// Whether Workload `index` was ever seen admitted.
    pub fn was_admitted(&self, index: usize) -> bool {
        self.observed[index].borrow().first_admitted.is_some()
    }

    /// Workloads (plan indices) Kueue admitted while an entry of a check guarding their queue
    /// was missing, with those checks' short names.
    pub fn admitted_without_entry(&self) -> Vec<(usize, Vec<String>)> {
        let state = lock(&self.state);
        state
            .tracks
            .iter()
            .enumerate()
            .filter_map(|(i, t)| t.admitted_without.clone().map(|m| (i, m)))
            .collect()
    }

    /// Whether Workload `index` reached its end state.
    pub fn ended(&self, index: usize) -> bool {
        lock(&self.state).tracks[index].ended.is_some()
    }

    /// Live requests the recorder knows of.
    pub fn live_requests(&self) -> usize {
        lock(&self.state).requests.len()
    }

    /// What was checked so far.
    pub fn counts(&self) -> Counts {
        lock(&self.state).counts.clone()
    }

    /// Every violation so far.
    pub fn violations(&self) -> Vec<Violation> {
        lock(&self.state).violations.clone()
    }

    /// Time to end state per end, in seconds: (end, sorted durations).
    pub fn times_to_end(&self) -> BTreeMap<End, Vec<f64>> {
        let state = lock(&self.state);
        let mut out: BTreeMap<End, Vec<f64>> = BTreeMap::new();
        for t in &state.tracks {
            if let (Some((end, at)), Some(s)) = (t.ended, t.submitted) {
                out.entry(end)
                    .or_default()
                    .push(at.duration_since(s).as_secs_f64());
            }
        }
        for v in out.values_mut() {
            v.sort_by(f64::total_cmp);
        }
        out
    }

    /// Quota held before the end state, in seconds, sorted.
    pub fn quota_held_to_end(&self) -> Vec<f64> {
        let state = lock(&self.state);
        let mut v: Vec<f64> = state
            .tracks
            .iter()
            .filter_map(|t| t.quota_at_end.map(|d| d.as_secs_f64()))
            .collect();
        v.sort_by(f64::total_cmp);
        v
    }

    /// The timeline of Workload `index`.
    pub fn timeline(&self, index: usize) -> String {
        let state = lock(&self.state);
        let mut out = String::new();
        let w = &self.plan.workloads[index];
        let _ = writeln!(
            out,
            "{} (queue {}, {:?}, script {:?}, licenses {}, planned {}):",
            w.name(),
            w.queue.name(),
            w.shape,
            w.script,
            w.licenses,
            w.end
        );
        for line in &state.tracks[index].timeline {
            let _ = writeln!(out, "  {line}");
        }
        out
    }
}

/// Starts the three watches; returns once each has listed, so no version is missed.
pub async fn start(
    recorder: Arc<Recorder>,
    client: &Client,
    namespace: &str,
    ledger: &str,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let (ready, mut ready_rx) = tokio::sync::mpsc::channel::<()>(3);
    let mut watches = Watches {
        recorder,
        ready,
        tasks: Vec::new(),
    };
    let all = watcher::Config::default;
    let workloads: Api<Workload> = Api::namespaced(client.clone(), namespace);
    watches.spawn(workloads, all(), "Workload", Recorder::workload_event);
    let requests: Api<ProvisioningRequest> = Api::namespaced(client.clone(), namespace);
    watches.spawn(
        requests,
        all(),
        "ProvisioningRequest",
        Recorder::request_event,
    );
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let the_ledger = all().fields(&format!("metadata.name={ledger}"));
    watches.spawn(maps, the_ledger, "ledger", Recorder::ledger_event);
    for _ in 0..3 {
        tokio::time::timeout(e2e::DEFAULT_TIMEOUT, ready_rx.recv())
            .await
            .map_err(|_| anyhow::anyhow!("a recorder watch never completed its first list"))?;
    }
    Ok(watches.tasks)
}

/// The recorder's watches as they are started.
struct Watches {
    recorder: Arc<Recorder>,
    /// Sent on once by each watch, when its first list is done.
    ready: tokio::sync::mpsc::Sender<()>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Watches {
    /// Watches `api` with `config`: every event goes to `handle`, every error is counted as one
    /// of `what`'s.
    fn spawn<K>(
        &mut self,
        api: Api<K>,
        config: watcher::Config,
        what: &'static str,
        handle: fn(&Recorder, watcher::Event<K>),
    ) where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    {
        let (on_event, on_error) = (self.recorder.clone(), self.recorder.clone());
        self.tasks.push(crate::witness::spawn(
            api,
            config,
            self.ready.clone(),
            move |event| handle(&on_event, event),
            move |e| on_error.watch_error(what, e),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Shape, WorkloadPlan};

    /// One unplaceable Workload of the buffered queue, planned `Rejected`.
    fn recorder() -> Recorder {
        let w = WorkloadPlan {
            index: 0,
            queue: Queue::Buffered,
            shape: Shape::Plain { counts: vec![1] },
            script: String::new(),
            licenses: 0,
            submit_at: Duration::ZERO,
            hold: Duration::from_secs(5),
            delete_after: None,
            unplaceable: true,
            end: End::Rejected,
        };
        let plan = Plan {
            seed: 1,
            workloads: vec![w],
            faults: Vec::new(),
            load_duration: Duration::from_secs(1),
        };
        let checks = vec![("buffer".to_string(), "cb".to_string())];
        Recorder::new(Arc::new(plan), checks, "license".into())
    }

    /// Workload `w-0000` at `rv`, with these true conditions and entries (name, state).
    fn version(rv: u32, conditions: &[&str], entries: &[(&str, &str)]) -> Workload {
        let conditions: Vec<_> = conditions
            .iter()
            .map(|c| {
                serde_json::json!({"type": c, "status": "True", "reason": "R", "message": "",
                    "lastTransitionTime": "2026-11-30T00:00:00Z"})
            })
            .collect();
        let entries: Vec<_> = entries
            .iter()
            .map(|(n, s)| {
                serde_json::json!({"name": n, "state": s, "message": "",
                    "lastTransitionTime": "2026-11-30T00:00:00Z"})
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "metadata": {"name": "w-0000", "namespace": "soak", "uid": "u", "resourceVersion": rv.to_string()},
            "spec": {"queueName": "buffer", "podSets": []},
            "status": {"conditions": conditions, "admissionChecks": entries},
        }))
        .expect("a Workload")
    }

    fn feed(r: &Recorder, versions: &[Workload]) {
        for v in versions {
            r.workload_event(watcher::Event::Apply(v.clone()));
        }
    }

    #[test]
    fn an_admission_without_the_checks_entry_is_kueues_and_reported_apart() {
        let r = recorder();
        feed(
            &r,
            &[
                version(1, &[], &[]),
                version(2, &["QuotaReserved"], &[]),
                version(3, &["QuotaReserved", "Admitted"], &[]),
            ],
        );
        assert!(r.violations().is_empty(), "{:?}", r.violations());
        assert_eq!(
            r.admitted_without_entry(),
            vec![(0, vec!["buffer".to_string()])]
        );
        assert_eq!(r.counts().admitted_without_entry, 1);
        assert!(r.timeline(0).contains("not judged"), "{}", r.timeline(0));
    }

    #[test]
    fn an_admission_with_the_checks_entry_ready_is_judged() {
        let r = recorder();
        feed(
            &r,
            &[
                version(1, &["QuotaReserved"], &[("cb", "Pending")]),
                version(2, &["QuotaReserved", "Admitted"], &[("cb", "Ready")]),
            ],
        );
        let v = r.violations();
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].invariant, Invariant::EndStateInTime);
        assert!(
            v[0].what.contains("ended admitted, planned rejected"),
            "{v:?}"
        );
        assert!(r.admitted_without_entry().is_empty());
    }
}

//! The pure part of `explain`: from what was read about a Workload ([`Snapshot`]) to where it
//! stands and what would move it ([`Report`]). No I/O, no clock: the time is passed in.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use kueue_admission_sdk::FlavorRule;
use kueue_admission_sdk::api::{
    AdmissionCheck, AdmissionCheckState, CheckState, ClusterQueue, ProvisioningRequest,
    ProvisioningRequestConfig, Workload, find_condition, workload_condition as cond,
};
use kueue_admission_sdk::attempts;
use kueue_provisioning_controller::identity::{ATTEMPT_ANNOTATION, CHECK_ANNOTATION};
use serde::Serialize;

/// Kueue's default `retryStrategy.backoffLimitCount` of a ProvisioningRequestConfig.
const KUEUE_DEFAULT_BACKOFF_LIMIT: i32 = 3;
/// How many of the Workload's Events the report keeps (the newest).
pub const RECENT_EVENTS: usize = 10;

/// Everything `explain` read about one Workload.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// The Workload.
    pub workload: Workload,
    /// The Job (or other object) that owns it, as `kind/name`.
    pub owner: Option<String>,
    /// The ClusterQueue its LocalQueue feeds (from the admission, or the LocalQueue).
    pub cluster_queue_name: Option<String>,
    /// That ClusterQueue, if it exists.
    pub cluster_queue: Option<ClusterQueue>,
    /// Whether the LocalQueue the Workload names exists (`None`: not looked up).
    pub local_queue_exists: Option<bool>,
    /// The AdmissionChecks named by its entries, by name (absent: not found).
    pub admission_checks: BTreeMap<String, AdmissionCheck>,
    /// The ProvisioningRequestConfigs those checks name, by check.
    pub provisioning_configs: BTreeMap<String, ProvisioningRequestConfig>,
    /// ProvisioningRequests made for this Workload (ours by uid label, Kueue's by owner).
    pub provisioning_requests: Vec<ProvisioningRequest>,
    /// Names of the PodTemplates made for it.
    pub pod_templates: Vec<String>,
    /// Events about the Workload.
    pub events: Vec<Event>,
}

/// Where a Workload stands, in one word.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Phase {
    /// Its job finished.
    Finished,
    /// `spec.active: false` (a rejection, a user, a limit).
    Deactivated,
    /// Admitted: its pods may run.
    Admitted,
    /// Holding quota, waiting for admission checks.
    WaitingForChecks,
    /// Evicted or requeued after a `Retry`, waiting to be considered again.
    Requeued,
    /// Waiting for quota.
    WaitingForQuota,
}

/// The report `explain` prints.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub namespace: String,
    pub workload: String,
    pub owner: Option<String>,
    pub phase: Phase,
    pub local_queue: Option<String>,
    pub cluster_queue: Option<String>,
    pub quota: Quota,
    pub requeue: Option<Requeue>,
    /// Kueue's evictions of the Workload, by reason (`status.schedulingStats.evictions`).
    pub evictions: Vec<EvictionReport>,
    pub checks: Vec<CheckReport>,
    pub provisioning_requests: Vec<RequestReport>,
    pub pod_templates: Vec<String>,
    pub events: Vec<EventReport>,
    /// One line: what would move the Workload.
    pub advice: String,
}

/// Quota: reserved or not, and where.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Quota {
    pub reserved: bool,
    /// Flavors by podset and resource, while reserved.
    pub flavors: BTreeMap<String, BTreeMap<String, String>>,
    /// Kueue's reason while not reserved (the `QuotaReserved` condition's message).
    pub waiting_reason: Option<String>,
}

/// When Kueue considers the Workload again after an eviction or a `Retry`.
///
/// Not `requeueState.count`: Kueue counts only waitForPodsReady requeues there, and clears it
/// on deactivation; the evictions are in [`Report::evictions`].
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Requeue {
    /// The latest of `status.requeueState.requeueAt` and, over the entries in `Retry`, their
    /// `lastTransitionTime + requeueAfterSeconds`: Kueue waits for the longest delay.
    pub at: Option<Timestamp>,
}

/// How often Kueue evicted the Workload for one reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EvictionReport {
    pub reason: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub underlying_cause: String,
    pub count: i32,
}

/// One admission check of the Workload.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckReport {
    pub name: String,
    /// The AdmissionCheck's `spec.controllerName` (`None`: the check does not exist).
    pub controller: Option<String>,
    /// Its `Active` condition: status and message.
    pub active: Option<bool>,
    pub active_message: Option<String>,
    pub state: CheckState,
    pub message: String,
    pub since: Option<Timestamp>,
    /// The attempt being decided (1 for the first), from the SDK's record or `retryCount`.
    pub attempt: u32,
    pub retry_count: Option<i32>,
    /// Retries allowed, when known (a ProvisioningRequestConfig's `backoffLimitCount`).
    pub retry_limit: Option<i32>,
    /// After a `Retry`: when Kueue evicts and requeues the Workload, the end of the longest
    /// delay of all its entries in `Retry` (Kueue waits for every one of them).
    pub next_attempt_at: Option<Timestamp>,
    /// After a delayed `Retry`: the end of this check's own delay
    /// (`lastTransitionTime + requeueAfterSeconds`).
    pub delay_ends_at: Option<Timestamp>,
    /// After a delayed `Retry`: Kueue keeps the quota until `next_attempt_at`.
    pub quota_held_until_retry: bool,
}

/// One ProvisioningRequest made for the Workload.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestReport {
    pub name: String,
    pub check: Option<String>,
    pub attempt: Option<String>,
    /// `type=status (reason: message)` for each condition.
    pub conditions: Vec<String>,
    /// The newest true one of `Failed`, `Provisioned`, `BookingExpired`, `CapacityRevoked`,
    /// else `Accepted` or nothing: what the autoscaler last said.
    pub outcome: Option<String>,
}

/// One Event about the Workload.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EventReport {
    pub time: Option<Timestamp>,
    #[serde(rename = "type")]
    pub type_: String,
    pub reason: String,
    pub note: String,
    pub count: i32,
}

/// Builds the report for `snapshot` at `now`.
pub fn report(snapshot: &Snapshot, now: Timestamp) -> Report {
    let wl = &snapshot.workload;
    let reserved = wl.condition_is_true(cond::QUOTA_RESERVED);
    let admission = wl.status.as_ref().and_then(|s| s.admission.as_ref());
    let quota = Quota {
        reserved,
        flavors: admission
            .filter(|_| reserved)
            .map(|a| {
                a.pod_set_assignments
                    .iter()
                    .map(|p| (p.name.clone(), p.flavors.clone()))
                    .collect()
            })
            .unwrap_or_default(),
        waiting_reason: (!reserved)
            .then(|| wl.condition(cond::QUOTA_RESERVED))
            .flatten()
            .map(|c| c.message.clone())
            .filter(|m| !m.is_empty()),
    };
    let requeue_at = requeue_at(wl);
    let requeue = requeue_at.map(|at| Requeue { at: Some(at) });
    let checks: Vec<CheckReport> = wl
        .status
        .as_ref()
        .map(|s| s.admission_checks.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|entry| check_report(snapshot, entry, requeue_at, now))
        .collect();
    let mut requests: Vec<RequestReport> = snapshot
        .provisioning_requests
        .iter()
        .map(request_report)
        .collect();
    requests.sort_by(|a, b| a.name.cmp(&b.name));
    let mut events: Vec<EventReport> = snapshot.events.iter().map(event_report).collect();
    events.sort_by_key(|e| e.time);
    let skip = events.len().saturating_sub(RECENT_EVENTS);
    let events = events.split_off(skip);
    let phase = phase(wl);
    let mut report = Report {
        namespace: wl.namespace().unwrap_or_default(),
        workload: wl.name_any(),
        owner: snapshot.owner.clone(),
        phase,
        local_queue: wl.spec.queue_name.clone(),
        cluster_queue: admission
            .map(|a| a.cluster_queue.clone())
            .or_else(|| snapshot.cluster_queue_name.clone()),
        quota,
        requeue,
        evictions: evictions(wl),
        checks,
        provisioning_requests: requests,
        pod_templates: snapshot.pod_templates.clone(),
        events,
        advice: String::new(),
    };
    report.advice = advice(snapshot, &report, now);
    report
}

/// When Kueue requeues the Workload: the latest of `status.requeueState.requeueAt` and, over
/// the entries in `Retry` with both fields, `lastTransitionTime + requeueAfterSeconds` (Kueue
/// moves `requeueAt` forward to the largest, never back).
pub fn requeue_at(wl: &Workload) -> Option<Timestamp> {
    let entries = wl
        .status
        .as_ref()
        .map(|s| s.admission_checks.as_slice())
        .unwrap_or_default();
    entries
        .iter()
        .filter(|e| e.state == CheckState::Retry)
        .filter_map(delay_end)
        .chain(wl.requeue_at())
        .max()
}

/// `lastTransitionTime + requeueAfterSeconds` of an entry that has both.
fn delay_end(entry: &AdmissionCheckState) -> Option<Timestamp> {
    let since = entry.last_transition_time.as_ref()?.0;
    let delay = i64::from(entry.requeue_after_seconds?.max(0));
    since.checked_add(SignedDuration::from_secs(delay)).ok()
}

/// One entry of the Workload, with what its AdmissionCheck and config say.
fn check_report(
    snapshot: &Snapshot,
    entry: &AdmissionCheckState,
    requeue_at: Option<Timestamp>,
    now: Timestamp,
) -> CheckReport {
    let wl = &snapshot.workload;
    let reserved = wl.condition_is_true(cond::QUOTA_RESERVED);
    let ac = snapshot.admission_checks.get(&entry.name);
    let active = ac.and_then(AdmissionCheck::active_condition);
    let retrying = entry.state == CheckState::Retry;
    // Without a delay of its own, Kueue requeues at once: the time is its own transition.
    let delay_ends_at = retrying
        .then(|| delay_end(entry).or(entry.last_transition_time.as_ref().map(|t| t.0)))
        .flatten();
    let next_attempt_at = retrying.then(|| delay_ends_at.max(requeue_at)).flatten();
    CheckReport {
        name: entry.name.clone(),
        controller: ac.map(|ac| ac.spec.controller_name.clone()),
        active: active.map(|c| c.status == "True"),
        active_message: active.map(|c| c.message.clone()),
        state: entry.state,
        message: entry.message.clone(),
        since: entry.last_transition_time.as_ref().map(|t| t.0),
        attempt: attempts::attempt(wl, &entry.name),
        retry_count: entry.retry_count,
        retry_limit: snapshot.provisioning_configs.get(&entry.name).map(|c| {
            c.spec
                .retry_strategy
                .as_ref()
                .and_then(|r| r.backoff_limit_count)
                .unwrap_or(KUEUE_DEFAULT_BACKOFF_LIMIT)
        }),
        quota_held_until_retry: reserved
            && next_attempt_at.is_some_and(|at| at > now)
            && !wl.condition_is_true(cond::EVICTED),
        next_attempt_at,
        delay_ends_at,
    }
}

/// Kueue's evictions of the Workload, by reason and underlying cause.
fn evictions(wl: &Workload) -> Vec<EvictionReport> {
    wl.status
        .as_ref()
        .and_then(|s| s.scheduling_stats.as_ref())
        .map(|s| {
            s.evictions
                .iter()
                .map(|e| EvictionReport {
                    reason: e.reason.clone(),
                    underlying_cause: e.underlying_cause.clone(),
                    count: e.count,
                })
                .collect()
        })
        .unwrap_or_default()
}

fn phase(wl: &Workload) -> Phase {
    if wl.condition_is_true(cond::FINISHED) {
        Phase::Finished
    } else if !wl.is_active() {
        Phase::Deactivated
    } else if wl.condition_is_true(cond::ADMITTED) {
        Phase::Admitted
    } else if wl.condition_is_true(cond::QUOTA_RESERVED) {
        Phase::WaitingForChecks
    } else if wl.condition_is_true(cond::EVICTED)
        || wl
            .status
            .as_ref()
            .and_then(|s| s.requeue_state.as_ref())
            .is_some_and(|r| r.requeue_at.is_some())
    {
        Phase::Requeued
    } else {
        Phase::WaitingForQuota
    }
}

fn request_report(pr: &ProvisioningRequest) -> RequestReport {
    let conditions = pr
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let newest_true = ["Failed", "Provisioned", "BookingExpired", "CapacityRevoked"]
        .iter()
        .filter_map(|t| find_condition(conditions, t).filter(|c| c.status == "True"))
        .max_by_key(|c| c.last_transition_time.0);
    let outcome = newest_true
        .or_else(|| find_condition(conditions, "Accepted").filter(|c| c.status == "True"))
        .map(describe_condition);
    RequestReport {
        name: pr.name_any(),
        check: pr.annotations().get(CHECK_ANNOTATION).cloned(),
        attempt: pr.annotations().get(ATTEMPT_ANNOTATION).cloned(),
        conditions: conditions.iter().map(describe_condition).collect(),
        outcome,
    }
}

fn describe_condition(c: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition) -> String {
    let mut text = format!("{}={}", c.type_, c.status);
    match (c.reason.is_empty(), c.message.is_empty()) {
        (true, true) => {}
        (false, true) => text.push_str(&format!(" ({})", c.reason)),
        (true, false) => text.push_str(&format!(" ({})", c.message)),
        (false, false) => text.push_str(&format!(" ({}: {})", c.reason, c.message)),
    }
    text
}

fn event_report(e: &Event) -> EventReport {
    let time = e
        .series
        .as_ref()
        .and_then(|s| s.last_observed_time.as_ref().map(|t| t.0))
        .or_else(|| e.last_timestamp.as_ref().map(|t| t.0))
        .or_else(|| e.event_time.as_ref().map(|t| t.0))
        .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0));
    EventReport {
        time,
        type_: e.type_.clone().unwrap_or_default(),
        reason: e.reason.clone().unwrap_or_default(),
        note: e.message.clone().unwrap_or_default(),
        count: e
            .series
            .as_ref()
            .and_then(|s| s.count)
            .or(e.count)
            .unwrap_or(1)
            .max(1),
    }
}

/// One line: what would move the Workload, from the first thing that holds it back.
fn advice(snapshot: &Snapshot, r: &Report, now: Timestamp) -> String {
    let wl = &snapshot.workload;
    let cq = r.cluster_queue.as_deref().unwrap_or("?");
    match r.phase {
        Phase::Finished => return "Finished: nothing to do.".into(),
        Phase::Deactivated => return deactivated_advice(wl, r),
        Phase::Admitted => {
            return format!("Admitted on ClusterQueue {cq}: its pods may start.");
        }
        _ => {}
    }
    if r.quota.reserved && r.checks.is_empty() {
        return entries_not_added_advice(snapshot, r, cq);
    }
    if r.quota.reserved {
        return reserved_advice(r);
    }
    if let Some(reason) = stranded_by_deactivation(wl) {
        return format!(
            "Reactivated, but Kueue does not queue it again: it was deactivated by Kueue \
             ({reason}), and Kueue (v0.15 to v0.19) requeues a reactivated Workload only when \
             it was deactivated by a user. {}",
            reactivation_paths(r)
        );
    }
    if let Some(at) = r.requeue.as_ref().and_then(|q| q.at).filter(|at| *at > now) {
        return format!(
            "Requeued after an eviction or a Retry; Kueue considers it again at {}.",
            format_time(at)
        );
    }
    queueing_advice(snapshot, r, cq)
}

/// What to run to queue again a Workload Kueue deactivated: a resubmitted Job, or
/// `kueue-ac reactivate`, which does what Kueue's reactivation misses.
fn reactivation_paths(r: &Report) -> String {
    let job = r
        .owner
        .as_deref()
        .and_then(|o| o.strip_prefix("Job/"))
        .map(|job| format!("job {job}"))
        .unwrap_or_else(|| "its owner".into());
    format!(
        "Resubmit {job} (its new Workload starts from attempt 1), or run `kueue-ac reactivate \
         -n {} workload/{}`, which queues this Workload again and gives the checks their \
         retries back (--keep-attempts keeps them: the attempt record on the Workload still \
         counts the retries spent).",
        r.namespace, r.workload
    )
}

/// `spec.active: false`: why, and what brings it back.
fn deactivated_advice(wl: &Workload, r: &Report) -> String {
    let rejected = r.checks.iter().find(|c| c.state == CheckState::Rejected);
    if rejected.is_some() || deactivated_by_kueue(wl).is_some() {
        let why = match rejected {
            Some(c) => format!("Rejected by check {}: {}", c.name, c.message),
            None => format!(
                "Deactivated by Kueue ({})",
                deactivation_message(wl).unwrap_or_else(|| "no reason given".into())
            ),
        };
        return format!(
            "{why}. Fix what it says, then queue it again. Setting spec.active: true is not \
             enough: Kueue (v0.15 to v0.19) requeues a reactivated Workload only when a user \
             deactivated it. {}",
            reactivation_paths(r)
        );
    }
    let why = deactivation_message(wl).unwrap_or_else(|| "spec.active is false".into());
    format!("Deactivated ({why}); set spec.active: true to queue it again.")
}

/// Kueue's message about the deactivation.
fn deactivation_message(wl: &Workload) -> Option<String> {
    wl.condition(cond::DEACTIVATION_TARGET)
        .or_else(|| wl.condition(cond::EVICTED))
        .map(|c| c.message.clone())
        .filter(|m| !m.is_empty())
}

/// The reason Kueue deactivated the Workload itself (a check's `Rejected`, a requeuing limit,
/// a maximum execution time: `DeactivatedDueTo...`), as its `Evicted` or `Requeued` condition
/// says. A user's deactivation says `Deactivated` alone.
pub fn deactivated_by_kueue(wl: &Workload) -> Option<String> {
    [cond::REQUEUED, cond::EVICTED, cond::DEACTIVATION_TARGET]
        .iter()
        .filter_map(|t| wl.condition(t))
        .find_map(|c| match c.type_.as_str() {
            cond::DEACTIVATION_TARGET if c.status == "True" => {
                Some(format!("DeactivatedDueTo{}", c.reason))
            }
            cond::DEACTIVATION_TARGET => None,
            _ => c
                .reason
                .starts_with("DeactivatedDueTo")
                .then(|| c.reason.clone()),
        })
}

/// An active Workload that Kueue deactivated and someone reactivated, that Kueue will never
/// queue again: `Requeued=False` with a `DeactivatedDueTo...` reason (Kueue requeues only on
/// `Deactivated`). The reason, if so.
pub fn stranded_by_deactivation(wl: &Workload) -> Option<String> {
    let requeued = wl.condition(cond::REQUEUED)?;
    (wl.is_active()
        && !wl.condition_is_true(cond::QUOTA_RESERVED)
        && !wl.condition_is_true(cond::FINISHED)
        && requeued.status == "False"
        && requeued.reason.starts_with("DeactivatedDueTo"))
    .then(|| requeued.reason.clone())
}

/// The advice while the Workload holds quota and has no check entry: Kueue adds the entries
/// from a loop of its own, seconds after the reservation under load (for ever where it never
/// does), and the early start works in that window. What is true then: which of the
/// ClusterQueue's rules apply to the flavors assigned, and what was started early.
fn entries_not_added_advice(snapshot: &Snapshot, r: &Report, cq: &str) -> String {
    let Some(queue) = &snapshot.cluster_queue else {
        return format!(
            "Holds quota in ClusterQueue {cq}, which no longer exists, with no check entry: \
             Kueue admits or evicts it at its next pass."
        );
    };
    let wl = &snapshot.workload;
    let rules = queue
        .spec
        .admission_checks_strategy
        .iter()
        .flat_map(|s| &s.admission_checks);
    let due: Vec<&str> = rules
        .filter(|rule| FlavorRule::EARLY_START.applies(&queue.spec, &rule.name, wl))
        .map(|rule| rule.name.as_str())
        .collect();
    let assigned: Vec<&str> = r
        .quota
        .flavors
        .values()
        .flat_map(|by_resource| by_resource.values())
        .map(String::as_str)
        .collect();
    if due.is_empty() {
        return format!(
            "Holds quota; no check of ClusterQueue {cq} applies to the flavors assigned ({}): \
             Kueue admits the Workload at its next pass (Kueue before v0.18 may still add a \
             check whose onFlavors is empty to a Workload without flavors).",
            if assigned.is_empty() {
                "none".to_string()
            } else {
                assigned.join(", ")
            }
        );
    }
    let started: Vec<String> = r
        .provisioning_requests
        .iter()
        .filter(|p| p.check.as_deref().is_some_and(|c| due.contains(&c)))
        .map(|p| match &p.outcome {
            Some(outcome) => format!("ProvisioningRequest {} ({outcome})", p.name),
            None => format!("ProvisioningRequest {}", p.name),
        })
        .collect();
    let started = match started.is_empty() {
        true => "Nothing was started early for them.".to_string(),
        false => format!("Started early: {}.", started.join(", ")),
    };
    format!(
        "Holds quota, but Kueue has not added the entries of check {} yet (ClusterQueue {cq} \
         applies {} to the flavors assigned: {}); it adds them at its next pass of the Workload, \
         seconds later under load, and each check answers then. {started}",
        due.join(", "),
        if due.len() == 1 { "it" } else { "them" },
        assigned.join(", ")
    )
}

/// The advice while the Workload holds quota: the first check that holds it back.
fn reserved_advice(r: &Report) -> String {
    if let Some(c) = r.checks.iter().find(|c| c.state == CheckState::Rejected) {
        return format!(
            "Check {} answered Rejected: {}. Kueue deactivates the Workload.",
            c.name, c.message
        );
    }
    if let Some(c) = r.checks.iter().find(|c| c.state == CheckState::Retry) {
        let next = c.next_attempt_at.map(format_time);
        // Kueue waits for the longest delay of all the checks that answered Retry.
        let longest = r
            .checks
            .iter()
            .filter(|o| o.state == CheckState::Retry && o.name != c.name)
            .find(|o| o.delay_ends_at.is_some() && o.delay_ends_at == c.next_attempt_at)
            .filter(|_| c.delay_ends_at != c.next_attempt_at)
            .map(|o| format!(" (check {}'s delay, the longest)", o.name))
            .unwrap_or_default();
        let attempt = c.attempt.saturating_add(1);
        return match next {
            Some(at) if c.quota_held_until_retry => format!(
                "Check {} answered Retry: {}. Kueue keeps the quota until {at}{longest}, then \
                 evicts and requeues the Workload for attempt {attempt}.",
                c.name, c.message
            ),
            _ => format!(
                "Check {} answered Retry: {}. Kueue evicts and requeues the Workload for \
                 attempt {attempt}.",
                c.name, c.message
            ),
        };
    }
    if let Some(c) = r.checks.iter().find(|c| c.state == CheckState::Pending) {
        return pending_advice(r, c);
    }
    "Every check is Ready: Kueue admits the Workload at its next pass.".into()
}

/// The advice for a Workload without quota and not requeued: its queues, then Kueue's reason.
fn queueing_advice(snapshot: &Snapshot, r: &Report, cq: &str) -> String {
    if r.local_queue.is_none() {
        return "No queue: set the label kueue.x-k8s.io/queue-name on the Job.".into();
    }
    if snapshot.local_queue_exists == Some(false) {
        return format!(
            "LocalQueue {} does not exist in namespace {}: create it or fix the queue-name label.",
            r.local_queue.as_deref().unwrap_or_default(),
            r.namespace
        );
    }
    if let Some(cq_obj) = &snapshot.cluster_queue {
        let active = cq_obj
            .status
            .as_ref()
            .and_then(|s| find_condition(&s.conditions, "Active"));
        if let Some(c) = active.filter(|c| c.status != "True") {
            return format!(
                "ClusterQueue {cq} is inactive ({}): {}",
                c.reason, c.message
            );
        }
    } else if r.cluster_queue.is_some() {
        return format!(
            "ClusterQueue {cq} does not exist: create it or point the LocalQueue elsewhere."
        );
    }
    match &r.quota.waiting_reason {
        Some(reason) => format!("Waiting for quota on ClusterQueue {cq}: {reason}"),
        None => format!("Waiting for Kueue to consider it for quota on ClusterQueue {cq}."),
    }
}

fn pending_advice(r: &Report, c: &CheckReport) -> String {
    let Some(controller) = &c.controller else {
        return format!(
            "AdmissionCheck {} does not exist: create it, or remove it from ClusterQueue {}.",
            c.name,
            r.cluster_queue.as_deref().unwrap_or("?")
        );
    };
    if c.active == Some(false) {
        return format!(
            "Check {} is inactive: {}",
            c.name,
            c.active_message.as_deref().unwrap_or("no reason given")
        );
    }
    if c.message.starts_with("Permanent failure") {
        return format!(
            "Check {} cannot go on until this is fixed: {}",
            c.name, c.message
        );
    }
    let request = r
        .provisioning_requests
        .iter()
        .filter(|p| p.check.as_deref().is_none_or(|ch| ch == c.name))
        .filter(|p| {
            p.attempt
                .as_deref()
                .is_none_or(|a| a == c.attempt.to_string())
        })
        .max_by(|a, b| a.name.cmp(&b.name));
    if let Some(request) = request {
        return match &request.outcome {
            Some(outcome) if outcome.starts_with("Failed=True") => format!(
                "The autoscaler could not provision request {}: {outcome}; check {} answers Retry (or Rejected past its limit).",
                request.name, c.name
            ),
            Some(outcome) => format!(
                "Waiting for cluster-autoscaler on request {}: {outcome}.",
                request.name
            ),
            None => format!(
                "Waiting for cluster-autoscaler to accept request {}.",
                request.name
            ),
        };
    }
    let message = if c.message.is_empty() {
        "no answer yet".to_string()
    } else {
        c.message.clone()
    };
    format!(
        "Waiting for check {} (controller {controller}): {message}",
        c.name
    )
}

/// A time as `2026-11-25T12:00:00Z`.
pub fn format_time(t: Timestamp) -> String {
    t.round(k8s_openapi::jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| t.to_string())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use kueue_admission_sdk::api::{
        AdmissionCheckSpec, AdmissionCheckState, AdmissionCheckStatus, ProvisioningRequestSpec,
        ProvisioningRequestStatus,
    };
    use kueue_admission_sdk::testing::WorkloadBuilder;

    use super::*;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn snapshot(workload: Workload) -> Snapshot {
        Snapshot {
            workload,
            owner: Some("Job/train".into()),
            cluster_queue_name: Some("cq".into()),
            cluster_queue: None,
            local_queue_exists: Some(true),
            admission_checks: BTreeMap::new(),
            provisioning_configs: BTreeMap::new(),
            provisioning_requests: Vec::new(),
            pod_templates: Vec::new(),
            events: Vec::new(),
        }
    }

    fn condition(
        type_: &str,
        status: &str,
        reason: &str,
        message: &str,
        at: Timestamp,
    ) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: Time(at),
            observed_generation: None,
        }
    }

    fn check(name: &str, active: bool, message: &str) -> AdmissionCheck {
        let mut ac = AdmissionCheck::new(
            name,
            AdmissionCheckSpec {
                controller_name: "example.com/c".into(),
                parameters: None,
            },
        );
        ac.status = Some(AdmissionCheckStatus {
            conditions: vec![condition(
                "Active",
                if active { "True" } else { "False" },
                "R",
                message,
                t("2026-01-01T00:00:00Z"),
            )],
        });
        ac
    }

    /// A Workload holding quota, check `name` Pending.
    fn pending_on(name: &str) -> Workload {
        WorkloadBuilder::new("ns", "w")
            .pod_set("main", 1, "1")
            .check(name, CheckState::Pending)
            .quota_reserved("cq", "default")
            .build()
    }

    fn assert_advice_starts(r: &Report, start: &str) {
        assert!(r.advice.starts_with(start), "{}", r.advice);
    }

    #[test]
    fn waiting_for_quota_quotes_kueue() {
        let wl = WorkloadBuilder::new("ns", "w")
            .with(|wl| {
                wl.spec.queue_name = Some("lq".into());
                wl.status.get_or_insert_with(Default::default).conditions = vec![condition(
                    cond::QUOTA_RESERVED,
                    "False",
                    "Pending",
                    "insufficient unused quota for cpu in flavor default, 3 more needed",
                    t("2026-01-01T00:00:00Z"),
                )];
            })
            .build();
        let mut s = snapshot(wl);
        let mut cq = ClusterQueue::new("cq", Default::default());
        cq.status = Some(kueue_admission_sdk::api::ClusterQueueStatus {
            conditions: vec![condition(
                "Active",
                "True",
                "Ready",
                "",
                t("2026-01-01T00:00:00Z"),
            )],
        });
        s.cluster_queue = Some(cq.clone());
        let r = report(&s, t("2026-01-01T00:01:00Z"));
        assert_eq!(r.phase, Phase::WaitingForQuota);
        assert_eq!(
            r.advice,
            "Waiting for quota on ClusterQueue cq: insufficient unused quota for cpu in flavor default, 3 more needed"
        );
        // An inactive queue is the first thing to fix.
        cq.status = Some(kueue_admission_sdk::api::ClusterQueueStatus {
            conditions: vec![condition(
                "Active",
                "False",
                "AdmissionCheckInactive",
                "references inactive AdmissionCheck(s): c",
                t("2026-01-01T00:00:00Z"),
            )],
        });
        s.cluster_queue = Some(cq);
        let r = report(&s, t("2026-01-01T00:01:00Z"));
        assert_eq!(
            r.advice,
            "ClusterQueue cq is inactive (AdmissionCheckInactive): references inactive AdmissionCheck(s): c"
        );
        s.cluster_queue = None;
        let r = report(&s, t("2026-01-01T00:01:00Z"));
        assert_advice_starts(&r, "ClusterQueue cq does not exist");
    }

    #[test]
    fn a_missing_local_queue_or_queue_label_is_named() {
        let wl = WorkloadBuilder::new("ns", "w").build();
        let r = report(&snapshot(wl.clone()), t("2026-01-01T00:00:00Z"));
        assert_advice_starts(&r, "No queue");
        let mut s = snapshot(
            WorkloadBuilder::new("ns", "w")
                .with(|wl| wl.spec.queue_name = Some("lq".into()))
                .build(),
        );
        s.local_queue_exists = Some(false);
        let r = report(&s, t("2026-01-01T00:00:00Z"));
        assert_advice_starts(&r, "LocalQueue lq does not exist");
    }

    #[test]
    fn a_pending_check_that_is_inactive_says_why() {
        let mut s = snapshot(pending_on("c"));
        s.admission_checks
            .insert("c".into(), check("c", false, "parameters missing"));
        let r = report(&s, t("2026-01-01T00:00:00Z"));
        assert_eq!(r.phase, Phase::WaitingForChecks);
        assert_eq!(r.advice, "Check c is inactive: parameters missing");
        assert_eq!(r.quota.flavors["main"]["cpu"], "default");
        let s = snapshot(s.workload.clone());
        let r = report(&s, t("2026-01-01T00:00:00Z"));
        assert_advice_starts(&r, "AdmissionCheck c does not exist");
    }

    #[test]
    fn a_delayed_retry_holds_quota_until_its_end() {
        let at = t("2026-01-01T00:00:00Z");
        let wl = WorkloadBuilder::new("ns", "w")
            .at(at)
            .pod_set("main", 1, "1")
            .check_entry(AdmissionCheckState {
                name: "c".into(),
                state: CheckState::Retry,
                last_transition_time: Some(Time(at)),
                message: "over budget".into(),
                requeue_after_seconds: Some(60),
                retry_count: Some(1),
                pod_set_updates: Vec::new(),
            })
            .quota_reserved("cq", "default")
            .build();
        let mut s = snapshot(wl);
        s.admission_checks
            .insert("c".into(), check("c", true, "ok"));
        let r = report(&s, t("2026-01-01T00:00:30Z"));
        let c = &r.checks[0];
        assert_eq!(c.next_attempt_at, Some(t("2026-01-01T00:01:00Z")));
        assert!(c.quota_held_until_retry);
        assert_eq!(c.attempt, 2);
        assert_eq!(
            r.advice,
            "Check c answered Retry: over budget. Kueue keeps the quota until 2026-01-01T00:01:00Z, then evicts and requeues the Workload for attempt 3."
        );
        let text = crate::render::text(&r);
        assert!(
            text.contains("next attempt at 2026-01-01T00:01:00Z; quota held until then"),
            "{text}"
        );
    }

    /// Request `w-prov-1`, made for `check`, with these conditions.
    fn request_of(check: &str, conditions: Vec<Condition>) -> ProvisioningRequest {
        let mut pr = ProvisioningRequest::new("w-prov-1", ProvisioningRequestSpec::default());
        pr.metadata.annotations = Some(BTreeMap::from([(
            CHECK_ANNOTATION.to_string(),
            check.to_string(),
        )]));
        pr.status = Some(ProvisioningRequestStatus {
            conditions,
            ..Default::default()
        });
        pr
    }

    #[test]
    fn a_failed_request_is_the_autoscalers_word() {
        let mut s = snapshot(pending_on("prov"));
        s.admission_checks
            .insert("prov".into(), check("prov", true, "ok"));
        let mut pr = request_of(
            "prov",
            vec![
                condition(
                    "Accepted",
                    "True",
                    "Accepted",
                    "",
                    t("2026-01-01T00:00:00Z"),
                ),
                condition(
                    "Failed",
                    "True",
                    "NoCapacity",
                    "no nodes of class gpu-a",
                    t("2026-01-01T00:00:05Z"),
                ),
            ],
        );
        pr.annotations_mut()
            .insert(ATTEMPT_ANNOTATION.to_string(), "1".to_string());
        s.provisioning_requests.push(pr);
        let r = report(&s, t("2026-01-01T00:00:10Z"));
        assert_eq!(
            r.advice,
            "The autoscaler could not provision request w-prov-1: Failed=True (NoCapacity: no nodes of class gpu-a); check prov answers Retry (or Rejected past its limit)."
        );
    }

    /// A Workload holding quota on `default` before Kueue added any entry, in ClusterQueue `cq`
    /// (flavor `default`) whose rules are `rules`.
    fn before_the_entries(rules: &[(&str, &[&str])]) -> Snapshot {
        let wl = WorkloadBuilder::new("ns", "w")
            .pod_set("main", 1, "1")
            .quota_reserved("cq", "default")
            .build();
        let mut s = snapshot(wl);
        s.cluster_queue = Some(kueue_admission_sdk::testing::cluster_queue(
            "cq",
            &["default"],
            rules,
        ));
        s
    }

    #[test]
    fn before_the_entries_it_names_the_checks_due_and_what_started_early() {
        let mut s = before_the_entries(&[("prov", &[]), ("gpu-only", &["gpu"])]);
        let provisioned = condition(
            "Provisioned",
            "True",
            "Provisioned",
            "",
            t("2026-01-01T00:00:05Z"),
        );
        s.provisioning_requests
            .push(request_of("prov", vec![provisioned]));
        let r = report(&s, t("2026-01-01T00:00:10Z"));
        assert_eq!(
            r.advice,
            "Holds quota, but Kueue has not added the entries of check prov yet (ClusterQueue cq \
             applies it to the flavors assigned: default); it adds them at its next pass of the \
             Workload, seconds later under load, and each check answers then. Started early: \
             ProvisioningRequest w-prov-1 (Provisioned=True (Provisioned))."
        );
        // Nothing started: said so, never "every check is Ready".
        let r = report(
            &before_the_entries(&[("prov", &[])]),
            t("2026-01-01T00:00:10Z"),
        );
        assert!(
            r.advice.ends_with("Nothing was started early for them."),
            "{}",
            r.advice
        );
    }

    #[test]
    fn before_the_entries_without_a_check_due_kueue_admits() {
        let s = before_the_entries(&[("gpu-only", &["gpu"])]);
        let r = report(&s, t("2026-01-01T00:00:10Z"));
        assert_advice_starts(
            &r,
            "Holds quota; no check of ClusterQueue cq applies to the flavors assigned (default): \
             Kueue admits the Workload at its next pass",
        );
        let mut gone = s;
        gone.cluster_queue = None;
        let r = report(&gone, t("2026-01-01T00:00:10Z"));
        assert_advice_starts(&r, "Holds quota in ClusterQueue cq, which no longer exists");
    }

    #[test]
    fn a_rejection_is_named_after_the_deactivation() {
        let wl = WorkloadBuilder::new("ns", "w")
            .check_entry(AdmissionCheckState {
                name: "c".into(),
                state: CheckState::Rejected,
                message: "needs 4 licenses, the pool has 2".into(),
                ..Default::default()
            })
            .deactivated()
            .build();
        let r = report(&snapshot(wl), t("2026-01-01T00:00:00Z"));
        assert_eq!(r.phase, Phase::Deactivated);
        assert_advice_starts(&r, "Rejected by check c: needs 4 licenses, the pool has 2.");
        let admitted = WorkloadBuilder::new("ns", "w")
            .pod_set("main", 1, "1")
            .quota_reserved("cq", "default")
            .admitted()
            .build();
        let r = report(&snapshot(admitted), t("2026-01-01T00:00:00Z"));
        assert_eq!(r.advice, "Admitted on ClusterQueue cq: its pods may start.");
    }

    /// A Retry entry of check `name` written at `at` with `delay` seconds.
    fn retry_entry(name: &str, at: Timestamp, delay: i32) -> AdmissionCheckState {
        AdmissionCheckState {
            name: name.into(),
            state: CheckState::Retry,
            last_transition_time: Some(Time(at)),
            message: format!("{name} busy"),
            requeue_after_seconds: Some(delay),
            retry_count: None,
            pod_set_updates: Vec::new(),
        }
    }

    #[test]
    fn the_quota_is_held_until_the_longest_delay_of_all_retries() {
        let at = t("2026-01-01T00:00:00Z");
        // The first entry has the shorter delay: Kueue waits for the second's.
        let wl = WorkloadBuilder::new("ns", "w")
            .at(at)
            .pod_set("main", 1, "1")
            .check_entry(retry_entry("short", at, 60))
            .check_entry(retry_entry("long", t("2026-01-01T00:00:10Z"), 300))
            .quota_reserved("cq", "default")
            .with(|wl| {
                // Kueue's own bookkeeping, which says waitForPodsReady requeues, not these.
                wl.status.get_or_insert_with(Default::default).requeue_state =
                    Some(kueue_admission_sdk::api::RequeueState {
                        count: Some(5),
                        requeue_at: Some(Time(t("2026-01-01T00:01:00Z"))),
                    });
            })
            .build();
        let r = report(&snapshot(wl), t("2026-01-01T00:00:30Z"));
        let longest = t("2026-01-01T00:05:10Z");
        assert_eq!(r.requeue.as_ref().and_then(|q| q.at), Some(longest));
        for c in &r.checks {
            assert_eq!(c.next_attempt_at, Some(longest), "{}", c.name);
            assert!(c.quota_held_until_retry, "{}", c.name);
        }
        assert_eq!(r.checks[0].delay_ends_at, Some(t("2026-01-01T00:01:00Z")));
        assert_eq!(
            r.advice,
            "Check short answered Retry: short busy. Kueue keeps the quota until \
             2026-01-01T00:05:10Z (check long's delay, the longest), then evicts and requeues \
             the Workload for attempt 2."
        );
        let text = crate::render::text(&r);
        assert!(
            text.contains(
                "next attempt at 2026-01-01T00:05:10Z (its own delay ends at \
                 2026-01-01T00:01:00Z); quota held until then"
            ),
            "{text}"
        );
        assert!(text.contains("Requeue: at 2026-01-01T00:05:10Z"), "{text}");
        assert!(
            !text.contains("5 time(s)"),
            "requeueState.count printed: {text}"
        );
    }

    #[test]
    fn evictions_are_counted_from_the_scheduling_stats_not_requeue_state() {
        let wl = WorkloadBuilder::new("ns", "w")
            .with(|wl| {
                let status = wl.status.get_or_insert_with(Default::default);
                status.scheduling_stats = Some(kueue_admission_sdk::api::SchedulingStats {
                    evictions: vec![
                        kueue_admission_sdk::api::EvictionCount {
                            reason: "AdmissionCheck".into(),
                            underlying_cause: String::new(),
                            count: 2,
                        },
                        kueue_admission_sdk::api::EvictionCount {
                            reason: "Deactivated".into(),
                            underlying_cause: "AdmissionCheck".into(),
                            count: 1,
                        },
                    ],
                });
                // Cleared by the deactivation in Kueue; never the count to show.
                status.requeue_state = Some(kueue_admission_sdk::api::RequeueState {
                    count: None,
                    requeue_at: None,
                });
            })
            .build();
        let r = report(&snapshot(wl), t("2026-01-01T00:00:00Z"));
        let text = crate::render::text(&r);
        assert!(
            text.contains("Evicted: 3 time(s): AdmissionCheck 2, Deactivated (AdmissionCheck) 1"),
            "{text}"
        );
        assert!(!text.contains("Requeue:"), "{text}");
    }

    /// A Workload Kueue deactivated after a check's Rejected, the entry already reset.
    fn deactivated_by_a_check(active: bool) -> Workload {
        let at = t("2026-01-01T00:00:00Z");
        WorkloadBuilder::new("ns", "w")
            .check("c", CheckState::Pending)
            .with(|wl| {
                wl.spec.active = Some(active);
                wl.spec.queue_name = Some("lq".into());
                wl.status.get_or_insert_with(Default::default).conditions = vec![
                    condition(
                        cond::EVICTED,
                        "True",
                        "DeactivatedDueToAdmissionCheck",
                        "The workload is deactivated due to Admission check(s): [c], were rejected",
                        at,
                    ),
                    condition(
                        cond::REQUEUED,
                        "False",
                        "DeactivatedDueToAdmissionCheck",
                        "x",
                        at,
                    ),
                ];
            })
            .build()
    }

    #[test]
    fn a_workload_a_check_deactivated_is_not_sent_to_spec_active() {
        let r = report(
            &snapshot(deactivated_by_a_check(false)),
            t("2026-01-01T00:00:00Z"),
        );
        assert_eq!(r.phase, Phase::Deactivated);
        assert!(
            r.advice.starts_with("Deactivated by Kueue (The workload is deactivated due to Admission check(s): [c], were rejected). Fix what it says, then queue it again. Setting spec.active: true is not enough")
                && r.advice.contains("Resubmit job train")
                && r.advice.contains("kueue-ac reactivate -n ns workload/w")
                && r.advice.contains("still counts the retries spent"),
            "{}",
            r.advice
        );
        // Reactivated by hand: active, evicted, never queued again.
        let r = report(
            &snapshot(deactivated_by_a_check(true)),
            t("2026-01-01T00:00:00Z"),
        );
        assert!(
            r.advice.starts_with(
                "Reactivated, but Kueue does not queue it again: it was deactivated by Kueue \
                 (DeactivatedDueToAdmissionCheck)"
            ) && r.advice.contains("kueue-ac reactivate"),
            "{}",
            r.advice
        );
    }

    #[test]
    fn targets_parse_with_or_without_a_kind() {
        use crate::fetch::Target;
        assert_eq!("a".parse(), Ok(Target::Either("a".into())));
        assert_eq!("job/a".parse(), Ok(Target::Job("a".into())));
        assert_eq!("Workload/a".parse(), Ok(Target::Workload("a".into())));
        assert!("pod/a".parse::<Target>().is_err());
        assert!("job/".parse::<Target>().is_err());
    }
}

//! Prometheus metrics of the runtime, all prefixed `kueue_ac_`. Kueue's own metrics already cover
//! the Workload side (`kueue_admission_checks_wait_time_seconds`, `kueue_evicted_workloads_total`);
//! these cover what only the check controller knows: its decisions, retries, delays and errors.

use std::fmt;
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::Store;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::api::{CheckState, Workload, workload_condition as cond};
use crate::decide::{Eligibility, eligibility};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CheckLabels {
    check: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    check: String,
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    kind: String,
}

/// Delays and waits span seconds to hours.
fn seconds_histogram() -> Histogram {
    Histogram::new([
        1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0,
    ])
}

/// A reconcile takes milliseconds (cache reads, one status write) to seconds (a slow check).
fn reconcile_histogram() -> Histogram {
    Histogram::new([
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    ])
}

/// Where a Workload's change spends its time before a reconcile reads it: reaching this
/// controller's watch, then waiting in the reconcile queue.
#[derive(Debug)]
struct QueueMetrics {
    reserved_seen: Histogram,
    queue_wait: Histogram,
    queue_depth: Gauge,
}

/// A change waits microseconds on an idle controller, minutes behind a flood of changes.
fn wait_histogram() -> Histogram {
    Histogram::new([
        0.001, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0,
    ])
}

impl Default for QueueMetrics {
    fn default() -> Self {
        Self {
            // Kueue's condition times are whole seconds.
            reserved_seen: Histogram::new([
                1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0,
            ]),
            queue_wait: wait_histogram(),
            queue_depth: Gauge::default(),
        }
    }
}

impl QueueMetrics {
    fn register(&self, registry: &mut Registry) {
        let Self {
            reserved_seen,
            queue_wait,
            queue_depth,
        } = self;
        registry.register(
            "quota_reserved_seen_seconds",
            "Time from Kueue reserving a Workload's quota (its QuotaReserved lastTransitionTime: whole seconds, Kueue's clock) to this controller's watch delivering it",
            reserved_seen.clone(),
        );
        registry.register(
            "reconcile_queue_wait_seconds",
            "Time a Workload change from the watch waited for a reconcile to read it (in line for a turn: answers first on the --concurrency turns, early starts first on the --early-start-concurrency turns, then first come, first served)",
            queue_wait.clone(),
        );
        registry.register(
            "reconcile_queue_depth",
            "Workloads with a change from the watch that no reconcile has read yet",
            queue_depth.clone(),
        );
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: String,
}

/// Error kinds counted from the start, at zero (see [`crate::error::Error::label`]).
const RECONCILE_ERROR_KINDS: [&str; 4] = ["api", "check", "invalid_decision", "malformed_workload"];

/// States a check writes, for series that exist from the start.
const STATES: [CheckState; 4] = [
    CheckState::Pending,
    CheckState::Ready,
    CheckState::Retry,
    CheckState::Rejected,
];

fn attempt_histogram() -> Histogram {
    Histogram::new([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0])
}

/// The runtime's metrics.
pub(crate) struct Metrics {
    decisions: Family<StateLabels, Counter>,
    retry_delay: Family<CheckLabels, Histogram>,
    attempt: Family<CheckLabels, Histogram>,
    time_to_decision: Family<StateLabels, Histogram>,
    errors: Family<ErrorLabels, Counter>,
    conflicts: Family<CheckLabels, Counter>,
    check_active: Family<CheckLabels, Gauge>,
    check_sync_errors: Family<CheckLabels, Counter>,
    check_claimed_elsewhere: Family<CheckLabels, Gauge>,
    retry_delays_clamped: Family<CheckLabels, Counter>,
    permanent_failures: Family<CheckLabels, Counter>,
    attempt_records_refused: Family<CheckLabels, Counter>,
    early_starts: Family<CheckLabels, Counter>,
    early_starts_abandoned: Family<CheckLabels, Counter>,
    reconcile_duration: Family<ResultLabels, Histogram>,
    shadow_decisions: Family<StateLabels, Counter>,
    /// The runtime runs its checks in shadow mode: their would-be answers are counted.
    shadow: bool,
    leader: Gauge,
    /// Whether this replica knows the ClusterQueues (only registered for a check that starts
    /// early: only then are they watched).
    cluster_queues_known: Gauge,
    /// Checks whose series exist: a reconcile that finishes after its check went away must not
    /// bring a few of them back.
    live: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// The reconcile queue.
    queue: QueueMetrics,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// Creates the metrics and registers them (prefixed `kueue_ac_`) in `registry`, with the
    /// waiting gauge counted from `store` for the checks `checks` names.
    pub fn new(
        registry: &mut Registry,
        store: Store<Workload>,
        checks: Arc<dyn Fn() -> Vec<String> + Send + Sync>,
    ) -> Self {
        let registry = registry.sub_registry_with_prefix("kueue_ac");
        registry.register_collector(Box::new(WaitingCollector { store, checks }));
        let metrics = Self {
            decisions: Family::default(),
            retry_delay: Family::new_with_constructor(seconds_histogram as fn() -> _),
            attempt: Family::new_with_constructor(attempt_histogram as fn() -> _),
            time_to_decision: Family::new_with_constructor(seconds_histogram as fn() -> _),
            errors: Family::default(),
            conflicts: Family::default(),
            check_active: Family::default(),
            check_sync_errors: Family::default(),
            check_claimed_elsewhere: Family::default(),
            retry_delays_clamped: Family::default(),
            permanent_failures: Family::default(),
            attempt_records_refused: Family::default(),
            early_starts: Family::default(),
            early_starts_abandoned: Family::default(),
            reconcile_duration: Family::new_with_constructor(reconcile_histogram as fn() -> _),
            shadow_decisions: Family::default(),
            shadow: false,
            leader: Gauge::default(),
            cluster_queues_known: Gauge::default(),
            live: Default::default(),
            queue: QueueMetrics::default(),
        };
        // Series that exist from the start, so that `rate()` and `increase()` see their first
        // increment (a series born at 1 hides it).
        for kind in RECONCILE_ERROR_KINDS {
            let _ = metrics
                .errors
                .get_or_create(&ErrorLabels { kind: kind.into() });
        }
        for result in ["ok", "error"] {
            let _ = metrics.reconcile_duration.get_or_create(&ResultLabels {
                result: result.into(),
            });
        }
        metrics.register(registry);
        metrics
    }

    /// Registers every metric, with its help text, in `registry`.
    fn register(&self, registry: &mut Registry) {
        self.register_answers(registry);
        self.register_health(registry);
    }

    /// What the checks answered: decisions, delays, attempts, failures, early starts, shadow.
    fn register_answers(&self, registry: &mut Registry) {
        registry.register(
            "decisions",
            "Check states written, by check and state",
            self.decisions.clone(),
        );
        registry.register(
            "retry_delay_seconds",
            "Delay asked for with each Retry written",
            self.retry_delay.clone(),
        );
        registry.register(
            "decision_attempt",
            "Attempt number of each decision written (the check's own count of its Retries + 1, never reset by other checks' evictions)",
            self.attempt.clone(),
        );
        registry.register(
            "time_to_decision_seconds",
            "Time from quota reservation to a Ready, Retry or Rejected being written",
            self.time_to_decision.clone(),
        );
        registry.register(
            "retry_delays_clamped",
            "Retry delays longer than the ceiling (--max-retry-delay) that were written as the ceiling",
            self.retry_delays_clamped.clone(),
        );
        registry.register(
            "permanent_failures",
            "Decisions that failed in a way retrying cannot fix (shown on the Workload's entry)",
            self.permanent_failures.clone(),
        );
        registry.register(
            "attempt_records_refused",
            "Attempts whose attempt record the API server refused for good (RBAC, a policy, a size limit); their Retry is written without it after the permanent-failure hold",
            self.attempt_records_refused.clone(),
        );
        registry.register(
            "early_starts",
            "Workloads whose check work started when they got quota, before Kueue added the check's entry",
            self.early_starts.clone(),
        );
        registry.register(
            "early_starts_abandoned",
            "Early starts released because Kueue did not add the check's entry within --early-start-wait",
            self.early_starts_abandoned.clone(),
        );
        registry.register(
            "shadow_decisions",
            "Answers a check in shadow mode would have written (it writes none), by check and state; counted once per Workload reservation and state or message",
            self.shadow_decisions.clone(),
        );
    }

    /// How the runtime is doing: errors, conflicts, the checks' state, reconciles.
    fn register_health(&self, registry: &mut Registry) {
        registry.register(
            "reconcile_errors",
            "Failed reconciles, by error kind",
            self.errors.clone(),
        );
        registry.register(
            "write_conflicts",
            "Status writes refused because the Workload changed since it was read (decided again)",
            self.conflicts.clone(),
        );
        registry.register(
            "check_active",
            "1 while the AdmissionCheck is Active, 0 while it is not",
            self.check_active.clone(),
        );
        registry.register(
            "check_sync_errors",
            "Failed attempts to read an AdmissionCheck's parameters or write its Active condition (each retried with backoff)",
            self.check_sync_errors.clone(),
        );
        registry.register(
            "check_claimed_elsewhere",
            "1 while another deployment with the same controllerName answers the AdmissionCheck (this one stands down for it)",
            self.check_claimed_elsewhere.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time one Workload reconcile took (every check of this controller asked, status written), by result",
            self.reconcile_duration.clone(),
        );
        self.queue.register(registry);
        registry.register(
            "leader",
            "1 while this replica leads (holds the Lease, or runs without leader election), 0 while it stands by",
            self.leader.clone(),
        );
    }

    /// The checks run in shadow mode: their would-be answers get series from the start.
    pub fn in_shadow_mode(mut self) -> Self {
        self.shadow = true;
        self
    }

    /// A check in shadow mode would have written `state`.
    pub fn shadow_decision(&self, check: &str, state: CheckState) {
        if !self.is_live(check) {
            return;
        }
        self.shadow_decisions
            .get_or_create(&state_labels(check, state))
            .inc();
    }

    fn is_live(&self, check: &str) -> bool {
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(check)
    }

    /// A reconcile finished.
    pub fn reconciled(&self, took: std::time::Duration, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.reconcile_duration
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .observe(took.as_secs_f64());
    }

    /// Where the Workload watch times reservations.
    pub fn reserved_seen(&self) -> Histogram {
        self.queue.reserved_seen.clone()
    }

    /// A reconcile started that reads a change which waited `waited` for it.
    pub fn queue_waited(&self, waited: std::time::Duration) {
        self.queue.queue_wait.observe(waited.as_secs_f64());
    }

    /// `waiting` Workloads have a change no reconcile has read yet.
    pub fn queue_depth(&self, waiting: usize) {
        self.queue
            .queue_depth
            .set(i64::try_from(waiting).unwrap_or(i64::MAX));
    }

    /// This replica took or lost the lead.
    pub fn leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// Registers the gauge of whether the ClusterQueues are known, for a runtime that watches
    /// them (its check starts early).
    pub fn register_cluster_queues(&self, registry: &mut Registry) {
        registry.sub_registry_with_prefix("kueue_ac").register(
            "cluster_queues_known",
            "1 while this replica has listed the ClusterQueues and may watch them; 0 while not (not listed yet, or list/watch refused): no check starts its work before Kueue adds the entry then",
            self.cluster_queues_known.clone(),
        );
    }

    /// The ClusterQueues became known or unknown.
    pub fn cluster_queues_known(&self, known: bool) {
        self.cluster_queues_known.set(i64::from(known));
    }

    /// A state was written for a check.
    pub fn decision(
        &self,
        wl: &Workload,
        check: &str,
        state: CheckState,
        attempt: u32,
        retry_delay: Option<f64>,
        now: Timestamp,
    ) {
        if !self.is_live(check) {
            return;
        }
        let labels = state_labels(check, state);
        self.decisions.get_or_create(&labels).inc();
        let per_check = check_labels(check);
        self.attempt
            .get_or_create(&per_check)
            .observe(f64::from(attempt));
        if let Some(delay) = retry_delay {
            self.retry_delay.get_or_create(&per_check).observe(delay);
        }
        if state != CheckState::Pending
            && let Some(reserved) = wl
                .condition(cond::QUOTA_RESERVED)
                .filter(|c| c.status == "True")
        {
            let waited = now
                .duration_since(reserved.last_transition_time.0)
                .as_secs_f64()
                .max(0.0);
            self.time_to_decision.get_or_create(&labels).observe(waited);
        }
    }

    pub fn error(&self, kind: &str) {
        self.errors
            .get_or_create(&ErrorLabels { kind: kind.into() })
            .inc();
    }

    pub fn conflict(&self, check: &str) {
        self.count(&self.conflicts, check);
    }

    /// Resolving or writing a check failed; it is tried again.
    pub fn check_sync_error(&self, check: &str) {
        self.count(&self.check_sync_errors, check);
    }

    /// Another deployment claims the check (1), or no longer does (the series goes away).
    pub fn check_claimed_elsewhere(&self, check: &str, claimed: bool) {
        let labels = check_labels(check);
        if claimed {
            self.check_claimed_elsewhere.get_or_create(&labels).set(1);
        } else {
            self.check_claimed_elsewhere.remove(&labels);
        }
    }

    /// A Retry delay was cut to the ceiling.
    pub fn retry_delay_clamped(&self, check: &str) {
        self.count(&self.retry_delays_clamped, check);
    }

    /// A decision failed permanently.
    pub fn permanent_failure(&self, check: &str) {
        self.count(&self.permanent_failures, check);
    }

    /// The API server refused an attempt's record for good.
    pub fn attempt_record_refused(&self, check: &str) {
        self.count(&self.attempt_records_refused, check);
    }

    /// A check's work started before its entry came.
    pub fn early_start(&self, check: &str) {
        self.count(&self.early_starts, check);
    }

    /// Work started early was released: the entry did not come in time.
    pub fn early_start_abandoned(&self, check: &str) {
        self.count(&self.early_starts_abandoned, check);
    }

    /// How many attempts of `check` had their record refused, for tests.
    #[cfg(test)]
    pub fn attempt_records_refused_of(&self, check: &str) -> u64 {
        self.attempt_records_refused
            .get_or_create(&check_labels(check))
            .get()
    }

    /// How many permanent failures of `check` were counted, for tests.
    #[cfg(test)]
    pub fn permanent_failures_of(&self, check: &str) -> u64 {
        self.permanent_failures
            .get_or_create(&check_labels(check))
            .get()
    }

    /// One more in `counter` for `check`, unless the check was forgotten meanwhile (its series
    /// must not come back).
    fn count(&self, counter: &Family<CheckLabels, Counter>, check: &str) {
        if self.is_live(check) {
            counter.get_or_create(&check_labels(check)).inc();
        }
    }

    /// A check of ours was resolved: active or not. Its series exist from then on, at zero.
    pub fn check_active(&self, check: &str, active: bool) {
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(check.into());
        let labels = check_labels(check);
        self.check_active
            .get_or_create(&labels)
            .set(i64::from(active));
        for state in STATES {
            let _ = self.decisions.get_or_create(&state_labels(check, state));
            if self.shadow {
                let _ = self
                    .shadow_decisions
                    .get_or_create(&state_labels(check, state));
            }
        }
        for state in &STATES[1..] {
            let _ = self
                .time_to_decision
                .get_or_create(&state_labels(check, *state));
        }
        let _ = self.conflicts.get_or_create(&labels);
        let _ = self.check_sync_errors.get_or_create(&labels);
        let _ = self.retry_delays_clamped.get_or_create(&labels);
        let _ = self.permanent_failures.get_or_create(&labels);
        let _ = self.attempt_records_refused.get_or_create(&labels);
        let _ = self.early_starts.get_or_create(&labels);
        let _ = self.early_starts_abandoned.get_or_create(&labels);
        let _ = self.retry_delay.get_or_create(&labels);
        let _ = self.attempt.get_or_create(&labels);
    }

    /// A check of ours went away: its series go too.
    pub fn forget_check(&self, check: &str) {
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(check);
        let labels = check_labels(check);
        self.check_active.remove(&labels);
        for state in STATES {
            self.decisions.remove(&state_labels(check, state));
            self.shadow_decisions.remove(&state_labels(check, state));
            self.time_to_decision.remove(&state_labels(check, state));
        }
        self.conflicts.remove(&labels);
        self.check_sync_errors.remove(&labels);
        self.retry_delays_clamped.remove(&labels);
        self.permanent_failures.remove(&labels);
        self.early_starts.remove(&labels);
        self.early_starts_abandoned.remove(&labels);
        self.attempt_records_refused.remove(&labels);
        self.retry_delay.remove(&labels);
        self.attempt.remove(&labels);
    }
}

fn check_labels(check: &str) -> CheckLabels {
    CheckLabels {
        check: check.into(),
    }
}

fn state_labels(check: &str, state: CheckState) -> StateLabels {
    StateLabels {
        check: check.into(),
        state: state.to_string(),
    }
}

/// `kueue_ac_workloads_waiting{check}`: Workloads holding quota with the check's entry Pending,
/// counted from the watch cache at scrape time, so it can never drift from the cluster.
struct WaitingCollector {
    store: Store<Workload>,
    checks: Arc<dyn Fn() -> Vec<String> + Send + Sync>,
}

impl fmt::Debug for WaitingCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WaitingCollector").finish_non_exhaustive()
    }
}

impl Collector for WaitingCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let checks = (self.checks)();
        let workloads = self.store.state();
        let mut family = encoder.encode_descriptor(
            "workloads_waiting",
            "Workloads holding quota whose entry for the check is Pending",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for check in checks {
            let n = workloads
                .iter()
                .filter(|wl| matches!(eligibility(wl, &check, false), Eligibility::Decide { .. }))
                .count();
            let labels = CheckLabels { check };
            ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX))
                .encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The metrics, registered, for a runtime without checks or Workloads.
    fn registered() -> (Registry, Metrics) {
        let mut registry = Registry::default();
        let (store, _writer) = kube::runtime::reflector::store::<Workload>();
        let metrics = Metrics::new(&mut registry, store, Arc::new(Vec::new));
        (registry, metrics)
    }

    fn scrape(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).expect("encodes");
        out
    }

    #[test]
    fn a_checks_series_exist_at_zero_from_its_first_sync_until_it_goes() {
        let (registry, metrics) = registered();
        let before = scrape(&registry);
        assert!(
            before.contains("kueue_ac_reconcile_errors_total{kind=\"api\"} 0"),
            "{before}"
        );
        assert!(
            before.contains("kueue_ac_reconcile_duration_seconds_count{result=\"error\"} 0"),
            "{before}"
        );
        assert!(
            before.contains("kueue_ac_reconcile_queue_depth 0"),
            "{before}"
        );
        assert!(!before.contains("check=\"budget\""), "{before}");

        metrics.check_active("budget", false);
        let synced = scrape(&registry);
        for series in [
            "kueue_ac_check_active{check=\"budget\"} 0",
            "kueue_ac_decisions_total{check=\"budget\",state=\"Pending\"} 0",
            "kueue_ac_decisions_total{check=\"budget\",state=\"Rejected\"} 0",
            "kueue_ac_write_conflicts_total{check=\"budget\"} 0",
            "kueue_ac_check_sync_errors_total{check=\"budget\"} 0",
            "kueue_ac_retry_delay_seconds_count{check=\"budget\"} 0",
            "kueue_ac_time_to_decision_seconds_count{check=\"budget\",state=\"Retry\"} 0",
        ] {
            assert!(synced.contains(series), "{series} missing from:\n{synced}");
        }
        // Resolving again keeps counts.
        metrics.conflict("budget");
        metrics.check_active("budget", true);
        let again = scrape(&registry);
        assert!(
            again.contains("kueue_ac_write_conflicts_total{check=\"budget\"} 1"),
            "{again}"
        );
        assert!(again.contains("kueue_ac_check_active{check=\"budget\"} 1"));

        metrics.forget_check("budget");
        // A reconcile that finishes after the check went away brings nothing back.
        metrics.conflict("budget");
        metrics.check_sync_error("budget");
        let gone = scrape(&registry);
        assert!(!gone.contains("check=\"budget\""), "{gone}");
    }

    #[test]
    fn the_error_kinds_counted_from_the_start_are_the_errors_labels() {
        let api = crate::error::Error::Api(kube::Error::LinesCodecMaxLineLengthExceeded);
        let check = crate::error::Error::Check("x".into());
        let invalid = crate::error::Error::InvalidDecision("x".into());
        let malformed = crate::error::Error::MalformedWorkload("x".into());
        let labels: Vec<&str> = [api, check, invalid, malformed]
            .iter()
            .map(crate::error::Error::label)
            .collect();
        assert_eq!(labels, RECONCILE_ERROR_KINDS);
    }

    #[test]
    fn the_reconcile_queue_is_measured() {
        let (registry, metrics) = registered();
        metrics.queue_depth(3);
        metrics.queue_waited(std::time::Duration::from_millis(200));
        let out = scrape(&registry);
        assert!(out.contains("kueue_ac_reconcile_queue_depth 3"), "{out}");
        assert!(
            out.contains("kueue_ac_reconcile_queue_wait_seconds_bucket{le=\"0.1\"} 0"),
            "{out}"
        );
        assert!(
            out.contains("kueue_ac_reconcile_queue_wait_seconds_bucket{le=\"0.5\"} 1"),
            "{out}"
        );
    }

    #[test]
    fn reconcile_durations_are_observed_by_result() {
        let (registry, metrics) = registered();
        metrics.reconciled(std::time::Duration::from_millis(30), true);
        metrics.reconciled(std::time::Duration::from_millis(3), true);
        let out = scrape(&registry);
        assert!(
            out.contains("kueue_ac_reconcile_duration_seconds_count{result=\"ok\"} 2"),
            "{out}"
        );
        assert!(
            out.contains(
                "kueue_ac_reconcile_duration_seconds_bucket{le=\"0.025\",result=\"ok\"} 1"
            ),
            "{out}"
        );
    }
}

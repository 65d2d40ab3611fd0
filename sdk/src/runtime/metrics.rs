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
    leader: Gauge,
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
        let decisions = Family::<StateLabels, Counter>::default();
        let retry_delay =
            Family::<CheckLabels, Histogram>::new_with_constructor(seconds_histogram as fn() -> _);
        let attempt =
            Family::<CheckLabels, Histogram>::new_with_constructor(attempt_histogram as fn() -> _);
        let time_to_decision =
            Family::<StateLabels, Histogram>::new_with_constructor(seconds_histogram as fn() -> _);
        let errors = Family::<ErrorLabels, Counter>::default();
        let conflicts = Family::<CheckLabels, Counter>::default();
        let check_active = Family::<CheckLabels, Gauge>::default();
        let leader = Gauge::default();
        registry.register(
            "decisions",
            "Check states written, by check and state",
            decisions.clone(),
        );
        registry.register(
            "retry_delay_seconds",
            "Delay asked for with each Retry written",
            retry_delay.clone(),
        );
        registry.register(
            "decision_attempt",
            "Attempt number (Kueue's retryCount + 1) of each decision written",
            attempt.clone(),
        );
        registry.register(
            "time_to_decision_seconds",
            "Time from quota reservation to a Ready, Retry or Rejected being written",
            time_to_decision.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Failed reconciles, by error kind",
            errors.clone(),
        );
        registry.register(
            "write_conflicts",
            "Status writes refused because the Workload changed since it was read (decided again)",
            conflicts.clone(),
        );
        registry.register(
            "check_active",
            "1 while the AdmissionCheck is Active, 0 while it is not",
            check_active.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica leads (holds the Lease, or runs without leader election), 0 while it stands by",
            leader.clone(),
        );
        Self {
            leader,
            decisions,
            retry_delay,
            attempt,
            time_to_decision,
            errors,
            conflicts,
            check_active,
        }
    }

    /// This replica took or lost the lead.
    pub fn leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
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
        let labels = StateLabels {
            check: check.into(),
            state: state.to_string(),
        };
        self.decisions.get_or_create(&labels).inc();
        let check_labels = CheckLabels {
            check: check.into(),
        };
        self.attempt
            .get_or_create(&check_labels)
            .observe(f64::from(attempt));
        if let Some(delay) = retry_delay {
            self.retry_delay.get_or_create(&check_labels).observe(delay);
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
        self.conflicts
            .get_or_create(&CheckLabels {
                check: check.into(),
            })
            .inc();
    }

    pub fn check_active(&self, check: &str, active: Option<bool>) {
        let labels = CheckLabels {
            check: check.into(),
        };
        match active {
            Some(a) => {
                self.check_active.get_or_create(&labels).set(i64::from(a));
            }
            None => {
                self.check_active.remove(&labels);
            }
        }
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

//! The capacity-buffer controller's own metrics, served beside the SDK's on `/metrics`
//! (prefix `kueue_capacity_buffer_`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CheckLabels {
    check: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    check: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReleaseLabels {
    why: String,
}

/// Why a Node's protection ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProtectionEnd {
    /// Every pod of the Workload is bound.
    PodsBound,
    /// The config's protectionSeconds ran out first.
    Expired,
    /// The Workload released the check (finished, evicted, deleted, ...), or is gone.
    Released,
}

impl ProtectionEnd {
    fn label(self) -> &'static str {
        match self {
            ProtectionEnd::PodsBound => "pods_bound",
            ProtectionEnd::Expired => "expired",
            ProtectionEnd::Released => "released",
        }
    }
}

/// Counters, histograms and gauges of the check.
#[derive(Debug)]
pub struct Metrics {
    buffers_created: Family<CheckLabels, Counter>,
    outcomes: Family<OutcomeLabels, Counter>,
    time_to_capacity: Family<CheckLabels, Histogram, fn() -> Histogram>,
    protections_ended: Family<ReleaseLabels, Counter>,
    nodes_protected: Gauge,
}

/// Seconds to an hour: Karpenter launches in seconds on kwok, minutes on a cloud.
fn seconds() -> Histogram {
    Histogram::new([
        1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 3600.0,
    ])
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            buffers_created: Family::default(),
            outcomes: Family::default(),
            time_to_capacity: Family::new_with_constructor(seconds),
            protections_ended: Family::default(),
            nodes_protected: Gauge::default(),
        }
    }
}

impl Metrics {
    /// Registers every metric under `kueue_capacity_buffer_`.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("kueue_capacity_buffer");
        r.register(
            "buffers_created",
            "CapacityBuffers created, by AdmissionCheck (one per podset and attempt)",
            self.buffers_created.clone(),
        );
        r.register(
            "outcomes",
            "Attempts that ended, by AdmissionCheck and outcome: capacity_ready, timed_out, unprovisionable (pods Karpenter cannot place), unresolved (a template Karpenter cannot resolve)",
            self.outcomes.clone(),
        );
        r.register(
            "time_to_capacity_seconds",
            "From the first CapacityBuffer of an attempt to its capacity being ready (every NodeClaim Ready)",
            self.time_to_capacity.clone(),
        );
        r.register(
            "node_protections_ended",
            "Nodes whose protection from consolidation (karpenter.sh/do-not-disrupt) this controller removed, by why: pods_bound, expired, released",
            self.protections_ended.clone(),
        );
        r.register(
            "nodes_protected",
            "Nodes this controller keeps from consolidation now, while an admitted Workload's pods are not all bound",
            self.nodes_protected.clone(),
        );
    }

    /// `n` buffers were created for `check`.
    pub fn created(&self, check: &str, n: usize) {
        self.buffers_created
            .get_or_create(&CheckLabels {
                check: check.into(),
            })
            .inc_by(n as u64);
    }

    /// An attempt of `check` ended with `outcome`.
    pub fn outcome(&self, check: &str, outcome: &'static str) {
        self.outcomes
            .get_or_create(&OutcomeLabels {
                check: check.into(),
                outcome: outcome.into(),
            })
            .inc();
    }

    /// The capacity of an attempt of `check` was ready `seconds` after its first buffer.
    pub fn capacity_ready(&self, check: &str, seconds: f64) {
        self.outcome(check, "capacity_ready");
        self.time_to_capacity
            .get_or_create(&CheckLabels {
                check: check.into(),
            })
            .observe(seconds);
    }

    /// A Node's protection ended.
    pub fn protection_ended(&self, why: ProtectionEnd) {
        self.protections_ended
            .get_or_create(&ReleaseLabels {
                why: why.label().into(),
            })
            .inc();
    }

    /// How many Nodes are protected now.
    pub fn set_protected(&self, n: usize) {
        self.nodes_protected
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;

    #[test]
    fn the_metrics_are_served_under_the_prefix() {
        let m = Metrics::default();
        let mut registry = Registry::default();
        m.register(&mut registry);
        m.created("capacity", 2);
        m.capacity_ready("capacity", 12.0);
        m.protection_ended(ProtectionEnd::PodsBound);
        m.set_protected(3);
        let mut out = String::new();
        encode(&mut out, &registry).expect("encode");
        for line in [
            "kueue_capacity_buffer_buffers_created_total{check=\"capacity\"} 2",
            "kueue_capacity_buffer_outcomes_total{check=\"capacity\",outcome=\"capacity_ready\"} 1",
            "kueue_capacity_buffer_time_to_capacity_seconds_count{check=\"capacity\"} 1",
            "kueue_capacity_buffer_node_protections_ended_total{why=\"pods_bound\"} 1",
            "kueue_capacity_buffer_nodes_protected 3",
        ] {
            assert!(out.contains(line), "{line} in:\n{out}");
        }
    }
}

//! The provisioning controller's own metrics, served beside the SDK's on `/metrics`
//! (prefix `kueue_provisioning_`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CheckLabels {
    check: String,
}

/// Counters and histograms by AdmissionCheck.
#[derive(Debug)]
pub struct Metrics {
    created: Family<CheckLabels, Counter>,
    provisioned: Family<CheckLabels, Counter>,
    failed: Family<CheckLabels, Counter>,
    booking_expired: Family<CheckLabels, Counter>,
    capacity_revoked: Family<CheckLabels, Counter>,
    timed_out: Family<CheckLabels, Counter>,
    stranded: Family<CheckLabels, Counter>,
    attempt: Family<CheckLabels, Histogram, fn() -> Histogram>,
    time_to_provisioned: Family<CheckLabels, Histogram, fn() -> Histogram>,
    time_to_request: Family<CheckLabels, Histogram, fn() -> Histogram>,
}

fn attempts() -> Histogram {
    Histogram::new([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0])
}

/// Seconds to minutes to hours: autoscaling takes a while, queued provisioning much longer.
fn seconds() -> Histogram {
    Histogram::new([
        1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0, 14400.0,
    ])
}

/// A request condition this controller counts when it turns true.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Transition {
    /// `Provisioned`, with the seconds since the request was created.
    Provisioned(f64),
    /// `Failed`.
    Failed,
    /// `BookingExpired`.
    BookingExpired,
    /// `CapacityRevoked`.
    CapacityRevoked,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Empty metrics, not yet registered.
    pub fn new() -> Self {
        Self {
            created: Family::default(),
            provisioned: Family::default(),
            failed: Family::default(),
            booking_expired: Family::default(),
            capacity_revoked: Family::default(),
            timed_out: Family::default(),
            stranded: Family::default(),
            attempt: Family::new_with_constructor(attempts),
            time_to_provisioned: Family::new_with_constructor(seconds),
            time_to_request: Family::new_with_constructor(seconds),
        }
    }

    /// Registers every metric under `kueue_provisioning_`.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("kueue_provisioning");
        r.register(
            "requests_created",
            "ProvisioningRequests created, by check",
            self.created.clone(),
        );
        r.register(
            "requests_provisioned",
            "ProvisioningRequests that became Provisioned",
            self.provisioned.clone(),
        );
        r.register(
            "requests_failed",
            "ProvisioningRequests that became Failed",
            self.failed.clone(),
        );
        r.register(
            "requests_booking_expired",
            "ProvisioningRequests whose booking expired",
            self.booking_expired.clone(),
        );
        r.register(
            "requests_capacity_revoked",
            "ProvisioningRequests whose capacity was revoked",
            self.capacity_revoked.clone(),
        );
        r.register(
            "requests_timed_out",
            "ProvisioningRequests not Provisioned within the configured timeout (a failed attempt)",
            self.timed_out.clone(),
        );
        r.register(
            "requests_stranded",
            "Admitted Workloads retried: pods consuming the request unscheduled when its booking ran out",
            self.stranded.clone(),
        );
        r.register(
            "request_attempt",
            "Attempt number of each ProvisioningRequest created (1 for a Workload's first)",
            self.attempt.clone(),
        );
        r.register(
            "time_to_provisioned_seconds",
            "Time from a ProvisioningRequest's creation to its Provisioned condition",
            self.time_to_provisioned.clone(),
        );
        r.register(
            "time_to_request_seconds",
            "Time from a Workload's quota reservation to the creation of its ProvisioningRequest",
            self.time_to_request.clone(),
        );
    }

    fn labels(check: &str) -> CheckLabels {
        CheckLabels {
            check: check.to_string(),
        }
    }

    /// A request was created for `attempt`, `since_reserved` seconds after the Workload's quota
    /// reservation (`None`: either time is unknown).
    pub fn created(&self, check: &str, attempt: u32, since_reserved: Option<f64>) {
        let l = Self::labels(check);
        self.created.get_or_create(&l).inc();
        self.attempt.get_or_create(&l).observe(f64::from(attempt));
        if let Some(secs) = since_reserved {
            self.time_to_request.get_or_create(&l).observe(secs);
        }
    }

    /// A request's condition turned true.
    pub fn transition(&self, check: &str, t: Transition) {
        let l = Self::labels(check);
        match t {
            Transition::Provisioned(secs) => {
                self.provisioned.get_or_create(&l).inc();
                self.time_to_provisioned.get_or_create(&l).observe(secs);
            }
            Transition::Failed => {
                self.failed.get_or_create(&l).inc();
            }
            Transition::BookingExpired => {
                self.booking_expired.get_or_create(&l).inc();
            }
            Transition::CapacityRevoked => {
                self.capacity_revoked.get_or_create(&l).inc();
            }
        }
    }

    /// A request timed out.
    pub fn timed_out(&self, check: &str) {
        self.timed_out.get_or_create(&Self::labels(check)).inc();
    }

    /// An admitted Workload's pods were unplaced when its request's booking ran out.
    pub fn stranded(&self, check: &str) {
        self.stranded.get_or_create(&Self::labels(check)).inc();
    }
}

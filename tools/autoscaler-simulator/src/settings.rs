//! What the simulator serves and its timings, with cluster-autoscaler 1.36.1's defaults, and the
//! duration syntax of its flags.

use std::time::Duration;

use crate::node_groups::{DEFAULT_GROUP_LABEL, NodeGroup};
use crate::script::Script;

/// How many `BookingExpired`/`Expired` writes one loop makes at most (hard-coded in
/// cluster-autoscaler).
pub const MAX_EXPIRY_UPDATES_PER_LOOP: usize = 20;

/// How many request UIDs the backoff remembers (`--provisioning-request-max-backoff-cache-size`);
/// the least recently used is forgotten beyond.
pub const BACKOFF_CACHE_SIZE: usize = 1000;

/// What the simulator serves, and how. [`Settings::default`] is cluster-autoscaler 1.36.1's
/// defaults with no node group and nothing scripted.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// Requests of these classes follow [`Self::default_script`] (scripted mode), unless their
    /// pod template names its own script.
    pub scripted_classes: Vec<String>,
    /// The script of scripted requests whose pod template names none.
    pub default_script: Script,
    /// Only ProvisioningRequests, PodTemplates and Pods of this namespace are watched (Nodes
    /// are cluster-scoped); `None`: all namespaces.
    pub namespace: Option<String>,
    /// The node groups scale-ups and scale-downs act on; none: no Node is ever created or
    /// deleted.
    pub node_groups: Vec<NodeGroup>,
    /// The label naming a Node's group (the kwok provider's `fromNodeLabelKey`).
    pub node_group_label: String,
    /// The pause between loops without activity (`--scan-interval`, 10 s).
    pub scan_interval: Duration,
    /// The first retry delay of a Provisioned=False request
    /// (`--provisioning-request-initial-backoff-time`, 1 min).
    pub initial_backoff: Duration,
    /// The longest retry delay (`--provisioning-request-max-backoff-time`, 10 min).
    pub max_backoff: Duration,
    /// How long a Provisioned=True request books its capacity (hard-coded 10 min).
    pub booking_duration: Duration,
    /// How long after creation a never-provisioned request fails `Expired` (hard-coded 7 days).
    pub expire_after: Duration,
    /// How long after its Provisioned or Failed condition a request is deleted (hard-coded 7
    /// days).
    pub request_ttl: Duration,
    /// How long a Node stays unneeded before it is deleted (`--scale-down-unneeded-time`, 10
    /// min).
    pub scale_down_unneeded_time: Duration,
    /// How long scale-down waits after a scale-up (`--scale-down-delay-after-add`, 10 min); a
    /// check-capacity request found to fit counts as one (rule 19).
    pub scale_down_delay_after_add: Duration,
    /// Up to this many check-capacity requests per loop (`--check-capacity-batch-processing`
    /// with `--check-capacity-provisioning-request-max-batch-size`); 0 or 1: no batching, one
    /// request per loop (the default).
    pub check_capacity_batch_size: usize,
    /// The most Nodes one scale-up adds (`--max-nodes-per-scaleup`, 1000).
    pub max_nodes_per_scaleup: usize,
}

impl Default for Settings {
    fn default() -> Self {
        let minute = Duration::from_secs(60);
        let week = Duration::from_secs(7 * 24 * 3600);
        Self {
            scripted_classes: Vec::new(),
            default_script: Script::default(),
            namespace: None,
            node_groups: Vec::new(),
            node_group_label: DEFAULT_GROUP_LABEL.to_string(),
            scan_interval: Duration::from_secs(10),
            initial_backoff: minute,
            max_backoff: 10 * minute,
            booking_duration: 10 * minute,
            expire_after: week,
            request_ttl: week,
            scale_down_unneeded_time: 10 * minute,
            scale_down_delay_after_add: 10 * minute,
            check_capacity_batch_size: 0,
            max_nodes_per_scaleup: 1000,
        }
    }
}

impl Settings {
    /// Whether requests of this class are scripted by class.
    pub fn scripts_class(&self, class: &str) -> bool {
        self.scripted_classes.iter().any(|c| c == class)
    }
}

/// Why a duration does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{text:?} is not a duration (expected e.g. 10s, 1m30s, 1.5h, 7d; units ns, us, ms, s, m, h, d)"
)]
pub struct DurationError {
    text: String,
}

fn unit_nanos(unit: &str) -> Option<u128> {
    Some(match unit {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60 * 1_000_000_000,
        "h" => 3600 * 1_000_000_000,
        "d" => 24 * 3600 * 1_000_000_000,
        _ => return None,
    })
}

/// A duration as cluster-autoscaler's flags take them (Go's `time.ParseDuration`: `10s`,
/// `1m30s`, `1.5h`; a bare `0`), plus days (`7d`).
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let bad = || DurationError {
        text: text.to_string(),
    };
    let mut rest = text.trim();
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(bad());
    }
    let mut nanos: u128 = 0;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let (number, after) = rest.split_at(number_end);
        let unit_end = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_end);
        let unit = unit_nanos(unit).ok_or_else(bad)?;
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if (whole.is_empty() && fraction.is_empty()) || fraction.len() > 9 {
            return Err(bad());
        }
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| bad())?
        };
        let mut part = whole.checked_mul(unit).ok_or_else(bad)?;
        if !fraction.is_empty() {
            let digits: u128 = fraction.parse().map_err(|_| bad())?;
            part += digits * unit / 10u128.pow(fraction.len() as u32);
        }
        nanos = nanos.checked_add(part).ok_or_else(bad)?;
        rest = next;
    }
    let secs = u64::try_from(nanos / 1_000_000_000).map_err(|_| bad())?;
    Ok(Duration::new(secs, (nanos % 1_000_000_000) as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_cluster_autoscalers() {
        let s = Settings::default();
        assert_eq!(s.scan_interval, Duration::from_secs(10));
        assert_eq!(s.initial_backoff, Duration::from_secs(60));
        assert_eq!(s.max_backoff, Duration::from_secs(600));
        assert_eq!(s.booking_duration, Duration::from_secs(600));
        assert_eq!(s.expire_after, Duration::from_secs(604_800));
        assert_eq!(s.request_ttl, Duration::from_secs(604_800));
        assert_eq!(s.scale_down_unneeded_time, Duration::from_secs(600));
        assert_eq!(s.scale_down_delay_after_add, Duration::from_secs(600));
        assert_eq!(s.max_nodes_per_scaleup, 1000);
        assert_eq!(s.check_capacity_batch_size, 0);
        assert_eq!(s.node_group_label, "kwok-nodegroup");
        assert!(!s.scripts_class("anything"));
    }

    #[test]
    fn durations_parse_like_go_flags() {
        for (text, expected) in [
            ("10s", Duration::from_secs(10)),
            ("1m30s", Duration::from_secs(90)),
            ("1.5h", Duration::from_secs(5400)),
            ("7d", Duration::from_secs(604_800)),
            ("250ms", Duration::from_millis(250)),
            ("0", Duration::ZERO),
            ("0s", Duration::ZERO),
            (" 2m ", Duration::from_secs(120)),
            (".5s", Duration::from_millis(500)),
        ] {
            assert_eq!(parse_duration(text), Ok(expected), "{text}");
        }
        for text in [
            "",
            "10",
            "s",
            "1x",
            "-1s",
            "1.2.3s",
            "1s2",
            "99999999999999999999999d",
        ] {
            assert!(parse_duration(text).is_err(), "{text}");
        }
    }
}

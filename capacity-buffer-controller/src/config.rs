//! The AdmissionCheck's parameters: a `CapacityBufferCheckConfig`, cluster-scoped as Kueue
//! requires. Every field has a default, so an empty spec is a working config.

use std::time::Duration;

use kube::CustomResource;
use kueue_admission_sdk::api::validation;
use kueue_admission_sdk::retry::{Backoff, ExponentialBackoff};
use kueue_admission_sdk::{CheckParameters, ParametersKind, RetryPolicy};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of [`CapacityBufferCheckConfig`].
pub const GROUP: &str = "kueue-admission-checks.dev";

/// The node label that dedicates capacity to one Workload unless a config names another.
pub const DEFAULT_NODE_LABEL: &str = "kueue-admission-checks.dev/capacity-for";

const DEFAULT_PROVISIONING_TIMEOUT: u32 = 600;
const DEFAULT_UNPROVISIONABLE_GRACE: u32 = 30;
const DEFAULT_PROTECTION: u32 = 600;
const DEFAULT_BACKOFF_LIMIT: u32 = 3;
const DEFAULT_BACKOFF_BASE: u32 = 60;
const DEFAULT_BACKOFF_MAX: u32 = 1800;

/// How the check asks Karpenter for capacity, how long it waits, and how it retries.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(
    group = "kueue-admission-checks.dev",
    version = "v1alpha1",
    kind = "CapacityBufferCheckConfig",
    plural = "capacitybuffercheckconfigs"
)]
#[serde(rename_all = "camelCase")]
pub struct CapacityBufferCheckConfigSpec {
    /// The node label that dedicates Karpenter's capacity to one Workload (default
    /// `kueue-admission-checks.dev/capacity-for`). Each buffer's pods select
    /// `<nodeLabel>=<Workload uid>`, and so do the Workload's pods once admitted; a NodePool
    /// must allow it with the requirement `{key: <nodeLabel>, operator: Exists}`, so that
    /// Karpenter labels the Nodes it launches with the value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_label: Option<String>,
    /// Seconds from the buffers' creation until the capacity must be there (default 600;
    /// 1 to 86400): past it the attempt fails and is retried with the backoff.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioning_timeout_seconds: Option<u32>,
    /// Seconds Karpenter may report pods it cannot place (a NodePool's limits, no instance
    /// type that fits) before the check says so as a failure (default 30; 0 to 3600). The
    /// Workload then keeps its quota for the runtime's hold while the message shows, then
    /// gives it back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unprovisionable_grace_seconds: Option<u32>,
    /// Seconds the Nodes made for an admitted Workload are kept from consolidation while its
    /// pods are not all bound to them (default 600; 0 to 86400; 0 protects nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protection_seconds: Option<u32>,
    /// Karpenter's provisioning strategy for the buffers; absent: Karpenter's default
    /// (`buffer.x-k8s.io/active-capacity`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioning_strategy: Option<String>,
    /// Retries of failed attempts (Kueue's ProvisioningRequest semantics and defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_strategy: Option<RetryStrategy>,
}

/// Retries of a failed attempt: delay of retry n = min(base · 2^(n−1), max).
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RetryStrategy {
    /// Retries after the first attempt (default 3; 0 to 100); past them `Rejected`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_limit_count: Option<u32>,
    /// Seconds before the first retry (default 60; 1 to 86400).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_base_seconds: Option<u32>,
    /// Longest delay in seconds (default 1800; at least the base, at most 86400).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_max_seconds: Option<u32>,
}

fn secs(s: u32) -> Duration {
    Duration::from_secs(s.into())
}

impl CapacityBufferCheckConfigSpec {
    /// The node label key.
    pub fn node_label(&self) -> &str {
        self.node_label.as_deref().unwrap_or(DEFAULT_NODE_LABEL)
    }

    /// How long the capacity may take.
    pub fn provisioning_timeout(&self) -> Duration {
        secs(
            self.provisioning_timeout_seconds
                .unwrap_or(DEFAULT_PROVISIONING_TIMEOUT),
        )
    }

    /// How long unplaceable pods are tolerated.
    pub fn unprovisionable_grace(&self) -> Duration {
        secs(
            self.unprovisionable_grace_seconds
                .unwrap_or(DEFAULT_UNPROVISIONABLE_GRACE),
        )
    }

    /// How long an admitted Workload's Nodes are protected at most.
    pub fn protection(&self) -> Duration {
        secs(self.protection_seconds.unwrap_or(DEFAULT_PROTECTION))
    }

    /// The retry policy of failed attempts.
    pub fn retry_policy(&self) -> RetryPolicy {
        let s = self.retry_strategy.clone().unwrap_or_default();
        let base = s.backoff_base_seconds.unwrap_or(DEFAULT_BACKOFF_BASE);
        let max = s
            .backoff_max_seconds
            .unwrap_or(DEFAULT_BACKOFF_MAX)
            .max(base);
        let mut backoff = ExponentialBackoff::kueue_default();
        backoff.base = secs(base);
        backoff.max = secs(max);
        RetryPolicy {
            backoff: Backoff::Exponential(backoff),
            retry_limit: Some(s.backoff_limit_count.unwrap_or(DEFAULT_BACKOFF_LIMIT)),
        }
    }
}

fn within(
    field: &str,
    value: Option<u32>,
    range: std::ops::RangeInclusive<u32>,
) -> Result<(), String> {
    match value {
        Some(v) if !range.contains(&v) => Err(format!(
            "spec.{field} is {v}; it must be {} to {}",
            range.start(),
            range.end()
        )),
        _ => Ok(()),
    }
}

/// Label domains a NodePool may not require (Karpenter refuses them) or that belong to others.
const RESTRICTED_DOMAINS: [&str; 4] = ["kubernetes.io", "k8s.io", "karpenter.sh", "kueue.x-k8s.io"];

impl CheckParameters for CapacityBufferCheckConfig {
    fn reference() -> Option<ParametersKind> {
        Some(ParametersKind {
            group: GROUP,
            version: "v1alpha1",
            kind: "CapacityBufferCheckConfig",
            plural: "capacitybuffercheckconfigs",
        })
    }

    fn validate(&self) -> Result<(), String> {
        let spec = &self.spec;
        let label = spec.node_label();
        validation::qualified_name(label)
            .map_err(|e| format!("spec.nodeLabel {label:?} is not a label key: {e}"))?;
        let domain = label.split_once('/').map(|(d, _)| d).unwrap_or_default();
        if domain.is_empty() {
            return Err(format!(
                "spec.nodeLabel {label:?} has no domain; use one of your own, e.g. example.com/capacity-for"
            ));
        }
        if let Some(r) = RESTRICTED_DOMAINS
            .iter()
            .find(|r| domain == **r || domain.ends_with(&format!(".{r}")))
        {
            return Err(format!(
                "spec.nodeLabel {label:?} is in the {r} domain, which Karpenter or Kubernetes reserve; use one of your own"
            ));
        }
        within(
            "provisioningTimeoutSeconds",
            spec.provisioning_timeout_seconds,
            1..=86_400,
        )?;
        within(
            "unprovisionableGraceSeconds",
            spec.unprovisionable_grace_seconds,
            0..=3600,
        )?;
        within("protectionSeconds", spec.protection_seconds, 0..=86_400)?;
        if let Some(s) = &spec.provisioning_strategy {
            validation::qualified_name(s).map_err(|e| {
                format!("spec.provisioningStrategy {s:?} is not a strategy name: {e}")
            })?;
        }
        if let Some(r) = &spec.retry_strategy {
            within(
                "retryStrategy.backoffLimitCount",
                r.backoff_limit_count,
                0..=100,
            )?;
            within(
                "retryStrategy.backoffBaseSeconds",
                r.backoff_base_seconds,
                1..=86_400,
            )?;
            within(
                "retryStrategy.backoffMaxSeconds",
                r.backoff_max_seconds,
                1..=86_400,
            )?;
            let base = r.backoff_base_seconds.unwrap_or(DEFAULT_BACKOFF_BASE);
            if let Some(max) = r.backoff_max_seconds
                && max < base
            {
                return Err(format!(
                    "spec.retryStrategy.backoffMaxSeconds ({max}) is below backoffBaseSeconds ({base})"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(spec: serde_json::Value) -> CapacityBufferCheckConfig {
        let spec = serde_json::from_value(spec).expect("spec");
        CapacityBufferCheckConfig::new("c", spec)
    }

    #[test]
    fn an_empty_spec_is_valid_and_takes_the_defaults() {
        let c = config(serde_json::json!({}));
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(c.spec.node_label(), DEFAULT_NODE_LABEL);
        assert_eq!(c.spec.provisioning_timeout(), Duration::from_secs(600));
        assert_eq!(c.spec.protection(), Duration::from_secs(600));
        let policy = c.spec.retry_policy();
        assert_eq!(policy.retry_limit, Some(3));
        assert_eq!(policy.validate(), Ok(()));
    }

    #[test]
    fn bad_values_name_the_field_and_what_it_accepts() {
        for (spec, says) in [
            (
                serde_json::json!({"nodeLabel": "capacity-for"}),
                "has no domain",
            ),
            (
                serde_json::json!({"nodeLabel": "karpenter.sh/x"}),
                "reserve",
            ),
            (
                serde_json::json!({"nodeLabel": "node.kubernetes.io/x"}),
                "reserve",
            ),
            (serde_json::json!({"nodeLabel": "a b/c"}), "not a label key"),
            (
                serde_json::json!({"provisioningTimeoutSeconds": 0}),
                "provisioningTimeoutSeconds is 0; it must be 1 to 86400",
            ),
            (
                serde_json::json!({"protectionSeconds": 100000}),
                "protectionSeconds is 100000",
            ),
            (
                serde_json::json!({"retryStrategy": {"backoffBaseSeconds": 100, "backoffMaxSeconds": 10}}),
                "below backoffBaseSeconds",
            ),
            (
                serde_json::json!({"provisioningStrategy": "no spaces allowed"}),
                "not a strategy name",
            ),
        ] {
            let err = config(spec.clone()).validate().expect_err("refused");
            assert!(err.contains(says), "{spec}: {err}");
        }
    }

    #[test]
    fn the_charts_crd_is_the_one_the_binary_prints() {
        use kube::CustomResourceExt;
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../charts/kueue-capacity-buffer-controller/crds/capacitybuffercheckconfigs.yaml"
        );
        let text = std::fs::read_to_string(path).expect("the chart's CRD");
        let json: String = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n");
        let in_chart: serde_json::Value = serde_json::from_str(&json).expect("JSON");
        let printed = serde_json::to_value(CapacityBufferCheckConfig::crd()).expect("serialize");
        assert!(
            in_chart == printed,
            "charts/kueue-capacity-buffer-controller/crds/capacitybuffercheckconfigs.yaml differs from --print-crd: regenerate it"
        );
    }

    #[test]
    fn a_negative_or_absurd_number_is_refused_when_read() {
        let spec: Result<CapacityBufferCheckConfigSpec, _> =
            serde_json::from_value(serde_json::json!({"protectionSeconds": -1}));
        assert!(spec.is_err());
        let spec: Result<CapacityBufferCheckConfigSpec, _> =
            serde_json::from_value(serde_json::json!({"protectionSeconds": 1e30}));
        assert!(spec.is_err());
    }
}

//! The check's parameters: Kueue's own `ProvisioningRequestConfig`, read whole (so the extras
//! this controller adds can live in its annotations instead of a forked CRD).

use std::collections::BTreeMap;
use std::time::Duration;

use kueue_admission_sdk::api::validation::qualified_name;
use kueue_admission_sdk::api::{
    ProvisioningRequestConfigSpec, ProvisioningRequestPodSetUpdatesNodeSelector,
};
use kueue_admission_sdk::retry::{Backoff, ExponentialBackoff, MAX_DELAY};
use kueue_admission_sdk::{CheckParameters, ParametersKind, RetryPolicy};
use serde::Deserialize;

use crate::plan::{MAX_PARAMETER_LEN, MAX_PARAMETERS};

/// Annotation on a `ProvisioningRequestConfig`: a request not `Provisioned` this many seconds
/// after it was created counts as a failed attempt. Overrides the controller's
/// `--provisioning-timeout-seconds`; `0` turns the timeout off for this config.
pub const TIMEOUT_ANNOTATION: &str = "kueue-admission-checks.dev/provisioning-timeout-seconds";

/// Kueue's defaults for an absent `retryStrategy` field.
pub const DEFAULT_BACKOFF_LIMIT_COUNT: i32 = 3;
/// Seconds before the second attempt.
pub const DEFAULT_BACKOFF_BASE_SECONDS: i32 = 60;
/// Upper bound of any delay, in seconds.
pub const DEFAULT_BACKOFF_MAX_SECONDS: i32 = 1800;

/// The two merge policies Kueue knows.
pub const MERGE_POLICIES: [&str; 2] = [
    "IdenticalPodTemplates",
    "IdenticalWorkloadSchedulingRequirements",
];

/// A `ProvisioningRequestConfig` as the AdmissionCheck's `spec.parameters` names it.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct ProvisioningParameters {
    /// Only the name and annotations are read.
    #[serde(default)]
    pub metadata: ConfigMetadata,
    /// Kueue's schema, unchanged.
    #[serde(default)]
    pub spec: ProvisioningRequestConfigSpec,
}

/// The part of the config's metadata this controller reads.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct ConfigMetadata {
    /// The config's name, for messages.
    #[serde(default)]
    pub name: String,
    /// Where this controller's extra settings live.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

impl CheckParameters for ProvisioningParameters {
    fn reference() -> Option<ParametersKind> {
        Some(ParametersKind {
            group: "kueue.x-k8s.io",
            version: "v1beta2",
            kind: "ProvisioningRequestConfig",
            plural: "provisioningrequestconfigs",
        })
    }

    fn validate(&self) -> Result<(), String> {
        let spec = &self.spec;
        if spec.provisioning_class_name.is_empty() {
            return Err("spec.provisioningClassName is empty".into());
        }
        if spec.parameters.len() > MAX_PARAMETERS {
            return Err(format!(
                "spec.parameters has {} entries; a ProvisioningRequest takes at most {MAX_PARAMETERS}",
                spec.parameters.len()
            ));
        }
        // Characters, not bytes: the ProvisioningRequest CRD's maxLength counts characters, and
        // so does the plan that copies these values into a request.
        if let Some((key, _)) = spec
            .parameters
            .iter()
            .find(|(_, v)| v.chars().count() > MAX_PARAMETER_LEN)
        {
            return Err(format!(
                "spec.parameters[{key:?}] is longer than the {MAX_PARAMETER_LEN} characters a \
                 ProvisioningRequest allows"
            ));
        }
        if let Some(policy) = &spec.pod_set_merge_policy
            && !MERGE_POLICIES.contains(&policy.as_str())
        {
            return Err(format!(
                "spec.podSetMergePolicy {policy:?} is not one of {}",
                MERGE_POLICIES.join(", ")
            ));
        }
        if let Some(s) = &spec.retry_strategy {
            for (field, value) in [
                ("backoffLimitCount", s.backoff_limit_count),
                ("backoffBaseSeconds", s.backoff_base_seconds),
                ("backoffMaxSeconds", s.backoff_max_seconds),
            ] {
                if let Some(v) = value
                    && v < 0
                {
                    return Err(format!(
                        "spec.retryStrategy.{field} is {v}; it cannot be negative"
                    ));
                }
            }
        }
        if let Some(e) = self
            .node_selector_updates()
            .iter()
            .find(|e| e.key.is_empty() || e.value_from_provisioning_class_detail.is_empty())
        {
            return Err(format!(
                "spec.podSetUpdates.nodeSelector has an entry with an empty key or \
                 valueFromProvisioningClassDetail: {e:?}"
            ));
        }
        // The CRD takes any key; Kueue's webhook refuses a podSetUpdate whose node selector key
        // is not a label name (403), so every provisioned Workload would wait for nothing.
        for (i, e) in self.node_selector_updates().iter().enumerate() {
            qualified_name(&e.key).map_err(|why| {
                format!(
                    "spec.podSetUpdates.nodeSelector[{i}].key {:?} is not a valid label name: \
                     {why}; Kueue refuses node selectors with such a key",
                    e.key
                )
            })?;
        }
        self.timeout_override()?;
        Ok(())
    }
}

impl ProvisioningParameters {
    /// The retry strategy with Kueue's defaults for absent fields: `min(base · 2^(n−1), max)`
    /// seconds after attempt `n`, a base of 0 meaning no delay and a max of 0 no cap, and at
    /// most `backoffLimitCount` retries.
    pub fn retry_policy(&self) -> RetryPolicy {
        let s = self.spec.retry_strategy.clone().unwrap_or_default();
        let limit = s.backoff_limit_count.unwrap_or(DEFAULT_BACKOFF_LIMIT_COUNT);
        let base = s
            .backoff_base_seconds
            .unwrap_or(DEFAULT_BACKOFF_BASE_SECONDS);
        let max = s.backoff_max_seconds.unwrap_or(DEFAULT_BACKOFF_MAX_SECONDS);
        let backoff = if base <= 0 {
            Backoff::Immediate
        } else if max > 0 && max < base {
            // The CRD accepts a cap below the base; Kueue's formula then waits the cap every
            // time. A fixed delay says the same and passes the SDK's policy validation, which
            // refuses an exponential backoff whose max is below its base (the check would have
            // gone Inactive for a config Kueue's own controller runs).
            Backoff::Fixed(secs(max))
        } else {
            let max = if max <= 0 { MAX_DELAY } else { secs(max) };
            let mut e = ExponentialBackoff::kueue_default();
            e.base = secs(base);
            e.factor = 2.0;
            e.max = max;
            Backoff::Exponential(e)
        };
        RetryPolicy {
            backoff,
            retry_limit: Some(limit.max(0) as u32),
        }
    }

    /// `spec.podSetUpdates.nodeSelector`, empty when absent.
    pub fn node_selector_updates(&self) -> &[ProvisioningRequestPodSetUpdatesNodeSelector] {
        self.spec
            .pod_set_updates
            .as_ref()
            .map(|u| u.node_selector.as_slice())
            .unwrap_or_default()
    }

    /// The timeout the config's annotation sets: `Ok(None)` without the annotation,
    /// `Ok(Some(None))` for `0` (off).
    pub fn timeout_override(&self) -> Result<Option<Option<Duration>>, String> {
        let Some(raw) = self.metadata.annotations.get(TIMEOUT_ANNOTATION) else {
            return Ok(None);
        };
        match raw.trim().parse::<u32>() {
            Ok(0) => Ok(Some(None)),
            Ok(s) => Ok(Some(Some(Duration::from_secs(u64::from(s))))),
            Err(_) => Err(format!(
                "annotation {TIMEOUT_ANNOTATION} is {raw:?}; expected whole seconds \
                 (0 turns the timeout off)"
            )),
        }
    }

    /// The provisioning timeout for requests made with this config.
    pub fn timeout(&self, controller_default: Option<Duration>) -> Option<Duration> {
        match self.timeout_override() {
            Ok(Some(t)) => t,
            _ => controller_default,
        }
    }
}

fn secs(s: i32) -> Duration {
    Duration::from_secs(u64::try_from(s).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kueue_admission_sdk::api::{
        ProvisioningRequestPodSetUpdates, ProvisioningRequestRetryStrategy,
    };

    fn params(spec: ProvisioningRequestConfigSpec) -> ProvisioningParameters {
        ProvisioningParameters {
            metadata: ConfigMetadata::default(),
            spec,
        }
    }

    fn class() -> ProvisioningRequestConfigSpec {
        ProvisioningRequestConfigSpec {
            provisioning_class_name: "check-capacity.autoscaling.x-k8s.io".into(),
            ..Default::default()
        }
    }

    /// [`class`] with a `retryStrategy` of this `backoffLimitCount`, `backoffBaseSeconds` and
    /// `backoffMaxSeconds` (`None`: unset).
    fn retrying(limit: Option<i32>, base: Option<i32>, max: Option<i32>) -> ProvisioningParameters {
        let mut spec = class();
        spec.retry_strategy = Some(ProvisioningRequestRetryStrategy {
            backoff_limit_count: limit,
            backoff_base_seconds: base,
            backoff_max_seconds: max,
        });
        params(spec)
    }

    /// Why [`class`] changed by `change` is refused.
    fn refusal(change: impl FnOnce(&mut ProvisioningRequestConfigSpec)) -> String {
        let mut spec = class();
        change(&mut spec);
        params(spec).validate().expect_err("invalid")
    }

    #[test]
    fn absent_retry_strategy_gives_kueues_defaults_60_120_240_then_rejected() {
        let p = params(class()).retry_policy();
        assert_eq!(p.retry_limit, Some(3));
        let delays: Vec<u64> = (1..=3).map(|n| p.delay(n, 0.0).as_secs()).collect();
        assert_eq!(delays, [60, 120, 240]);
        assert!(!p.exhausted(3));
        assert!(p.exhausted(4));
        // The cap.
        assert_eq!(p.delay(10, 0.0).as_secs(), 1800);
    }

    #[test]
    fn partial_retry_strategy_defaults_the_missing_fields() {
        let p = retrying(Some(1), None, Some(90)).retry_policy();
        assert_eq!(p.retry_limit, Some(1));
        assert_eq!(p.delay(1, 0.0).as_secs(), 60);
        assert_eq!(p.delay(2, 0.0).as_secs(), 90);
    }

    #[test]
    fn base_zero_means_no_delay_and_max_zero_no_cap() {
        let p = retrying(Some(0), Some(0), Some(10)).retry_policy();
        assert_eq!(p.backoff, Backoff::Immediate);
        assert!(p.exhausted(1), "a limit of 0 rejects the first failure");
        let p = retrying(Some(30), Some(10), Some(0)).retry_policy();
        assert_eq!(p.delay(11, 0.0).as_secs(), 10 * 1024);
        assert!(p.validate().is_ok());
    }

    /// What the SDK writes for a `Retry` on `attempt` of a Workload under `policy`, with the
    /// default ceiling of a day: (`requeueAfterSeconds`, the delay asked for when clamped).
    fn written_retry(policy: &RetryPolicy, attempt: u32) -> (Option<i32>, Option<Duration>) {
        use kueue_admission_sdk::api::CheckState;
        use kueue_admission_sdk::testing::{PlanSettings, Planned, WorkloadBuilder, plan_once};
        let now = k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).expect("valid");
        // Kueue's retryCount says which attempt is decided: one less.
        let retries = i32::try_from(attempt.saturating_sub(1)).expect("a small attempt");
        let wl = WorkloadBuilder::new("ns", "wl")
            .at(now)
            .pod_set("main", 1, "1")
            .check("prov", CheckState::Pending)
            .retry_count("prov", retries)
            .quota_reserved("cq", "default")
            .build();
        let decision = crate::outcome::decision(
            &crate::outcome::Outcome::Failed("no capacity".into()),
            "ns/wl-prov-1",
            attempt,
            Vec::new,
        );
        let settings = PlanSettings {
            policy: policy.clone(),
            revalidate_ready: true,
            ..PlanSettings::default()
        };
        match plan_once(&wl, "prov", decision, &settings) {
            Planned::Write(w) => {
                assert_eq!(w.entry.state, CheckState::Retry, "{w:?}");
                (w.entry.requeue_after_seconds, w.clamped_from)
            }
            other => panic!("expected a Retry to write: {other:?}"),
        }
    }

    #[test]
    fn a_cap_below_the_base_waits_the_cap_every_time_as_kueue_does() {
        let p = retrying(Some(4), Some(60), Some(10));
        assert_eq!(p.validate(), Ok(()));
        let policy = p.retry_policy();
        assert_eq!(policy.validate(), Ok(()), "the check stays Active");
        for attempt in 1..=4 {
            // min(60 · 2^(n−1), 10) = 10
            assert_eq!(policy.delay(attempt, 0.5), secs(10));
        }
        assert!(policy.exhausted(5));
    }

    #[test]
    fn an_absurd_retry_strategy_is_valid_and_every_delay_is_clamped_to_the_ceiling() {
        // Accepted by the CRD: a base of 68 years and no cap.
        let p = retrying(Some(3), Some(i32::MAX), Some(0));
        assert_eq!(p.validate(), Ok(()), "the check stays Active");
        let policy = p.retry_policy();
        assert_eq!(policy.validate(), Ok(()), "the SDK takes the policy");
        assert_eq!(
            policy.delay(1, 0.0),
            MAX_DELAY,
            "Kueue's formula, unclamped"
        );
        // Beyond the ceiling: what the SDK's Active message names.
        assert!(policy.longest_delay() > kueue_admission_sdk::retry::DEFAULT_MAX_RETRY_DELAY);
        for attempt in 1..=3 {
            let (secs, clamped_from) = written_retry(&policy, attempt);
            assert_eq!(
                secs,
                Some(86_400),
                "attempt {attempt}: the ceiling is written"
            );
            assert_eq!(
                clamped_from,
                Some(MAX_DELAY),
                "attempt {attempt}: and counted"
            );
        }
    }

    #[test]
    fn delays_within_the_ceiling_are_kueues_exactly() {
        // Kueue's defaults: 60, 120, 240 s, then Rejected (no Retry to write).
        let policy = params(class()).retry_policy();
        for (attempt, secs) in [(1, 60), (2, 120), (3, 240)] {
            assert_eq!(written_retry(&policy, attempt), (Some(secs), None));
        }
        // A cap just under the ceiling is kept as it is.
        let policy = retrying(Some(20), Some(3600), Some(86_400)).retry_policy();
        assert_eq!(written_retry(&policy, 2), (Some(7200), None));
        assert_eq!(written_retry(&policy, 10), (Some(86_400), None));
        // The cap holds after Kueue's jitter too, so the Active message names no clamp.
        assert_eq!(
            policy.longest_delay(),
            kueue_admission_sdk::retry::DEFAULT_MAX_RETRY_DELAY
        );
    }

    #[test]
    fn a_timed_out_request_retries_with_the_policy_so_the_ceiling_applies() {
        let d = crate::outcome::decision(
            &crate::outcome::Outcome::TimedOut(Duration::from_secs(u64::from(u32::MAX))),
            "ns/r",
            1,
            Vec::new,
        );
        assert!(
            matches!(
                d,
                kueue_admission_sdk::Decision::Retry {
                    delay: kueue_admission_sdk::RetryDelay::Policy,
                    ..
                }
            ),
            "{d:?}"
        );
    }

    #[test]
    fn validation_explains_what_is_wrong() {
        let no_class = refusal(|spec| spec.provisioning_class_name.clear());
        assert!(no_class.contains("provisioningClassName"), "{no_class}");
        let merge = refusal(|spec| spec.pod_set_merge_policy = Some("Sometimes".into()));
        assert!(merge.contains("Sometimes"), "{merge}");
        let limit = retrying(Some(-1), None, None)
            .validate()
            .expect_err("invalid");
        assert!(limit.contains("backoffLimitCount"), "{limit}");
        let long = refusal(|spec| {
            spec.parameters.insert("k".into(), "x".repeat(256));
        });
        assert!(long.contains("255"), "{long}");
        // Counted in characters like the CRD and the plan: 255 two-byte characters are fine
        // (they were refused as 510 bytes, so the check went Inactive for a valid config).
        let mut spec = class();
        spec.parameters.insert("k".into(), "é".repeat(255));
        assert_eq!(params(spec).validate(), Ok(()));
        let node_selector = refusal(|spec| {
            spec.pod_set_updates = Some(ProvisioningRequestPodSetUpdates {
                node_selector: vec![ProvisioningRequestPodSetUpdatesNodeSelector {
                    key: "zone".into(),
                    value_from_provisioning_class_detail: String::new(),
                }],
            })
        });
        assert!(node_selector.contains("nodeSelector"), "{node_selector}");
        // The issue's key: a 70-character name part, which the CRD takes and Kueue's webhook
        // refuses on every Ready.
        let long = format!("example.com/{}", "z".repeat(70));
        let key = refusal(|spec| {
            spec.pod_set_updates = Some(ProvisioningRequestPodSetUpdates {
                node_selector: vec![
                    ProvisioningRequestPodSetUpdatesNodeSelector {
                        key: "topology.kubernetes.io/zone".into(),
                        value_from_provisioning_class_detail: "zone".into(),
                    },
                    ProvisioningRequestPodSetUpdatesNodeSelector {
                        key: long.clone(),
                        value_from_provisioning_class_detail: "pool".into(),
                    },
                ],
            })
        });
        assert!(
            key.starts_with("spec.podSetUpdates.nodeSelector[1].key")
                && key.contains(&long)
                && key.contains("70 characters, more than 63"),
            "{key}"
        );
        let spaced = refusal(|spec| {
            spec.pod_set_updates = Some(ProvisioningRequestPodSetUpdates {
                node_selector: vec![ProvisioningRequestPodSetUpdatesNodeSelector {
                    key: "my zone".into(),
                    value_from_provisioning_class_detail: "zone".into(),
                }],
            })
        });
        assert!(spaced.contains("U+0020"), "{spaced}");
        let mut p = params(class());
        p.metadata
            .annotations
            .insert(TIMEOUT_ANNOTATION.into(), "ten minutes".into());
        assert!(
            p.validate()
                .expect_err("invalid")
                .contains(TIMEOUT_ANNOTATION)
        );
        assert!(params(class()).validate().is_ok());
    }

    #[test]
    fn the_timeout_annotation_overrides_the_controller_default() {
        let default = Some(Duration::from_secs(600));
        let mut p = params(class());
        assert_eq!(p.timeout(default), default);
        p.metadata
            .annotations
            .insert(TIMEOUT_ANNOTATION.into(), "30".into());
        assert_eq!(p.timeout(default), Some(Duration::from_secs(30)));
        p.metadata
            .annotations
            .insert(TIMEOUT_ANNOTATION.into(), "0".into());
        assert_eq!(p.timeout(default), None);
    }

    #[test]
    fn reads_a_whole_config_object_and_ignores_unknown_fields() {
        let p: ProvisioningParameters = serde_json::from_value(serde_json::json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ProvisioningRequestConfig",
            "metadata": {"name": "prc", "annotations": {TIMEOUT_ANNOTATION: "120"}, "uid": "x"},
            "spec": {
                "provisioningClassName": "check-capacity.autoscaling.x-k8s.io",
                "managedResources": ["nvidia.com/gpu"],
                "somethingNew": true
            }
        }))
        .expect("parses");
        assert_eq!(p.metadata.name, "prc");
        assert_eq!(p.spec.managed_resources, ["nvidia.com/gpu"]);
        assert_eq!(p.timeout(None), Some(Duration::from_secs(120)));
    }
}

//! The `AlertGate` parameters and the pure verdict: which alerts hold work back, and what a
//! Workload is told.

use std::time::Duration;

use kube::CustomResource;
use kueue_admission_sdk::{CheckParameters, Decision, ParametersKind};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of [`AlertGate`].
pub const GROUP: &str = "kueue-admission-checks.dev";

/// An AdmissionCheck's parameters: which Alertmanager to ask, which alerts hold admission back,
/// and how a held Workload waits. Cluster-scoped, as Kueue requires of parameters.
#[derive(CustomResource, Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(
    group = "kueue-admission-checks.dev",
    version = "v1alpha1",
    kind = "AlertGate",
    plural = "alertgates"
)]
#[serde(rename_all = "camelCase")]
pub struct AlertGateSpec {
    /// Base URL of Alertmanager, `http://host:port` (plain HTTP; put it behind the cluster's
    /// network policy).
    pub alertmanager_url: String,
    /// Alertmanager matchers, all of which a firing alert must meet to hold work back, e.g.
    /// `severity="critical"` or `team=~"ml|batch"`. Silenced and inhibited alerts never do.
    #[serde(default)]
    pub matchers: Vec<String>,
    /// What a held Workload is told: `Pending` (keeps its quota, looked at again every
    /// `recheckSeconds`) or `Retry` (gives the quota back for `retryDelaySeconds`).
    #[serde(default)]
    pub while_firing: WhileFiring,
    /// Seconds between looks at a held Workload (5 to 3600; default 30).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recheck_seconds: Option<u32>,
    /// Delay of a `Retry` (1 to 86400; default 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_delay_seconds: Option<u32>,
}

/// How a held Workload waits.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum WhileFiring {
    /// Keep the quota and look again.
    #[default]
    Pending,
    /// Give the quota back and come again after the delay.
    Retry,
}

const DEFAULT_RECHECK: u32 = 30;
const DEFAULT_RETRY_DELAY: u32 = 300;
/// How many firing alerts a message names.
const NAMED_ALERTS: usize = 3;

impl AlertGateSpec {
    /// Seconds between looks at a held Workload.
    pub fn recheck(&self) -> Duration {
        Duration::from_secs(self.recheck_seconds.unwrap_or(DEFAULT_RECHECK).into())
    }

    /// Delay of a `Retry`.
    pub fn retry_delay(&self) -> Duration {
        Duration::from_secs(
            self.retry_delay_seconds
                .unwrap_or(DEFAULT_RETRY_DELAY)
                .into(),
        )
    }
}

impl CheckParameters for AlertGate {
    fn reference() -> Option<ParametersKind> {
        Some(ParametersKind {
            group: GROUP,
            version: "v1alpha1",
            kind: "AlertGate",
            plural: "alertgates",
        })
    }

    fn validate(&self) -> Result<(), String> {
        let spec = &self.spec;
        let url = &spec.alertmanager_url;
        let Some(rest) = url.strip_prefix("http://") else {
            return Err(format!(
                "spec.alertmanagerUrl {url:?} must start with http:// (this example speaks plain HTTP)"
            ));
        };
        if rest.trim_end_matches('/').is_empty() || rest.contains(char::is_whitespace) {
            return Err(format!("spec.alertmanagerUrl {url:?} names no host"));
        }
        if spec.matchers.is_empty() {
            return Err(
                "spec.matchers is empty: every firing alert would hold back all work; name at \
                 least one label, e.g. severity=\"critical\""
                    .into(),
            );
        }
        for m in &spec.matchers {
            parse_matcher(m).map_err(|e| format!("spec.matchers: {m:?}: {e}"))?;
        }
        if let Some(s) = spec.recheck_seconds
            && !(5..=3600).contains(&s)
        {
            return Err(format!("spec.recheckSeconds is {s}; it must be 5 to 3600"));
        }
        if let Some(s) = spec.retry_delay_seconds
            && !(1..=86_400).contains(&s)
        {
            return Err(format!(
                "spec.retryDelaySeconds is {s}; it must be 1 to 86400"
            ));
        }
        Ok(())
    }
}

/// One matcher: label name, operator and value, as Alertmanager's `filter` takes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Matcher {
    pub name: String,
    pub op: &'static str,
    pub value: String,
}

/// Parses `name="value"` (or `!=`, `=~`, `!~`; the value quoted or bare).
pub fn parse_matcher(text: &str) -> Result<Matcher, String> {
    let text = text.trim();
    let name_end = text
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .ok_or("no operator (=, !=, =~ or !~)")?;
    let name = &text[..name_end];
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        return Err("the label name must start with a letter or _".into());
    }
    let rest = &text[name_end..];
    let op = ["=~", "!~", "!=", "="]
        .into_iter()
        .find(|op| rest.starts_with(op))
        .ok_or("no operator (=, !=, =~ or !~) after the label name")?;
    let raw = rest[op.len()..].trim();
    let value = match raw.strip_prefix('"') {
        Some(quoted) => quoted
            .strip_suffix('"')
            .ok_or("the value's quote is not closed")?
            .to_string(),
        None if raw.contains(['"', ',', '{', '}']) => {
            return Err("a bare value cannot hold quotes, commas or braces".into());
        }
        None => raw.to_string(),
    };
    Ok(Matcher {
        name: name.to_string(),
        op,
        value,
    })
}

/// A firing alert, as much of it as a message names.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct FiringAlert {
    /// Its labels (`alertname` among them).
    #[serde(default)]
    pub labels: std::collections::BTreeMap<String, String>,
}

impl FiringAlert {
    fn describe(&self) -> String {
        let name = self
            .labels
            .get("alertname")
            .map_or("(no alertname)", String::as_str);
        let others: Vec<String> = self
            .labels
            .iter()
            .filter(|(k, _)| *k != "alertname")
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        if others.is_empty() {
            name.to_string()
        } else {
            format!("{name}{{{}}}", others.join(","))
        }
    }
}

/// What the gate answers, given what Alertmanager said (`Err`: it could not be asked).
/// `recheck` is the jittered time until the next look.
pub fn verdict(
    spec: &AlertGateSpec,
    firing: &Result<Vec<FiringAlert>, String>,
    recheck: Duration,
) -> Decision {
    let matchers = spec.matchers.join(", ");
    match firing {
        Ok(alerts) if alerts.is_empty() => Decision::ready(format!(
            "no firing alert matches {matchers} at {}",
            spec.alertmanager_url
        )),
        Ok(alerts) => {
            let mut named: Vec<String> = alerts
                .iter()
                .take(NAMED_ALERTS)
                .map(FiringAlert::describe)
                .collect();
            if alerts.len() > NAMED_ALERTS {
                named.push(format!("and {} more", alerts.len() - NAMED_ALERTS));
            }
            let held = format!(
                "held back while {} alert(s) matching {matchers} fire: {}",
                alerts.len(),
                named.join(", ")
            );
            match spec.while_firing {
                WhileFiring::Pending => Decision::pending_recheck_after(
                    format!("{held}; looking again in {}s", recheck.as_secs()),
                    recheck,
                ),
                WhileFiring::Retry => Decision::retry_after(held, spec.retry_delay()),
            }
        }
        Err(e) => Decision::pending_recheck_after(
            format!(
                "Alertmanager at {} did not answer ({e}): not Ready until it does; looking again in {}s",
                spec.alertmanager_url,
                recheck.as_secs()
            ),
            recheck,
        ),
    }
}

/// `base` with up to 10 % taken off at random, so that many held Workloads do not look again
/// in step (`sample` in `[0, 1)`).
pub fn jittered(base: Duration, sample: f64) -> Duration {
    base.mul_f64(1.0 - 0.1 * sample.clamp(0.0, 1.0))
}

#[cfg(test)]
mod tests {
    use kueue_admission_sdk::api::CheckState;

    use super::*;

    fn spec(matchers: &[&str]) -> AlertGateSpec {
        AlertGateSpec {
            alertmanager_url: "http://am:9093".into(),
            matchers: matchers.iter().map(|m| m.to_string()).collect(),
            while_firing: WhileFiring::Pending,
            recheck_seconds: None,
            retry_delay_seconds: None,
        }
    }

    fn alert(labels: &[(&str, &str)]) -> FiringAlert {
        FiringAlert {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn matchers_parse_like_alertmanagers() {
        assert_eq!(
            parse_matcher("severity=\"critical\""),
            Ok(Matcher {
                name: "severity".into(),
                op: "=",
                value: "critical".into()
            })
        );
        assert_eq!(parse_matcher("team=~\"ml|batch\"").map(|m| m.op), Ok("=~"));
        assert_eq!(
            parse_matcher("env!=prod").map(|m| (m.op, m.value)),
            Ok(("!=", "prod".into()))
        );
        for bad in ["severity", "=x", "1a=x", "a=\"x", "a=x,b=y", "a>x"] {
            assert!(parse_matcher(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn bad_parameters_are_named() {
        let gate = |s: AlertGateSpec| AlertGate::new("g", s).validate();
        assert!(gate(spec(&["severity=\"critical\""])).is_ok());
        assert!(
            gate(spec(&[]))
                .expect_err("refused")
                .contains("spec.matchers is empty")
        );
        assert!(
            gate(spec(&["oops"]))
                .expect_err("refused")
                .contains("spec.matchers: \"oops\"")
        );
        let mut https = spec(&["a=b"]);
        https.alertmanager_url = "https://am".into();
        assert!(
            gate(https)
                .expect_err("refused")
                .contains("must start with http://")
        );
        let mut absurd = spec(&["a=b"]);
        absurd.recheck_seconds = Some(0);
        assert!(
            gate(absurd)
                .expect_err("refused")
                .contains("spec.recheckSeconds is 0")
        );
    }

    #[test]
    fn firing_alerts_hold_work_back_and_an_unreachable_alertmanager_never_admits() {
        let s = spec(&["severity=\"critical\""]);
        let recheck = Duration::from_secs(27);
        let ready = verdict(&s, &Ok(vec![]), recheck);
        assert_eq!(ready.state(), CheckState::Ready);
        assert_eq!(
            ready.message(),
            "no firing alert matches severity=\"critical\" at http://am:9093"
        );
        let held = verdict(
            &s,
            &Ok(vec![alert(&[
                ("alertname", "EtcdDown"),
                ("severity", "critical"),
            ])]),
            recheck,
        );
        assert_eq!(
            held,
            Decision::pending_recheck_after(
                "held back while 1 alert(s) matching severity=\"critical\" fire: EtcdDown{severity=critical}; looking again in 27s",
                recheck
            )
        );
        let mut retrying = s.clone();
        retrying.while_firing = WhileFiring::Retry;
        let many: Vec<FiringAlert> = (0..5)
            .map(|i| alert(&[("alertname", &format!("A{i}"))]))
            .collect();
        let retry = verdict(&retrying, &Ok(many), recheck);
        assert_eq!(retry.state(), CheckState::Retry);
        assert!(
            retry.message().ends_with("A0, A1, A2, and 2 more"),
            "{}",
            retry.message()
        );
        let down = verdict(&s, &Err("connection refused".into()), recheck);
        assert_eq!(down.state(), CheckState::Pending);
        assert!(
            down.message()
                .starts_with("Alertmanager at http://am:9093 did not answer (connection refused)")
        );
    }

    #[test]
    fn jitter_only_shortens_by_a_tenth_at_most() {
        let base = Duration::from_secs(30);
        assert_eq!(jittered(base, 0.0), base);
        assert_eq!(jittered(base, 0.999_999).as_secs(), 27);
        assert_eq!(jittered(base, 7.0), Duration::from_secs(27));
    }
}

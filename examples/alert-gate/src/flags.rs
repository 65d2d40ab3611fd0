//! The binary's flags and environment variables, and the check they describe.

use std::time::Duration;

use clap::Parser;
use kueue_admission_sdk::Options;
use kueue_admission_sdk::options::Seconds;

use crate::{AlertGateCheck, DEFAULT_CONTROLLER_NAME};

/// Kueue admission check: admits a Workload only while no firing Alertmanager alert matches its
/// AlertGate's matchers; tells held Workloads which alerts hold them back.
#[derive(Debug, Parser)]
#[command(version)]
pub struct Flags {
    /// The spec.controllerName of the AdmissionChecks this controller answers.
    #[arg(long, env = "ALERT_GATE_CONTROLLER_NAME", default_value = DEFAULT_CONTROLLER_NAME)]
    pub controller_name: String,

    /// Look again at Ready answers this often and, while a matching alert fires, withdraw
    /// those Kueue has not admitted yet (a Retry: the quota goes back for the gate's
    /// retryDelaySeconds); 0 never withdraws. A running job is never evicted.
    #[arg(long, env = "ALERT_GATE_WITHDRAW_READY_SECONDS", default_value = "0")]
    pub withdraw_ready_seconds: Seconds<0, 3600>,

    /// Seconds one answer of an Alertmanager serves every Workload of a gate (an alert that
    /// starts firing is seen at most this late); 0 asks for every decision.
    #[arg(long, env = "ALERT_GATE_ANSWER_FRESH_SECONDS", default_value = "2")]
    pub answer_fresh_seconds: Seconds<0, 300>,

    /// Print the AlertGate CustomResourceDefinition (YAML as JSON) and exit.
    #[arg(long)]
    pub print_crd: bool,

    #[command(flatten)]
    pub runtime: Options,
}

impl Flags {
    /// The check the flags describe.
    pub fn check(&self) -> AlertGateCheck {
        let check = AlertGateCheck::new(self.controller_name.clone())
            .answers_fresh_for(self.answer_fresh_seconds.duration());
        match self.withdraw_ready_seconds.duration() {
            Duration::ZERO => check,
            every => check.withdraw_ready_every(every),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kueue_admission_sdk::{AdmissionCheckController, Revalidate};

    #[test]
    fn ready_answers_are_withdrawn_only_when_asked() {
        let flags: Flags = kueue_admission_sdk::testing::defaults_refusing(&[
            "--withdraw-ready-seconds=3601",
            "--answer-fresh-seconds=301",
        ]);
        assert_eq!(flags.check().revalidate(), Revalidate::Never);
        let flags =
            Flags::try_parse_from(["alert-gate", "--withdraw-ready-seconds=30"]).expect("parses");
        assert_eq!(
            flags.check().revalidate(),
            Revalidate::Every(Duration::from_secs(30))
        );
    }
}

//! `alert-gate`: flags and environment → the SDK runtime. `alert-gate crd` prints the
//! `AlertGate` CustomResourceDefinition to install.

use std::process::ExitCode;
use std::time::Duration;

use alert_gate::{AlertGate, AlertGateCheck, DEFAULT_CONTROLLER_NAME};
use clap::Parser;
use kube::CustomResourceExt;
use kueue_admission_sdk::Options;

/// Kueue admission check: admits a Workload only while no firing Alertmanager alert matches its
/// AlertGate's matchers; tells held Workloads which alerts hold them back.
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    /// The spec.controllerName of the AdmissionChecks this controller answers.
    #[arg(long, env = "ALERT_GATE_CONTROLLER_NAME", default_value = DEFAULT_CONTROLLER_NAME)]
    controller_name: String,

    /// Look again at Ready answers this often and, while a matching alert fires, withdraw
    /// those Kueue has not admitted yet (a Retry: the quota goes back for the gate's
    /// retryDelaySeconds); 0 never withdraws. A running job is never evicted.
    #[arg(long, env = "ALERT_GATE_WITHDRAW_READY_SECONDS", default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(0..=3600))]
    withdraw_ready_seconds: u64,

    /// Seconds one answer of an Alertmanager serves every Workload of a gate (an alert that
    /// starts firing is seen at most this late); 0 asks for every decision.
    #[arg(long, env = "ALERT_GATE_ANSWER_FRESH_SECONDS", default_value_t = 2,
          value_parser = clap::value_parser!(u64).range(0..=300))]
    answer_fresh_seconds: u64,

    /// Print the AlertGate CustomResourceDefinition (YAML as JSON) and exit.
    #[arg(long)]
    print_crd: bool,

    #[command(flatten)]
    runtime: Options,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.print_crd {
        return match serde_json::to_string_pretty(&AlertGate::crd()) {
            Ok(crd) => {
                println!("{crd}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let mut check = AlertGateCheck::new(cli.controller_name)
        .answers_fresh_for(Duration::from_secs(cli.answer_fresh_seconds));
    if cli.withdraw_ready_seconds > 0 {
        check = check.withdraw_ready_every(Duration::from_secs(cli.withdraw_ready_seconds));
    }
    cli.runtime.run(check).await
}

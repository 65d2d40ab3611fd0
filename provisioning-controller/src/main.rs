//! `kueue-provisioning-controller`: flags and environment → the SDK runtime.

use std::process::ExitCode;

use clap::Parser;
use kueue_admission_sdk::Options;
use kueue_admission_sdk::options::Seconds;
use kueue_provisioning_controller::{DEFAULT_CONTROLLER_NAME, ProvisioningCheck, Settings};

/// Kueue admission check that admits a Workload once cluster-autoscaler has provisioned the
/// capacity for all of its pods, through a ProvisioningRequest. Accepts Kueue's own
/// ProvisioningRequestConfig as the AdmissionCheck's parameters.
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    /// The spec.controllerName of the AdmissionChecks this controller answers. Never Kueue's
    /// own kueue.x-k8s.io/provisioning-request, which Kueue's built-in controller serves.
    #[arg(long, env = "PROVISIONING_CONTROLLER_NAME", default_value = DEFAULT_CONTROLLER_NAME,
          value_parser = controller_name)]
    controller_name: String,

    /// A request not Provisioned this many seconds after its creation counts as a failed
    /// attempt (retried with the config's backoff). Unset waits forever, as Kueue does. A
    /// ProvisioningRequestConfig can override it with the annotation
    /// kueue-admission-checks.dev/provisioning-timeout-seconds.
    #[arg(long, env = "PROVISIONING_TIMEOUT_SECONDS")]
    provisioning_timeout_seconds: Option<Seconds<1, 2_147_483_647>>,

    /// Create the ProvisioningRequest as soon as Kueue reserves quota for a Workload whose
    /// ClusterQueue applies this check, instead of waiting until Kueue adds the check's entry
    /// (seconds later when Kueue is busy). What is created early and not needed is deleted:
    /// when the Workload loses its quota, when the check stops applying, or when the entry
    /// does not come within --early-start-wait-seconds. false waits for the entry, as
    /// Kueue's built-in check does.
    #[arg(long, env = "PROVISIONING_START_EARLY", default_value_t = true,
          action = clap::ArgAction::Set)]
    start_early: bool,

    #[command(flatten)]
    runtime: Options,
}

fn controller_name(value: &str) -> Result<String, String> {
    if value == kueue_provisioning_controller::identity::KUEUE_CONTROLLER_NAME {
        return Err(
            "that name belongs to Kueue's built-in controller, which always serves it; pick another"
                .into(),
        );
    }
    if value.is_empty() || value.len() > 253 {
        return Err("must be 1 to 253 characters".into());
    }
    Ok(value.to_string())
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let check = ProvisioningCheck::new(Settings {
        controller_name: cli.controller_name,
        default_timeout: cli.provisioning_timeout_seconds.map(Seconds::duration),
        start_early: cli.start_early,
    });
    cli.runtime.run(check).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_refusals() {
        let cli: Cli = kueue_admission_sdk::testing::defaults_refusing(&[
            "--controller-name=kueue.x-k8s.io/provisioning-request",
            "--provisioning-timeout-seconds=0",
            "--provisioning-timeout-seconds=ten",
            "--start-early=maybe",
        ]);
        assert!(cli.start_early);
        assert_eq!(cli.controller_name, DEFAULT_CONTROLLER_NAME);
        assert_eq!(cli.provisioning_timeout_seconds, None);
    }
}

//! `kueue-capacity-buffer-controller`: flags and environment → the SDK runtime. `--print-crd`
//! prints the `CapacityBufferCheckConfig` CustomResourceDefinition to install.

use std::process::ExitCode;

use clap::Parser;
use kube::CustomResourceExt;
use kueue_admission_sdk::Options;
use kueue_capacity_buffer_controller::{
    CapacityBufferCheck, CapacityBufferCheckConfig, DEFAULT_CONTROLLER_NAME, Settings,
};

/// Kueue admission check that admits a Workload once Karpenter has launched the Nodes for all
/// of its pods, through CapacityBuffers (Karpenter v1.14+, feature gate CapacityBuffer).
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    /// The spec.controllerName of the AdmissionChecks this controller answers.
    #[arg(long, env = "CAPACITY_BUFFER_CONTROLLER_NAME", default_value = DEFAULT_CONTROLLER_NAME,
          value_parser = controller_name)]
    controller_name: String,

    /// Create the buffers as soon as Kueue reserves quota for a Workload whose ClusterQueue
    /// applies this check, instead of waiting until Kueue adds the check's entry. What is
    /// created early and not needed is deleted.
    #[arg(long, env = "CAPACITY_BUFFER_START_EARLY", default_value_t = true,
          action = clap::ArgAction::Set)]
    start_early: bool,

    /// Print the CapacityBufferCheckConfig CustomResourceDefinition (YAML) and exit.
    #[arg(long)]
    print_crd: bool,

    #[command(flatten)]
    runtime: Options,
}

fn controller_name(value: &str) -> Result<String, String> {
    if value.is_empty() || value.len() > 253 {
        return Err("must be 1 to 253 characters".into());
    }
    Ok(value.to_string())
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.print_crd {
        return match serde_json::to_string_pretty(&CapacityBufferCheckConfig::crd()) {
            Ok(crd) => {
                println!("{crd}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("cannot print the CRD: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let check = CapacityBufferCheck::new(Settings {
        controller_name: cli.controller_name,
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
            "--controller-name=",
            "--start-early=maybe",
        ]);
        assert!(cli.start_early);
        assert_eq!(cli.controller_name, DEFAULT_CONTROLLER_NAME);
    }
}

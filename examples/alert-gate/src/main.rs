//! `alert-gate`: flags and environment → the alert gate check, run by the SDK. `alert-gate
//! --print-crd` prints the `AlertGate` CustomResourceDefinition to install.

use std::process::ExitCode;

use alert_gate::AlertGate;
use alert_gate::flags::Flags;
use clap::Parser;
use kube::CustomResourceExt;

#[tokio::main]
async fn main() -> ExitCode {
    let flags = Flags::parse();
    if flags.print_crd {
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
    let check = flags.check();
    flags.runtime.run(check).await
}

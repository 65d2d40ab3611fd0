//! `license-check`: flags and environment → the license check, run by the SDK.

use std::process::ExitCode;

use clap::Parser;
use license_check::flags::Flags;

#[tokio::main]
async fn main() -> ExitCode {
    let (check, runtime) = Flags::parse().into_check();
    runtime.run(check).await
}

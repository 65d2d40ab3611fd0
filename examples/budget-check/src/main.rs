//! `budget-check`: flags and environment → the budget check, run by the SDK.

use std::process::ExitCode;

use budget_check::flags::Flags;
use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    let (check, runtime) = Flags::parse().into_check();
    runtime.run(check).await
}

//! The smallest check binary built the way the guide says (flags from the SDK's `Options`, one
//! call to `run`), which the end-to-end tests start as a real process to see flags,
//! environment variables, JSON logs, leader election and SIGTERM at work.

use std::convert::Infallible;

use clap::Parser;
use kueue_admission_sdk::{
    AdmissionCheckController, CheckContext, Decision, NoParameters, Options,
};

#[derive(Parser)]
#[command(about = "An admission check that approves every Workload")]
struct Cli {
    /// The controllerName of the AdmissionChecks to answer.
    #[arg(long, env = "CONTROLLER_NAME")]
    controller_name: String,
    #[command(flatten)]
    runtime: Options,
}

struct AlwaysReady(String);

impl AdmissionCheckController for AlwaysReady {
    type Parameters = NoParameters;
    type Error = Infallible;

    fn controller_name(&self) -> &str {
        &self.0
    }

    async fn decide(&self, _: &CheckContext<'_, NoParameters>) -> Result<Decision, Infallible> {
        Ok(Decision::ready("approved by the always-ready check"))
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    cli.runtime.run(AlwaysReady(cli.controller_name)).await
}

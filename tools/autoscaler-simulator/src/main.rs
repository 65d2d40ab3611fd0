//! `autoscaler-simulator`: plays cluster-autoscaler's part on ProvisioningRequests, for the
//! tests and the demo. See [`autoscaler_simulator`] for the scripts.

use std::path::PathBuf;
use std::process::ExitCode;

use autoscaler_simulator::{self as simulator, Script, Settings};
use clap::{Args, FromArgMatches, Parser};
use kueue_admission_sdk::options::{LogFormat, MetricsAddress};
use kueue_admission_sdk::{Options, termination_signal};
use tracing::{error, info};

/// Plays cluster-autoscaler on ProvisioningRequests, following the script annotated
/// (`simulator.kueue-admission-checks.dev/script`) on each request's first pod template.
#[derive(Debug, Parser)]
#[command(name = "autoscaler-simulator", version)]
struct Cli {
    /// Only simulate requests of this provisioningClassName (repeatable, or comma-separated);
    /// default all.
    #[arg(
        long = "class",
        env = "SIMULATOR_CLASSES",
        value_delimiter = ',',
        value_name = "NAME"
    )]
    classes: Vec<String>,

    /// Script of requests whose pod template has none, e.g. "provision" or "fail,provision:5".
    #[arg(
        long,
        env = "SIMULATOR_DEFAULT_SCRIPT",
        default_value = "provision",
        value_name = "SCRIPT"
    )]
    default_script: Script,

    /// Kubeconfig file; without it, $KUBECONFIG, ~/.kube/config, or the in-cluster config.
    #[arg(long, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,

    /// Kubeconfig context to use instead of the current one.
    #[arg(long)]
    context: Option<String>,

    /// Log level or filter directives, e.g. "info" or "info,kube=debug".
    #[arg(long, env = "SIMULATOR_LOG_LEVEL", default_value = "info")]
    log_level: String,

    /// Log format.
    #[arg(long, env = "SIMULATOR_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

impl Cli {
    fn settings(&self) -> Settings {
        Settings {
            classes: self
                .classes
                .iter()
                .map(|c| c.trim().to_string())
                .filter(|c| !c.is_empty())
                .collect(),
            default_script: self.default_script.clone(),
        }
    }

    /// The SDK's options (logging, client) with this binary's flags; the SDK's other flags keep
    /// their defaults (or `KUEUE_AC_*` variables, e.g. the client's rate limit).
    fn sdk_options(&self) -> Result<Options, clap::Error> {
        let command = Options::augment_args(clap::Command::new("autoscaler-simulator"));
        let mut options =
            Options::from_arg_matches(&command.try_get_matches_from(["autoscaler-simulator"])?)?;
        options.kubeconfig = self.kubeconfig.clone();
        options.context = self.context.clone();
        options.log_level = self.log_level.clone();
        options.log_format = self.log_format;
        options.leader_elect = false;
        options.metrics_address = MetricsAddress(None);
        Ok(options)
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let options = match cli.sdk_options() {
        Ok(options) => options,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = options.init_logging() {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    let client = match options.client().await {
        Ok(client) => client,
        Err(e) => {
            error!(error = %e, "no Kubernetes client");
            return ExitCode::FAILURE;
        }
    };
    tokio::select! {
        () = simulator::run(client, cli.settings()) => {
            error!("the ProvisioningRequest watch ended");
            ExitCode::FAILURE
        }
        () = termination_signal() => {
            info!("autoscaler simulator stopped");
            ExitCode::SUCCESS
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use autoscaler_simulator::Step;
    use std::time::Duration;

    #[test]
    fn flags_parse() {
        let cli = Cli::try_parse_from([
            "autoscaler-simulator",
            "--class",
            "a",
            "--class=b,c",
            "--default-script",
            "fail,provision:5",
        ])
        .expect("parses");
        let settings = cli.settings();
        assert_eq!(settings.classes, ["a", "b", "c"]);
        assert_eq!(
            settings.default_script.steps(),
            [
                Step::Fail,
                Step::Provision {
                    after: Duration::from_secs(5)
                }
            ]
        );
        let options = cli.sdk_options().expect("sdk options");
        assert!(!options.leader_elect);
        assert_eq!(options.metrics_address, MetricsAddress(None));
        assert!(Cli::try_parse_from(["autoscaler-simulator", "--default-script=boom"]).is_err());
    }
}

//! `kueue-ac` (also `kubectl kueue-ac` once linked as `kubectl-kueue_ac` on the PATH).

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use kueue_ac::Error;
use kueue_ac::fetch::Target;

#[derive(Parser)]
#[command(
    name = "kueue-ac",
    version,
    about = "Kueue admission checks, seen from a Workload"
)]
struct Cli {
    /// Kubeconfig file; without it, $KUBECONFIG, ~/.kube/config, or the in-cluster config.
    #[arg(long, global = true, env = "KUBECONFIG", value_name = "PATH")]
    kubeconfig: Option<std::path::PathBuf>,
    /// Kubeconfig context to use instead of the current one.
    #[arg(long, global = true)]
    context: Option<String>,
    /// Namespace; default: the kubeconfig context's.
    #[arg(short, long, global = true)]
    namespace: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Why is this Workload (or the Job that owns it) not running, and what would move it.
    Explain {
        /// NAME (a Workload, else a Job), workload/NAME or job/NAME.
        target: Target,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Queue again a Workload that Kueue deactivated (a check's Rejected, ...): setting
    /// spec.active: true alone leaves such a Workload evicted for good. Gives the checks their
    /// retries back (removes their attempt records) unless --keep-attempts.
    Reactivate {
        /// NAME (a Workload, else a Job), workload/NAME or job/NAME.
        target: Target,
        /// Keep the checks' attempt records: their spent retries still count.
        #[arg(long)]
        keep_attempts: bool,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Text,
    Json,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<String, Error> {
    let options = KubeConfigOptions {
        context: cli.context.clone(),
        ..Default::default()
    };
    let config = match &cli.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .map_err(|e| Error::Config(format!("reading {}: {e}", path.display())))?;
            Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(|e| Error::Config(e.to_string()))?
        }
        None if cli.context.is_some() => Config::from_kubeconfig(&options)
            .await
            .map_err(|e| Error::Config(e.to_string()))?,
        None => Config::infer()
            .await
            .map_err(|e| Error::Config(format!("no kubeconfig and not in a cluster: {e}")))?,
    };
    let namespace = cli
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let client = Client::try_from(config).map_err(|e| Error::Config(e.to_string()))?;
    match cli.command {
        Command::Explain { target, output } => {
            let report = kueue_ac::explain(&client, &namespace, &target).await?;
            Ok(match output {
                Output::Text => kueue_ac::render::text(&report),
                Output::Json => {
                    let mut json = serde_json::to_string_pretty(&report)
                        .map_err(|e| Error::Config(format!("encoding the report: {e}")))?;
                    json.push('\n');
                    json
                }
            })
        }
        Command::Reactivate {
            target,
            keep_attempts,
        } => kueue_ac::reactivate(&client, &namespace, &target, keep_attempts).await,
    }
}

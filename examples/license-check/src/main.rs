//! `license-check`: flags and environment → the license check, run by the SDK.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use kueue_admission_sdk::{Options, RetryPolicy};
use license_check::{ConfigMapBackend, DEFAULT_CONTROLLER_NAME, LicenseCheck, Settings};

/// Kueue admission check for floating licenses: a Workload is admitted once the licenses it
/// asks for are free, and holds them until it finishes or is evicted.
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    /// The spec.controllerName of the AdmissionChecks this controller answers.
    #[arg(long, env = "LICENSE_CHECK_CONTROLLER_NAME", default_value = DEFAULT_CONTROLLER_NAME)]
    controller_name: String,

    /// Namespace of the pool and ledger ConfigMaps (and of the leader Lease by default).
    #[arg(long, env = "LICENSE_CHECK_NAMESPACE", default_value = "kueue-system")]
    namespace: String,

    /// ConfigMap listing the licenses that exist, one key per feature, the count as value.
    #[arg(
        long,
        env = "LICENSE_CHECK_POOL_CONFIGMAP",
        default_value = "license-pool"
    )]
    pool_configmap: String,

    /// ConfigMap where the check records who holds what; created on first use.
    #[arg(
        long,
        env = "LICENSE_CHECK_LEDGER_CONFIGMAP",
        default_value = "license-ledger"
    )]
    ledger_configmap: String,

    /// Delay before the second attempt of a Workload that found its licenses taken; doubles
    /// with each attempt.
    #[arg(long, env = "LICENSE_CHECK_BACKOFF_BASE_SECONDS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    backoff_base_seconds: u64,

    /// Longest delay between two attempts.
    #[arg(long, env = "LICENSE_CHECK_BACKOFF_MAX_SECONDS", default_value_t = 600,
          value_parser = clap::value_parser!(u64).range(1..=2_147_483_647))]
    backoff_max_seconds: u64,

    /// Reject a Workload after this many attempts without free licenses; unset waits forever.
    #[arg(long, env = "LICENSE_CHECK_RETRY_LIMIT")]
    retry_limit: Option<u32>,

    /// How soon a Workload left Pending by a missing or malformed pool is looked at again.
    #[arg(long, env = "LICENSE_CHECK_POOL_RECHECK_SECONDS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pool_recheck_seconds: u64,

    /// How often the ledger is checked against the Workloads, reclaiming licenses of Workloads
    /// that finished or vanished unnoticed (e.g. while no controller ran).
    #[arg(long, env = "LICENSE_CHECK_SWEEP_INTERVAL_SECONDS", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    sweep_interval_seconds: u64,

    #[command(flatten)]
    runtime: Options,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut retry_policy = RetryPolicy::exponential(
        Duration::from_secs(cli.backoff_base_seconds),
        2.0,
        Duration::from_secs(cli.backoff_max_seconds.max(cli.backoff_base_seconds)),
        0.1,
    );
    retry_policy.retry_limit = cli.retry_limit;
    let check = LicenseCheck::new(
        Settings {
            controller_name: cli.controller_name,
            retry_policy,
            pool_recheck: Duration::from_secs(cli.pool_recheck_seconds),
            sweep_interval: Duration::from_secs(cli.sweep_interval_seconds),
        },
        ConfigMapBackend {
            namespace: cli.namespace.clone(),
            pool: cli.pool_configmap,
            ledger: cli.ledger_configmap,
        },
    );
    cli.runtime
        .lease_namespace_by_default(cli.namespace)
        .run(check)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_refusals() {
        let cli = Cli::try_parse_from(["license-check"]).expect("defaults parse");
        assert_eq!(cli.controller_name, DEFAULT_CONTROLLER_NAME);
        assert_eq!(
            (cli.namespace.as_str(), cli.pool_configmap.as_str()),
            ("kueue-system", "license-pool")
        );
        assert_eq!(cli.retry_limit, None);
        for bad in [
            "--backoff-base-seconds=0",
            "--sweep-interval-seconds=0",
            "--retry-limit=-1",
        ] {
            assert!(
                Cli::try_parse_from(["license-check", bad]).is_err(),
                "{bad}"
            );
        }
    }
}

//! `budget-check`: flags and environment → the budget check, run by the SDK.

use std::process::ExitCode;
use std::time::Duration;

use budget_check::cost::Prices;
use budget_check::{BudgetCheck, ConfigMapBackend, DEFAULT_CONTROLLER_NAME, Settings};
use clap::Parser;
use kueue_admission_sdk::Options;

/// Kueue admission check for per-namespace budgets: a Workload is admitted and charged if its
/// estimated cost fits its namespace's daily or weekly budget, waits for the next window if not,
/// and gets back what it did not use when it finishes or is evicted.
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    /// The spec.controllerName of the AdmissionChecks this controller answers.
    #[arg(long, env = "BUDGET_CHECK_CONTROLLER_NAME", default_value = DEFAULT_CONTROLLER_NAME)]
    controller_name: String,

    /// Namespace of the budgets and ledger ConfigMaps (and of the leader Lease by default).
    #[arg(long, env = "BUDGET_CHECK_NAMESPACE", default_value = "kueue-system")]
    namespace: String,

    /// ConfigMap of budgets: one key per namespace, valued credits/day or credits/week.
    #[arg(
        long,
        env = "BUDGET_CHECK_BUDGETS_CONFIGMAP",
        default_value = "budgets"
    )]
    budgets_configmap: String,

    /// Ledgers are ConfigMaps named this prefix plus the namespace they record.
    #[arg(
        long,
        env = "BUDGET_CHECK_LEDGER_PREFIX",
        default_value = "budget-ledger-"
    )]
    ledger_prefix: String,

    /// Credits per resource unit per hour: per core of cpu, per GiB of memory, per device of
    /// anything else; unpriced resources are free.
    #[arg(long, env = "BUDGET_CHECK_PRICES", default_value = "cpu=1,memory=0.1")]
    prices: Prices,

    /// Run time assumed for a Workload without maximumExecutionTimeSeconds (Jobs set it with
    /// the kueue.x-k8s.io/max-exec-time-seconds label).
    #[arg(long, env = "BUDGET_CHECK_DEFAULT_RUNTIME_SECONDS", default_value_t = 3600,
          value_parser = clap::value_parser!(u64).range(1..=31_536_000))]
    default_runtime_seconds: u64,

    /// Longest wait of a Workload over budget before it is asked again; unset waits until the
    /// window resets (Kueue keeps its quota reserved meanwhile).
    #[arg(long, env = "BUDGET_CHECK_MAX_WAIT_SECONDS",
          value_parser = clap::value_parser!(u64).range(1..=2_147_483_647))]
    max_wait_seconds: Option<u64>,

    /// How soon a Workload left Pending by a missing or malformed budget is looked at again.
    #[arg(long, env = "BUDGET_CHECK_BUDGET_RECHECK_SECONDS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    budget_recheck_seconds: u64,

    /// How often ledgers are checked against the Workloads, settling charges of Workloads that
    /// finished or vanished unnoticed (e.g. while no controller ran).
    #[arg(long, env = "BUDGET_CHECK_SWEEP_INTERVAL_SECONDS", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    sweep_interval_seconds: u64,

    #[command(flatten)]
    runtime: Options,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let check = BudgetCheck::new(
        Settings {
            controller_name: cli.controller_name,
            prices: cli.prices,
            default_runtime: Duration::from_secs(cli.default_runtime_seconds),
            budget_recheck: Duration::from_secs(cli.budget_recheck_seconds),
            max_wait: cli.max_wait_seconds.map(Duration::from_secs),
            sweep_interval: Duration::from_secs(cli.sweep_interval_seconds),
        },
        ConfigMapBackend {
            namespace: cli.namespace.clone(),
            budgets: cli.budgets_configmap,
            ledger_prefix: cli.ledger_prefix,
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
        let cli = Cli::try_parse_from(["budget-check"]).expect("defaults parse");
        assert_eq!(cli.controller_name, DEFAULT_CONTROLLER_NAME);
        assert_eq!(cli.prices.to_string(), "cpu=1,memory=0.1");
        assert_eq!(cli.max_wait_seconds, None);
        for bad in [
            "--prices=cpu",
            "--prices=cpu=-1",
            "--default-runtime-seconds=0",
            "--max-wait-seconds=0",
        ] {
            assert!(Cli::try_parse_from(["budget-check", bad]).is_err(), "{bad}");
        }
    }
}

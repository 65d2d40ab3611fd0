//! The binary's flags and environment variables, and the check they describe.

use crate::cost::Prices;
use crate::{
    BudgetCheck, ConfigMapBackend, DEFAULT_BUDGETS_CONFIGMAP, DEFAULT_CONTROLLER_NAME,
    DEFAULT_LEDGER_PREFIX, Settings,
};
use clap::Parser;
use kueue_admission_sdk::Options;
use kueue_admission_sdk::options::Seconds;

/// Kueue admission check for per-namespace budgets: a Workload is admitted and charged if its
/// estimated cost fits its namespace's daily or weekly budget, waits for the next window if not,
/// and gets back what it did not use when it finishes or is evicted.
#[derive(Debug, Parser)]
#[command(version)]
pub struct Flags {
    /// The spec.controllerName of the AdmissionChecks this controller answers.
    #[arg(long, env = "BUDGET_CHECK_CONTROLLER_NAME", default_value = DEFAULT_CONTROLLER_NAME)]
    pub controller_name: String,

    /// Namespace of the budgets and ledger ConfigMaps (and of the leader Lease by default).
    #[arg(long, env = "BUDGET_CHECK_NAMESPACE", default_value = "kueue-system")]
    pub namespace: String,

    /// ConfigMap of budgets: one key per namespace, valued credits/day or credits/week.
    #[arg(long, env = "BUDGET_CHECK_BUDGETS_CONFIGMAP", default_value = DEFAULT_BUDGETS_CONFIGMAP)]
    pub budgets_configmap: String,

    /// Ledgers are ConfigMaps named this prefix plus the namespace they record.
    #[arg(long, env = "BUDGET_CHECK_LEDGER_PREFIX", default_value = DEFAULT_LEDGER_PREFIX)]
    pub ledger_prefix: String,

    /// Credits per resource unit per hour: per core of cpu, per GiB of memory, per device of
    /// anything else; unpriced resources are free.
    #[arg(long, env = "BUDGET_CHECK_PRICES", default_value = "cpu=1,memory=0.1")]
    pub prices: Prices,

    /// Run time assumed for a Workload without maximumExecutionTimeSeconds (Jobs set it with
    /// the kueue.x-k8s.io/max-exec-time-seconds label).
    #[arg(
        long,
        env = "BUDGET_CHECK_DEFAULT_RUNTIME_SECONDS",
        default_value = "3600"
    )]
    pub default_runtime_seconds: Seconds<1, 31_536_000>,

    /// Longest wait of a Workload over budget before it is asked again; unset waits until the
    /// window resets (Kueue keeps its quota reserved meanwhile).
    #[arg(long, env = "BUDGET_CHECK_MAX_WAIT_SECONDS")]
    pub max_wait_seconds: Option<Seconds<1, 2_147_483_647>>,

    /// How soon a Workload left Pending by a missing or malformed budget is looked at again.
    #[arg(
        long,
        env = "BUDGET_CHECK_BUDGET_RECHECK_SECONDS",
        default_value = "30"
    )]
    pub budget_recheck_seconds: Seconds<1, 86_400>,

    /// How often ledgers are checked against the Workloads, settling charges of Workloads that
    /// finished or vanished unnoticed (e.g. while no controller ran).
    #[arg(
        long,
        env = "BUDGET_CHECK_SWEEP_INTERVAL_SECONDS",
        default_value = "300"
    )]
    pub sweep_interval_seconds: Seconds<1, 86_400>,

    #[command(flatten)]
    pub runtime: Options,
}

impl Flags {
    /// The check the flags describe, and the runtime options to run it with (the leader Lease
    /// beside the check's ConfigMaps unless a flag or `$POD_NAMESPACE` says otherwise).
    pub fn into_check(self) -> (BudgetCheck, Options) {
        let check = BudgetCheck::new(
            Settings {
                controller_name: self.controller_name,
                prices: self.prices,
                default_runtime: self.default_runtime_seconds.duration(),
                budget_recheck: self.budget_recheck_seconds.duration(),
                max_wait: self.max_wait_seconds.map(Seconds::duration),
                sweep_interval: self.sweep_interval_seconds.duration(),
            },
            ConfigMapBackend {
                namespace: self.namespace.clone(),
                budgets: self.budgets_configmap,
                ledger_prefix: self.ledger_prefix,
            },
        );
        let runtime = self.runtime.lease_namespace_by_default(self.namespace);
        (check, runtime)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_refusals() {
        let cli: Flags = kueue_admission_sdk::testing::defaults_refusing(&[
            "--prices=cpu",
            "--prices=cpu=-1",
            "--default-runtime-seconds=0",
            "--max-wait-seconds=0",
        ]);
        assert_eq!(cli.controller_name, DEFAULT_CONTROLLER_NAME);
        assert_eq!(cli.prices.to_string(), "cpu=1,memory=0.1");
        assert_eq!(cli.max_wait_seconds, None);
    }
}

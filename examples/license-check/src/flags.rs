//! The binary's flags and environment variables, and the check they describe.

use crate::check::backoff;
use crate::{
    ConfigMapBackend, DEFAULT_CONTROLLER_NAME, DEFAULT_LEDGER_CONFIGMAP, DEFAULT_POOL_CONFIGMAP,
    LicenseCheck, Settings,
};
use clap::Parser;
use kueue_admission_sdk::Options;
use kueue_admission_sdk::options::Seconds;

/// Kueue admission check for floating licenses: a Workload is admitted once the licenses it
/// asks for are free, and holds them until it finishes or is evicted.
#[derive(Debug, Parser)]
#[command(version)]
pub struct Flags {
    /// The spec.controllerName of the AdmissionChecks this controller answers.
    #[arg(long, env = "LICENSE_CHECK_CONTROLLER_NAME", default_value = DEFAULT_CONTROLLER_NAME)]
    pub controller_name: String,

    /// Namespace of the pool and ledger ConfigMaps (and of the leader Lease by default).
    #[arg(long, env = "LICENSE_CHECK_NAMESPACE", default_value = "kueue-system")]
    pub namespace: String,

    /// ConfigMap listing the licenses that exist, one key per feature, the count as value.
    #[arg(long, env = "LICENSE_CHECK_POOL_CONFIGMAP", default_value = DEFAULT_POOL_CONFIGMAP)]
    pub pool_configmap: String,

    /// ConfigMap where the check records who holds what; created on first use.
    #[arg(long, env = "LICENSE_CHECK_LEDGER_CONFIGMAP", default_value = DEFAULT_LEDGER_CONFIGMAP)]
    pub ledger_configmap: String,

    /// Delay before the second attempt of a Workload that found its licenses taken; doubles
    /// with each attempt.
    #[arg(long, env = "LICENSE_CHECK_BACKOFF_BASE_SECONDS", default_value = "30")]
    pub backoff_base_seconds: Seconds<1, 86_400>,

    /// Longest delay between two attempts.
    #[arg(long, env = "LICENSE_CHECK_BACKOFF_MAX_SECONDS", default_value = "600")]
    pub backoff_max_seconds: Seconds<1, 2_147_483_647>,

    /// Reject a Workload after this many attempts without free licenses; unset waits forever.
    #[arg(long, env = "LICENSE_CHECK_RETRY_LIMIT")]
    pub retry_limit: Option<u32>,

    /// How soon a Workload left Pending by a missing or malformed pool is looked at again.
    #[arg(long, env = "LICENSE_CHECK_POOL_RECHECK_SECONDS", default_value = "30")]
    pub pool_recheck_seconds: Seconds<1, 86_400>,

    /// How often the ledger is checked against the Workloads, reclaiming licenses of Workloads
    /// that finished or vanished unnoticed (e.g. while no controller ran).
    #[arg(
        long,
        env = "LICENSE_CHECK_SWEEP_INTERVAL_SECONDS",
        default_value = "300"
    )]
    pub sweep_interval_seconds: Seconds<1, 86_400>,

    #[command(flatten)]
    pub runtime: Options,
}

impl Flags {
    /// The check the flags describe, and the runtime options to run it with (the leader Lease
    /// beside the check's ConfigMaps unless a flag or `$POD_NAMESPACE` says otherwise).
    pub fn into_check(self) -> (LicenseCheck, Options) {
        let mut retry_policy = backoff(
            self.backoff_base_seconds.duration(),
            self.backoff_max_seconds.duration(),
        );
        retry_policy.retry_limit = self.retry_limit;
        let check = LicenseCheck::new(
            Settings {
                controller_name: self.controller_name,
                retry_policy,
                pool_recheck: self.pool_recheck_seconds.duration(),
                sweep_interval: self.sweep_interval_seconds.duration(),
            },
            ConfigMapBackend {
                namespace: self.namespace.clone(),
                pool: self.pool_configmap,
                ledger: self.ledger_configmap,
            },
        );
        let runtime = self.runtime.lease_namespace_by_default(self.namespace);
        (check, runtime)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kueue_admission_sdk::testing::defaults_refusing;
    use kueue_admission_sdk::{AdmissionCheckController, NoParameters};

    /// The defaults, read back from the check and runtime options they build.
    #[test]
    fn defaults_and_refusals() {
        let (check, runtime) = defaults_refusing::<Flags>(&[
            "--backoff-base-seconds=0",
            "--sweep-interval-seconds=0",
            "--retry-limit=-1",
        ])
        .into_check();
        assert_eq!(check.controller_name(), DEFAULT_CONTROLLER_NAME);
        let backend = check.backend();
        assert_eq!(
            (backend.namespace.as_str(), backend.pool.as_str()),
            ("kueue-system", "license-pool")
        );
        assert_eq!(check.retry_policy(&NoParameters).retry_limit, None);
        assert_eq!(
            runtime.lease_namespace_fallback.as_deref(),
            Some("kueue-system")
        );
    }

    #[test]
    fn a_longest_delay_below_the_first_is_raised_to_it() {
        let flags = Flags::try_parse_from([
            "license-check",
            "--backoff-base-seconds=60",
            "--backoff-max-seconds=10",
            "--retry-limit=3",
        ])
        .expect("parses");
        let (check, _) = flags.into_check();
        let sixty = std::time::Duration::from_secs(60);
        assert_eq!(
            check.retry_policy(&NoParameters),
            backoff(sixty, sixty).with_retry_limit(3)
        );
    }
}

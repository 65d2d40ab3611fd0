//! Command-line flags and environment variables of a check controller, the usual way for a
//! Kubernetes controller: flatten [`Options`] into the binary's own `clap` parser and hand the
//! check to [`Options::run`].
//!
//! ```no_run
//! use clap::Parser;
//! # use kueue_admission_sdk::{AdmissionCheckController, CheckContext, Decision, NoParameters};
//! # struct AlwaysReady;
//! # impl AdmissionCheckController for AlwaysReady {
//! #     type Parameters = NoParameters;
//! #     type Error = std::convert::Infallible;
//! #     fn controller_name(&self) -> &str { "example.com/always-ready" }
//! #     async fn decide(&self, _: &CheckContext<'_, NoParameters>) -> Result<Decision, Self::Error> {
//! #         Ok(Decision::ready("fine"))
//! #     }
//! # }
//!
//! #[derive(Parser)]
//! struct Cli {
//!     #[command(flatten)]
//!     runtime: kueue_admission_sdk::Options,
//! }
//!
//! #[tokio::main]
//! async fn main() -> std::process::ExitCode {
//!     Cli::parse().runtime.run(AlwaysReady).await
//! }
//! ```

mod budget;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use kube::client::ClientBuilder;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tracing::{error, info};
use tracing_subscriber::EnvFilter;

use crate::check::AdmissionCheckController;
use crate::error::Error;
use crate::runtime::{
    DEFAULT_FIELD_MANAGER, LeaderElection, MetricsSecurity, RuntimeConfig, TlsSource,
    lease_name_for, run_until, termination_signal,
};

/// Where an endpoint listens (host:port), or `off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetricsAddress(pub Option<SocketAddr>);

impl std::str::FromStr for MetricsAddress {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.eq_ignore_ascii_case("off") {
            return Ok(Self(None));
        }
        s.parse()
            .map(|a| Self(Some(a)))
            .map_err(|e| format!("{s:?} is neither host:port nor \"off\": {e}"))
    }
}

/// A flag of whole seconds from `MIN` to `MAX`, as the [`Duration`] it means. A check binary
/// declares the range in the field's type and the flag refuses anything outside it:
///
/// ```
/// use clap::Parser;
/// use kueue_admission_sdk::options::Seconds;
///
/// #[derive(Parser)]
/// struct Cli {
///     /// How often the ledger is swept.
///     #[arg(long, env = "MY_CHECK_SWEEP_INTERVAL_SECONDS", default_value = "300")]
///     sweep_interval_seconds: Seconds<1, 86_400>,
/// }
///
/// let cli = Cli::try_parse_from(["check"]).unwrap();
/// assert_eq!(cli.sweep_interval_seconds.duration(), std::time::Duration::from_secs(300));
/// assert!(Cli::try_parse_from(["check", "--sweep-interval-seconds=0"]).is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Seconds<const MIN: u64, const MAX: u64>(u64);

impl<const MIN: u64, const MAX: u64> Seconds<MIN, MAX> {
    /// `seconds`, if it is within the range.
    pub fn new(seconds: u64) -> Option<Self> {
        (MIN..=MAX).contains(&seconds).then_some(Self(seconds))
    }

    /// The number of seconds.
    pub fn get(self) -> u64 {
        self.0
    }

    /// As a duration.
    pub fn duration(self) -> Duration {
        Duration::from_secs(self.0)
    }
}

impl<const MIN: u64, const MAX: u64> From<Seconds<MIN, MAX>> for Duration {
    fn from(seconds: Seconds<MIN, MAX>) -> Duration {
        seconds.duration()
    }
}

impl<const MIN: u64, const MAX: u64> std::fmt::Display for Seconds<MIN, MAX> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl<const MIN: u64, const MAX: u64> std::str::FromStr for Seconds<MIN, MAX> {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let seconds: u64 = s
            .parse()
            .map_err(|_| format!("{s:?} is not a whole number of seconds"))?;
        Self::new(seconds).ok_or_else(|| format!("{seconds} is not in {MIN}..={MAX}"))
    }
}

/// Log output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// Flags (and their environment variables) every check controller shares.
#[derive(Clone, Debug, clap::Args)]
pub struct Options {
    /// Kubeconfig file; without it, $KUBECONFIG, ~/.kube/config, or the in-cluster config.
    #[arg(long, env = "KUBECONFIG", value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,

    /// Kubeconfig context to use instead of the current one.
    #[arg(long, env = "KUEUE_AC_CONTEXT")]
    pub context: Option<String>,

    /// Address of /metrics (host:port), or "off". HTTPS with authentication unless
    /// --metrics-secure=false.
    #[arg(long, env = "KUEUE_AC_METRICS_ADDRESS", default_value = "0.0.0.0:8443")]
    pub metrics_address: MetricsAddress,

    /// Serve /metrics over HTTPS and let only requests through whose bearer token the API
    /// server authenticates (TokenReview) and allows to get the non-resource URL /metrics
    /// (SubjectAccessReview): 401 without a valid token, 403 without the permission. Decisions
    /// are kept 30 s per token (at most 1024 tokens). false serves plain HTTP to anyone.
    #[arg(long, env = "KUEUE_AC_METRICS_SECURE", default_value_t = true, action = clap::ArgAction::Set)]
    pub metrics_secure: bool,

    /// PEM certificate chain served on /metrics (with --metrics-tls-key); without both, a
    /// self-signed certificate is generated at start.
    #[arg(long, env = "KUEUE_AC_METRICS_TLS_CERT", value_name = "PATH")]
    pub metrics_tls_cert: Option<PathBuf>,

    /// PEM private key of --metrics-tls-cert.
    #[arg(long, env = "KUEUE_AC_METRICS_TLS_KEY", value_name = "PATH")]
    pub metrics_tls_key: Option<PathBuf>,

    /// Address of the probes /healthz and /readyz (host:port, plain HTTP, no authentication),
    /// or "off". It may equal --metrics-address only with --metrics-secure=false.
    #[arg(long, env = "KUEUE_AC_HEALTH_ADDRESS", default_value = "0.0.0.0:8081")]
    pub health_address: MetricsAddress,

    /// Workloads reconciled at once (Kueue reconciles 10 Workloads at once as shipped).
    #[arg(long, env = "KUEUE_AC_CONCURRENCY", default_value_t = 10,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrency: u16,

    /// For a check that starts early: more turns kept for early starts, beside --concurrency
    /// (0: early starts share the main turns). Either kind serves the other's work when none of
    /// its own waits.
    #[arg(long, env = "KUEUE_AC_EARLY_START_CONCURRENCY", default_value_t = 10)]
    pub early_start_concurrency: u16,

    /// Longest retry delay written, in seconds; longer ones (an absurd backoff in a parameters
    /// object, an explicit delay) are written as this, counted and shown on the check. Kueue
    /// keeps a Workload's quota for the whole delay.
    #[arg(
        long,
        env = "KUEUE_AC_MAX_RETRY_DELAY_SECONDS",
        default_value = "86400"
    )]
    pub max_retry_delay_seconds: Seconds<1, { i32::MAX as u64 }>,

    /// Seconds a Workload keeps its quota after its check failed in a way retrying cannot fix
    /// (the reason is on its entry) before the check answers Retry and gives the quota back.
    /// The same hold applies to an answer Kueue would refuse, an attempt record the API server
    /// refuses (the Retry is then written without it) and a check that cannot answer (inactive,
    /// or in shadow mode while a ClusterQueue lists it).
    #[arg(
        long,
        env = "KUEUE_AC_PERMANENT_FAILURE_HOLD_SECONDS",
        default_value = "120"
    )]
    pub permanent_failure_hold_seconds: Seconds<0, 86_400>,

    /// Seconds what a check started when a Workload got quota (before Kueue added the check's
    /// entry) waits for that entry before it is released. Only for checks that start early
    /// (the provisioning check does); Kueue adds entries within seconds unless it is busy.
    #[arg(long, env = "KUEUE_AC_EARLY_START_WAIT_SECONDS", default_value = "300")]
    pub early_start_wait_seconds: Seconds<1, 86_400>,

    /// Sustained requests per second to the API server (client-side rate limit; the leader
    /// election's Lease requests are not counted, and Events have a budget of their own of the
    /// same size). At about 5 requests per Workload, 100 answers a burst of 1,000 Workloads in
    /// under a minute; Kueue itself ships with 300.
    #[arg(long, env = "KUEUE_AC_KUBE_API_QPS", default_value_t = 100.0, value_parser = positive_f64)]
    pub kube_api_qps: f64,

    /// Requests allowed in a burst above the sustained rate.
    #[arg(long, env = "KUEUE_AC_KUBE_API_BURST", default_value_t = 200,
          value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub kube_api_burst: u64,

    /// Seconds each API request (not a watch) may wait for its answer once sent, before it
    /// fails and is retried; Lease requests wait at most 10 s. Time spent waiting for the rate
    /// limit does not count.
    #[arg(long, env = "KUEUE_AC_KUBE_API_TIMEOUT_SECONDS", default_value = "30")]
    pub kube_api_timeout_seconds: Seconds<1, 600>,

    /// Shadow mode, for trying a check on a live cluster before it blocks anyone: decide for
    /// Workloads holding quota and publish what would have been answered (Events WouldAnswer,
    /// metric kueue_ac_shadow_decisions_total, the log) without writing it; the AdmissionChecks
    /// show Active=False, reason ShadowMode, so no ClusterQueue may wait on them.
    #[arg(long, env = "KUEUE_AC_SHADOW", default_value_t = false, action = clap::ArgAction::Set,
          default_missing_value = "true", num_args = 0..=1)]
    pub shadow: bool,

    /// In shadow mode, the ClusterQueues whose Workloads are decided (comma-separated); none
    /// named: every ClusterQueue.
    #[arg(
        long,
        env = "KUEUE_AC_SHADOW_CLUSTER_QUEUES",
        value_delimiter = ',',
        value_name = "NAMES"
    )]
    pub shadow_cluster_queues: Vec<String>,

    /// Publish Normal events about the check's answers on Workloads (CheckReady, CheckPending,
    /// CheckRetryCarriedOver); false keeps only Warning events (CheckRetry, CheckRejected,
    /// CheckFailed, ...), one API request less per answer.
    #[arg(long, env = "KUEUE_AC_NORMAL_EVENTS", default_value_t = true, action = clap::ArgAction::Set)]
    pub normal_events: bool,

    /// Elect a leader on a Lease so that several replicas can run and only one writes.
    #[arg(long, env = "KUEUE_AC_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,

    /// Namespace of the leader Lease; default $POD_NAMESPACE, the in-cluster namespace, or the
    /// kubeconfig's namespace.
    #[arg(long, env = "KUEUE_AC_LEADER_ELECTION_NAMESPACE")]
    pub leader_election_namespace: Option<String>,

    /// Where [`Options::run`] puts the Lease when neither the flag nor `$POD_NAMESPACE` says,
    /// instead of the kubeconfig's namespace: set by a binary whose check lives in a namespace
    /// of its own ([`Options::lease_namespace_by_default`]).
    #[arg(skip)]
    pub lease_namespace_fallback: Option<String>,

    /// Name of the leader Lease; default derived from the controller name.
    #[arg(long, env = "KUEUE_AC_LEADER_ELECTION_ID")]
    pub leader_election_id: Option<String>,

    /// Seconds a leader's Lease stays valid without renewal (a standby takes over after that).
    #[arg(long, env = "KUEUE_AC_LEASE_DURATION_SECONDS", default_value = "15")]
    pub lease_duration_seconds: Seconds<3, 3600>,

    /// Prefix of the server-side apply field managers and the events' reporting controller.
    #[arg(long, env = "KUEUE_AC_FIELD_MANAGER", default_value = DEFAULT_FIELD_MANAGER)]
    pub field_manager: String,

    /// Log format.
    #[arg(long, env = "KUEUE_AC_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Log level or filter directives, e.g. "info" or "info,kueue_admission_sdk=debug".
    #[arg(long, env = "KUEUE_AC_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
}

fn positive_f64(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("{s:?} is not a positive number")),
    }
}

impl Options {
    /// Sets up logging as the flags say. Fails on a malformed `--log-level`.
    pub fn init_logging(&self) -> Result<(), Error> {
        let filter = EnvFilter::try_new(&self.log_level)
            .map_err(|e| Error::Config(format!("--log-level {:?}: {e}", self.log_level)))?;
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr);
        // A subscriber set earlier (e.g. by a test) wins; that is not an error.
        let _ = match self.log_format {
            LogFormat::Text => builder.try_init(),
            LogFormat::Json => builder.json().flatten_event(true).try_init(),
        };
        Ok(())
    }

    /// Refuses flags that make sense only together when one is missing.
    pub fn validate(&self) -> Result<(), Error> {
        self.metrics_tls()?;
        if !self.shadow && !self.shadow_cluster_queues.is_empty() {
            return Err(Error::Config(
                "--shadow-cluster-queues names ClusterQueues for shadow mode, but --shadow is \
                 off: add --shadow, or drop the list to enforce the check"
                    .into(),
            ));
        }
        Ok(())
    }

    /// The certificate the metrics flags ask for: files when both are given, self-signed when
    /// neither is, an error when one is missing or metrics are plain.
    fn metrics_tls(&self) -> Result<Option<TlsSource>, Error> {
        match (&self.metrics_tls_cert, &self.metrics_tls_key) {
            (Some(_), _) | (_, Some(_)) if !self.metrics_secure => Err(Error::Config(
                "--metrics-tls-cert/--metrics-tls-key give a certificate, but \
                 --metrics-secure=false serves plain HTTP: drop the files, or serve HTTPS"
                    .into(),
            )),
            _ if !self.metrics_secure => Ok(None),
            (Some(cert), Some(key)) => Ok(Some(TlsSource::Files {
                cert: cert.clone(),
                key: key.clone(),
            })),
            (None, None) => Ok(Some(TlsSource::SelfSigned)),
            (Some(_), None) => Err(Error::Config(
                "--metrics-tls-cert is given without --metrics-tls-key: give both, or neither \
                 for a self-signed certificate"
                    .into(),
            )),
            (None, Some(_)) => Err(Error::Config(
                "--metrics-tls-key is given without --metrics-tls-cert: give both, or neither \
                 for a self-signed certificate"
                    .into(),
            )),
        }
    }

    /// How /metrics is served, as the flags say (a half-given certificate falls back to a
    /// self-signed one here; [`Options::validate`] refuses it).
    pub fn metrics_security(&self) -> MetricsSecurity {
        match self.metrics_tls() {
            Ok(None) => MetricsSecurity::Plain,
            Ok(Some(tls)) => MetricsSecurity::Authenticated { tls },
            Err(_) if !self.metrics_secure => MetricsSecurity::Plain,
            Err(_) => MetricsSecurity::Authenticated {
                tls: TlsSource::SelfSigned,
            },
        }
    }

    /// The client the flags describe, with the client-side rate limit applied to every request.
    pub async fn client(&self) -> Result<Client, Error> {
        rate_limited(
            self.kube_config().await?,
            self.kube_api_qps,
            self.kube_api_burst,
            self.kube_api_timeout_seconds.duration(),
        )
    }

    async fn kube_config(&self) -> Result<Config, Error> {
        let options = KubeConfigOptions {
            context: self.context.clone(),
            ..Default::default()
        };
        match &self.kubeconfig {
            Some(path) => {
                let kubeconfig = Kubeconfig::read_from(path).map_err(|e| {
                    Error::Config(format!("reading kubeconfig {}: {e}", path.display()))
                })?;
                Config::from_custom_kubeconfig(kubeconfig, &options)
                    .await
                    .map_err(|e| Error::Config(format!("kubeconfig {}: {e}", path.display())))
            }
            None if self.context.is_some() => Config::from_kubeconfig(&options)
                .await
                .map_err(|e| Error::Config(format!("kubeconfig: {e}"))),
            None => Config::infer()
                .await
                .map_err(|e| Error::Config(format!("no kubeconfig and not in a cluster: {e}"))),
        }
    }

    /// The runtime settings the flags describe, for the controller named `controller_name`;
    /// `default_namespace` is where the Lease goes unless a flag or `$POD_NAMESPACE` says.
    pub fn runtime_config(&self, controller_name: &str, default_namespace: &str) -> RuntimeConfig {
        let leader_election = self.leader_elect.then(|| {
            let namespace = self
                .leader_election_namespace
                .clone()
                .or_else(|| std::env::var("POD_NAMESPACE").ok())
                .unwrap_or_else(|| default_namespace.to_string());
            let lease = self
                .leader_election_id
                .clone()
                .unwrap_or_else(|| lease_name_for(controller_name));
            let mut election = LeaderElection::new(namespace, lease);
            election.lease_duration = self.lease_duration_seconds.duration();
            election.renew_grace = Duration::from_secs(self.lease_duration_seconds.get() / 3);
            election
        });
        RuntimeConfig {
            metrics_address: self.metrics_address.0,
            metrics_security: self.metrics_security(),
            health_address: self.health_address.0,
            field_manager: self.field_manager.clone(),
            concurrency: self.concurrency,
            early_start_concurrency: self.early_start_concurrency,
            leader_election,
            max_retry_delay: self.max_retry_delay_seconds.duration(),
            permanent_failure_hold: self.permanent_failure_hold_seconds.duration(),
            early_start_wait: self.early_start_wait_seconds.duration(),
            shadow: self
                .shadow
                .then(|| crate::shadow::ShadowScope::of(self.shadow_cluster_queues.clone())),
            normal_events: self.normal_events,
        }
    }

    /// Sets up logging and the client, then runs `controller` (with what it runs while leading)
    /// until SIGTERM or Ctrl-C. Every failure is logged with its reason; the exit code is
    /// non-zero if the controller did not stop cleanly (e.g. it lost its leader Lease and must
    /// restart as a standby).
    pub async fn run<C: AdmissionCheckController>(self, controller: C) -> ExitCode {
        if let Err(e) = self.init_logging() {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
        let result = async {
            self.validate()?;
            let client = self.client().await?;
            let namespace = match &self.lease_namespace_fallback {
                Some(namespace) => namespace.clone(),
                None => client.default_namespace().to_string(),
            };
            let runtime = self.runtime_config(controller.controller_name(), &namespace);
            info!(controller = controller.controller_name(), "starting");
            run_until(client, controller, runtime, termination_signal()).await
        }
        .await;
        match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                error!(error = %e, kind = e.label(), "the controller stopped");
                ExitCode::FAILURE
            }
        }
    }

    /// These options, with the Lease in `namespace` unless `--leader-election-namespace` or
    /// `$POD_NAMESPACE` says otherwise.
    pub fn lease_namespace_by_default(mut self, namespace: impl Into<String>) -> Self {
        self.lease_namespace_fallback = Some(namespace.into());
        self
    }
}

/// A client that sends at most `burst` requests per `burst / qps` seconds, Lease requests
/// exempt, and fails a request unanswered after `deadline` (see [`budget`]): tower's own rate
/// limit, so no hand-written token bucket. Requests over the limit wait in a
/// first-come-first-served queue.
fn rate_limited(config: Config, qps: f64, burst: u64, deadline: Duration) -> Result<Client, Error> {
    let period = Duration::from_secs_f64(burst as f64 / qps);
    let layer = budget::BudgetLayer {
        burst,
        period,
        deadline,
    };
    let builder = ClientBuilder::try_from(config)
        .map_err(|e| Error::Config(format!("building the API client: {e}")))?;
    Ok(builder.with_layer(&layer).build())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        runtime: Options,
    }

    #[test]
    fn defaults_elect_a_leader_named_after_the_controller() {
        let cli = Cli::try_parse_from(["check"]).expect("defaults parse");
        let config = cli.runtime.runtime_config("example.com/budget", "ops");
        let election = config.leader_election.expect("on by default");
        assert_eq!(election.lease_name, "example.com-budget");
        assert_eq!(config.concurrency, 10);
        assert!(config.normal_events);
        assert_eq!(
            (cli.runtime.kube_api_qps, cli.runtime.kube_api_burst),
            (100.0, 200)
        );
        assert_eq!(config.max_retry_delay, Duration::from_secs(86_400));
        assert_eq!(config.permanent_failure_hold, Duration::from_secs(120));
        assert_eq!(
            config.metrics_address,
            Some(SocketAddr::from(([0, 0, 0, 0], 8443)))
        );
        assert_eq!(
            config.metrics_security,
            MetricsSecurity::Authenticated {
                tls: TlsSource::SelfSigned
            }
        );
        assert_eq!(
            config.health_address,
            Some(SocketAddr::from(([0, 0, 0, 0], 8081)))
        );
        cli.runtime.validate().expect("the defaults are consistent");
    }

    #[test]
    fn metrics_are_plain_only_when_asked_and_certificates_come_in_pairs() {
        let parse = |args: &[&str]| {
            Cli::try_parse_from(std::iter::once("check").chain(args.iter().copied()))
                .expect("parses")
                .runtime
        };
        let plain = parse(&[
            "--metrics-secure=false",
            "--metrics-address=127.0.0.1:9090",
            "--health-address=127.0.0.1:9090",
        ]);
        plain.validate().expect("consistent");
        let config = plain.runtime_config("x", "d");
        assert_eq!(config.metrics_security, MetricsSecurity::Plain);
        assert_eq!(config.health_address, config.metrics_address);

        let files = parse(&[
            "--metrics-tls-cert=/tls/tls.crt",
            "--metrics-tls-key=/tls/tls.key",
        ]);
        files.validate().expect("consistent");
        assert_eq!(
            files.metrics_security(),
            MetricsSecurity::Authenticated {
                tls: TlsSource::Files {
                    cert: "/tls/tls.crt".into(),
                    key: "/tls/tls.key".into(),
                }
            }
        );
        assert!(parse(&["--health-address=off"]).health_address.0.is_none());

        for (args, why) in [
            (
                &["--metrics-tls-cert=/tls/tls.crt"][..],
                "--metrics-tls-cert is given without --metrics-tls-key",
            ),
            (
                &["--metrics-tls-key=/tls/tls.key"][..],
                "--metrics-tls-key is given without --metrics-tls-cert",
            ),
            (
                &[
                    "--metrics-secure=false",
                    "--metrics-tls-cert=/a",
                    "--metrics-tls-key=/b",
                ][..],
                "--metrics-secure=false serves plain HTTP",
            ),
        ] {
            let err = parse(args).validate().expect_err(why);
            assert_eq!(err.label(), "config");
            assert!(err.to_string().contains(why), "{args:?}: {err}");
        }
        for bad in ["--metrics-secure=maybe", "--health-address=nowhere"] {
            assert!(Cli::try_parse_from(["check", bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn flags_switch_things_off_and_bad_values_are_refused() {
        let cli = Cli::try_parse_from([
            "check",
            "--leader-elect=false",
            "--metrics-address=off",
            "--log-format=json",
        ])
        .expect("parses");
        let config = cli.runtime.runtime_config("x", "default");
        assert!(config.leader_election.is_none());
        assert!(config.metrics_address.is_none());
        for bad in [
            "--concurrency=0",
            "--kube-api-qps=0",
            "--kube-api-qps=-3",
            "--kube-api-qps=NaN",
            "--kube-api-burst=0",
            "--kube-api-timeout-seconds=0",
            "--kube-api-timeout-seconds=601",
            "--lease-duration-seconds=1",
            "--metrics-address=nowhere",
            "--max-retry-delay-seconds=0",
            "--max-retry-delay-seconds=2147483648",
            "--permanent-failure-hold-seconds=86401",
            "--permanent-failure-hold-seconds=-1",
        ] {
            let err = Cli::try_parse_from(["check", bad]).expect_err(bad);
            assert!(!err.to_string().is_empty());
        }
    }

    #[test]
    fn seconds_keep_their_range() {
        assert_eq!("0".parse::<Seconds<0, 5>>().map(Seconds::get), Ok(0));
        assert_eq!(
            "5".parse::<Seconds<1, 5>>().map(Seconds::duration),
            Ok(Duration::from_secs(5))
        );
        for (bad, why) in [
            ("0", "0 is not in 1..=5"),
            ("6", "6 is not in 1..=5"),
            ("-1", "\"-1\" is not a whole number of seconds"),
            ("1.5", "\"1.5\" is not a whole number of seconds"),
        ] {
            assert_eq!(bad.parse::<Seconds<1, 5>>(), Err(why.to_string()), "{bad}");
        }
        assert_eq!(
            Seconds::<1, 5>::new(3).map(|s| s.to_string()),
            Some("3".into())
        );
        assert_eq!(Seconds::<1, 5>::new(9), None);
    }

    #[test]
    fn shadow_mode_is_off_by_default_and_scoped_by_a_list() {
        use crate::shadow::ShadowScope;
        let off = Cli::try_parse_from(["check"]).expect("parses");
        assert_eq!(off.runtime.runtime_config("x", "d").shadow, None);
        let everywhere = Cli::try_parse_from(["check", "--shadow"]).expect("parses");
        assert_eq!(
            everywhere.runtime.runtime_config("x", "d").shadow,
            Some(ShadowScope::AllClusterQueues)
        );
        let some = Cli::try_parse_from(["check", "--shadow=true", "--shadow-cluster-queues=a,b"])
            .expect("parses");
        assert_eq!(
            some.runtime.runtime_config("x", "d").shadow,
            Some(ShadowScope::of(vec!["a".into(), "b".into()]))
        );
        assert!(Cli::try_parse_from(["check", "--shadow=maybe"]).is_err());
    }

    #[test]
    fn a_queue_list_without_shadow_mode_is_refused() {
        let cli = Cli::try_parse_from(["check", "--shadow-cluster-queues=a"]).expect("parses");
        let err = cli.runtime.validate().expect_err("refused");
        assert!(err.to_string().contains("--shadow is off"), "{err}");
        let cli = Cli::try_parse_from(["check", "--shadow", "--shadow-cluster-queues=a"])
            .expect("parses");
        cli.runtime.validate().expect("consistent");
    }
}

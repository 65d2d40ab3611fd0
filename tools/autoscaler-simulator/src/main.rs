//! `autoscaler-simulator`: plays cluster-autoscaler 1.36.1's part on ProvisioningRequests, for
//! the tests and the demo. See [`autoscaler_simulator`] for what is simulated, and its `script`
//! module for scripted mode.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use autoscaler_simulator::node_groups::DEFAULT_GROUP_LABEL;
use autoscaler_simulator::{
    self as simulator, Script, Settings, parse_duration, parse_node_groups,
};
use clap::{Args, FromArgMatches, Parser};
use kueue_admission_sdk::options::{LogFormat, MetricsAddress};
use kueue_admission_sdk::{Options, termination_signal};
use tracing::{error, info, warn};

/// Plays cluster-autoscaler 1.36.1 on ProvisioningRequests (check-capacity and
/// best-effort-atomic-scale-up, with kwok-style node groups), or follows a script for requests
/// in scripted mode ("fault injection").
#[derive(Debug, Parser)]
#[command(name = "autoscaler-simulator", version)]
struct Cli {
    /// Fault injection: requests of this provisioningClassName follow --default-script (or their
    /// pod template's script) instead of cluster-autoscaler's rules (repeatable, or
    /// comma-separated).
    #[arg(
        long = "scripted-class",
        alias = "class",
        env = "SIMULATOR_SCRIPTED_CLASSES",
        value_delimiter = ',',
        value_name = "NAME"
    )]
    scripted_classes: Vec<String>,

    /// Fault injection: the script of scripted requests whose pod template has none, e.g.
    /// "provision" or "fail,provision:5".
    #[arg(
        long,
        env = "SIMULATOR_DEFAULT_SCRIPT",
        default_value = "provision",
        value_name = "SCRIPT"
    )]
    default_script: Script,

    /// Only watch requests, PodTemplates and Pods of this namespace (default: all).
    #[arg(long, env = "SIMULATOR_NAMESPACE", value_name = "NAMESPACE")]
    namespace: Option<String>,

    /// Node templates (YAML: a List, a sequence or documents of v1 Node, as the kwok provider's
    /// templates ConfigMap holds) defining the node groups; without it no Node is ever created
    /// or deleted.
    #[arg(long, env = "SIMULATOR_NODE_GROUPS", value_name = "FILE")]
    node_groups: Option<PathBuf>,

    /// The label whose value names a template's (and a Node's) node group.
    #[arg(long, env = "SIMULATOR_NODE_GROUP_LABEL", default_value = DEFAULT_GROUP_LABEL, value_name = "KEY")]
    node_group_label: String,

    /// Do not add the kwok-provider=true:NoSchedule taint to created Nodes.
    #[arg(long, env = "SIMULATOR_SKIP_TAINT")]
    skip_taint: bool,

    /// Pause between loops without activity (--scan-interval).
    #[arg(long, env = "SIMULATOR_SCAN_INTERVAL", default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    scan_interval: Duration,

    /// First retry delay of a Provisioned=False request.
    #[arg(long, env = "SIMULATOR_INITIAL_BACKOFF", default_value = "1m", value_parser = parse_duration, value_name = "DURATION")]
    initial_backoff: Duration,

    /// Longest retry delay.
    #[arg(long, env = "SIMULATOR_MAX_BACKOFF", default_value = "10m", value_parser = parse_duration, value_name = "DURATION")]
    max_backoff: Duration,

    /// How long a Provisioned request books its capacity.
    #[arg(long, env = "SIMULATOR_BOOKING_DURATION", default_value = "10m", value_parser = parse_duration, value_name = "DURATION")]
    booking_duration: Duration,

    /// How long after creation a never-provisioned request fails Expired.
    #[arg(long, env = "SIMULATOR_EXPIRE_AFTER", default_value = "7d", value_parser = parse_duration, value_name = "DURATION")]
    expire_after: Duration,

    /// How long after its Provisioned or Failed condition a request is deleted.
    #[arg(long, env = "SIMULATOR_REQUEST_TTL", default_value = "7d", value_parser = parse_duration, value_name = "DURATION")]
    request_ttl: Duration,

    /// How long a Node stays unneeded before it is deleted (--scale-down-unneeded-time).
    #[arg(long, env = "SIMULATOR_SCALE_DOWN_UNNEEDED_TIME", default_value = "10m", value_parser = parse_duration, value_name = "DURATION")]
    scale_down_unneeded_time: Duration,

    /// How long scale-down waits after a scale-up, or after a check-capacity request found
    /// to fit (--scale-down-delay-after-add).
    #[arg(long, env = "SIMULATOR_SCALE_DOWN_DELAY_AFTER_ADD", default_value = "10m", value_parser = parse_duration, value_name = "DURATION")]
    scale_down_delay_after_add: Duration,

    /// Check up to this many check-capacity requests per loop (0 or 1: no batching).
    #[arg(
        long,
        env = "SIMULATOR_CHECK_CAPACITY_BATCH_SIZE",
        default_value_t = 0,
        value_name = "N"
    )]
    check_capacity_batch_size: usize,

    /// The most Nodes one scale-up adds (--max-nodes-per-scaleup).
    #[arg(long, env = "SIMULATOR_MAX_NODES_PER_SCALEUP", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..), value_name = "N")]
    max_nodes_per_scaleup: u32,

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
    /// The settings, with the node groups read from their file; the error says what is wrong.
    fn settings(&self) -> Result<(Settings, Vec<String>), String> {
        let (node_groups, warnings) = match &self.node_groups {
            None => (Vec::new(), Vec::new()),
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("reading --node-groups {}: {e}", path.display()))?;
                let loaded = parse_node_groups(&text, &self.node_group_label, self.skip_taint)
                    .map_err(|e| format!("--node-groups {}: {e}", path.display()))?;
                (loaded.groups, loaded.warnings)
            }
        };
        let settings = Settings {
            scripted_classes: self
                .scripted_classes
                .iter()
                .map(|c| c.trim().to_string())
                .filter(|c| !c.is_empty())
                .collect(),
            default_script: self.default_script.clone(),
            namespace: self.namespace.clone().filter(|n| !n.is_empty()),
            node_groups,
            node_group_label: self.node_group_label.clone(),
            scan_interval: self.scan_interval,
            initial_backoff: self.initial_backoff,
            max_backoff: self.max_backoff,
            booking_duration: self.booking_duration,
            expire_after: self.expire_after,
            request_ttl: self.request_ttl,
            scale_down_unneeded_time: self.scale_down_unneeded_time,
            scale_down_delay_after_add: self.scale_down_delay_after_add,
            check_capacity_batch_size: self.check_capacity_batch_size,
            max_nodes_per_scaleup: usize::try_from(self.max_nodes_per_scaleup)
                .unwrap_or(usize::MAX),
        };
        Ok((settings, warnings))
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
        options.health_address = MetricsAddress(None);
        Ok(options)
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let (settings, warnings) = match cli.settings() {
        Ok(found) => found,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
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
    for warning in warnings {
        warn!("node groups: {warning}");
    }
    let client = match options.client().await {
        Ok(client) => client,
        Err(e) => {
            error!(error = %e, "no Kubernetes client");
            return ExitCode::FAILURE;
        }
    };
    tokio::select! {
        () = simulator::run(client, settings) => {
            error!("the watches ended");
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
    use std::io::Write;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("autoscaler-simulator").chain(args.iter().copied()))
    }

    #[test]
    fn flags_parse() {
        let cli = parse(&[
            "--scripted-class",
            "a",
            "--class=b,c",
            "--default-script",
            "fail,provision:5",
            "--namespace=ns1",
            "--scan-interval=1s",
            "--initial-backoff=2s",
            "--max-backoff=1m30s",
            "--booking-duration=5m",
            "--expire-after=1h",
            "--request-ttl=2d",
            "--scale-down-unneeded-time=30s",
            "--scale-down-delay-after-add=1m",
            "--check-capacity-batch-size=10",
            "--max-nodes-per-scaleup=7",
        ])
        .expect("parses");
        let (settings, warnings) = cli.settings().expect("settings");
        assert!(warnings.is_empty());
        assert_eq!(settings.scripted_classes, ["a", "b", "c"]);
        assert_eq!(
            settings.default_script.steps(),
            [
                Step::Fail,
                Step::Provision {
                    after: Duration::from_secs(5)
                }
            ]
        );
        assert_eq!(settings.namespace.as_deref(), Some("ns1"));
        let secs = Duration::from_secs;
        assert_eq!(
            (
                settings.scan_interval,
                settings.initial_backoff,
                settings.max_backoff
            ),
            (secs(1), secs(2), secs(90))
        );
        assert_eq!(
            (
                settings.booking_duration,
                settings.expire_after,
                settings.request_ttl
            ),
            (secs(300), secs(3600), secs(172_800))
        );
        assert_eq!(settings.scale_down_unneeded_time, secs(30));
        assert_eq!(settings.scale_down_delay_after_add, secs(60));
        assert_eq!(
            (
                settings.check_capacity_batch_size,
                settings.max_nodes_per_scaleup
            ),
            (10, 7)
        );
        let options = cli.sdk_options().expect("sdk options");
        assert!(!options.leader_elect);
        assert_eq!(options.metrics_address, MetricsAddress(None));
        assert_eq!(options.health_address, MetricsAddress(None));
    }

    #[test]
    fn defaults_are_cluster_autoscalers() {
        let (settings, _) = parse(&[]).expect("parses").settings().expect("settings");
        assert_eq!(settings, Settings::default());
    }

    #[test]
    fn bad_flags_are_refused() {
        for args in [
            &["--default-script=boom"][..],
            &["--scan-interval=soon"],
            &["--max-nodes-per-scaleup=0"],
            &["--check-capacity-batch-size=-1"],
        ] {
            let error = parse(args).expect_err("refused");
            assert_eq!(error.exit_code(), 2, "{args:?}");
        }
    }

    #[test]
    fn node_group_files_are_read_and_checked() {
        let dir = std::env::temp_dir().join(format!("simulator-flags-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let good = dir.join("good.yaml");
        let mut file = std::fs::File::create(&good).expect("file");
        write!(
            file,
            "kind: Node\nmetadata: {{name: t, labels: {{pool: p}}}}\nstatus: {{allocatable: {{pods: '9'}}}}\n"
        )
        .expect("written");
        let path = good.to_str().expect("utf-8");
        let cli = parse(&[
            "--node-groups",
            path,
            "--node-group-label=pool",
            "--skip-taint",
        ])
        .expect("parses");
        let (settings, _) = cli.settings().expect("settings");
        assert_eq!(settings.node_groups.len(), 1);
        assert_eq!(settings.node_group_label, "pool");
        let bad = dir.join("bad.yaml");
        std::fs::write(&bad, "kind: Node\nmetadata: {labels: {pool: p}}\n").expect("written");
        let cli = parse(&[
            "--node-groups",
            bad.to_str().expect("utf-8"),
            "--node-group-label=pool",
        ])
        .expect("parses");
        let error = cli.settings().expect_err("refused");
        assert!(error.contains("no metadata.name"), "{error}");
        let missing = parse(&["--node-groups", "/nonexistent/groups.yaml"]).expect("parses");
        assert!(
            missing
                .settings()
                .expect_err("refused")
                .contains("reading --node-groups")
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}

//! `soak`: the chaos soak of `docs/reliability.md` against the local control plane. `make soak`
//! runs it at full size; `tests/run-all.sh` runs a short one. Exits non-zero if an invariant
//! broke; the results file says which, with the timelines of the Workloads concerned.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use soak::{SoakConfig, run};

/// A seeded load of Workloads through the provisioning, license, budget and capacity-buffer
/// checks (two replicas each, as processes), with leaders killed, the apiserver, Kueue and
/// Karpenter restarted and more, checked by independent witnesses.
#[derive(Debug, Parser)]
struct Cli {
    /// Seed of the plan (decimal); a fresh one when unset. Printed first, to replay a run.
    #[arg(long, env = "SOAK_SEED")]
    seed: Option<u64>,

    /// Workloads in all.
    #[arg(long, env = "SOAK_WORKLOADS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(10..=100_000))]
    workloads: u64,

    /// Workloads under way at once at most.
    #[arg(long, env = "SOAK_IN_FLIGHT", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    in_flight: u64,

    /// Directory of the results, the controllers' logs and the timelines; default
    /// `target/soak/<seed>`.
    #[arg(long)]
    out: Option<PathBuf>,

    /// Where the controllers' executables are; default the directory of this one.
    #[arg(long)]
    bin_dir: Option<PathBuf>,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let seed = cli.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(1)
    });
    let bin_dir = match cli.bin_dir.clone().map(Ok).unwrap_or_else(|| {
        std::env::current_exe().map(|p| p.parent().map(PathBuf::from).unwrap_or_default())
    }) {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("soak: where am I? {e}");
            return ExitCode::FAILURE;
        }
    };
    for exe in [
        "kueue-provisioning-controller",
        "autoscaler-simulator",
        "kueue-capacity-buffer-controller",
        "license-check",
        "budget-check",
    ] {
        if !bin_dir.join(exe).is_file() {
            eprintln!(
                "soak: {} is missing; build the controllers first (make soak does: cargo build --bins)",
                bin_dir.join(exe).display()
            );
            return ExitCode::FAILURE;
        }
    }
    let out = cli.out.clone().unwrap_or_else(|| {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        root.canonicalize()
            .unwrap_or(root)
            .join("target/soak")
            .join(seed.to_string())
    });
    let config = SoakConfig {
        seed,
        workloads: cli.workloads as usize,
        in_flight: cli.in_flight as usize,
        out,
        bin_dir,
    };
    // Interrupted, the runtime drops the supervisors and with them every controller process.
    let outcome = tokio::select! {
        outcome = run(config) => outcome,
        () = kueue_admission_sdk::termination_signal() => {
            eprintln!("soak: interrupted; the controllers are stopped");
            return ExitCode::from(130);
        }
    };
    match outcome {
        Ok(report) => {
            println!("\n{}", report.text);
            println!("soak: results in {}", report.results.display());
            match report.check() {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("soak: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Err(e) => {
            eprintln!("soak: the run could not complete: {e:#}");
            ExitCode::FAILURE
        }
    }
}

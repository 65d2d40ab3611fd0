//! The benchmark (`bench`, docs/benchmark.md) runs end to end on a small scale, so that it
//! keeps working: it fails unless every Workload is admitted with exactly one `Ready` written,
//! in the SDK pass and beside the raw baseline.

use std::process::Command;

use anyhow::{Result, ensure};

#[test]
fn the_benchmark_admits_every_workload_once_and_reports_each_stage() -> Result<()> {
    let out = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(["--workloads", "30", "--timeout-seconds", "120"])
        .args(["--", "--concurrency", "4"])
        .env("KUBECONFIG", e2e::kubeconfig_path())
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.success(), "bench failed:\n{stdout}\n{stderr}");
    for expected in [
        "30 Workloads; always-ready and the raw baseline with --concurrency 4",
        "the raw baseline (server-side apply only):",
        "the SDK check's throughput is ",
        "| quota reserved → Ready written (the check) |",
        "| created → admitted |",
        "the runtime: 30 Ready and 0 Pending written",
    ] {
        ensure!(
            stdout.contains(expected),
            "{expected:?} missing from:\n{stdout}"
        );
    }
    Ok(())
}

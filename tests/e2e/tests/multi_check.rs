//! Several SDK checks on one ClusterQueue, answering from a seeded script, against the real
//! Kueue; an independent watch checks the invariants of `docs/reliability.md` on every
//! Workload version. The seed is printed first; `MULTI_CHECK_SEED` replays one.
//!
//! The short run is part of the suite; the long one is `make multi-check-soak`.

use anyhow::Result;
use e2e::scripted::{RunConfig, check_script_promises, run};

/// The script itself keeps its promises (no cluster): a Workload meant to be admitted never
/// retries a check past its limit, a doomed check never answers Ready, and a step depends only
/// on the seed, the Workload, the check and the call count.
#[test]
fn the_script_keeps_its_promises_for_many_seeds() -> Result<()> {
    for seed in 0..500 {
        check_script_promises(seed, 24)?;
    }
    Ok(())
}

/// 12 Workloads (unless `MULTI_CHECK_WORKLOADS` says otherwise), 2 or 3 checks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_checks_keep_every_invariant() -> Result<()> {
    let report = run("multi-check", RunConfig::from_env(12)?).await?;
    println!("{}{}", report.per_workload(), report.summary());
    report.check()
}

/// The long run behind `make multi-check-soak`: 200 Workloads unless the environment says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: run with make multi-check-soak"]
async fn soak() -> Result<()> {
    let report = run("multi-check-soak", RunConfig::from_env(200)?).await?;
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    println!(
        "multi_check soak, {} UTC, commit {commit}\n{}",
        k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%d %H:%M"),
        report.summary()
    );
    report.check()
}

//! A check binary built on `Options::run`, started as a real process: flags and environment
//! variables, JSON logs, leader election, and a clean exit on SIGTERM that releases the Lease.

use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use e2e::TestEnv;

const BINARY: &str = env!("CARGO_BIN_EXE_always-ready");

/// The binary, set up by flags and environment variables as a Deployment would, takes the Lease
/// and admits a Job, serves its probes on the health address and its metrics over HTTPS to a
/// token allowed to read them (the default); on SIGTERM it exits 0, leaves the Lease unheld, and
/// has logged only JSON.
#[tokio::test]
async fn sigterm_stops_cleanly_and_releases_the_lease() -> Result<()> {
    let env = TestEnv::new("sdk-binary").await?;
    let controller = format!("e2e.kueue-admission-checks.dev/{}", env.ns);
    env.guarded_queue("check", &controller, "4").await?;

    let (https, health) = e2e::free_local_addresses()?;
    let log = std::env::temp_dir().join(format!("{}.log", env.ns));
    let mut child = start_always_ready(&env, &controller, https, health, &log)?;
    lease_taken_by_the_pod(&env, &mut child).await?;
    env.admitted_job("job").await?;
    ensure!(e2e::http_get(health, "/readyz").await?.0 == 200);
    let token = e2e::scraper_token().await?;
    let (status, metrics) = e2e::https_get(https, "/metrics", Some(&token)).await?;
    ensure!(status == 200, "GET /metrics answered {status}: {metrics}");
    ensure!(e2e::metric_sample(&metrics, "kueue_ac_leader") == Some(1.0));
    let (status, _) = e2e::https_get(https, "/metrics", None).await?;
    ensure!(
        status == 401,
        "GET /metrics without a token answered {status}"
    );

    let status = sigterm_and_wait_for_exit(&mut child).await?;
    let logs = std::fs::read_to_string(&log)?;
    ensure!(
        status.success(),
        "exit {status} after SIGTERM; logs:\n{logs}"
    );
    let holder = env.lease_holder("always-ready").await?;
    ensure!(holder.is_none(), "Lease still held by {holder:?}");
    // Every log line is a JSON object, and the shutdown is told.
    every_line_is_json(&logs)?;
    ensure!(logs.contains("SIGTERM"), "{logs}");
    Ok(())
}

/// Flags the binary cannot work with end it at once: exit 2 naming a bad flag, exit 1 naming a
/// kubeconfig that is not there.
#[tokio::test]
async fn bad_flags_fail_at_once_with_a_reason() -> Result<()> {
    let out = Command::new(BINARY)
        .args(["--controller-name", "x", "--concurrency", "0"])
        .output()?;
    ensure!(out.status.code() == Some(2), "{:?}", out.status);
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(stderr.contains("--concurrency"), "{stderr}");

    let out = Command::new(BINARY)
        .args([
            "--controller-name",
            "x",
            "--kubeconfig",
            "/nonexistent/kubeconfig",
        ])
        .args(["--metrics-address", "off", "--health-address", "off"])
        .output()?;
    ensure!(out.status.code() == Some(1), "{:?}", out.status);
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(stderr.contains("/nonexistent/kubeconfig"), "{stderr}");
    Ok(())
}

/// Starts the always-ready binary answering `controller`'s checks, serving its metrics at
/// `https` (the default: HTTPS, authenticated) and its probes at `health`, logging JSON to `log`, with its leader election set from the environment as a
/// Deployment would pass it (Lease `always-ready` in the test namespace, pod `always-ready-0`).
fn start_always_ready(
    env: &TestEnv,
    controller: &str,
    https: std::net::SocketAddr,
    health: std::net::SocketAddr,
    log: &std::path::Path,
) -> Result<Child> {
    Command::new(BINARY)
        .arg("--kubeconfig")
        .arg(e2e::kubeconfig_path())
        .args(["--controller-name", controller])
        .args(["--metrics-address", &https.to_string()])
        .args(["--health-address", &health.to_string()])
        .args(["--log-format", "json"])
        // Settings from the environment, as a Deployment would pass them.
        .env("KUEUE_AC_LEADER_ELECTION_NAMESPACE", &env.ns)
        .env("KUEUE_AC_LEADER_ELECTION_ID", "always-ready")
        .env("POD_NAME", "always-ready-0")
        .env("KUEUE_AC_LOG_LEVEL", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log)?)
        .spawn()
        .context("starting the always-ready binary")
}

/// Waits until the Lease `always-ready` is held by the pod `always-ready-0`; kills the child if
/// it never is.
async fn lease_taken_by_the_pod(env: &TestEnv, child: &mut Child) -> Result<()> {
    let held = env
        .wait_lease_holder("always-ready", "a holder", |h| {
            h.is_some_and(|h| h.starts_with("always-ready-0_"))
        })
        .await;
    if held.is_err() {
        let _ = child.kill();
    }
    held?;
    Ok(())
}

/// Sends SIGTERM to the child and waits up to 30 s for it to exit (killing it if it does not);
/// returns its exit status.
async fn sigterm_and_wait_for_exit(child: &mut Child) -> Result<ExitStatus> {
    let pid = child.id().to_string();
    ensure!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()?
            .success()
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            anyhow::bail!("no exit within 30 s of SIGTERM");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Fails on the first non-empty log line that is not JSON.
fn every_line_is_json(logs: &str) -> Result<()> {
    for line in logs.lines().filter(|l| !l.trim().is_empty()) {
        serde_json::from_str::<serde_json::Value>(line)
            .with_context(|| format!("not a JSON log line: {line}"))?;
    }
    Ok(())
}

//! The alert-gate example against the real Kueue and a real Alertmanager (Debian's
//! `prometheus-alertmanager`, or `E2E_ALERTMANAGER`): each test starts its own Alertmanager,
//! posts alerts through its API, and runs the check in-process.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use alert_gate::{AlertGate, AlertGateCheck, AlertGateSpec, WhileFiring};
use anyhow::{Context, Result, bail, ensure};
use e2e::{DEFAULT_TIMEOUT, TestEnv, WorkloadRecorder};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kueue_admission_sdk::api::{
    AdmissionCheck, AdmissionCheckParametersReference, AdmissionCheckSpec, AdmissionCheckState,
    CheckState, Workload, workload_condition as cond,
};
use serde_json::json;

/// A running Alertmanager of one test, stopped when dropped.
struct Alertmanager {
    _process: tokio::process::Child,
    addr: SocketAddr,
}

/// The Alertmanager binary: `E2E_ALERTMANAGER`, or the first on the PATH.
fn alertmanager_binary() -> Result<PathBuf> {
    if let Ok(path) = std::env::var("E2E_ALERTMANAGER") {
        return Ok(path.into());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        for name in ["prometheus-alertmanager", "alertmanager"] {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    bail!(
        "Alertmanager is required for the alert-gate tests and is not on the PATH \
         (Debian: apt-get install prometheus-alertmanager; or set E2E_ALERTMANAGER)"
    )
}

impl Alertmanager {
    /// Starts an Alertmanager of its own for the test (alerts go nowhere) on a free port and
    /// waits until it is ready.
    async fn start(env: &TestEnv) -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("e2e-alertmanager-{}", env.ns));
        std::fs::create_dir_all(&dir)?;
        let config = dir.join("alertmanager.yml");
        // Alerts go nowhere: the tests only read them back.
        std::fs::write(
            &config,
            "route:\n  receiver: none\nreceivers:\n  - name: none\n",
        )?;
        let addr = e2e::free_local_address()?;
        let log = std::fs::File::create(dir.join("alertmanager.log"))?;
        let process = tokio::process::Command::new(alertmanager_binary()?)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            // A single instance: no gossip port to collide with parallel tests.
            .arg("--cluster.listen-address=")
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .context("starting Alertmanager")?;
        let am = Self {
            _process: process,
            addr,
        };
        let deadline = tokio::time::Instant::now() + DEFAULT_TIMEOUT;
        while !matches!(e2e::http_get(addr, "/-/ready").await, Ok((200, _))) {
            if tokio::time::Instant::now() > deadline {
                let log = std::fs::read_to_string(dir.join("alertmanager.log")).unwrap_or_default();
                bail!("Alertmanager at {addr} not ready after {DEFAULT_TIMEOUT:?}:\n{log}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(am)
    }

    /// Its base URL, as a gate names it.
    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Waits until Alertmanager lists `count` alerts for `spec`'s matchers, as the check asks.
    async fn wait_listed(&self, spec: &AlertGateSpec, count: usize) -> Result<()> {
        let url = alert_gate::alertmanager::alerts_url(spec);
        let path = url.trim_start_matches(&self.url()).to_string();
        let deadline = tokio::time::Instant::now() + DEFAULT_TIMEOUT;
        loop {
            let (status, body) = e2e::http_get(self.addr, &path).await?;
            let listed = serde_json::from_str::<Vec<serde_json::Value>>(&body).map(|a| a.len());
            if status == 200 && listed.as_ref().is_ok_and(|n| *n == count) {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                bail!("Alertmanager lists {listed:?} alerts for {path}, not {count}: {body}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Posts the alert `name` of `team` at `severity`, firing for an hour.
    async fn fire(&self, name: &str, severity: &str, team: &str) -> Result<()> {
        self.alert(name, severity, team, true).await
    }

    /// Posts the alert `name` of `team` at `severity`, resolved now.
    async fn resolve(&self, name: &str, severity: &str, team: &str) -> Result<()> {
        self.alert(name, severity, team, false).await
    }

    /// Posts the alert `name` of `team` at `severity` (its only labels), firing for an hour, or
    /// resolved now.
    async fn alert(&self, name: &str, severity: &str, team: &str, firing: bool) -> Result<()> {
        let labels = [("alertname", name), ("severity", severity), ("team", team)];
        let now = Timestamp::now();
        let ends = if firing {
            now + SignedDuration::from_hours(1)
        } else {
            now - SignedDuration::from_secs(1)
        };
        let labels: serde_json::Map<String, serde_json::Value> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect();
        let body = json!([{
            "labels": labels,
            "startsAt": (now - SignedDuration::from_mins(1)).to_string(),
            "endsAt": ends.to_string(),
        }]);
        let (status, answer) = e2e::http_post_json(self.addr, "/api/v2/alerts", &body).await?;
        ensure!(status == 200, "posting an alert: HTTP {status}: {answer}");
        Ok(())
    }
}

/// One test's queue guarded by an alert gate answered by its own controller.
struct Gated {
    env: TestEnv,
    check: String,
    _controller: e2e::Running,
}

/// A namespace for `test` with queues (8 cpu, LocalQueue `lq`) guarded by an AdmissionCheck
/// whose parameters are an AlertGate of `spec`, and the gate's controller running.
async fn gated(test: &str, spec: AlertGateSpec) -> Result<Gated> {
    let env = TestEnv::new(test).await?;
    e2e::install_crd::<AlertGate>(&env).await?;
    let gate = env.cluster_name("gate");
    Api::<AlertGate>::all(env.client.clone())
        .create(&PostParams::default(), &AlertGate::new(&gate, spec))
        .await
        .context("creating the AlertGate")?;
    let controller_name = env.own_controller_name("alert-gate");
    let ac = AdmissionCheck::new(
        &env.cluster_name("alerts"),
        AdmissionCheckSpec {
            controller_name: controller_name.clone(),
            parameters: Some(AdmissionCheckParametersReference {
                api_group: alert_gate::gate::GROUP.into(),
                kind: "AlertGate".into(),
                name: gate,
            }),
        },
    );
    let check = Api::<AdmissionCheck>::all(env.client.clone())
        .create(&PostParams::default(), &ac)
        .await?
        .name_any();
    let flavor = env.resource_flavor("default").await?.name_any();
    env.queues_on(&flavor, "8", &[&check]).await?;
    let runtime = env.runtime_config();
    let controller = e2e::Running::check(
        env.client.clone(),
        // Every decision asks Alertmanager: the test orders an alert before a submission.
        AlertGateCheck::new(controller_name).answers_fresh_for(Duration::ZERO),
        runtime,
    );
    Ok(Gated {
        env,
        check,
        _controller: controller,
    })
}

impl Gated {
    /// The Workload's entry for the gate (a default one if it has none).
    fn entry(&self, wl: &Workload) -> AdmissionCheckState {
        wl.admission_check(&self.check).cloned().unwrap_or_default()
    }

    /// The versions of the Workload `recorder` sees until the gate's entry satisfies `cond`
    /// (`what` says how).
    async fn until_entry(
        &self,
        recorder: &mut WorkloadRecorder,
        wl: &str,
        what: &str,
        cond: impl Fn(&AdmissionCheckState) -> bool,
    ) -> Result<Vec<Workload>> {
        recorder
            .until(wl, what, |wl| {
                wl.admission_check(&self.check).is_some_and(&cond)
            })
            .await
    }

    /// Submits the Job `job` (one pod of 1 cpu) and waits until its Workload is admitted;
    /// returns the gate's entry then.
    async fn admitted_entry(&self, job: &str) -> Result<AdmissionCheckState> {
        let wl = self.env.submit_job(job, "lq", "1").await?;
        Ok(self.entry(&self.env.wait_admitted(&wl).await?))
    }

    /// Starts recording every Workload version, then submits the Job `job` (one pod of 1 cpu):
    /// returns the recorder and the Workload's name.
    async fn submit_recorded(&self, job: &str) -> Result<(WorkloadRecorder, String)> {
        let recorder = self.env.record_workloads().await?;
        let wl = self.env.submit_job(job, "lq", "1").await?;
        Ok((recorder, wl))
    }

    /// Follows the Workload with `recorder` until the gate holds it back (`Pending`) naming the
    /// alert; returns that version and its entry.
    async fn held_back_by(
        &self,
        recorder: &mut WorkloadRecorder,
        wl: &str,
        alert: &str,
    ) -> Result<(Workload, AdmissionCheckState)> {
        let versions = self
            .until_entry(recorder, wl, "held back by the alert", |e| {
                e.state == CheckState::Pending && e.message.contains(alert)
            })
            .await?;
        let last = versions.last().context("no version")?.clone();
        let entry = e2e::entry_of(&last, &self.check)?;
        Ok((last, entry))
    }

    /// Follows the Workload with `recorder` until it is admitted; returns when its entry first
    /// said `Ready` (the entry's lastTransitionTime).
    async fn ready_at_once_admitted(
        &self,
        recorder: &mut WorkloadRecorder,
        wl: &str,
    ) -> Result<Timestamp> {
        let versions = recorder
            .until(wl, "admitted once the alert resolved", |wl| {
                wl.condition_is_true(cond::ADMITTED)
            })
            .await?;
        versions
            .iter()
            .filter_map(|wl| wl.admission_check(&self.check))
            .find(|e| e.state == CheckState::Ready)
            .and_then(|e| e.last_transition_time.as_ref().map(|t| t.0))
            .context("no Ready entry")
    }

    /// Whether no version had the gate's entry `Ready`.
    fn never_ready(&self, versions: &[Workload]) -> bool {
        versions.iter().all(|v| {
            v.admission_check(&self.check)
                .is_none_or(|e| e.state != CheckState::Ready)
        })
    }
}

/// An Alertmanager of the test's own (started from a namespace of its own) and a queue gated
/// on its critical alerts of `team`; returns it, the gate's spec, and the gated queue.
async fn gated_by_alertmanager(
    test: &str,
    team: &str,
) -> Result<(Alertmanager, AlertGateSpec, Gated)> {
    let probe = TestEnv::new(&format!("{test}-am")).await?;
    let am = Alertmanager::start(&probe).await?;
    let gate = spec(am.url(), team);
    let t = gated(test, gate.clone()).await?;
    Ok((am, gate, t))
}

/// A gate holding work back (`Pending`, looking again every 5 s) while a critical alert of
/// `team` fires at the Alertmanager at `url`.
fn spec(url: String, team: &str) -> AlertGateSpec {
    AlertGateSpec {
        alertmanager_url: url,
        matchers: vec!["severity=\"critical\"".into(), format!("team=\"{team}\"")],
        while_firing: WhileFiring::Pending,
        recheck_seconds: Some(5),
        retry_delay_seconds: None,
    }
}

#[tokio::test]
async fn work_waits_while_a_matching_alert_fires_and_is_admitted_once_it_resolves() -> Result<()> {
    let (am, gate, t) = gated_by_alertmanager("alert-gate", "batch").await?;
    // A warning, and a critical alert of another team: neither matches every matcher.
    am.fire("DiskFilling", "warning", "batch").await?;
    am.fire("EtcdDown", "critical", "web").await?;
    am.wait_listed(&gate, 0).await?;
    let entry = t.admitted_entry("quiet").await?;
    assert_eq!(entry.state, CheckState::Ready);
    let matchers = "severity=\"critical\", team=\"batch\"";
    let no_match = format!("no firing alert matches {matchers} at {}", am.url());
    assert_eq!(entry.message, no_match);

    // A matching alert holds the next Workload back, with its quota, naming the alert.
    let alert = "NodePoolDegraded";
    am.fire(alert, "critical", "batch").await?;
    am.wait_listed(&gate, 1).await?;
    let (mut recorder, held) = t.submit_recorded("held").await?;
    let (last, entry) = t.held_back_by(&mut recorder, &held, alert).await?;
    assert!(last.condition_is_true(cond::QUOTA_RESERVED));
    let fire = "NodePoolDegraded{severity=critical,team=batch}; looking again in ";
    let holding = format!("held back while 1 alert(s) matching {matchers} fire: {fire}");
    assert!(entry.message.starts_with(&holding), "{}", entry.message);

    // Resolved: the next look (within the recheck of 5 s) admits it, and it was never Ready
    // before the alert ended.
    let resolved_at = Timestamp::now();
    am.resolve(alert, "critical", "batch").await?;
    let ready_at = t.ready_at_once_admitted(&mut recorder, &held).await?;
    // Kueue's times are whole seconds.
    assert!(
        ready_at >= resolved_at - SignedDuration::from_secs(1),
        "Ready at {ready_at}, the alert resolved at {resolved_at}"
    );
    Ok(())
}

#[tokio::test]
async fn an_unreachable_alertmanager_is_a_clear_message_never_ready() -> Result<()> {
    // A port nothing listens on.
    let closed = e2e::free_local_address()?;
    let t = gated("alert-gate-down", spec(format!("http://{closed}"), "batch")).await?;
    let (mut recorder, wl) = t.submit_recorded("job").await?;
    let what = "the check says Alertmanager did not answer";
    let versions = t
        .until_entry(&mut recorder, &wl, what, |e| {
            e.message.contains("did not answer")
        })
        .await?;
    let last = versions.last().context("no version")?;
    let entry = t.entry(last);
    assert_eq!(entry.state, CheckState::Pending);
    let unreachable = format!("Alertmanager at http://{closed} did not answer (");
    assert!(entry.message.starts_with(&unreachable), "{}", entry.message);
    // The only answer it gave was this one: never Ready, the Workload holds its quota waiting.
    let admitted_work = "an unreachable Alertmanager admitted work";
    assert!(t.never_ready(&versions), "{admitted_work}");
    assert!(
        last.condition_is_true(cond::QUOTA_RESERVED) && !last.condition_is_true(cond::ADMITTED)
    );
    Ok(())
}

#[tokio::test]
async fn malformed_parameters_make_the_check_inactive_with_the_reason() -> Result<()> {
    let mut bad = spec("http://127.0.0.1:9".into(), "batch");
    bad.matchers.push("oops".into());
    let t = gated("alert-gate-bad", bad).await?;
    let ac = e2e::wait_for(
        Api::<AdmissionCheck>::all(t.env.client.clone()),
        &t.check,
        "Active=False",
        |ac| ac.active_condition().is_some_and(|c| c.status == "False"),
    )
    .await?;
    let active = ac
        .active_condition()
        .cloned()
        .context("no Active condition")?;
    assert_eq!(active.reason, "InvalidParameters");
    assert!(
        active.message.contains("spec.matchers: \"oops\""),
        "{}",
        active.message
    );
    Ok(())
}

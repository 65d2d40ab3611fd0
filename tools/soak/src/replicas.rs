//! The controllers of a soak as real processes, each in a slot that a supervisor keeps filled
//! the way a kubelet would: a process that exits (killed, or stopping on its own) is started
//! again a second later, under a new `POD_NAME` so that its Lease identity tells it apart.
//!
//! Every exit is recorded with its cause; each slot writes one log file (all generations).

use std::fs::OpenOptions;
use std::io::Write as _;
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What a slot runs.
#[derive(Clone, Debug)]
pub struct Spec {
    /// Slot name, e.g. `prov-0`; also the log file's name.
    pub slot: String,
    /// Which controller (`prov`, `license`, `budget`, `simulator`).
    pub controller: &'static str,
    /// The executable.
    pub program: PathBuf,
    /// Its arguments; `{metrics}` is replaced by a fresh local address on every start.
    pub args: Vec<String>,
}

/// One exit of a slot's process.
#[derive(Clone, Debug)]
pub struct Exit {
    /// The slot.
    pub slot: String,
    /// Its generation.
    pub generation: u32,
    /// When, since the supervisor started.
    pub at: Duration,
    /// `exit N` or `signal N`.
    pub status: String,
    /// Whether the soak killed it on purpose.
    pub killed: bool,
}

#[derive(Debug, Default)]
struct SlotState {
    generation: u32,
    pid: Option<u32>,
    pod_name: String,
    metrics: Option<std::net::SocketAddr>,
    /// The pid the soak is killing (so its exit counts as intended).
    killing: Option<u32>,
}

/// A running slot.
#[derive(Debug)]
pub struct Slot {
    /// What it runs.
    pub spec: Spec,
    state: Mutex<SlotState>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Slot {
    /// The current process's pid and `POD_NAME`, if one runs.
    pub fn current(&self) -> Option<(u32, String)> {
        let s = lock(&self.state);
        s.pid.map(|p| (p, s.pod_name.clone()))
    }

    /// Where the current process serves `/metrics`.
    pub fn metrics(&self) -> Option<std::net::SocketAddr> {
        lock(&self.state).metrics
    }

    /// Sends `signal` (`KILL`, `STOP`, `CONT`) to the current process; a `KILL` counts as
    /// intended when it exits.
    pub fn signal(&self, signal: &str) -> Result<u32> {
        let pid = {
            let mut s = lock(&self.state);
            let pid = s.pid.context("no process runs in this slot")?;
            if signal == "KILL" {
                s.killing = Some(pid);
            }
            pid
        };
        let status = std::process::Command::new("kill")
            .args([format!("-{signal}"), pid.to_string()])
            .status()
            .context("running kill")?;
        anyhow::ensure!(status.success(), "kill -{signal} {pid} failed");
        Ok(pid)
    }
}

/// All slots, and every exit.
#[derive(Debug)]
pub struct Supervisor {
    /// The slots.
    pub slots: Vec<Arc<Slot>>,
    exits: Arc<Mutex<Vec<Exit>>>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    /// Where the logs go.
    pub log_dir: PathBuf,
}

impl Supervisor {
    /// Starts every slot; each writes `<log_dir>/<slot>.log`.
    pub fn start(specs: Vec<Spec>, log_dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(log_dir)?;
        let exits = Arc::new(Mutex::new(Vec::new()));
        let (stop, stopped) = watch::channel(false);
        let started = Instant::now();
        let mut slots = Vec::new();
        let mut tasks = Vec::new();
        for spec in specs {
            let slot = Arc::new(Slot {
                spec,
                state: Mutex::new(SlotState::default()),
            });
            let log = log_dir.join(format!("{}.log", slot.spec.slot));
            tasks.push(tokio::spawn(keep_running(
                slot.clone(),
                log,
                exits.clone(),
                stopped.clone(),
                started,
            )));
            slots.push(slot);
        }
        Ok(Self {
            slots,
            exits,
            stop,
            tasks,
            log_dir: log_dir.to_path_buf(),
        })
    }

    /// The slots of `controller`.
    pub fn of(&self, controller: &str) -> Vec<Arc<Slot>> {
        self.slots
            .iter()
            .filter(|s| s.spec.controller == controller)
            .cloned()
            .collect()
    }

    /// The slot whose current process has `POD_NAME` `pod_name`.
    pub fn by_pod_name(&self, pod_name: &str) -> Option<Arc<Slot>> {
        self.slots
            .iter()
            .find(|s| s.current().is_some_and(|(_, p)| p == pod_name))
            .cloned()
    }

    /// Every exit so far.
    pub fn exits(&self) -> Vec<Exit> {
        lock(&self.exits).clone()
    }

    /// Stops every process (SIGTERM, then SIGKILL after 15 s) and the supervisors.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(20), task).await;
        }
    }

    /// Lines of the logs that tell of a panic, with the file they are in.
    pub fn panics(&self) -> Vec<String> {
        let mut out = Vec::new();
        for slot in &self.slots {
            let path = self.log_dir.join(format!("{}.log", slot.spec.slot));
            let Ok(text) = std::fs::read_to_string(&path) else {
                out.push(format!("{}: the log cannot be read", path.display()));
                continue;
            };
            out.extend(
                text.lines()
                    .filter(|l| l.contains("panicked at"))
                    .map(|l| format!("{}: {l}", slot.spec.slot)),
            );
        }
        out
    }
}

async fn keep_running(
    slot: Arc<Slot>,
    log: PathBuf,
    exits: Arc<Mutex<Vec<Exit>>>,
    mut stopped: watch::Receiver<bool>,
    started: Instant,
) {
    loop {
        if *stopped.borrow() {
            return;
        }
        let generation = {
            let mut s = lock(&slot.state);
            s.generation += 1;
            s.generation
        };
        let pod_name = format!("{}-g{generation}", slot.spec.slot);
        let child = spawn(&slot.spec, &log, &pod_name, generation);
        let (mut child, metrics) = match child {
            Ok(c) => c,
            Err(e) => {
                eprintln!("soak: starting {pod_name} failed: {e:#}");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        {
            let mut s = lock(&slot.state);
            s.pid = child.id();
            s.pod_name.clone_from(&pod_name);
            s.metrics = metrics;
        }
        let stop = async {
            let _ = stopped.wait_for(|s| *s).await;
        };
        let status = tokio::select! {
            status = child.wait() => status,
            () = stop => {
                stop_child(&mut child).await;
                lock(&slot.state).pid = None;
                return;
            }
        };
        let killed = {
            let mut s = lock(&slot.state);
            let pid = s.pid.take();
            s.killing.take().is_some_and(|k| Some(k) == pid)
        };
        let status = match status {
            Ok(s) => match (s.code(), s.signal()) {
                (Some(c), _) => format!("exit {c}"),
                (_, Some(sig)) => format!("signal {sig}"),
                _ => s.to_string(),
            },
            Err(e) => format!("wait failed: {e}"),
        };
        lock(&exits).push(Exit {
            slot: slot.spec.slot.clone(),
            generation,
            at: started.elapsed(),
            status,
            killed,
        });
        // A kubelet restarts at once the first time, then backs off; one second is enough here.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// SIGTERM, and SIGKILL if it has not stopped 15 s later.
async fn stop_child(child: &mut tokio::process::Child) {
    if let Some(pid) = child.id() {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
    }
    if tokio::time::timeout(Duration::from_secs(15), child.wait())
        .await
        .is_err()
    {
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
}

fn spawn(
    spec: &Spec,
    log: &Path,
    pod_name: &str,
    generation: u32,
) -> Result<(tokio::process::Child, Option<std::net::SocketAddr>)> {
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    writeln!(file, "===== {pod_name} (generation {generation})")?;
    let metrics = if spec.args.iter().any(|a| a.contains("{metrics}")) {
        Some(e2e::free_local_address()?)
    } else {
        None
    };
    let args: Vec<String> = spec
        .args
        .iter()
        .map(|a| match metrics {
            Some(m) => a.replace("{metrics}", &m.to_string()),
            None => a.clone(),
        })
        .collect();
    let child = tokio::process::Command::new(&spec.program)
        .args(&args)
        .env("POD_NAME", pod_name)
        .env("RUST_BACKTRACE", "1")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", spec.program.display()))?;
    Ok((child, metrics))
}

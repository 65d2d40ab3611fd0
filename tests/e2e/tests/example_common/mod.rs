//! What the budget and license examples' end-to-end tests share: one test's namespace and queue
//! guarded by the example's check, how a test reads the check's ledger, and the recorders of the
//! race in which two instances decide for many Workloads at once.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use e2e::{DEFAULT_TIMEOUT, GuardedQueue, TestEnv, WorkloadRecorder};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::watcher::{Config, Event, watcher};
use kube::{Client, ResourceExt};
use kueue_admission_sdk::api::{
    AdmissionCheckState, CheckState, Workload, workload_condition as cond,
};
use kueue_admission_sdk::configmap_store::CorruptEntry;

/// How a test reads an example's ledger, kept by its backend `B`.
pub struct LedgerFormat<B, L> {
    /// Name of the ledger ConfigMap that records the test's namespace.
    pub configmap: fn(&B, &str) -> String,
    /// Reads the ledger from that ConfigMap's data.
    pub parse: fn(&BTreeMap<String, String>) -> Result<L, CorruptEntry>,
    /// The Workloads holding something in a ledger (an open charge, licenses), by name, sorted.
    pub holders: fn(&L) -> Vec<String>,
}

/// One test's namespace, its queue guarded by the example's check, where the check keeps its
/// state, and how to read its ledger.
pub struct ExampleTest<B, L> {
    pub env: TestEnv,
    pub q: GuardedQueue,
    pub backend: B,
    pub ledger_format: LedgerFormat<B, L>,
}

impl<B, L: Debug> ExampleTest<B, L> {
    /// A namespace for `test` with a queue guarded by the AdmissionCheck `check`, which names a
    /// controller of this test only (`controller` and the namespace), and the check's state in
    /// `backend(namespace)`.
    pub async fn new(
        test: &str,
        check: &str,
        controller: &str,
        backend: impl FnOnce(&str) -> B,
        ledger_format: LedgerFormat<B, L>,
    ) -> Result<Self> {
        let env = TestEnv::new(test).await?;
        let q = env
            .guarded_queue(check, &env.own_controller_name(controller), "20")
            .await?;
        let backend = backend(&env.ns);
        Ok(Self {
            env,
            q,
            backend,
            ledger_format,
        })
    }

    /// The Workload's entry for the check (a default one if it has none).
    pub fn entry(&self, wl: &Workload) -> AdmissionCheckState {
        wl.admission_check(&self.q.check)
            .cloned()
            .unwrap_or_default()
    }

    /// Waits until the Workload's entry for the check satisfies `cond`; returns the Workload
    /// and the entry.
    pub async fn entry_when(
        &self,
        workload: &str,
        what: &str,
        cond: impl Fn(&AdmissionCheckState) -> bool,
    ) -> Result<(Workload, AdmissionCheckState)> {
        let wl = self
            .env
            .wait_workload(workload, what, |wl| cond(&self.entry(wl)))
            .await?;
        let entry = self.entry(&wl);
        Ok((wl, entry))
    }

    /// Waits until each of these Workloads is admitted.
    pub async fn wait_all_admitted(&self, workloads: &[&String]) -> Result<()> {
        for wl in workloads {
            self.env.wait_admitted(wl).await?;
        }
        Ok(())
    }

    /// The Workload's uid.
    pub async fn uid(&self, workload: &str) -> Result<String> {
        let wl = self.env.workloads().get(workload).await?;
        wl.uid().context("no uid")
    }

    /// The message of the `Rejected` entry `workload` had before Kueue deactivated it, from
    /// the versions `recorder` saw until then: Kueue evicts a deactivated Workload and resets
    /// the entry to `Pending` in a later write, so the `Rejected` one is only in the history.
    pub async fn rejected_before_deactivation(
        &self,
        recorder: &mut WorkloadRecorder,
        workload: &str,
    ) -> Result<String> {
        let versions = recorder
            .until(workload, "deactivated", |wl| !wl.is_active())
            .await?;
        let rejected = versions
            .iter()
            .map(|v| self.entry(v))
            .find(|entry| entry.state == CheckState::Rejected)
            .with_context(|| format!("{workload}: never Rejected before the deactivation"))?;
        Ok(rejected.message)
    }

    /// The ledger as stored now (empty if there is none yet).
    pub async fn ledger(&self) -> Result<L> {
        let name = (self.ledger_format.configmap)(&self.backend, &self.env.ns);
        let cm = self.env.config_maps().get_opt(&name).await?;
        self.parse(cm)
    }

    /// The ledger in this ConfigMap (empty if there is none).
    fn parse(&self, cm: Option<ConfigMap>) -> Result<L> {
        let data = cm.and_then(|cm| cm.data).unwrap_or_default();
        Ok((self.ledger_format.parse)(&data)?)
    }

    /// The Workloads holding something in `ledger`, by name, sorted.
    pub fn holders(&self, ledger: &L) -> Vec<String> {
        (self.ledger_format.holders)(ledger)
    }

    /// Polls the ledger until `cond` holds.
    pub async fn wait_ledger(&self, what: &str, cond: impl Fn(&L) -> bool) -> Result<L> {
        let deadline = tokio::time::Instant::now() + DEFAULT_TIMEOUT;
        loop {
            let ledger = self.ledger().await?;
            if cond(&ledger) {
                return Ok(ledger);
            }
            if tokio::time::Instant::now() > deadline {
                bail!("timed out waiting for the ledger: {what}\nledger: {ledger:#?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Records the race of the Workloads `submit` creates, all at once, for what only `limit`
    /// of them can have. Two recorders, started before any Job exists, see every version of
    /// every Workload and of the ledger (not samples: a brief over-admission between two looks
    /// cannot be missed). Fails as soon as more than `limit` are admitted at once, a newly
    /// admitted Workload is missing from a fresh read of the ledger (its grant is saved before
    /// `Ready` is written), or a ledger version fails `within_limit`. Done when `limit` are
    /// admitted, every other one was told to retry at least once (every Workload has been
    /// through the race), and the ledger recorder has caught up with the grants.
    pub async fn record_race(
        &self,
        limit: usize,
        submit: impl Future<Output = Result<Vec<String>>>,
        within_limit: impl Fn(&L) -> Result<()>,
    ) -> Result<()> {
        let ledgers = self.env.config_maps();
        let ledger_name = (self.ledger_format.configmap)(&self.backend, &self.env.ns);
        let mut events = futures::stream::select(
            watcher(self.env.workloads(), Config::default()).map(|e| e.map(Seen::Workload)),
            watcher(
                ledgers,
                Config::default().fields(&format!("metadata.name={ledger_name}")),
            )
            .map(|e| e.map(Seen::Ledger)),
        )
        .boxed();
        // Watch streams start when first polled: both initial lists are done before any Job
        // exists, so the recorders see the race from its first version.
        let mut listed = 0;
        while listed < 2 {
            let next = tokio::time::timeout(DEFAULT_TIMEOUT, events.next())
                .await
                .context("the recorders' initial lists")?
                .context("the watches ended")?;
            if matches!(
                next,
                Ok(Seen::Workload(Event::InitDone) | Seen::Ledger(Event::InitDone))
            ) {
                listed += 1;
            }
        }
        let workloads = submit.await?.len();

        let mut admitted: BTreeSet<String> = BTreeSet::new();
        let mut retried: BTreeSet<String> = BTreeSet::new();
        let mut booked: Vec<String> = Vec::new();
        let (mut workload_versions, mut ledger_versions) = (0u32, 0u32);
        let deadline = tokio::time::Instant::now() + DEFAULT_TIMEOUT;
        while admitted.len() < limit
            || retried.difference(&admitted).count() < workloads - limit
            || booked != admitted.iter().cloned().collect::<Vec<_>>()
        {
            let next = tokio::time::timeout_at(deadline, events.next())
                .await
                .map_err(|_| {
                    anyhow::anyhow!(
                        "not settled in time: admitted {admitted:?}, retried {retried:?}, booked \
                         {booked:?} ({workload_versions} Workload, {ledger_versions} ledger \
                         versions seen)"
                    )
                })?
                .context("the watches ended")?;
            match next.context("a recorder's watch failed")? {
                Seen::Workload(Event::Apply(wl) | Event::InitApply(wl)) => {
                    workload_versions += 1;
                    let name = wl.name_any();
                    if self.entry(&wl).state == CheckState::Retry {
                        retried.insert(name.clone());
                    }
                    if !wl.condition_is_true(cond::ADMITTED) {
                        admitted.remove(&name);
                    } else if admitted.insert(name.clone()) {
                        let ledger = self.ledger().await?;
                        ensure!(
                            self.holders(&ledger).contains(&name),
                            "{name} admitted but not in the ledger: {ledger:#?}"
                        );
                    }
                    ensure!(
                        admitted.len() <= limit,
                        "{} admitted at once, over the limit of {limit}: {admitted:?}",
                        admitted.len()
                    );
                }
                Seen::Workload(Event::Delete(wl)) => {
                    admitted.remove(&wl.name_any());
                }
                Seen::Ledger(Event::Apply(cm) | Event::InitApply(cm)) => {
                    ledger_versions += 1;
                    let version = cm.metadata.resource_version.clone();
                    let ledger = self
                        .parse(Some(cm))
                        .with_context(|| format!("ledger version {version:?}"))?;
                    within_limit(&ledger).with_context(|| format!("ledger version {version:?}"))?;
                    booked = self.holders(&ledger);
                }
                _ => {}
            }
        }
        // Hollow if the race never happened: several ledger versions, every Workload seen.
        ensure!(
            ledger_versions >= 3 && workload_versions >= u32::try_from(workloads)?,
            "too little observed: {ledger_versions} ledger and {workload_versions} Workload versions"
        );
        println!(
            "recorded {workload_versions} Workload and {ledger_versions} ledger versions: never \
             over {limit}"
        );
        Ok(())
    }
}

/// Asserts that a check's `message` starts with `expected` (what follows is the SDK's attempt
/// note), showing both if not.
#[track_caller]
pub fn assert_starts_with(message: &str, expected: &str) {
    assert!(
        message.starts_with(expected),
        "the message\n{message}\ndoes not start with\n{expected}"
    );
}

/// A controller instance that can die as a crashed process does: its client can be cut
/// ([`e2e::severable_client`]), so nothing left of it writes after its task is aborted.
pub struct Crashable {
    running: e2e::Running,
    cut: Arc<AtomicBool>,
}

impl Crashable {
    /// Starts an instance with `start`, on a severable client of `client`.
    pub fn start(client: Client, start: impl FnOnce(Client) -> e2e::Running) -> Self {
        let (client, cut) = e2e::severable_client(client);
        Self {
            running: start(client),
            cut,
        }
    }

    /// Crash: the task is aborted and its connection cut.
    pub async fn crash(self) {
        self.cut.store(true, Ordering::SeqCst);
        self.running.kill().await;
    }
}

/// What the race's recorders see.
enum Seen {
    Workload(Event<Workload>),
    Ledger(Event<ConfigMap>),
}

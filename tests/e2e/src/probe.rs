//! The one SDK check the end-to-end tests script as they go: [`Probe`] answers what its
//! [`ProbeScript`] says and records what it was asked and what it released, so a test asserts
//! on calls, attempts and releases instead of on time.
//!
//! The script is shared by the test and every replica it starts. For each call the probe looks,
//! in this order, for: the next queued answer ([`ProbeScript::then`], for any Workload), a gate
//! on the Job ([`ProbeScript::gate`]), the Job's answers by attempt ([`ProbeScript::answer`],
//! [`ProbeScript::answers`]), an answer for the attempt ([`ProbeScript::on_attempt`]), and
//! last [`ProbeScript::otherwise`] (by default `Pending` "no answer yet").
//!
//! A whole test of the SDK against Kueue takes about fifteen lines with the harness's steps:
//! `sdk_runtime::a_probe_test_is_this_short` is the model.

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use kube::{Client, ResourceExt};
use kueue_admission_sdk::api::Workload;
use kueue_admission_sdk::{
    AdmissionCheckController, CheckContext, Decision, Extensions, NoParameters, ReleaseContext,
    ReleaseReason, RetryPolicy, Revalidate, RuntimeConfig,
};
use tokio::sync::Semaphore;

use crate::{Running, TestEnv};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One call the probe answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    /// The replica that was asked (see [`Probe::replica`]).
    pub replica: String,
    /// The Job the Workload belongs to (its first owner).
    pub job: String,
    /// The Workload's name.
    pub workload: String,
    /// `ctx.attempt()`.
    pub attempt: u32,
}

/// What the probe answers and what it saw.
#[derive(Debug)]
pub struct ProbeScript {
    queued: Mutex<VecDeque<(Decision, Option<Arc<Semaphore>>)>>,
    gates: Mutex<BTreeMap<String, Arc<Semaphore>>>,
    by_job: Mutex<BTreeMap<String, Vec<Decision>>>,
    by_attempt: Mutex<BTreeMap<u32, Decision>>,
    otherwise: Mutex<Decision>,
    calls: Mutex<Vec<Call>>,
    releases: Mutex<Vec<(String, ReleaseReason)>>,
}

impl Default for ProbeScript {
    fn default() -> Self {
        Self {
            queued: Mutex::default(),
            gates: Mutex::default(),
            by_job: Mutex::default(),
            by_attempt: Mutex::default(),
            otherwise: Mutex::new(Decision::pending("no answer yet")),
            calls: Mutex::default(),
            releases: Mutex::default(),
        }
    }
}

impl ProbeScript {
    /// An empty script: every call is answered `Pending` "no answer yet".
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// The next call, whichever Workload it is for, answers `decision`.
    pub fn then(&self, decision: Decision) {
        lock(&self.queued).push_back((decision, None));
    }

    /// Like [`ProbeScript::then`], but the call waits until the returned gate gets a permit.
    pub fn then_gated(&self, decision: Decision) -> Arc<Semaphore> {
        let gate = Arc::new(Semaphore::new(0));
        lock(&self.queued).push_back((decision, Some(gate.clone())));
        gate
    }

    /// From now on every call for `job` waits for a permit of the returned gate.
    pub fn gate(&self, job: &str) -> Arc<Semaphore> {
        let gate = Arc::new(Semaphore::new(0));
        lock(&self.gates).insert(job.into(), gate.clone());
        gate
    }

    /// Every call for `job` answers `decision`.
    pub fn answer(&self, job: &str, decision: Decision) {
        self.answers(job, vec![decision]);
    }

    /// Attempt n of `job` answers the n-th decision; the last one repeats.
    pub fn answers(&self, job: &str, decisions: Vec<Decision>) {
        lock(&self.by_job).insert(job.into(), decisions);
    }

    /// A call for attempt `attempt` of a Job without answers of its own answers `decision`.
    pub fn on_attempt(&self, attempt: u32, decision: Decision) {
        lock(&self.by_attempt).insert(attempt, decision);
    }

    /// What a call answers when nothing else in the script applies.
    pub fn otherwise(&self, decision: Decision) {
        *lock(&self.otherwise) = decision;
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        lock(&self.calls).clone()
    }

    /// The (replica, attempt) of every call for `job`.
    pub fn calls_for(&self, job: &str) -> Vec<(String, u32)> {
        self.calls()
            .into_iter()
            .filter(|c| c.job == job)
            .map(|c| (c.replica, c.attempt))
            .collect()
    }

    /// Waits (bounded) until the probe has been asked about `job` (a gate may hold its answer).
    pub async fn wait_asked(&self, job: &str, what: &str) -> anyhow::Result<()> {
        crate::eventually(what, || !self.calls_for(job).is_empty()).await
    }

    /// The replicas asked about `job`, each once, in the order of their first call.
    pub fn replicas_asked(&self, job: &str) -> Vec<String> {
        let mut replicas: Vec<String> = Vec::new();
        for (replica, _) in self.calls_for(job) {
            if !replicas.contains(&replica) {
                replicas.push(replica);
            }
        }
        replicas
    }

    /// The attempt of every call, in order.
    pub fn attempts(&self) -> Vec<u32> {
        self.calls().iter().map(|c| c.attempt).collect()
    }

    /// The attempt of every call for the Workload named `workload`.
    pub fn attempts_of(&self, workload: &str) -> Vec<u32> {
        self.calls()
            .iter()
            .filter(|c| c.workload == workload)
            .map(|c| c.attempt)
            .collect()
    }

    /// Every release's reason, in order.
    pub fn releases(&self) -> Vec<ReleaseReason> {
        lock(&self.releases).iter().map(|(_, r)| *r).collect()
    }

    /// The reasons of the releases of `job`'s Workload.
    pub fn releases_for(&self, job: &str) -> Vec<ReleaseReason> {
        lock(&self.releases)
            .iter()
            .filter(|(j, _)| j == job)
            .map(|(_, r)| *r)
            .collect()
    }

    /// Waits (bounded) until the releases of `job`'s Workload are exactly `expected`.
    pub async fn wait_releases<const N: usize>(
        &self,
        job: &str,
        expected: [ReleaseReason; N],
    ) -> anyhow::Result<()> {
        let what = format!("the releases of {job}");
        crate::eventually_equal(&what, || self.releases_for(job), expected.to_vec()).await
    }

    async fn answer_call(&self, call: Call) -> Decision {
        let job = call.job.clone();
        let attempt = call.attempt;
        lock(&self.calls).push(call);
        let queued = lock(&self.queued).pop_front();
        if let Some((decision, gate)) = queued {
            wait_for_permit(gate).await;
            return decision;
        }
        let gate = lock(&self.gates).get(&job).cloned();
        wait_for_permit(gate).await;
        if let Some(answers) = lock(&self.by_job).get(&job)
            && let Some(last) = answers.len().checked_sub(1)
        {
            return answers[(attempt as usize).saturating_sub(1).min(last)].clone();
        }
        let by_attempt = lock(&self.by_attempt).get(&attempt).cloned();
        by_attempt.unwrap_or_else(|| lock(&self.otherwise).clone())
    }
}

async fn wait_for_permit(gate: Option<Arc<Semaphore>>) {
    if let Some(gate) = gate
        && let Ok(permit) = gate.acquire().await
    {
        permit.forget();
    }
}

/// The Job a Workload belongs to (its first owner), or "".
pub fn job_of(wl: &Workload) -> String {
    wl.owner_references()
        .first()
        .map(|o| o.name.clone())
        .unwrap_or_default()
}

/// An SDK check answering from a [`ProbeScript`].
#[derive(Debug)]
pub struct Probe {
    controller_name: String,
    replica: String,
    policy: RetryPolicy,
    revalidate: Revalidate,
    script: Arc<ProbeScript>,
    while_leading: Mutex<Option<Extensions>>,
}

impl Probe {
    /// A probe for the AdmissionChecks of `controller_name`, with the default retry policy and
    /// no revalidation.
    pub fn new(controller_name: impl Into<String>, script: Arc<ProbeScript>) -> Self {
        Self {
            controller_name: controller_name.into(),
            replica: String::new(),
            policy: RetryPolicy::default(),
            revalidate: Revalidate::Never,
            script,
            while_leading: Mutex::new(None),
        }
    }

    /// The name its calls are recorded under, to tell replicas apart.
    pub fn replica(mut self, replica: &str) -> Self {
        self.replica = replica.into();
        self
    }

    /// The retry policy it gives every check.
    pub fn policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Asks again about a `Ready` answer every `period`, if given.
    pub fn revalidate_every(mut self, period: Option<Duration>) -> Self {
        self.revalidate = period.map_or(Revalidate::Never, Revalidate::Every);
        self
    }

    /// What it runs while it leads.
    pub fn while_leading(self, extensions: Extensions) -> Self {
        *lock(&self.while_leading) = Some(extensions);
        self
    }

    /// Runs it with the test's runtime configuration, changed by `config`.
    pub fn run(
        self,
        env: &TestEnv,
        client: Client,
        config: impl FnOnce(RuntimeConfig) -> RuntimeConfig,
    ) -> Running {
        Running::check(client, self, config(env.runtime_config()))
    }
}

impl AdmissionCheckController for Probe {
    type Parameters = NoParameters;
    type Error = Infallible;

    fn controller_name(&self) -> &str {
        &self.controller_name
    }

    fn retry_policy(&self, _: &NoParameters) -> RetryPolicy {
        self.policy.clone()
    }

    fn revalidate(&self) -> Revalidate {
        self.revalidate
    }

    fn while_leading(&self) -> Extensions {
        lock(&self.while_leading).take().unwrap_or_default()
    }

    async fn decide(&self, ctx: &CheckContext<'_, NoParameters>) -> Result<Decision, Infallible> {
        let call = Call {
            replica: self.replica.clone(),
            job: job_of(ctx.workload),
            workload: ctx.workload.name_any(),
            attempt: ctx.attempt(),
        };
        Ok(self.script.answer_call(call).await)
    }

    async fn release(&self, ctx: &ReleaseContext<'_>) -> Result<(), Infallible> {
        let job = ctx.workload.map(job_of).unwrap_or_default();
        lock(&self.script.releases).push((job, ctx.reason));
        Ok(())
    }
}

//! The SDK runtime's harder moments against the real Kueue: two replicas, a crash in the middle
//! of a decision, a decision computed from a stale Workload, a Retry that arrives after Kueue
//! evicted the Workload, revalidation of a Ready answer, and a deleted Workload.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Result, ensure};
use e2e::TestEnv;
use e2e::chart::Grant;
use e2e::probe::{Probe, ProbeScript};
use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::api::Api;
use kueue_admission_sdk::api::{AdmissionCheck, CheckState, Workload};
use kueue_admission_sdk::{
    Decision, Extensions, LeaderContext, LeaderElection, ReleaseReason, RuntimeConfig,
};
use serde_json::json;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One running replica of the probe's runtime.
type Replica = e2e::Running;

/// A ClusterQueue whose checks are `probe` (served by the runtime under test) and, if asked,
/// `other` (answered by the test itself).
struct Setup {
    controller_name: String,
    probe: String,
    other: Option<String>,
    script: Arc<ProbeScript>,
}

async fn setup(test: &str, with_other: bool) -> Result<(TestEnv, Setup)> {
    let env = TestEnv::new(test).await?;
    let controller_name = format!("e2e.kueue-admission-checks.dev/{}", env.ns);
    let flavor = env.resource_flavor("default").await?.name_any();
    let probe = env
        .admission_check("probe", &controller_name)
        .await?
        .name_any();
    let mut checks = vec![probe.clone()];
    let other = if with_other {
        let name = env
            .admission_check("other", "e2e.kueue-admission-checks.dev/played-by-the-test")
            .await?
            .name_any();
        env.set_admission_check_active(&name, true).await?;
        checks.push(name.clone());
        Some(name)
    } else {
        None
    };
    let refs: Vec<&str> = checks.iter().map(String::as_str).collect();
    env.queues_on(&flavor, "4", &refs).await?;
    let s = Setup {
        controller_name,
        probe,
        other,
        script: Default::default(),
    };
    Ok((env, s))
}

impl Setup {
    /// Answers Job `job` with `answer`, starts one replica and waits until the Job is
    /// admitted; returns the replica and the Workload's name.
    async fn start_admitted(
        &self,
        env: &TestEnv,
        answer: Decision,
        replica: &str,
        revalidate: Option<Duration>,
    ) -> Result<(Replica, String)> {
        self.script.answer("job", answer);
        let running = self.start(env, replica, None, revalidate)?;
        let wl = env.admitted_job("job").await?;
        Ok((running, wl))
    }

    /// Answers Job `job` `Ready`, waits until it is admitted, and ensures only `replica`
    /// decided it (`what` says why).
    async fn admitted_by(&self, env: &TestEnv, job: &str, replica: &str, what: &str) -> Result<()> {
        self.script.answer(job, Decision::ready("approved"));
        env.admitted_job(job).await?;
        let calls = self.script.calls_for(job);
        ensure!(
            !calls.is_empty() && calls.iter().all(|(r, _)| r == replica),
            "{what}: {calls:?}"
        );
        Ok(())
    }

    /// A replica that elects on the Lease `probe` as `identity`, with `lease` as its duration.
    fn start_candidate(&self, env: &TestEnv, identity: &str, lease: Duration) -> Result<Replica> {
        self.start(env, identity, Some(election(env, identity, lease)), None)
    }

    /// A replica of its own deployment: it elects on the Lease `lease_name` as `identity`.
    fn start_deployment(
        &self,
        env: &TestEnv,
        identity: &str,
        lease_name: &str,
        lease: Duration,
    ) -> Result<Replica> {
        let election = LeaderElection {
            lease_name: lease_name.into(),
            ..election(env, identity, lease)
        };
        self.start(env, identity, Some(election), None)
    }

    /// The metrics series `name` of the probe's check, with `extra` labels if any.
    fn series(&self, name: &str, extra: &str) -> String {
        match extra {
            "" => format!("{name}{{check=\"{}\"}}", self.probe),
            _ => format!("{name}{{check=\"{}\",{extra}}}", self.probe),
        }
    }

    fn start(
        &self,
        env: &TestEnv,
        replica: &str,
        election: Option<LeaderElection>,
        revalidate: Option<Duration>,
    ) -> Result<Replica> {
        self.start_with(env, replica, election, revalidate, Extensions::new())
    }

    fn start_with(
        &self,
        env: &TestEnv,
        replica: &str,
        election: Option<LeaderElection>,
        revalidate: Option<Duration>,
        extensions: Extensions,
    ) -> Result<Replica> {
        self.start_as(
            env,
            env.client.clone(),
            replica,
            election,
            revalidate,
            extensions,
        )
    }

    /// A replica acting with `client` (e.g. a ServiceAccount's).
    fn start_as(
        &self,
        env: &TestEnv,
        client: kube::Client,
        replica: &str,
        election: Option<LeaderElection>,
        revalidate: Option<Duration>,
        extensions: Extensions,
    ) -> Result<Replica> {
        let http = e2e::free_local_address()?;
        let probe = Probe::new(&self.controller_name, self.script.clone())
            .replica(replica)
            .revalidate_every(revalidate)
            .while_leading(extensions);
        Ok(probe.run(env, client, |config| RuntimeConfig {
            metrics_address: Some(http),
            health_address: Some(http),
            leader_election: election,
            ..config
        }))
    }
}

fn election(env: &TestEnv, identity: &str, lease_duration: Duration) -> LeaderElection {
    LeaderElection {
        namespace: env.ns.clone(),
        lease_name: "probe".into(),
        identity: identity.into(),
        lease_duration,
        renew_grace: lease_duration / 3,
    }
}

/// Waits until the Lease `probe` is held by `holder` (`None`: by no one).
async fn wait_holder(env: &TestEnv, holder: Option<&str>) -> Result<Lease> {
    let what = format!("Lease held by {holder:?}");
    env.wait_lease_holder("probe", &what, |h| h == holder).await
}

/// The replica's `kueue_ac_decisions_total` samples, one line each.
async fn decision_series(replica: &Replica) -> Result<Vec<String>> {
    let (_, metrics) = e2e::http_get(replica.addr()?, "/metrics").await?;
    Ok(metrics
        .lines()
        .filter(|l| l.starts_with("kueue_ac_decisions_total{"))
        .map(String::from)
        .collect())
}

/// The `other` check answers an immediate `Retry` ("try again"); waits until Kueue has evicted
/// the Workload and it holds quota again (not `Evicted`): the next attempt.
async fn evicted_by_the_others_retry(env: &TestEnv, wl: &str, other: &str) -> Result<Workload> {
    env.answer_check(wl, other, CheckState::Retry, "try again")
        .await?;
    env.wait_next_attempt(wl).await
}

/// Ensures a `requeueAfterSeconds` is what is left of a 40 s delay decided at `decided_at` (the
/// SDK adds back the sub-second part Kueue drops, so up to 41).
fn ensure_what_is_left_of_40s(left: Option<i32>, decided_at: std::time::Instant) -> Result<()> {
    let left = left.unwrap_or(0);
    let elapsed = decided_at.elapsed().as_secs() as i32;
    ensure!(
        (40 - elapsed - 3..=41).contains(&left),
        "requeueAfterSeconds {left}, expected what is left of 40 s ({elapsed} s elapsed; the SDK \
         adds back the sub-second part Kueue drops, so up to 41)"
    );
    Ok(())
}

/// Waits until Kueue has scheduled the Workload's next attempt (`requeueAt` set).
async fn next_attempt_scheduled(env: &TestEnv, wl: &str) -> Result<Workload> {
    env.wait_workload(wl, "Kueue scheduling the next attempt (requeueAt)", |w| {
        w.requeue_at().is_some()
    })
    .await
}

/// Extensions with a task that, each time the returned sender signals, finds a Workload of
/// `namespace` in the runtime's cache, remembers its name (the returned slot) and wakes it.
fn waker_on_signal(
    namespace: &str,
) -> (
    Extensions,
    tokio::sync::mpsc::Sender<()>,
    Arc<Mutex<Option<String>>>,
) {
    let (go, mut gone) = tokio::sync::mpsc::channel::<()>(1);
    let cached = Arc::new(Mutex::new(None::<String>));
    let seen = cached.clone();
    let namespace = namespace.to_string();
    let extensions =
        Extensions::new().while_leading("waker", move |ctx: LeaderContext| async move {
            while gone.recv().await.is_some() {
                // The task finds the Workload in the runtime's cache and wakes it.
                let Some(wl) = ctx
                    .workloads
                    .state()
                    .into_iter()
                    .find(|w| w.namespace().as_deref() == Some(namespace.as_str()))
                else {
                    continue;
                };
                *lock(&seen) = Some(wl.name_any());
                ctx.waker.wake(&namespace, &wl.name_any()).await;
            }
        });
    (extensions, go, cached)
}

/// A client of the ServiceAccount `name` that may read AdmissionChecks and patch their status
/// but not list Workloads; returns once the authorizer says so.
async fn account_that_cannot_list_workloads(env: &TestEnv, name: &str) -> Result<kube::Client> {
    env.grant_cluster_rules(
        name,
        json!([
            {"apiGroups": ["kueue.x-k8s.io"], "resources": ["admissionchecks"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["kueue.x-k8s.io"], "resources": ["admissionchecks/status"], "verbs": ["patch"]},
        ]),
    )
    .await?;
    let client = env.service_account(name).await?;
    let kueue = |resource: &str, verb: &str| Grant::cluster("kueue.x-k8s.io", resource, verb);
    e2e::chart::wait_for_authorizer(
        &env.client,
        &env.ns,
        name,
        &[kueue("admissionchecks", "list")],
        &[kueue("workloads", "list")],
    )
    .await?;
    Ok(client)
}

/// Creates the Lease `name` as another program would (its own field manager, held by
/// `someone-else` for an hour).
async fn lease_of_another_program(leases: &Api<Lease>, name: &str) -> Result<Lease> {
    let foreign: Lease = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"holderIdentity": "someone-else", "leaseDurationSeconds": 3600},
    }))?;
    Ok(leases
        .create(
            &kube::api::PostParams {
                field_manager: Some("another-program".into()),
                ..Default::default()
            },
            &foreign,
        )
        .await?)
}

/// A Workload `name` of one 1-cpu pod in `lq` that no Job owns (so its name is its own).
fn workload_without_a_job(env: &TestEnv, name: &str) -> Result<Workload> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": name, "namespace": env.ns},
        "spec": {"queueName": "lq", "podSets": [{
            "name": "main", "count": 1,
            "template": {"spec": {"restartPolicy": "Never", "containers": [{
                "name": "main", "image": "registry.invalid/none:1",
                "resources": {"requests": {"cpu": "1"}},
            }]}},
        }]},
    }))?)
}

#[tokio::test]
async fn two_replicas_only_the_leader_writes_and_a_clean_stop_hands_over() -> Result<()> {
    let (env, s) = setup("sdk-two-replicas", false).await?;
    let lease = Duration::from_secs(6);
    let a = s.start_candidate(&env, "a", lease)?;
    wait_holder(&env, Some("a")).await?;
    let b = s.start_candidate(&env, "b", lease)?;
    // The standby keeps warm caches and reports ready, but does not lead.
    b.wait_ready().await?;
    ensure!(b.metric("kueue_ac_leader").await? == Some(0.0));

    s.admitted_by(&env, "first", "a", "only the leader decides")
        .await?;
    ensure!(a.metric("kueue_ac_leader").await? == Some(1.0));
    ensure!(b.metric("kueue_ac_leader").await? == Some(0.0));
    // Its decision series exist (at 0 from the check's first sync), and stay at 0.
    let decided = decision_series(&b).await?;
    let four_zeros = decided.len() == 4 && decided.iter().all(|l| l.ends_with(" 0"));
    ensure!(four_zeros, "the standby wrote nothing: {decided:?}");

    // A clean stop releases the Lease (holder cleared) and the standby takes it over.
    a.stop().await?;
    let holder = env.lease_holder("probe").await?;
    let why = "a clean stop releases the Lease, still held by";
    ensure!(holder.as_deref() != Some("a"), "{why} {holder:?}");
    wait_holder(&env, Some("b")).await?;
    s.admitted_by(&env, "second", "b", "the new leader decides")
        .await?;
    ensure!(b.metric("kueue_ac_leader").await? == Some(1.0));
    b.stop().await
}

#[tokio::test]
async fn a_replica_killed_mid_decision_is_replaced_and_nothing_is_lost_or_doubled() -> Result<()> {
    let (env, s) = setup("sdk-killed", false).await?;
    let lease = Duration::from_secs(4);
    let gate = s.script.gate("job");
    s.script.answer("job", Decision::ready("approved"));
    let first = s.start_candidate(&env, "first", lease)?;
    let wl = env.submit_job("job", "lq", "1").await?;
    s.script
        .wait_asked("job", "the first replica deciding")
        .await?;
    // Killed while the check is deciding: nothing written, the Lease left to expire.
    first.kill().await;
    let pending = env.wait_check_pending_with_quota(&wl, &s.probe).await?;
    ensure!(e2e::entry_state(&pending, &s.probe) == Some(CheckState::Pending));

    gate.add_permits(100);
    let second = s.start_candidate(&env, "second", lease)?;
    env.wait_admitted(&wl).await?;
    let calls = s.script.calls_for("job");
    let by_second = calls.iter().filter(|(r, _)| r == "second").count();
    ensure!(by_second == 1, "the new replica decided once: {calls:?}");
    ensure!(calls.iter().all(|(_, attempt)| *attempt == 1), "{calls:?}");
    let events = env.wait_event_count(&wl, "CheckReady", 1).await?;
    ensure!(events == 1, "one Ready written, one event");
    let ready = s.series("kueue_ac_decisions_total", r#"state="Ready""#);
    ensure!(second.metric(&ready).await? == Some(1.0));
    second.stop().await
}

#[tokio::test]
async fn a_decision_from_a_stale_workload_is_refused_and_recomputed() -> Result<()> {
    let (env, s) = setup("sdk-stale", false).await?;
    let gate = s.script.gate("job");
    s.script.answer("job", Decision::ready("approved"));
    let replica = s.start(&env, "only", None, None)?;
    let wl = env.submit_job("job", "lq", "1").await?;
    env.wait_check_pending_with_quota(&wl, &s.probe).await?;
    s.script.wait_asked("job", "the check deciding").await?;
    let calls_before = s.script.calls_for("job").len();
    // The Workload changes while the check decides: its answer now carries an old
    // resourceVersion, which the API server must refuse.
    env.touch_workload(&wl, "by-the-test").await?;
    gate.add_permits(100);
    env.wait_admitted(&wl).await?;
    let calls = s.script.calls_for("job");
    // At least once more; Kueue's own write right after QuotaReserved can add another 409.
    let asked_again = calls.len() > calls_before;
    ensure!(asked_again, "asked again after the conflict: {calls:?}");
    let series = s.series("kueue_ac_write_conflicts_total", "");
    let conflicts = replica.metric(&series).await?.unwrap_or(0.0);
    ensure!(conflicts >= 1.0, "the refused write was counted");
    ensure!(env.wait_event_count(&wl, "CheckReady", 1).await? == 1);
    replica.stop().await
}

#[tokio::test]
async fn a_retry_that_arrives_after_an_eviction_holds_for_the_next_attempt() -> Result<()> {
    let (env, s) = setup("sdk-late-retry", true).await?;
    let other = s.other.clone().expect("other check");
    let gate = s.script.gate("job");
    let busy = Decision::retry_after("licence server busy", Duration::from_secs(40));
    s.script.answer("job", busy);
    let replica = s.start(&env, "only", None, None)?;
    let wl = env.submit_job("job", "lq", "1").await?;
    env.wait_check_pending_with_quota(&wl, &s.probe).await?;
    s.script.wait_asked("job", "the probe deciding").await?;

    // While the probe decides, the other check asks for an immediate retry: Kueue evicts the
    // Workload, resets every entry to Pending and reserves quota again at once.
    evicted_by_the_others_retry(&env, &wl, &other).await?;
    let decided_at = std::time::Instant::now();
    gate.add_permits(100);

    // The late Retry is not lost: written on the new attempt for what is left of its delay.
    let (_, entry) = env.wait_entry(&wl, &s.probe, CheckState::Retry).await?;
    ensure_what_is_left_of_40s(entry.requeue_after_seconds, decided_at)?;
    let carried = entry.message.contains("decided for attempt 1");
    ensure!(carried, "{}", entry.message);
    let calls = s.script.calls_for("job");
    ensure!(calls.len() == 1, "the check was not asked again: {calls:?}");
    let note = env.event_note(&wl, "CheckRetryCarriedOver").await?;
    ensure!(note.contains("arrived after Kueue evicted"), "{note}");
    next_attempt_scheduled(&env, &wl).await?;
    replica.stop().await
}

#[tokio::test]
async fn revalidation_withdraws_a_ready_answer() -> Result<()> {
    let (env, s) = setup("sdk-revalidate", false).await?;
    let ready = Decision::ready("within budget");
    let every_second = Some(Duration::from_secs(1));
    let (replica, wl) = s.start_admitted(&env, ready, "only", every_second).await?;
    // The check changes its mind about an admitted Workload: Kueue must evict it.
    // An immediate Retry: a delayed one would keep the quota until the delay ends.
    let withdrawn = Decision::retry_after("budget withdrawn", Duration::ZERO);
    s.script.answer("job", withdrawn);
    let evicted = env
        .wait_workload(&wl, "evicted after the Ready was withdrawn", |w| {
            w.total_evictions() >= 1
        })
        .await?;
    let revalidations = s.script.calls_for("job").len();
    ensure!(revalidations >= 2, "asked again while Ready");
    let entry = evicted.admission_check(&s.probe);
    let retried = entry
        .is_some_and(|e| e.retry_count.unwrap_or(0) >= 1 || e.message.contains("budget withdrawn"));
    ensure!(retried, "{}", e2e::dump(&evicted));
    replica.stop().await
}

#[tokio::test]
async fn a_deleted_workload_is_released_once() -> Result<()> {
    let (env, s) = setup("sdk-deleted", false).await?;
    let (replica, wl) = s
        .start_admitted(&env, Decision::ready("licence granted"), "only", None)
        .await?;
    env.delete_workload(&wl).await?;
    s.script
        .wait_releases("job", [ReleaseReason::Deleted])
        .await?;
    // And not again later: a second Workload, admitted and deleted after the first, is a
    // marker. Once its own release is seen, the runtime has gone past everything the first
    // deletion could have caused; a sleep would only guess how long that takes.
    s.script
        .answer("marker", Decision::ready("licence granted"));
    let marker = env.admitted_job("marker").await?;
    env.delete_workload(&marker).await?;
    s.script
        .wait_releases("marker", [ReleaseReason::Deleted])
        .await?;
    assert_eq!(s.script.releases_for("job"), [ReleaseReason::Deleted]);
    replica.stop().await
}

/// A process that starts after another answered `Ready` still releases the Workload when it
/// finishes: the runtime remembers answers it finds on Workloads that hold quota.
#[tokio::test]
async fn a_workload_admitted_before_a_restart_is_released_when_it_finishes() -> Result<()> {
    let (env, s) = setup("sdk-restart-release", false).await?;
    let (first, wl) = s
        .start_admitted(&env, Decision::ready("granted"), "first", None)
        .await?;
    first.stop().await?;

    let second = s.start(&env, "second", None, None)?;
    // Ready: caches synced, and everything cached is queued for one reconcile on taking the
    // lead; give that queue a moment before the Workload finishes.
    second.wait_ready().await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The Job completes: Kueue marks the Workload Finished.
    env.complete_job("job", &wl).await?;
    s.script
        .wait_releases("job", [ReleaseReason::Finished])
        .await?;
    // (The first replica may have been asked twice: Kueue's own write right after the quota
    // reservation often refuses the first answer with 409.)
    assert_eq!(
        s.script.replicas_asked("job"),
        ["first"],
        "the second replica asked the check again"
    );
    second.stop().await
}

/// A task beside the runtime sees the Workload cache and wakes a Workload when something outside
/// it changed: the check is asked again at once, with no recheck timer.
#[tokio::test]
async fn a_task_beside_the_runtime_wakes_a_workload() -> Result<()> {
    let (env, s) = setup("sdk-wake", false).await?;
    // The check says Pending without asking to be asked again; only a wake can move it on.
    s.script
        .answer("job", Decision::pending("waiting for the outside world"));
    let (extensions, go, woken) = waker_on_signal(&env.ns);
    let replica = s.start_with(&env, "only", None, None, extensions)?;
    let wl = env.submit_job("job", "lq", "1").await?;
    env.wait_entry_message(&wl, &s.probe, "waiting for the outside world")
        .await?;
    // The runtime's own write is a change too and asks once more (same answer, nothing
    // written); after that, nothing changes on the Workload and nothing asks the check again...
    tokio::time::sleep(Duration::from_secs(1)).await;
    let asked = s.script.calls_for("job").len();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let asked_later = s.script.calls_for("job").len();
    ensure!(asked_later == asked, "asked again without a wake");
    // ...until the outside world changes and the task wakes it.
    s.script
        .answer("job", Decision::ready("the outside world agreed"));
    go.send(()).await?;
    env.wait_admitted(&wl).await?;
    ensure!(lock(&woken).as_deref() == Some(wl.as_str()));
    replica.stop().await
}

/// A replica whose Workload cache cannot fill (its RBAC forbids listing Workloads) never reports
/// ready, and still stops at once on SIGTERM: with nothing reconciled there is nothing to finish
/// (Kubernetes would otherwise kill it only after the grace period, at every rollout).
#[tokio::test]
async fn a_replica_whose_cache_never_syncs_still_stops_cleanly() -> Result<()> {
    let (env, s) = setup("sdk-unsynced", false).await?;
    let client = account_that_cannot_list_workloads(&env, "probe").await?;
    let replica = s.start_as(&env, client, "a", None, None, Extensions::new())?;
    // The check is resolved and kept active (that needs no Workload), but the replica is not ready.
    env.wait_active::<AdmissionCheck>(&s.probe, "True", None)
        .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (code, _) = e2e::http_get(replica.addr()?, "/readyz").await?;
    ensure!(code == 503, "not ready without a Workload cache: {code}");

    let started = tokio::time::Instant::now();
    replica.stop().await?;
    let took = started.elapsed();
    ensure!(
        took < Duration::from_secs(5),
        "a replica with nothing in flight stops at once, took {took:?}"
    );
    Ok(())
}

/// A Lease of the configured name that another program made is never joined or changed: the
/// runtime refuses to start, naming the Lease and the flag to choose another.
#[tokio::test]
async fn a_lease_made_by_another_program_is_left_alone() -> Result<()> {
    let (env, s) = setup("sdk-foreign-lease", false).await?;
    let leases = env.leases();
    let foreign = lease_of_another_program(&leases, "shared-name").await?;
    let election = LeaderElection::new(&env.ns, "shared-name");
    let replica = s.start(&env, "only", Some(election), None)?;
    // It ends by itself, without a stop (a stop while it waits to join would end it cleanly).
    let ended = replica.ended_by_itself(e2e::DEFAULT_TIMEOUT).await?;
    let err = ended.expect_err("the runtime must refuse a foreign Lease");
    ensure!(
        err.to_string()
            .contains("not made by a kueue-admission-sdk controller")
            && err.to_string().contains("--leader-election-id"),
        "{err:#}"
    );
    let after = leases.get("shared-name").await?;
    ensure!(
        after.resource_version() == foreign.resource_version(),
        "the foreign Lease was changed:\n{}",
        e2e::dump(&after)
    );
    Ok(())
}

/// Every decision produces its Event, whatever the Workload's name: kube-runtime's recorder
/// names an event `<object>.<16 hex digits>`, which is too long for a Workload named near the
/// 253-character limit (plain Workloads and pod groups choose their own names).
#[tokio::test]
async fn decisions_about_a_workload_with_a_253_character_name_have_their_events() -> Result<()> {
    let (env, s) = setup("sdk-long-name", false).await?;
    s.script.answer("", Decision::ready("approved"));
    let replica = s.start(&env, "only", None, None)?;
    let name = format!("w{}", "x".repeat(252));
    env.create_workload(&workload_without_a_job(&env, &name)?)
        .await?;
    env.wait_admitted(&name).await?;
    let note = env.event_note(&name, "CheckReady").await?;
    ensure!(note.contains("approved"), "{note}");
    replica.stop().await
}

/// The claim condition a leader writes on each check it answers.
const CLAIM: &str = "kueue-admission-checks.dev/AnsweredBy";

fn claim_on(ac: &kueue_admission_sdk::api::AdmissionCheck) -> Option<String> {
    let conditions = ac.status.as_ref().map(|s| s.conditions.as_slice())?;
    kueue_admission_sdk::api::find_condition(conditions, CLAIM)
        .filter(|c| c.status == "True")
        .map(|c| c.message.clone())
}

/// The AdmissionChecks (cluster scoped).
fn checks(env: &TestEnv) -> Api<AdmissionCheck> {
    Api::all(env.client.clone())
}

/// How a claim names the deployment that elects on the Lease `lease_name`.
fn claimed_by(env: &TestEnv, lease_name: &str) -> String {
    format!("Lease {}/{lease_name}", env.ns)
}

/// Waits until `check` is claimed by the deployment electing on `lease_name`; returns the claim
/// as read right after.
async fn wait_claimed_by(env: &TestEnv, check: &str, lease_name: &str) -> Result<Option<String>> {
    let by = claimed_by(env, lease_name);
    let what = format!("claimed by {lease_name}");
    e2e::wait_for(checks(env), check, &what, |ac| {
        claim_on(ac).is_some_and(|m| m.ends_with(&by))
    })
    .await?;
    Ok(claim_on(&checks(env).get(check).await?))
}

/// Waits until the replica's `gauge` of standing down and its leader gauge are both 1 (in
/// either order).
async fn standing_down_and_leading(replica: &Replica, gauge: &str) -> Result<()> {
    e2e::wait_metric(replica.addr()?, gauge, 1.0).await?;
    e2e::wait_metric(replica.addr()?, "kueue_ac_leader", 1.0).await?;
    Ok(())
}

/// Waits for the Warning event `ClaimedElsewhere` on the AdmissionCheck `check`; returns its
/// message.
async fn claimed_elsewhere_warning(env: &TestEnv, check: &str) -> Result<String> {
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::all(env.client.clone());
    let warning = e2e::wait_for_any(events, "a ClaimedElsewhere event on the check", |e| {
        e.involved_object.name.as_deref() == Some(check)
            && e.reason.as_deref() == Some("ClaimedElsewhere")
    })
    .await?;
    Ok(warning.message.unwrap_or_default())
}

/// Catalogue: two *deployments* with the same controllerName (here two runtimes electing on
/// different Leases, as two Helm releases in different namespaces would). The first leader
/// claims the check (a condition naming its Lease); the second finds the claim, stands down for
/// the check (its gauge, a Warning Event on the check) and never overwrites it, so each Workload
/// is answered by one deployment only. A clean stop of the first withdraws its claim, and the
/// second takes the check over by itself.
#[tokio::test]
async fn two_deployments_with_one_controller_name_answer_through_one_and_hand_over() -> Result<()> {
    let (env, s) = setup("sdk-two-deployments", false).await?;
    let lease = Duration::from_secs(6);
    let a = s.start_deployment(&env, "a", "deployment-a", lease)?;
    let claimed = wait_claimed_by(&env, &s.probe, "deployment-a").await?;

    let b = s.start_deployment(&env, "b", "deployment-b", lease)?;
    b.wait_ready().await?;
    let gauge = s.series("kueue_ac_check_claimed_elsewhere", "");
    // A standby stands down too (the gauge comes from the check watch every replica runs), so
    // b may see the claim before it has won its own Lease: wait for both, in either order.
    standing_down_and_leading(&b, &gauge).await?;
    ensure!(a.metric(&gauge).await?.is_none(), "a is not standing down");
    let note = claimed_elsewhere_warning(&env, &s.probe).await?;
    let names_a = note.contains(&claimed_by(&env, "deployment-a"));
    ensure!(names_a && note.contains("same controllerName"), "{note}");

    s.admitted_by(&env, "first", "a", "only the claiming deployment decides")
        .await?;
    let after = claim_on(&checks(&env).get(&s.probe).await?);
    ensure!(
        after == claimed,
        "the claim was never overwritten: {after:?}"
    );

    // A clean stop withdraws the claim; the other deployment takes the check over.
    a.stop().await?;
    wait_claimed_by(&env, &s.probe, "deployment-b").await?;
    s.admitted_by(&env, "second", "b", "the remaining deployment decides")
        .await?;
    // Taken off in the same step that let b answer the check again.
    ensure!(b.metric(&gauge).await?.is_none(), "b no longer stands down");
    b.stop().await
}

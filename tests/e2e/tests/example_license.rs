//! The license-check example against the real Kueue: its controller runs in this process, one
//! instance (or two) per test, answering only that test's AdmissionCheck.

mod example_common;

use std::time::Duration;

use anyhow::{Result, ensure};
use example_common::{Crashable, ExampleTest, LedgerFormat, assert_starts_with};
use k8s_openapi::api::batch::v1::Job;
use kube::api::{ListParams, PostParams};
use kube::{Client, ResourceExt};
use kueue_admission_sdk::RetryPolicy;
use kueue_admission_sdk::api::{
    AdmissionCheckState, CheckState, Workload, workload_condition as cond,
};
use license_check::backend::Saved;
use license_check::ledger::Ledger;
use license_check::request::LICENSES_ANNOTATION;
use license_check::{ConfigMapBackend, LicenseCheck, Settings};
use serde_json::json;

const POOL: &str = license_check::DEFAULT_POOL_CONFIGMAP;
const LEDGER: &str = license_check::DEFAULT_LEDGER_CONFIGMAP;

/// One test's queue, check and the ConfigMaps its controller uses.
type Licensed = ExampleTest<ConfigMapBackend, Ledger>;

/// One ledger ConfigMap for all namespaces; a Workload is in it while it holds licenses.
const LEDGER_FORMAT: LedgerFormat<ConfigMapBackend, Ledger> = LedgerFormat {
    configmap: |backend, _| backend.ledger.clone(),
    parse: Ledger::from_config_map_data,
    holders,
};

/// A test's namespace and queue guarded by the license check, with no pool and no controller.
async fn setup(test: &str) -> Result<Licensed> {
    let backend = |ns: &str| ConfigMapBackend {
        namespace: ns.into(),
        pool: POOL.into(),
        ledger: LEDGER.into(),
    };
    ExampleTest::new(test, "licenses", "license", backend, LEDGER_FORMAT).await
}

/// [`setup`] with the license pool `pool` and a controller started.
async fn setup_running(test: &str, pool: &[(&str, &str)]) -> Result<(Licensed, e2e::Running)> {
    let t = setup(test).await?;
    t.set_pool(pool).await?;
    let controller = t.start(t.env.client.clone());
    Ok((t, controller))
}

impl Licensed {
    /// Starts a controller instance on `client`: backoff 1 s doubling to 4 s, no retry limit,
    /// a ledger sweep at start (and not again during the test).
    fn start(&self, client: Client) -> e2e::Running {
        let settings = Settings {
            controller_name: self.q.controller_name.clone(),
            retry_policy: RetryPolicy::exponential(
                Duration::from_secs(1),
                2.0,
                Duration::from_secs(4),
                0.0,
            ),
            pool_recheck: Duration::from_secs(1),
            sweep_interval: Duration::from_secs(3600),
        };
        let runtime = self.env.runtime_config();
        e2e::Running::check(
            client,
            LicenseCheck::new(settings, self.backend.clone()),
            runtime,
        )
    }

    /// Sets (creates or replaces) the license pool ConfigMap.
    async fn set_pool(&self, data: &[(&str, &str)]) -> Result<()> {
        self.env.put_config_map(POOL, data).await?;
        Ok(())
    }

    /// Submits a suspended Job of one pod whose template asks for `licenses`; returns the name
    /// of its Workload.
    async fn submit(&self, job: &str, licenses: &str) -> Result<String> {
        let job: Job = serde_json::from_value(json!({
            "metadata": {"name": job, "labels": {"kueue.x-k8s.io/queue-name": "lq"}},
            "spec": {
                "suspend": true,
                "template": {
                    "metadata": {"annotations": {LICENSES_ANNOTATION: licenses}},
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{
                            "name": "main",
                            "image": "registry.invalid/no-pod-runs-here:1",
                            "resources": {"requests": {"cpu": "100m"}},
                        }],
                    },
                },
            },
        }))?;
        let job = self.env.jobs().create(&PostParams::default(), &job).await?;
        Ok(self.env.workload_for_job(&job).await?.name_any())
    }

    /// Ends the Job as its pods would: Kueue marks its Workload `Finished`. Waits for that.
    async fn finish(&self, job: &str, workload: &str) -> Result<()> {
        self.env.complete_job(job, workload).await?;
        Ok(())
    }

    /// Starts an instance whose client pauses `pause` after each read of the ledger
    /// ([`dawdling`]).
    fn start_dawdling(&self, pause: Duration) -> e2e::Running {
        let client = dawdling(self.env.client.clone(), &self.backend.namespace, pause);
        self.start(client)
    }

    /// Saves an empty ledger, so that grants race on updates, not on who creates it first.
    async fn save_empty_ledger(&self) -> Result<Saved> {
        Ok(self
            .backend
            .save(&self.env.client, &Ledger::default(), None)
            .await?)
    }

    /// Waits until the check answers the Workload `Retry` on its second attempt (the license
    /// is taken); returns the Workload and the entry.
    async fn retry_on_second_attempt(&self, wl: &str) -> Result<(Workload, AdmissionCheckState)> {
        self.entry_when(wl, "Retry on its second attempt", |e| {
            e.state == CheckState::Retry && e.message.contains("(attempt 2;")
        })
        .await
    }

    /// Waits until the check answers the Workload `Retry` (the license is taken).
    async fn told_the_license_is_taken(&self, wl: &str) -> Result<()> {
        self.entry_when(wl, "Retry: the license is taken", |e| {
            e.state == CheckState::Retry
        })
        .await?;
        Ok(())
    }

    /// Asserts that the ledger names `wl` as the only holder, of the one matlab license.
    async fn assert_sole_holder(&self, wl: &str) -> Result<()> {
        let ledger = self.ledger().await?;
        assert_eq!(holders(&ledger), vec![wl.to_string()]);
        assert_eq!(matlab_in_use(&ledger), 1);
        Ok(())
    }

    /// Waits until the Workload has been asked again and told to retry (retryCount 2 or more).
    async fn told_to_retry_again(&self, wl: &str) -> Result<()> {
        self.entry_when(wl, "asked again and told to retry", |e| {
            e.state == CheckState::Retry && e.retry_count >= Some(2)
        })
        .await?;
        Ok(())
    }

    /// Waits until Kueue has replaced the deleted Workload `first_uid` of the Job (same name,
    /// another uid) and admitted the successor.
    async fn successor_admitted(&self, wl: &str, first_uid: &str) -> Result<Workload> {
        self.env
            .wait_workload(wl, "a successor admitted", |w| {
                w.uid().is_some_and(|u| u != first_uid) && w.condition_is_true(cond::ADMITTED)
            })
            .await
    }

    /// Waits until the ledger no longer holds licenses for `reclaimed` and has exactly one
    /// holder; returns that holder's name.
    async fn only_holder_after_reclaiming(&self, reclaimed: &str) -> Result<String> {
        let ledger = self
            .wait_ledger("A's holding reclaimed, one new holder", |l| {
                l.holding(reclaimed).is_none() && l.holdings().len() == 1
            })
            .await?;
        Ok(holders(&ledger).remove(0))
    }

    /// The names of the test's Workloads that are admitted now.
    async fn admitted(&self) -> Result<Vec<String>> {
        let list = self.env.workloads().list(&ListParams::default()).await?;
        Ok(list
            .items
            .iter()
            .filter(|wl| wl.condition_is_true(cond::ADMITTED))
            .map(|wl| wl.name_any())
            .collect())
    }
}

/// Holders in the ledger, by Workload name.
fn holders(ledger: &Ledger) -> Vec<String> {
    let mut names: Vec<String> = ledger.holdings().values().map(|h| h.name.clone()).collect();
    names.sort();
    names
}

/// How many matlab licenses the ledger books.
fn matlab_in_use(ledger: &Ledger) -> u32 {
    ledger.in_use().get("matlab").copied().unwrap_or(0)
}

/// A client of the same API server that pauses after each read of the ledger ConfigMap
/// `namespace/LEDGER`, before the check gets it. Two instances with different pauses get out of
/// step, so one writes from a version the other has already replaced.
fn dawdling(client: Client, namespace: &str, pause: Duration) -> Client {
    let ledger = format!("/api/v1/namespaces/{namespace}/configmaps/{LEDGER}");
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let client = client.clone();
        let reads_the_ledger = req.method() == http::Method::GET && req.uri().path() == ledger;
        async move {
            let response = client.send(req).await?;
            if reads_the_ledger {
                tokio::time::sleep(pause).await;
            }
            Ok::<_, kube::Error>(response)
        }
    });
    Client::new(service, "default")
}

#[tokio::test]
async fn ready_holds_licenses_and_the_next_waits_with_backoff_until_they_are_released() -> Result<()>
{
    let (t, _controller) = setup_running("license-hold", &[("matlab", "1")]).await?;
    let a = t.submit("job-a", "matlab=1").await?;
    let entry = t.entry(&t.env.wait_admitted(&a).await?);
    assert_eq!(entry.state, CheckState::Ready);
    let holds = "holds matlab=1 until the workload finishes or is evicted";
    assert_eq!(entry.message, holds);
    t.env.wait_job_unsuspended("job-a").await?;
    let ledger = t.ledger().await?;
    assert_eq!(holders(&ledger), vec![a.clone()]);
    let keyed_by_uid = ledger.holding(&t.uid(&a).await?).is_some();
    assert!(keyed_by_uid, "keyed by uid: {ledger:#?}");

    // The second Workload finds the license taken: Retry, and Kueue counts the attempts; the
    // policy's delay grows with them.
    let b = t.submit("job-b", "matlab=1").await?;
    let (waiting, entry) = t.retry_on_second_attempt(&b).await?;
    let ns = &t.env.ns;
    let taken = format!("waiting for licenses: matlab: needs 1, 0 of 1 free, held by {ns}/{a} (1)");
    assert_starts_with(&entry.message, &taken);
    assert_eq!(entry.retry_count, Some(1), "{}", e2e::dump(&waiting));
    // Attempt 2 waits 2 s (the SDK rounds the dropped sub-second part up).
    let delay = entry.requeue_after_seconds;
    assert!(matches!(delay, Some(2 | 3)), "{}", e2e::dump(&waiting));
    assert!(!waiting.condition_is_true(cond::ADMITTED));
    assert_eq!(holders(&t.ledger().await?), vec![a.clone()]);

    // The first job ends: its license goes back, and the second gets it on its next attempt.
    t.finish("job-a", &a).await?;
    t.env.wait_admitted(&b).await?;
    t.assert_sole_holder(&b).await?;
    Ok(())
}

/// With nobody waiting (so no sweep runs), only the runtime's release hook can free licenses:
/// a finished Workload and a deactivated (evicted) one give theirs back.
#[tokio::test]
async fn finishing_or_evicting_gives_the_licenses_back() -> Result<()> {
    let (t, _controller) = setup_running("license-release", &[("matlab", "2")]).await?;
    let a = t.submit("job-a", "matlab=1").await?;
    let b = t.submit("job-b", "matlab=1").await?;
    t.wait_all_admitted(&[&a, &b]).await?;
    assert_eq!(holders(&t.ledger().await?), vec![a.clone(), b.clone()]);

    t.finish("job-a", &a).await?;
    t.wait_ledger("A released after it finished", |l| {
        holders(l) == [b.clone()]
    })
    .await?;

    t.env.set_workload_active(&b, false).await?;
    t.env
        .wait_workload(&b, "evicted", |wl| wl.condition_is_true(cond::EVICTED))
        .await?;
    t.wait_ledger("B released after its eviction", |l| l.holdings().is_empty())
        .await?;
    Ok(())
}

/// A Workload deleted while it holds licenses (`kubectl delete workload`): its holding goes,
/// and the Workload Kueue creates again for the still-existing Job gets a holding of its own;
/// at no point do both hold.
#[tokio::test]
async fn a_deleted_workload_gives_its_licenses_back_and_its_successor_books_its_own() -> Result<()>
{
    let (t, _controller) = setup_running("license-deleted", &[("matlab", "1")]).await?;
    let wl = t.submit("job", "matlab=1").await?;
    let first = t.env.wait_admitted(&wl).await?;
    let first_uid = first.uid().unwrap_or_default();
    ensure!(t.ledger().await?.holding(&first_uid).is_some());

    t.env.delete_workload(&wl).await?;
    // Kueue makes a new Workload for the Job (same name, another uid); with a pool of one it is
    // admitted only once the deleted one's licenses are back.
    let second = t.successor_admitted(&wl, &first_uid).await?;
    let second_uid = second.uid().unwrap_or_default();
    let ledger = t.ledger().await?;
    ensure!(
        ledger.holding(&first_uid).is_none() && ledger.holding(&second_uid).is_some(),
        "the deleted Workload's holding must be gone and its successor's there: {ledger:#?}"
    );
    ensure!(matlab_in_use(&ledger) == 1, "{ledger:#?}");
    Ok(())
}

#[tokio::test]
async fn requests_the_pool_can_never_satisfy_are_rejected_and_deactivated() -> Result<()> {
    let (t, _controller) = setup_running("license-reject", &[("matlab", "2")]).await?;
    // Kueue deactivates a rejected Workload, then evicts it and resets the entry to Pending
    // ("Previously: Rejected") in a later write: the Rejected entry is only in the history.
    let mut recorder = t.env.record_workloads().await?;

    for (job, licenses, expected) in [
        (
            "unknown",
            "abaqus=1",
            "unknown license feature abaqus; the pool has: matlab",
        ),
        (
            "too-many",
            "matlab=3",
            "asks for more licenses than exist: 3 matlab (the pool has 2)",
        ),
        (
            "malformed",
            "matlab=two",
            "matlab=two: the count must be a whole number from 1",
        ),
    ] {
        let wl = t.submit(job, licenses).await?;
        let message = t.rejected_before_deactivation(&mut recorder, &wl).await?;
        assert!(message.ends_with(expected), "{job}: {message}");
    }
    assert!(t.ledger().await?.holdings().is_empty());
    Ok(())
}

#[tokio::test]
async fn a_missing_or_malformed_pool_keeps_workloads_pending_with_the_reason() -> Result<()> {
    let t = setup("license-pool").await?;
    let _controller = t.start(t.env.client.clone());
    let wl = t.submit("job", "matlab=1").await?;
    let pool = format!("the license pool ConfigMap {}/{POOL}", t.env.ns);
    let missing = format!("{pool} does not exist");
    let what = "Pending: the pool does not exist";
    t.entry_when(&wl, what, |e| e.message == missing).await?;

    t.set_pool(&[("matlab", "-1"), ("ansys", "2")]).await?;
    let invalid = format!(
        "{pool} is invalid: matlab: \"-1\" is not a number of licenses (a whole number from 0)"
    );
    let what = "Pending: the pool is invalid";
    let (pending, entry) = t.entry_when(&wl, what, |e| e.message == invalid).await?;
    assert_eq!(entry.state, CheckState::Pending);
    assert!(pending.condition_is_true(cond::QUOTA_RESERVED));

    t.set_pool(&[("matlab", "1"), ("ansys", "2")]).await?;
    t.env.wait_admitted(&wl).await?;
    Ok(())
}

/// The controller dies while a Workload holds the only license; that Workload is deleted
/// while nothing runs, so no release can happen. The next instance reclaims the license from
/// the ledger (no leak) and grants it to exactly one of the two Workloads waiting for it (no
/// double booking).
#[tokio::test]
async fn a_restart_neither_leaks_nor_double_books() -> Result<()> {
    let t = setup("license-restart").await?;
    t.set_pool(&[("matlab", "1")]).await?;
    let first = Crashable::start(t.env.client.clone(), |client| t.start(client));

    let a = t.submit("job-a", "matlab=1").await?;
    t.env.wait_admitted(&a).await?;
    let a_uid = t.uid(&a).await?;
    let b = t.submit("job-b", "matlab=1").await?;
    t.told_the_license_is_taken(&b).await?;

    // Crash: the task is aborted and its connection cut.
    first.crash().await;

    // While nothing runs: A's Job and Workload go away, and a third Workload asks too.
    t.finish("job-a", &a).await?;
    t.env.delete_workload(&a).await?;
    let c = t.submit("job-c", "matlab=1").await?;
    t.env.wait_check_pending_with_quota(&c, &t.q.check).await?;
    let ledger = t.ledger().await?;
    let kept = "nobody may have released A's license while no controller ran";
    ensure!(ledger.holding(&a_uid).is_some(), "{kept}: {ledger:#?}");

    let _second = t.start(t.env.client.clone());
    let winner = t.only_holder_after_reclaiming(&a_uid).await?;
    ensure!(winner == b || winner == c, "holder {winner}");
    let loser = if winner == b { c } else { b };
    t.env.wait_admitted(&winner).await?;
    // The other keeps asking (it goes through more attempts) and never gets in.
    t.told_to_retry_again(&loser).await?;
    assert_eq!(t.admitted().await?, vec![winner.clone()]);
    t.assert_sole_holder(&winner).await?;
    Ok(())
}

/// Two instances answering the same check at once (two replicas without leader election),
/// each pausing differently between reading and writing the ledger, and nine Workloads asking
/// for a pool of three: never more than three admitted, and the ledger
/// names exactly those.
#[tokio::test]
async fn two_instances_deciding_at_once_never_exceed_the_pool() -> Result<()> {
    let t = setup("license-race").await?;
    t.set_pool(&[("matlab", "3")]).await?;
    // An existing (empty) ledger: the grants race on updates, not on who creates it first.
    assert_eq!(t.save_empty_ledger().await?, Saved::Written);
    let _one = t.start_dawdling(Duration::from_millis(400));
    let _two = t.start_dawdling(Duration::from_millis(30));
    // All at once, so that Kueue reserves quota for them in one burst.
    let jobs: Vec<String> = (0..9).map(|i| format!("job-{i}")).collect();
    let submit = futures::future::try_join_all(jobs.iter().map(|job| t.submit(job, "matlab=1")));
    t.record_race(3, submit, |ledger| {
        let in_use = matlab_in_use(ledger);
        ensure!(
            in_use <= 3,
            "books {in_use} matlab licenses of 3: {ledger:#?}"
        );
        Ok(())
    })
    .await
}

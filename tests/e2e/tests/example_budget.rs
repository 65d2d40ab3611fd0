//! The budget-check example against the real Kueue: its controller runs in this process, one
//! instance per test, answering only that test's AdmissionCheck. Budgets and ledgers live in the
//! test's namespace, which is also the namespace being budgeted.

mod example_common;

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use budget_check::ledger::{BudgetLedger, Charge};
use budget_check::money::Credits;
use budget_check::window::{Period, Window};
use budget_check::{BudgetCheck, ConfigMapBackend, Settings};
use e2e::{GuardedQueue, SuspendedJob, TestEnv};
use example_common::{Crashable, ExampleTest, LedgerFormat, assert_starts_with};
use k8s_openapi::jiff::Timestamp;
use kube::{Client, ResourceExt};
use kueue_admission_sdk::RuntimeConfig;
use kueue_admission_sdk::api::{
    AdmissionCheck, AdmissionCheckState, CheckState, Workload, workload_condition as cond,
};
use kueue_admission_sdk::shadow::ShadowScope;

const BUDGETS: &str = budget_check::DEFAULT_BUDGETS_CONFIGMAP;

/// One test's queue, check and the ConfigMaps its controller uses.
type Budgeted = ExampleTest<ConfigMapBackend, BudgetLedger>;

/// One ledger per namespace; a Workload is in it while its charge is open.
const LEDGER_FORMAT: LedgerFormat<ConfigMapBackend, BudgetLedger> = LedgerFormat {
    configmap: |backend, ns| backend.ledger_of(ns).name,
    parse: BudgetLedger::from_config_map_data,
    holders: BudgetLedger::charged_workloads,
};

/// The budgets and the ledgers in the test's namespace, which is also the one budgeted.
fn backend(ns: &str) -> ConfigMapBackend {
    ConfigMapBackend {
        namespace: ns.into(),
        budgets: BUDGETS.into(),
        ledger_prefix: budget_check::DEFAULT_LEDGER_PREFIX.into(),
    }
}

/// A test's namespace and queue guarded by the budget check, with no budget and no controller.
async fn setup(test: &str) -> Result<Budgeted> {
    ExampleTest::new(test, "budget", "budget", backend, LEDGER_FORMAT).await
}

/// [`setup`] with a budget for the test's namespace and a controller started.
async fn setup_running(test: &str, budget: &str) -> Result<(Budgeted, e2e::Running)> {
    let t = setup(test).await?;
    t.set_budget(budget).await?;
    let controller = t.start(t.env.client.clone());
    Ok((t, controller))
}

/// An amount of credits written as the budgets ConfigMap writes it.
fn credits(s: &str) -> Credits {
    s.parse().unwrap_or_else(|e| panic!("{e}"))
}

impl Budgeted {
    /// Starts a controller instance on `client`: 1 credit per core-hour, one hour by default,
    /// a ledger sweep at start (and not again during the test).
    fn start(&self, client: Client) -> e2e::Running {
        let quiet = RuntimeConfig {
            metrics_address: None,
            health_address: None,
            ..Default::default()
        };
        self.start_with(client, quiet)
    }

    /// [`Budgeted::start`] with `base`'s metrics address and shadow mode.
    fn start_with(&self, client: Client, base: RuntimeConfig) -> e2e::Running {
        let settings = Settings {
            controller_name: self.q.controller_name.clone(),
            prices: "cpu=1".parse().unwrap_or_default(),
            default_runtime: Duration::from_secs(3600),
            budget_recheck: Duration::from_secs(1),
            max_wait: None,
            sweep_interval: Duration::from_secs(3600),
        };
        let runtime = RuntimeConfig {
            metrics_address: base.metrics_address,
            health_address: base.health_address,
            shadow: base.shadow,
            ..self.env.runtime_config()
        };
        e2e::Running::check(
            client,
            BudgetCheck::new(settings, self.backend.clone()),
            runtime,
        )
    }

    /// Sets (creates or replaces) the budgets ConfigMap.
    async fn set_budgets(&self, data: &[(&str, &str)]) -> Result<()> {
        self.env.put_config_map(BUDGETS, data).await?;
        Ok(())
    }

    /// Gives the test's namespace this budget.
    async fn set_budget(&self, budget: &str) -> Result<()> {
        self.set_budgets(&[(&self.env.ns, budget)]).await
    }

    /// Submits a suspended Job of one pod requesting `cpu` cores, limited to `max_seconds` if
    /// given (Kueue copies the label into `maximumExecutionTimeSeconds`); returns its Workload.
    async fn submit(&self, job: &str, cpu: &str, max_seconds: Option<u32>) -> Result<String> {
        let max_seconds = max_seconds.map(|s| s.to_string());
        let labels: Vec<(&str, &str)> = max_seconds
            .iter()
            .map(|s| ("kueue.x-k8s.io/max-exec-time-seconds", s.as_str()))
            .collect();
        let job = self
            .env
            .create_job(&SuspendedJob {
                labels: &labels,
                ..SuspendedJob::new(job, "lq", cpu)
            })
            .await?;
        Ok(self.env.workload_for_job(&job).await?.name_any())
    }

    /// Ends the Job as its pods would: Kueue marks its Workload `Finished`. Waits for that.
    async fn finish(&self, job: &str, workload: &str) -> Result<Workload> {
        self.env.complete_job(job, workload).await
    }
}

/// The day (the budget's window) that holds now.
fn today() -> Window {
    Window::containing(Period::Day, Timestamp::now())
}

/// A test whose check is in shadow mode for its ClusterQueue, with `budget`: the queue does
/// not list the check (in shadow mode nothing may wait on it), and its controller runs with
/// `--shadow` for that queue and serves its metrics. Returns the test, the ClusterQueue, where
/// the metrics are served and the running controller.
async fn shadowed(
    test: &str,
    budget: &str,
) -> Result<(Budgeted, String, SocketAddr, e2e::Running)> {
    let env = TestEnv::new(test).await?;
    let backend = backend(&env.ns);
    let controller_name = env.own_controller_name("budget");
    let flavor = env.resource_flavor("default").await?.name_any();
    let check = env
        .admission_check("budget", &controller_name)
        .await?
        .name_any();
    // The queue does not list the check: in shadow mode nothing may wait on it.
    let cq = env.queues_on(&flavor, "20", &[]).await?;
    let q = GuardedQueue {
        flavor,
        check,
        controller_name,
        cluster_queue: cq.clone(),
    };
    let t = ExampleTest {
        env,
        q,
        backend,
        ledger_format: LEDGER_FORMAT,
    };
    t.set_budget(budget).await?;
    let http = e2e::free_local_address()?;
    let controller = t.start_with(
        t.env.client.clone(),
        RuntimeConfig {
            metrics_address: Some(http),
            health_address: Some(http),
            shadow: Some(ShadowScope::of(vec![cq.clone()])),
            ..Default::default()
        },
    );
    Ok((t, cq, http, controller))
}

/// The series counting what a shadowed check would have answered `state`.
fn shadow_series(check: &str, state: &str) -> String {
    format!("kueue_ac_shadow_decisions_total{{check=\"{check}\",state=\"{state}\"}}")
}

/// A scrape of a shadowed check's metrics, once its counts have settled.
struct ShadowMetrics {
    check: String,
    text: String,
}

impl ShadowMetrics {
    /// Scrapes the metrics at `http` until the shadowed check has counted 2 would-be
    /// `Rejected` and 1 would-be `Retry`; keeps that exposition.
    async fn settled(http: SocketAddr, check: &str) -> Result<Self> {
        let series = |state| shadow_series(check, state);
        let mut text = e2e::wait_metric(http, &series("Rejected"), 2.0).await?;
        if e2e::metric_sample(&text, &series("Retry")) != Some(1.0) {
            text = e2e::wait_metric(http, &series("Retry"), 1.0).await?;
        }
        Ok(Self {
            check: check.into(),
            text,
        })
    }

    /// How many times the check would have answered `state`.
    fn shadow(&self, state: &str) -> Option<f64> {
        e2e::metric_sample(&self.text, &shadow_series(&self.check, state))
    }

    /// How many times the check answered `state` on a Workload (enforcing).
    fn enforced(&self, state: &str) -> Option<f64> {
        let check = &self.check;
        let series = format!("kueue_ac_decisions_total{{check=\"{check}\",state=\"{state}\"}}");
        e2e::metric_sample(&self.text, &series)
    }
}

impl std::fmt::Display for ShadowMetrics {
    /// The whole exposition, for a failure message.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// When the check decided (its entry's lastTransitionTime), the day that holds that moment,
/// the seconds from then to the day's end, and the `requeueAfterSeconds` it asked for.
fn decided_in(entry: &AdmissionCheckState) -> Result<(Window, i64, i64)> {
    let decided = entry
        .last_transition_time
        .as_ref()
        .map(|t| t.0)
        .ok_or_else(|| anyhow::anyhow!("no lastTransitionTime"))?;
    let window = Window::containing(Period::Day, decided);
    let until_reset = window.end().as_second() - decided.as_second();
    let delay = i64::from(entry.requeue_after_seconds.unwrap_or_default());
    Ok((window, until_reset, delay))
}

/// Seconds from the charge to the Workload's `Finished` (now if it has none).
fn ran_seconds(finished: &Workload, charge: &Charge) -> i64 {
    let finished_at = finished
        .condition(cond::FINISHED)
        .map(|c| c.last_transition_time.0)
        .unwrap_or_else(Timestamp::now);
    finished_at.as_second() - charge.charged_at.0.as_second()
}

impl Budgeted {
    /// The charge open for the Workload with this uid, or an error saying `why` there must be
    /// one.
    async fn open_charge(&self, uid: &str, why: &str) -> Result<Charge> {
        let ledger = self.ledger().await?;
        ledger
            .open_charge(uid)
            .cloned()
            .with_context(|| format!("{why}: {ledger:#?}"))
    }

    /// Waits until the ledger's open charges are exactly those of `charged`; returns what it
    /// says the namespace spent today then.
    async fn spent_once_charged(&self, what: &str, charged: &[&String]) -> Result<Credits> {
        let ledger = self
            .wait_ledger(what, |l| {
                l.charged_workloads().iter().eq(charged.iter().copied())
            })
            .await?;
        Ok(ledger.spent(&today()))
    }

    /// Waits until the check answers the Workload `Retry` and Kueue has set its `requeueAt`;
    /// returns the Workload and the entry.
    async fn retried_with_requeue_at(
        &self,
        workload: &str,
    ) -> Result<(Workload, AdmissionCheckState)> {
        let waiting = self
            .env
            .wait_workload(workload, "Retry, and Kueue's requeueAt set", |wl| {
                self.entry(wl).state == CheckState::Retry && wl.requeue_at().is_some()
            })
            .await?;
        let entry = self.entry(&waiting);
        Ok((waiting, entry))
    }

    /// What the spending today comes to besides the one open charge.
    fn spent_besides_the_open_charge(ledger: &BudgetLedger) -> Result<Credits> {
        let charge = ledger
            .open_charges()
            .values()
            .next()
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("no open charge"))?;
        Ok(ledger.spent(&today()).saturating_sub(charge.cost))
    }

    /// The message the check says in shadow mode (its `Active=False`, reason `ShadowMode`).
    async fn shadow_mode_message(&self) -> Result<String> {
        let active = self
            .env
            .wait_active::<AdmissionCheck>(&self.q.check, "False", Some("ShadowMode"))
            .await?;
        Ok(active.message)
    }

    /// Asserts that the shadowed check's `WouldAnswer` Event on the Workload says it "would
    /// have answered" `answer`.
    async fn assert_would_answer(&self, workload: &str, answer: &str) -> Result<()> {
        let note = self.env.event_note(workload, "WouldAnswer").await?;
        let words = format!("would have answered {answer}");
        assert!(note.contains(&words), "{note}");
        Ok(())
    }

    /// Asserts that nothing of the check is on the Workloads: no entry, no attempt record, no
    /// field of its field manager (every write would have left it in managedFields).
    async fn assert_nothing_written(&self, workloads: &[&String]) -> Result<()> {
        let ours = format!("e2e-{}", self.env.ns);
        for wl in workloads {
            let wl = self.env.workloads().get(wl).await?;
            assert!(
                wl.admission_check(&self.q.check).is_none(),
                "{}",
                e2e::dump(&wl)
            );
            assert!(
                !wl.annotations()
                    .keys()
                    .any(|k| k.contains("kueue-admission-checks.dev")),
                "{}",
                e2e::dump(&wl)
            );
            let managers: Vec<String> = wl
                .managed_fields()
                .iter()
                .filter_map(|m| m.manager.clone())
                .collect();
            assert!(
                !managers.iter().any(|m| m.starts_with(&ours)),
                "written by {managers:?}"
            );
        }
        Ok(())
    }
}

#[tokio::test]
async fn a_fitting_workload_is_admitted_and_charged_its_estimate() -> Result<()> {
    let (t, _controller) = setup_running("budget-fits", "10/day").await?;

    let wl = t.submit("job", "2", Some(1800)).await?;
    let admitted = t.env.wait_admitted(&wl).await?;
    t.env.wait_job_unsuspended("job").await?;
    assert_eq!(admitted.spec.maximum_execution_time_seconds, Some(1800));
    let entry = t.entry(&admitted);
    assert_eq!(entry.state, CheckState::Ready);
    let (midnight, ns) = (budget_check::window::format_time(today().end()), &t.env.ns);
    assert_eq!(
        entry.message,
        format!(
            "charged 1 credits (2 cpu for 30m); namespace {ns} has spent 1 of 10 credits this day, until {midnight}"
        )
    );
    let charge = t
        .open_charge(&t.uid(&wl).await?, "no charge for the uid")
        .await?;
    assert_eq!(
        (charge.cost, charge.runtime_seconds, charge.check),
        (credits("1"), 1800, t.q.check.clone())
    );
    assert_eq!(t.ledger().await?.spent(&today()), credits("1"));
    Ok(())
}

#[tokio::test]
async fn over_budget_retries_with_the_delay_until_the_window_resets() -> Result<()> {
    let (t, _controller) = setup_running("budget-exceeds", "3/day").await?;
    let a = t.submit("job-a", "2", None).await?;
    t.env.wait_admitted(&a).await?;

    let b = t.submit("job-b", "2", None).await?;
    let (waiting, entry) = t.retried_with_requeue_at(&b).await?;
    let (window, until_reset, delay) = decided_in(&entry)?;
    ensure!(
        (until_reset..=until_reset + 1).contains(&delay),
        "requeueAfterSeconds {delay}, {until_reset} s to the reset\n{}",
        e2e::dump(&waiting)
    );
    let (midnight, ns) = (budget_check::window::format_time(window.end()), &t.env.ns);
    assert_starts_with(
        &entry.message,
        &format!(
            "the estimated cost of 2 credits (2 cpu for 1h) would take namespace {ns} over its budget: 2 of 3 credits spent this day; the budget starts again at {midnight} (attempt 1; next attempt not before {midnight})"
        ),
    );
    // Kueue holds the quota through a delayed Retry (docs/kueue-behaviour.md), until the reset.
    let requeue_at = waiting.requeue_at().map(|t| t.as_second());
    let reset = Some(window.end().as_second());
    assert_eq!(requeue_at, reset, "{}", e2e::dump(&waiting));
    assert!(waiting.condition_is_true(cond::QUOTA_RESERVED));
    assert!(!waiting.condition_is_true(cond::ADMITTED));
    assert_eq!(t.ledger().await?.charged_workloads(), vec![a]);
    Ok(())
}

#[tokio::test]
async fn a_workload_costlier_than_the_whole_budget_is_rejected_and_deactivated() -> Result<()> {
    let (t, _controller) = setup_running("budget-never", "3/week").await?;
    // The Rejected entry is reset to Pending by the eviction after the deactivation: recorded.
    let mut recorder = t.env.record_workloads().await?;
    let wl = t.submit("job", "4", None).await?;
    let rejected = t.rejected_before_deactivation(&mut recorder, &wl).await?;
    assert_eq!(
        rejected,
        format!(
            "the estimated cost of 4 credits (4 cpu for 1h) is more than the whole budget of namespace {}: 3 credits per week",
            t.env.ns
        )
    );
    assert!(t.ledger().await?.open_charges().is_empty());
    Ok(())
}

/// With nobody waiting (so no sweep runs), only the runtime's release hook can settle charges:
/// a finished Workload and a deactivated (evicted) one give back what they did not use, and the
/// budget they free admits the next.
#[tokio::test]
async fn finishing_or_evicting_gives_back_what_was_not_used() -> Result<()> {
    let (t, _controller) = setup_running("budget-refund", "5/day").await?;
    let a = t.submit("job-a", "2", None).await?;
    let b = t.submit("job-b", "2", None).await?;
    t.wait_all_admitted(&[&a, &b]).await?;
    assert_eq!(t.ledger().await?.spent(&today()), credits("4"));

    t.finish("job-a", &a).await?;
    let spent = t
        .spent_once_charged("A settled after it finished", &[&b])
        .await?;
    // A ran seconds of its hour (Kueue's whole-second Finished time may even make it none):
    // 2 cores for a minute would be 0.034.
    let (at_least, below) = (credits("2"), credits("2.034"));
    ensure!(spent >= at_least && spent < below, "spent {spent}");

    t.env.set_workload_active(&b, false).await?;
    let spent = t
        .spent_once_charged("B settled after its eviction", &[])
        .await?;
    ensure!(spent < credits("0.067"), "spent {spent}");

    // 4 credits would not have fitted without the refunds.
    let c = t.submit("job-c", "4", None).await?;
    t.env.wait_admitted(&c).await?;
    Ok(())
}

#[tokio::test]
async fn a_missing_or_malformed_budget_keeps_workloads_pending_with_the_reason() -> Result<()> {
    let t = setup("budget-config").await?;
    let _controller = t.start(t.env.client.clone());
    let wl = t.submit("job", "1", None).await?;
    let ns = t.env.ns.clone();
    let where_ = format!("the budgets ConfigMap {ns}/{BUDGETS}");
    for (budgets, expected) in [
        (None, format!("{where_} does not exist")),
        (
            Some(vec![("other-team", "5/day")]),
            format!("namespace {ns} has no budget: {where_} has no key {ns:?}"),
        ),
        (
            Some(vec![(ns.as_str(), "ten/day")]),
            format!(
                "the budget of namespace {ns} in {where_} is invalid: \"ten\" is not an amount of credits (e.g. 500 or 12.5, at most 3 decimals)"
            ),
        ),
    ] {
        if let Some(data) = budgets {
            t.set_budgets(&data).await?;
        }
        let what = format!("Pending: {expected}");
        let (_, entry) = t.entry_when(&wl, &what, |e| e.message == expected).await?;
        assert_eq!(entry.state, CheckState::Pending);
    }
    t.set_budgets(&[(ns.as_str(), "10/week")]).await?;
    t.env.wait_admitted(&wl).await?;
    Ok(())
}

/// The controller dies while a Workload is charged; the Workload finishes while nothing runs,
/// so no release can happen. The next instance settles the charge as of when the Workload
/// finished (not when it noticed), and the refund admits the Workload that waited.
#[tokio::test]
async fn a_restart_settles_what_finished_while_no_controller_ran() -> Result<()> {
    let t = setup("budget-restart").await?;
    t.set_budget("3/day").await?;
    let first = Crashable::start(t.env.client.clone(), |client| t.start(client));
    let a = t.submit("job-a", "2", None).await?;
    t.env.wait_admitted(&a).await?;
    let a_uid = t.uid(&a).await?;

    first.crash().await;

    let finished = t.finish("job-a", &a).await?;
    let b = t.submit("job-b", "2", None).await?;
    t.env.wait_check_pending_with_quota(&b, &t.q.check).await?;
    let unsettled = "nobody may have settled A while no controller ran";
    let a_charge = t.open_charge(&a_uid, unsettled).await?;
    // Finishing is what counts, not when the next controller notices.
    tokio::time::sleep(Duration::from_secs(5)).await;

    let _second = t.start(t.env.client.clone());
    t.env.wait_admitted(&b).await?;
    let ledger = t.ledger().await?;
    assert_eq!(ledger.charged_workloads(), vec![b]);
    let a_used = Budgeted::spent_besides_the_open_charge(&ledger)?;
    let ran = ran_seconds(&finished, &a_charge);
    // 2 cores for `ran` seconds at 1 credit per core-hour, rounded up to a thousandth: a
    // settlement as of the restart would be at least 5 s × 2 cores later (0.0027 more).
    let expected_max = Credits::from_milli(u64::try_from((ran + 1) * 2000 / 3600 + 1)?);
    ensure!(
        a_used <= expected_max,
        "A used {a_used} for ~{ran} s, more than {expected_max}: {ledger:#?}"
    );
    Ok(())
}

/// Nine Workloads of 1 credit each, submitted at once against a budget of 3 and decided by two
/// controller instances at the same time, against the real Kueue. Two recorders (every
/// Workload version, every ledger version) check that the ledger never spends more than the
/// budget, that never more than 3 are admitted at once, and that a newly admitted Workload's
/// charge is already in the ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_workloads_at_once_never_overspend_at_any_version() -> Result<()> {
    let t = setup("budget-race").await?;
    t.set_budget("3/day").await?;
    let _one = t.start(t.env.client.clone());
    let _two = t.start(t.env.client.clone());
    let jobs: Vec<String> = (0..9).map(|i| format!("job-{i}")).collect();
    let submit = futures::future::try_join_all(jobs.iter().map(|job| t.submit(job, "1", None)));
    let budget = credits("3");
    t.record_race(3, submit, |ledger| {
        let spent = ledger.spent(&today());
        ensure!(
            spent <= budget,
            "spends {spent} of a budget of {budget}: {ledger:#?}"
        );
        Ok(())
    })
    .await
}

/// Shadow mode, as a platform team rolls a budget out: the controller decides every Workload
/// holding quota on the queue and publishes what it would have answered, but the queue does not
/// wait on the check, so every Workload is admitted, the check's would-be refusals are counted
/// (by state, once each), its bookkeeping shows what enforcing would have charged, and nothing
/// is written on any Workload.
#[tokio::test]
async fn a_shadowed_budget_admits_everything_and_counts_what_it_would_have_refused() -> Result<()> {
    let (t, cq, http, _controller) = shadowed("budget-shadow", "3/week").await?;
    // The check says it is in shadow mode, and that no queue may wait on it.
    let message = t.shadow_mode_message().await?;
    let names_the_queue = message.contains(&format!("ClusterQueues {cq}"));
    assert!(names_the_queue && message.contains("--shadow"), "{message}");

    // 2 credits fit the budget of 3; then 2 more do not (Retry until the week ends); 4 never do.
    let fits = t.submit("fits", "2", None).await?;
    t.env.wait_admitted(&fits).await?;
    t.assert_would_answer(&fits, "Ready: charged 2 credits")
        .await?;
    let over = t.submit("over", "2", None).await?;
    let huge_1 = t.submit("huge-1", "4", None).await?;
    let huge_2 = t.submit("huge-2", "4", None).await?;
    t.wait_all_admitted(&[&over, &huge_1, &huge_2]).await?;
    let m = ShadowMetrics::settled(http, &t.q.check).await?;
    assert_eq!(m.shadow("Ready"), Some(1.0), "{m}");
    assert_eq!(m.shadow("Pending"), Some(0.0), "{m}");
    // Nothing was written: the enforcing metric never moved.
    assert_eq!(m.enforced("Rejected"), Some(0.0), "{m}");
    t.assert_would_answer(&over, "Retry").await?;
    for wl in [&huge_1, &huge_2] {
        t.assert_would_answer(wl, "Rejected").await?;
    }
    // Only the Workload it would have admitted is charged, as enforcing would have.
    assert_eq!(t.ledger().await?.charged_workloads(), vec![fits.clone()]);
    // No entry, no attempt record, no field of ours on any Workload.
    let all = [&fits, &over, &huge_1, &huge_2];
    t.assert_nothing_written(&all).await?;
    // Finishing the charged Workload settles its charge through the release, as enforcing.
    t.finish("fits", &fits).await?;
    t.spent_once_charged("the charge settled", &[]).await?;
    Ok(())
}

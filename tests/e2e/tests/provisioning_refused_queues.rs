//! A provisioning controller whose ClusterRole lacks `list` and `watch` on ClusterQueues (an
//! operator's own role, written before the early start needed them), under the API server's
//! real RBAC and the real Kueue: it becomes ready, answers every check once Kueue adds the
//! entry, shows on `kueue_ac_cluster_queues_known` that it cannot start early, and starts early
//! again once the verbs are granted, without a restart (issue 32, item 1).

use anyhow::{Context, Result, ensure};
use e2e::chart::{self, Grant, PROVISIONING_CHART};
use e2e::entry_hold::EntryHold;
use e2e::{Running, TestEnv};
use kueue_admission_sdk::api::workload_condition as cond;
use serde_json::{Value, json};

const FIELD_MANAGER: &str = "e2e-refused-queues";
const KNOWN: &str = "kueue_ac_cluster_queues_known";

/// The story: refused, the controller is ready, starts nothing while Kueue's entry is held
/// back, and admits through the check once it comes; granted, it asks for capacity before the
/// entry again.
#[tokio::test]
async fn a_refused_cluster_queue_watch_costs_only_the_early_start() -> Result<()> {
    let env = TestEnv::new("refused-queues").await?;
    let p = env.provisioning(json!({}), "4").await?;
    let rbac = ChartRbac::without_cluster_queues(&env).await?;
    let audit = e2e::audit_log_mark()?;
    let controller = env.start_provisioning_controller_as(rbac.client.clone(), None)?;
    let _simulator = env.start_simulator()?;

    ready_while_refused(&controller, &audit, &rbac.user).await?;

    let first = reserved_without_entry(&env, &p.check, "first").await?;
    looked_at(&env, &controller, &first.workload).await?;
    let first = first.lift(&env).await?;
    env.wait_admitted_ready(&first, &p.check).await?;
    let early = early_starts(&controller, &p.check).await?;
    ensure!(
        early == 0.0,
        "{early} early starts while the queues are refused"
    );

    rbac.grant_everything(&env).await?;
    e2e::wait_metric(controller.addr()?, KNOWN, 1.0).await?;
    let second = reserved_without_entry(&env, &p.check, "second").await?;
    let request = format!("{}-{}-1", second.workload, p.check);
    env.wait_request(&request, "Provisioned").await?;
    ensure!(
        early_starts(&controller, &p.check).await? == 1.0,
        "no early start counted"
    );
    let second = second.lift(&env).await?;
    env.wait_admitted_ready(&second, &p.check).await?;
    controller.stop().await
}

/// A Job's Workload holding quota while Kueue's write of the check's entry is held back.
struct Held {
    workload: String,
    hold: EntryHold,
}

/// Holds back `check`'s entry, submits Job `name` and waits until its Workload holds quota.
async fn reserved_without_entry(env: &TestEnv, check: &str, name: &str) -> Result<Held> {
    let hold = EntryHold::new(env, check).await?;
    let workload = env.job_with_script(name, "provision").await?;
    env.wait_workload(&workload, "QuotaReserved", |w| {
        w.condition_is_true(cond::QUOTA_RESERVED)
    })
    .await?;
    Ok(Held { workload, hold })
}

impl Held {
    /// Lifts the hold and touches the Workload, so that Kueue adds the entry now rather than
    /// after its backoff; returns the Workload's name.
    async fn lift(self, env: &TestEnv) -> Result<String> {
        self.hold.lift().await?;
        env.touch_workload(&self.workload, "lifted").await?;
        Ok(self.workload)
    }
}

/// The chart's RBAC for this test's controller, applied without the ClusterQueue rule.
struct ChartRbac {
    objects: Vec<Value>,
    client: kube::Client,
    /// The ServiceAccount, as the audit log names it.
    user: String,
}

impl ChartRbac {
    /// Renders the chart for the test's controllerName and applies its RBAC with the
    /// ClusterRole's `clusterqueues` rule taken out; waits until the authorizer agrees.
    async fn without_cluster_queues(env: &TestEnv) -> Result<Self> {
        let set = format!("controllerName={}", env.provisioning_controller_name());
        let objects = chart::render(
            PROVISIONING_CHART,
            &env.ns,
            &env.ns,
            &["--set-string", &set],
        )?;
        let mut refused = objects.clone();
        let role = &mut refused[chart::controller_role_index(&objects, "ClusterRole")?];
        let rules = role["rules"].as_array_mut().context("rules")?;
        let before = rules.len();
        rules.retain(|r| r["resources"] != json!(["clusterqueues"]));
        ensure!(
            rules.len() + 1 == before,
            "the chart has no rule of its own for clusterqueues"
        );
        let denied =
            ["list", "watch"].map(|v| Grant::cluster("kueue.x-k8s.io", "clusterqueues", v));
        let (service_account, _) =
            chart::apply_rbac(&env.client, &env.ns, &refused, FIELD_MANAGER, &denied).await?;
        Ok(Self {
            objects,
            client: e2e::service_account_client(&env.ns, &service_account).await?,
            user: format!("system:serviceaccount:{}:{service_account}", env.ns),
        })
    }

    /// Applies the chart's RBAC as rendered: the ClusterQueue rule is granted.
    async fn grant_everything(&self, env: &TestEnv) -> Result<()> {
        chart::apply_rbac(&env.client, &env.ns, &self.objects, FIELD_MANAGER, &[]).await?;
        Ok(())
    }
}

/// The controller is ready, the API server has refused it ClusterQueues, and its gauge says
/// they are not known.
async fn ready_while_refused(
    controller: &Running,
    audit: &e2e::AuditMark,
    user: &str,
) -> Result<()> {
    controller.wait_ready().await?;
    wait_refused(audit, user).await?;
    ensure!(gauge(controller).await? == Some(0.0), "{KNOWN} is not 0");
    Ok(())
}

/// Waits until the audit log shows the API server refusing `user` a list or watch of
/// ClusterQueues: the cause of what follows, not a slow start.
async fn wait_refused(mark: &e2e::AuditMark, user: &str) -> Result<()> {
    e2e::eventually_async("a 403 for clusterqueues in the audit log", || async {
        let forbidden = e2e::forbidden_since(mark, user)?;
        Ok(forbidden.iter().any(|f| f.resource == "clusterqueues"))
    })
    .await
}

/// Touches the Workload and waits until the controller has finished a reconcile since: it has
/// looked at the Workload as it holds quota without the entry.
async fn looked_at(env: &TestEnv, controller: &Running, workload: &str) -> Result<()> {
    let ok = "kueue_ac_reconcile_duration_seconds_count{result=\"ok\"}";
    let before = controller.metric(ok).await?.unwrap_or_default();
    env.touch_workload(workload, "while-refused").await?;
    e2e::wait_metric_where(controller.addr()?, ok, &format!("> {before}"), |v| {
        v > before
    })
    .await?;
    Ok(())
}

async fn gauge(controller: &Running) -> Result<Option<f64>> {
    controller.metric(KNOWN).await
}

async fn early_starts(controller: &Running, check: &str) -> Result<f64> {
    let series = format!("kueue_ac_early_starts_total{{check=\"{check}\"}}");
    Ok(controller.metric(&series).await?.unwrap_or_default())
}

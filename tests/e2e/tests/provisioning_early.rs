//! The provisioning check asks for capacity when Kueue reserves quota, before Kueue adds its
//! entry (`start_early`), against the real Kueue. The window between the two lasts seconds
//! when Kueue is busy and milliseconds here, so each test holds Kueue's write of the entry back
//! with a ValidatingAdmissionPolicy ([`e2e::entry_hold`]) and lifts it when the test says.

use anyhow::{Result, ensure};
use autoscaler_simulator::SCRIPT_ANNOTATION;
use e2e::TestEnv;
use e2e::entry_hold::EntryHold;
use e2e::provisioning::World;
use e2e::running::Running;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kueue_admission_sdk::api::{
    AdmissionCheckStrategyRule, AdmissionChecksStrategy, CheckState, ClusterQueue,
    ClusterQueueSpec, FlavorQuotas, ResourceGroup, ResourceQuota, Workload,
    workload_condition as cond,
};
use serde_json::json;

const EARLY_STARTS: &str = "kueue_ac_early_starts_total";

/// The Workload as read now holds quota without our entry: the window is open.
async fn holds_quota_without_entry(env: &TestEnv, workload: &str, check: &str) -> Result<()> {
    let wl: Workload = env.workloads().get(workload).await?;
    ensure!(
        wl.condition_is_true(cond::QUOTA_RESERVED) && wl.admission_check(check).is_none(),
        "expected quota without the entry of {check}: {}",
        e2e::dump(&wl)
    );
    Ok(())
}

/// The Workload as read now has no entry of `check`.
async fn holds_no_entry(env: &TestEnv, workload: &str, check: &str) -> Result<()> {
    let wl: Workload = env.workloads().get(workload).await?;
    ensure!(wl.admission_check(check).is_none(), "{}", e2e::dump(&wl));
    Ok(())
}

/// Waits until Kueue reserved quota for the Workload.
async fn wait_reserved(env: &TestEnv, workload: &str) -> Result<Workload> {
    e2e::wait_for(
        env.workloads(),
        workload,
        "QuotaReserved",
        |w: &Workload| w.condition_is_true(cond::QUOTA_RESERVED),
    )
    .await
}

/// Lifts the hold and touches the Workload (a label), so that Kueue tries its refused write
/// again now rather than after its backoff, which grows with each refusal.
async fn lift(hold: EntryHold, env: &TestEnv, workload: &str) -> Result<()> {
    hold.lift().await?;
    let patch = json!({"metadata": {"labels": {"e2e.kueue-admission-checks.dev/nudge": "lifted"}}});
    env.workloads()
        .patch(workload, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Submits Job `name` of `pods` pods whose requests the simulator provisions; returns its
/// Workload's name.
async fn provisioned_job(env: &TestEnv, name: &str, pods: i32) -> Result<String> {
    let script = [(SCRIPT_ANNOTATION, "provision")];
    let job = env
        .job_with_pod_annotations(name, "lq", "1", pods, &script)
        .await?;
    Ok(env.workload_for_job(&job).await?.name_any())
}

/// Creates Workload `name` (owned by no Job) whose requests the simulator provisions;
/// returns its name.
async fn provisioned_workload(env: &TestEnv, name: &str) -> Result<String> {
    Ok(env.standalone_workload(name, "provision").await?.name_any())
}

/// Waits until Kueue released the Workload's quota.
async fn wait_released(env: &TestEnv, workload: &str) -> Result<Workload> {
    e2e::wait_for(
        env.workloads(),
        workload,
        "quota released",
        |w: &Workload| !w.condition_is_true(cond::QUOTA_RESERVED),
    )
    .await
}

/// Waits until Kueue evicted the Workload.
async fn wait_evicted(env: &TestEnv, workload: &str) -> Result<Workload> {
    e2e::wait_for(env.workloads(), workload, "evicted", |w: &Workload| {
        w.condition_is_true(cond::EVICTED)
    })
    .await
}

/// Stops the controller under test (if it runs) as SIGTERM would.
async fn stop_controller(t: &mut World) -> Result<()> {
    if let Some(controller) = t.controller.take() {
        controller.stop().await?;
    }
    Ok(())
}

/// Starts a new process of the controller under test.
fn start_controller(t: &mut World) -> Result<()> {
    t.controller = Some(t.env.start_provisioning_controller(None)?);
    Ok(())
}

/// Waits until Kueue reserved quota for the Workload; returns the flavors it assigned.
async fn reserved_on(env: &TestEnv, workload: &str) -> Result<Vec<String>> {
    Ok(assigned_flavors(&wait_reserved(env, workload).await?))
}

/// The controller's count of early starts for `check`, with the metrics it was read from.
async fn early_starts(controller: &Running, check: &str) -> Result<(Option<f64>, String)> {
    let metrics = controller.metrics().await?;
    let series = format!("{EARLY_STARTS}{{check=\"{check}\"}}");
    Ok((e2e::metric_sample(&metrics, &series), metrics))
}

/// The flavors Kueue assigned the Workload's podsets, in order.
fn assigned_flavors(wl: &Workload) -> Vec<String> {
    let admission = wl.status.as_ref().and_then(|s| s.admission.as_ref());
    admission
        .map(|a| {
            a.pod_set_assignments
                .iter()
                .flat_map(|p| p.flavors.values().cloned())
                .collect()
        })
        .unwrap_or_default()
}

/// Our check `prov` (config `prc`) limited to flavor `other`, and a gate of the test's on
/// every flavor (it keeps Workloads holding quota unadmitted), on a ClusterQueue of two
/// flavors of 1 cpu each, `pool` first, fed by LocalQueue `lq`. Returns the check's name and
/// the two flavors'.
async fn check_only_on_the_second_flavor(env: &TestEnv) -> Result<(String, String, String)> {
    let controller_name = env.provisioning_controller_name();
    let config = env.provisioning_config("prc", json!({})).await?;
    let check = env
        .provisioning_check("prov", &controller_name, &config)
        .await?;
    let gate = env
        .admission_check("gate", &env.own_controller_name("gate"))
        .await?
        .name_any();
    env.set_admission_check_active(&gate, true).await?;
    let (pool, other) = (
        env.provisioning_flavor("pool").await?,
        env.provisioning_flavor("other").await?,
    );
    let quota = |flavor: &str| FlavorQuotas {
        name: flavor.into(),
        resources: vec![ResourceQuota {
            name: "cpu".into(),
            nominal_quota: k8s_openapi::apimachinery::pkg::api::resource::Quantity("1".into()),
        }],
    };
    let rule = |name: &str, on: Vec<String>| AdmissionCheckStrategyRule {
        name: name.into(),
        on_flavors: on,
    };
    let spec = ClusterQueueSpec {
        namespace_selector: Some(Default::default()),
        resource_groups: vec![ResourceGroup {
            covered_resources: vec!["cpu".into()],
            flavors: vec![quota(&pool), quota(&other)],
        }],
        admission_checks_strategy: Some(AdmissionChecksStrategy {
            admission_checks: vec![rule(&gate, vec![]), rule(&check, vec![other.clone()])],
        }),
    };
    let cq = Api::<ClusterQueue>::all(env.client.clone())
        .create(
            &Default::default(),
            &ClusterQueue::new(&env.cluster_name("cq"), spec),
        )
        .await?
        .name_any();
    env.local_queue("lq", &cq).await?;
    Ok((check, pool, other))
}

#[tokio::test]
async fn the_request_is_made_at_the_reservation_and_the_entry_is_answered_at_once() -> Result<()> {
    let t = World::new("prov-early", json!({})).await?;
    let (env, p) = (&t.env, &t.p);
    let requests = env.request_history();
    let hold = EntryHold::new(env, &p.check).await?;
    let wl = provisioned_job(env, "job", 2).await?;
    let request = t.request(&wl, 1);

    // Without the entry the request is made and provisioned.
    let provisioned = env.wait_request(&request, "Provisioned").await?;
    holds_quota_without_entry(env, &wl, &p.check).await?;
    assert_eq!(t.metric(&t.series(EARLY_STARTS)).await?, 1.0);

    // Kueue adds the entry once the hold is lifted: the known answer is written, nothing new
    // is made, and the Job's pods run.
    hold.lift().await?;
    let (_, entry) = env.wait_admitted_ready(&wl, &p.check).await?;
    let expected = t.provisioned(&wl, 1);
    assert_eq!(entry.message, expected);
    let made = (request.clone(), provisioned.uid().unwrap_or_default());
    assert_eq!(
        requests.objects(),
        [made],
        "one request, made before the entry"
    );
    env.wait_job_pods_running("job", 2).await?;

    // The Job finishes through its pods: nothing is left.
    env.complete_job("job", &wl).await?;
    env.wait_nothing_left().await?;
    t.stop().await
}

#[tokio::test]
async fn a_workload_that_loses_its_quota_before_the_entry_leaves_nothing() -> Result<()> {
    let t = World::new("prov-early-lost", json!({})).await?;
    let (env, p) = (&t.env, &t.p);
    let requests = env.request_history();
    let hold = EntryHold::new(env, &p.check).await?;
    let wl = provisioned_job(env, "job", 1).await?;
    env.wait_request(&t.request(&wl, 1), "Provisioned").await?;
    holds_quota_without_entry(env, &wl, &p.check).await?;

    // Deactivated: Kueue evicts the Workload and the Job integration gives its quota back, all
    // before the entry. (A stopped ClusterQueue would not do: Kueue evicts for it only after
    // adding the entry, which the hold refuses.) What was made for the entry goes with it.
    env.set_workload_active(&wl, false).await?;
    wait_released(env, &wl).await?;
    env.wait_nothing_left().await?;
    holds_no_entry(env, &wl, &p.check).await?;
    lift(hold, env, &wl).await?;
    env.wait_nothing_left().await?;
    assert_eq!(requests.objects().len(), 1, "nothing made again");
    t.stop().await
}

#[tokio::test]
async fn the_check_removed_from_the_cluster_queue_before_the_entry_leaves_nothing() -> Result<()> {
    let t = World::new("prov-early-removed", json!({})).await?;
    let (env, p) = (&t.env, &t.p);
    let hold = EntryHold::new(env, &p.check).await?;
    let wl = provisioned_workload(env, "wl").await?;
    env.wait_request(&t.request(&wl, 1), "Provisioned").await?;
    holds_quota_without_entry(env, &wl, &p.check).await?;

    // The ClusterQueue keeps no check: Kueue admits the Workload without ours, and what was
    // made for the entry that will never come goes.
    env.remove_queue_checks(&p.cluster_queue).await?;
    env.wait_nothing_left().await?;
    env.wait_admitted(&wl).await?;
    hold.lift().await?;
    t.stop().await
}

#[tokio::test]
async fn a_cluster_queue_whose_on_flavors_exclude_the_flavor_assigned_gets_no_request() -> Result<()>
{
    let env = TestEnv::new("prov-early-flavors").await?;
    let (check, pool, other) = check_only_on_the_second_flavor(&env).await?;
    let controller = env.start_provisioning_controller(None)?;
    let simulator = env.start_simulator()?;
    let requests = env.request_history();
    let hold = EntryHold::new(&env, &check).await?;

    // `on-pool` takes `pool`, where the check does not apply; `on-other` gets `other` after it.
    let on_pool = provisioned_workload(&env, "on-pool").await?;
    assert_eq!(reserved_on(&env, &on_pool).await?, [pool]);
    let on_other = provisioned_workload(&env, "on-other").await?;
    let request = format!("{on_other}-{check}-1");
    env.wait_request(&request, "Provisioned").await?;
    assert_eq!(reserved_on(&env, &on_other).await?, [other]);
    holds_quota_without_entry(&env, &on_other, &check).await?;

    // Lifted: `on-other` gets our entry and its answer. `on-pool` never gets our entry, and
    // nothing was made for it, though it held quota through all of this (the reconciles of
    // its reservation came before those of `on-other`'s).
    hold.lift().await?;
    env.wait_entry(&on_other, &check, CheckState::Ready).await?;
    holds_quota_without_entry(&env, &on_pool, &check).await?;
    let made: Vec<String> = requests.objects().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        made,
        [request],
        "a request only for the Workload on `other`"
    );
    let (count, metrics) = early_starts(&controller, &check).await?;
    assert_eq!(count, Some(1.0), "{metrics}");
    Running::stop_all([controller, simulator]).await
}

#[tokio::test]
async fn a_restart_between_reservation_and_entry_neither_duplicates_nor_leaks() -> Result<()> {
    let mut t = World::new("prov-early-restart", json!({})).await?;
    let requests = t.env.request_history();
    let hold = EntryHold::new(&t.env, &t.p.check).await?;
    let wl = provisioned_workload(&t.env, "wl").await?;
    let request = t.request(&wl, 1);
    let made = t.env.wait_request(&request, "Provisioned").await?;

    // Stopped and started again before the entry: the new process starts early again, finds
    // the request and makes no other.
    stop_controller(&mut t).await?;
    start_controller(&mut t)?;
    t.controller()?.wait_ready().await?;
    t.wait_counter(EARLY_STARTS, 1.0).await?;
    holds_quota_without_entry(&t.env, &wl, &t.p.check).await?;
    t.env.wait_only_left(std::slice::from_ref(&request)).await?;

    // Stopped again, and the Workload is deactivated while nothing runs (Kueue's eviction
    // waits for the hold: its write adds our entry too): the next process removes the request
    // on taking the lead.
    stop_controller(&mut t).await?;
    t.env.set_workload_active(&wl, false).await?;
    lift(hold, &t.env, &wl).await?;
    wait_evicted(&t.env, &wl).await?;
    t.env.wait_only_left(std::slice::from_ref(&request)).await?;
    start_controller(&mut t)?;
    t.env.wait_nothing_left().await?;
    let one = [(request, made.uid().unwrap_or_default())];
    assert_eq!(requests.objects(), one, "one request in all");
    t.stop().await
}

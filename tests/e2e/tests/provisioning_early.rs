//! The provisioning check asks for capacity when Kueue reserves quota, before Kueue adds its
//! entry (`start_early`), against the real Kueue. The window between the two lasts seconds
//! when Kueue is busy and milliseconds here, so each test holds Kueue's write of the entry back
//! with a ValidatingAdmissionPolicy ([`e2e::entry_hold`]) and lifts it when the test says.

use anyhow::{Result, ensure};
use autoscaler_simulator::SCRIPT_ANNOTATION;
use e2e::TestEnv;
use e2e::entry_hold::EntryHold;
use e2e::provisioning::World;
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

/// `spec.active: false`: Kueue evicts the Workload and releases its quota.
async fn deactivate(env: &TestEnv, workload: &str) -> Result<()> {
    let patch = json!({"spec": {"active": false}});
    env.workloads()
        .patch(workload, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

#[tokio::test]
async fn the_request_is_made_at_the_reservation_and_the_entry_is_answered_at_once() -> Result<()> {
    let t = World::new("prov-early", json!({})).await?;
    let (env, p) = (&t.env, &t.p);
    let requests = env.request_history();
    let hold = EntryHold::new(env, &p.check).await?;
    let job = env
        .job_with_pod_annotations("job", "lq", "1", 2, &[(SCRIPT_ANNOTATION, "provision")])
        .await?;
    let wl = env.workload_for_job(&job).await?.name_any();
    let request = t.request(&wl, 1);

    // Without the entry the request is made and provisioned.
    let provisioned = env.wait_request(&request, "Provisioned").await?;
    holds_quota_without_entry(env, &wl, &p.check).await?;
    assert_eq!(t.metric(&t.series(EARLY_STARTS)).await?, 1.0);

    // Kueue adds the entry once the hold is lifted: the known answer is written, nothing new
    // is made, and the Job's pods run.
    hold.lift().await?;
    let (_, entry) = env.wait_admitted_ready(&wl, &p.check).await?;
    assert_eq!(
        entry.message,
        format!("ProvisioningRequest {} provisioned", t.qualified(&wl, 1))
    );
    assert_eq!(
        requests.objects(),
        [(request.clone(), provisioned.uid().unwrap_or_default())],
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
    let job = env
        .job_with_pod_annotations("job", "lq", "1", 1, &[(SCRIPT_ANNOTATION, "provision")])
        .await?;
    let wl = env.workload_for_job(&job).await?.name_any();
    env.wait_request(&t.request(&wl, 1), "Provisioned").await?;
    holds_quota_without_entry(env, &wl, &p.check).await?;

    // Deactivated: Kueue evicts the Workload and the Job integration gives its quota back, all
    // before the entry. (A stopped ClusterQueue would not do: Kueue evicts for it only after
    // adding the entry, which the hold refuses.) What was made for the entry goes with it.
    deactivate(env, &wl).await?;
    e2e::wait_for(env.workloads(), &wl, "quota released", |w: &Workload| {
        !w.condition_is_true(cond::QUOTA_RESERVED)
    })
    .await?;
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
    let wl = env.standalone_workload("wl", "provision").await?.name_any();
    env.wait_request(&t.request(&wl, 1), "Provisioned").await?;
    holds_quota_without_entry(env, &wl, &p.check).await?;

    // The ClusterQueue keeps no check: Kueue admits the Workload without ours, and what was
    // made for the entry that will never come goes.
    let patch = json!({"spec": {"admissionChecksStrategy": null}});
    Api::<ClusterQueue>::all(env.client.clone())
        .patch(
            &p.cluster_queue,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    env.wait_nothing_left().await?;
    env.wait_admitted(&wl).await?;
    hold.lift().await?;
    t.stop().await
}

#[tokio::test]
async fn a_cluster_queue_whose_on_flavors_exclude_the_flavor_assigned_gets_no_request() -> Result<()>
{
    let env = TestEnv::new("prov-early-flavors").await?;
    let controller_name = env.provisioning_controller_name();
    let config = env.provisioning_config("prc", json!({})).await?;
    let check = env
        .provisioning_check("prov", &controller_name, &config)
        .await?;
    // A gate of the test's, on every flavor, keeps Workloads holding quota unadmitted.
    let gate = env
        .admission_check("gate", &env.own_controller_name("gate"))
        .await?
        .name_any();
    env.set_admission_check_active(&gate, true).await?;
    // Two flavors, `pool` first with room for one Workload; our check only on `other`.
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
    let controller = env.start_provisioning_controller(None)?;
    let simulator = env.start_simulator()?;
    let requests = env.request_history();
    let hold = EntryHold::new(&env, &check).await?;

    // `on-pool` takes `pool`, where the check does not apply; `on-other` gets `other` after it.
    let on_pool = env
        .standalone_workload("on-pool", "provision")
        .await?
        .name_any();
    let reserved = wait_reserved(&env, &on_pool).await?;
    let flavors = |wl: &Workload| -> Vec<String> {
        let admission = wl.status.as_ref().and_then(|s| s.admission.as_ref());
        admission
            .map(|a| {
                a.pod_set_assignments
                    .iter()
                    .flat_map(|p| p.flavors.values().cloned())
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(flavors(&reserved), std::slice::from_ref(&pool));
    let on_other = env
        .standalone_workload("on-other", "provision")
        .await?
        .name_any();
    let request = format!("{on_other}-{check}-1");
    env.wait_request(&request, "Provisioned").await?;
    assert_eq!(
        flavors(&wait_reserved(&env, &on_other).await?),
        std::slice::from_ref(&other)
    );
    holds_quota_without_entry(&env, &on_other, &check).await?;

    // Lifted: `on-other` gets our entry and its answer. `on-pool` never gets our entry, and
    // nothing was made for it, though it held quota through all of this (the reconciles of
    // its reservation came before those of `on-other`'s).
    hold.lift().await?;
    e2e::wait_for(
        env.workloads(),
        &on_other,
        "our entry Ready",
        |w: &Workload| {
            w.admission_check(&check)
                .is_some_and(|e| e.state == CheckState::Ready)
        },
    )
    .await?;
    let pool_wl: Workload = env.workloads().get(&on_pool).await?;
    ensure!(
        pool_wl.condition_is_true(cond::QUOTA_RESERVED)
            && pool_wl.admission_check(&check).is_none(),
        "{}",
        e2e::dump(&pool_wl)
    );
    let made: Vec<String> = requests.objects().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        made,
        [request],
        "a request only for the Workload on `other`"
    );
    let metrics = controller.metrics().await?;
    assert_eq!(
        e2e::metric_sample(&metrics, &format!("{EARLY_STARTS}{{check=\"{check}\"}}")),
        Some(1.0),
        "{metrics}"
    );
    e2e::running::Running::stop_all([controller, simulator]).await
}

#[tokio::test]
async fn a_restart_between_reservation_and_entry_neither_duplicates_nor_leaks() -> Result<()> {
    let mut t = World::new("prov-early-restart", json!({})).await?;
    let requests = t.env.request_history();
    let hold = EntryHold::new(&t.env, &t.p.check).await?;
    let wl = t
        .env
        .standalone_workload("wl", "provision")
        .await?
        .name_any();
    let request = t.request(&wl, 1);
    let made = t.env.wait_request(&request, "Provisioned").await?;

    // Stopped and started again before the entry: the new process starts early again, finds
    // the request and makes no other.
    if let Some(controller) = t.controller.take() {
        controller.stop().await?;
    }
    t.controller = Some(t.env.start_provisioning_controller(None)?);
    t.controller()?.wait_ready().await?;
    t.wait_counter(EARLY_STARTS, 1.0).await?;
    holds_quota_without_entry(&t.env, &wl, &t.p.check).await?;
    t.env.wait_only_left(std::slice::from_ref(&request)).await?;

    // Stopped again, and the Workload is deactivated while nothing runs (Kueue's eviction
    // waits for the hold: its write adds our entry too): the next process removes the request
    // on taking the lead.
    if let Some(controller) = t.controller.take() {
        controller.stop().await?;
    }
    deactivate(&t.env, &wl).await?;
    lift(hold, &t.env, &wl).await?;
    e2e::wait_for(t.env.workloads(), &wl, "evicted", |w: &Workload| {
        w.condition_is_true(cond::EVICTED)
    })
    .await?;
    t.env.wait_only_left(std::slice::from_ref(&request)).await?;
    t.controller = Some(t.env.start_provisioning_controller(None)?);
    t.env.wait_nothing_left().await?;
    assert_eq!(
        requests.objects(),
        [(request, made.uid().unwrap_or_default())],
        "one request in all"
    );
    t.stop().await
}

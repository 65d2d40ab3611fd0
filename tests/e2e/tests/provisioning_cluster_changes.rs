//! Cluster objects changed under Workloads that the provisioning controller is answering for,
//! against the real Kueue with the autoscaler simulator playing cluster-autoscaler: the
//! ResourceFlavor a Workload was admitted on is deleted, and the AdmissionCheck is renamed (a
//! second check with the same controllerName and parameters replaces the first on the
//! ClusterQueue, and the first is deleted).
//!
//! Where the simulator's scripts cannot say "provisioned now, not before", the test plays the
//! autoscaler itself: the request's script is `accept` (the simulator only accepts it) and the
//! test adds `Provisioned` when the story needs it.

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use e2e::TestEnv;
use e2e::provisioning::{History, World};
use k8s_openapi::api::core::v1::{PodSpec, PodTemplate};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kueue_admission_sdk::api::{
    ADMISSION_CHECK_ACTIVE, AdmissionCheck, AdmissionCheckState, CheckState, ClusterQueue,
    ProvisioningRequest, ResourceFlavor, Workload, find_condition, provisioning_condition as pr,
    workload_condition as cond,
};
use kueue_admission_sdk::flavors::assigned_flavor_names;
use kueue_provisioning_controller::check::ADMITTED_BEFORE_THE_CHECK;
use serde_json::json;

/// Kueue's finalizer on ResourceFlavors and AdmissionChecks that a ClusterQueue references.
const IN_USE_FINALIZER: &str = "kueue.x-k8s.io/resource-in-use";

/// The pod annotation naming the request whose capacity the pods consume.
const CONSUME_ANNOTATION: &str = "autoscaling.x-k8s.io/consume-provisioning-request";

/// One test's world (config, check, flavor, ClusterQueue with 4 cpu, LocalQueue `lq`, the
/// controller under test and the simulator), the controller keeping a Workload's quota only
/// `hold` after a failure retrying cannot fix, if given.
async fn setup(test: &str, hold: Option<Duration>) -> Result<World> {
    World::tuned(test, json!({}), |config| {
        if let Some(hold) = hold {
            config.permanent_failure_hold = hold;
        }
    })
    .await
}

/// Deletes the object and checks that Kueue's in-use finalizer holds it (a ClusterQueue lists
/// it); returns it as it is while terminating.
async fn delete_held_in_use<K>(api: &Api<K>, name: &str) -> Result<K>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize,
    K: Send + 'static,
    K::DynamicType: Default,
{
    api.delete(name, &DeleteParams::default()).await?;
    let held = e2e::wait_for(api.clone(), name, "deletionTimestamp set", |k: &K| {
        k.meta().deletion_timestamp.is_some()
    })
    .await?;
    assert_eq!(
        held.finalizers(),
        [IN_USE_FINALIZER],
        "Kueue's finalizer holds it: {}",
        e2e::dump(&held)
    );
    Ok(held)
}

/// The name of attempt 1's request of `workload` under `check`.
fn request(workload: &str, check: &str) -> String {
    format!("{workload}-{check}-1")
}

/// The `Active` condition of an object's status conditions.
fn active(conditions: Option<&Vec<Condition>>) -> Option<&Condition> {
    conditions.and_then(|c| find_condition(c, ADMISSION_CHECK_ACTIVE))
}

/// The lastTransitionTime of a Workload condition.
fn since(wl: &Workload, type_: &str) -> Option<Timestamp> {
    wl.condition(type_).map(|c| c.last_transition_time.0)
}

/// Names of the Workload's check entries.
fn entry_names(wl: &Workload) -> Vec<String> {
    wl.status
        .as_ref()
        .map(|s| s.admission_checks.iter().map(|e| e.name.clone()).collect())
        .unwrap_or_default()
}

/// Whether `check`'s entry, in `state`, is the Workload's only one.
fn only_entry_is(wl: &Workload, check: &str, state: CheckState) -> bool {
    entry_names(wl) == [check] && wl.admission_check(check).is_some_and(|e| e.state == state)
}

/// Adds `Provisioned=True` to the request, as cluster-autoscaler would, with the
/// resourceVersion it read (read again on a conflict with the simulator's own write).
async fn mark_provisioned(env: &TestEnv, name: &str) -> Result<ProvisioningRequest> {
    let api = env.provisioning_requests();
    for _ in 0..10 {
        let r = api.get(name).await?;
        let mut conditions = r.status.clone().unwrap_or_default().conditions;
        conditions.push(Condition {
            type_: pr::PROVISIONED.into(),
            status: "True".into(),
            reason: "Provisioned".into(),
            message: "provisioned by the end-to-end test".into(),
            last_transition_time: Time(Timestamp::now()),
            observed_generation: r.metadata.generation,
        });
        let body = json!({
            "metadata": {"resourceVersion": r.resource_version()},
            "status": {"conditions": conditions},
        });
        match api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&body))
            .await
        {
            Ok(r) => return Ok(r),
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(e).with_context(|| format!("marking {name} Provisioned")),
        }
    }
    bail!("request {name} changed under every one of 10 attempts to mark it Provisioned")
}

/// The controller's counter of reconcile errors of checks.
const RECONCILE_ERRORS: &str = "kueue_ac_reconcile_errors_total{kind=\"check\"}";

/// The controller's counter of requests created for `check`.
fn created_total(check: &str) -> String {
    format!("kueue_provisioning_requests_created_total{{check=\"{check}\"}}")
}

/// The message of an entry whose request `request` is provisioned.
fn provisioned(t: &World, request: &str) -> String {
    format!(
        "ProvisioningRequest {} provisioned",
        t.qualified_name(request)
    )
}

/// Submits Job `job` whose request the simulator provisions and waits until it is admitted;
/// returns its Workload's name, the Workload as admitted, and its request's name.
async fn admitted_job(t: &World, job: &str) -> Result<(String, Workload, String)> {
    let wl = t.env.job_with_script(job, "provision").await?;
    let admitted = t.env.wait_admitted(&wl).await?;
    let request = request(&wl, &t.p.check);
    Ok((wl, admitted, request))
}

/// Waits until the ClusterQueue is `Active=True` (reason `Ready`); returns the condition.
async fn queue_can_admit(t: &World) -> Result<Condition> {
    t.env
        .wait_active::<ClusterQueue>(&t.p.cluster_queue, "True", Some("Ready"))
        .await
}

/// Changes a label of the Workload (any change wakes our controller for it) and waits until
/// the controller has finished one more reconcile without error.
async fn reconciled_after_a_change(t: &World, wl: &str) -> Result<()> {
    let ok = "kueue_ac_reconcile_duration_seconds_count{result=\"ok\"}";
    let reconciled = t.metric(ok).await?;
    t.env
        .touch_workload(wl, "after-the-flavor-was-deleted")
        .await?;
    let addr = t.controller()?.http.context("the controller's address")?;
    e2e::wait_metric_where(addr, ok, &format!("> {reconciled}"), |v| v > reconciled).await?;
    Ok(())
}

/// The pod spec of the request's PodTemplate of podset `main`, once checked that it was made
/// after the flavor started terminating.
async fn template_made_while_terminating(
    env: &TestEnv,
    request: &str,
    terminating: &ResourceFlavor,
) -> Result<PodSpec> {
    let template = Api::<PodTemplate>::namespaced(env.client.clone(), &env.ns)
        .get(&format!("ppt-{request}-main"))
        .await?;
    let deleted_at = terminating.metadata.deletion_timestamp.as_ref();
    assert!(
        template.creation_timestamp().map(|t| t.0) >= deleted_at.map(|t| t.0),
        "{}",
        e2e::dump(&template)
    );
    template
        .template
        .and_then(|t| t.spec)
        .context("the PodTemplate has a pod spec")
}

/// The flavor read now, once checked it is the one that started terminating (same uid).
async fn same_flavor(
    flavors: &Api<ResourceFlavor>,
    terminating: &ResourceFlavor,
) -> Result<ResourceFlavor> {
    let now = flavors.get(&terminating.name_any()).await?;
    assert_eq!(now.uid(), terminating.uid());
    Ok(now)
}

/// Checks, after the flavor's deletion and the second Job's admission, that the first Workload
/// is as it was (admitted since the same time, never evicted, the same entry), its request
/// unchanged (same uid and resourceVersion) and its Job `first` running, that no `CheckFailed`
/// event was published on either Workload, and that the controller counted no reconcile error.
async fn our_request_and_entry_unchanged_after(
    t: &World,
    first: &FirstAdmitted,
    second: &String,
) -> Result<()> {
    let env = &t.env;
    let (wl, admitted, request) = (&first.wl, &first.admitted, &first.request);
    let now = env.workloads().get(wl).await?;
    assert!(now.condition_is_true(cond::ADMITTED), "{}", e2e::dump(&now));
    assert_eq!(since(&now, cond::ADMITTED), since(admitted, cond::ADMITTED));
    assert_eq!(now.total_evictions(), 0, "{}", e2e::dump(&now));
    assert_eq!(now.admission_check(&t.p.check), Some(&first.entry));
    let after = env.provisioning_requests().get(&request.name_any()).await?;
    assert_eq!(
        (after.uid(), after.resource_version()),
        (request.uid(), request.resource_version()),
        "the first request was changed or replaced: {}",
        e2e::dump(&after)
    );
    let job = env.jobs().get("first").await?;
    assert_eq!(job.spec.and_then(|s| s.suspend), Some(false));
    assert_no_check_failed(env, &[wl, second]).await?;
    assert_eq!(t.metric(RECONCILE_ERRORS).await?, 0.0);
    Ok(())
}

/// Checks that no `CheckFailed` event was published on any of the Workloads.
async fn assert_no_check_failed(env: &TestEnv, workloads: &[&String]) -> Result<()> {
    for wl in workloads {
        assert_eq!(env.event_count(wl, "CheckFailed").await?, 0, "{wl}");
    }
    Ok(())
}

/// Waits until the request history has seen at least `deletions` deletions (`what` names them
/// on a timeout); returns the (name, uid) of every request it saw, in order, and the names of
/// those deleted.
async fn deletions_seen(
    requests: &History<ProvisioningRequest>,
    deletions: usize,
    what: &str,
) -> Result<(Vec<(String, String)>, Vec<String>)> {
    e2e::eventually(what, || requests.deleted().len() >= deletions).await?;
    Ok((requests.objects(), requests.deleted()))
}

/// Deletes the ClusterQueue and waits until the flavor it held goes.
async fn flavor_gone_with_its_queue(t: &World, flavors: Api<ResourceFlavor>) -> Result<()> {
    Api::<ClusterQueue>::all(t.env.client.clone())
        .delete(&t.p.cluster_queue, &DeleteParams::default())
        .await?;
    e2e::wait_gone(flavors, &t.p.flavor).await
}

/// Submits Job `job` whose request the simulator only accepts and waits until its Workload
/// holds quota with our entry `Pending`, waiting for that request; returns its Workload's
/// name, the Workload then, and its request's name.
async fn pending_on_accepted_request(t: &World, job: &str) -> Result<(String, Workload, String)> {
    let (env, check) = (&t.env, &t.p.check);
    let wl = env.job_with_script(job, "accept").await?;
    let request = request(&wl, check);
    env.wait_request(&request, pr::ACCEPTED).await?;
    let waiting = format!(
        "waiting for ProvisioningRequest {}",
        t.qualified_name(&request)
    );
    let pending = env
        .wait_workload(&wl, &format!("holding quota, {waiting}"), |w| {
            w.condition_is_true(cond::QUOTA_RESERVED)
                && w.admission_check(check).is_some_and(|e| {
                    e.state == CheckState::Pending && e.message.starts_with(&waiting)
                })
        })
        .await?;
    Ok((wl, pending, request))
}

/// Creates check `prov-renamed` with the same controllerName and parameters as ours and waits
/// until our controller makes it `Active=True` (reason `Active`); returns its name.
async fn renamed_check_active(t: &World, checks: &Api<AdmissionCheck>) -> Result<String> {
    let renamed = t
        .env
        .provisioning_check("prov-renamed", &t.p.controller_name, &t.p.config)
        .await?;
    e2e::wait_for(
        checks.clone(),
        &renamed,
        "Active=True with reason Active",
        |ac: &AdmissionCheck| {
            active(ac.status.as_ref().map(|s| &s.conditions))
                .is_some_and(|c| c.status == "True" && c.reason == "Active")
        },
    )
    .await?;
    Ok(renamed)
}

/// Makes `check` the ClusterQueue's only check.
async fn switch_queue_to(t: &World, check: &str) -> Result<()> {
    let switch =
        json!({"spec": {"admissionChecksStrategy": {"admissionChecks": [{"name": check}]}}});
    Api::<ClusterQueue>::all(t.env.client.clone())
        .patch(
            &t.p.cluster_queue,
            &PatchParams::default(),
            &Patch::Merge(&switch),
        )
        .await?;
    Ok(())
}

/// Waits until `check`'s entry, in `state`, is the Workload's only one (`what` says so on a
/// timeout); returns the Workload then.
async fn only_entry(
    env: &TestEnv,
    wl: &str,
    (check, state): (&str, CheckState),
    what: &str,
) -> Result<Workload> {
    env.wait_workload(wl, what, |w| only_entry_is(w, check, state))
        .await
}

/// Waits until `check`'s request for the Workload is accepted, marks it `Provisioned`, and
/// waits until the Workload is admitted with `check`'s entry `Ready`; returns the request's
/// name, the Workload then and the entry.
async fn provisioned_under(
    t: &World,
    wl: &str,
    check: &str,
) -> Result<(String, Workload, AdmissionCheckState)> {
    let env = &t.env;
    let request = request(wl, check);
    env.wait_request(&request, pr::ACCEPTED).await?;
    mark_provisioned(env, &request).await?;
    let done = env
        .wait_workload(wl, "Admitted with the new check Ready", |w| {
            w.condition_is_true(cond::ADMITTED) && entry_is(w, check, CheckState::Ready)
        })
        .await?;
    let entry = e2e::entry_of(&done, check)?;
    Ok((request, done, entry))
}

/// Whether the Workload's entry of `check` is in `state`.
fn entry_is(wl: &Workload, check: &str, state: CheckState) -> bool {
    wl.admission_check(check).is_some_and(|e| e.state == state)
}

/// Every version of Workload `wl` the history saw, once it has seen one with `check`'s entry
/// `Ready`.
async fn versions_until_ready(
    wls: &History<Workload>,
    wl: &str,
    check: &str,
) -> Result<Vec<Workload>> {
    e2e::eventually(
        "the history saw the admitted Workload's new entry Ready",
        || {
            wls.applied()
                .iter()
                .any(|w| w.name_any() == wl && entry_is(w, check, CheckState::Ready))
        },
    )
    .await?;
    Ok(wls
        .applied()
        .into_iter()
        .filter(|w| w.name_any() == wl)
        .collect())
}

/// Checks that every version is admitted, since the same time as `before`.
fn assert_admitted_throughout(versions: &[Workload], before: &Workload) -> Result<()> {
    for w in versions {
        ensure!(
            w.condition_is_true(cond::ADMITTED)
                && since(w, cond::ADMITTED) == since(before, cond::ADMITTED),
            "the admitted Workload stopped being admitted:\n{}",
            e2e::dump(w)
        );
    }
    Ok(())
}

/// Job `job`'s `suspend`, and the request its pod template says its pods consume.
async fn job_suspend_and_consumed(
    env: &TestEnv,
    job: &str,
) -> Result<(Option<bool>, Option<String>)> {
    let job = env.jobs().get(job).await?;
    let spec = job.spec.context("the Job has a spec")?;
    let consumed = spec
        .template
        .metadata
        .and_then(|m| m.annotations)
        .and_then(|a| a.get(CONSUME_ANNOTATION).cloned());
    Ok((spec.suspend, consumed))
}

/// Waits until only `request` (and its templates) is left of ours; if something else stays,
/// fails naming what is left.
async fn old_requests_released(t: &World, request: &str) -> Result<()> {
    let env = &t.env;
    if let Err(e) = env.wait_only_left(&[request.to_string()]).await {
        let left = (env.our_requests().await?, env.our_pod_templates().await?);
        bail!(
            "the old check's requests were not released: {e}\n(requests, templates) left: \
             {left:?}"
        );
    }
    Ok(())
}

/// Submits Job `job` whose request the simulator only accepts and waits until the request is
/// `Accepted` and the Workload holds quota with our entry `Pending`; returns its Workload's
/// name and its request's name.
async fn holding_quota_on_accepted_request(t: &World, job: &str) -> Result<(String, String)> {
    let wl = t.env.job_with_script(job, "accept").await?;
    let first = request(&wl, &t.p.check);
    t.env.wait_request(&first, pr::ACCEPTED).await?;
    t.env.wait_check_pending_with_quota(&wl, &t.p.check).await?;
    Ok((wl, first))
}

/// Waits until the Workload, evicted at least once, holds no quota.
async fn quota_given_back(env: &TestEnv, wl: &str) -> Result<()> {
    env.wait_workload(wl, "quota given back after the hold", |w| {
        !w.condition_is_true(cond::QUOTA_RESERVED) && w.total_evictions() >= 1
    })
    .await?;
    Ok(())
}

/// Waits until attempt `attempt`'s request for the Workload is accepted, marks it
/// `Provisioned`, and waits until the Workload is admitted; returns the request's name and our
/// entry then.
async fn admitted_once_provisioned(
    t: &World,
    wl: &str,
    attempt: u32,
) -> Result<(String, AdmissionCheckState)> {
    let env = &t.env;
    let request = format!("{wl}-{}-{attempt}", t.p.check);
    env.wait_request(&request, pr::ACCEPTED).await?;
    mark_provisioned(env, &request).await?;
    let admitted = env.wait_admitted(wl).await?;
    let entry = admitted.admission_check(&t.p.check).context("our entry")?;
    Ok((request, entry.clone()))
}

/// Removes the flavor's finalizer, deletes it and waits until it is gone (Kueue's finalizer
/// would keep it).
async fn force_out(flavors: &Api<ResourceFlavor>, name: &str) -> Result<()> {
    let unfinalized = json!({"metadata": {"finalizers": null}});
    flavors
        .patch(name, &PatchParams::default(), &Patch::Merge(&unfinalized))
        .await?;
    flavors.delete(name, &DeleteParams::default()).await?;
    e2e::wait_gone(flavors.clone(), name).await
}

/// Waits until our entry on the Workload names the missing flavor; returns the Workload then.
async fn entry_names_missing_flavor(t: &World, wl: &str) -> Result<Workload> {
    let p = &t.p;
    t.env
        .wait_workload(wl, "the entry names the missing flavor", |w| {
            w.admission_check(&p.check).is_some_and(|e| {
                e.message.contains(&format!(
                    "ResourceFlavor {} (assigned to podset main) no longer exists",
                    p.flavor
                ))
            })
        })
        .await
}

/// Creates the flavor again as `saved` was (spec and labels).
async fn recreate(flavors: &Api<ResourceFlavor>, saved: &ResourceFlavor) -> Result<()> {
    let mut again = ResourceFlavor::new(&saved.name_any(), saved.spec.clone());
    again.metadata.labels = saved.metadata.labels.clone();
    flavors.create(&Default::default(), &again).await?;
    Ok(())
}

/// Job `first` admitted through our check: its Workload's name, the Workload and our entry as
/// admitted, and its request once `Provisioned`.
struct FirstAdmitted {
    /// The Workload's name.
    wl: String,
    /// The Workload as admitted.
    admitted: Workload,
    /// Our entry as admitted.
    entry: AdmissionCheckState,
    /// Its request, once `Provisioned`.
    request: ProvisioningRequest,
}

/// Submits Job `first` and checks it is admitted with our entry `Ready`, naming its request
/// provisioned, and its request `Provisioned`; returns what the later phases compare with.
async fn first_admitted_ready_on_its_provisioned_request(t: &World) -> Result<FirstAdmitted> {
    let (wl, admitted, first_request) = admitted_job(t, "first").await?;
    let entry = e2e::entry_of(&admitted, &t.p.check)?;
    assert_eq!(entry.state, CheckState::Ready, "{entry:#?}");
    assert_eq!(entry.message, provisioned(t, &first_request));
    let request = t.env.wait_request(&first_request, pr::PROVISIONED).await?;
    Ok(FirstAdmitted {
        wl,
        admitted,
        entry,
        request,
    })
}

/// Submits Job `second` and checks it gets quota on the terminating flavor and is admitted on
/// a request whose PodTemplate, made from the flavor as it was while terminating, carries the
/// flavor's node label and toleration; returns its Workload's name and its request's name.
async fn second_job_admitted_on_the_terminating_flavor(
    t: &World,
    terminating: &ResourceFlavor,
) -> Result<(String, String)> {
    let (second, second_admitted, second_request) = admitted_job(t, "second").await?;
    let assigned = assigned_flavor_names(&second_admitted);
    let dump = e2e::dump(&second_admitted);
    assert_eq!(assigned, [t.p.flavor.as_str()], "{dump}");
    let second_entry = e2e::entry_of(&second_admitted, &t.p.check)?;
    assert_eq!(second_entry.message, provisioned(t, &second_request));
    // Made from the flavor as it was while terminating.
    let spec = template_made_while_terminating(&t.env, &second_request, terminating).await?;
    let pool = spec.node_selector.unwrap_or_default().get("pool").cloned();
    assert_eq!(pool.as_deref(), Some("pool"));
    assert_eq!(spec.tolerations, Some(vec![TestEnv::pool_toleration()]));
    Ok((second, second_request))
}

/// Checks that the ClusterQueue is still `Active` ("Can admit new workloads") and the flavor
/// still the same one, terminating.
async fn queue_still_admitting_on_the_terminating_flavor(
    t: &World,
    flavors: &Api<ResourceFlavor>,
    terminating: &ResourceFlavor,
) -> Result<()> {
    let cq_active = queue_can_admit(t).await?;
    assert_eq!(cq_active.message, "Can admit new workloads");
    let still = same_flavor(flavors, terminating).await?;
    assert!(still.metadata.deletion_timestamp.is_some());
    Ok(())
}

/// Completes Job `first` and checks that its request and PodTemplate go while the second's
/// stay: the history saw exactly the two requests, the first never replaced, and only the
/// first deleted.
async fn only_the_first_request_goes_when_it_finishes(
    t: &World,
    requests: &History<ProvisioningRequest>,
    first: &FirstAdmitted,
    second_request: &String,
) -> Result<()> {
    let env = &t.env;
    let first_request = first.request.name_any();
    env.complete_job("first", &first.wl).await?;
    env.wait_only_left(std::slice::from_ref(second_request))
        .await?;
    let saw = "the request history saw the first request deleted";
    let (made, gone) = deletions_seen(requests, 1, saw).await?;
    let names = made.iter().map(|(n, _)| n);
    ensure!(
        names.eq([&first_request, second_request]),
        "requests ever seen: {made:?}"
    );
    let first_uid = first.request.uid().unwrap_or_default();
    assert_eq!(made[0].1, first_uid, "the first request was never replaced");
    assert_eq!(gone, [first_request]);
    Ok(())
}

/// Completes Job `second` and waits until nothing of ours is left; checks that the controller
/// made two requests in all and counted no reconcile error.
async fn nothing_left_once_the_second_finishes(t: &World, second: &str) -> Result<()> {
    t.env.complete_job("second", second).await?;
    t.env.wait_nothing_left().await?;
    assert_eq!(t.metric(&created_total(&t.p.check)).await?, 2.0);
    assert_eq!(t.metric(RECONCILE_ERRORS).await?, 0.0);
    Ok(())
}

/// Checks that the flavor, though no Workload holds quota on it any more, is still held by
/// Kueue's in-use finalizer, then deletes the ClusterQueue and waits until the flavor goes.
async fn flavor_held_until_its_queue_goes(
    t: &World,
    flavors: Api<ResourceFlavor>,
    terminating: &ResourceFlavor,
) -> Result<()> {
    let held = same_flavor(&flavors, terminating).await?;
    assert_eq!(held.finalizers(), [IN_USE_FINALIZER]);
    flavor_gone_with_its_queue(t, flavors).await
}

/// Catalogue row "ResourceFlavor deleted under an admitted Workload".
///
/// A Job is admitted through our check (entry `Ready`, its request `Provisioned`), then the
/// ResourceFlavor it was admitted on is deleted. What Kueue v0.19.2 does: its
/// `resource-in-use` finalizer keeps the flavor, terminating, for as long as a ClusterQueue
/// lists it (Workloads holding quota on it do not count: it is still there once they are all
/// finished), the ClusterQueue stays `Active` (reason `Ready`) and goes on admitting on the
/// terminating flavor, and the admitted Workload is left as it was. What our controller does:
/// asked again about the admitted Workload after the deletion, it keeps its answer (entry,
/// request uid and resourceVersion unchanged, no `CheckFailed` event, no reconcile error); a
/// second Job submitted meanwhile gets quota on the terminating flavor, and a request whose
/// PodTemplate still carries that flavor's node label and toleration, and is admitted. When the
/// first Job's Workload finishes, its request and PodTemplate are deleted and the second's
/// stay; when the second finishes, nothing is left. Deleting the ClusterQueue finally lets the
/// flavor go.
#[tokio::test]
async fn a_resource_flavor_deleted_under_an_admitted_workload_is_kept_terminating_and_nothing_of_ours_changes()
-> Result<()> {
    let t = setup("cc-flavor-deleted", None).await?;
    let flavors = Api::<ResourceFlavor>::all(t.env.client.clone());
    let requests = t.env.request_history();
    let first = first_admitted_ready_on_its_provisioned_request(&t).await?;
    queue_can_admit(&t).await?;

    let terminating = delete_held_in_use(&flavors, &t.p.flavor).await?;
    // Our controller is asked about the admitted Workload again (any change of it wakes it);
    // the marker is its count of finished reconciles.
    reconciled_after_a_change(&t, &first.wl).await?;
    // A second Job gets quota on the terminating flavor, and our request for it the flavor's
    // node label and toleration.
    let (second, second_request) =
        second_job_admitted_on_the_terminating_flavor(&t, &terminating).await?;
    // Still terminating, the ClusterQueue still active: Kueue admitted the second Job on it.
    queue_still_admitting_on_the_terminating_flavor(&t, &flavors, &terminating).await?;
    // The first Workload is as it was, and so is its request.
    our_request_and_entry_unchanged_after(&t, &first, &second).await?;

    // The first Workload finishes: its request and PodTemplate go, the second's stay.
    only_the_first_request_goes_when_it_finishes(&t, &requests, &first, &second_request).await?;
    nothing_left_once_the_second_finishes(&t, &second).await?;
    // No Workload holds quota any more, yet the flavor is still held: "in use" means listed by
    // a ClusterQueue. Deleting the ClusterQueue lets it go.
    flavor_held_until_its_queue_goes(&t, flavors, &terminating).await?;
    t.stop().await
}

/// A Job holding quota through our check before the rename: its Workload's name, the Workload
/// then, and the name of its request under the old check.
struct Holding {
    /// The Workload's name.
    wl: String,
    /// The Workload before the rename.
    before: Workload,
    /// Its request under the old check.
    old_request: String,
}

/// Job `admitted` admitted through our check (entry `Ready`) and Job `pending` holding quota on
/// a request the autoscaler has only accepted (entry `Pending`); checks that those two requests
/// are all of ours.
async fn admitted_and_pending_under_the_old_check(t: &World) -> Result<(Holding, Holding)> {
    let (wl, before, old_request) = admitted_job(t, "admitted").await?;
    let admitted = Holding {
        wl,
        before,
        old_request,
    };
    let (wl, before, old_request) = pending_on_accepted_request(t, "pending").await?;
    let pending = Holding {
        wl,
        before,
        old_request,
    };
    let both_old = [admitted.old_request.clone(), pending.old_request.clone()];
    assert_eq!(t.env.our_requests().await?, both_old);
    Ok((admitted, pending))
}

/// Renames our check: creates `prov-renamed` (same controllerName and parameters) and waits
/// until it is active, deletes the old check (checking that Kueue holds it while the queue
/// lists it), switches the ClusterQueue to the new name, and waits until the old check is
/// gone; returns the new check's name.
async fn renamed_with_the_old_check_held_until_the_queue_switches(t: &World) -> Result<String> {
    let checks = Api::<AdmissionCheck>::all(t.env.client.clone());
    // The new check, with the same controllerName and parameters: our controller makes it
    // active before the queue names it, so the queue never stops admitting.
    let renamed = renamed_check_active(t, &checks).await?;
    // The old check is deleted; Kueue holds it while the queue lists it.
    delete_held_in_use(&checks, &t.p.check).await?;
    switch_queue_to(t, &renamed).await?;
    e2e::wait_gone(checks.clone(), &t.p.check).await?;
    Ok(renamed)
}

/// Checks that Kueue replaced the pending Workload's entry with the new check's, `Pending`,
/// keeping its quota, and that it is admitted on its new request (marked `Provisioned` here)
/// on the same reservation, never evicted, its Job unsuspended; returns the new request's name.
async fn pending_admitted_on_the_same_reservation(
    t: &World,
    pending: &Holding,
    renamed: &str,
) -> Result<String> {
    let env = &t.env;
    let new_pending = (renamed, CheckState::Pending);
    let what = "only the new check's entry, Pending";
    let replaced = only_entry(env, &pending.wl, new_pending, what).await?;
    let reserved = replaced.condition_is_true(cond::QUOTA_RESERVED);
    assert!(reserved, "{}", e2e::dump(&replaced));
    let (pending_new, done, entry) = provisioned_under(t, &pending.wl, renamed).await?;
    assert_eq!(entry_names(&done), [renamed]);
    assert_eq!(entry.message, provisioned(t, &pending_new));
    // The same reservation from start to admission: never released, never evicted.
    let reserved_since = since(&pending.before, cond::QUOTA_RESERVED);
    assert_eq!(since(&done, cond::QUOTA_RESERVED), reserved_since);
    assert_eq!(done.total_evictions(), 0, "{}", e2e::dump(&done));
    env.wait_job_unsuspended("pending").await?;
    Ok(pending_new)
}

/// Checks that the admitted Workload's only entry becomes the new check's, `Ready` with
/// [`ADMITTED_BEFORE_THE_CHECK`], after Kueue showed it `Pending`; that every version of it
/// the history saw was admitted since the same time; and that its Job runs on, its pods still
/// consuming the old request.
async fn admitted_answered_ready_at_once_and_left_running(
    t: &World,
    wls: &History<Workload>,
    admitted: &Holding,
    renamed: &str,
) -> Result<()> {
    let env = &t.env;
    let new_ready = (renamed, CheckState::Ready);
    let again = only_entry(env, &admitted.wl, new_ready, "the new check's entry Ready").await?;
    let answer = e2e::entry_of(&again, renamed)?.message;
    assert_eq!(answer, ADMITTED_BEFORE_THE_CHECK);
    let versions = versions_until_ready(wls, &admitted.wl, renamed).await?;
    let seen_pending = versions
        .iter()
        .any(|w| entry_is(w, renamed, CheckState::Pending));
    ensure!(
        seen_pending,
        "Kueue never showed the new entry Pending on the admitted Workload"
    );
    assert_admitted_throughout(&versions, &admitted.before)?;
    let (suspend, consumed) = job_suspend_and_consumed(env, "admitted").await?;
    assert_eq!(suspend, Some(false));
    assert_eq!(
        consumed,
        Some(admitted.old_request.clone()),
        "Kueue does not update a running Job's pods"
    );
    Ok(())
}

/// Checks that the request history saw both old requests deleted, that the controller made
/// two requests under the old check and one under the new, and that no `CheckFailed` event was
/// published on either Workload.
async fn both_old_requests_deleted_and_one_new_made(
    t: &World,
    requests: &History<ProvisioningRequest>,
    [admitted, pending]: [&Holding; 2],
    renamed: &String,
) -> Result<()> {
    let saw = "the request history saw both old requests deleted";
    let (_, mut gone) = deletions_seen(requests, 2, saw).await?;
    gone.sort();
    assert_eq!(
        gone,
        [admitted.old_request.clone(), pending.old_request.clone()]
    );
    for (check, made) in [(&t.p.check, 2.0), (renamed, 1.0)] {
        assert_eq!(t.metric(&created_total(check)).await?, made, "{check}");
    }
    assert_no_check_failed(&t.env, &[&admitted.wl, &pending.wl]).await
}

/// Catalogue row "a check renamed".
///
/// Two Jobs hold quota through our check `<ns>-prov`: one admitted (entry `Ready`), one whose
/// request the autoscaler has only accepted (entry `Pending`). The check is renamed: a second
/// AdmissionCheck `<ns>-prov-renamed` with the same controllerName and parameters is created
/// (our controller makes it `Active`), the old one is deleted, and the ClusterQueue is switched
/// to the new name. What Kueue v0.19.2 does: its `resource-in-use` finalizer holds the old
/// check while the ClusterQueue lists it and lets it go as soon as it does not (about a second
/// before it rewrites the Workloads); it replaces the old entry of every Workload of the queue
/// with a `Pending` entry of the new check, without releasing any quota, and leaves an
/// admitted Workload `Admitted` (its Job running, its pods still naming the old request).
/// What our controller must do: release the old check's requests and PodTemplates and provision
/// under the new check: the pending Workload is admitted on its new request; the admitted one
/// (its new entry `Pending` with quota, so the check is asked) is answered `Ready` at once with
/// no new request, since its pods are placed (it used to get a request nobody would use).
/// Nothing of the old check is left.
///
/// Found by this test: the old check's requests and PodTemplates were never released (the
/// runtime released only the checks still in its registry, and a deleted check leaves it before
/// Kueue drops its entries); the runtime now releases every check it has known
/// (`a_check_gone_from_the_registry_still_releases_what_its_workloads_hold`). Deleting the old
/// check before switching the ClusterQueue made the loss certain, so that is the order here.
#[tokio::test]
async fn a_renamed_check_replaces_the_entries_and_its_requests_without_releasing_quota()
-> Result<()> {
    let t = setup("cc-check-renamed", None).await?;
    let (admitted, pending) = admitted_and_pending_under_the_old_check(&t).await?;
    let wls = t.env.workload_history();
    let requests = t.env.request_history();

    let renamed = renamed_with_the_old_check_held_until_the_queue_switches(&t).await?;
    // The pending Workload: Kueue replaced its entry and kept its quota; our controller asked
    // the autoscaler again under the new name.
    let pending_new = pending_admitted_on_the_same_reservation(&t, &pending, &renamed).await?;
    // The admitted Workload: still admitted throughout; Kueue gave it a Pending entry of the
    // new check, which our controller answered Ready at once, provisioning nothing (its pods
    // are placed).
    admitted_answered_ready_at_once_and_left_running(&t, &wls, &admitted, &renamed).await?;

    // Nothing of the old check is left.
    if let Err(e) = old_requests_released(&t, &pending_new).await {
        t.stop().await?;
        return Err(e);
    }
    let both = [&admitted, &pending];
    both_old_requests_deleted_and_one_new_made(&t, &requests, both, &renamed).await?;

    for (job, wl) in [("admitted", &admitted.wl), ("pending", &pending.wl)] {
        t.env.complete_job(job, wl).await?;
    }
    t.env.wait_nothing_left().await?;
    t.stop().await
}

/// Forces the flavor out (its finalizer removed, then deleted: Kueue's finalizer would keep it)
/// and waits until Kueue makes the ClusterQueue inactive (`FlavorNotFound`).
async fn queue_inactive_once_the_flavor_is_forced_out(
    t: &World,
    flavors: &Api<ResourceFlavor>,
) -> Result<()> {
    force_out(flavors, &t.p.flavor).await?;
    t.env
        .wait_active::<ClusterQueue>(&t.p.cluster_queue, "False", Some("FlavorNotFound"))
        .await?;
    Ok(())
}

/// Checks that our entry names the missing flavor while the Workload keeps its quota for the
/// hold, and that a `CheckFailedPermanently` Event says so too.
async fn missing_flavor_named_with_the_quota_kept_for_the_hold(t: &World, wl: &str) -> Result<()> {
    let named = entry_names_missing_flavor(t, wl).await?;
    let kept = named.condition_is_true(cond::QUOTA_RESERVED);
    let dump = e2e::dump(&named);
    ensure!(kept, "the quota is kept for the hold: {dump}");
    let failed = "CheckFailedPermanently";
    let events = t.env.wait_event_count(wl, failed, 1).await?;
    ensure!(events >= 1, "an Event says so too");
    Ok(())
}

/// Waits until the Workload, evicted at least once, holds no quota, and its request `first`
/// is gone.
async fn quota_given_back_and_request_released(env: &TestEnv, wl: &str, first: &str) -> Result<()> {
    quota_given_back(env, wl).await?;
    e2e::wait_gone(env.provisioning_requests(), first).await
}

/// Catalogue row "a flavor that no longer exists" (end to end): a Workload holds quota on a
/// flavor with its request accepted, not yet provisioned, when the flavor is forced out (its
/// finalizer removed, then deleted). Kueue makes the ClusterQueue inactive (`FlavorNotFound`)
/// and leaves the Workload its quota. Asked again (the request is provisioned meanwhile), our
/// check cannot plan without the flavor: the entry says so at once (naming the flavor and the
/// fix), the quota is kept only for the hold, then `Retry` gives it back and the request is
/// released. Re-created, the flavor lets the Workload be admitted on its second attempt:
/// nothing lost, quota never held indefinitely. (Before, the failure was transient: the entry
/// kept saying "waiting to be provisioned" and the quota was held for as long as the flavor
/// stayed away.)
#[tokio::test]
async fn a_flavor_forced_out_under_a_pending_workload_is_named_and_the_quota_given_back()
-> Result<()> {
    let t = setup("cc-flavor-forced-out", Some(Duration::from_secs(3))).await?;
    let flavors = Api::<ResourceFlavor>::all(t.env.client.clone());
    let saved = flavors.get(&t.p.flavor).await?;
    let (wl, first) = holding_quota_on_accepted_request(&t, "job").await?;

    // Forced out: the finalizer removed, then deleted (Kueue's finalizer would keep it).
    queue_inactive_once_the_flavor_is_forced_out(&t, &flavors).await?;
    // The autoscaler provisions the request: the change asks the check again.
    mark_provisioned(&t.env, &first).await?;
    missing_flavor_named_with_the_quota_kept_for_the_hold(&t, &wl).await?;
    // After the hold: Retry, the quota given back, the request released.
    quota_given_back_and_request_released(&t.env, &wl, &first).await?;

    // The flavor back: the ClusterQueue is active again and the Workload admitted on its
    // second attempt.
    recreate(&flavors, &saved).await?;
    let (second, entry) = admitted_once_provisioned(&t, &wl, 2).await?;
    ensure!(
        entry.state == CheckState::Ready && entry.message.contains(&second),
        "{entry:?}"
    );
    t.stop().await
}

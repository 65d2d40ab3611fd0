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
use e2e::provisioning::World;
use k8s_openapi::api::core::v1::PodTemplate;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kueue_admission_sdk::api::{
    ADMISSION_CHECK_ACTIVE, AdmissionCheck, CheckState, ClusterQueue, ProvisioningRequest,
    ResourceFlavor, Workload, find_condition, provisioning_condition as pr,
    workload_condition as cond,
};
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
    let (env, p) = (&t.env, &t.p);
    let flavors = Api::<ResourceFlavor>::all(env.client.clone());
    let requests = env.request_history();

    let first = env.job_with_script("first", "provision").await?;
    let admitted = env.wait_admitted(&first).await?;
    let first_request = request(&first, &p.check);
    let entry = admitted
        .admission_check(&p.check)
        .cloned()
        .context("our entry")?;
    assert_eq!(entry.state, CheckState::Ready, "{entry:#?}");
    assert_eq!(
        entry.message,
        format!(
            "ProvisioningRequest {} provisioned",
            t.qualified_name(&first_request)
        )
    );
    let before = env.wait_request(&first_request, pr::PROVISIONED).await?;
    env.wait_active::<ClusterQueue>(&p.cluster_queue, "True", Some("Ready"))
        .await?;

    let terminating = delete_held_in_use(&flavors, &p.flavor).await?;

    // Our controller is asked about the admitted Workload again (any change of it wakes it);
    // the marker is its count of finished reconciles.
    let ok = "kueue_ac_reconcile_duration_seconds_count{result=\"ok\"}";
    let reconciled = t.metric(ok).await?;
    let touch = json!({"metadata": {"labels": {"e2e-touched": "after-the-flavor-was-deleted"}}});
    env.workloads()
        .patch(&first, &PatchParams::default(), &Patch::Merge(&touch))
        .await?;
    let addr = t.controller()?.http.context("the controller's address")?;
    e2e::wait_metric_where(addr, ok, &format!("> {reconciled}"), |v| v > reconciled).await?;

    // A second Job gets quota on the terminating flavor, and our request for it the flavor's
    // node label and toleration.
    let second = env.job_with_script("second", "provision").await?;
    let second_admitted = env.wait_admitted(&second).await?;
    let second_request = request(&second, &p.check);
    assert_eq!(
        kueue_provisioning_controller::plan::assigned_flavor_names(&second_admitted),
        [p.flavor.as_str()],
        "{}",
        e2e::dump(&second_admitted)
    );
    assert_eq!(
        second_admitted
            .admission_check(&p.check)
            .map(|e| e.message.clone()),
        Some(format!(
            "ProvisioningRequest {} provisioned",
            t.qualified_name(&second_request)
        ))
    );
    let template = Api::<PodTemplate>::namespaced(env.client.clone(), &env.ns)
        .get(&format!("ppt-{second_request}-main"))
        .await?;
    // Made from the flavor as it was while terminating.
    assert!(
        template.creation_timestamp().map(|t| t.0)
            >= terminating
                .metadata
                .deletion_timestamp
                .as_ref()
                .map(|t| t.0),
        "{}",
        e2e::dump(&template)
    );
    let spec = template
        .template
        .and_then(|t| t.spec)
        .context("the PodTemplate has a pod spec")?;
    assert_eq!(
        spec.node_selector.unwrap_or_default().get("pool"),
        Some(&"pool".to_string())
    );
    assert_eq!(spec.tolerations, Some(vec![TestEnv::pool_toleration()]));

    // Still terminating, the ClusterQueue still active: Kueue admitted the second Job on it.
    let cq_active = env
        .wait_active::<ClusterQueue>(&p.cluster_queue, "True", Some("Ready"))
        .await?;
    assert_eq!(cq_active.message, "Can admit new workloads");
    let still = flavors.get(&p.flavor).await?;
    assert_eq!(still.uid(), terminating.uid());
    assert!(still.metadata.deletion_timestamp.is_some());

    // The first Workload is as it was, and so is its request.
    let now = env.workloads().get(&first).await?;
    assert!(now.condition_is_true(cond::ADMITTED), "{}", e2e::dump(&now));
    assert_eq!(
        since(&now, cond::ADMITTED),
        since(&admitted, cond::ADMITTED)
    );
    assert_eq!(now.total_evictions(), 0, "{}", e2e::dump(&now));
    assert_eq!(now.admission_check(&p.check), Some(&entry));
    let after = env.provisioning_requests().get(&first_request).await?;
    assert_eq!(
        (after.uid(), after.resource_version()),
        (before.uid(), before.resource_version()),
        "the first request was changed or replaced: {}",
        e2e::dump(&after)
    );
    let job = env.jobs().get("first").await?;
    assert_eq!(job.spec.and_then(|s| s.suspend), Some(false));
    for wl in [&first, &second] {
        assert_eq!(env.event_count(wl, "CheckFailed").await?, 0, "{wl}");
    }
    let errors = "kueue_ac_reconcile_errors_total{kind=\"check\"}";
    assert_eq!(t.metric(errors).await?, 0.0);

    // The first Workload finishes: its request and PodTemplate go, the second's stay.
    env.complete_job("first", &first).await?;
    env.wait_only_left(std::slice::from_ref(&second_request))
        .await?;
    e2e::eventually("the request history saw the first request deleted", || {
        !requests.deleted().is_empty()
    })
    .await?;
    let made = requests.objects();
    ensure!(
        made.iter()
            .map(|(n, _)| n)
            .eq([&first_request, &second_request]),
        "requests ever seen: {made:?}"
    );
    assert_eq!(
        made[0].1,
        before.uid().unwrap_or_default(),
        "the first request was never replaced"
    );
    assert_eq!(requests.deleted(), std::slice::from_ref(&first_request));

    env.complete_job("second", &second).await?;
    env.wait_nothing_left().await?;
    let created = format!(
        "kueue_provisioning_requests_created_total{{check=\"{}\"}}",
        p.check
    );
    assert_eq!(t.metric(&created).await?, 2.0);
    assert_eq!(t.metric(errors).await?, 0.0);

    // No Workload holds quota any more, yet the flavor is still held: "in use" means listed by
    // a ClusterQueue. Deleting the ClusterQueue lets it go.
    let held = flavors.get(&p.flavor).await?;
    assert_eq!(held.uid(), terminating.uid());
    assert_eq!(held.finalizers(), [IN_USE_FINALIZER]);
    Api::<ClusterQueue>::all(env.client.clone())
        .delete(&p.cluster_queue, &DeleteParams::default())
        .await?;
    e2e::wait_gone(flavors, &p.flavor).await?;
    t.stop().await
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
    let (env, p) = (&t.env, &t.p);
    let checks = Api::<AdmissionCheck>::all(env.client.clone());

    let admitted = env.job_with_script("admitted", "provision").await?;
    let admitted_before = env.wait_admitted(&admitted).await?;
    let pending = env.job_with_script("pending", "accept").await?;
    let pending_old = request(&pending, &p.check);
    env.wait_request(&pending_old, pr::ACCEPTED).await?;
    let waiting = format!(
        "waiting for ProvisioningRequest {}",
        t.qualified_name(&pending_old)
    );
    let pending_before = env
        .wait_workload(&pending, &format!("holding quota, {waiting}"), |w| {
            w.condition_is_true(cond::QUOTA_RESERVED)
                && w.admission_check(&p.check).is_some_and(|e| {
                    e.state == CheckState::Pending && e.message.starts_with(&waiting)
                })
        })
        .await?;
    let admitted_old = request(&admitted, &p.check);
    assert_eq!(
        env.our_requests().await?,
        [admitted_old.clone(), pending_old.clone()]
    );
    let wls = env.workload_history();
    let requests = env.request_history();

    // The new check, with the same controllerName and parameters: our controller makes it
    // active before the queue names it, so the queue never stops admitting.
    let renamed = env
        .provisioning_check("prov-renamed", &p.controller_name, &p.config)
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

    // The old check is deleted; Kueue holds it while the queue lists it.
    delete_held_in_use(&checks, &p.check).await?;
    let switch =
        json!({"spec": {"admissionChecksStrategy": {"admissionChecks": [{"name": renamed}]}}});
    Api::<ClusterQueue>::all(env.client.clone())
        .patch(
            &p.cluster_queue,
            &PatchParams::default(),
            &Patch::Merge(&switch),
        )
        .await?;
    e2e::wait_gone(checks.clone(), &p.check).await?;

    // The pending Workload: Kueue replaced its entry and kept its quota; our controller asked
    // the autoscaler again under the new name.
    let pending_new = request(&pending, &renamed);
    let replaced = env
        .wait_workload(&pending, "only the new check's entry, Pending", |w| {
            only_entry_is(w, &renamed, CheckState::Pending)
        })
        .await?;
    assert!(
        replaced.condition_is_true(cond::QUOTA_RESERVED),
        "{}",
        e2e::dump(&replaced)
    );
    env.wait_request(&pending_new, pr::ACCEPTED).await?;
    mark_provisioned(env, &pending_new).await?;
    let done = env
        .wait_workload(&pending, "Admitted with the new check Ready", |w| {
            w.condition_is_true(cond::ADMITTED)
                && w.admission_check(&renamed)
                    .is_some_and(|e| e.state == CheckState::Ready)
        })
        .await?;
    assert_eq!(entry_names(&done), std::slice::from_ref(&renamed));
    assert_eq!(
        done.admission_check(&renamed).map(|e| e.message.clone()),
        Some(format!(
            "ProvisioningRequest {} provisioned",
            t.qualified_name(&pending_new)
        ))
    );
    // The same reservation from start to admission: never released, never evicted.
    assert_eq!(
        since(&done, cond::QUOTA_RESERVED),
        since(&pending_before, cond::QUOTA_RESERVED)
    );
    assert_eq!(done.total_evictions(), 0, "{}", e2e::dump(&done));
    env.wait_job_unsuspended("pending").await?;

    // The admitted Workload: still admitted throughout; Kueue gave it a Pending entry of the
    // new check, which our controller answered Ready at once, provisioning nothing (its pods
    // are placed).
    let again = env
        .wait_workload(&admitted, "the new check's entry Ready", |w| {
            only_entry_is(w, &renamed, CheckState::Ready)
        })
        .await?;
    assert_eq!(
        again.admission_check(&renamed).map(|e| e.message.clone()),
        Some(kueue_provisioning_controller::check::ADMITTED_BEFORE_THE_CHECK.to_string())
    );
    e2e::eventually(
        "the history saw the admitted Workload's new entry Ready",
        || {
            wls.applied().iter().any(|w| {
                w.name_any() == admitted
                    && w.admission_check(&renamed)
                        .is_some_and(|e| e.state == CheckState::Ready)
            })
        },
    )
    .await?;
    let versions: Vec<Workload> = wls
        .applied()
        .into_iter()
        .filter(|w| w.name_any() == admitted)
        .collect();
    ensure!(
        versions.iter().any(|w| w
            .admission_check(&renamed)
            .is_some_and(|e| e.state == CheckState::Pending)),
        "Kueue never showed the new entry Pending on the admitted Workload"
    );
    for w in &versions {
        ensure!(
            w.condition_is_true(cond::ADMITTED)
                && since(w, cond::ADMITTED) == since(&admitted_before, cond::ADMITTED),
            "the admitted Workload stopped being admitted:\n{}",
            e2e::dump(w)
        );
    }
    let job = env.jobs().get("admitted").await?;
    let spec = job.spec.context("the Job has a spec")?;
    assert_eq!(spec.suspend, Some(false));
    let consumed = spec
        .template
        .metadata
        .and_then(|m| m.annotations)
        .and_then(|a| a.get(CONSUME_ANNOTATION).cloned());
    assert_eq!(
        consumed,
        Some(admitted_old.clone()),
        "Kueue does not update a running Job's pods"
    );

    // Nothing of the old check is left.
    let result = env.wait_only_left(std::slice::from_ref(&pending_new)).await;
    if let Err(e) = result {
        let left = (env.our_requests().await?, env.our_pod_templates().await?);
        t.stop().await?;
        bail!(
            "the old check's requests were not released: {e}\n(requests, templates) left: \
             {left:?}"
        );
    }
    e2e::eventually("the request history saw both old requests deleted", || {
        requests.deleted().len() >= 2
    })
    .await?;
    let mut gone = requests.deleted();
    gone.sort();
    assert_eq!(gone, [admitted_old, pending_old]);
    for (check, made) in [(&p.check, 2.0), (&renamed, 1.0)] {
        let created = format!("kueue_provisioning_requests_created_total{{check=\"{check}\"}}");
        assert_eq!(t.metric(&created).await?, made, "{check}");
    }
    for wl in [&admitted, &pending] {
        assert_eq!(env.event_count(wl, "CheckFailed").await?, 0, "{wl}");
    }

    for (job, wl) in [("admitted", &admitted), ("pending", &pending)] {
        env.complete_job(job, wl).await?;
    }
    env.wait_nothing_left().await?;
    t.stop().await
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
    let (env, p) = (&t.env, &t.p);
    let flavors = Api::<ResourceFlavor>::all(env.client.clone());
    let saved = flavors.get(&p.flavor).await?;

    let wl = env.job_with_script("job", "accept").await?;
    let first = request(&wl, &p.check);
    env.wait_request(&first, pr::ACCEPTED).await?;
    env.wait_check_pending_with_quota(&wl, &p.check).await?;

    // Forced out: the finalizer removed, then deleted (Kueue's finalizer would keep it).
    let unfinalized = json!({"metadata": {"finalizers": null}});
    flavors
        .patch(
            &p.flavor,
            &PatchParams::default(),
            &Patch::Merge(&unfinalized),
        )
        .await?;
    flavors.delete(&p.flavor, &DeleteParams::default()).await?;
    e2e::wait_gone(flavors.clone(), &p.flavor).await?;
    env.wait_active::<ClusterQueue>(&p.cluster_queue, "False", Some("FlavorNotFound"))
        .await?;

    // The autoscaler provisions the request: the change asks the check again.
    mark_provisioned(env, &first).await?;
    let named = env
        .wait_workload(&wl, "the entry names the missing flavor", |w| {
            w.admission_check(&p.check).is_some_and(|e| {
                e.message.contains(&format!(
                    "ResourceFlavor {} (assigned to podset main) no longer exists",
                    p.flavor
                ))
            })
        })
        .await?;
    ensure!(
        named.condition_is_true(cond::QUOTA_RESERVED),
        "the quota is kept for the hold: {}",
        e2e::dump(&named)
    );
    ensure!(
        env.wait_event_count(&wl, "CheckFailedPermanently", 1)
            .await?
            >= 1,
        "an Event says so too"
    );

    // After the hold: Retry, the quota given back, the request released.
    env.wait_workload(&wl, "quota given back after the hold", |w| {
        !w.condition_is_true(cond::QUOTA_RESERVED) && w.total_evictions() >= 1
    })
    .await?;
    e2e::wait_gone(env.provisioning_requests(), &first).await?;

    // The flavor back: the ClusterQueue is active again and the Workload admitted on its
    // second attempt.
    let mut again = ResourceFlavor::new(&p.flavor, saved.spec.clone());
    again.metadata.labels = saved.metadata.labels.clone();
    flavors.create(&Default::default(), &again).await?;
    let second = format!("{wl}-{}-2", p.check);
    env.wait_request(&second, pr::ACCEPTED).await?;
    mark_provisioned(env, &second).await?;
    let admitted = env.wait_admitted(&wl).await?;
    let entry = admitted.admission_check(&p.check).context("our entry")?;
    ensure!(
        entry.state == CheckState::Ready && entry.message.contains(&second),
        "{entry:?}"
    );
    t.stop().await
}

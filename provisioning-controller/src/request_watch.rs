//! Tying requests to Workloads without an ownerReference, and removing what nobody needs.
//!
//! Kueue's built-in check deletes every ProvisioningRequest whose ownerReferences name the
//! Workload, so ours carry labels instead: this instance's label and the Workload's uid (plus
//! annotations with the Workload's name, the check and the attempt). Three paths remove them:
//! - `release` (called by the SDK when a Workload finishes, is evicted, is deactivated, loses
//!   the check or is deleted) deletes the Workload's requests and their templates;
//! - each new attempt deletes the earlier attempts' requests first;
//! - the task below watches this instance's requests while the replica leads: on taking the
//!   lead it sees every existing request, and deletes those whose Workload is gone or no longer
//!   needs them (also after this controller was down while the Workload was deleted). The same
//!   watch wakes a request's Workload on every change, so the check answers at once, and keeps
//!   the cache ([`RequestCache`]) the decisions read the requests from.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::PodTemplate;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kueue_admission_sdk::api::{
    ProvisioningRequest, Workload, find_condition, provisioning_condition as pr,
};
use kueue_admission_sdk::holding::{self, Holding, Lasts};
use kueue_admission_sdk::{ClusterQueues, LeaderContext, QueueRule};
use tracing::{info, warn};

use crate::identity;
use crate::identity::{INSTANCE_LABEL, Identity, Ownership, ownership};
use crate::metrics::{Metrics, Transition};
use crate::names;
use crate::requests::{RequestCache, delete_exactly, delete_request, delete_templates, kept};

/// Templates younger than this are never swept as orphans: a template is created just before
/// its request.
const TEMPLATE_GRACE: Duration = Duration::from_secs(60);

/// Why a request is no longer needed, or `None` while its Workload may still use it: the SDK's
/// rule for something made for one attempt (see [`kueue_admission_sdk::holding`]), with the
/// Workload's uid and the check read from the request's label and annotation. Pure; `workload`
/// is the Workload named by the request's annotation, if it exists; `queues` tell whether its
/// ClusterQueue applies the check to it (a request made before Kueue added the entry is kept
/// while the entry is due).
pub fn orphan_reason(
    request: &ProvisioningRequest,
    workload: Option<&Workload>,
    queues: &ClusterQueues,
) -> Option<String> {
    let label = |key: &str| request.labels().get(key).map(String::as_str);
    let annotation = |key: &str| request.annotations().get(key).map(String::as_str);
    let held = Holding {
        // Without the label the request is nobody's Workload's: no uid matches an empty one.
        uid: label(identity::WORKLOAD_UID_LABEL).unwrap_or_default(),
        check: annotation(identity::CHECK_ANNOTATION).unwrap_or_default(),
        // A name without an attempt is never superseded.
        lasts: Lasts::ForTheAttempt(names::attempt_of(&request.name_any()).unwrap_or(u32::MAX)),
    };
    // Queues not known (not listed yet, or refused) are no reason to delete it.
    let entry_expected =
        workload.is_some_and(|wl| queues.rule_for(wl, held.check) != QueueRule::DoesNotApply);
    holding::stale_reason_expecting_entry(&held, workload, None, entry_expected)
}

/// The conditions counted in metrics that are true on a request (a booking used up by its pods
/// did not expire: not counted).
fn counted_conditions(r: &ProvisioningRequest) -> BTreeSet<&'static str> {
    let conditions = r
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    [
        pr::PROVISIONED,
        pr::FAILED,
        pr::BOOKING_EXPIRED,
        pr::CAPACITY_REVOKED,
    ]
    .into_iter()
    .filter(|t| match *t {
        pr::BOOKING_EXPIRED => crate::outcome::booking_ran_out(conditions).is_some(),
        _ => find_condition(conditions, t).is_some_and(|c| c.status == "True"),
    })
    .collect()
}

fn transition(r: &ProvisioningRequest, condition: &str) -> Option<Transition> {
    Some(match condition {
        pr::PROVISIONED => {
            let conditions = r.status.as_ref().map(|s| s.conditions.as_slice())?;
            let at = find_condition(conditions, pr::PROVISIONED)?
                .last_transition_time
                .0;
            let created = r.metadata.creation_timestamp.as_ref()?.0;
            let secs = at.duration_since(created).as_secs_f64().max(0.0);
            Transition::Provisioned(secs)
        }
        pr::FAILED => Transition::Failed,
        pr::BOOKING_EXPIRED => Transition::BookingExpired,
        pr::CAPACITY_REVOKED => Transition::CapacityRevoked,
        _ => return None,
    })
}

/// The task beside the runtime: watches this instance's requests, wakes their Workloads,
/// counts their transitions and deletes orphans. Runs until dropped.
pub async fn watch_requests(
    ctx: LeaderContext,
    instance: String,
    metrics: Arc<Metrics>,
    cache: Arc<RequestCache>,
) {
    let api: Api<ProvisioningRequest> = Api::all(ctx.client.clone());
    let config = watcher::Config::default().labels(&format!("{INSTANCE_LABEL}={instance}"));
    // The decisions read the requests from this cache: its events are already in it.
    let mut events = std::pin::pin!(cache.clone().watch(api, config, kept));
    // Conditions already counted, by request uid: a restart counts only what changes after it.
    let mut counted: HashMap<String, BTreeSet<&'static str>> = HashMap::new();
    // Requests listed while (re)starting the watch, for the template sweep.
    let mut listed: HashSet<(String, String)> = HashSet::new();
    // Requests (by uid) this sweep deleted and whose deletion the watch has not shown yet: the
    // versions still queued for them need no second read, list and delete each.
    let mut swept: HashSet<String> = HashSet::new();
    // The requests of a list in progress, swept and woken once it is complete: the cache is
    // complete only then, and decisions wait for it rather than for the sweep.
    let mut initial: Vec<ProvisioningRequest> = Vec::new();
    while let Some(event) = events.next().await {
        match event {
            watcher::Event::Init => {
                listed.clear();
                swept.clear();
                initial.clear();
            }
            watcher::Event::InitApply(r) => {
                counted.insert(r.uid().unwrap_or_default(), counted_conditions(&r));
                listed.insert((r.namespace().unwrap_or_default(), r.name_any()));
                initial.push(r);
            }
            watcher::Event::InitDone => {
                for r in initial.drain(..) {
                    if sweep_one(&ctx, &instance, &cache, &r).await {
                        swept.insert(r.uid().unwrap_or_default());
                    }
                    wake(&ctx, &r).await;
                }
                sweep_templates(&ctx, &instance, &listed).await;
            }
            watcher::Event::Apply(r) => {
                let now = counted_conditions(&r);
                let before = counted.insert(r.uid().unwrap_or_default(), now.clone());
                let check = r
                    .annotations()
                    .get(identity::CHECK_ANNOTATION)
                    .cloned()
                    .unwrap_or_default();
                for c in now.difference(&before.unwrap_or_default()) {
                    if let Some(t) = transition(&r, c) {
                        metrics.transition(&check, t);
                    }
                }
                let uid = r.uid().unwrap_or_default();
                if !swept.contains(&uid) && sweep_one(&ctx, &instance, &cache, &r).await {
                    swept.insert(uid);
                }
                wake(&ctx, &r).await;
            }
            watcher::Event::Delete(r) => {
                counted.remove(&r.uid().unwrap_or_default());
                swept.remove(&r.uid().unwrap_or_default());
                if let Err(e) = delete_templates(&ctx.client, &instance, &r).await {
                    warn!(request = %r.name_any(), error = %e, "deleting the templates of a deleted request");
                }
                wake(&ctx, &r).await;
            }
        }
    }
}

async fn wake(ctx: &LeaderContext, r: &ProvisioningRequest) {
    if let (Some(ns), Some(wl)) = (
        r.namespace(),
        r.annotations().get(identity::WORKLOAD_ANNOTATION),
    ) {
        ctx.waker.wake(&ns, wl).await;
    }
}

/// Deletes `r` if it is an orphan, confirming with a fresh read of the Workload: the cache may
/// not have seen a Workload created a moment ago. Returns whether it deleted it.
async fn sweep_one(
    ctx: &LeaderContext,
    instance: &str,
    cache: &RequestCache,
    r: &ProvisioningRequest,
) -> bool {
    if r.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let Some(namespace) = r.namespace() else {
        return false;
    };
    let Some(name) = r.annotations().get(identity::WORKLOAD_ANNOTATION) else {
        return false;
    };
    let cached = ctx.workloads.get(&ObjectRef::new(name).within(&namespace));
    if orphan_reason(r, cached.as_deref(), &ctx.cluster_queues).is_none() {
        return false;
    }
    let api: Api<Workload> = Api::namespaced(ctx.client.clone(), &namespace);
    let fresh = match api.get_opt(name).await {
        Ok(w) => w,
        Err(e) => {
            warn!(request = %r.name_any(), error = %e, "reading the Workload of a request");
            return false;
        }
    };
    let Some(reason) = orphan_reason(r, fresh.as_ref(), &ctx.cluster_queues) else {
        return false;
    };
    match delete_request(&ctx.client, instance, cache, r).await {
        Ok(true) => {
            info!(request = %r.name_any(), namespace, reason, "deleted an orphaned ProvisioningRequest");
            true
        }
        Ok(false) => false,
        Err(e) => {
            warn!(request = %r.name_any(), error = %e, "deleting an orphaned ProvisioningRequest");
            false
        }
    }
}

/// Deletes this instance's templates whose request does not exist (a crash between creating
/// the templates and the request, or a request deleted while no replica ran).
async fn sweep_templates(
    ctx: &LeaderContext,
    instance: &str,
    requests: &HashSet<(String, String)>,
) {
    let api: Api<PodTemplate> = Api::all(ctx.client.clone());
    let list = match api
        .list(&ListParams::default().labels(&format!("{INSTANCE_LABEL}={instance}")))
        .await
    {
        Ok(l) => l,
        Err(e) => {
            warn!(error = %e, "listing PodTemplates to sweep");
            return;
        }
    };
    let now = Timestamp::now();
    for t in list.items {
        let namespace = t.namespace().unwrap_or_default();
        let request = t.annotations().get(identity::REQUEST_ANNOTATION).cloned();
        let young = t
            .metadata
            .creation_timestamp
            .as_ref()
            // A creation time ahead of our clock is young, not as old as the skew.
            .is_none_or(|c| crate::outcome::age_at(now, c.0) < TEMPLATE_GRACE);
        let orphan = request.is_none_or(|r| !requests.contains(&(namespace.clone(), r)));
        // The selector only narrows the list: a template without our full identity stays.
        let this_instances = Identity::recorded_on(&t.metadata, instance)
            .is_some_and(|id| ownership(&t.metadata, &id) == Ownership::Ours);
        if !orphan || young || !this_instances {
            continue;
        }
        let templates: Api<PodTemplate> = Api::namespaced(ctx.client.clone(), &namespace);
        match delete_exactly(&templates, &t).await {
            Ok(()) => info!(template = %t.name_any(), namespace, "deleted an orphaned PodTemplate"),
            Err(e) => {
                warn!(template = %t.name_any(), error = %e, "deleting an orphaned PodTemplate")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kueue_admission_sdk::api::{CheckState, ProvisioningRequestSpec};
    use kueue_admission_sdk::testing::WorkloadBuilder;

    fn request(name: &str, uid: &str, check: &str) -> ProvisioningRequest {
        let mut r = ProvisioningRequest::new(name, ProvisioningRequestSpec::default());
        r.metadata.namespace = Some("team".into());
        r.labels_mut()
            .insert(identity::WORKLOAD_UID_LABEL.into(), uid.into());
        r.annotations_mut()
            .insert(identity::CHECK_ANNOTATION.into(), check.into());
        r.annotations_mut()
            .insert(identity::WORKLOAD_ANNOTATION.into(), "wl".into());
        r
    }

    fn holding(retry_count: Option<i32>) -> Workload {
        let mut b = WorkloadBuilder::new("team", "wl")
            .uid("u1")
            .pod_set("main", 1, "1")
            .check("prov", CheckState::Pending)
            .quota_reserved("cq", "default");
        if let Some(n) = retry_count {
            b = b.retry_count("prov", n);
        }
        b.build()
    }

    #[test]
    fn a_request_of_a_live_workload_on_its_current_attempt_is_kept() {
        let r = request("wl-prov-2", "u1", "prov");
        assert_eq!(
            orphan_reason(&r, Some(&holding(Some(1))), &ClusterQueues::default()),
            None
        );
        // A request ahead of a stale cache is kept too.
        let ahead = request("wl-prov-3", "u1", "prov");
        assert_eq!(
            orphan_reason(&ahead, Some(&holding(Some(1))), &ClusterQueues::default()),
            None
        );
    }

    #[test]
    fn gone_recreated_idle_or_superseded_is_an_orphan() {
        let r = request("wl-prov-1", "u1", "prov");
        assert!(
            orphan_reason(&r, None, &ClusterQueues::default())
                .is_some_and(|m| m.contains("no longer exists"))
        );
        let other = WorkloadBuilder::new("team", "wl")
            .uid("u2")
            .check("prov", CheckState::Pending)
            .quota_reserved("cq", "default")
            .build();
        assert!(
            orphan_reason(&r, Some(&other), &ClusterQueues::default())
                .is_some_and(|m| m.contains("another one"))
        );
        let finished = WorkloadBuilder::new("team", "wl")
            .uid("u1")
            .check("prov", CheckState::Ready)
            .quota_reserved("cq", "default")
            .finished()
            .build();
        assert!(
            orphan_reason(&r, Some(&finished), &ClusterQueues::default())
                .is_some_and(|m| m.contains("finished"))
        );
        let no_quota = WorkloadBuilder::new("team", "wl")
            .uid("u1")
            .check("prov", CheckState::Pending)
            .build();
        assert!(orphan_reason(&r, Some(&no_quota), &ClusterQueues::default()).is_some());
        assert!(
            orphan_reason(&r, Some(&holding(Some(1))), &ClusterQueues::default())
                .is_some_and(|m| m.contains("superseded by attempt 2"))
        );
        // The check was removed from the Workload's ClusterQueue.
        let other_check = request("wl-gone-1", "u1", "gone");
        assert!(
            orphan_reason(
                &other_check,
                Some(&holding(None)),
                &ClusterQueues::default()
            )
            .is_some()
        );
    }

    #[test]
    fn a_booking_used_up_by_its_pods_is_not_counted_as_expired() {
        let with_booking_ended = |reason: &str| {
            let mut r = request("wl-prov-1", "u1", "prov");
            r.status = Some(kueue_admission_sdk::api::ProvisioningRequestStatus {
                conditions: vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                    type_: pr::BOOKING_EXPIRED.into(),
                    status: "True".into(),
                    reason: reason.into(),
                    message: String::new(),
                    last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        Timestamp::now(),
                    ),
                    observed_generation: None,
                }],
                ..Default::default()
            });
            r
        };
        let expired = with_booking_ended("CapacityReservationTimeExpired");
        assert!(counted_conditions(&expired).contains(pr::BOOKING_EXPIRED));
        assert!(matches!(
            transition(&expired, pr::BOOKING_EXPIRED),
            Some(Transition::BookingExpired)
        ));
        let consumed = with_booking_ended(crate::outcome::BOOKING_CONSUMED);
        assert!(counted_conditions(&consumed).is_empty());
    }

    #[test]
    fn a_request_made_before_the_entry_is_kept_while_the_entry_is_due() {
        let queue = |on_flavors: &[&str]| {
            ClusterQueues::for_tests([kueue_admission_sdk::testing::cluster_queue(
                "cq",
                &["default", "gpu"],
                &[("prov", on_flavors)],
            )])
        };
        let r = request("wl-prov-1", "u1", "prov");
        let no_entry_yet = WorkloadBuilder::new("team", "wl")
            .uid("u1")
            .pod_set("main", 1, "1")
            .quota_reserved("cq", "default")
            .build();
        assert_eq!(orphan_reason(&r, Some(&no_entry_yet), &queue(&[])), None);
        assert_eq!(
            orphan_reason(&r, Some(&no_entry_yet), &queue(&["default"])),
            None
        );
        // The queue applies the check to other flavors only, or no queue is known.
        assert!(orphan_reason(&r, Some(&no_entry_yet), &queue(&["gpu"])).is_some());
        assert!(orphan_reason(&r, Some(&no_entry_yet), &ClusterQueues::default()).is_some());
        // Queues not listed yet (or refused) are no reason to delete what was made early.
        let unknown = ClusterQueues::unknown_for_tests();
        assert_eq!(orphan_reason(&r, Some(&no_entry_yet), &unknown), None);
        // The entry never came and the quota went.
        let released = WorkloadBuilder::new("team", "wl").uid("u1").build();
        assert!(
            orphan_reason(&r, Some(&released), &queue(&[]))
                .is_some_and(|m| m.contains("quota released"))
        );
    }
}

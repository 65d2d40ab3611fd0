//! Keeping the Nodes made for an admitted Workload until its pods are on them.
//!
//! At `Ready` the check shrinks the Workload's buffers to zero, before Kueue admits and so
//! before any of its pods exist: Karpenter never sees the Workload's virtual pods and its real
//! pods at once (it would launch capacity for both). From then until the pods are bound the
//! Nodes are empty, and Karpenter consolidates empty Nodes; so first the check puts
//! Karpenter's `karpenter.sh/do-not-disrupt: "true"` on them, with annotations of its own
//! saying for which Workload, for how many pods and until when. The task here removes them
//! once that many of the Workload's pods (which carry its uid as a label, a pod set update of
//! the answer) are bound, once the time is up, or once the Workload is gone; the check's
//! `release` removes them when the Workload finishes, is evicted or deleted. A do-not-disrupt
//! this controller did not put there is never removed.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use kueue_admission_sdk::LeaderContext;
use kueue_admission_sdk::watched_cache::WatchedCache;
use serde_json::{Value, json};
use tracing::{info, warn};

use crate::api::{DO_NOT_DISRUPT, NODEPOOL_LABEL};
use crate::error::Error;
use crate::metrics::{Metrics, ProtectionEnd};
use crate::names::{
    PROTECTED_BY_ANNOTATION, PROTECTED_FOR_ANNOTATION, PROTECTED_PODS_ANNOTATION,
    PROTECTED_UNTIL_ANNOTATION, WORKLOAD_UID_LABEL,
};

/// A protection this controller put on a Node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Protection {
    /// The instance of this controller that put it there (see [`crate::names::instance`]).
    pub by: String,
    /// The Workload's uid.
    pub uid: String,
    /// Its pods that must be bound.
    pub pods: u32,
    /// When it ends at the latest.
    pub until: Timestamp,
}

/// What is kept of a Karpenter Node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeView {
    /// Ours, if this controller protects it.
    pub protection: Option<Protection>,
    /// It carries a do-not-disrupt that is not ours (never touched).
    pub held_by_others: bool,
}

/// Reads a Node's annotations.
pub fn node_view(annotations: &BTreeMap<String, String>) -> NodeView {
    let ours = annotations
        .get(PROTECTED_FOR_ANNOTATION)
        .map(|uid| Protection {
            by: annotations
                .get(PROTECTED_BY_ANNOTATION)
                .cloned()
                .unwrap_or_default(),
            uid: uid.clone(),
            pods: annotations
                .get(PROTECTED_PODS_ANNOTATION)
                .and_then(|p| p.parse().ok())
                .unwrap_or(0),
            // An unreadable end (edited by hand) ends it now.
            until: annotations
                .get(PROTECTED_UNTIL_ANNOTATION)
                .and_then(|t| t.parse().ok())
                .unwrap_or(Timestamp::UNIX_EPOCH),
        });
    NodeView {
        held_by_others: ours.is_none() && annotations.contains_key(DO_NOT_DISRUPT),
        protection: ours,
    }
}

/// The merge patch that protects a Node for `protection`.
pub fn protect_patch(p: &Protection) -> Value {
    let until = p.until.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    json!({"metadata": {"annotations": {
        DO_NOT_DISRUPT: "true",
        PROTECTED_BY_ANNOTATION: p.by,
        PROTECTED_FOR_ANNOTATION: p.uid,
        PROTECTED_PODS_ANNOTATION: p.pods.to_string(),
        PROTECTED_UNTIL_ANNOTATION: until,
    }}})
}

/// The merge patch that removes a protection of ours.
pub fn release_patch() -> Value {
    json!({"metadata": {"annotations": {
        DO_NOT_DISRUPT: null,
        PROTECTED_BY_ANNOTATION: null,
        PROTECTED_FOR_ANNOTATION: null,
        PROTECTED_PODS_ANNOTATION: null,
        PROTECTED_UNTIL_ANNOTATION: null,
    }}})
}

/// What to do with a protection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Keep it; look again at this time at the latest.
    Keep(Timestamp),
    /// End it.
    End(ProtectionEnd),
}

/// Pure: whether `p` still holds with `bound` of its Workload's pods bound, at `now`.
pub fn verdict(p: &Protection, bound: u32, workload_exists: bool, now: Timestamp) -> Verdict {
    if !workload_exists {
        Verdict::End(ProtectionEnd::Released)
    } else if bound >= p.pods {
        Verdict::End(ProtectionEnd::PodsBound)
    } else if now >= p.until {
        Verdict::End(ProtectionEnd::Expired)
    } else {
        Verdict::Keep(p.until)
    }
}

/// A Node, reduced to what is read.
pub fn kept_node(node: &Node) -> NodeView {
    node_view(node.annotations())
}

/// A pod of a Workload this check answered: its Workload's uid and whether it is bound.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodView {
    /// The Workload's uid (the pod's label).
    pub uid: String,
    /// Bound to a Node.
    pub bound: bool,
}

fn kept_pod(pod: &Pod) -> PodView {
    PodView {
        uid: pod
            .labels()
            .get(WORKLOAD_UID_LABEL)
            .cloned()
            .unwrap_or_default(),
        bound: pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .is_some(),
    }
}

fn pod_group(p: &PodView) -> Option<String> {
    Some(p.uid.clone())
}

/// Karpenter's Nodes (label `karpenter.sh/nodepool`), with the protections on them.
pub type NodeCache = WatchedCache<NodeView>;

/// A cache of Karpenter's Nodes.
pub fn node_cache() -> Arc<NodeCache> {
    Arc::new(WatchedCache::new("nodes"))
}

/// Protects `node` for `p`, unless it carries a do-not-disrupt of someone else's.
pub async fn protect(
    client: &Client,
    nodes: &NodeCache,
    node: &str,
    p: &Protection,
) -> Result<bool, Error> {
    let key = (String::new(), node.to_string());
    let theirs =
        |n: &NodeView| n.held_by_others || n.protection.as_ref().is_some_and(|o| o.by != p.by);
    if nodes.get(&key)?.is_some_and(|n| theirs(&n)) {
        return Ok(false);
    }
    let api: Api<Node> = Api::all(client.clone());
    api.patch(
        node,
        &PatchParams::default(),
        &Patch::Merge(protect_patch(p)),
    )
    .await
    .map_err(Error::api("patch", "Node", "", node))?;
    Ok(true)
}

/// Removes our protection from `node`.
pub async fn unprotect(client: &Client, node: &str) -> Result<(), Error> {
    let api: Api<Node> = Api::all(client.clone());
    match api
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(release_patch()),
        )
        .await
    {
        Ok(_) => Ok(()),
        // Gone: nothing left to protect.
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(Error::api("patch", "Node", "", node)(e)),
    }
}

/// Removes every protection of ours for the Workload `uid`; returns how many.
pub async fn unprotect_workload(
    client: &Client,
    nodes: &NodeCache,
    instance: &str,
    uid: &str,
) -> Result<usize, Error> {
    let ours = |n: &NodeView| {
        n.protection
            .as_ref()
            .is_some_and(|p| p.by == instance && p.uid == uid)
    };
    let protected = nodes.select(|_, n| ours(n))?;
    for ((_, name), _) in &protected {
        unprotect(client, name).await?;
        info!(node = %name, workload_uid = uid, "released the Node's protection: the Workload released the check");
    }
    Ok(protected.len())
}

/// The task: watches Karpenter's Nodes and the pods of answered Workloads, and ends each
/// protection when its verdict says so. Runs until dropped.
pub async fn watch_protections(
    ctx: LeaderContext,
    nodes: Arc<NodeCache>,
    metrics: Arc<Metrics>,
    instance: String,
) {
    let pods = Arc::new(WatchedCache::grouped("pods", pod_group));
    let node_events = nodes.clone().watch(
        Api::<Node>::all(ctx.client.clone()),
        watcher::Config::default().labels(NODEPOOL_LABEL),
        kept_node,
    );
    let pod_events = pods.clone().watch(
        Api::<Pod>::all(ctx.client.clone()),
        watcher::Config::default().labels(WORKLOAD_UID_LABEL),
        kept_pod,
    );
    let mut changes = futures::stream::select(
        Box::pin(node_events).map(|_| ()),
        Box::pin(pod_events).map(|_| ()),
    );
    let mut next: Option<Timestamp> = None;
    // Protections this task ended whose end the watch has not delivered yet: not ended twice.
    let mut ended: HashSet<(String, String)> = HashSet::new();
    loop {
        let wait = next.map(|at| {
            let left = at.duration_since(Timestamp::now());
            Duration::try_from(left).unwrap_or_default()
        });
        tokio::select! {
            change = changes.next() => if change.is_none() { return },
            () = tokio::time::sleep(wait.unwrap_or(Duration::from_secs(3600))), if wait.is_some() => {}
        }
        next = review(&ctx, &nodes, &pods, &metrics, &instance, &mut ended).await;
    }
}

/// Ends what is due; returns when to look again.
async fn review(
    ctx: &LeaderContext,
    nodes: &NodeCache,
    pods: &WatchedCache<PodView>,
    metrics: &Metrics,
    instance: &str,
    ended: &mut HashSet<(String, String)>,
) -> Option<Timestamp> {
    let ours = |n: &NodeView| n.protection.as_ref().is_some_and(|p| p.by == instance);
    let Ok(protected) = nodes.select(|_, n| ours(n)) else {
        return None;
    };
    // Forget the ends the watch has delivered.
    ended.retain(|(node, uid)| {
        protected
            .iter()
            .any(|((_, n), v)| n == node && v.protection.as_ref().is_some_and(|p| &p.uid == uid))
    });
    let protected: Vec<_> = protected
        .into_iter()
        .filter(|((_, n), v)| {
            let uid = v
                .protection
                .as_ref()
                .map(|p| p.uid.clone())
                .unwrap_or_default();
            !ended.contains(&(n.clone(), uid))
        })
        .collect();
    metrics.set_protected(protected.len());
    if protected.is_empty() || !pods.settled() {
        return None;
    }
    let live: HashSet<String> = ctx
        .workloads
        .state()
        .iter()
        .filter_map(|w| w.uid())
        .collect();
    let now = Timestamp::now();
    let mut next: Option<Timestamp> = None;
    for ((_, name), view) in protected {
        let Some(p) = view.protection else { continue };
        let bound = pods
            .select_group(&p.uid, |_, _| true)
            .map(|ps| ps.iter().filter(|(_, v)| v.bound).count())
            .unwrap_or(0);
        match verdict(
            &p,
            u32::try_from(bound).unwrap_or(u32::MAX),
            live.contains(&p.uid),
            now,
        ) {
            Verdict::Keep(at) => next = Some(next.map_or(at, |n| n.min(at))),
            Verdict::End(why) => match unprotect(&ctx.client, &name).await {
                Ok(()) => {
                    ended.insert((name.clone(), p.uid.clone()));
                    metrics.protection_ended(why);
                    info!(node = %name, workload_uid = %p.uid, ?why, bound, "released the Node's protection");
                }
                Err(e) => {
                    warn!(node = %name, error = %e, "could not release the Node's protection; trying again");
                    let again = now + std::time::Duration::from_secs(5);
                    next = Some(next.map_or(again, |n| n.min(again)));
                }
            },
        }
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).expect("time")
    }

    #[test]
    fn a_protection_reads_back_from_the_annotations_it_writes() {
        let p = Protection {
            by: "cb-1".into(),
            uid: "uid-1".into(),
            pods: 3,
            until: t(600),
        };
        let patch = protect_patch(&p);
        let annotations: BTreeMap<String, String> =
            serde_json::from_value(patch["metadata"]["annotations"].clone()).expect("strings");
        assert_eq!(annotations[DO_NOT_DISRUPT], "true");
        let view = node_view(&annotations);
        assert_eq!(view.protection, Some(p));
        assert!(!view.held_by_others);
        // Someone else's do-not-disrupt is seen as theirs.
        let theirs = BTreeMap::from([(DO_NOT_DISRUPT.to_string(), "true".to_string())]);
        assert_eq!(
            node_view(&theirs),
            NodeView {
                protection: None,
                held_by_others: true
            }
        );
        // The release patch removes exactly what protect wrote.
        let release = release_patch();
        let removed: Vec<&String> = release["metadata"]["annotations"]
            .as_object()
            .expect("map")
            .keys()
            .collect();
        let written: Vec<&String> = annotations.keys().collect();
        assert_eq!(removed, written);
    }

    #[test]
    fn a_protection_ends_when_the_pods_are_bound_the_time_is_up_or_the_workload_is_gone() {
        let p = Protection {
            by: "cb-1".into(),
            uid: "u".into(),
            pods: 2,
            until: t(600),
        };
        assert_eq!(verdict(&p, 1, true, t(10)), Verdict::Keep(t(600)));
        assert_eq!(
            verdict(&p, 2, true, t(10)),
            Verdict::End(ProtectionEnd::PodsBound)
        );
        assert_eq!(
            verdict(&p, 0, true, t(600)),
            Verdict::End(ProtectionEnd::Expired)
        );
        assert_eq!(
            verdict(&p, 0, false, t(10)),
            Verdict::End(ProtectionEnd::Released)
        );
        // An unreadable end, edited by hand, ends it at once.
        let mut hand = BTreeMap::from([(PROTECTED_FOR_ANNOTATION.to_string(), "u".to_string())]);
        hand.insert(PROTECTED_UNTIL_ANNOTATION.into(), "soon".into());
        let read = node_view(&hand).protection.expect("ours");
        assert_eq!(
            verdict(&read, 0, true, t(0)),
            Verdict::End(ProtectionEnd::PodsBound)
        );
    }
}

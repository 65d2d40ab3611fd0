//! Scale-ups (the atomic one of best-effort requests, the ordinary one of unschedulable pods)
//! and scale-down, on the kwok provider's node groups (rule 18).
//!
//! Choosing among fitting groups: cluster-autoscaler's default expander is `random`; the
//! simulator is deterministic instead, and takes the group that helps the most pods, then the
//! one needing the fewest Nodes, then the first in the node-groups file.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::{LoopState, NodeCreation};
use crate::fit::{PodShape, binpack};
use crate::node_groups::{NodeGroup, fresh_room, group_of, is_kwok_managed};
use crate::settings::Settings;
use crate::snapshot::{ClusterView, Snapshot};

/// Annotation that keeps cluster-autoscaler from removing a Node.
pub const SCALE_DOWN_DISABLED_ANNOTATION: &str =
    "cluster-autoscaler.kubernetes.io/scale-down-disabled";

/// The live Nodes of `group` (its size, as the kwok provider's refresh counts it).
pub fn group_nodes<'a>(settings: &Settings, view: &'a ClusterView, group: &str) -> Vec<&'a Node> {
    view.nodes
        .iter()
        .filter(|n| group_of(n, &settings.node_group_label).as_deref() == Some(group))
        .collect()
}

fn is_ready(node: &Node) -> bool {
    let conditions = node.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// A fresh Node of `group` as estimates see it: a copy of a live Ready schedulable Node of the
/// group if there is one (no kube-proxy pod then), else the template with a kube-proxy pod.
fn fresh(settings: &Settings, view: &ClusterView, group: &NodeGroup) -> crate::fit::NodeRoom {
    let copies = group_nodes(settings, view, &group.name).iter().any(|n| {
        is_ready(n)
            && !n
                .spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false)
    });
    fresh_room(group, copies)
}

/// How many Nodes one scale-up may add to `group`: up to its max count and
/// `max_nodes_per_scaleup`.
fn headroom(settings: &Settings, view: &ClusterView, group: &NodeGroup) -> usize {
    let size = group_nodes(settings, view, &group.name).len();
    let max = usize::try_from(group.max_count).unwrap_or(usize::MAX);
    max.saturating_sub(size).min(settings.max_nodes_per_scaleup)
}

/// Rules 8, 9 and 18: the one group (and how many Nodes) that takes every pod of `pods` on
/// fresh Nodes within its headroom; `None` if no group does (then nothing is created: never a
/// partial scale-up).
pub fn atomic_option(
    settings: &Settings,
    view: &ClusterView,
    pods: &[PodShape],
) -> Option<(String, usize)> {
    let mut best: Option<(String, usize)> = None;
    for group in &settings.node_groups {
        let packed = binpack(&fresh(settings, view, group), pods, usize::MAX);
        if packed.placed.len() != pods.len() || packed.nodes > headroom(settings, view, group) {
            continue;
        }
        if best.as_ref().is_none_or(|(_, n)| packed.nodes < *n) {
            best = Some((group.name.clone(), packed.nodes));
        }
    }
    best
}

/// Rules 17 and 18: the ordinary (non-atomic) scale-up for unschedulable pods that consume no
/// request: the group that helps the most of them, its Nodes capped by its headroom (a partial
/// scale-up is fine here).
pub fn regular_scale_up(
    settings: &Settings,
    view: &ClusterView,
    pods: &[PodShape],
) -> Option<NodeCreation> {
    let mut best: Option<(usize, usize, &NodeGroup)> = None;
    for group in &settings.node_groups {
        let room = headroom(settings, view, group);
        if room == 0 {
            continue;
        }
        let packed = binpack(&fresh(settings, view, group), pods, room);
        let helped = packed.placed.len();
        if helped == 0 {
            continue;
        }
        let better = best.is_none_or(|(h, n, _)| helped > h || (helped == h && packed.nodes < n));
        if better {
            best = Some((helped, packed.nodes, group));
        }
    }
    best.map(|(_, nodes, group)| NodeCreation {
        group: group.name.clone(),
        count: nodes,
        if_refused: None,
    })
}

/// Scale-down: a kwok-managed Node of a configured group with no pod that keeps it (see
/// [`Snapshot::blockers`]: bound pods other than DaemonSet and mirror ones, booked pods,
/// unschedulable pods about to land there) is unneeded from now on; unneeded for
/// `scale_down_unneeded_time`, it is deleted, oldest first, as long as its group stays at or
/// above its min count. Nothing is deleted within `scale_down_delay_after_add` of the last
/// scale-up (`state.last_scale_up`, this loop's included), though Nodes still become unneeded
/// meanwhile, as in cluster-autoscaler's cooldown.
pub fn scale_down(
    settings: &Settings,
    view: &ClusterView,
    snapshot: &Snapshot,
    state: &mut LoopState,
    now: Timestamp,
) -> Vec<String> {
    let mut unneeded = BTreeMap::new();
    for group in &settings.node_groups {
        for node in group_nodes(settings, view, &group.name) {
            let name = node.name_any();
            let disabled = node
                .annotations()
                .get(SCALE_DOWN_DISABLED_ANNOTATION)
                .map(String::as_str)
                == Some("true");
            let blocked = snapshot
                .index_of(&name)
                .is_none_or(|i| snapshot.blockers[i] > 0);
            if is_kwok_managed(node)
                && !disabled
                && !blocked
                && node.metadata.deletion_timestamp.is_none()
            {
                let since = state.unneeded_since.get(&name).copied().unwrap_or(now);
                unneeded.insert(name, (since, group));
            }
        }
    }
    state.unneeded_since = unneeded
        .iter()
        .map(|(n, (since, _))| (n.clone(), *since))
        .collect();
    let cooling = state.last_scale_up.is_some_and(|at| {
        at == now || !super::older_than(at, settings.scale_down_delay_after_add, now)
    });
    if cooling {
        return Vec::new();
    }
    let mut due: Vec<_> = unneeded
        .into_iter()
        .filter(|(_, (since, _))| {
            since
                .checked_add(settings.scale_down_unneeded_time)
                .is_ok_and(|due| due <= now)
        })
        .collect();
    due.sort_by(|a, b| (a.1.0, &a.0).cmp(&(b.1.0, &b.0)));
    let mut left: BTreeMap<&str, usize> = settings
        .node_groups
        .iter()
        .map(|g| (g.name.as_str(), group_nodes(settings, view, &g.name).len()))
        .collect();
    let mut deleted = Vec::new();
    for (name, (_, group)) in due {
        let size = left.entry(group.name.as_str()).or_insert(0);
        if *size > usize::try_from(group.min_count).unwrap_or(usize::MAX) {
            *size -= 1;
            deleted.push(name);
        }
    }
    deleted
}

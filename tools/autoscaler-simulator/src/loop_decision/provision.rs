//! The requests turn of a loop: check-capacity and best-effort-atomic-scale-up on the picked
//! request(s).

use kueue_admission_sdk::api::provisioning_condition::{FAILED, PROVISIONED};

use super::requests::accept;
use super::scale::atomic_option;
use super::{Handling, NodeCreation, Work};
use crate::conditions::{NO_RETRY_PARAMETER, reason};
use crate::fit::PodShape;
use crate::snapshot::Snapshot;

/// Processes the picked requests on `snapshot`; the Nodes a best-effort request scales up.
pub(super) fn provision(
    work: &mut Work<'_>,
    picked: &[(usize, Vec<PodShape>)],
    snapshot: &mut Snapshot,
) -> Vec<NodeCreation> {
    let mut creations = Vec::new();
    for (i, pods) in picked {
        match work.requests[*i].handling {
            Handling::CheckCapacity => check_capacity(work, *i, pods, snapshot),
            Handling::BestEffort => creations.extend(best_effort(work, *i, pods, snapshot)),
            Handling::Scripted | Handling::Unsupported => {}
        }
    }
    creations
}

/// Rules 5, 6 and 7: Accepted (rewritten), then Provisioned=True/`CapacityIsFound` if every pod
/// fits the snapshot (existing and upcoming Nodes, minus bound pods and bookings; the pods then
/// stay in the snapshot for the rest of the batch), else Failed=True/`CapacityIsNotFound` with
/// `noRetry: "true"` or Provisioned=False/`CapacityIsNotFound` (retried after the backoff).
/// Never adds Nodes.
fn check_capacity(work: &mut Work<'_>, i: usize, pods: &[PodShape], snapshot: &mut Snapshot) {
    let now = work.now;
    let req = &mut work.requests[i];
    accept(req, now);
    let count = pods.len();
    if snapshot.place_all(pods) {
        let message = format!("All {count} pods fit the capacity the cluster has now.");
        req.set(PROVISIONED, true, reason::CAPACITY_IS_FOUND, message, now);
        work.capacity_found = true;
    } else if req
        .object
        .spec
        .parameters
        .get(NO_RETRY_PARAMETER)
        .map(String::as_str)
        == Some("true")
    {
        let message = format!(
            "The {count} pods do not all fit the cluster's capacity, and noRetry is set: no \
             further try."
        );
        req.set(FAILED, true, reason::CAPACITY_IS_NOT_FOUND, message, now);
    } else {
        let message = format!(
            "The {count} pods do not all fit the cluster's capacity; another check comes after a \
             backoff."
        );
        req.set(
            PROVISIONED,
            false,
            reason::CAPACITY_IS_NOT_FOUND,
            message,
            now,
        );
    }
}

/// Rules 5, 8 and 9: Accepted (written on the pick), then Provisioned=True/`CapacityIsFound` if
/// every pod fits existing capacity; else one node group must take all the pods that do not
/// within its max count and `max_nodes_per_scaleup`: its Nodes are created and
/// Provisioned=True/`CapacityIsProvisioned` is written at once; else no Node at all and
/// Provisioned=False/`CapacityIsNotFound`. `noRetry` is ignored.
fn best_effort(
    work: &mut Work<'_>,
    i: usize,
    pods: &[PodShape],
    snapshot: &Snapshot,
) -> Option<NodeCreation> {
    let now = work.now;
    let mut fork = snapshot.clone();
    let remaining = fork.place_each(pods);
    let count = pods.len();
    if remaining.is_empty() {
        let message = format!("All {count} pods fit the capacity the cluster has now.");
        work.requests[i].set(PROVISIONED, true, reason::CAPACITY_IS_FOUND, message, now);
        return None;
    }
    let not_found = format!(
        "{} of the {count} pods fit neither the cluster nor one node group within its limits; \
         another try comes after a backoff.",
        remaining.len()
    );
    let Some((group, nodes)) = atomic_option(work.settings, work.view, &remaining) else {
        work.requests[i].set(
            PROVISIONED,
            false,
            reason::CAPACITY_IS_NOT_FOUND,
            not_found,
            now,
        );
        return None;
    };
    let mut refused = work.requests[i].clone();
    refused.set(
        PROVISIONED,
        false,
        reason::CAPACITY_IS_NOT_FOUND,
        not_found,
        now,
    );
    let message = format!(
        "A scale-up of {nodes} Node(s) in node group {group} was requested for the {} pods that \
         did not fit.",
        remaining.len()
    );
    work.requests[i].set(
        PROVISIONED,
        true,
        reason::CAPACITY_IS_PROVISIONED,
        message,
        now,
    );
    Some(NodeCreation {
        group,
        count: nodes,
        if_refused: Some(refused.write()),
    })
}

//! For the examples' unit tests: drivers that call a check the way the runtime does (a release,
//! many decisions at once), against the SDK's [`MemoryApi`] that holds the check's ConfigMaps
//! and Workloads.

use futures::future::try_join_all;
use k8s_openapi::jiff::Timestamp;
use kube::{Client, ResourceExt};
use kueue_admission_sdk::api::Workload;
use kueue_admission_sdk::testing::{MemoryApi, decide_with_client};
use kueue_admission_sdk::{AdmissionCheckController, Decision, ReleaseContext, ReleaseReason};

/// Calls `controller.release` once for `workload`'s entry of `check`, as the runtime does when
/// the Workload ends for `reason` at `now`, with `client`.
pub async fn release_once<C: AdmissionCheckController>(
    controller: &C,
    client: &Client,
    workload: &Workload,
    check: &str,
    reason: ReleaseReason,
    now: Timestamp,
) -> Result<(), C::Error> {
    let ctx = ReleaseContext {
        namespace: &workload.namespace().unwrap_or_default(),
        name: &workload.name_any(),
        workload: Some(workload),
        check_name: check,
        reason,
        client,
        now,
    };
    controller.release(&ctx).await
}

/// Stores every Workload in `api`, then decides for all at once, the i-th by
/// `replicas[i % replicas.len()]` (at least one replica), each with a client of `api`: replicas
/// that share nothing but the API server, like two controllers without a common lock. Returns
/// every decision, and the names of the Workloads told `Ready`, in order.
pub async fn decide_concurrently<C: AdmissionCheckController>(
    replicas: &[C],
    api: &MemoryApi,
    workloads: &[Workload],
    check: &str,
    parameters: &C::Parameters,
) -> Result<(Vec<Decision>, Vec<String>), C::Error> {
    for wl in workloads {
        api.put(wl);
    }
    let client = &api.client();
    let decisions = try_join_all(workloads.iter().enumerate().map(|(i, wl)| {
        let replica = &replicas[i % replicas.len()];
        decide_with_client(replica, client, wl, check, parameters)
    }))
    .await?;
    let ready = workloads
        .iter()
        .zip(&decisions)
        .filter(|(_, d)| matches!(d, Decision::Ready { .. }))
        .map(|(wl, _)| wl.name_any())
        .collect();
    Ok((decisions, ready))
}

//! The I/O part of `explain`: read everything the report needs about one Workload. Read-only:
//! get and list, nothing else (the RBAC is in the crate's README).

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, PodTemplate};
use kube::api::{Api, ListParams};
use kube::{Client, Resource, ResourceExt};
use kueue_admission_sdk::api::{
    AdmissionCheck, ClusterQueue, KUEUE_GROUP, LocalQueue, ProvisioningRequest,
    ProvisioningRequestConfig, Workload,
};
use kueue_provisioning_controller::identity::WORKLOAD_UID_LABEL;

use crate::Error;
use crate::report::Snapshot;

/// What to explain: a Workload, or the Job that owns one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// `workload/NAME`.
    Workload(String),
    /// `job/NAME`.
    Job(String),
    /// A bare `NAME`: a Workload of that name, else a Job.
    Either(String),
}

impl std::str::FromStr for Target {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (kind, name) = match s.split_once('/') {
            Some((kind, name)) => (Some(kind), name),
            None => (None, s),
        };
        if name.is_empty() {
            return Err(format!(
                "{s:?}: no name; use NAME, workload/NAME or job/NAME"
            ));
        }
        match kind.map(str::to_ascii_lowercase).as_deref() {
            None => Ok(Self::Either(name.into())),
            Some("workload" | "workloads" | "wl" | "workload.kueue.x-k8s.io") => {
                Ok(Self::Workload(name.into()))
            }
            Some("job" | "jobs" | "job.batch") => Ok(Self::Job(name.into())),
            Some(other) => Err(format!(
                "{other:?} is not a kind explain knows; use workload/NAME or job/NAME"
            )),
        }
    }
}

/// The Workload `target` names in `namespace`: a Workload of that name, or the one a Job
/// of that name owns.
pub async fn workload(
    client: &Client,
    namespace: &str,
    target: &Target,
) -> Result<Workload, Error> {
    let workloads: Api<Workload> = Api::namespaced(client.clone(), namespace);
    match target {
        Target::Workload(name) => workloads
            .get_opt(name)
            .await?
            .ok_or_else(|| Error::NotFound(format!("Workload {namespace}/{name}"))),
        Target::Job(name) => workload_of_job(client, namespace, name).await,
        Target::Either(name) => match workloads.get_opt(name).await? {
            Some(wl) => Ok(wl),
            None => workload_of_job(client, namespace, name)
                .await
                .map_err(|e| match e {
                    Error::NotFound(_) => Error::NotFound(format!(
                        "no Workload or Job named {name} in namespace {namespace}"
                    )),
                    other => other,
                }),
        },
    }
}

/// Reads the Workload `target` names in `namespace` and everything around it.
pub async fn snapshot(
    client: &Client,
    namespace: &str,
    target: &Target,
) -> Result<Snapshot, Error> {
    let workload = workload(client, namespace, target).await?;
    let uid = workload.uid().unwrap_or_default();
    let owner = workload
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
        .or_else(|| workload.owner_references().first())
        .map(|o| format!("{}/{}", o.kind, o.name));

    let local_queue = match &workload.spec.queue_name {
        Some(name) => {
            Api::<LocalQueue>::namespaced(client.clone(), namespace)
                .get_opt(name)
                .await?
        }
        None => None,
    };
    let cluster_queue_name = workload
        .status
        .as_ref()
        .and_then(|s| s.admission.as_ref())
        .map(|a| a.cluster_queue.clone())
        .or_else(|| local_queue.as_ref().map(|lq| lq.spec.cluster_queue.clone()));
    let cluster_queue = match &cluster_queue_name {
        Some(name) => {
            Api::<ClusterQueue>::all(client.clone())
                .get_opt(name)
                .await?
        }
        None => None,
    };

    let (admission_checks, provisioning_configs) = checks_of(client, &workload).await?;
    let (provisioning_requests, pod_templates) = made_for(client, namespace, &uid).await?;
    let events = Api::<Event>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().fields(&format!(
            "involvedObject.kind=Workload,involvedObject.name={}",
            workload.name_any()
        )))
        .await?
        .items
        .into_iter()
        // Events about an earlier Workload of the same name are not this one's.
        .filter(|e| e.involved_object.uid.as_deref().is_none_or(|u| u == uid))
        .collect();

    Ok(Snapshot {
        workload,
        owner,
        cluster_queue_name,
        cluster_queue,
        local_queue_exists: Some(local_queue.is_some()),
        admission_checks,
        provisioning_configs,
        provisioning_requests,
        pod_templates,
        events,
    })
}

/// The AdmissionChecks named by the Workload's entries, and the ProvisioningRequestConfigs
/// they name, by check.
async fn checks_of(
    client: &Client,
    workload: &Workload,
) -> Result<
    (
        BTreeMap<String, AdmissionCheck>,
        BTreeMap<String, ProvisioningRequestConfig>,
    ),
    Error,
> {
    let mut admission_checks = BTreeMap::new();
    let mut provisioning_configs = BTreeMap::new();
    let entries = workload
        .status
        .as_ref()
        .map(|s| s.admission_checks.clone())
        .unwrap_or_default();
    for entry in &entries {
        let Some(ac) = Api::<AdmissionCheck>::all(client.clone())
            .get_opt(&entry.name)
            .await?
        else {
            continue;
        };
        if let Some(p) = ac.spec.parameters.as_ref().filter(|p| {
            p.api_group == KUEUE_GROUP && p.kind == ProvisioningRequestConfig::kind(&())
        }) && let Some(config) = Api::<ProvisioningRequestConfig>::all(client.clone())
            .get_opt(&p.name)
            .await?
        {
            provisioning_configs.insert(entry.name.clone(), config);
        }
        admission_checks.insert(entry.name.clone(), ac);
    }
    Ok((admission_checks, provisioning_configs))
}

/// The ProvisioningRequests and the names of the PodTemplates made for the Workload of `uid`
/// (ours by label, Kueue's by owner).
async fn made_for(
    client: &Client,
    namespace: &str,
    uid: &str,
) -> Result<(Vec<ProvisioningRequest>, Vec<String>), Error> {
    let made_for = |meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        meta.labels
            .as_ref()
            .and_then(|l| l.get(WORKLOAD_UID_LABEL))
            .is_some_and(|u| *u == uid)
            || meta
                .owner_references
                .as_ref()
                .is_some_and(|o| o.iter().any(|o| o.uid == uid))
    };
    // A cluster without the ProvisioningRequest CRD has none to show.
    let provisioning_requests =
        match Api::<ProvisioningRequest>::namespaced(client.clone(), namespace)
            .list(&ListParams::default())
            .await
        {
            Ok(list) => list
                .items
                .into_iter()
                .filter(|p| made_for(&p.metadata))
                .collect(),
            Err(kube::Error::Api(e)) if e.code == 404 => Vec::new(),
            Err(e) => return Err(e.into()),
        };
    let pod_templates = Api::<PodTemplate>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|t| made_for(&t.metadata))
        .map(|t| t.name_any())
        .collect();
    Ok((provisioning_requests, pod_templates))
}

/// The Workload Kueue made for Job `name` (it owns the Workload).
async fn workload_of_job(client: &Client, namespace: &str, name: &str) -> Result<Workload, Error> {
    let job = Api::<Job>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await?
        .ok_or_else(|| Error::NotFound(format!("Job {namespace}/{name}")))?;
    let uid = job.uid().unwrap_or_default();
    Api::<Workload>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .find(|wl| wl.owner_references().iter().any(|o| o.uid == uid))
        .ok_or_else(|| {
            Error::NoWorkload(format!(
                "Job {namespace}/{name} has no Workload: Kueue makes one only for a Job labelled \
                 kueue.x-k8s.io/queue-name (and created suspended, or by Kueue's webhook)"
            ))
        })
}

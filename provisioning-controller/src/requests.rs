//! Deleting what this instance made: a Workload's requests, one request with the templates
//! made with it, an object by uid. Nothing is deleted that the identity rule
//! ([`crate::identity::ownership`]) does not call ours.

use std::sync::Arc;

use k8s_openapi::api::core::v1::PodTemplate;
use kube::api::{Api, DeleteParams, ListParams, Preconditions};
use kube::{Client, ResourceExt};
use kueue_admission_sdk::api::{ProvisioningRequest, Workload};

use crate::error::Error;
use crate::identity;
use crate::identity::{INSTANCE_LABEL, Identity, Ownership, ownership};
use kueue_admission_sdk::watched_cache::WatchedCache;

/// This instance's requests as the leader's watch of them delivered them.
pub type RequestCache = WatchedCache<Arc<ProvisioningRequest>>;

/// An empty [`RequestCache`], not listed yet.
pub fn request_cache() -> Arc<RequestCache> {
    Arc::new(WatchedCache::grouped(
        "provisioningrequests.autoscaling.x-k8s.io",
        workload_uid_of,
    ))
}

/// The uid of the Workload a request was made for (its label): the cache's groups, so that a
/// Workload's requests are found without going through every request (a burst of thousands
/// in one namespace made that the controller's main cost).
fn workload_uid_of(request: &Arc<ProvisioningRequest>) -> Option<String> {
    request
        .labels()
        .get(identity::WORKLOAD_UID_LABEL)
        .filter(|uid| !uid.is_empty())
        .cloned()
}

/// What the cache keeps of a request: all but its managedFields.
pub fn kept(request: &ProvisioningRequest) -> Arc<ProvisioningRequest> {
    let mut kept = request.clone();
    kept.metadata.managed_fields = None;
    Arc::new(kept)
}

/// Deletes the requests of `wl` for `check` that `which` selects, with their templates: only
/// those this instance made for this Workload and check ([`Ownership::Ours`]). They are read
/// from `cache`; listed only while it cannot be read (the same verb its watch lists with, so a
/// refused verb still shows). Returns how many requests it deleted.
pub async fn delete_requests_of(
    client: &Client,
    instance: &str,
    wl: &Workload,
    check: &str,
    cache: &RequestCache,
    which: impl Fn(&ProvisioningRequest) -> bool,
) -> Result<usize, Error> {
    let namespace = wl
        .namespace()
        .ok_or_else(|| Error::MalformedWorkload(wl.name_any(), "namespace"))?;
    let uid = wl
        .uid()
        .ok_or_else(|| Error::MalformedWorkload(wl.name_any(), "uid"))?;
    let name = wl.name_any();
    let me = Identity {
        instance,
        workload: &name,
        workload_uid: &uid,
        check,
    };
    let cached = cache.select_group(&uid, |(ns, _), r| {
        *ns == namespace && ownership(&r.metadata, &me) == Ownership::Ours && which(r)
    });
    let requests = match cached {
        Ok(requests) => requests.into_iter().map(|(_, r)| r).collect(),
        Err(_) => list_requests(client, &namespace, instance, &uid).await?,
    };
    let mut deleted = 0;
    for r in requests
        .iter()
        .filter(|r| ownership(&r.metadata, &me) == Ownership::Ours && which(r))
    {
        if delete_request(client, instance, cache, r).await? {
            deleted += 1;
        }
    }
    Ok(deleted)
}

/// The requests in `namespace` labelled as this instance's for the Workload of uid `uid`.
async fn list_requests(
    client: &Client,
    namespace: &str,
    instance: &str,
    uid: &str,
) -> Result<Vec<Arc<ProvisioningRequest>>, Error> {
    let api: Api<ProvisioningRequest> = Api::namespaced(client.clone(), namespace);
    // The selector only narrows the list; the rule decides.
    let selector = format!(
        "{INSTANCE_LABEL}={instance},{}={uid}",
        identity::WORKLOAD_UID_LABEL
    );
    let requests = api.list(&ListParams::default().labels(&selector)).await;
    let requests =
        requests.map_err(Error::api_list::<ProvisioningRequest>(namespace, &selector))?;
    Ok(requests.items.into_iter().map(Arc::new).collect())
}

/// Deletes a request this instance made (for whichever Workload its labels record) and the
/// PodTemplates it names that were made with it. Anything else is left alone and `false`
/// returned; callers decide first whether the Workload still needs the request. Objects
/// already gone are fine. `cache` stops answering with the request at once: its watch may
/// deliver the deletion after the next decision reads it.
pub async fn delete_request(
    client: &Client,
    instance: &str,
    cache: &RequestCache,
    request: &ProvisioningRequest,
) -> Result<bool, Error> {
    let Some(recorded) = Identity::recorded_on(&request.metadata, instance) else {
        return Ok(false);
    };
    if ownership(&request.metadata, &recorded) != Ownership::Ours {
        return Ok(false);
    }
    let namespace = request.namespace().unwrap_or_default();
    let api: Api<ProvisioningRequest> = Api::namespaced(client.clone(), &namespace);
    // Templates first: while the request still holds its name, nobody else (Kueue's built-in
    // check waiting for that name) can take our templates for a request of its own.
    delete_templates(client, instance, request).await?;
    // `request` may be a stale copy, and a successor's request may already exist under the same
    // name (a Workload re-created with the same name).
    delete_exactly(&api, request).await?;
    let key = (namespace, request.name_any());
    cache.deleted(key, request.uid().unwrap_or_default());
    Ok(true)
}

/// Deletes the PodTemplates made with a request: those that own it (its ownerReferences give
/// their uids), never another object under the same name, such as the template of a successor
/// request of the same name made meanwhile (the watch may deliver this request's deletion after
/// the successor exists). No template is read: each delete carries the uid as precondition.
///
/// A request made before templates owned requests names its templates only by name; of those,
/// a template made with it (this instance, the same Workload uid and check) and not after it is
/// deleted.
pub(crate) async fn delete_templates(
    client: &Client,
    instance: &str,
    request: &ProvisioningRequest,
) -> Result<(), Error> {
    let Some(recorded) = Identity::recorded_on(&request.metadata, instance) else {
        return Ok(());
    };
    let namespace = request.namespace().unwrap_or_default();
    let templates: Api<PodTemplate> = Api::namespaced(client.clone(), &namespace);
    let owners: Vec<_> = request
        .owner_references()
        .iter()
        .filter(|o| o.kind == "PodTemplate")
        .collect();
    if !owners.is_empty() {
        for owner in owners {
            delete_by_uid(&templates, &owner.name, &owner.uid).await?;
        }
        return Ok(());
    }
    for p in &request.spec.pod_sets {
        let name = &p.pod_template_ref.name;
        let template = templates.get_opt(name).await;
        let Some(t) = template.map_err(Error::api::<PodTemplate>("get", &namespace, name))? else {
            continue;
        };
        let made_with_it = t.creation_timestamp() <= request.creation_timestamp();
        if ownership(&t.metadata, &recorded) != Ownership::Ours || !made_with_it {
            continue;
        }
        delete_exactly(&templates, &t).await?;
    }
    Ok(())
}

/// Deletes the object `name` if its uid is still `uid`; gone or replaced is fine.
async fn delete_by_uid<K>(api: &Api<K>, name: &str, uid: &str) -> Result<(), Error>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) || is_conflict(&e) => Ok(()),
        Err(e) => {
            let namespace = api.namespace().unwrap_or_default();
            Err(Error::api::<K>("delete", namespace, name)(e))
        }
    }
}

/// Deletes this very object (a uid precondition), not one re-created under its name meanwhile.
pub(crate) async fn delete_exactly<K>(api: &Api<K>, object: &K) -> Result<(), Error>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    // An object without a uid was never created: nothing of it to delete.
    let Some(uid) = object.uid() else {
        return Ok(());
    };
    delete_by_uid(api, &object.name_any(), &uid).await
}

/// A 409: the object changed, or a precondition (uid) did not hold.
pub(crate) fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// A 404: the object (or its namespace) is gone.
pub(crate) fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodTemplateSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use kube::api::PostParams;
    use kueue_admission_sdk::api::{
        PodTemplateReference, ProvisioningRequestPodSet, ProvisioningRequestSpec,
    };
    use kueue_admission_sdk::testing::MemoryApi;

    use crate::identity::{CHECK_ANNOTATION, WORKLOAD_ANNOTATION, WORKLOAD_UID_LABEL};

    const INSTANCE: &str = "pr-test";
    const NS: &str = "team-a";
    const TEMPLATE: &str = "ppt-job-1-prov-1-main";

    /// Metadata that makes an object this instance's, for Workload `job-1` (uid `wl-1`).
    fn ours(name: &str) -> kube::api::ObjectMeta {
        kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            labels: Some(
                [(INSTANCE_LABEL, INSTANCE), (WORKLOAD_UID_LABEL, "wl-1")]
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .into(),
            ),
            annotations: Some(
                [(WORKLOAD_ANNOTATION, "job-1"), (CHECK_ANNOTATION, "prov")]
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .into(),
            ),
            ..Default::default()
        }
    }

    fn template() -> PodTemplate {
        PodTemplate {
            metadata: ours(TEMPLATE),
            template: Some(PodTemplateSpec::default()),
        }
    }

    /// Request `job-1-prov-1` naming [`TEMPLATE`], owned by the given templates.
    fn request(owners: &[PodTemplate]) -> ProvisioningRequest {
        let spec = ProvisioningRequestSpec {
            pod_sets: vec![ProvisioningRequestPodSet {
                pod_template_ref: PodTemplateReference {
                    name: TEMPLATE.into(),
                },
                count: 1,
            }],
            provisioning_class_name: "check-capacity.autoscaling.x-k8s.io".into(),
            parameters: Default::default(),
        };
        let mut r = ProvisioningRequest::new("job-1-prov-1", spec);
        r.metadata = ours("job-1-prov-1");
        let owners = crate::plan::template_owners(owners);
        r.metadata.owner_references = (!owners.is_empty()).then_some(owners);
        r
    }

    /// Issue 26, item 1: the watch delivers the deletion of a request after a successor of the
    /// same name (the same Workload, check and attempt: a config switch) has its template.
    /// The successor's template, under the same name and with the same identity, stays.
    #[tokio::test]
    async fn a_late_deletion_never_takes_the_successors_template() {
        let api = MemoryApi::new();
        let client = api.client();
        let templates: Api<PodTemplate> = Api::namespaced(client.clone(), NS);
        let pp = PostParams::default();
        let old_template = templates.create(&pp, &template()).await.expect("created");
        let old_request = request(std::slice::from_ref(&old_template));
        // The switch: the old request and its template go, the successor's template comes.
        delete_exactly(&templates, &old_template)
            .await
            .expect("deleted");
        let successor = templates.create(&pp, &template()).await.expect("again");
        assert_ne!(successor.uid(), old_template.uid());

        delete_templates(&client, INSTANCE, &old_request)
            .await
            .expect("a late deletion is no error");
        let kept = templates
            .get(TEMPLATE)
            .await
            .expect("the successor's template stays");
        assert_eq!(kept.uid(), successor.uid());

        // Its own deletion takes it.
        let successor_request = request(std::slice::from_ref(&successor));
        delete_templates(&client, INSTANCE, &successor_request)
            .await
            .expect("deleted");
        assert!(templates.get_opt(TEMPLATE).await.expect("read").is_none());
    }

    /// A request made before templates owned requests: its templates are found by name, and
    /// one made after the request (a successor's) is left alone.
    #[tokio::test]
    async fn a_request_without_template_owners_takes_only_older_templates() {
        let api = MemoryApi::new();
        let client = api.client();
        let templates: Api<PodTemplate> = Api::namespaced(client.clone(), NS);
        let at = |s: i64| Some(Time(Timestamp::from_second(s).expect("a time")));
        let mut legacy = request(&[]);
        legacy.metadata.creation_timestamp = at(1_000);
        let mut newer = template();
        newer.metadata.creation_timestamp = at(1_001);
        api.put(&newer);
        delete_templates(&client, INSTANCE, &legacy)
            .await
            .expect("ok");
        assert!(templates.get_opt(TEMPLATE).await.expect("read").is_some());

        let mut older = template();
        older.metadata.creation_timestamp = at(999);
        older.metadata.uid = Some("older".into());
        api.put(&older);
        delete_templates(&client, INSTANCE, &legacy)
            .await
            .expect("ok");
        assert!(templates.get_opt(TEMPLATE).await.expect("read").is_none());
    }
}

//! Deleting what this instance made: a Workload's requests, one request with the templates
//! made with it, an object by uid. Nothing is deleted that the identity rule
//! ([`crate::identity::ownership`]) does not call ours.

use std::sync::Arc;

use k8s_openapi::api::core::v1::PodTemplate;
use kube::api::{Api, DeleteParams, ListParams, Preconditions};
use kube::{Client, ResourceExt};
use kueue_admission_sdk::api::{ProvisioningRequest, Workload};

use crate::cache::WatchedCache;
use crate::error::Error;
use crate::identity;
use crate::identity::{INSTANCE_LABEL, Identity, Ownership, ownership};

/// This instance's requests as the leader's watch of them delivered them.
pub type RequestCache = WatchedCache<Arc<ProvisioningRequest>>;

/// An empty [`RequestCache`], not listed yet.
pub fn request_cache() -> Arc<RequestCache> {
    Arc::new(WatchedCache::new(
        "provisioningrequests.autoscaling.x-k8s.io",
    ))
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
    let cached = cache.select(|(ns, _), _| *ns == namespace);
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

/// Deletes the PodTemplates a request names, but only those made with it (this instance, the
/// same Workload uid and check): a template of that name may be Kueue's, a user's, or that of a
/// Workload re-created under the same name.
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
    for p in &request.spec.pod_sets {
        let name = &p.pod_template_ref.name;
        let template = templates.get_opt(name).await;
        let Some(t) = template.map_err(Error::api::<PodTemplate>("get", &namespace, name))? else {
            continue;
        };
        if ownership(&t.metadata, &recorded) != Ownership::Ours {
            continue;
        }
        delete_exactly(&templates, &t).await?;
    }
    Ok(())
}

/// Deletes this very object (a uid precondition), not one re-created under its name meanwhile.
pub(crate) async fn delete_exactly<K>(api: &Api<K>, object: &K) -> Result<(), Error>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: object.uid(),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    let name = object.name_any();
    match api.delete(&name, &params).await {
        Ok(_) => Ok(()),
        // Gone, or replaced by another object of the same name (precondition failed).
        Err(e) if is_not_found(&e) || is_conflict(&e) => Ok(()),
        Err(e) => {
            let namespace = object.namespace().unwrap_or_default();
            Err(Error::api::<K>("delete", &namespace, &name)(e))
        }
    }
}

/// A 409: the object changed, or a precondition (uid) did not hold.
pub(crate) fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// A 404: the object (or its namespace) is gone.
pub(crate) fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

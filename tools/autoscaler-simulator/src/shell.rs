//! The I/O shell: watches (reflector stores) of ProvisioningRequests, PodTemplates, Nodes and
//! Pods, the autoscaler loop that feeds them to [`run_loop`] and carries out its actions, and
//! the scripted-mode controller beside it.
//!
//! - No polling: the loop reads the watch caches only (managedFields stripped).
//! - Status writes are updates of the cached object (`replace_status`, carrying its
//!   resourceVersion): a 409 means the cache was stale, and the next loop decides again.
//! - The watch caches lag the simulator's own writes: until the cache shows them, the loop sees
//!   the objects as written ([`Overlay`]), so a request is never processed twice and a Node
//!   just created counts as upcoming capacity.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Pod, PodTemplate};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use kueue_admission_sdk::api::{ProvisioningRequest, ProvisioningRequestStatus};
use rand::Rng;
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tracing::{debug, info, warn};

use crate::loop_decision::{
    LoopActions, LoopState, NodeCreation, RequestKey, StatusWrite, run_loop,
};
use crate::node_groups::new_node;
use crate::scripted::{self, FIELD_MANAGER};
use crate::settings::Settings;
use crate::snapshot::ClusterView;

/// How long the loop keeps showing its own write or deletion the watch cache has not shown yet.
const OVERLAY_TTL: Duration = Duration::from_secs(60);

/// The shortest pause between two loops, so that a loop that keeps failing its writes cannot
/// spin.
const MIN_PAUSE: Duration = Duration::from_millis(100);

/// The characters of the random suffix of a created Node (those of Kubernetes' `rand.String`).
const NAME_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// Simulates cluster-autoscaler (and plays scripted requests) until the future is dropped. API
/// errors are logged and retried, never fatal.
pub async fn run(client: Client, settings: Settings) {
    info!(
        namespace = settings.namespace.as_deref().unwrap_or("(all)"),
        scripted_classes = ?settings.scripted_classes,
        default_script = %settings.default_script,
        node_groups = ?settings.node_groups.iter().map(|g| &g.name).collect::<Vec<_>>(),
        "autoscaler simulator starting (cluster-autoscaler 1.36.1)"
    );
    let (requests, request_writer) = reflector::store::<ProvisioningRequest>();
    let (templates, template_writer) = reflector::store::<PodTemplate>();
    let (nodes, node_writer) = reflector::store::<Node>();
    let (pods, pod_writer) = reflector::store::<Pod>();
    let wake = Arc::new(Notify::new());
    let namespace = settings.namespace.clone();
    let request_stream =
        reflected(scoped(&client, namespace.as_deref()), request_writer).applied_objects();
    let watches = futures::future::join3(
        drain(reflected(
            scoped(&client, namespace.as_deref()),
            template_writer,
        )),
        drain(reflected(Api::all(client.clone()), node_writer)),
        drain(
            reflected(scoped(&client, namespace.as_deref()), pod_writer)
                .applied_objects()
                .inspect_ok(|pod: &Pod| {
                    if recently_unschedulable(pod) {
                        wake.notify_one();
                    }
                }),
        ),
    );
    let stores = Stores {
        requests: requests.clone(),
        templates: templates.clone(),
        nodes,
        pods,
    };
    let scripted = scripted::run(
        client.clone(),
        settings.clone(),
        request_stream,
        requests,
        templates,
    );
    let autoscaler = autoscaler_loop(client, settings, stores, wake.clone());
    futures::future::join3(watches, scripted, autoscaler).await;
}

/// The API of `K` in `namespace`, or in all namespaces.
fn scoped<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// The watch of `api`, managedFields stripped, reflected into `writer`.
fn reflected<K>(
    api: Api<K>,
    writer: reflector::store::Writer<K>,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    watcher(api, watcher::Config::default())
        .default_backoff()
        .modify(|object: &mut K| {
            object.meta_mut().managed_fields = None;
        })
        .reflect(writer)
}

/// Drives a watch stream forever, logging its errors (the backoff retries them).
async fn drain<T, S>(stream: S)
where
    S: Stream<Item = Result<T, watcher::Error>>,
{
    stream
        .for_each(|item| async move {
            if let Err(error) = item {
                warn!(%error, "watch error");
            }
        })
        .await;
}

/// Whether kube-scheduler marked the pod unschedulable in the last 10 seconds (cluster-
/// autoscaler then starts a loop at once).
fn recently_unschedulable(pod: &Pod) -> bool {
    let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.into_iter().flatten().any(|c| {
        c.type_ == "PodScheduled"
            && c.status == "False"
            && c.reason.as_deref() == Some("Unschedulable")
            && c.last_transition_time.as_ref().is_some_and(|t| {
                Timestamp::now().duration_since(t.0)
                    < k8s_openapi::jiff::SignedDuration::from_secs(10)
            })
    })
}

/// The watch caches the loop reads.
struct Stores {
    requests: Store<ProvisioningRequest>,
    templates: Store<PodTemplate>,
    nodes: Store<Node>,
    pods: Store<Pod>,
}

/// What the simulator wrote or deleted that the watch caches may not show yet.
#[derive(Debug, Default)]
struct Overlay {
    /// By request UID: the resourceVersion the write replaced, and the object written.
    written: HashMap<String, (Option<String>, ProvisioningRequest, Timestamp)>,
    /// Request UIDs deleted.
    deleted_requests: HashMap<String, Timestamp>,
    /// Nodes created, by name.
    created_nodes: HashMap<String, (Node, Timestamp)>,
    /// Node names deleted.
    deleted_nodes: HashMap<String, Timestamp>,
}

fn fresh(at: Timestamp, now: Timestamp) -> bool {
    at.checked_add(OVERLAY_TTL).is_ok_and(|until| until > now)
}

impl Overlay {
    /// The cluster as the caches show it, corrected by the simulator's own recent actions.
    fn view(&mut self, stores: &Stores, now: Timestamp) -> ClusterView {
        let cached: Vec<ProvisioningRequest> = stores
            .requests
            .state()
            .iter()
            .map(|r| (**r).clone())
            .collect();
        self.deleted_requests.retain(|uid, at| {
            fresh(*at, now) && cached.iter().any(|r| r.uid().as_deref() == Some(uid))
        });
        let mut requests = Vec::new();
        for request in cached {
            let uid = request.uid().unwrap_or_default();
            if self.deleted_requests.contains_key(&uid) {
                continue;
            }
            match self.written.get(&uid) {
                Some((stale, written, at))
                    if *stale == request.resource_version() && fresh(*at, now) =>
                {
                    requests.push(written.clone());
                }
                Some(_) => {
                    self.written.remove(&uid);
                    requests.push(request);
                }
                None => requests.push(request),
            }
        }
        let cached_nodes: Vec<Node> = stores.nodes.state().iter().map(|n| (**n).clone()).collect();
        let has = |name: &str| cached_nodes.iter().any(|n| n.name_any() == name);
        self.created_nodes
            .retain(|name, (_, at)| fresh(*at, now) && !has(name));
        self.deleted_nodes
            .retain(|name, at| fresh(*at, now) && has(name));
        let mut nodes: Vec<Node> = cached_nodes
            .into_iter()
            .filter(|n| !self.deleted_nodes.contains_key(&n.name_any()))
            .collect();
        nodes.extend(self.created_nodes.values().map(|(n, _)| n.clone()));
        ClusterView {
            nodes,
            pods: stores.pods.state().iter().map(|p| (**p).clone()).collect(),
            requests,
            templates: stores
                .templates
                .state()
                .iter()
                .map(|t| (**t).clone())
                .collect(),
        }
    }
}

/// Loops until the caches' writers are gone: decide, act, wait.
async fn autoscaler_loop(client: Client, settings: Settings, stores: Stores, wake: Arc<Notify>) {
    for ready in [
        stores.requests.wait_until_ready().await,
        stores.templates.wait_until_ready().await,
        stores.nodes.wait_until_ready().await,
        stores.pods.wait_until_ready().await,
    ] {
        if ready.is_err() {
            return;
        }
    }
    info!("watch caches synced: the autoscaler loop starts");
    let mut state = LoopState::default();
    let mut overlay = Overlay::default();
    loop {
        let now = Timestamp::now();
        let view = overlay.view(&stores, now);
        let actions = run_loop(&settings, &view, &mut state, now);
        let next_loop = actions.next_loop;
        let failed = act(&client, &settings, &view, actions, &mut overlay).await;
        let due = if failed {
            now.checked_add(settings.scan_interval).unwrap_or(now)
        } else {
            next_loop
        };
        let wait = Duration::try_from(due.duration_since(Timestamp::now()))
            .unwrap_or(Duration::ZERO)
            .max(MIN_PAUSE);
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = wake.notified() => {
                debug!("an unschedulable pod appeared: looping at once");
                tokio::time::sleep(MIN_PAUSE).await;
            }
        }
    }
}

/// Carries out one loop's actions: Node creations, then status writes, then deletions.
/// Returns whether an API call failed for another reason than a stale cache or a vanished
/// object.
async fn act(
    client: &Client,
    settings: &Settings,
    view: &ClusterView,
    actions: LoopActions,
    overlay: &mut Overlay,
) -> bool {
    let mut failed = false;
    let mut writes = actions.status_writes;
    for creation in actions.node_creations {
        if let Err(error) = create_nodes(client, settings, &creation, overlay).await {
            warn!(group = %creation.group, count = creation.count, %error, "scale-up failed");
            failed = true;
            if let Some(refused) = creation.if_refused {
                writes.retain(|w| w.request != refused.request);
                writes.push(refused);
            }
        }
    }
    for write in writes {
        failed |= !write_status(client, view, &write, overlay).await;
    }
    for key in actions.request_deletions {
        failed |= !delete_request(client, &key, overlay).await;
    }
    for name in actions.node_deletions {
        failed |= !delete_node(client, &name, overlay).await;
    }
    failed
}

fn random_suffix() -> String {
    let mut rng = rand::rng();
    (0..5)
        .map(|_| char::from(NAME_ALPHABET[rng.random_range(0..NAME_ALPHABET.len())]))
        .collect()
}

/// Creates the Nodes one by one, as the kwok provider does (a failure leaves those created).
async fn create_nodes(
    client: &Client,
    settings: &Settings,
    creation: &NodeCreation,
    overlay: &mut Overlay,
) -> Result<(), kube::Error> {
    let Some(group) = settings
        .node_groups
        .iter()
        .find(|g| g.name == creation.group)
    else {
        return Ok(());
    };
    let api: Api<Node> = Api::all(client.clone());
    for _ in 0..creation.count {
        let mut attempt = 0;
        let created = loop {
            let node = new_node(group, &format!("{}-{}", group.name, random_suffix()));
            match api.create(&PostParams::default(), &node).await {
                Err(kube::Error::Api(s)) if s.code == 409 && attempt < 3 => attempt += 1,
                other => break other?,
            }
        };
        info!(node = %created.name_any(), group = %group.name, "node created");
        overlay
            .created_nodes
            .insert(created.name_any(), (created, Timestamp::now()));
    }
    Ok(())
}

fn is_code(error: &kube::Error, code: u16) -> bool {
    matches!(error, kube::Error::Api(s) if s.code == code)
}

/// Updates the request's status to `write`'s conditions; whether it went well or harmlessly.
async fn write_status(
    client: &Client,
    view: &ClusterView,
    write: &StatusWrite,
    overlay: &mut Overlay,
) -> bool {
    let key = &write.request;
    let Some(cached) = view
        .requests
        .iter()
        .find(|r| r.uid().as_deref() == Some(&key.uid))
    else {
        return true;
    };
    let mut object = cached.clone();
    let status = object
        .status
        .get_or_insert_with(ProvisioningRequestStatus::default);
    status.conditions = write.conditions.clone();
    let api: Api<ProvisioningRequest> = Api::namespaced(client.clone(), &key.namespace);
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PostParams::default()
    };
    let conditions: Vec<_> = write
        .conditions
        .iter()
        .map(|c| format!("{}={}/{}", c.type_, c.status, c.reason))
        .collect();
    match api.replace_status(&key.name, &params, &object).await {
        Ok(written) => {
            info!(request = %format!("{}/{}", key.namespace, key.name), ?conditions, "status written");
            let stale = cached.resource_version();
            overlay
                .written
                .insert(key.uid.clone(), (stale, written, Timestamp::now()));
            true
        }
        Err(e) if is_code(&e, 409) || is_code(&e, 404) => {
            info!(request = %format!("{}/{}", key.namespace, key.name), "the request changed meanwhile: the next loop decides again");
            true
        }
        Err(error) => {
            warn!(request = %format!("{}/{}", key.namespace, key.name), %error, "writing the status failed");
            false
        }
    }
}

async fn delete_request(client: &Client, key: &RequestKey, overlay: &mut Overlay) -> bool {
    let api: Api<ProvisioningRequest> = Api::namespaced(client.clone(), &key.namespace);
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(key.uid.clone()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&key.name, &params).await {
        Ok(_) => {
            info!(request = %format!("{}/{}", key.namespace, key.name), "old request deleted");
            overlay
                .deleted_requests
                .insert(key.uid.clone(), Timestamp::now());
            true
        }
        Err(e) if is_code(&e, 404) || is_code(&e, 409) => true,
        Err(error) => {
            warn!(request = %format!("{}/{}", key.namespace, key.name), %error, "deleting the old request failed");
            false
        }
    }
}

async fn delete_node(client: &Client, name: &str, overlay: &mut Overlay) -> bool {
    let api: Api<Node> = Api::all(client.clone());
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => {
            info!(node = %name, "unneeded node deleted");
            overlay
                .deleted_nodes
                .insert(name.to_string(), Timestamp::now());
            true
        }
        Err(e) if is_code(&e, 404) => true,
        Err(error) => {
            warn!(node = %name, %error, "deleting the node failed");
            false
        }
    }
}

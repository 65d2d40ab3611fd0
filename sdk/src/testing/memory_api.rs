//! [`MemoryApi`]: an API server in memory that keeps what it is sent, for unit tests that run a
//! check's real storage code (ConfigMaps written with optimistic concurrency, fresh Workload
//! reads) without a cluster.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use http_body_util::BodyExt;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::{json_response, status_body};

/// An API server in memory, for unit tests: it stores the objects it is sent and answers reads
/// from them, with the API server's rules that matter to a check's state:
///
/// - every write gives the object a new `metadata.resourceVersion`, and a create a `uid`;
/// - a replace (`PUT`) at a `resourceVersion` other than the stored one is refused with `409
///   Conflict`, and a create (`POST`) of a name that exists with `409 AlreadyExists`;
/// - a delete honours the `uid` and `resourceVersion` preconditions of its options (`409
///   Conflict` when one does not hold);
/// - a read or delete of a missing object is `404 NotFound`;
/// - a list honours a `labelSelector` of `key`, `!key`, `key=value` and `key!=value` terms.
///
/// Each request first yields to other tasks, so that concurrent read-modify-write updates
/// interleave between their read and their write as they do against a real API server. Events
/// are accepted and counted apart. Patches and watches are answered `405`: the runtime's own
/// writes are tested against the real API server.
///
/// ```
/// use kueue_admission_sdk::testing::MemoryApi;
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube::api::{Api, PostParams};
///
/// # tokio_test::block_on(async {
/// let api = MemoryApi::new();
/// let maps: Api<ConfigMap> = Api::namespaced(api.client(), "team-a");
/// let mut cm = ConfigMap::default();
/// cm.metadata.name = Some("ledger".into());
/// let created = maps.create(&PostParams::default(), &cm).await.unwrap();
/// let stale = created.clone();
/// maps.replace("ledger", &PostParams::default(), &created).await.unwrap();
/// let lost = maps.replace("ledger", &PostParams::default(), &stale).await.unwrap_err();
/// assert!(matches!(lost, kube::Error::Api(s) if s.code == 409));
/// assert_eq!((api.writes(), api.conflicts()), (2, 1));
/// # });
/// ```
#[derive(Clone, Debug, Default)]
pub struct MemoryApi {
    state: Arc<Mutex<Stored>>,
}

#[derive(Debug, Default)]
struct Stored {
    /// Objects by collection path (`/api/v1/namespaces/ns/configmaps`) and name.
    objects: BTreeMap<(String, String), Value>,
    /// The last `resourceVersion` given out; versions are unique across objects, as etcd's are.
    version: u64,
    writes: usize,
    conflicts: usize,
    events: usize,
}

/// The parts of a request the store answers from.
struct Call {
    method: http::Method,
    collection: String,
    name: Option<String>,
    query: Option<String>,
    body: Value,
}

impl MemoryApi {
    /// An empty API server.
    pub fn new() -> Self {
        Self::default()
    }

    fn stored(&self) -> MutexGuard<'_, Stored> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A client whose every request this server answers.
    pub fn client(&self) -> kube::Client {
        let api = self.clone();
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let api = api.clone();
            async move {
                tokio::task::yield_now().await;
                let call = Call::read(req).await?;
                let (code, body) = api.answer(call);
                json_response(code, &body)
            }
        });
        kube::Client::new(service, "default")
    }

    /// Stores `object` as if created or replaced now (a new `resourceVersion`), whatever it was.
    pub fn put<K>(&self, object: &K)
    where
        K: Resource<DynamicType = ()> + Serialize,
    {
        let collection = K::url_path(&(), object.namespace().as_deref());
        let mut value = serde_json::to_value(object).unwrap_or(Value::Null);
        let mut stored = self.stored();
        stored.stamp(&mut value, object.meta().namespace.as_deref());
        stored
            .objects
            .insert((collection, object.name_any()), value);
    }

    /// The stored object `name` (in `namespace`, for a namespaced kind), if any.
    ///
    /// # Panics
    /// If what is stored there does not read as a `K`: a broken test.
    pub fn get<K>(&self, namespace: Option<&str>, name: &str) -> Option<K>
    where
        K: Resource<DynamicType = ()> + DeserializeOwned,
    {
        let key = (K::url_path(&(), namespace), name.to_string());
        let value = self.stored().objects.get(&key).cloned()?;
        #[allow(clippy::expect_used)] // documented: a broken test
        Some(serde_json::from_value(value).expect("the stored object reads as its kind"))
    }

    /// Successful creates and replaces so far (Events not counted).
    pub fn writes(&self) -> usize {
        self.stored().writes
    }

    /// Writes refused with `409` so far.
    pub fn conflicts(&self) -> usize {
        self.stored().conflicts
    }

    /// Events sent so far.
    pub fn events(&self) -> usize {
        self.stored().events
    }

    fn answer(&self, call: Call) -> (u16, Value) {
        let mut stored = self.stored();
        if call.collection.ends_with("/events") {
            stored.events += 1;
            return (201, call.body);
        }
        match (&call.method, &call.name) {
            (&http::Method::GET, Some(name)) => stored.read(&call.collection, name),
            (&http::Method::GET, None) => stored.list(&call.collection, call.query.as_deref()),
            (&http::Method::POST, None) => stored.create(call),
            (&http::Method::PUT, Some(_)) => stored.replace(call),
            (&http::Method::DELETE, Some(_)) => stored.delete(call),
            _ => (
                405,
                status_body(
                    405,
                    "MethodNotAllowed",
                    "MemoryApi answers get, list, create, replace and delete only",
                ),
            ),
        }
    }
}

impl Call {
    /// Splits the path into collection and name: the name is the segment after the resource
    /// (`.../namespaces/<ns>/<resource>/<name>`, or `/<resource>/<name>` cluster wide).
    async fn read(req: http::Request<kube::client::Body>) -> Result<Self, kube::Error> {
        let method = req.method().clone();
        let path = req.uri().path().trim_end_matches('/').to_string();
        let query = req.uri().query().map(String::from);
        let bytes = req.into_body().collect().await?.to_bytes();
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let segments: Vec<&str> = path.split('/').collect();
        // `/api/v1/<resource>` has 4 segments (the first empty), `/apis/<group>/<version>/...`
        // one more; `namespaces/<ns>` adds two.
        let mut base = if segments.get(1) == Some(&"api") {
            3
        } else {
            4
        };
        if segments.get(base) == Some(&"namespaces") && segments.len() > base + 2 {
            base += 2;
        }
        let (collection, name) = match segments.len() - base {
            2 => (
                segments[..base + 1].join("/"),
                Some(segments[base + 1].to_string()),
            ),
            _ => (path.clone(), None),
        };
        Ok(Self {
            method,
            collection,
            name,
            query,
            body,
        })
    }
}

impl Stored {
    /// Gives `object` the next `resourceVersion`, and its namespace.
    fn stamp(&mut self, object: &mut Value, namespace: Option<&str>) {
        self.version += 1;
        let meta = &mut object["metadata"];
        meta["resourceVersion"] = json!(self.version.to_string());
        if let Some(ns) = namespace {
            meta["namespace"] = json!(ns);
        }
    }

    fn read(&self, collection: &str, name: &str) -> (u16, Value) {
        match self
            .objects
            .get(&(collection.to_string(), name.to_string()))
        {
            Some(object) => (200, object.clone()),
            None => not_found(collection, name),
        }
    }

    fn list(&self, collection: &str, query: Option<&str>) -> (u16, Value) {
        let selector = query.and_then(label_selector).unwrap_or_default();
        let items: Vec<&Value> = self
            .objects
            .iter()
            .filter(|((c, _), object)| c == collection && selects(&selector, object))
            .map(|(_, object)| object)
            .collect();
        let list = json!({
            "apiVersion": "v1",
            "kind": "List",
            "metadata": {"resourceVersion": self.version.to_string()},
            "items": items,
        });
        (200, list)
    }

    fn create(&mut self, call: Call) -> (u16, Value) {
        let mut object = call.body;
        let Some(name) = object["metadata"]["name"].as_str().map(String::from) else {
            return (
                422,
                status_body(422, "Invalid", "metadata.name: Required value"),
            );
        };
        let key = (call.collection, name.clone());
        if self.objects.contains_key(&key) {
            self.conflicts += 1;
            let message = format!("{name:?} already exists");
            return (409, status_body(409, "AlreadyExists", &message));
        }
        self.stamp(&mut object, namespace_of(&key.0));
        // As the API server does: every object created gets a uid of its own.
        if object["metadata"]["uid"].as_str().is_none_or(str::is_empty) {
            object["metadata"]["uid"] = json!(format!("memory-uid-{}", self.version));
        }
        self.writes += 1;
        self.objects.insert(key, object.clone());
        (201, object)
    }

    /// Deletes the object, honouring the uid and resourceVersion preconditions of the
    /// DeleteOptions sent (409 when one does not hold, as the API server answers).
    fn delete(&mut self, call: Call) -> (u16, Value) {
        let name = call.name.unwrap_or_default();
        let key = (call.collection, name.clone());
        let Some(current) = self.objects.get(&key) else {
            return not_found(&key.0, &name);
        };
        let preconditions = &call.body["preconditions"];
        for field in ["uid", "resourceVersion"] {
            let asked = &preconditions[field];
            if !asked.is_null() && asked != &current["metadata"][field] {
                self.conflicts += 1;
                let message = format!(
                    "Precondition failed: {field} in precondition: {asked}, {field} in object \
                     meta: {}",
                    current["metadata"][field]
                );
                return (409, status_body(409, "Conflict", &message));
            }
        }
        self.writes += 1;
        let deleted = self.objects.remove(&key).unwrap_or_default();
        (200, deleted)
    }

    fn replace(&mut self, call: Call) -> (u16, Value) {
        let name = call.name.unwrap_or_default();
        let key = (call.collection, name.clone());
        let Some(current) = self.objects.get(&key) else {
            return not_found(&key.0, &name);
        };
        let asked = &call.body["metadata"]["resourceVersion"];
        if asked != &current["metadata"]["resourceVersion"] {
            self.conflicts += 1;
            let message =
                format!("Operation cannot be fulfilled on {name:?}: the object has been modified");
            return (409, status_body(409, "Conflict", &message));
        }
        let mut object = call.body;
        self.stamp(&mut object, namespace_of(&key.0));
        self.writes += 1;
        self.objects.insert(key, object.clone());
        (200, object)
    }
}

fn not_found(collection: &str, name: &str) -> (u16, Value) {
    let resource = collection.rsplit('/').next().unwrap_or_default();
    let message = format!("{resource} {name:?} not found");
    (404, status_body(404, "NotFound", &message))
}

/// The namespace in a collection path, if namespaced.
fn namespace_of(collection: &str) -> Option<&str> {
    let mut segments = collection.split('/');
    segments.find(|s| *s == "namespaces")?;
    segments.next()
}

/// One term of a label selector: the key, and what its value must (or must not) be.
#[derive(Debug, PartialEq)]
enum Term {
    Exists(String),
    Absent(String),
    Equals(String, String),
    Differs(String, String),
}

/// The terms of the `labelSelector` in a query string (percent-decoded).
fn label_selector(query: &str) -> Option<Vec<Term>> {
    let (_, raw) = form_urlencoded::parse(query.as_bytes()).find(|(k, _)| k == "labelSelector")?;
    let terms = raw
        .split(',')
        .filter(|t| !t.is_empty())
        .map(|term| {
            if let Some((k, v)) = term.split_once("!=") {
                Term::Differs(k.into(), v.into())
            } else if let Some((k, v)) = term.split_once('=') {
                Term::Equals(k.into(), v.trim_start_matches('=').into())
            } else if let Some(k) = term.strip_prefix('!') {
                Term::Absent(k.into())
            } else {
                Term::Exists(term.into())
            }
        })
        .collect();
    Some(terms)
}

fn selects(selector: &[Term], object: &Value) -> bool {
    let label = |k: &str| object["metadata"]["labels"][k].as_str();
    selector.iter().all(|term| match term {
        Term::Exists(k) => label(k).is_some(),
        Term::Absent(k) => label(k).is_none(),
        Term::Equals(k, v) => label(k) == Some(v.as_str()),
        Term::Differs(k, v) => label(k) != Some(v.as_str()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Workload;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, ListParams, PostParams};

    fn config_map(name: &str, labels: &[(&str, &str)]) -> ConfigMap {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.into());
        let labels = labels.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        cm.metadata.labels = Some(labels.collect());
        cm
    }

    #[tokio::test]
    async fn reads_what_was_written_and_refuses_what_is_missing_or_stale() {
        let api = MemoryApi::new();
        let maps: Api<ConfigMap> = Api::namespaced(api.client(), "ops");
        let pp = PostParams::default();
        let missing = maps.get("ledger").await.expect_err("nothing yet");
        assert!(matches!(missing, kube::Error::Api(s) if s.code == 404 && s.reason == "NotFound"));
        let created = maps
            .create(&pp, &config_map("ledger", &[]))
            .await
            .expect("created");
        assert_eq!(created.namespace().as_deref(), Some("ops"));
        let twice = maps
            .create(&pp, &config_map("ledger", &[]))
            .await
            .expect_err("exists");
        assert!(
            matches!(twice, kube::Error::Api(s) if s.code == 409 && s.reason == "AlreadyExists")
        );
        let replaced = maps
            .replace("ledger", &pp, &created)
            .await
            .expect("at its version");
        assert_ne!(replaced.resource_version(), created.resource_version());
        let stale = maps
            .replace("ledger", &pp, &created)
            .await
            .expect_err("stale");
        assert!(matches!(stale, kube::Error::Api(s) if s.code == 409 && s.reason == "Conflict"));
        let read = maps.get("ledger").await.expect("read");
        assert_eq!(read.resource_version(), replaced.resource_version());
        assert_eq!((api.writes(), api.conflicts()), (2, 2));
        // Another namespace is another collection.
        let elsewhere: Api<ConfigMap> = Api::namespaced(api.client(), "team-a");
        assert!(elsewhere.get_opt("ledger").await.expect("read").is_none());
    }

    #[tokio::test]
    async fn lists_select_by_label() {
        let api = MemoryApi::new();
        api.put(&ConfigMap {
            metadata: kube::api::ObjectMeta {
                namespace: Some("ops".into()),
                ..config_map("a", &[("owner", "x")]).metadata
            },
            ..Default::default()
        });
        let maps: Api<ConfigMap> = Api::namespaced(api.client(), "ops");
        let pp = PostParams::default();
        maps.create(&pp, &config_map("b", &[("owner", "y")]))
            .await
            .expect("b");
        maps.create(&pp, &config_map("c", &[])).await.expect("c");
        let names = |selector: &str| {
            let maps = maps.clone();
            let lp = ListParams::default().labels(selector);
            async move {
                let list = maps.list(&lp).await.expect("list");
                list.items
                    .iter()
                    .map(|cm| cm.name_any())
                    .collect::<Vec<_>>()
            }
        };
        assert_eq!(names("").await, ["a", "b", "c"]);
        assert_eq!(names("owner").await, ["a", "b"]);
        assert_eq!(names("!owner").await, ["c"]);
        assert_eq!(names("owner=x").await, ["a"]);
        assert_eq!(names("owner!=x").await, ["b", "c"]);
    }

    #[tokio::test]
    async fn serves_custom_resources_and_counts_events_apart() {
        let api = MemoryApi::new();
        let wl = crate::testing::WorkloadBuilder::new("team-a", "job-1").build();
        api.put(&wl);
        let workloads: Api<Workload> = Api::namespaced(api.client(), "team-a");
        let read = workloads.get("job-1").await.expect("stored");
        assert_eq!(read.name_any(), "job-1");
        assert_eq!(
            api.get::<Workload>(Some("team-a"), "job-1")
                .map(|w| w.name_any()),
            Some("job-1".into())
        );
        let patch = kube::api::Patch::Merge(json!({}));
        let refused = workloads
            .patch("job-1", &kube::api::PatchParams::default(), &patch)
            .await
            .expect_err("patches are not served");
        assert!(matches!(refused, kube::Error::Api(s) if s.code == 405));
        assert_eq!((api.writes(), api.events()), (0, 0));
    }

    #[tokio::test]
    async fn deletes_honour_uid_and_version_preconditions() {
        let api = MemoryApi::new();
        let maps: Api<ConfigMap> = Api::namespaced(api.client(), "ops");
        let pp = PostParams::default();
        let first = maps
            .create(&pp, &config_map("ledger", &[]))
            .await
            .expect("created");
        let first_uid = first.uid().expect("a create gives a uid");
        let with = |uid: Option<String>, version: Option<String>| kube::api::DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid,
                resource_version: version,
            }),
            ..Default::default()
        };
        maps.delete("ledger", &with(Some(first_uid.clone()), None))
            .await
            .expect("deleted at its uid");
        let second = maps
            .create(&pp, &config_map("ledger", &[]))
            .await
            .expect("again");
        assert_ne!(
            second.uid(),
            Some(first_uid.clone()),
            "a new object, a new uid"
        );
        // The first object's uid no longer names what is stored under the name.
        let stale = maps
            .delete("ledger", &with(Some(first_uid), None))
            .await
            .expect_err("another object");
        assert!(matches!(stale, kube::Error::Api(s) if s.code == 409));
        let old_version = maps
            .delete("ledger", &with(None, first.resource_version()))
            .await
            .expect_err("another version");
        assert!(matches!(old_version, kube::Error::Api(s) if s.code == 409));
        assert!(maps.get_opt("ledger").await.expect("read").is_some());
        maps.delete("ledger", &Default::default())
            .await
            .expect("no precondition");
        let gone = maps
            .delete("ledger", &Default::default())
            .await
            .expect_err("gone");
        assert!(matches!(gone, kube::Error::Api(s) if s.code == 404));
    }
}

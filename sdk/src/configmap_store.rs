//! A check's ledger in a ConfigMap (what it gave Workloads: charges, licenses, reservations),
//! updated with optimistic concurrency so that replicas and concurrent reconciles never lose
//! each other's changes.
//!
//! A check that takes something for a Workload (a budget charge, a license) has to remember it
//! across restarts and leader changes, and a ConfigMap in the controller's namespace, out of the
//! tenants' reach, is the simplest place. Use this module when you keep such state; three rules
//! keep it right, each a piece here:
//!
//! - Every change is a read-modify-write that carries the `resourceVersion` it read
//!   ([`Versioned`]). Of two writers that read the same version only one lands; the other gets
//!   [`Saved::Conflict`] and starts again from a fresh read. [`Updater`] runs that loop, and makes
//!   the reconciles of one process take turns so that they do not conflict with each other.
//! - The ConfigMap is found by name but read and overwritten only if it carries the check's
//!   label ([`OwnedConfigMap`]): one of the same name that someone else made is left alone.
//! - An entry that cannot be read stops the check ([`CorruptEntry`], [`StoreError::Corrupt`])
//!   instead of being skipped: a forgotten holding would be handed out twice.
//!
//! Unit tests run the same logic against [`MemoryStore`], which has the same versions and
//! conflicts without an API server. The budget and license examples keep their ledgers this way:
//!
//! ```no_run
//! use std::collections::BTreeMap;
//! use kueue_admission_sdk::configmap_store::{Attempt, OwnedConfigMap, StoreError, Updater};
//!
//! # async fn grant(client: &kube::Client) -> Result<(), StoreError> {
//! let ledger = OwnedConfigMap::new("kueue-system", "license-ledger", "example.com/ledger", "true");
//! let updater = Updater::default(); // one per check, shared by its clones
//! let granted = updater
//!     .update(&ledger.to_string(), || async {
//!         let loaded = ledger.load(client, |data| Ok(data.clone())).await?;
//!         let mut holdings: BTreeMap<String, String> = loaded.value;
//!         if holdings.contains_key("workload-uid") {
//!             return Ok(Attempt::Done(false)); // asked again: nothing to write
//!         }
//!         holdings.insert("workload-uid".into(), "matlab=1".into());
//!         let saved = ledger.save(client, holdings, loaded.version.as_deref()).await?;
//!         Ok::<_, StoreError>(Attempt::saved(saved, true))
//!     })
//!     .await?;
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};
use tokio::sync::Mutex;

/// How often [`Updater::default`] tries one update whose write keeps losing to other writers.
pub const DEFAULT_ATTEMPTS: usize = 8;

/// A value with the version it was read at (`None`: the object does not exist yet).
#[derive(Clone, Debug, PartialEq)]
pub struct Versioned<T> {
    /// The value.
    pub value: T,
    /// The `resourceVersion` it was read at; a save must carry it.
    pub version: Option<String>,
}

/// Whether a save landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Saved {
    /// Written.
    Written,
    /// Someone wrote it since it was read (409): read again and decide again.
    Conflict,
}

/// An entry of the stored data that cannot be read back; the message names the key.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("ledger entry {key:?}: {reason}")]
pub struct CorruptEntry {
    /// The ConfigMap key.
    pub key: String,
    /// What is wrong with it.
    pub reason: String,
}

/// Why stored state could not be read or updated. Nothing here is the user's doing: a check
/// returns it as a transient error, so the runtime retries with backoff and shows the message
/// in an Event.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A call to the API server failed.
    #[error("Kubernetes API: {0}")]
    Api(#[from] kube::Error),
    /// The ConfigMap holds an entry that cannot be read. Ignoring it could hand out what it
    /// records twice, so the check stops until a person fixes or deletes the key.
    #[error("ledger ConfigMap {configmap}: {source}; fix or delete that key")]
    Corrupt {
        /// `namespace/name` of the ConfigMap.
        configmap: String,
        /// The entry and what is wrong with it.
        #[source]
        source: CorruptEntry,
    },
    /// A ConfigMap has the name but not the label of the check's state (someone else's, or
    /// another instance's): it is never read as state nor overwritten.
    #[error(
        "ConfigMap {configmap} is not a ledger of this check (label {label} is missing or has \
         another value); it is left alone: rename or delete it, or give the check another name \
         for its ledger"
    )]
    NotOwned {
        /// `namespace/name` of the ConfigMap.
        configmap: String,
        /// The label it lacks, `key=value`.
        label: String,
    },
    /// The state changed under every attempt to update it (many writers at once); the runtime
    /// asks again after its error backoff.
    #[error("ledger ConfigMap {configmap} changed under each of {attempts} attempts to update it")]
    Contention {
        /// `namespace/name` of the ConfigMap.
        configmap: String,
        /// How many times the update was tried.
        attempts: usize,
    },
}

/// A ConfigMap a check keeps state in, marked as the check's by a label. Shown as
/// `namespace/name`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnedConfigMap {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The key of the label that marks it as the check's.
    pub label: String,
    /// The value of that label (`true`, or what the state is about, e.g. a tenant namespace).
    pub label_value: String,
}

impl fmt::Display for OwnedConfigMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl OwnedConfigMap {
    /// The ConfigMap `namespace/name`, the check's when labelled `label=label_value`.
    pub fn new(
        namespace: impl Into<String>,
        name: impl Into<String>,
        label: impl Into<String>,
        label_value: impl Into<String>,
    ) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            label: label.into(),
            label_value: label_value.into(),
        }
    }

    /// Whether `cm` carries the label that makes it the check's, and so may be read as its
    /// state and overwritten.
    pub fn owns(&self, cm: &ConfigMap) -> bool {
        cm.labels().get(&self.label) == Some(&self.label_value)
    }

    fn api(&self, client: &Client) -> Api<ConfigMap> {
        Api::namespaced(client.clone(), &self.namespace)
    }

    /// Reads the state with its version, `parse`d from the ConfigMap's `data`; the default
    /// value without a version if the ConfigMap does not exist yet.
    pub async fn load<T: Default>(
        &self,
        client: &Client,
        parse: impl FnOnce(&BTreeMap<String, String>) -> Result<T, CorruptEntry>,
    ) -> Result<Versioned<T>, StoreError> {
        let Some(cm) = self.api(client).get_opt(&self.name).await? else {
            return Ok(Versioned {
                value: T::default(),
                version: None,
            });
        };
        // Found by name only: it is the check's only if labelled so.
        if !self.owns(&cm) {
            return Err(StoreError::NotOwned {
                configmap: self.to_string(),
                label: format!("{}={}", self.label, self.label_value),
            });
        }
        let value = parse(cm.data.as_ref().unwrap_or(&BTreeMap::new())).map_err(|source| {
            StoreError::Corrupt {
                configmap: self.to_string(),
                source,
            }
        })?;
        Ok(Versioned {
            value,
            version: cm.resource_version(),
        })
    }

    /// Writes `data`, with the check's label, if the ConfigMap is still at `version` (creates
    /// it when `version` is `None`).
    pub async fn save(
        &self,
        client: &Client,
        data: BTreeMap<String, String>,
        version: Option<&str>,
    ) -> Result<Saved, StoreError> {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                resource_version: version.map(str::to_string),
                labels: Some(BTreeMap::from([(
                    self.label.clone(),
                    self.label_value.clone(),
                )])),
                ..Default::default()
            },
            data: Some(data),
            ..Default::default()
        };
        let api = self.api(client);
        let written = match version {
            None => api.create(&PostParams::default(), &cm).await,
            Some(_) => api.replace(&self.name, &PostParams::default(), &cm).await,
        };
        match written {
            Ok(_) => Ok(Saved::Written),
            // 409: a stale resourceVersion, or someone created the ConfigMap first.
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(Saved::Conflict),
            Err(e) => Err(e.into()),
        }
    }
}

/// What one try of an update came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attempt<R> {
    /// The update is over (written, or nothing needed writing), with its outcome.
    Done(R),
    /// The write lost to another writer: read again and decide again.
    Conflict,
}

impl<R> Attempt<R> {
    /// Ends with `outcome` if the save landed; tries again if it lost.
    pub fn saved(saved: Saved, outcome: R) -> Self {
        match saved {
            Saved::Written => Attempt::Done(outcome),
            Saved::Conflict => Attempt::Conflict,
        }
    }
}

/// Runs the read-modify-write updates of a check's state. Updates in this process take turns
/// (clones share the turns), so they never conflict with each other; an update whose write lost
/// to another process is tried again from a fresh read, up to a limit.
#[derive(Clone, Debug)]
pub struct Updater {
    turns: Arc<Mutex<()>>,
    attempts: usize,
}

impl Default for Updater {
    /// Tries each update [`DEFAULT_ATTEMPTS`] times.
    fn default() -> Self {
        Self::new(DEFAULT_ATTEMPTS)
    }
}

impl Updater {
    /// An updater that tries each update at most `attempts` times.
    pub fn new(attempts: usize) -> Self {
        Self {
            turns: Arc::default(),
            attempts,
        }
    }

    /// Waits for this process's turn, then runs `attempt` (read, decide, write if unchanged)
    /// until it is [`Attempt::Done`]. An error of `attempt` ends the update; so does a conflict
    /// on every try, as [`StoreError::Contention`] naming `configmap`.
    pub async fn update<R, E, Try>(
        &self,
        configmap: &str,
        mut attempt: impl FnMut() -> Try,
    ) -> Result<R, E>
    where
        Try: Future<Output = Result<Attempt<R>, E>>,
        E: From<StoreError>,
    {
        let _turn = self.turns.lock().await;
        for _ in 0..self.attempts {
            if let Attempt::Done(outcome) = attempt().await? {
                return Ok(outcome);
            }
        }
        Err(StoreError::Contention {
            configmap: configmap.to_string(),
            attempts: self.attempts,
        }
        .into())
    }
}

/// Versioned values in memory, by key: the stand-in for ConfigMaps in a check's unit tests,
/// with the same versions and conflicts. Loads yield to other tasks, so that concurrent updates
/// interleave between their read and their write as they do against an API server.
#[derive(Debug)]
pub struct MemoryStore<T> {
    state: std::sync::Mutex<Memory<T>>,
}

#[derive(Debug)]
struct Memory<T> {
    values: BTreeMap<String, (T, u64)>,
    saves: usize,
    conflicts: usize,
}

impl<T> Default for MemoryStore<T> {
    fn default() -> Self {
        Self {
            state: std::sync::Mutex::new(Memory {
                values: BTreeMap::new(),
                saves: 0,
                conflicts: 0,
            }),
        }
    }
}

impl<T: Clone + Default> MemoryStore<T> {
    fn memory(&self) -> std::sync::MutexGuard<'_, Memory<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The value under `key` with its version; the default without a version if none.
    pub async fn load(&self, key: &str) -> Versioned<T> {
        let loaded = match self.memory().values.get(key) {
            Some((value, version)) => Versioned {
                value: value.clone(),
                version: Some(version.to_string()),
            },
            None => Versioned {
                value: T::default(),
                version: None,
            },
        };
        tokio::task::yield_now().await;
        loaded
    }

    /// Stores `value` under `key` if it is still at `version` (`None`: absent).
    pub fn save(&self, key: &str, value: &T, version: Option<&str>) -> Saved {
        let mut memory = self.memory();
        let current = memory.values.get(key).map(|(_, v)| *v);
        if current.map(|v| v.to_string()).as_deref() != version {
            memory.conflicts += 1;
            return Saved::Conflict;
        }
        let next = current.map_or(1, |v| v + 1);
        memory.values.insert(key.to_string(), (value.clone(), next));
        memory.saves += 1;
        Saved::Written
    }

    /// The value under `key`; the default if none.
    pub fn value(&self, key: &str) -> T {
        let memory = self.memory();
        memory
            .values
            .get(key)
            .map(|(v, _)| v.clone())
            .unwrap_or_default()
    }

    /// The keys that have a value, in order.
    pub fn keys(&self) -> Vec<String> {
        self.memory().values.keys().cloned().collect()
    }

    /// How many saves landed.
    pub fn saves(&self) -> usize {
        self.memory().saves
    }

    /// How many saves were refused for a stale version.
    pub fn conflicts(&self) -> usize {
        self.memory().conflicts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::ScriptedApi;
    use serde_json::json;

    fn ledger() -> OwnedConfigMap {
        OwnedConfigMap::new("ops", "ledger-team", "example.com/ledger-for", "team")
    }

    fn config_map(labels: serde_json::Value, data: serde_json::Value) -> serde_json::Value {
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "ledger-team", "namespace": "ops", "resourceVersion": "7", "labels": labels},
            "data": data,
        })
    }

    fn numbers(data: &BTreeMap<String, String>) -> Result<BTreeMap<String, u32>, CorruptEntry> {
        data.iter()
            .map(|(k, v)| {
                let n = v
                    .parse()
                    .map_err(|e: std::num::ParseIntError| CorruptEntry {
                        key: k.clone(),
                        reason: e.to_string(),
                    })?;
                Ok((k.clone(), n))
            })
            .collect()
    }

    #[test]
    fn only_a_config_map_with_the_label_and_its_value_is_owned() {
        let mut cm = ConfigMap::default();
        // The right name, someone else's ConfigMap.
        assert!(!ledger().owns(&cm));
        cm.labels_mut().insert("app".into(), "x".into());
        assert!(!ledger().owns(&cm));
        // Another tenant's ledger (prefixes that make names meet).
        cm.labels_mut()
            .insert("example.com/ledger-for".into(), "other".into());
        assert!(!ledger().owns(&cm));
        cm.labels_mut()
            .insert("example.com/ledger-for".into(), "team".into());
        assert!(ledger().owns(&cm));
        assert_eq!(ledger().to_string(), "ops/ledger-team");
    }

    #[tokio::test]
    async fn load_reads_what_is_owned_and_refuses_the_rest() {
        let api = ScriptedApi::new();
        api.fail(404, "NotFound", "configmaps \"ledger-team\" not found");
        api.answer(
            200,
            config_map(json!({"example.com/ledger-for": "team"}), json!({"a": "1"})),
        );
        api.answer(200, config_map(json!({}), json!({"a": "1"})));
        api.answer(
            200,
            config_map(json!({"example.com/ledger-for": "team"}), json!({"a": "x"})),
        );
        let client = api.client();
        let absent = ledger().load(&client, numbers).await.expect("absent");
        assert_eq!((absent.value.len(), absent.version), (0, None));
        let read = ledger().load(&client, numbers).await.expect("read");
        assert_eq!(read.value, BTreeMap::from([("a".to_string(), 1)]));
        assert_eq!(read.version.as_deref(), Some("7"));
        let foreign = ledger().load(&client, numbers).await.expect_err("not ours");
        assert!(
            matches!(&foreign, StoreError::NotOwned { label, .. } if label == "example.com/ledger-for=team"),
            "{foreign}"
        );
        let corrupt = ledger().load(&client, numbers).await.expect_err("corrupt");
        assert!(
            matches!(&corrupt, StoreError::Corrupt { source, .. } if source.key == "a"),
            "{corrupt}"
        );
        assert!(corrupt.to_string().contains("ops/ledger-team"), "{corrupt}");
        assert_eq!(api.requests().len(), 4);
    }

    #[tokio::test]
    async fn save_creates_then_replaces_at_the_version_read_and_reports_a_conflict() {
        let api = ScriptedApi::new();
        api.answer(201, config_map(json!({}), json!({})));
        api.fail(409, "Conflict", "the object has been modified");
        api.fail(403, "Forbidden", "configmaps is forbidden");
        let client = api.client();
        let data = BTreeMap::from([("a".to_string(), "1".to_string())]);
        let saved = ledger().save(&client, data.clone(), None).await;
        assert_eq!(saved.expect("created"), Saved::Written);
        let saved = ledger().save(&client, data.clone(), Some("7")).await;
        assert_eq!(saved.expect("a conflict is no error"), Saved::Conflict);
        let refused = ledger().save(&client, data, Some("7")).await;
        assert!(matches!(refused, Err(StoreError::Api(_))), "{refused:?}");
        let requests = api.requests();
        assert_eq!(
            requests
                .iter()
                .map(|r| format!("{} {}", r.method, r.path))
                .collect::<Vec<_>>(),
            [
                "POST /api/v1/namespaces/ops/configmaps",
                "PUT /api/v1/namespaces/ops/configmaps/ledger-team",
                "PUT /api/v1/namespaces/ops/configmaps/ledger-team",
            ]
        );
        assert_eq!(
            requests[1].body["metadata"]["resourceVersion"],
            json!("7"),
            "a replace carries the version read"
        );
        assert_eq!(
            requests[0].body["metadata"]["labels"],
            json!({"example.com/ledger-for": "team"})
        );
        assert_eq!(requests[0].body["data"], json!({"a": "1"}));
    }

    #[tokio::test]
    async fn an_update_is_tried_again_after_a_conflict_and_gives_up_after_the_limit() {
        let updater = Updater::new(3);
        let tries = std::cell::Cell::new(0);
        let outcome = updater
            .update("ops/ledger", || async {
                tries.set(tries.get() + 1);
                let saved = if tries.get() < 3 {
                    Saved::Conflict
                } else {
                    Saved::Written
                };
                Ok::<_, StoreError>(Attempt::saved(saved, tries.get()))
            })
            .await;
        assert_eq!(outcome.expect("written on the third try"), 3);

        tries.set(0);
        let outcome = updater
            .update("ops/ledger", || async {
                tries.set(tries.get() + 1);
                Ok::<Attempt<()>, StoreError>(Attempt::Conflict)
            })
            .await;
        assert_eq!(tries.get(), 3);
        let err = outcome.expect_err("contention");
        assert_eq!(
            err.to_string(),
            "ledger ConfigMap ops/ledger changed under each of 3 attempts to update it"
        );
    }

    /// Clones of one updater take turns, so concurrent read-modify-writes of one process never
    /// conflict; against a store shared with another updater (another replica) they do, and
    /// the retries still lose no increment.
    #[tokio::test]
    async fn updates_take_turns_in_a_process_and_retry_across_processes() {
        async fn increment(updater: &Updater, store: &MemoryStore<u32>) -> Result<(), StoreError> {
            updater
                .update("mem/counter", || async {
                    let loaded = store.load("counter").await;
                    let saved =
                        store.save("counter", &(loaded.value + 1), loaded.version.as_deref());
                    Ok(Attempt::saved(saved, ()))
                })
                .await
        }
        let store = MemoryStore::default();
        let one = Updater::default();
        let together = (0..6).map(|_| increment(&one, &store));
        futures::future::try_join_all(together)
            .await
            .expect("no contention");
        assert_eq!((store.value("counter"), store.conflicts()), (6, 0));

        let two = Updater::default();
        let apart = (0..6).map(|i| increment(if i % 2 == 0 { &one } else { &two }, &store));
        futures::future::try_join_all(apart).await.expect("retried");
        assert_eq!(store.value("counter"), 12);
        assert!(store.conflicts() > 0, "the two updaters did interleave");
        assert_eq!(
            (store.saves(), store.keys()),
            (12, vec!["counter".to_string()])
        );
    }
}

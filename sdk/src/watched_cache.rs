//! Caches kept by watches while this replica leads, so that a check's decisions read the objects
//! it creates or needs (its own requests, ResourceFlavors, ClusterQueues) without a request to
//! the API server. Fill one from a task of [`crate::Extensions`].
//!
//! A cache answers only while its watch is known to work: before its first list a reader waits
//! for it, and while the API server refuses the list or the watch, every read fails with
//! [`Unavailable`], which names the verb refused. Nothing falls back to a GET: a refused verb
//! shows on the decisions and in the log (the chart's RBAC test depends on that), and comes
//! back once granted (the watch is started again, from a fresh list, with backoff).

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt, stream::BoxStream};
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use tokio::sync::watch;
use tracing::{error, info, warn};

/// After a refusal, how long a new list's watch must go unrefused before the cache is trusted:
/// the watch starts right after the list, so a refusal comes well within this.
const CONFIRM: Duration = Duration::from_secs(5);

/// How long a decision waits for a watch's first list before it answers that it waits.
pub const FIRST_LIST_WAIT: Duration = Duration::from_secs(5);

/// The longest wait before a refused watch is started again.
const MAX_RESTART_DELAY: Duration = Duration::from_secs(60);

/// How many of the latest deletions a cache remembers (a few hundred KiB at most): a create's
/// answer is handled within moments of the watch delivering it.
const RECENTLY_DELETED: usize = 4096;

/// `(namespace, name)`; the namespace is empty for cluster-scoped objects.
pub type Key = (String, String);

/// Whether a cache can be read.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Health {
    /// Not listed yet.
    Starting,
    /// Listed, and the watch not refused since.
    Synced,
    /// The API server refused `verb`. `relisted`: when a list succeeded after the refusal; the
    /// cache is trusted again [`CONFIRM`] after it unless refused meanwhile.
    Refused {
        verb: &'static str,
        message: String,
        relisted: Option<Instant>,
    },
}

/// Why a cache cannot answer now. Its `Display` is for the user (a decision's message).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unavailable {
    /// The watch has not listed the objects yet.
    NotListed {
        /// The resource, `resourceflavors.kueue.x-k8s.io`.
        resource: &'static str,
        /// Why the last list failed, if one did (e.g. the resource is not served).
        last_error: Option<String>,
    },
    /// The API server refuses this controller a verb the cache needs.
    Refused {
        /// The resource, `resourceflavors.kueue.x-k8s.io`.
        resource: &'static str,
        /// `list` or `watch`.
        verb: &'static str,
        /// The API server's message.
        message: String,
    },
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unavailable::NotListed {
                resource,
                last_error,
            } => {
                write!(
                    f,
                    "waiting for this controller's watch of {resource} to list them (it reads \
                     them from that watch only)"
                )?;
                match last_error {
                    Some(e) => write!(f, "; the last list failed: {e}"),
                    None => Ok(()),
                }
            }
            Unavailable::Refused {
                resource,
                verb,
                message,
            } => write!(
                f,
                "this controller may not {verb} {resource} ({message}); it reads them from a \
                 watch only: grant its ServiceAccount list and watch on {resource} (the Helm \
                 chart's ClusterRole does)"
            ),
        }
    }
}

/// Objects of one kind as a watch last delivered them, reduced to what is read (`V`).
#[derive(Debug)]
pub struct WatchedCache<V> {
    /// `resourceflavors.kueue.x-k8s.io`: for messages.
    resource: &'static str,
    /// The group of a value, when the cache indexes them (see [`WatchedCache::grouped`]).
    group_of: Option<fn(&V) -> Option<String>>,
    inner: Mutex<Inner<V>>,
    /// Bumped on every change, for readers waiting on one.
    changes: watch::Sender<u64>,
}

#[derive(Debug)]
struct Inner<V> {
    /// What the watch delivered: each object's uid and what is kept of it.
    objects: HashMap<Key, (String, V)>,
    /// What a list in progress has delivered so far.
    relisting: Option<HashMap<Key, (String, V)>>,
    /// Objects this controller created that the watch has not delivered yet: uid, value and
    /// the number of the list they were created during. Read in place of what `objects`
    /// holds under the key (a create succeeds only once the name is free).
    created: HashMap<Key, (String, V, u64)>,
    /// Objects (by uid) this controller deleted whose deletion the watch has not delivered
    /// yet, with the number of the list they were deleted during: not read, so a decision
    /// right after a delete does not answer from the object it deleted.
    deleted: HashMap<Key, (String, u64)>,
    /// The uids of the last [`RECENTLY_DELETED`] deletions the watch delivered, so that a
    /// create whose answer is handled after its object's deletion arrived is not read.
    recently_deleted: std::collections::VecDeque<(Key, String)>,
    /// By group ([`WatchedCache::grouped`]): the keys that may hold a value of that group,
    /// in `objects` or `created` (a superset; reads confirm it).
    groups: HashMap<String, HashSet<Key>>,
    /// Lists started so far.
    lists: u64,
    /// The last failure of the watch that was not a refusal, until a list succeeds.
    last_error: Option<String>,
    health: Health,
}

impl<V> Inner<V> {
    /// What is read under `key`: our own create not delivered yet, else what the watch
    /// delivered, unless we deleted that very object.
    fn read(&self, key: &Key) -> Option<&V> {
        let deleted = |uid: &str| self.deleted.get(key).is_some_and(|(d, _)| d == uid);
        let created = self.created.get(key).filter(|(uid, ..)| !deleted(uid));
        let created = created.map(|(_, v, _)| v);
        let delivered = || {
            let found = self.objects.get(key).filter(|(uid, _)| !deleted(uid));
            found.map(|(_, v)| v)
        };
        created.or_else(delivered)
    }

    /// The end of a list: it replaces what was delivered, and our creates and deletes that
    /// it settles are forgotten. One begun before the list is settled by it: delivered or
    /// absent. One begun during the list may be missing from it, so it is kept.
    fn list_done(&mut self) {
        self.objects = self.relisting.take().unwrap_or_default();
        let (lists, objects) = (self.lists, &self.objects);
        let listed_uid = |k: &Key| objects.get(k).map(|(uid, _)| uid.as_str());
        self.created
            .retain(|k, (uid, _, during)| *during >= lists && listed_uid(k) != Some(uid));
        self.deleted
            .retain(|k, (uid, during)| *during >= lists || listed_uid(k) == Some(uid));
    }
}

impl<V> Inner<V> {
    /// Whether `key` holds a value of `group` in `objects` or `created`.
    fn holds(&self, key: &Key, group: &str, group_of: fn(&V) -> Option<String>) -> bool {
        let of = |v: &V| group_of(v).as_deref() == Some(group);
        self.objects.get(key).is_some_and(|(_, v)| of(v))
            || self.created.get(key).is_some_and(|(_, v, _)| of(v))
    }

    /// `key` now holds `value` (in `objects` or `created`): indexed under its group.
    fn index(&mut self, key: &Key, value: &V, group_of: Option<fn(&V) -> Option<String>>) {
        if let Some(group) = group_of.and_then(|g| g(value)) {
            self.groups.entry(group).or_default().insert(key.clone());
        }
    }

    /// `key` no longer holds `value` where it did: out of its group's index unless it still
    /// holds another value of that group.
    fn unindex(&mut self, key: &Key, value: &V, group_of: Option<fn(&V) -> Option<String>>) {
        let Some(group_of) = group_of else { return };
        let Some(group) = group_of(value) else { return };
        if self.holds(key, &group, group_of) {
            return;
        }
        if let Some(keys) = self.groups.get_mut(&group) {
            keys.remove(key);
            if keys.is_empty() {
                self.groups.remove(&group);
            }
        }
    }

    /// The index made anew from `objects` and `created` (after a list replaced them).
    fn reindex(&mut self, group_of: Option<fn(&V) -> Option<String>>) {
        let Some(group_of) = group_of else { return };
        let mut groups: HashMap<String, HashSet<Key>> = HashMap::new();
        let held = self.objects.iter().map(|(k, (_, v))| (k, v));
        let created = self.created.iter().map(|(k, (_, v, _))| (k, v));
        for (key, value) in held.chain(created) {
            if let Some(group) = group_of(value) {
                groups.entry(group).or_default().insert(key.clone());
            }
        }
        self.groups = groups;
    }
}

impl<V: Clone> WatchedCache<V> {
    /// An empty cache of `resource`, not listed yet.
    pub fn new(resource: &'static str) -> Self {
        Self::with_groups(resource, None)
    }

    /// An empty cache of `resource` that also indexes its values by `group_of` (e.g. the
    /// Workload a request was made for), so that [`Self::select_group`] reads one group
    /// without going through every object.
    pub fn grouped(resource: &'static str, group_of: fn(&V) -> Option<String>) -> Self {
        Self::with_groups(resource, Some(group_of))
    }

    fn with_groups(resource: &'static str, group_of: Option<fn(&V) -> Option<String>>) -> Self {
        Self {
            resource,
            group_of,
            inner: Mutex::new(Inner {
                objects: HashMap::new(),
                relisting: None,
                created: HashMap::new(),
                deleted: HashMap::new(),
                recently_deleted: std::collections::VecDeque::new(),
                groups: HashMap::new(),
                lists: 0,
                last_error: None,
                health: Health::Starting,
            }),
            changes: watch::channel(0).0,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<V>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes in what the watch delivered; `keep` reduces an object to what is read.
    pub fn apply<K: Resource>(&self, event: &watcher::Event<K>, keep: impl Fn(&K) -> V) {
        let key = |k: &K| (k.namespace().unwrap_or_default(), k.name_any());
        let uid = |k: &K| k.uid().unwrap_or_default();
        let group_of = self.group_of;
        {
            let mut inner = self.lock();
            match event {
                watcher::Event::Init => {
                    inner.lists += 1;
                    inner.relisting = Some(HashMap::new());
                }
                watcher::Event::InitApply(k) => {
                    let value = (uid(k), keep(k));
                    let relisting = inner.relisting.get_or_insert_with(HashMap::new);
                    relisting.insert(key(k), value);
                }
                watcher::Event::InitDone => {
                    inner.last_error = None;
                    inner.list_done();
                    inner.reindex(group_of);
                    inner.health = match &inner.health {
                        Health::Refused { verb, message, .. } => Health::Refused {
                            verb,
                            message: message.clone(),
                            relisted: Some(Instant::now()),
                        },
                        _ => Health::Synced,
                    };
                }
                watcher::Event::Apply(k) => {
                    let (key, uid) = (key(k), uid(k));
                    // Our create delivered. (A version of another object under the name, an
                    // older one, does not replace it.)
                    let mut gone = Vec::new();
                    if inner.created.get(&key).is_some_and(|(c, ..)| *c == uid)
                        && let Some((_, v, _)) = inner.created.remove(&key)
                    {
                        gone.push(v);
                    }
                    let value = keep(k);
                    inner.index(&key, &value, group_of);
                    if let Some((_, old)) = inner.objects.insert(key.clone(), (uid, value)) {
                        gone.push(old);
                    }
                    for old in gone {
                        inner.unindex(&key, &old, group_of);
                    }
                }
                watcher::Event::Delete(k) => {
                    let (key, uid) = (key(k), uid(k));
                    let mut gone: Vec<V> = inner
                        .objects
                        .remove(&key)
                        .map(|(_, v)| v)
                        .into_iter()
                        .collect();
                    if inner.created.get(&key).is_some_and(|(c, ..)| *c == uid)
                        && let Some((_, v, _)) = inner.created.remove(&key)
                    {
                        gone.push(v);
                    }
                    for old in gone {
                        inner.unindex(&key, &old, group_of);
                    }
                    if inner.deleted.get(&key).is_some_and(|(d, _)| *d == uid) {
                        inner.deleted.remove(&key);
                    }
                    if inner.recently_deleted.len() >= RECENTLY_DELETED {
                        inner.recently_deleted.pop_front();
                    }
                    inner.recently_deleted.push_back((key, uid));
                }
            }
            // A change the watch delivered after a list: the watch works.
            let watched = matches!(event, watcher::Event::Apply(_) | watcher::Event::Delete(_));
            if watched && inner.relisting.is_none() {
                inner.health = Health::Synced;
            }
        }
        self.changes.send_modify(|n| *n += 1);
    }

    /// Takes in a failure of the watch. Returns the refused verb when the API server refused
    /// the list or the watch (403): the watch must then be started again.
    pub fn failed(&self, error: &watcher::Error) -> Option<&'static str> {
        let (verb, status) = match error {
            watcher::Error::InitialListFailed(kube::Error::Api(s)) => ("list", s.as_ref()),
            watcher::Error::WatchStartFailed(kube::Error::Api(s))
            | watcher::Error::WatchFailed(kube::Error::Api(s)) => ("watch", s.as_ref()),
            watcher::Error::WatchError(s) => ("watch", s.as_ref()),
            _ => {
                self.lock().last_error = Some(error.to_string());
                return None;
            }
        };
        if status.code != 403 {
            self.lock().last_error = Some(error.to_string());
            return None;
        }
        self.lock().health = Health::Refused {
            verb,
            message: status.message.clone(),
            relisted: None,
        };
        self.changes.send_modify(|n| *n += 1);
        Some(verb)
    }

    /// Records an object (of uid `uid`) this controller just created, until the watch delivers
    /// it: read like a delivered one, so a decision right after the create does not create it
    /// again, and in place of any older object the watch still shows under its name.
    pub fn created(&self, key: Key, uid: String, value: V) {
        let mut inner = self.lock();
        // The watch may have delivered it (and later versions of it, or its deletion) before
        // the create's answer was handled: what it delivered is newer.
        let delivered = inner.objects.get(&key).is_some_and(|(u, _)| *u == uid);
        if delivered || inner.recently_deleted.contains(&(key.clone(), uid.clone())) {
            return;
        }
        let lists = inner.lists;
        inner.index(&key, &value, self.group_of);
        if let Some((_, old, _)) = inner.created.insert(key.clone(), (uid, value, lists)) {
            inner.unindex(&key, &old, self.group_of);
        }
    }

    /// Records that this controller deleted the object of uid `uid` under `key` (or found it
    /// gone), until the watch delivers the deletion: not read meanwhile, so a decision right
    /// after the delete does not answer from it.
    pub fn deleted(&self, key: Key, uid: String) {
        let mut inner = self.lock();
        let lists = inner.lists;
        inner.deleted.insert(key, (uid, lists));
    }

    /// `Ok` when the cache may be read at `now`.
    fn readable(inner: &Inner<V>, resource: &'static str, now: Instant) -> Result<(), Unavailable> {
        match &inner.health {
            Health::Synced => Ok(()),
            Health::Refused {
                relisted: Some(at), ..
            } if now.duration_since(*at) >= CONFIRM => Ok(()),
            Health::Starting => Err(Unavailable::NotListed {
                resource,
                last_error: inner.last_error.clone(),
            }),
            Health::Refused { verb, message, .. } => Err(Unavailable::Refused {
                resource,
                verb,
                message: message.clone(),
            }),
        }
    }

    /// The object under `key`, `None` when there is none.
    pub fn get(&self, key: &Key) -> Result<Option<V>, Unavailable> {
        let inner = self.lock();
        Self::readable(&inner, self.resource, Instant::now())?;
        Ok(inner.read(key).cloned())
    }

    /// The objects of `group` ([`Self::grouped`]) that `select` picks, with their keys: as
    /// [`Self::select`] restricted to the group, at the cost of the group's size. Empty for a
    /// cache without groups.
    pub fn select_group(
        &self,
        group: &str,
        select: impl Fn(&Key, &V) -> bool,
    ) -> Result<Vec<(Key, V)>, Unavailable> {
        let inner = self.lock();
        Self::readable(&inner, self.resource, Instant::now())?;
        let (Some(group_of), Some(keys)) = (self.group_of, inner.groups.get(group)) else {
            return Ok(Vec::new());
        };
        let found = keys.iter().filter_map(|k| inner.read(k).map(|v| (k, v)));
        let found = found.filter(|(k, v)| group_of(v).as_deref() == Some(group) && select(k, v));
        Ok(found.map(|(k, v)| (k.clone(), v.clone())).collect())
    }

    /// The objects `select` picks, with their keys.
    pub fn select(&self, select: impl Fn(&Key, &V) -> bool) -> Result<Vec<(Key, V)>, Unavailable> {
        let inner = self.lock();
        Self::readable(&inner, self.resource, Instant::now())?;
        let created = inner
            .created
            .keys()
            .filter(|k| !inner.objects.contains_key(*k));
        let keys = inner.objects.keys().chain(created);
        let found = keys.filter_map(|k| inner.read(k).map(|v| (k, v)));
        let found = found.filter(|(k, v)| select(k, v));
        Ok(found.map(|(k, v)| (k.clone(), v.clone())).collect())
    }

    /// Waits at most `bound` for the cache to change (a delivery or a failure); returns at
    /// once when `ready` already holds.
    pub async fn wait_until(&self, bound: Duration, ready: impl Fn(&Self) -> bool) {
        let mut changes = self.changes.subscribe();
        let wait = async {
            while !ready(self) {
                if changes.changed().await.is_err() {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(bound, wait).await;
    }

    /// Waits at most [`FIRST_LIST_WAIT`] for the watch's first list, then says whether the cache
    /// can be read.
    pub async fn listed(&self) -> Result<(), Unavailable> {
        self.wait_until(FIRST_LIST_WAIT, Self::settled).await;
        Self::readable(&self.lock(), self.resource, Instant::now())
    }

    /// Told of every change (a delivery or a failure), for a task that judges the whole cache
    /// again on each.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Whether a reader waiting for the first list can stop: listed, or refused.
    pub fn settled(&self) -> bool {
        self.lock().health != Health::Starting
    }
}

impl<V: Clone + Send + 'static> WatchedCache<V> {
    /// The events of a watch of `api` after the cache has taken each in, without end. A
    /// refusal is logged and the watch started again from a fresh list, after 1 s doubling to
    /// a minute; other failures are retried by the watcher with its backoff.
    pub fn watch<K>(
        self: std::sync::Arc<Self>,
        api: Api<K>,
        config: watcher::Config,
        keep: fn(&K) -> V,
    ) -> impl Stream<Item = watcher::Event<K>> + Send
    where
        K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + fmt::Debug,
        K: Send + Sync + 'static,
    {
        let start = move || {
            watcher(api.clone(), config.clone())
                .default_backoff()
                .boxed()
        };
        let state: (Option<BoxStream<'static, _>>, u32) = (None, 0);
        futures::stream::unfold(state, move |(mut events, mut refusals)| {
            let (cache, start) = (self.clone(), start.clone());
            async move {
                loop {
                    let current = match events.as_mut() {
                        Some(current) => current,
                        None => {
                            tokio::time::sleep(restart_delay(refusals)).await;
                            events.insert(start())
                        }
                    };
                    match current.next().await {
                        Some(Ok(event)) => {
                            cache.apply(&event, keep);
                            match event {
                                watcher::Event::InitDone if refusals > 0 => {
                                    info!(resource = cache.resource, "listed again after a refusal")
                                }
                                watcher::Event::Apply(_) | watcher::Event::Delete(_) => {
                                    refusals = 0
                                }
                                _ => {}
                            }
                            return Some((event, (events, refusals)));
                        }
                        Some(Err(e)) => match cache.failed(&e) {
                            Some(verb) => {
                                error!(resource = cache.resource, verb, error = %e,
                                    "the API server refuses this controller a verb it needs; \
                                     decisions that read these objects wait until it is granted");
                                refusals = refusals.saturating_add(1);
                                events = None;
                            }
                            None => warn!(resource = cache.resource, error = %e, "watching"),
                        },
                        None => events = None,
                    }
                }
            }
        })
    }
}

impl<V: Clone + Send + 'static> WatchedCache<V> {
    /// Keeps the cache filled from a watch of every object `api` reaches, until dropped.
    pub async fn fill<K>(self: std::sync::Arc<Self>, api: Api<K>, keep: fn(&K) -> V)
    where
        K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + fmt::Debug,
        K: Send + Sync + 'static,
    {
        let events = self.watch(api, watcher::Config::default(), keep);
        events.for_each(|_| async {}).await;
    }
}

/// The wait before starting a watch again after `refusals` refusals in a row.
fn restart_delay(refusals: u32) -> Duration {
    if refusals == 0 {
        return Duration::ZERO;
    }
    Duration::from_secs(1u64 << refusals.min(7).saturating_sub(1)).min(MAX_RESTART_DELAY)
}

/// The watcher's error for a 403 on `verb` (`list` or `watch`): for tests of a check that reads
/// a cache, to show what its users read when a permission is missing.
pub fn forbidden(verb: &str, message: &str) -> watcher::Error {
    let status = kube::core::Status::failure(message, "Forbidden")
        .with_code(403)
        .boxed();
    match verb {
        "list" => watcher::Error::InitialListFailed(kube::Error::Api(status)),
        _ => watcher::Error::WatchStartFailed(kube::Error::Api(status)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ResourceFlavor, ResourceFlavorSpec};
    use kube::runtime::watcher::Event;

    fn flavor(name: &str) -> ResourceFlavor {
        ResourceFlavor::new(name, ResourceFlavorSpec::default())
    }

    fn key(name: &str) -> Key {
        (String::new(), name.into())
    }

    fn name_of(f: &ResourceFlavor) -> String {
        f.name_any()
    }

    fn listed(names: &[&str]) -> WatchedCache<String> {
        let cache = WatchedCache::new("resourceflavors.kueue.x-k8s.io");
        cache.apply(&Event::Init, name_of);
        for n in names {
            cache.apply(&Event::InitApply(flavor(n)), name_of);
        }
        cache.apply(&Event::<ResourceFlavor>::InitDone, name_of);
        cache
    }

    #[test]
    fn nothing_is_read_before_the_first_list_completes() {
        let cache = WatchedCache::<String>::new("resourceflavors.kueue.x-k8s.io");
        cache.apply(&Event::Init, name_of);
        cache.apply(&Event::InitApply(flavor("a")), name_of);
        let err = cache.get(&key("a")).expect_err("not listed");
        assert!(err.to_string().contains("to list them"), "{err}");
        assert!(!cache.settled());
        cache.apply(&Event::<ResourceFlavor>::InitDone, name_of);
        assert_eq!(cache.get(&key("a")), Ok(Some("a".into())));
        assert_eq!(cache.get(&key("b")), Ok(None));
    }

    #[test]
    fn changes_and_deletions_are_taken_in_and_a_relist_replaces_everything() {
        let cache = listed(&["a", "b"]);
        cache.apply(&Event::Apply(flavor("c")), name_of);
        cache.apply(&Event::Delete(flavor("a")), name_of);
        let all = cache.select(|_, _| true).expect("readable");
        let mut all: Vec<String> = all.into_iter().map(|(_, v)| v).collect();
        all.sort();
        assert_eq!(all, ["b", "c"]);
        // A relist in progress keeps answering from the last complete one.
        cache.apply(&Event::Init, name_of);
        cache.apply(&Event::InitApply(flavor("d")), name_of);
        assert_eq!(cache.get(&key("b")), Ok(Some("b".into())));
        cache.apply(&Event::<ResourceFlavor>::InitDone, name_of);
        assert_eq!(
            cache.select(|_, _| true),
            Ok(vec![(key("d"), "d".to_string())])
        );
    }

    #[test]
    fn a_refused_list_or_watch_is_named_and_blocks_reads_until_confirmed_again() {
        for verb in ["list", "watch"] {
            let cache = listed(&["a"]);
            assert_eq!(
                cache.failed(&forbidden(verb, "forbidden by test")),
                Some(verb)
            );
            let err = cache.get(&key("a")).expect_err("refused");
            let message = err.to_string();
            assert!(
                message.contains(&format!("may not {verb} resourceflavors")),
                "{message}"
            );
            assert!(message.contains("forbidden by test"), "{message}");
            assert!(
                message.contains("grant its ServiceAccount list and watch"),
                "{message}"
            );
            // Listed again: still refused until the watch has gone unrefused for a while.
            cache.apply(&Event::Init, name_of);
            cache.apply(&Event::<ResourceFlavor>::InitDone, name_of);
            assert!(cache.get(&key("a")).is_err());
            {
                let inner = cache.lock();
                let later = Instant::now() + CONFIRM;
                assert_eq!(WatchedCache::readable(&inner, "x", later), Ok(()));
            }
            // A change delivered by the watch proves it works at once.
            cache.apply(&Event::Apply(flavor("b")), name_of);
            assert_eq!(cache.get(&key("b")), Ok(Some("b".into())));
        }
        // A list that fails otherwise (the resource not served) is said while nothing is listed.
        let cache = WatchedCache::<String>::new("x");
        let missing = kube::core::Status::failure("the server could not find it", "NotFound");
        let missing = kube::Error::Api(missing.with_code(404).boxed());
        assert_eq!(
            cache.failed(&watcher::Error::InitialListFailed(missing)),
            None
        );
        let err = cache.get(&key("a")).expect_err("not listed").to_string();
        assert!(err.contains("the last list failed: "), "{err}");
        assert!(err.contains("could not find it"), "{err}");
        // Other failures (a timeout, an expired version) are the watcher's to retry.
        let cache = listed(&["a"]);
        let gone = kube::core::Status::failure("too old", "Expired")
            .with_code(410)
            .boxed();
        assert_eq!(cache.failed(&watcher::Error::WatchError(gone)), None);
        assert!(cache.get(&key("a")).is_ok());
    }

    /// A flavor named `name` of uid `uid`, kept as `"name/uid"`.
    fn versioned(name: &str, uid: &str) -> ResourceFlavor {
        let mut f = flavor(name);
        f.metadata.uid = Some(uid.into());
        f
    }

    fn name_and_uid(f: &ResourceFlavor) -> String {
        format!("{}/{}", f.name_any(), f.uid().unwrap_or_default())
    }

    fn read(cache: &WatchedCache<String>, name: &str) -> Option<String> {
        cache.get(&key(name)).expect("readable")
    }

    fn select_all(cache: &WatchedCache<String>) -> Vec<String> {
        let all = cache.select(|_, _| true).expect("readable");
        let mut all: Vec<String> = all.into_iter().map(|(_, v)| v).collect();
        all.sort();
        all
    }

    #[test]
    fn a_created_object_is_read_until_the_watch_delivers_it_or_a_relist_lacks_it() {
        let cache = listed(&[]);
        let apply = |e: Event<ResourceFlavor>| cache.apply(&e, name_and_uid);
        cache.created(key("new"), "1".into(), "created".into());
        assert_eq!(read(&cache, "new").as_deref(), Some("created"));
        assert_eq!(select_all(&cache), ["created"]);
        apply(Event::Apply(versioned("new", "1")));
        assert_eq!(read(&cache, "new").as_deref(), Some("new/1"));
        apply(Event::Delete(versioned("new", "1")));
        assert_eq!(read(&cache, "new"), None);
        // Created under the name of an object the watch still shows (its deletion not delivered
        // yet): ours is read, also when that older object's deletion arrives.
        apply(Event::Apply(versioned("reused", "1")));
        cache.created(key("reused"), "2".into(), "created".into());
        assert_eq!(read(&cache, "reused").as_deref(), Some("created"));
        apply(Event::Apply(versioned("reused", "1")));
        apply(Event::Delete(versioned("reused", "1")));
        assert_eq!(read(&cache, "reused").as_deref(), Some("created"));
        apply(Event::Apply(versioned("reused", "2")));
        assert_eq!(read(&cache, "reused").as_deref(), Some("reused/2"));
        // Created during a list that has it: delivered.
        apply(Event::Init);
        apply(Event::InitApply(versioned("both", "1")));
        cache.created(key("both"), "1".into(), "created".into());
        apply(Event::InitDone);
        assert_eq!(read(&cache, "both").as_deref(), Some("both/1"));
        // Created, then deleted while the watch was down: the next list does not have it.
        cache.created(key("gone"), "1".into(), "created".into());
        apply(Event::Init);
        apply(Event::InitDone);
        assert_eq!(read(&cache, "gone"), None);
        // The watch delivered the create, and a later version, before the create's answer was
        // handled (found by the comparison benchmark: the provisioned request was shadowed by
        // the created one, and its Workload never answered): the delivered version is read.
        apply(Event::Apply(versioned("raced", "1")));
        cache.apply(&Event::Apply(versioned("raced", "1")), |f| {
            format!("{}/provisioned", name_and_uid(f))
        });
        cache.created(key("raced"), "1".into(), "created".into());
        assert_eq!(
            read(&cache, "raced").as_deref(),
            Some("raced/1/provisioned")
        );
        // ... or its deletion too: nothing is read.
        apply(Event::Apply(versioned("brief", "1")));
        apply(Event::Delete(versioned("brief", "1")));
        cache.created(key("brief"), "1".into(), "created".into());
        assert_eq!(read(&cache, "brief"), None);
        // Created while a list was in progress: kept, the list may predate it.
        apply(Event::Init);
        cache.created(key("during"), "1".into(), "created".into());
        apply(Event::InitDone);
        assert_eq!(read(&cache, "during").as_deref(), Some("created"));
    }

    #[test]
    fn a_deleted_object_is_not_read_though_the_watch_has_not_delivered_its_deletion() {
        let cache = WatchedCache::new("x");
        let apply = |e: Event<ResourceFlavor>| cache.apply(&e, name_and_uid);
        apply(Event::Init);
        apply(Event::InitApply(versioned("a", "1")));
        apply(Event::InitApply(versioned("b", "1")));
        apply(Event::InitDone);
        cache.deleted(key("a"), "1".into());
        assert_eq!(read(&cache, "a"), None);
        assert_eq!(select_all(&cache), ["b/1"]);
        // Versions of it queued before the deletion stay unread; the deletion ends the record.
        apply(Event::Apply(versioned("a", "1")));
        assert_eq!(read(&cache, "a"), None);
        apply(Event::Delete(versioned("a", "1")));
        assert!(cache.lock().deleted.is_empty());
        // Another object under the name is read: only that very object was deleted.
        cache.deleted(key("b"), "1".into());
        apply(Event::Apply(versioned("b", "2")));
        assert_eq!(read(&cache, "b").as_deref(), Some("b/2"));
        // Ours, created and deleted before the watch delivered either.
        cache.created(key("c"), "1".into(), "created".into());
        cache.deleted(key("c"), "1".into());
        assert_eq!(read(&cache, "c"), None);
        // A list that still has a deleted object (its deletion pending, or the list older than
        // the delete) keeps it unread; a list without it ends the record.
        cache.deleted(key("d"), "1".into());
        apply(Event::Init);
        apply(Event::InitApply(versioned("d", "1")));
        apply(Event::InitDone);
        assert_eq!(read(&cache, "d"), None);
        apply(Event::Init);
        apply(Event::InitDone);
        let inner = cache.lock();
        assert!(
            inner.deleted.is_empty() && inner.created.is_empty(),
            "{inner:?}"
        );
    }

    #[test]
    fn restarts_back_off_to_a_minute() {
        let delays: Vec<u64> = (0..9).map(|n| restart_delay(n).as_secs()).collect();
        assert_eq!(delays, [0, 1, 2, 4, 8, 16, 32, 60, 60]);
        assert!(restart_delay(u32::MAX) <= MAX_RESTART_DELAY);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_waits_for_the_first_list_at_most_its_bound() {
        let cache = std::sync::Arc::new(WatchedCache::<String>::new("x"));
        let waiting = tokio::spawn({
            let cache = cache.clone();
            async move {
                cache
                    .wait_until(Duration::from_secs(10), WatchedCache::settled)
                    .await;
                cache.get(&key("a"))
            }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        cache.apply(&Event::Init, name_of);
        cache.apply(&Event::InitApply(flavor("a")), name_of);
        cache.apply(&Event::<ResourceFlavor>::InitDone, name_of);
        assert_eq!(waiting.await.expect("joined"), Ok(Some("a".into())));
        let never = WatchedCache::<String>::new("x");
        never
            .wait_until(Duration::from_secs(10), WatchedCache::settled)
            .await;
        assert!(never.get(&key("a")).is_err());
    }

    /// The group of a name: what comes before its first `-`. (`&String`: a group function
    /// takes `&V`.)
    #[allow(clippy::ptr_arg)]
    fn prefix(value: &String) -> Option<String> {
        value.split('-').next().map(str::to_string)
    }

    fn group(cache: &WatchedCache<String>, group: &str) -> Vec<String> {
        let found = cache.select_group(group, |_, _| true).expect("readable");
        let mut names: Vec<String> = found.into_iter().map(|(_, v)| v).collect();
        names.sort();
        names
    }

    #[test]
    fn a_group_is_read_without_the_others_through_changes_creates_and_relists() {
        let cache = WatchedCache::grouped("resourceflavors.kueue.x-k8s.io", prefix);
        cache.apply(&Event::Init, name_of);
        for n in ["a-1", "a-2", "b-1"] {
            cache.apply(&Event::InitApply(flavor(n)), name_of);
        }
        cache.apply(&Event::<ResourceFlavor>::InitDone, name_of);
        assert_eq!(group(&cache, "a"), ["a-1", "a-2"]);
        assert_eq!(group(&cache, "b"), ["b-1"]);
        assert!(group(&cache, "c").is_empty());

        cache.apply(&Event::Apply(flavor("a-3")), name_of);
        cache.apply(&Event::Delete(flavor("a-1")), name_of);
        assert_eq!(group(&cache, "a"), ["a-2", "a-3"]);
        // Our own create, read before the watch delivers it; then delivered.
        cache.created(key("a-4"), String::new(), "a-4".into());
        assert_eq!(group(&cache, "a"), ["a-2", "a-3", "a-4"]);
        cache.apply(&Event::Apply(flavor("a-4")), name_of);
        assert_eq!(group(&cache, "a"), ["a-2", "a-3", "a-4"]);
        // Deleted by us: not read while the watch has not shown it.
        let uid = String::new();
        cache.deleted(key("a-2"), uid);
        assert_eq!(group(&cache, "a"), ["a-3", "a-4"]);

        // A relist replaces everything, the index with it.
        cache.apply(&Event::Init, name_of);
        cache.apply(&Event::InitApply(flavor("b-1")), name_of);
        cache.apply(&Event::<ResourceFlavor>::InitDone, name_of);
        assert!(group(&cache, "a").is_empty());
        assert_eq!(group(&cache, "b"), ["b-1"]);
        assert!(
            !cache.lock().groups.contains_key("a"),
            "no index left for a gone group"
        );
    }
}

//! The Workload watch: keeps the cache every replica holds, and hands changes and deletions
//! to the reconciler while this replica leads.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Client, ResourceExt};
use prometheus_client::metrics::histogram::Histogram;
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use super::{own_writes, relist};
use crate::api::{Workload, workload_condition as cond};
use crate::check::CachedPodSets;

/// What the Workload watch hands on, for [`start`]'s caller.
pub(super) struct Feed {
    /// Told when a list is complete and in the cache.
    pub(super) synced: Arc<tokio::sync::Notify>,
    /// Changes for the reconciler (while leading).
    pub(super) changes: mpsc::Receiver<Workload>,
    /// Deleted Workloads, to release (while leading).
    pub(super) deleted: mpsc::UnboundedReceiver<Workload>,
    /// Our status writes, to know when the cache holds them.
    pub(super) own_writes: Arc<own_writes::OwnWrites>,
}

/// Starts watching every Workload into `cache` (kept on every replica); changes reach the
/// reconciler only while this replica leads (on taking the lead, everything cached is
/// reconciled once).
pub(super) fn start(
    client: &Client,
    (cache, writer): (
        reflector::Store<Workload>,
        reflector::store::Writer<Workload>,
    ),
    pod_sets: CachedPodSets,
    reconcile_all: &mpsc::Sender<()>,
    reserved_seen: Histogram,
    leading: &watch::Receiver<bool>,
    background: &mut super::tasks::TaskGroup,
) -> Feed {
    let (changes_tx, changes) = mpsc::channel::<Workload>(256);
    // Unbounded: a burst of deletions must not lose a release; each entry is one Workload.
    let (deleted_tx, deleted) = mpsc::unbounded_channel::<Workload>();
    let feed = Feed {
        synced: Default::default(),
        changes,
        deleted,
        own_writes: Default::default(),
    };
    let events = watcher(
        Api::<Workload>::all(client.clone()),
        watcher::Config::default().any_semantic(),
    )
    .default_backoff();
    let targets = Targets {
        cache,
        synced: feed.synced.clone(),
        changes: changes_tx,
        deleted: deleted_tx,
        reconcile_all: reconcile_all.clone(),
        leading: leading.clone(),
        own_writes: feed.own_writes.clone(),
        reserved_seen,
    };
    background.push(tokio::spawn(watch_workloads(
        events, writer, pod_sets, targets,
    )));
    feed
}

/// Where the Workload watch hands what it sees.
struct Targets {
    /// The cache the watch fills.
    cache: reflector::Store<Workload>,
    /// Told when a list is complete and in the cache.
    synced: Arc<tokio::sync::Notify>,
    /// Changes for the reconciler (while leading).
    changes: mpsc::Sender<Workload>,
    /// Deleted Workloads, to release (while leading).
    deleted: mpsc::UnboundedSender<Workload>,
    /// Asks for every cached Workload to be reconciled.
    reconcile_all: mpsc::Sender<()>,
    leading: watch::Receiver<bool>,
    own_writes: Arc<own_writes::OwnWrites>,
    /// `kueue_ac_quota_reserved_seen_seconds`: Kueue's reservation → this watch delivering it.
    reserved_seen: Histogram,
}

/// Keeps the Workload cache and forwards changes to the reconciler while this replica leads.
/// What a (re)list brings is not forwarded one by one: the cache takes it only at the list's
/// end, so its end asks for everything to be reconciled instead (see [`relist::WorkloadLists`]).
async fn watch_workloads<S>(
    events: S,
    writer: reflector::store::Writer<Workload>,
    pod_sets: CachedPodSets,
    w: Targets,
) where
    S: futures::Stream<Item = Result<watcher::Event<Workload>, watcher::Error>>,
{
    let events = slim_and_cache(events, writer, pod_sets, &w);
    let mut events = std::pin::pin!(events);
    let mut lists = relist::WorkloadLists::default();
    while let Some(event) = events.next().await {
        let now = tokio::time::Instant::now();
        // The reflector has applied `event` to the cache by now.
        let touched = match event {
            Err(e) => {
                warn!(error = %e, "watching Workloads");
                continue;
            }
            Ok(watcher::Event::Init) => {
                lists.begin(w.cache.state());
                continue;
            }
            Ok(watcher::Event::InitApply(wl)) => {
                lists.delivered(&wl);
                continue;
            }
            Ok(watcher::Event::InitDone) => {
                list_done(&w, lists.done(), now);
                continue;
            }
            Ok(watcher::Event::Apply(wl)) => {
                if let (Some(uid), Some(rv)) = (wl.uid(), wl.resource_version()) {
                    w.own_writes.seen(&uid, &rv, now);
                }
                wl
            }
            Ok(watcher::Event::Delete(wl)) => wl,
        };
        // A failed send means the reconciler stopped: the cache is kept for metrics and
        // readiness all the same.
        if *w.leading.borrow() {
            let _ = w.changes.send(touched).await;
        }
    }
}

/// The events, stripped of what the runtime never reads, applied to the cache by `writer`; a
/// deletion is handed on for release at once while this replica leads. A reservation is timed
/// against the cached version the event replaces (`reserved_seen`).
fn slim_and_cache<S>(
    events: S,
    writer: reflector::store::Writer<Workload>,
    pod_sets: CachedPodSets,
    w: &Targets,
) -> impl futures::Stream<Item = Result<watcher::Event<Workload>, watcher::Error>>
where
    S: futures::Stream<Item = Result<watcher::Event<Workload>, watcher::Error>>,
{
    let (leading, deleted) = (w.leading.clone(), w.deleted.clone());
    let (cache, reserved_seen) = (w.cache.clone(), w.reserved_seen.clone());
    events
        .modify(move |wl| slim(wl, pod_sets))
        .inspect(move |event| {
            // Live changes only: a list brings reservations of any age.
            if let Ok(watcher::Event::Apply(wl)) = event {
                let cached = cache.get(&reflector::ObjectRef::from_obj(wl));
                if let Some(at) = newly_reserved(cached.as_deref(), wl) {
                    let late = Timestamp::now().duration_since(at).as_secs_f64();
                    reserved_seen.observe(late.max(0.0));
                }
            }
        })
        .inspect(move |event| {
            if let Ok(watcher::Event::Delete(wl)) = event
                && *leading.borrow()
            {
                // Fails only once the runtime is stopping.
                let _ = deleted.send(wl.clone());
            }
        })
        .reflect(writer)
}

/// When Kueue reserved quota for `new` (its `QuotaReserved` condition's lastTransitionTime),
/// if the version it replaces in the cache did not show that reservation yet.
fn newly_reserved(cached: Option<&Workload>, new: &Workload) -> Option<Timestamp> {
    let reserved_at = |wl: &Workload| {
        wl.condition(cond::QUOTA_RESERVED)
            .filter(|c| c.status == "True")
            .map(|c| c.last_transition_time.0)
    };
    let at = reserved_at(new)?;
    (cached.and_then(reserved_at) != Some(at)).then_some(at)
}

/// Drops what the runtime and the check do not read: managedFields, the last-applied
/// annotation, and the podsets of a Workload that holds no quota (unless the check keeps them):
/// with their pod templates (k8s-openapi's `PodTemplateSpec` alone is 1.8 KiB before any
/// string) they are most of its size. Every change of a Workload comes as a whole object, so
/// one that gets quota is cached whole again before it is decided.
fn slim(wl: &mut Workload, pod_sets: CachedPodSets) {
    wl.managed_fields_mut().clear();
    wl.annotations_mut()
        .remove("kubectl.kubernetes.io/last-applied-configuration");
    let holds_quota =
        wl.condition_is_true(cond::QUOTA_RESERVED) && !wl.condition_is_true(cond::FINISHED);
    if pod_sets == CachedPodSets::WhileQuotaReserved && !holds_quota {
        wl.spec.pod_sets = Vec::new();
    }
}

/// A (re)list is complete and in the cache: reconciles waiting for our own write may go on,
/// and (while leading) what vanished meanwhile is released and a relist reconciles everything.
fn list_done(w: &Targets, done: relist::ListDone, now: tokio::time::Instant) {
    for (uid, rv) in &done.versions {
        w.own_writes.seen(uid, rv, now);
    }
    w.synced.notify_one();
    if !*w.leading.borrow() {
        return;
    }
    for wl in done.gone {
        debug!(workload = %wl.name_any(), "deleted while the watch was away");
        let _ = w.deleted.send((*wl).clone());
    }
    // The first list is covered by the reconcile of everything on taking the lead, which
    // waits for it.
    if done.relist {
        info!(
            workloads = done.versions.len(),
            "Workloads listed again; reconciling all of them"
        );
        let _ = w.reconcile_all.try_send(());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::CheckState;
    use watcher::Event::{Apply, Delete, Init, InitApply, InitDone};

    /// What the Workload watch handed on.
    struct Handed {
        changes: Vec<String>,
        deleted: Vec<String>,
        reconcile_all: usize,
        /// Each change, with whether the cache held that version (or a later one) when it was
        /// handed on.
        changes_cached: Vec<bool>,
        /// The cache at the end.
        cache: reflector::Store<Workload>,
    }

    fn wl(name: &str, version: &str) -> Workload {
        crate::testing::WorkloadBuilder::new("ns", name)
            .resource_version(version)
            .build()
    }

    /// The events of one list of the watch: each Workload it found, then its end.
    fn listing<const N: usize>(found: [Workload; N]) -> Vec<watcher::Event<Workload>> {
        let found = found.into_iter().map(InitApply);
        std::iter::once(Init)
            .chain(found)
            .chain([InitDone])
            .collect()
    }

    /// Feeds `events` to the Workload watch of a replica that leads (or not) and collects what
    /// it hands on.
    async fn feed(events: Vec<watcher::Event<Workload>>, leading: bool) -> Handed {
        feed_keeping(events, leading, CachedPodSets::default()).await
    }

    async fn feed_keeping(
        events: Vec<watcher::Event<Workload>>,
        leading: bool,
        pod_sets: CachedPodSets,
    ) -> Handed {
        let (cache, writer) = reflector::store::<Workload>();
        let (changes_tx, mut changes_rx) = mpsc::channel(64);
        let (deleted_tx, mut deleted_rx) = mpsc::unbounded_channel();
        let (all_tx, mut all_rx) = mpsc::channel(8);
        let (_leading_tx, leading_rx) = watch::channel(leading);
        let targets = Targets {
            cache: cache.clone(),
            synced: Default::default(),
            changes: changes_tx,
            deleted: deleted_tx,
            reconcile_all: all_tx,
            leading: leading_rx,
            own_writes: Default::default(),
            reserved_seen: Histogram::new([1.0]),
        };
        // Checks, as each change arrives, that the cache already holds it.
        let cache_check = cache.clone();
        let collect = async move {
            let mut names = Vec::new();
            let mut cached = Vec::new();
            while let Some(w) = changes_rx.recv().await {
                // That version or a later one (the watch may have gone on meanwhile).
                let version = |w: &Workload| {
                    w.resource_version()
                        .and_then(|v| v.parse::<u64>().ok())
                        .unwrap_or_default()
                };
                let held = cache_check
                    .get(&reflector::ObjectRef::from_obj(&w))
                    .is_some_and(|c| version(&c) >= version(&w));
                names.push(w.name_any());
                cached.push(held);
            }
            (names, cached)
        };
        let ((), (changes, changes_cached)) = tokio::join!(
            watch_workloads(
                futures::stream::iter(events.into_iter().map(Ok)),
                writer,
                pod_sets,
                targets
            ),
            collect
        );
        let mut deleted = Vec::new();
        while let Ok(w) = deleted_rx.try_recv() {
            deleted.push(w.name_any());
        }
        let mut reconcile_all = 0;
        while all_rx.try_recv().is_ok() {
            reconcile_all += 1;
        }
        Handed {
            changes,
            deleted,
            reconcile_all,
            changes_cached,
            cache,
        }
    }

    #[tokio::test]
    async fn a_relist_reconciles_everything_once_the_cache_holds_it_and_releases_the_vanished() {
        let handed = feed(
            [
                listing([wl("a", "1"), wl("b", "1")]),
                vec![Apply(wl("a", "2"))],
                // The watch expires and lists again: "b" was deleted and "c" created (and
                // given quota) meanwhile; the cache still holds "a"@2 and "b" until InitDone.
                listing([wl("a", "3"), wl("c", "1")]),
                vec![Apply(wl("c", "2"))],
            ]
            .concat(),
            true,
        )
        .await;
        // Only live changes are handed on, each already in the cache; nothing from a list,
        // which the cache does not hold until the list ends.
        assert_eq!(handed.changes, ["a", "c"]);
        assert!(handed.changes_cached.iter().all(|held| *held));
        // The first list is the leadership's reconcile of everything; the relist asks for one.
        assert_eq!(handed.reconcile_all, 1);
        // "b" vanished without a Delete event: released all the same.
        assert_eq!(handed.deleted, ["b"]);
    }

    /// A reservation is timed once, when the watch first shows it; a later reservation (after
    /// an eviction gave the quota back) is timed again.
    #[test]
    fn a_reservation_is_new_until_the_cache_shows_it() {
        let at = |secs: i64| Timestamp::from_second(secs).expect("valid");
        let reserved = |secs| {
            crate::testing::WorkloadBuilder::new("ns", "w")
                .at(at(secs))
                .quota_reserved("cq", "f")
                .build()
        };
        let waiting = crate::testing::WorkloadBuilder::new("ns", "w").build();
        assert_eq!(newly_reserved(None, &waiting), None);
        assert_eq!(newly_reserved(Some(&waiting), &reserved(10)), Some(at(10)));
        assert_eq!(newly_reserved(None, &reserved(10)), Some(at(10)));
        assert_eq!(newly_reserved(Some(&reserved(10)), &reserved(10)), None);
        assert_eq!(
            newly_reserved(Some(&reserved(10)), &reserved(70)),
            Some(at(70))
        );
    }

    #[tokio::test]
    async fn a_standby_hands_nothing_on() {
        let handed = feed(
            [
                listing([wl("a", "1")]),
                vec![Apply(wl("a", "2"))],
                listing([]),
                vec![Delete(wl("x", "1"))],
            ]
            .concat(),
            false,
        )
        .await;
        assert!(handed.changes.is_empty());
        assert!(handed.deleted.is_empty());
        assert_eq!(handed.reconcile_all, 0);
    }

    /// Whether the cached "w" has its podset, whole.
    fn cached_pod_set(handed: &Handed) -> bool {
        let w = handed
            .cache
            .get(&reflector::ObjectRef::new("w").within("ns"))
            .expect("cached");
        match w.spec.pod_sets.as_slice() {
            [] => false,
            [main] => {
                assert_eq!((main.name.as_str(), main.count), ("main", 2));
                main.template.spec.is_some()
            }
            more => panic!("podsets {more:?}"),
        }
    }

    fn pending(version: &str) -> crate::testing::WorkloadBuilder {
        crate::testing::WorkloadBuilder::new("ns", "w")
            .pod_set("main", 2, "1")
            .check("c", CheckState::Pending)
            .resource_version(version)
    }

    #[tokio::test]
    async fn pod_sets_are_cached_only_while_the_workload_holds_quota() {
        let waiting = pending("1").build();
        assert!(waiting.spec.pod_sets[0].template.spec.is_some());
        let handed = feed(listing([waiting]), true).await;
        assert!(!cached_pod_set(&handed), "a Workload waiting for quota");

        // Getting quota is a change, which brings the whole object: decided with its template.
        let reserved = pending("2").quota_reserved("cq", "f").build();
        let handed = feed([listing([]), vec![Apply(reserved.clone())]].concat(), true).await;
        assert!(cached_pod_set(&handed), "a Workload holding quota");
        assert_eq!(handed.changes, ["w"]);

        let finished = pending("3").quota_reserved("cq", "f").finished().build();
        let handed = feed([listing([reserved]), vec![Apply(finished)]].concat(), true).await;
        assert!(!cached_pod_set(&handed), "a finished Workload");
    }

    #[tokio::test]
    async fn a_check_may_keep_every_pod_set() {
        let events = listing([pending("1").build()]);
        let handed = feed_keeping(events, true, CachedPodSets::Always).await;
        assert!(cached_pod_set(&handed));
    }

    #[test]
    fn managed_fields_and_the_last_applied_annotation_are_never_cached() {
        let mut w = pending("1")
            .quota_reserved("cq", "f")
            .annotation("kubectl.kubernetes.io/last-applied-configuration", "{}")
            .annotation("kept", "yes")
            .with(|w| {
                w.metadata.managed_fields = Some(vec![Default::default()]);
            })
            .build();
        slim(&mut w, CachedPodSets::Always);
        assert!(w.managed_fields().is_empty());
        assert_eq!(w.annotations().keys().collect::<Vec<_>>(), ["kept"]);
    }
}

//! What a watch's re-list implies. A watch that must list again (its resourceVersion expired, a
//! list failed) gets every object as `InitApply`, changed or not, and objects deleted meanwhile
//! get no `Delete` at all: they are only missing from the new list.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::watcher::Event;

use crate::api::Workload;

/// Follows the Workload watch's lists. The reflector's cache takes a list's objects only once
/// the list is complete (`InitDone`); until then it still holds what it had before. So a
/// reconcile started from an `InitApply` would read the old version, or find nothing for a
/// Workload created meanwhile, and drop it: after a re-list (an apiserver restart, an expired
/// resourceVersion) a Workload reserved while the watch was away would wait for its next change,
/// which may never come. Instead nothing is handed on during a list, and its end asks for every
/// cached Workload to be reconciled and names the Workloads the list no longer has (deleted
/// while the watch was away: they get no `Delete` event, and their release must not be lost).
#[derive(Debug, Default)]
pub(crate) struct WorkloadLists {
    /// A list is under way: the cache's content when it began.
    before: Option<Vec<Arc<Workload>>>,
    /// (uid, resourceVersion) of each Workload the list under way delivered.
    listed: Vec<(String, String)>,
    /// Lists completed so far.
    completed: u64,
}

/// A completed list.
#[derive(Debug)]
pub(crate) struct ListDone {
    /// The versions it delivered; the cache holds them now.
    pub versions: Vec<(String, String)>,
    /// Workloads cached before it that it no longer has.
    pub gone: Vec<Arc<Workload>>,
    /// It is a re-list (not the watch's first list): what it brought was not handed on.
    pub relist: bool,
}

impl WorkloadLists {
    /// A list begins; `cached` is the cache's content now (what the list will replace).
    pub fn begin(&mut self, cached: Vec<Arc<Workload>>) {
        self.before = Some(cached);
        self.listed.clear();
    }

    /// The list under way delivered `wl`.
    pub fn delivered(&mut self, wl: &Workload) {
        if let (Some(uid), Some(rv)) = (wl.uid(), wl.resource_version()) {
            self.listed.push((uid, rv));
        }
    }

    /// The list is complete (and the cache holds it).
    pub fn done(&mut self) -> ListDone {
        let versions = std::mem::take(&mut self.listed);
        let listed: HashSet<&str> = versions.iter().map(|(uid, _)| uid.as_str()).collect();
        let gone = self
            .before
            .take()
            .unwrap_or_default()
            .into_iter()
            .filter(|wl| wl.uid().is_none_or(|uid| !listed.contains(uid.as_str())))
            .collect();
        let relist = self.completed > 0;
        self.completed += 1;
        ListDone {
            versions,
            gone,
            relist,
        }
    }
}

/// Follows the objects a watch has shown (name and resourceVersion), to tell which ones a
/// re-list shows changed and which it no longer has.
#[derive(Debug, Default)]
pub(crate) struct NameTracker {
    known: BTreeMap<String, Option<String>>,
    /// Names seen since the current list began, while one is under way.
    listing: Option<BTreeSet<String>>,
}

impl NameTracker {
    /// Feeds one event; returns the names whose objects changed or went away with it (an
    /// object a re-list shows unchanged is not among them).
    pub fn observe<K: ResourceExt>(&mut self, event: &Event<K>) -> Vec<String> {
        match event {
            Event::Init => {
                self.listing = Some(BTreeSet::new());
                Vec::new()
            }
            Event::InitApply(o) => {
                let name = o.name_any();
                self.listing
                    .get_or_insert_with(BTreeSet::new)
                    .insert(name.clone());
                let version = o.resource_version();
                match self.known.insert(name.clone(), version.clone()) {
                    Some(before) if before.is_some() && before == version => Vec::new(),
                    _ => vec![name],
                }
            }
            Event::InitDone => {
                let listed = self.listing.take().unwrap_or_default();
                let gone: Vec<String> = self
                    .known
                    .keys()
                    .filter(|n| !listed.contains(*n))
                    .cloned()
                    .collect();
                for name in &gone {
                    self.known.remove(name);
                }
                gone
            }
            Event::Apply(o) => {
                let name = o.name_any();
                self.known.insert(name.clone(), o.resource_version());
                vec![name]
            }
            Event::Delete(o) => {
                let name = o.name_any();
                self.known.remove(&name);
                vec![name]
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    use super::*;

    fn cm(name: &str) -> ConfigMap {
        cm_at(name, "1")
    }

    fn cm_at(name: &str, version: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                resource_version: Some(version.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn feed(tracker: &mut NameTracker, events: Vec<Event<ConfigMap>>) -> Vec<String> {
        events.iter().flat_map(|e| tracker.observe(e)).collect()
    }

    #[test]
    fn a_relist_reports_changes_and_the_objects_it_no_longer_has() {
        let mut t = NameTracker::default();
        let first = feed(
            &mut t,
            vec![
                Event::Init,
                Event::InitApply(cm("a")),
                Event::InitApply(cm("b")),
                Event::InitDone,
                Event::Apply(cm("c")),
            ],
        );
        assert_eq!(first, ["a", "b", "c"], "the first list deletes nothing");
        // The watch lists again: "b" was deleted and "a" changed while it was down; "c" did not.
        let relist = feed(
            &mut t,
            vec![
                Event::Init,
                Event::InitApply(cm_at("a", "2")),
                Event::InitApply(cm("c")),
                Event::InitDone,
            ],
        );
        assert_eq!(relist, ["a", "b"]);
        // Nothing is reported gone twice; an unchanged object is not reported.
        let again = feed(
            &mut t,
            vec![
                Event::Init,
                Event::InitApply(cm_at("a", "2")),
                Event::InitDone,
            ],
        );
        assert_eq!(again, ["c"]);
    }

    fn workload(name: &str, version: &str) -> Arc<Workload> {
        Arc::new(
            crate::testing::WorkloadBuilder::new("ns", name)
                .resource_version(version)
                .build(),
        )
    }

    fn names(wls: &[Arc<Workload>]) -> Vec<String> {
        wls.iter().map(|w| w.name_any()).collect()
    }

    #[test]
    fn the_first_list_is_not_a_relist_and_finds_nothing_gone() {
        let mut lists = WorkloadLists::default();
        lists.begin(Vec::new());
        lists.delivered(&workload("a", "1"));
        let done = lists.done();
        assert!(!done.relist);
        assert!(done.gone.is_empty());
        assert_eq!(done.versions, [("uid-ns-a".to_string(), "1".to_string())]);
    }

    #[test]
    fn a_relist_names_the_workloads_deleted_while_the_watch_was_away() {
        let mut lists = WorkloadLists::default();
        lists.begin(Vec::new());
        lists.delivered(&workload("a", "1"));
        lists.delivered(&workload("b", "1"));
        lists.done();
        // The cache holds a and b; "b" is deleted and "c" created while the watch is away.
        lists.begin(vec![workload("a", "1"), workload("b", "1")]);
        lists.delivered(&workload("a", "2"));
        lists.delivered(&workload("c", "1"));
        let done = lists.done();
        assert!(done.relist);
        assert_eq!(names(&done.gone), ["b"]);
        assert_eq!(done.versions.len(), 2);
        // A later relist starts afresh: nothing is reported gone twice.
        lists.begin(vec![workload("a", "2"), workload("c", "1")]);
        lists.delivered(&workload("a", "2"));
        lists.delivered(&workload("c", "1"));
        assert!(lists.done().gone.is_empty());
    }

    #[test]
    fn deletions_seen_live_are_not_reported_again_by_a_relist() {
        let mut t = NameTracker::default();
        feed(
            &mut t,
            vec![Event::Init, Event::InitApply(cm("a")), Event::InitDone],
        );
        assert_eq!(feed(&mut t, vec![Event::Delete(cm("a"))]), ["a"]);
        assert!(feed(&mut t, vec![Event::Init, Event::InitDone]).is_empty());
    }
}

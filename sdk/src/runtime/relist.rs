//! What a watch's re-list implies. A watch that must list again (its resourceVersion expired, a
//! list failed) gets every object as `InitApply`, changed or not, and objects deleted meanwhile
//! get no `Delete` at all: they are only missing from the new list.

use std::collections::{BTreeMap, BTreeSet};

use kube::ResourceExt;
use kube::runtime::watcher::Event;

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

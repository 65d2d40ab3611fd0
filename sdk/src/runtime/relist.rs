//! What a watch's re-list implies. A watch that restarts (a dropped connection, an expired
//! resourceVersion) lists everything again: objects changed meanwhile arrive as `InitApply`,
//! and objects deleted meanwhile get no `Delete` at all; they are only missing from the list.

use std::collections::BTreeSet;

use kube::ResourceExt;
use kube::runtime::watcher::Event;

/// Follows the names a watch has shown, to tell which ones a re-list no longer has.
#[derive(Debug, Default)]
pub(crate) struct NameTracker {
    known: BTreeSet<String>,
    /// Names seen since the current list began, while one is under way.
    listing: Option<BTreeSet<String>>,
}

impl NameTracker {
    /// Feeds one event; returns the names whose objects changed or went away with it.
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
                vec![name]
            }
            Event::InitDone => {
                let listed = self.listing.take().unwrap_or_default();
                let gone = self.known.difference(&listed).cloned().collect();
                self.known = listed;
                gone
            }
            Event::Apply(o) => {
                let name = o.name_any();
                self.known.insert(name.clone());
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
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
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
        // The watch restarts: "b" was deleted and "a" changed while it was down.
        let relist = feed(
            &mut t,
            vec![
                Event::Init,
                Event::InitApply(cm("a")),
                Event::InitApply(cm("c")),
                Event::InitDone,
            ],
        );
        assert_eq!(relist, ["a", "c", "b"]);
        // Nothing is reported gone twice.
        let again = feed(
            &mut t,
            vec![Event::Init, Event::InitApply(cm("a")), Event::InitDone],
        );
        assert_eq!(again, ["a", "c"]);
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

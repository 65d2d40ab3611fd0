//! What the soak's witnesses share: a watch that feeds every event to a handler and says when
//! it first listed, and the live objects keyed by what may exist only once.

use std::collections::BTreeMap;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};

/// Live objects by name, each with the key of which at most one may be live.
#[derive(Debug)]
pub struct LiveOnce<K>(BTreeMap<String, K>);

impl<K> Default for LiveOnce<K> {
    fn default() -> Self {
        Self(BTreeMap::new())
    }
}

impl<K: PartialEq + Clone> LiveOnce<K> {
    /// Notes `name` live under `key`: the other live objects under the same key (none when all
    /// is well).
    pub fn insert(&mut self, name: &str, key: K) -> Vec<String> {
        let twins = self
            .0
            .iter()
            .filter(|(n, k)| n.as_str() != name && **k == key)
            .map(|(n, _)| n.clone())
            .collect();
        self.0.insert(name.to_string(), key);
        twins
    }

    /// `name` is gone.
    pub fn remove(&mut self, name: &str) {
        self.0.remove(name);
    }

    /// A new list replaces what was live.
    pub fn clear(&mut self) {
        self.0.clear();
    }

    /// How many are live.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Watches `api` with `config` and feeds every event to `handle`; sends on `ready` once the
/// first list is done. Errors go to `error` (the watch lists again after one).
pub fn spawn<K>(
    api: Api<K>,
    config: watcher::Config,
    ready: tokio::sync::mpsc::Sender<()>,
    handle: impl Fn(watcher::Event<K>) + Send + 'static,
    error: impl Fn(&watcher::Error) + Send + 'static,
) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let stream = watcher(api, config).default_backoff();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        let mut first = true;
        while let Some(event) = stream.next().await {
            match event {
                Ok(event) => {
                    let listed = matches!(event, watcher::Event::InitDone);
                    handle(event);
                    if listed && first {
                        first = false;
                        let _ = ready.send(()).await;
                    }
                }
                Err(e) => error(&e),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_live_object_under_a_key_names_the_first() {
        let mut live = LiveOnce::default();
        assert!(live.insert("a", (1, "x")).is_empty());
        assert!(live.insert("b", (2, "x")).is_empty());
        // A new version of the same object is no twin of itself.
        assert!(live.insert("a", (1, "x")).is_empty());
        assert_eq!(live.insert("c", (1, "x")), ["a"]);
        live.remove("a");
        live.remove("c");
        assert!(live.insert("d", (1, "x")).is_empty());
        live.clear();
        assert!(live.is_empty());
    }
}

//! The ResourceFlavors the planner reads (node labels and tolerations), from a cache the leading
//! replica keeps with one watch, instead of one GET per assigned flavor and decision. Only the
//! spec's node labels, tolerations and topology name are kept, by name.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use crate::LeaderContext;
use crate::api::{ResourceFlavor, ResourceFlavorSpec, Workload};
use kube::api::Api;

use crate::watched_cache::{Key, Unavailable, WatchedCache};

/// How long a decision waits for an assigned flavor the cache lacks (Kueue assigned it, so it
/// existed a moment ago): the watch delivers it first.
const MISSING_WAIT: Duration = Duration::from_secs(5);

/// ResourceFlavor name → the part of its spec the planner reads.
#[derive(Clone, Debug)]
pub struct FlavorCache(Arc<WatchedCache<ResourceFlavorSpec>>);

impl Default for FlavorCache {
    fn default() -> Self {
        Self(Arc::new(WatchedCache::new(
            "resourceflavors.kueue.x-k8s.io",
        )))
    }
}

fn key(name: &str) -> Key {
    (String::new(), name.to_string())
}

/// What the planner reads of a flavor; the rest of the object is dropped.
fn kept(flavor: &ResourceFlavor) -> ResourceFlavorSpec {
    ResourceFlavorSpec {
        node_labels: flavor.spec.node_labels.clone(),
        tolerations: flavor.spec.tolerations.clone(),
        topology_name: flavor.spec.topology_name.clone(),
    }
}

impl FlavorCache {
    /// The watch that fills the cache, while this replica leads.
    pub async fn watch(cache: Arc<WatchedCache<ResourceFlavorSpec>>, ctx: LeaderContext) {
        cache.fill(Api::all(ctx.client), kept).await;
    }

    /// The cache, for the task that fills it.
    pub fn shared(&self) -> Arc<WatchedCache<ResourceFlavorSpec>> {
        self.0.clone()
    }

    /// The specs of the flavors assigned to `wl`'s podsets, by name; a flavor that does not
    /// exist is left out (the plan names it). Waits for the watch's first list, and a while
    /// for an assigned flavor not delivered yet; never reads the API server.
    pub async fn assigned(
        &self,
        wl: &Workload,
    ) -> Result<BTreeMap<String, ResourceFlavorSpec>, Unavailable> {
        let names: BTreeSet<&str> = assigned_flavor_names(wl).into_iter().collect();
        let cache = &self.0;
        cache.listed().await?;
        // Until each is delivered, or the cache cannot be read at all.
        let delivered = |c: &WatchedCache<ResourceFlavorSpec>| {
            names.iter().all(|n| !matches!(c.get(&key(n)), Ok(None)))
        };
        cache.wait_until(MISSING_WAIT, delivered).await;
        let mut flavors = BTreeMap::new();
        for name in names {
            if let Some(spec) = cache.get(&key(name))? {
                flavors.insert(name.to_string(), spec);
            }
        }
        Ok(flavors)
    }
}

/// The ResourceFlavor of every resource of every podset Kueue admitted the Workload with, in
/// podset order, repeats kept; empty before quota is reserved.
pub fn assigned_flavor_names(workload: &Workload) -> Vec<&str> {
    let admission = workload.status.as_ref().and_then(|s| s.admission.as_ref());
    admission
        .iter()
        .flat_map(|a| &a.pod_set_assignments)
        .flat_map(|p| p.flavors.values())
        .map(String::as_str)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::WorkloadBuilder;
    use kube::runtime::watcher::Event;

    fn flavor(name: &str, zone: &str) -> ResourceFlavor {
        let mut f = ResourceFlavor::new(name, ResourceFlavorSpec::default());
        f.spec.node_labels = BTreeMap::from([("zone".to_string(), zone.to_string())]);
        f.metadata.managed_fields = Some(vec![Default::default()]);
        f
    }

    fn holding(flavor: &str) -> Workload {
        WorkloadBuilder::new("ns", "wl")
            .pod_set("main", 1, "1")
            .quota_reserved("cq", flavor)
            .build()
    }

    #[test]
    fn assigned_flavor_names_are_every_resources_in_podset_order() {
        let mut wl = WorkloadBuilder::new("ns", "wl")
            .pod_set("a", 1, "1")
            .pod_set("b", 1, "1")
            .quota_reserved("cq", "spot")
            .build();
        let admission = wl.status.as_mut().and_then(|s| s.admission.as_mut());
        let first = &mut admission.expect("reserved").pod_set_assignments[0];
        first.flavors.insert("memory".into(), "default".into());
        assert_eq!(assigned_flavor_names(&wl), ["spot", "default", "spot"]);
        wl.status = None;
        assert!(assigned_flavor_names(&wl).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn assigned_flavors_come_from_the_watch_and_a_missing_one_is_left_out() {
        let cache = FlavorCache::default();
        let shared = cache.shared();
        shared.apply(&Event::Init, kept);
        shared.apply(&Event::InitApply(flavor("a", "east")), kept);
        shared.apply(&Event::<ResourceFlavor>::InitDone, kept);
        let read = cache.assigned(&holding("a")).await.expect("cached");
        assert_eq!(read["a"].node_labels["zone"], "east");
        // Not delivered within the wait: left out, the plan says it is missing.
        let read = cache.assigned(&holding("gone")).await.expect("readable");
        assert!(read.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_flavor_delivered_while_a_decision_waits_is_used() {
        let cache = FlavorCache::default();
        let shared = cache.shared();
        shared.apply(&Event::Init, kept);
        shared.apply(&Event::<ResourceFlavor>::InitDone, kept);
        let wl = holding("new");
        let read = cache.assigned(&wl);
        let deliver = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            shared.apply(&Event::Apply(flavor("new", "west")), kept);
        };
        let (read, ()) = tokio::join!(read, deliver);
        assert_eq!(read.expect("delivered")["new"].node_labels["zone"], "west");
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_watch_is_an_error_naming_the_verb() {
        let cache = FlavorCache::default();
        let refused = crate::watched_cache::forbidden("list", "resourceflavors is forbidden");
        assert_eq!(cache.shared().failed(&refused), Some("list"));
        let err = cache.assigned(&holding("a")).await.expect_err("refused");
        assert!(
            err.to_string().contains("may not list resourceflavors"),
            "{err}"
        );
    }
}

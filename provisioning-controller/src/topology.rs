//! A warning on our AdmissionChecks when a ClusterQueue applies one to a topology-aware
//! ResourceFlavor.
//!
//! Kueue (v0.19.2, `pkg/scheduler/flavorassigner/tas_flavorassigner.go`) delays a Workload's
//! topology assignment until after provisioning only when a ClusterQueue applies a check of its
//! own built-in controller (`kueue.x-k8s.io/provisioning-request`, collected in
//! `pkg/cache/scheduler/clusterqueue.go`) to the flavor. With any other controllerName, ours
//! included, the topology is assigned when quota is reserved, against the Nodes that exist then:
//! a Workload that needs a topology gets no quota (so no request) while no existing Nodes can hold
//! it, and once it does, its pods go to those Nodes rather than to the capacity provisioned.
//! Nothing in this controller can change that, so it says so where the operator looks: the
//! condition [`CONDITION`] on the AdmissionCheck, `True` with every ClusterQueue and flavor
//! concerned, `False` once none is left (written only after a `True`, so a cluster without
//! topology-aware flavors gets no write at all).
//!
//! Pure: [`findings`], [`desired`] and [`condition_to_write`]; I/O: [`warn_while_leading`], fed
//! by the leader's caches of AdmissionChecks, ClusterQueues and ResourceFlavors.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use kueue_admission_sdk::LeaderContext;
use kueue_admission_sdk::api::{AdmissionCheck, ClusterQueue, ResourceFlavorSpec, find_condition};
use serde_json::json;
use tracing::{info, warn};

use kueue_admission_sdk::watched_cache::{Unavailable, WatchedCache};

/// The condition type on our AdmissionChecks.
pub const CONDITION: &str = "TopologyAssignedBeforeProvisioning";
/// Its reason while a ClusterQueue applies the check to a topology-aware flavor.
pub const REASON_TOPOLOGY_AWARE: &str = "TopologyAwareFlavor";
/// Its reason once none does.
pub const REASON_NONE: &str = "NoTopologyAwareFlavor";
/// The field manager of the condition's server-side apply: not the runtime's, so that neither
/// apply removes the other's conditions (they are a list keyed by type).
pub const FIELD_MANAGER: &str = "kueue-admission-checks.dev/topology-warning";
/// How many ClusterQueue and flavor pairs the message names; the rest are counted.
const MAX_LISTED: usize = 10;
/// How often the warnings are judged again without a change: a cache readable again after a
/// refusal, or a write that failed.
const RESYNC: Duration = Duration::from_secs(30);

/// What is kept of a ClusterQueue: its flavors, and its admission checks with the flavors each
/// is limited to (`onFlavors`; empty: all).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QueueView {
    /// Every flavor of every resource group.
    pub flavors: Vec<String>,
    /// `(check, onFlavors)` per rule of `admissionChecksStrategy`.
    pub checks: Vec<(String, Vec<String>)>,
}

/// Reduces a ClusterQueue to its [`QueueView`].
pub fn kept_queue(cq: &ClusterQueue) -> QueueView {
    let flavors = cq.spec.resource_groups.iter().flat_map(|g| &g.flavors);
    let rules = cq.spec.admission_checks_strategy.iter();
    QueueView {
        flavors: flavors.map(|f| f.name.clone()).collect(),
        checks: rules
            .flat_map(|s| &s.admission_checks)
            .map(|r| (r.name.clone(), r.on_flavors.clone()))
            .collect(),
    }
}

/// What is kept of an AdmissionCheck: its controllerName, its uid and our condition.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CheckView {
    /// `spec.controllerName`.
    pub controller_name: String,
    /// The object's uid (a re-created check is another one).
    pub uid: String,
    /// The [`CONDITION`] condition, if any.
    pub warning: Option<Condition>,
}

/// Reduces an AdmissionCheck to its [`CheckView`].
pub fn kept_check(ac: &AdmissionCheck) -> CheckView {
    let conditions = ac.status.as_ref().map(|s| s.conditions.as_slice());
    CheckView {
        controller_name: ac.spec.controller_name.clone(),
        uid: ac.uid().unwrap_or_default(),
        warning: find_condition(conditions.unwrap_or_default(), CONDITION).cloned(),
    }
}

/// A ClusterQueue that applies the check to a topology-aware flavor.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Finding {
    /// The ClusterQueue.
    pub cluster_queue: String,
    /// The flavor.
    pub flavor: String,
    /// The flavor's Topology.
    pub topology: String,
}

/// Where `check` meets a topology-aware flavor: for every ClusterQueue listing it, each flavor
/// it applies to (its `onFlavors`, else all the queue's) that has a Topology (`topology_of`).
/// Sorted, each once.
pub fn findings(
    check: &str,
    queues: &[(String, QueueView)],
    topology_of: impl Fn(&str) -> Option<String>,
) -> Vec<Finding> {
    let mut found = Vec::new();
    for (queue, view) in queues {
        for (_, on) in view.checks.iter().filter(|(name, _)| name == check) {
            let applies = if on.is_empty() { &view.flavors } else { on };
            for flavor in applies {
                if let Some(topology) = topology_of(flavor) {
                    found.push(Finding {
                        cluster_queue: queue.clone(),
                        flavor: flavor.clone(),
                        topology,
                    });
                }
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

/// The condition's status, reason and message for `findings`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    /// `True` while there is a finding.
    pub status: &'static str,
    /// [`REASON_TOPOLOGY_AWARE`] or [`REASON_NONE`].
    pub reason: &'static str,
    /// For the operator.
    pub message: String,
}

/// What the condition should say about `findings`.
pub fn desired(findings: &[Finding]) -> Desired {
    if findings.is_empty() {
        return Desired {
            status: "False",
            reason: REASON_NONE,
            message: "no ClusterQueue applies this check to a topology-aware ResourceFlavor".into(),
        };
    }
    let mut listed: Vec<String> = findings
        .iter()
        .take(MAX_LISTED)
        .map(|f| {
            format!(
                "ClusterQueue {} on flavor {} (Topology {})",
                f.cluster_queue, f.flavor, f.topology
            )
        })
        .collect();
    if findings.len() > MAX_LISTED {
        listed.push(format!("{} more", findings.len() - MAX_LISTED));
    }
    Desired {
        status: "True",
        reason: REASON_TOPOLOGY_AWARE,
        message: format!(
            "{}: Kueue assigns the topology of a Workload there when it reserves quota, against \
             the Nodes that exist then; it waits for provisioning only for its built-in check \
             ({}). A Workload that needs a topology (podset-required-topology or \
             podset-preferred-topology, or any Workload of a ClusterQueue whose flavors are all \
             topology-aware) gets no quota, and so no ProvisioningRequest, while existing Nodes \
             cannot hold it; once it has quota its pods go to those Nodes, not to the capacity \
             provisioned for it. Use Kueue's built-in check for topology-aware flavors, or limit \
             this check to the others with onFlavors",
            listed.join("; "),
            crate::identity::KUEUE_CONTROLLER_NAME,
        ),
    }
}

/// The condition to apply when the check carries `current` and should say `desired`; `None`
/// when it says that already, or when there is nothing to warn about and it never warned. The
/// transition time moves only with the status.
pub fn condition_to_write(
    current: Option<&Condition>,
    desired: &Desired,
    generation: Option<i64>,
    now: Timestamp,
) -> Option<Condition> {
    let same = |c: &Condition| {
        c.status == desired.status && c.reason == desired.reason && c.message == desired.message
    };
    match current {
        Some(c) if same(c) => return None,
        None if desired.status == "False" => return None,
        _ => {}
    }
    let since = current
        .filter(|c| c.status == desired.status)
        .map_or(Time(now), |c| c.last_transition_time.clone());
    Some(Condition {
        type_: CONDITION.into(),
        status: desired.status.into(),
        reason: desired.reason.into(),
        message: desired.message.clone(),
        last_transition_time: since,
        observed_generation: generation,
    })
}

/// The caches the warning is judged from, all kept by the leader's watches.
#[derive(Clone, Debug)]
pub struct Sources {
    /// Every AdmissionCheck.
    pub checks: Arc<WatchedCache<CheckView>>,
    /// Every ClusterQueue.
    pub queues: Arc<WatchedCache<QueueView>>,
    /// Every ResourceFlavor.
    pub flavors: Arc<WatchedCache<ResourceFlavorSpec>>,
}

/// One condition to apply: the check's name and uid, what it says, and the condition.
type ToWrite = (String, String, Desired, Condition);

impl Sources {
    /// The conditions to apply on the checks of `controller_name`, skipping those `written`
    /// says were applied already (by this leader, as the caches may not show it yet).
    fn judge(
        &self,
        controller_name: &str,
        written: &HashMap<String, (String, Desired)>,
        now: Timestamp,
    ) -> Result<Vec<ToWrite>, Unavailable> {
        let ours = self
            .checks
            .select(|_, c| c.controller_name == controller_name)?;
        let queues: Vec<(String, QueueView)> = self
            .queues
            .select(|_, _| true)?
            .into_iter()
            .map(|((_, name), view)| (name, view))
            .collect();
        let flavors = self.flavors.select(|_, f| f.topology_name.is_some())?;
        let topology_of = |name: &str| {
            flavors
                .iter()
                .find(|((_, n), _)| n == name)
                .and_then(|(_, f)| f.topology_name.clone())
        };
        let mut out = Vec::new();
        for ((_, name), view) in ours {
            let want = desired(&findings(&name, &queues, topology_of));
            if written.get(&name) == Some(&(view.uid.clone(), want.clone())) {
                continue;
            }
            if let Some(c) = condition_to_write(view.warning.as_ref(), &want, None, now) {
                out.push((name, view.uid, want, c));
            }
        }
        Ok(out)
    }
}

/// While this replica leads: judges the warning of every AdmissionCheck of `controller_name`
/// whenever one of the caches changes (and every 30 s), and applies the conditions that
/// differ.
pub async fn warn_while_leading(ctx: LeaderContext, controller_name: String, sources: Sources) {
    let mut changes = [
        sources.checks.subscribe(),
        sources.queues.subscribe(),
        sources.flavors.subscribe(),
    ];
    let mut written: HashMap<String, (String, Desired)> = HashMap::new();
    let mut unavailable: Option<String> = None;
    loop {
        match sources.judge(&controller_name, &written, Timestamp::now()) {
            Ok(writes) => {
                unavailable = None;
                for (name, uid, want, condition) in writes {
                    match apply(&ctx.client, &name, &uid, condition).await {
                        Ok(()) => {
                            written.insert(name, (uid, want));
                        }
                        Err(e) => warn!(check = %name, error = %e, "writing the topology warning"),
                    }
                }
            }
            Err(why) => {
                let why = why.to_string();
                if unavailable.as_ref() != Some(&why) {
                    warn!(%why, "the topology warning of the AdmissionChecks waits for a cache");
                    unavailable = Some(why);
                }
            }
        }
        let [a, b, c] = &mut changes;
        tokio::select! {
            _ = a.changed() => {}
            _ = b.changed() => {}
            _ = c.changed() => {}
            () = tokio::time::sleep(RESYNC) => {}
        }
    }
}

/// Applies `condition` on the AdmissionCheck `name` of uid `uid` (a re-created one is refused).
async fn apply(
    client: &Client,
    name: &str,
    uid: &str,
    condition: Condition,
) -> Result<(), kube::Error> {
    if condition.status == "True" {
        warn!(check = %name, message = %condition.message, "a ClusterQueue applies this check to a topology-aware flavor");
    } else {
        info!(check = %name, "no ClusterQueue applies this check to a topology-aware flavor any more");
    }
    let body = json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "AdmissionCheck",
        "metadata": {"name": name, "uid": uid},
        "status": {"conditions": [condition]},
    });
    Api::<AdmissionCheck>::all(client.clone())
        .patch_status(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(flavors: &[&str], checks: &[(&str, &[&str])]) -> QueueView {
        QueueView {
            flavors: flavors.iter().map(|f| f.to_string()).collect(),
            checks: checks
                .iter()
                .map(|(c, on)| (c.to_string(), on.iter().map(|f| f.to_string()).collect()))
                .collect(),
        }
    }

    fn topology_of(name: &str) -> Option<String> {
        (name.starts_with("tas")).then(|| format!("{name}-topology"))
    }

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + second).expect("valid")
    }

    #[test]
    fn a_check_is_warned_of_each_topology_aware_flavor_it_applies_to() {
        let queues = vec![
            ("plain".to_string(), queue(&["a", "b"], &[("prov", &[])])),
            (
                "mixed".to_string(),
                queue(&["a", "tas-1"], &[("prov", &[])]),
            ),
            // onFlavors leaves the topology-aware flavor out: no warning from this queue.
            (
                "limited".to_string(),
                queue(&["tas-2", "a"], &[("prov", &["a"]), ("other", &[])]),
            ),
            // onFlavors names it.
            (
                "named".to_string(),
                queue(&["tas-3", "a"], &[("prov", &["tas-3"])]),
            ),
            ("not-ours".to_string(), queue(&["tas-4"], &[("other", &[])])),
        ];
        let found = findings("prov", &queues, topology_of);
        let pairs: Vec<(&str, &str, &str)> = found
            .iter()
            .map(|f| {
                (
                    f.cluster_queue.as_str(),
                    f.flavor.as_str(),
                    f.topology.as_str(),
                )
            })
            .collect();
        assert_eq!(
            pairs,
            [
                ("mixed", "tas-1", "tas-1-topology"),
                ("named", "tas-3", "tas-3-topology")
            ]
        );
        assert!(findings("nobody", &queues, topology_of).is_empty());
        let d = desired(&found);
        assert_eq!((d.status, d.reason), ("True", REASON_TOPOLOGY_AWARE));
        assert!(
            d.message.starts_with(
                "ClusterQueue mixed on flavor tas-1 (Topology tas-1-topology); ClusterQueue named \
                 on flavor tas-3 (Topology tas-3-topology): Kueue assigns"
            ) && d.message.contains("kueue.x-k8s.io/provisioning-request"),
            "{}",
            d.message
        );
    }

    #[test]
    fn a_long_list_is_cut_and_counted() {
        let queues: Vec<(String, QueueView)> = (0..12)
            .map(|i| (format!("cq-{i:02}"), queue(&["tas"], &[("prov", &[])])))
            .collect();
        let d = desired(&findings("prov", &queues, topology_of));
        assert!(d.message.contains("cq-09") && !d.message.contains("cq-10"));
        assert!(
            d.message.contains("; 2 more: Kueue assigns"),
            "{}",
            d.message
        );
    }

    #[test]
    fn the_condition_is_written_only_when_it_says_something_new() {
        let warn = desired(&[Finding {
            cluster_queue: "cq".into(),
            flavor: "tas".into(),
            topology: "t".into(),
        }]);
        let clear = desired(&[]);
        // Nothing to say and never said: no write.
        assert_eq!(condition_to_write(None, &clear, None, at(0)), None);
        let first = condition_to_write(None, &warn, Some(2), at(0)).expect("a warning");
        assert_eq!(
            (
                first.type_.as_str(),
                first.status.as_str(),
                first.reason.as_str()
            ),
            (CONDITION, "True", REASON_TOPOLOGY_AWARE)
        );
        assert_eq!(first.last_transition_time, Time(at(0)));
        assert_eq!(
            condition_to_write(Some(&first), &warn, Some(2), at(5)),
            None
        );
        // Another message, same status: the transition time stays.
        let mut more = warn.clone();
        more.message.push_str(" (more)");
        let changed = condition_to_write(Some(&first), &more, None, at(5)).expect("new text");
        assert_eq!(changed.last_transition_time, Time(at(0)));
        // Fixed: False, from now.
        let cleared = condition_to_write(Some(&first), &clear, None, at(9)).expect("cleared");
        assert_eq!(
            (cleared.status.as_str(), cleared.reason.as_str()),
            ("False", REASON_NONE)
        );
        assert_eq!(cleared.last_transition_time, Time(at(9)));
        assert_eq!(
            condition_to_write(Some(&cleared), &clear, None, at(20)),
            None
        );
    }

    #[test]
    fn the_views_keep_what_is_judged() {
        let cq: ClusterQueue = serde_json::from_value(json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
            "metadata": {"name": "cq"},
            "spec": {
                "resourceGroups": [
                    {"coveredResources": ["cpu"], "flavors": [{"name": "a", "resources": []}, {"name": "tas", "resources": []}]},
                    {"coveredResources": ["gpu"], "flavors": [{"name": "g", "resources": []}]},
                ],
                "admissionChecksStrategy": {"admissionChecks": [{"name": "prov", "onFlavors": ["tas"]}, {"name": "gate"}]},
            },
        }))
        .expect("a ClusterQueue");
        assert_eq!(
            kept_queue(&cq),
            queue(&["a", "tas", "g"], &[("prov", &["tas"]), ("gate", &[])])
        );
        let ac: AdmissionCheck = serde_json::from_value(json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "AdmissionCheck",
            "metadata": {"name": "prov", "uid": "u-1"},
            "spec": {"controllerName": "example.com/prov"},
            "status": {"conditions": [
                {"type": "Active", "status": "True", "reason": "Active", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": CONDITION, "status": "True", "reason": REASON_TOPOLOGY_AWARE, "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"},
            ]},
        }))
        .expect("an AdmissionCheck");
        let view = kept_check(&ac);
        assert_eq!(
            (view.controller_name.as_str(), view.uid.as_str()),
            ("example.com/prov", "u-1")
        );
        assert_eq!(view.warning.map(|c| c.message), Some("m".to_string()));
    }

    /// Fills a cache from one list of `objects`.
    fn listed<K: kube::Resource, V: Clone>(
        objects: Vec<K>,
        keep: fn(&K) -> V,
        resource: &'static str,
    ) -> Arc<WatchedCache<V>> {
        use kube::runtime::watcher::Event;
        let cache = Arc::new(WatchedCache::new(resource));
        cache.apply(&Event::<K>::Init, keep);
        for k in objects {
            cache.apply(&Event::InitApply(k), keep);
        }
        cache.apply(&Event::<K>::InitDone, keep);
        cache
    }

    #[test]
    fn judged_from_the_caches_for_our_checks_only_and_once() {
        let check = |name: &str, controller: &str| -> AdmissionCheck {
            serde_json::from_value(json!({
                "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "AdmissionCheck",
                "metadata": {"name": name, "uid": format!("uid-{name}")},
                "spec": {"controllerName": controller},
            }))
            .expect("an AdmissionCheck")
        };
        let queue = |name: &str, flavor: &str, check: &str| -> ClusterQueue {
            serde_json::from_value(json!({
                "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
                "metadata": {"name": name},
                "spec": {
                    "resourceGroups": [{"coveredResources": ["cpu"], "flavors": [{"name": flavor, "resources": []}]}],
                    "admissionChecksStrategy": {"admissionChecks": [{"name": check}]},
                },
            }))
            .expect("a ClusterQueue")
        };
        let flavor = |name: &str, topology: Option<&str>| {
            let mut f = kueue_admission_sdk::api::ResourceFlavor::new(name, Default::default());
            f.spec.topology_name = topology.map(String::from);
            f
        };
        let sources = Sources {
            checks: listed(
                vec![check("ours", "me"), check("theirs", "someone-else")],
                kept_check,
                "admissionchecks",
            ),
            queues: listed(
                vec![queue("cq-1", "tas", "ours"), queue("cq-2", "tas", "theirs")],
                kept_queue,
                "clusterqueues",
            ),
            flavors: listed(
                vec![flavor("tas", Some("racks")), flavor("plain", None)],
                |f: &kueue_admission_sdk::api::ResourceFlavor| f.spec.clone(),
                "resourceflavors",
            ),
        };
        let mut written = HashMap::new();
        let writes = sources.judge("me", &written, at(0)).expect("readable");
        let named: Vec<(&str, &str, &str)> = writes
            .iter()
            .map(|(n, uid, _, c)| (n.as_str(), uid.as_str(), c.status.as_str()))
            .collect();
        assert_eq!(named, [("ours", "uid-ours", "True")]);
        let (name, uid, want, _) = writes.into_iter().next().expect("one");
        assert!(
            want.message
                .starts_with("ClusterQueue cq-1 on flavor tas (Topology racks)")
        );
        // Applied, but the cache does not show it yet: not written twice.
        written.insert(name, (uid, want));
        assert!(
            sources
                .judge("me", &written, at(1))
                .expect("readable")
                .is_empty()
        );
        // A cache not listed yet (or refused) writes nothing.
        let unread = Sources {
            queues: Arc::new(WatchedCache::new("clusterqueues")),
            ..sources
        };
        assert!(unread.judge("me", &HashMap::new(), at(2)).is_err());
    }
}

//! The soak's witness of the capacity-buffer check and the real Karpenter: watches of the run
//! namespace's Workloads and CapacityBuffers, of the NodeClaims carrying the run's dedication
//! label and of the Nodes, kept apart from the controllers.
//!
//! It holds the check to three invariants of its own:
//! - [`Invariant::NoDuplicateRequests`]: at most one live buffer per Workload uid, podset and
//!   attempt (checked on every buffer version);
//! - [`Invariant::NoCapacityTwice`]: no NodeClaim for a Workload created while the check's
//!   entry of that Workload stands `Ready` (judged at the end, when every span and claim is
//!   known). The entry's `lastTransitionTime` and a claim's `creationTimestamp` have whole
//!   seconds: a claim made in the second of the `Ready` counts as before it;
//! - [`Invariant::ProtectionWithinBound`]: no Node keeps this check's protection more than
//!   [`PROTECTION_SLACK`] past the end it states, or past its Workload's finish or deletion
//!   (swept every few seconds, outages of the control plane not counted).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::Api;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use kueue_admission_sdk::api::{CheckState, Workload, workload_condition as cond};
use kueue_capacity_buffer_controller::api::{CapacityBuffer, NodeClaim};
use kueue_capacity_buffer_controller::names;
use kueue_capacity_buffer_controller::protection::node_view;

use super::recorder::{Invariant, Recorder, index_of};
use super::witness::{LiveOnce, spawn};

/// How long past its end a protection may stay: the leader's task ends it at that time; a
/// leader killed then leaves it to the next one (a 6 s Lease, a start, a first list).
pub const PROTECTION_SLACK: Duration = Duration::from_secs(30);

/// What the witness needs to know of the check.
#[derive(Clone, Debug)]
pub struct BufferSide {
    /// The AdmissionCheck's name.
    pub check: String,
    /// The node label key that dedicates Karpenter's Nodes to a Workload (value: its uid).
    pub node_label: String,
    /// The controller's instance (its buffers' label, its protections' `protected-by`).
    pub instance: String,
}

/// A span during which the check's entry stood `Ready` on a Workload holding quota.
#[derive(Clone, Copy, Debug)]
struct ReadySpan {
    /// The entry's `lastTransitionTime`.
    from: Timestamp,
    /// When the witness saw it end (quota lost, finished, deleted); open while `None`.
    to: Option<Timestamp>,
}

/// A protection as a Node shows it.
#[derive(Clone, Debug)]
struct Protected {
    uid: String,
    until: Timestamp,
}

/// Figures of what was checked, for the report.
#[derive(Clone, Debug, Default)]
pub struct BufferCounts {
    /// Buffer versions observed.
    pub buffer_versions: u64,
    /// Distinct buffers.
    pub buffers: u64,
    /// NodeClaims seen for the run's Workloads.
    pub claims: u64,
    /// `Ready` spans seen.
    pub ready_spans: u64,
    /// Nodes seen protected by the check.
    pub protected_nodes: u64,
    /// Protection sweeps made.
    pub sweeps: u64,
    /// Protections held to the bound: once per sweep each, and once as each ended.
    pub protections_judged: u64,
}

#[derive(Debug, Default)]
struct Seen {
    /// Live buffers, each keyed by (Workload uid, podset, attempt).
    live: LiveOnce<(String, String, String)>,
    buffers: BTreeSet<String>,
    /// Plan index by Workload uid.
    index: HashMap<String, usize>,
    spans: HashMap<String, Vec<ReadySpan>>,
    /// NodeClaims: name → (Workload uid, creation).
    claims: BTreeMap<String, (String, Timestamp)>,
    /// Nodes protected by the check, by name.
    protected: BTreeMap<String, Protected>,
    ever_protected: BTreeSet<String>,
    /// (Node, uid) already reported, so that one late protection is one violation.
    reported: BTreeSet<(String, String)>,
    /// When a Workload finished or was deleted, by uid.
    gone: HashMap<String, Instant>,
    /// What is counted rather than kept: buffer versions, sweeps, judgements (the rest of
    /// [`BufferCounts`] is read from the sets above).
    counts: BufferCounts,
}

/// The witness; cheap to share.
#[derive(Clone)]
pub struct BufferWitness {
    side: BufferSide,
    recorder: Arc<Recorder>,
    seen: Arc<Mutex<Seen>>,
}

impl std::fmt::Debug for BufferWitness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferWitness")
            .field("side", &self.side)
            .finish_non_exhaustive()
    }
}

impl BufferWitness {
    /// A witness of `side`, reporting to `recorder`.
    pub fn new(side: BufferSide, recorder: Arc<Recorder>) -> Self {
        Self {
            side,
            recorder,
            seen: Arc::default(),
        }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn workload(&self, wl: &Workload) {
        let (Some(index), Some(uid)) = (index_of(wl), wl.uid()) else {
            return;
        };
        let entry = wl.admission_check(&self.side.check);
        let holds = (wl.condition_is_true(cond::QUOTA_RESERVED)
            || wl.condition_is_true(cond::ADMITTED))
            && !wl.condition_is_true(cond::FINISHED)
            && wl.metadata.deletion_timestamp.is_none();
        let ready_at = entry
            .filter(|e| holds && e.state == CheckState::Ready)
            .map(|e| {
                e.last_transition_time
                    .as_ref()
                    .map_or_else(Timestamp::now, |t| t.0)
            });
        let mut seen = self.seen();
        seen.index.insert(uid.clone(), index);
        if wl.condition_is_true(cond::FINISHED) || wl.metadata.deletion_timestamp.is_some() {
            seen.gone.entry(uid.clone()).or_insert_with(Instant::now);
        }
        let spans = seen.spans.entry(uid).or_default();
        let open = spans.last_mut().filter(|s| s.to.is_none());
        match (ready_at, open) {
            (Some(from), None) => spans.push(ReadySpan { from, to: None }),
            (None, Some(span)) => span.to = Some(Timestamp::now()),
            _ => {}
        }
    }

    fn workload_gone(&self, wl: &Workload) {
        let Some(uid) = wl.uid() else { return };
        let mut seen = self.seen();
        seen.gone.entry(uid.clone()).or_insert_with(Instant::now);
        if let Some(span) = seen
            .spans
            .get_mut(&uid)
            .and_then(|s| s.last_mut())
            .filter(|s| s.to.is_none())
        {
            span.to = Some(Timestamp::now());
        }
    }

    fn buffer(&self, event: watcher::Event<CapacityBuffer>) {
        let mut guard = self.seen();
        let seen = &mut *guard;
        match event {
            watcher::Event::Apply(b) | watcher::Event::InitApply(b) => {
                let instance = b.labels().get(names::INSTANCE_LABEL);
                if instance != Some(&self.side.instance) {
                    return;
                }
                seen.counts.buffer_versions += 1;
                let name = b.name_any();
                seen.buffers.insert(name.clone());
                let label = |k: &str| b.labels().get(k).cloned().unwrap_or_default();
                let key = (
                    label(names::WORKLOAD_UID_LABEL),
                    b.annotations()
                        .get(names::POD_SET_ANNOTATION)
                        .cloned()
                        .unwrap_or_default(),
                    label(names::ATTEMPT_LABEL),
                );
                let twins = seen.live.insert(&name, key.clone());
                if !twins.is_empty() {
                    let index = seen.index.get(&key.0).copied();
                    drop(guard);
                    self.recorder.record(
                        Invariant::NoDuplicateRequests,
                        index,
                        format!("buffer {name} is live beside {twins:?} for (uid, podset, attempt) {key:?}"),
                    );
                }
            }
            watcher::Event::Delete(b) => seen.live.remove(&b.name_any()),
            // A new list replaces what was live.
            watcher::Event::Init => seen.live.clear(),
            watcher::Event::InitDone => {}
        }
    }

    fn claim(&self, claim: &NodeClaim) {
        let Some(uid) = claim.labels().get(&self.side.node_label).cloned() else {
            return;
        };
        let created = claim
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or_else(Timestamp::now, |t| t.0);
        let mut seen = self.seen();
        let index = seen.index.get(&uid).copied();
        let first_sight = seen
            .claims
            .insert(claim.name_any(), (uid, created))
            .is_none();
        drop(seen);
        if first_sight && let Some(index) = index {
            let name = claim.name_any();
            self.recorder
                .witness_note(index, &format!("NodeClaim {name} created at {created}"));
        }
    }

    fn node(&self, event: watcher::Event<Node>) {
        let calm_since = self.recorder.calm_since();
        let mut guard = self.seen();
        let seen = &mut *guard;
        let ended = match event {
            watcher::Event::Apply(n) | watcher::Event::InitApply(n) => {
                let view = node_view(n.annotations());
                match view.protection.filter(|p| p.by == self.side.instance) {
                    Some(p) => {
                        seen.ever_protected.insert(n.name_any());
                        let protection = Protected {
                            uid: p.uid,
                            until: p.until,
                        };
                        seen.protected.insert(n.name_any(), protection);
                        None
                    }
                    None => Some(n),
                }
            }
            watcher::Event::Delete(n) => Some(n),
            watcher::Event::Init => {
                seen.protected.clear();
                None
            }
            watcher::Event::InitDone => None,
        };
        let ended = ended.and_then(|n| {
            let node = n.name_any();
            seen.protected.remove(&node).map(|p| (node, p))
        });
        // A protection that ended is judged as it ends: was it kept too long?
        let late = ended.and_then(|(node, p)| {
            seen.counts.protections_judged += 1;
            let why = overdue(seen, &p, calm_since?, Instant::now())?;
            seen.reported
                .insert((node.clone(), p.uid.clone()))
                .then(|| {
                    (
                        seen.index.get(&p.uid).copied(),
                        node,
                        format!("{why}, then ended"),
                    )
                })
        });
        drop(guard);
        if let Some((index, node, why)) = late {
            self.report_late(index, &node, &why);
        }
    }

    /// Looks for protections kept past their bound; call every few seconds. `calm_since` is
    /// when the control plane was last whole again (`None`: an outage is under way).
    pub fn sweep_protections(&self, calm_since: Option<Instant>) {
        let Some(calm_since) = calm_since else {
            return;
        };
        let now = Instant::now();
        let mut late = Vec::new();
        {
            let mut guard = self.seen();
            let seen = &mut *guard;
            seen.counts.sweeps += 1;
            for (node, p) in &seen.protected {
                seen.counts.protections_judged += 1;
                if let Some(why) = overdue(seen, p, calm_since, now)
                    && !seen.reported.contains(&(node.clone(), p.uid.clone()))
                {
                    late.push((seen.index.get(&p.uid).copied(), node.clone(), why));
                }
            }
            for (_, node, _) in &late {
                let uid = seen.protected[node].uid.clone();
                seen.reported.insert((node.clone(), uid));
            }
        }
        for (index, node, why) in late {
            self.report_late(index, &node, &why);
        }
    }

    fn report_late(&self, index: Option<usize>, node: &str, why: &str) {
        self.recorder.record(
            Invariant::ProtectionWithinBound,
            index,
            format!(
                "Node {node} was still protected by the check more than {PROTECTION_SLACK:?} \
                 after {why}"
            ),
        );
    }

    /// Holds every NodeClaim seen to [`Invariant::NoCapacityTwice`]; call once, at the end.
    pub fn judge_claims(&self) {
        let twice: Vec<(Option<usize>, String)> =
            {
                let seen = self.seen();
                seen.claims
                .iter()
                .filter_map(|(name, (uid, created))| {
                    let span = seen.spans.get(uid)?.iter().find(|s| {
                        *created > s.from && s.to.is_none_or(|to| *created < to)
                    })?;
                    Some((
                        seen.index.get(uid).copied(),
                        format!(
                            "NodeClaim {name} created at {created}, while the check's entry stood \
                             Ready (since {}{})",
                            span.from,
                            span.to.map(|t| format!(", seen ending at {t}")).unwrap_or_default()
                        ),
                    ))
                })
                .collect()
            };
        for (index, what) in twice {
            self.recorder
                .record(Invariant::NoCapacityTwice, index, what);
        }
    }

    /// What was checked so far.
    pub fn counts(&self) -> BufferCounts {
        let seen = self.seen();
        BufferCounts {
            buffers: seen.buffers.len() as u64,
            claims: seen.claims.len() as u64,
            ready_spans: seen.spans.values().map(|s| s.len() as u64).sum(),
            protected_nodes: seen.ever_protected.len() as u64,
            ..seen.counts.clone()
        }
    }
}

/// Why protection `p` is late at `now`, if it is: more than [`PROTECTION_SLACK`] past its
/// stated end, or past its Workload's finish or deletion, and past the end of the last outage
/// (`calm_since`: the check's task cannot end anything while the apiserver is away).
fn overdue(seen: &Seen, p: &Protected, calm_since: Instant, now: Instant) -> Option<String> {
    if now.duration_since(calm_since) <= PROTECTION_SLACK {
        return None;
    }
    let slack = SignedDuration::try_from(PROTECTION_SLACK).unwrap_or(SignedDuration::MAX);
    if Timestamp::now() > p.until.checked_add(slack).unwrap_or(p.until) {
        return Some(format!("its stated end {}", p.until));
    }
    let gone = seen.gone.get(&p.uid)?;
    let ago = now.duration_since(*gone);
    (ago > PROTECTION_SLACK)
        .then(|| format!("its Workload finished or was deleted ({ago:.0?} before)"))
}

/// Starts the witness's watches. Returns once each has listed.
pub async fn start(
    witness: BufferWitness,
    client: &Client,
    namespace: &str,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let (ready, mut ready_rx) = tokio::sync::mpsc::channel::<()>(4);
    let errors = |what: &'static str| {
        let recorder = witness.recorder.clone();
        move |e: &watcher::Error| recorder.watch_error(what, e)
    };
    let mut tasks = Vec::new();
    let w = witness.clone();
    tasks.push(spawn(
        Api::<Workload>::namespaced(client.clone(), namespace),
        watcher::Config::default(),
        ready.clone(),
        move |event| match event {
            watcher::Event::Apply(wl) | watcher::Event::InitApply(wl) => w.workload(&wl),
            watcher::Event::Delete(wl) => w.workload_gone(&wl),
            _ => {}
        },
        errors("Workload (capacity-buffer witness)"),
    ));
    let w = witness.clone();
    tasks.push(spawn(
        Api::<CapacityBuffer>::namespaced(client.clone(), namespace),
        watcher::Config::default(),
        ready.clone(),
        move |event| w.buffer(event),
        errors("CapacityBuffer"),
    ));
    let w = witness.clone();
    tasks.push(spawn(
        Api::<NodeClaim>::all(client.clone()),
        watcher::Config::default().labels(&witness.side.node_label),
        ready.clone(),
        move |event| {
            if let watcher::Event::Apply(c) | watcher::Event::InitApply(c) = event {
                w.claim(&c);
            }
        },
        errors("NodeClaim"),
    ));
    let w = witness.clone();
    tasks.push(spawn(
        Api::<Node>::all(client.clone()),
        watcher::Config::default(),
        ready,
        move |event| w.node(event),
        errors("Node"),
    ));
    for _ in 0..4 {
        tokio::time::timeout(e2e::DEFAULT_TIMEOUT, ready_rx.recv())
            .await
            .map_err(|_| {
                anyhow::anyhow!("a capacity-buffer witness watch never completed its first list")
            })?;
    }
    Ok(tasks)
}

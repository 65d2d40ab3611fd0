//! What a soak run does, as a function of its seed alone: every Workload (its queue, shape,
//! simulator script, when it is submitted, how long it is held once admitted, whether it is
//! deleted mid-flight, and so where it must end) and every fault with its time.
//!
//! Pure: no cluster, no clock. The same seed and size give the same plan, so a failing run is
//! replayed with `--seed`.

use std::fmt;
use std::time::Duration;

use e2e::scripted::Rng;

/// The ClusterQueues of a run; each Workload goes to one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Queue {
    /// The provisioning check alone, requests split per podset.
    Provisioning,
    /// The provisioning check alone, with `podSetMergePolicy: IdenticalPodTemplates`; the queue
    /// whose AdmissionCheck is removed and added again during the run.
    Merged,
    /// The license check and the provisioning check together.
    Licensed,
    /// The budget check alone.
    Budgeted,
    /// The capacity-buffer check alone: each Workload's capacity comes from the real
    /// Karpenter, on Nodes made for it alone.
    Buffered,
}

impl Queue {
    /// Every queue, in a fixed order.
    pub const ALL: [Queue; 5] = [
        Queue::Provisioning,
        Queue::Merged,
        Queue::Licensed,
        Queue::Budgeted,
        Queue::Buffered,
    ];

    /// The LocalQueue's (and the short) name.
    pub fn name(self) -> &'static str {
        match self {
            Queue::Provisioning => "prov",
            Queue::Merged => "merge",
            Queue::Licensed => "license",
            Queue::Budgeted => "budget",
            Queue::Buffered => "buffer",
        }
    }

    /// The recorder's short names of the checks whose `Ready` its Workloads wait for. None for
    /// the merged queue: a fault takes its check off the ClusterQueue for a while, and Kueue
    /// rightly admits without it then.
    pub fn guarded_by(self) -> &'static [&'static str] {
        match self {
            Queue::Provisioning => &["prov"],
            Queue::Merged => &[],
            Queue::Licensed => &["license", "prov"],
            Queue::Budgeted => &["budget"],
            Queue::Buffered => &["buffer"],
        }
    }

    /// Whether the provisioning check guards it (so the simulator's script matters).
    pub fn provisions(self) -> bool {
        !matches!(self, Queue::Budgeted | Queue::Buffered)
    }
}

/// How a Workload is submitted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Shape {
    /// A suspended batch/v1 Job of this many pods (one podset); Kueue makes its Workload.
    Job {
        /// Pods.
        parallelism: i32,
    },
    /// A Workload created directly, with these podset counts (identical templates, so the
    /// merge policy merges them).
    Plain {
        /// Pods per podset.
        counts: Vec<i32>,
    },
}

impl Shape {
    /// Pods in all.
    pub fn pods(&self) -> i32 {
        match self {
            Shape::Job { parallelism } => *parallelism,
            Shape::Plain { counts } => counts.iter().sum(),
        }
    }
}

/// Where a Workload must end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum End {
    /// Admitted (at least once), then finished by the driver after its hold.
    Admitted,
    /// Deactivated after a check answered `Rejected` (its retries ran out).
    Rejected,
    /// Deleted by the driver before it could be admitted.
    Deleted,
    /// Admitted, then deactivated when the autoscaler revoked its capacity (the provisioning
    /// check answers `Rejected` then, as Kueue's built-in check does).
    Revoked,
}

impl fmt::Display for End {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            End::Admitted => "admitted",
            End::Rejected => "rejected",
            End::Deleted => "deleted",
            End::Revoked => "admitted, then revoked",
        })
    }
}

/// One Workload of the run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadPlan {
    /// Index; the Job or Workload is named `w-<index>`.
    pub index: usize,
    /// Its queue.
    pub queue: Queue,
    /// How it is submitted.
    pub shape: Shape,
    /// The simulator's script for its requests (the provisioning queues only).
    pub script: String,
    /// Licenses of the `solver` feature it asks for (the licensed queue only).
    pub licenses: u32,
    /// When it is submitted, from the start of the load.
    pub submit_at: Duration,
    /// How long it stays admitted before the driver finishes it (0.3 to 2.5 s; 5 to 15 s
    /// through the capacity-buffer check).
    pub hold: Duration,
    /// Deleted this long after its submission (planned [`End::Deleted`]).
    pub delete_after: Option<Duration>,
    /// Its pods ask for what no Node of Karpenter's NodePool has (the buffered queue only):
    /// every attempt fails as unprovisionable.
    pub unplaceable: bool,
    /// Where it must end.
    pub end: End,
}

impl WorkloadPlan {
    /// The name of its Job (or its Workload, when created directly).
    pub fn name(&self) -> String {
        format!("w-{:04}", self.index)
    }
}

/// The kinds of faults.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// `kill -9` the current leader of this controller (`prov`, `license`, `budget`).
    KillLeader(&'static str),
    /// Stop and start kube-apiserver on the same data.
    RestartApiserver,
    /// Stop and start Kueue's controller manager.
    RestartKueue,
    /// Stop and start Karpenter.
    RestartKarpenter,
    /// SIGSTOP the autoscaler simulator, SIGCONT it this long later.
    PauseSimulator(Duration),
    /// Remove the provisioning check from the merged queue's ClusterQueue, add it back this long
    /// later.
    RemoveCheck(Duration),
    /// Change the ProvisioningRequestConfig of the split queue (its backoff), and back later.
    ChangeConfig(Duration),
    /// A second writer touches every live Workload's annotations for this long, so the
    /// controllers' writes meet 409 conflicts.
    ConflictBurst(Duration),
}

impl FaultKind {
    /// A short label for the tables.
    pub fn label(&self) -> &'static str {
        match self {
            FaultKind::KillLeader(_) => "leader killed (kill -9)",
            FaultKind::RestartApiserver => "kube-apiserver restarted",
            FaultKind::RestartKueue => "Kueue manager restarted",
            FaultKind::RestartKarpenter => "Karpenter restarted",
            FaultKind::PauseSimulator(_) => "simulator paused and resumed",
            FaultKind::RemoveCheck(_) => "AdmissionCheck removed from a ClusterQueue and re-added",
            FaultKind::ChangeConfig(_) => "ProvisioningRequestConfig changed",
            FaultKind::ConflictBurst(_) => "409 burst (a second writer on the Workloads)",
        }
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FaultKind::KillLeader(c) => write!(f, "kill -9 the {c} leader"),
            FaultKind::RestartApiserver => f.write_str("restart kube-apiserver"),
            FaultKind::RestartKueue => f.write_str("restart Kueue"),
            FaultKind::RestartKarpenter => f.write_str("restart Karpenter"),
            FaultKind::PauseSimulator(d) => write!(f, "pause the simulator for {}s", d.as_secs()),
            FaultKind::RemoveCheck(d) => {
                write!(f, "remove the merge queue's check for {}s", d.as_secs())
            }
            FaultKind::ChangeConfig(d) => {
                write!(f, "change the prov config's backoff for {}s", d.as_secs())
            }
            FaultKind::ConflictBurst(d) => write!(f, "touch every Workload for {}s", d.as_secs()),
        }
    }
}

/// One fault at its time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    /// From the start of the load.
    pub at: Duration,
    /// What.
    pub kind: FaultKind,
}

/// The whole run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The seed.
    pub seed: u64,
    /// Every Workload, by submission time.
    pub workloads: Vec<WorkloadPlan>,
    /// Every fault, by time.
    pub faults: Vec<Fault>,
    /// How long submissions and faults go on (every submission and fault is within).
    pub load_duration: Duration,
}

/// The controllers whose leaders are killed, in turn.
pub const CONTROLLERS: [&str; 4] = ["prov", "license", "budget", "buffer"];

/// `backoffLimitCount` of the capacity-buffer check's config: an unplaceable Workload is
/// rejected after its third attempt.
pub const BUFFER_RETRIES: u32 = 2;

/// `provisioningTimeoutSeconds` of the capacity-buffer check's config: Karpenter on kwok
/// launches in seconds; this covers its restart and the apiserver's.
pub const BUFFER_TIMEOUT: Duration = Duration::from_secs(90);

/// `protectionSeconds` of the capacity-buffer check's config: the Nodes of a Workload without
/// pods (created directly) are kept this long after `Ready`.
pub const BUFFER_PROTECTION: Duration = Duration::from_secs(20);

/// The provisioning timeout the controller runs with: a request neither provisioned nor failed
/// this long after its creation is a failed attempt.
pub const PROVISIONING_TIMEOUT: Duration = Duration::from_secs(6);

/// `backoffLimitCount` of the configs: retries before the provisioning check rejects. Room for
/// the scripted failure, a timeout while the simulator is paused and a revoked capacity.
pub const PROVISIONING_RETRIES: u32 = 4;

/// Licenses of the `solver` feature in the pool. With 5, the licensed queue's demand (about
/// 0.5 licenses a second, each held 5 to 8 s from grant to release) saturated it: the license
/// check has no queue, so under contention one Workload waited over four minutes while later
/// ones got licenses (seen in the soak; see docs/reliability.md).
pub const LICENSE_POOL: u32 = 8;

/// The scripts of Workloads meant to be admitted through the provisioning check, by weight
/// (`revoke` ones are admitted first, then deactivated).
const ADMITTED_SCRIPTS: [(&str, u64); 7] = [
    ("provision", 35),
    ("provision:2", 10),
    ("fail,provision", 15),
    // Accepted and never provisioned: the controller's timeout fails the attempt.
    ("accept,provision", 10),
    ("expire:1,provision", 8),
    ("revoke:2", 10),
    ("provision:1", 12),
];

fn pick<'a>(rng: &mut Rng, weighted: &[(&'a str, u64)]) -> &'a str {
    let total: u64 = weighted.iter().map(|(_, w)| w).sum();
    let mut n = rng.below(total);
    for (item, w) in weighted {
        if n < *w {
            return item;
        }
        n -= w;
    }
    weighted[0].0
}

impl Plan {
    /// The plan of `workloads` Workloads under `seed`. The load lasts at least 90 s (so that a
    /// short run still sees every fault) and about 0.6 s per Workload beyond that.
    pub fn generate(seed: u64, workloads: usize) -> Self {
        let load = Duration::from_millis((workloads as u64 * 600).max(90_000));
        let mut rng = Rng::stream(seed, &[1]);
        // Bursts: about one every 40 s, 10 to 25 Workloads at one instant; the rest trickle
        // in at uniformly drawn times.
        let mut times: Vec<Duration> = Vec::with_capacity(workloads);
        while times.len() < workloads {
            if rng.one_in(12) {
                let at = Duration::from_millis(rng.below(load.as_millis() as u64));
                let size = 10 + rng.below(16) as usize;
                for _ in 0..size.min(workloads - times.len()) {
                    times.push(at);
                }
            } else {
                times.push(Duration::from_millis(rng.below(load.as_millis() as u64)));
            }
        }
        times.sort();
        let mut workloads = times
            .into_iter()
            .enumerate()
            .map(|(index, submit_at)| workload(seed, index, submit_at))
            .collect::<Vec<_>>();
        ensure_every_end(&mut workloads);
        Self {
            seed,
            workloads,
            faults: faults(seed, load),
            load_duration: load,
        }
    }

    /// Workloads per planned end.
    pub fn ends(&self) -> std::collections::BTreeMap<End, usize> {
        let mut out = std::collections::BTreeMap::new();
        for w in &self.workloads {
            *out.entry(w.end).or_default() += 1;
        }
        out
    }

    /// Faults per kind label.
    pub fn fault_counts(&self) -> std::collections::BTreeMap<&'static str, usize> {
        let mut out = std::collections::BTreeMap::new();
        for f in &self.faults {
            *out.entry(f.kind.label()).or_default() += 1;
        }
        out
    }
}

/// However the draw went, a run has a doomed Workload, a revoked one and one deleted mid-flight
/// through the provisioning check, and an admitted Job and an unplaceable Workload through the
/// capacity-buffer check (the invariants about them must be checked at least once): the first
/// fitting ones become so.
fn ensure_every_end(workloads: &mut [WorkloadPlan]) {
    // Each end with the script (and deletion delay) that makes a plain admitted one end so.
    let needed = [
        (End::Rejected, "fail", None),
        (End::Revoked, "revoke:2", None),
        (End::Deleted, "accept", Some(Duration::from_secs(2))),
    ];
    for (end, script, delete_after) in needed {
        let provisioning = |w: &WorkloadPlan| w.queue == Queue::Provisioning;
        if !workloads.iter().any(|w| provisioning(w) && w.end == end)
            && let Some(w) = workloads
                .iter_mut()
                .find(|w| provisioning(w) && w.end == End::Admitted)
        {
            w.script = script.into();
            // None before: only a planned deletion has one.
            w.delete_after = delete_after;
            w.end = end;
        }
    }
    let buffered = |w: &WorkloadPlan| w.queue == Queue::Buffered;
    if !workloads
        .iter()
        .any(|w| buffered(w) && w.end == End::Admitted && matches!(w.shape, Shape::Job { .. }))
        && let Some(w) = workloads
            .iter_mut()
            .find(|w| buffered(w) && w.end == End::Admitted)
    {
        w.shape = Shape::Job { parallelism: 2 };
    }
    if !workloads
        .iter()
        .any(|w| buffered(w) && w.end == End::Rejected)
        && let Some(w) = workloads
            .iter_mut()
            .rev()
            .find(|w| buffered(w) && w.end == End::Admitted)
    {
        w.unplaceable = true;
        w.end = End::Rejected;
    }
}

fn workload(seed: u64, index: usize, submit_at: Duration) -> WorkloadPlan {
    let mut rng = Rng::stream(seed, &[2, index as u64]);
    let queue = match rng.below(100) {
        0..=34 => Queue::Provisioning,
        35..=51 => Queue::Merged,
        52..=68 => Queue::Licensed,
        69..=84 => Queue::Budgeted,
        _ => Queue::Buffered,
    };
    let shape = if rng.one_in(2) {
        Shape::Job {
            parallelism: 1 + rng.below(3) as i32,
        }
    } else {
        let podsets = 1 + rng.below(3) as usize;
        Shape::Plain {
            counts: (0..podsets).map(|_| 1 + rng.below(2) as i32).collect(),
        }
    };
    let hold = rng.millis(300, 2_500);
    let licenses = if queue == Queue::Licensed {
        1 + rng.below(2) as u32
    } else {
        0
    };
    let mut plan = WorkloadPlan {
        index,
        queue,
        shape,
        script: String::new(),
        licenses,
        submit_at,
        hold,
        delete_after: None,
        unplaceable: false,
        end: End::Admitted,
    };
    // A licensed Job asks per pod: one pod, so that its licenses are what the plan says.
    if let (Queue::Licensed, Shape::Job { parallelism }) = (queue, &mut plan.shape) {
        *parallelism = 1;
    }
    // Deleted mid-flight: its requests stay accepted and never provisioned, so it is still
    // waiting when the driver deletes it (before the controller's timeout fails the attempt).
    // Only where a check waits on the simulator and never goes away meanwhile: elsewhere the
    // Workload may be admitted before the driver deletes it.
    if matches!(queue, Queue::Provisioning | Queue::Licensed) && rng.one_in(10) {
        plan.script = "accept".into();
        plan.delete_after = Some(rng.millis(500, 4_000));
        plan.end = End::Deleted;
        return plan;
    }
    if queue == Queue::Buffered {
        // Held longer: Karpenter runs provisioning passes while the pods sit on the Nodes made
        // for them (other Workloads' buffers and pods trigger them), which is when a buffer that
        // still asked for its pods would get a second set of Nodes.
        plan.hold = rng.millis(5_000, 15_000);
        // Unplaceable: Karpenter can place none of its pods. Rejected once its retries run out,
        // or deleted while it waits (it is never admitted, so the deletion cannot come late).
        match rng.below(10) {
            0 => {
                plan.unplaceable = true;
                plan.end = End::Rejected;
            }
            1 => {
                plan.unplaceable = true;
                plan.delete_after = Some(rng.millis(500, 4_000));
                plan.end = End::Deleted;
            }
            _ => {}
        }
        return plan;
    }
    match queue {
        // Doomed: every attempt fails, so the retries run out. Only on the queue whose check is
        // never removed (a removed check admits what waited on it).
        Queue::Provisioning if rng.one_in(9) => {
            plan.script = "fail".into();
            plan.end = End::Rejected;
        }
        Queue::Provisioning | Queue::Merged => {
            plan.script = pick(&mut rng, &ADMITTED_SCRIPTS).into();
            // Revoked 2 s after it was provisioned: the driver keeps it admitted until then.
            // Not where the check goes away for a while (admitted without it, nothing to revoke).
            if plan.script.starts_with("revoke") {
                if queue == Queue::Merged {
                    plan.script = "provision".into();
                } else {
                    plan.end = End::Revoked;
                }
            }
        }
        Queue::Licensed => {
            plan.script = if rng.one_in(2) {
                "provision"
            } else {
                "provision:1"
            }
            .into();
        }
        Queue::Budgeted | Queue::Buffered => {}
    }
    plan
}

/// A leader killed about every 5 s from 15 s on, the four controllers in turn (so each one's
/// leader about every 21 s); the other faults at fixed fractions of the load,
/// apart from each other so that each one's effect is seen on its own.
fn faults(seed: u64, load: Duration) -> Vec<Fault> {
    let mut rng = Rng::stream(seed, &[3]);
    let at = |fraction: f64| Duration::from_secs_f64(load.as_secs_f64() * fraction);
    let mut faults = vec![
        Fault {
            at: at(0.15),
            kind: FaultKind::PauseSimulator(Duration::from_secs(10)),
        },
        Fault {
            at: at(0.3),
            kind: FaultKind::RestartApiserver,
        },
        Fault {
            at: at(0.42),
            kind: FaultKind::ChangeConfig(Duration::from_secs(20)),
        },
        Fault {
            at: at(0.5),
            kind: FaultKind::RestartKueue,
        },
        Fault {
            at: at(0.6),
            kind: FaultKind::RemoveCheck(Duration::from_secs(8)),
        },
        Fault {
            at: at(0.68),
            kind: FaultKind::RestartKarpenter,
        },
        Fault {
            at: at(0.75),
            kind: FaultKind::ConflictBurst(Duration::from_secs(10)),
        },
    ];
    // A second apiserver restart once the load is long enough to keep them 60 s apart.
    if load >= Duration::from_secs(300) {
        faults.push(Fault {
            at: at(0.85),
            kind: FaultKind::RestartApiserver,
        });
    }
    let mut t = Duration::from_secs(15);
    let mut turn = rng.below(CONTROLLERS.len() as u64) as usize;
    while t < load {
        faults.push(Fault {
            at: t,
            kind: FaultKind::KillLeader(CONTROLLERS[turn % CONTROLLERS.len()]),
        });
        turn += 1;
        t += rng.millis(4_000, 6_500);
    }
    faults.sort_by_key(|f| f.at);
    faults
}

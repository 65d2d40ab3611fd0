//! The line of Workloads waiting to be reconciled, behind one face: the changes taken from the
//! watch and not reconciled yet (`changes`: the queue metrics), and the turns to reconcile,
//! granted first come, first served, answers first on the main turns and early starts first on
//! their own ([`Class`]), with the Workloads that wait for one kept here rather than in kube
//! (`turns`). The leader's reconciler asks it what kube needs to see (a change or
//! a wake of a Workload already in line needs no reconcile of its own) and each reconcile
//! begins here.

mod changes;
mod turns;

use std::time::Duration;

use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::api::Workload;
pub(super) use turns::{Class, GRANT_TIMEOUT, Turn};

/// The line: changes waiting and turns.
pub(super) struct Line {
    changes: changes::QueuedChanges,
    turns: turns::Turns,
}

/// How a reconcile begins.
pub(super) struct Begun<'a> {
    /// Its turn; `None`: the Workload waits in line, and its turn comes as a trigger.
    pub turn: Option<Turn<'a>>,
    /// With the turn: how long the oldest change it reads waited (none for a requeue, a wake,
    /// a reconcile of everything), and how many Workloads' changes still wait.
    pub waited: Option<(Option<Duration>, usize)>,
}

impl Line {
    /// A line with `concurrency` main turns and `start_concurrency` kept for early starts.
    pub(super) fn new(concurrency: usize, start_concurrency: usize) -> Self {
        Self {
            changes: changes::QueuedChanges::default(),
            turns: turns::Turns::new(concurrency, start_concurrency),
        }
    }

    /// From now on, a Workload granted a turn is sent to `triggers` to be reconciled.
    pub(super) fn connect(&self, triggers: mpsc::UnboundedSender<ObjectRef<Workload>>) {
        self.turns.connect(triggers);
    }

    /// The watch brought a change of `namespace/name`, making it one of `class`, at `now`:
    /// whether kube needs it (not while the Workload waits in line: its reconcile reads the
    /// cache when it runs, and it moves up if the change made it an answer), and how many
    /// Workloads' changes wait.
    pub(super) fn change(
        &self,
        namespace: &str,
        name: &str,
        class: Class,
        now: Instant,
    ) -> (bool, usize) {
        let waiting = self.changes.taken(namespace, name, now);
        (!self.turns.raise(namespace, name, class), waiting)
    }

    /// A wake of `namespace/name`: whether kube needs it (as for a change).
    pub(super) fn wake(&self, namespace: &str, name: &str) -> bool {
        !self.turns.waits(namespace, name)
    }

    /// The reconcile of `namespace/name`, of `class`, begins at `now`.
    pub(super) fn begin(
        &self,
        namespace: &str,
        name: &str,
        class: Class,
        now: Instant,
    ) -> Begun<'_> {
        let turn = self.turns.ask(namespace, name, class, now);
        let waited = turn
            .is_some()
            .then(|| self.changes.reconciling(namespace, name, now));
        Begun { turn, waited }
    }

    /// kube found `namespace/name` gone before its reconcile: it waits no more, a turn granted
    /// to it goes to the next. Returns how many Workloads' changes still wait.
    pub(super) fn gone(&self, namespace: &str, name: &str, now: Instant) -> usize {
        let waiting = self.changes.gone(namespace, name);
        self.turns.gone(namespace, name, now);
        waiting
    }

    /// Puts back in line the Workloads granted a turn too long ago that never took it (see
    /// [`GRANT_TIMEOUT`]); their turns go to the next.
    pub(super) fn sweep(&self, now: Instant) {
        self.turns.take_back_stale_grants(now);
    }

    /// The runtime stops leading: nothing waits, no trigger is sent.
    pub(super) fn clear(&self) {
        self.turns.clear();
        self.changes.clear();
    }

    /// Whether `namespace/name` waits in line (for tests).
    #[cfg(test)]
    pub(super) fn waits(&self, namespace: &str, name: &str) -> bool {
        self.turns.waits(namespace, name)
    }
}

//! What this process keeps about each Workload between reconciles: per check, where the Workload
//! stood when the check was asked, a late `Retry` to honour, early work started, the last
//! would-be answer in shadow mode; per Workload, its error backoff. One map keyed by
//! the Workload's uid, so forgetting a deleted Workload is one removal, and empty entries are
//! dropped as they empty (nothing grows with Workloads that no longer need anything).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use crate::decide::LateRetry;
use crate::lifecycle::{AskedAt, EarlyStart};
use crate::shadow::ShadowRecord;

/// Everything kept, by Workload uid.
#[derive(Debug, Default)]
pub(crate) struct Memory(Mutex<HashMap<String, WorkloadMemory>>);

/// What is kept about one Workload.
#[derive(Clone, Debug, Default)]
pub(crate) struct WorkloadMemory {
    /// By check name.
    pub checks: BTreeMap<String, PairMemory>,
    /// Consecutive failed reconciles, for the error backoff.
    pub failures: u32,
    /// The last reconcile failed: the version it failed on and the end of its backoff. Until
    /// then a trigger other than a change of the Workload (a reconcile of everything after a
    /// re-list or a check's activation) does not ask again, so a failing backend is spared the
    /// storm.
    pub backing_off: Option<(Option<String>, tokio::time::Instant)>,
}

/// What is kept about one (Workload, check) pair. Holds on quota are not kept here: they are
/// read from the cluster (see [`crate::lifecycle`]), so a restart does not start them again.
#[derive(Clone, Debug, Default)]
pub(crate) struct PairMemory {
    /// This process asked the check and has not released: where the Workload stood then. The
    /// pair gets `release` once the Workload goes idle, or comes back with another attempt or
    /// more evictions (evicted and re-admitted in between).
    pub asked: Option<AskedAt>,
    /// A `Retry` refused because Kueue evicted the Workload while the check decided; honoured
    /// on the next attempt.
    pub late: Option<LateRetry>,
    /// In shadow mode, the last would-be answer, until released.
    pub shadowed: Option<ShadowRecord>,
    /// The check's work was started before Kueue added its entry: for which attempt, and
    /// whether it was released for want of the entry. Cleared when the entry comes.
    pub early: Option<EarlyStart>,
}

impl PairMemory {
    fn is_empty(&self) -> bool {
        self.asked.is_none()
            && self.late.is_none()
            && self.shadowed.is_none()
            && self.early.is_none()
    }
}

impl WorkloadMemory {
    fn is_empty(&self) -> bool {
        self.checks.is_empty() && self.failures == 0 && self.backing_off.is_none()
    }
}

impl Memory {
    /// Runs `f` on what is kept about the Workload `uid` (empty if nothing), keeping what it
    /// leaves.
    pub fn workload<R>(&self, uid: &str, f: impl FnOnce(&mut WorkloadMemory) -> R) -> R {
        let mut map = lock(&self.0);
        match map.get_mut(uid) {
            Some(kept) => {
                let result = f(kept);
                if kept.is_empty() {
                    map.remove(uid);
                }
                result
            }
            None => {
                let mut fresh = WorkloadMemory::default();
                let result = f(&mut fresh);
                if !fresh.is_empty() {
                    map.insert(uid.to_string(), fresh);
                }
                result
            }
        }
    }

    /// Runs `f` on what is kept about one (Workload, check) pair, keeping what it leaves.
    pub fn pair<R>(&self, (uid, check): &PairKey, f: impl FnOnce(&mut PairMemory) -> R) -> R {
        self.workload(uid, |workload| match workload.checks.get_mut(check) {
            Some(kept) => {
                let result = f(kept);
                if kept.is_empty() {
                    workload.checks.remove(check);
                }
                result
            }
            None => {
                let mut fresh = PairMemory::default();
                let result = f(&mut fresh);
                if !fresh.is_empty() {
                    workload.checks.insert(check.clone(), fresh);
                }
                result
            }
        })
    }

    /// A copy of what is kept about the Workload `uid`.
    pub fn of(&self, uid: &str) -> WorkloadMemory {
        lock(&self.0).get(uid).cloned().unwrap_or_default()
    }

    /// Whether anything is kept about the Workload `uid`.
    pub fn knows(&self, uid: &str) -> bool {
        lock(&self.0).contains_key(uid)
    }

    /// Forgets everything about the Workload `uid`.
    pub fn forget(&self, uid: &str) {
        lock(&self.0).remove(uid);
    }

    /// How many Workloads something is kept about.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        lock(&self.0).len()
    }
}

/// (Workload uid, check name).
pub(super) type PairKey = (String, String);

/// Every critical section is a single insert, remove or lookup: a poisoned lock is sound.
pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(uid: &str, check: &str) -> PairKey {
        (uid.to_string(), check.to_string())
    }

    #[test]
    fn what_empties_is_dropped_and_a_workload_is_forgotten_at_once() {
        let memory = Memory::default();
        // Reading what is not there keeps nothing.
        assert!(memory.pair(&key("u1", "a"), |p| p.asked.is_none()));
        assert_eq!(memory.len(), 0);
        let at = AskedAt {
            attempt: 1,
            evictions: 0,
        };
        memory.pair(&key("u1", "a"), |p| p.asked = Some(at));
        memory.pair(&key("u1", "b"), |p| p.asked = Some(at));
        memory.workload("u2", |w| w.failures = 3);
        assert_eq!(memory.len(), 2);
        assert_eq!(memory.of("u1").checks.len(), 2);
        // Emptying a pair drops it; emptying every part of a Workload drops the Workload.
        memory.pair(&key("u1", "a"), |p| p.asked = None);
        assert_eq!(memory.of("u1").checks.len(), 1);
        memory.workload("u2", |w| w.failures = 0);
        assert_eq!(memory.len(), 1);
        memory.forget("u1");
        assert_eq!(memory.len(), 0);
    }
}

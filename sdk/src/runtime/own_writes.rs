//! The runtime's own status writes that the Workload cache has not shown yet.
//!
//! A reconcile queued while a decision was in flight runs with the Workload from the cache. If
//! the cache does not have the runtime's write yet (common on a loaded machine: the watch lags),
//! that Workload still shows the entry `Pending` with quota, and the check would be asked a
//! second time for an attempt it already answered. So every successful write is remembered with
//! the `resourceVersion` the API server gave it until the watch delivers exactly that version;
//! meanwhile the check is not asked about that Workload again. The watch delivers versions in
//! order, so seeing ours means the cache holds it (or something newer). The watch can deliver
//! the version before the writer gets the API server's answer, so the versions seen last are
//! kept for a while too. A re-list can skip a version, so a remembered write also expires after
//! [`OwnWrites::PATIENCE`]: then the check is asked, and a stale write is refused with 409 as
//! always.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Writes not yet seen in the cache, by Workload uid: (check, resourceVersion, expires).
#[derive(Debug, Default)]
pub(crate) struct OwnWrites {
    unseen: Mutex<HashMap<String, Vec<Unseen>>>,
    /// The (uid, resourceVersion) pairs the watch delivered last, oldest first.
    recent: Mutex<Recent>,
}

#[derive(Debug, Default)]
struct Recent {
    order: VecDeque<(String, String)>,
    set: HashSet<(String, String)>,
}

#[derive(Debug)]
struct Unseen {
    check: String,
    resource_version: String,
    expires: Instant,
}

impl OwnWrites {
    /// How long a write may stay unseen before the check is asked again all the same.
    pub const PATIENCE: Duration = Duration::from_secs(30);
    /// How many delivered versions are remembered for a writer that learns of its write late.
    const RECENT: usize = 8192;

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Unseen>>> {
        self.unseen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `check`'s entry was written on the Workload `uid`, which the API server then had at
    /// `resource_version`.
    pub fn wrote(&self, uid: &str, check: &str, resource_version: String, now: Instant) {
        // `unseen` first and held while `recent` is read: a `seen` of this version either
        // came before (found here) or removes the entry after this insert.
        let mut unseen = self.lock();
        let seen_already = {
            let recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
            recent
                .set
                .contains(&(uid.to_string(), resource_version.clone()))
        };
        if seen_already {
            if let Some(writes) = unseen.get_mut(uid) {
                writes.retain(|w| w.check != check);
            }
            return;
        }
        let writes = unseen.entry(uid.to_string()).or_default();
        writes.retain(|w| w.check != check);
        writes.push(Unseen {
            check: check.to_string(),
            resource_version,
            expires: now + Self::PATIENCE,
        });
    }

    /// The watch delivered the Workload `uid` at `resource_version` (and the cache holds it).
    pub fn seen(&self, uid: &str, resource_version: &str, now: Instant) {
        {
            let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
            let pair = (uid.to_string(), resource_version.to_string());
            if recent.set.insert(pair.clone()) {
                recent.order.push_back(pair);
                if recent.order.len() > Self::RECENT
                    && let Some(old) = recent.order.pop_front()
                {
                    recent.set.remove(&old);
                }
            }
        }
        let mut unseen = self.lock();
        if let Some(writes) = unseen.get_mut(uid) {
            writes.retain(|w| w.resource_version != resource_version && w.expires > now);
            if writes.is_empty() {
                unseen.remove(uid);
            }
        }
    }

    /// How long to wait before asking `check` about the cached Workload at `resource_version`,
    /// or `None` if the cache already shows the last write (or it expired).
    pub fn wait_for(
        &self,
        uid: &str,
        check: &str,
        resource_version: Option<&str>,
        now: Instant,
    ) -> Option<Duration> {
        let unseen = self.lock();
        let write = unseen.get(uid)?.iter().find(|w| w.check == check)?;
        if resource_version == Some(write.resource_version.as_str()) || write.expires <= now {
            return None;
        }
        Some(write.expires - now)
    }

    /// The Workload is gone: nothing of it is awaited.
    pub fn forget(&self, uid: &str) {
        self.lock().remove(uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_is_awaited_until_the_watch_delivers_its_version() {
        let writes = OwnWrites::default();
        let t0 = Instant::now();
        writes.wrote("uid", "a", "11".into(), t0);
        assert!(
            writes.wait_for("uid", "a", Some("10"), t0).is_some(),
            "the version we wrote on"
        );
        assert!(
            writes.wait_for("uid", "a", Some("9"), t0).is_some(),
            "an even older one"
        );
        assert_eq!(
            writes.wait_for("uid", "b", Some("10"), t0),
            None,
            "another check"
        );
        assert_eq!(
            writes.wait_for("other", "a", Some("10"), t0),
            None,
            "another Workload"
        );
        assert_eq!(
            writes.wait_for("uid", "a", Some("11"), t0),
            None,
            "the cache has it"
        );
        writes.seen("uid", "10", t0);
        assert!(writes.wait_for("uid", "a", Some("10"), t0).is_some());
        writes.seen("uid", "11", t0);
        assert_eq!(writes.wait_for("uid", "a", Some("10"), t0), None);
    }

    #[test]
    fn a_version_delivered_before_the_writer_heard_back_counts_as_seen() {
        let writes = OwnWrites::default();
        let t0 = Instant::now();
        writes.seen("uid", "11", t0);
        writes.wrote("uid", "a", "11".into(), t0);
        assert_eq!(writes.wait_for("uid", "a", Some("10"), t0), None);
        writes.wrote("uid", "a", "12".into(), t0);
        assert!(writes.wait_for("uid", "a", Some("11"), t0).is_some());
    }

    #[test]
    fn an_unseen_write_expires() {
        let writes = OwnWrites::default();
        let t0 = Instant::now();
        writes.wrote("uid", "a", "11".into(), t0);
        let wait = writes
            .wait_for("uid", "a", Some("10"), t0)
            .expect("awaited");
        assert_eq!(wait, OwnWrites::PATIENCE);
        let later = t0 + OwnWrites::PATIENCE;
        assert_eq!(writes.wait_for("uid", "a", Some("10"), later), None);
    }

    #[test]
    fn a_newer_write_of_the_same_check_replaces_the_older() {
        let writes = OwnWrites::default();
        let t0 = Instant::now();
        writes.wrote("uid", "a", "11".into(), t0);
        writes.wrote("uid", "b", "12".into(), t0);
        writes.wrote("uid", "a", "13".into(), t0);
        writes.seen("uid", "12", t0);
        assert!(writes.wait_for("uid", "a", Some("12"), t0).is_some());
        assert_eq!(writes.wait_for("uid", "b", Some("11"), t0), None);
        writes.forget("uid");
        assert_eq!(writes.wait_for("uid", "a", Some("12"), t0), None);
    }
}

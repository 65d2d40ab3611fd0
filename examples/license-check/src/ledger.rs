//! Who holds which licenses: the arithmetic of the ledger, without I/O.
//!
//! The ledger maps a Workload's uid to what it holds. Keying by uid (not name) matters: Kueue
//! recreates a deleted Workload under the same name for a Job that still exists, and the new one
//! must not inherit the old one's licenses. A Workload holds at most one entry, so asking again
//! for the same uid never takes more, and [`Ledger::acquire`] only grants what leaves every
//! feature within the pool.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kueue_admission_sdk::configmap_store::CorruptEntry;
use serde::{Deserialize, Serialize};

use crate::pool::Pool;
use crate::request::{Licenses, format_licenses};

/// What one Workload holds, and enough about it to find it again.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Holding {
    /// Namespace of the Workload.
    pub namespace: String,
    /// Name of the Workload.
    pub name: String,
    /// The AdmissionCheck whose `Ready` the licenses back.
    pub check: String,
    /// Licenses held, per feature.
    pub licenses: Licenses,
    /// When they were granted.
    pub since: Time,
}

impl Holding {
    /// `namespace/name`, for messages.
    pub fn workload(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// A request that does not fit now: per short feature, how many were asked for and how many
/// are free.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shortage {
    /// Feature → (asked for, free).
    pub short: BTreeMap<String, (u32, u32)>,
}

/// What [`Ledger::acquire`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acquired {
    /// The licenses were added to the ledger.
    Granted,
    /// The Workload already held licenses; nothing changed.
    AlreadyHeld,
}

/// Every holding, by Workload uid.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    holdings: BTreeMap<String, Holding>,
}

impl Ledger {
    /// What the Workload with this uid holds.
    pub fn holding(&self, uid: &str) -> Option<&Holding> {
        self.holdings.get(uid)
    }

    /// Every holding, by uid.
    pub fn holdings(&self) -> &BTreeMap<String, Holding> {
        &self.holdings
    }

    /// Licenses held per feature, over all holdings.
    pub fn in_use(&self) -> Licenses {
        let mut used = Licenses::new();
        for holding in self.holdings.values() {
            for (feature, n) in &holding.licenses {
                let sum = used.entry(feature.clone()).or_default();
                *sum = sum.saturating_add(*n);
            }
        }
        used
    }

    /// Licenses of `feature` neither held nor missing: 0 when the pool shrank below what is held.
    pub fn free(&self, pool: &Pool, feature: &str) -> u32 {
        let used = self.in_use().get(feature).copied().unwrap_or(0);
        pool.total_of(feature).saturating_sub(used)
    }

    /// Grants `holding.licenses` to the Workload `uid` if every feature has that many free.
    /// A uid that already holds something is left as it is (idempotent), whatever it asks now.
    pub fn acquire(
        &mut self,
        uid: &str,
        holding: Holding,
        pool: &Pool,
    ) -> Result<Acquired, Shortage> {
        if self.holdings.contains_key(uid) {
            return Ok(Acquired::AlreadyHeld);
        }
        let used = self.in_use();
        let short: BTreeMap<String, (u32, u32)> = holding
            .licenses
            .iter()
            .filter_map(|(feature, wanted)| {
                let free = pool
                    .total_of(feature)
                    .saturating_sub(used.get(feature).copied().unwrap_or(0));
                (*wanted > free).then(|| (feature.clone(), (*wanted, free)))
            })
            .collect();
        if !short.is_empty() {
            return Err(Shortage { short });
        }
        self.holdings.insert(uid.to_string(), holding);
        Ok(Acquired::Granted)
    }

    /// Gives back what the Workload `uid` holds, if anything.
    pub fn release(&mut self, uid: &str) -> Option<Holding> {
        self.holdings.remove(uid)
    }

    /// Gives back what any Workload named `namespace/name` holds (for a release that no longer
    /// knows the uid). Returns the uids released.
    pub fn release_by_name(&mut self, namespace: &str, name: &str) -> Vec<String> {
        let uids: Vec<String> = self
            .holdings
            .iter()
            .filter(|(_, h)| h.namespace == namespace && h.name == name)
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in &uids {
            self.holdings.remove(uid);
        }
        uids
    }

    /// Explains a shortage for the Workload's message: what is missing and who holds it.
    pub fn describe_shortage(&self, shortage: &Shortage, pool: &Pool) -> String {
        const MAX_HOLDERS: usize = 5;
        let parts: Vec<String> = shortage
            .short
            .iter()
            .map(|(feature, (wanted, free))| {
                let mut holders: Vec<String> = self
                    .holdings
                    .values()
                    .filter_map(|h| {
                        h.licenses
                            .get(feature)
                            .map(|n| format!("{} ({n})", h.workload()))
                    })
                    .collect();
                let more = holders.len().saturating_sub(MAX_HOLDERS);
                holders.truncate(MAX_HOLDERS);
                if more > 0 {
                    holders.push(format!("{more} more"));
                }
                let held_by = if holders.is_empty() {
                    String::new()
                } else {
                    format!(", held by {}", holders.join(", "))
                };
                format!(
                    "{feature}: needs {wanted}, {free} of {} free{held_by}",
                    pool.total_of(feature)
                )
            })
            .collect();
        format!("waiting for licenses: {}", parts.join("; "))
    }

    /// Reads the ledger from its ConfigMap `data`: one key per Workload uid, the holding as JSON.
    pub fn from_config_map_data(data: &BTreeMap<String, String>) -> Result<Self, CorruptEntry> {
        let holdings = data
            .iter()
            .map(|(uid, json)| {
                serde_json::from_str::<Holding>(json)
                    .map(|h| (uid.clone(), h))
                    .map_err(|e| CorruptEntry {
                        key: uid.clone(),
                        reason: e.to_string(),
                    })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { holdings })
    }

    /// The ConfigMap `data` of this ledger.
    pub fn to_config_map_data(&self) -> BTreeMap<String, String> {
        self.holdings
            .iter()
            .filter_map(|(uid, h)| {
                serde_json::to_string(h)
                    .ok()
                    .map(|json| (uid.clone(), json))
            })
            .collect()
    }
}

/// `matlab=2 (ns/wl)`, for logs.
pub fn describe_holding(holding: &Holding) -> String {
    format!(
        "{} ({})",
        format_licenses(&holding.licenses),
        holding.workload()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;
    use proptest::prelude::*;

    fn pool(items: &[(&str, u32)]) -> Pool {
        Pool {
            total: items.iter().map(|(f, n)| (f.to_string(), *n)).collect(),
        }
    }

    fn holding(name: &str, items: &[(&str, u32)]) -> Holding {
        Holding {
            namespace: "ns".into(),
            name: name.into(),
            check: "licenses".into(),
            licenses: items.iter().map(|(f, n)| (f.to_string(), *n)).collect(),
            since: Time(Timestamp::UNIX_EPOCH),
        }
    }

    #[test]
    fn grants_while_free_then_reports_the_shortage_with_its_holders() {
        let pool = pool(&[("matlab", 3), ("ansys", 1)]);
        let mut ledger = Ledger::default();
        assert_eq!(
            ledger.acquire("a", holding("a", &[("matlab", 2)]), &pool),
            Ok(Acquired::Granted)
        );
        let shortage = ledger
            .acquire("b", holding("b", &[("matlab", 2), ("ansys", 1)]), &pool)
            .expect_err("only one matlab left");
        assert_eq!(shortage.short, BTreeMap::from([("matlab".into(), (2, 1))]));
        assert_eq!(
            ledger.describe_shortage(&shortage, &pool),
            "waiting for licenses: matlab: needs 2, 1 of 3 free, held by ns/a (2)"
        );
        assert_eq!(
            ledger.free(&pool, "ansys"),
            1,
            "a refused request takes nothing"
        );
        assert_eq!(ledger.release("a").map(|h| h.name), Some("a".into()));
        assert_eq!(
            ledger.acquire("b", holding("b", &[("matlab", 2), ("ansys", 1)]), &pool),
            Ok(Acquired::Granted)
        );
    }

    #[test]
    fn asking_again_for_the_same_uid_takes_nothing_more() {
        let pool = pool(&[("matlab", 3)]);
        let mut ledger = Ledger::default();
        ledger
            .acquire("a", holding("a", &[("matlab", 1)]), &pool)
            .expect("granted");
        assert_eq!(
            ledger.acquire("a", holding("a", &[("matlab", 3)]), &pool),
            Ok(Acquired::AlreadyHeld)
        );
        assert_eq!(ledger.in_use(), BTreeMap::from([("matlab".into(), 1)]));
    }

    #[test]
    fn a_shrunk_pool_frees_nothing_until_enough_is_released() {
        let mut ledger = Ledger::default();
        ledger
            .acquire("a", holding("a", &[("matlab", 3)]), &pool(&[("matlab", 3)]))
            .expect("granted");
        let smaller = pool(&[("matlab", 1)]);
        assert_eq!(ledger.free(&smaller, "matlab"), 0);
        assert!(
            ledger
                .acquire("b", holding("b", &[("matlab", 1)]), &smaller)
                .is_err()
        );
    }

    #[test]
    fn release_by_name_frees_every_uid_of_that_name() {
        let pool = pool(&[("matlab", 3)]);
        let mut ledger = Ledger::default();
        for (uid, name) in [("u1", "a"), ("u2", "a"), ("u3", "b")] {
            ledger
                .acquire(uid, holding(name, &[("matlab", 1)]), &pool)
                .expect("granted");
        }
        assert_eq!(ledger.release_by_name("ns", "a"), vec!["u1", "u2"]);
        assert_eq!(ledger.holdings().len(), 1);
    }

    #[test]
    fn round_trips_through_config_map_data_and_names_a_corrupt_key() {
        let mut ledger = Ledger::default();
        ledger
            .acquire(
                "uid-1",
                holding("a", &[("matlab", 2)]),
                &pool(&[("matlab", 2)]),
            )
            .expect("granted");
        let data = ledger.to_config_map_data();
        assert_eq!(Ledger::from_config_map_data(&data), Ok(ledger));
        let mut bad = data;
        bad.insert("uid-2".into(), "{not json".into());
        let err = Ledger::from_config_map_data(&bad).expect_err("corrupt");
        assert_eq!(err.key, "uid-2");
    }

    #[derive(Clone, Debug)]
    enum Op {
        Acquire { uid: u8, matlab: u32, ansys: u32 },
        Release { uid: u8 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..8, 0u32..5, 0u32..3).prop_map(|(uid, matlab, ansys)| Op::Acquire {
                uid,
                matlab,
                ansys
            }),
            (0u8..8).prop_map(|uid| Op::Release { uid }),
        ]
    }

    proptest! {
        /// Whatever the order of requests and releases: nothing is ever held beyond the pool,
        /// a uid holds what it was first granted until released, and releasing gives back
        /// exactly that.
        #[test]
        fn never_exceeds_the_pool_and_never_double_books(
            matlab in 0u32..6, ansys in 0u32..4, ops in proptest::collection::vec(op(), 0..60)
        ) {
            let pool = pool(&[("matlab", matlab), ("ansys", ansys)]);
            let mut ledger = Ledger::default();
            // What each uid should hold, tracked independently of the ledger.
            let mut model: BTreeMap<String, Licenses> = BTreeMap::new();
            for op in ops {
                match op {
                    Op::Acquire { uid, matlab, ansys } => {
                        let uid = uid.to_string();
                        let wanted: Vec<(&str, u32)> = [("matlab", matlab), ("ansys", ansys)]
                            .into_iter().filter(|(_, n)| *n > 0).collect();
                        let h = holding(&uid, &wanted);
                        let asked = h.licenses.clone();
                        match ledger.acquire(&uid, h, &pool) {
                            Ok(Acquired::Granted) => {
                                prop_assert!(!model.contains_key(&uid));
                                model.insert(uid, asked);
                            }
                            Ok(Acquired::AlreadyHeld) => prop_assert!(model.contains_key(&uid)),
                            Err(shortage) => {
                                prop_assert!(!model.contains_key(&uid));
                                prop_assert!(!shortage.short.is_empty());
                            }
                        }
                    }
                    Op::Release { uid } => {
                        let uid = uid.to_string();
                        let released = ledger.release(&uid).map(|h| h.licenses);
                        prop_assert_eq!(released, model.remove(&uid));
                    }
                }
                let used = ledger.in_use();
                for feature in ["matlab", "ansys"] {
                    let held = used.get(feature).copied().unwrap_or(0);
                    prop_assert!(held <= pool.total_of(feature), "{feature}: {held} held");
                    let expected: u32 = model.values().filter_map(|l| l.get(feature)).sum();
                    prop_assert_eq!(held, expected);
                }
            }
        }
    }
}

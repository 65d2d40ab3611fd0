//! What a namespace has spent: the arithmetic of its ledger, without I/O.
//!
//! A Workload is charged its whole estimated cost when it is admitted (an *open* charge, keyed by
//! its uid so that asking again never charges twice). When it finishes or is evicted the charge
//! is *settled*: what it used (the estimate pro rata of the time it ran, never more than the
//! estimate) is added to the day it was charged on, and the rest is given back. Spending in a
//! window is what was settled on its days plus the open charges made in it. Settled days older
//! than any window can reach are dropped.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kueue_admission_sdk::configmap_store::CorruptEntry;
use serde::{Deserialize, Serialize};

use crate::money::Credits;
use crate::window::{Budget, Window, day_of, format_day, parse_day};

/// Settled days kept: the longest window (a week) reaches back six days before today.
const KEEP_DAYS: i64 = 7;

/// A Workload's charge while it runs.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Charge {
    /// Name of the Workload (its namespace is the ledger's).
    pub name: String,
    /// The AdmissionCheck whose `Ready` the charge backs.
    pub check: String,
    /// The whole estimated cost.
    pub cost: Credits,
    /// The run time the estimate assumed, in seconds.
    pub runtime_seconds: u64,
    /// When it was charged (≈ when the job was let start).
    pub charged_at: Time,
    /// Kueue's eviction count of the Workload then: a higher count later means this admission
    /// ended (evicted) and a new one began.
    pub evictions: i32,
}

/// What settling a charge did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settlement {
    /// The charge settled.
    pub charge: Charge,
    /// What the Workload used: stays spent.
    pub used: Credits,
    /// What it did not use: given back.
    pub refund: Credits,
}

/// One namespace's spending.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BudgetLedger {
    /// Settled spending per day (days since 1970-01-01).
    settled: BTreeMap<i64, Credits>,
    /// Open charges by Workload uid.
    open: BTreeMap<String, Charge>,
}

/// What [`BudgetLedger::check_fit`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fit {
    /// Spent so far in the window, and after this charge: within the budget.
    Fits {
        /// Spent before.
        spent: Credits,
    },
    /// It would take the window over its budget.
    Exceeds {
        /// Spent so far.
        spent: Credits,
    },
    /// It costs more than the whole budget: no window can take it.
    Never,
}

impl BudgetLedger {
    /// The open charge of a Workload.
    pub fn open_charge(&self, uid: &str) -> Option<&Charge> {
        self.open.get(uid)
    }

    /// Every open charge, by uid.
    pub fn open_charges(&self) -> &BTreeMap<String, Charge> {
        &self.open
    }

    /// The names of the Workloads with an open charge, sorted.
    pub fn charged_workloads(&self) -> Vec<String> {
        let mut names: Vec<String> = self.open.values().map(|c| c.name.clone()).collect();
        names.sort();
        names
    }

    /// Settled spending per day.
    pub fn settled_days(&self) -> &BTreeMap<i64, Credits> {
        &self.settled
    }

    /// Spent in `window`: settled on its days plus open charges made in it.
    pub fn spent(&self, window: &Window) -> Credits {
        let settled = self
            .settled
            .range(window.first_day..window.end_day)
            .fold(Credits::ZERO, |sum, (_, c)| sum.saturating_add(*c));
        self.open
            .values()
            .filter(|c| window.contains_day(day_of(c.charged_at.0)))
            .fold(settled, |sum, c| sum.saturating_add(c.cost))
    }

    /// Whether `cost` fits `budget` in `window` on top of what is spent.
    pub fn check_fit(&self, cost: Credits, budget: &Budget, window: &Window) -> Fit {
        if cost > budget.limit {
            return Fit::Never;
        }
        let spent = self.spent(window);
        if spent.saturating_add(cost) <= budget.limit {
            Fit::Fits { spent }
        } else {
            Fit::Exceeds { spent }
        }
    }

    /// Opens a charge for `uid`; refused (`false`) if it already has one.
    pub fn charge(&mut self, uid: &str, charge: Charge) -> bool {
        if self.open.contains_key(uid) {
            return false;
        }
        self.open.insert(uid.to_string(), charge);
        true
    }

    /// Settles the open charge of `uid` as of `end`: the part of the estimate for the time it ran
    /// (rounded up to a thousandth, never more than the estimate) stays spent on the day it was
    /// charged; the rest is given back. `None` if it had no open charge.
    pub fn settle(&mut self, uid: &str, end: Timestamp) -> Option<Settlement> {
        let charge = self.open.remove(uid)?;
        let used = used_until(&charge, end);
        let day = self.settled.entry(day_of(charge.charged_at.0)).or_default();
        *day = day.saturating_add(used);
        Some(Settlement {
            refund: charge.cost.saturating_sub(used),
            used,
            charge,
        })
    }

    /// Drops settled days no window containing `now` can reach. Open charges are kept however
    /// old: they are settled when their Workload ends.
    pub fn prune(&mut self, now: Timestamp) {
        let oldest = day_of(now) - (KEEP_DAYS - 1);
        self.settled.retain(|day, _| *day >= oldest);
    }

    /// Reads the ledger from its ConfigMap `data`: `settled.<YYYY-MM-DD>` = credits, and
    /// `charge.<uid>` = the open charge as JSON.
    pub fn from_config_map_data(data: &BTreeMap<String, String>) -> Result<Self, CorruptEntry> {
        let mut ledger = BudgetLedger::default();
        for (key, value) in data {
            let corrupt = |reason: String| CorruptEntry {
                key: key.clone(),
                reason,
            };
            if let Some(day) = key.strip_prefix("settled.") {
                let day = parse_day(day).ok_or_else(|| corrupt("not a date".into()))?;
                let credits = value.parse().map_err(corrupt)?;
                ledger.settled.insert(day, credits);
            } else if let Some(uid) = key.strip_prefix("charge.") {
                let charge = serde_json::from_str(value).map_err(|e| corrupt(e.to_string()))?;
                ledger.open.insert(uid.to_string(), charge);
            } else {
                return Err(corrupt("neither settled.<day> nor charge.<uid>".into()));
            }
        }
        Ok(ledger)
    }

    /// The ConfigMap `data` of this ledger.
    pub fn to_config_map_data(&self) -> BTreeMap<String, String> {
        let settled = self
            .settled
            .iter()
            .map(|(day, c)| (format!("settled.{}", format_day(*day)), c.to_string()));
        let open = self.open.iter().filter_map(|(uid, c)| {
            serde_json::to_string(c)
                .ok()
                .map(|json| (format!("charge.{uid}"), json))
        });
        settled.chain(open).collect()
    }
}

/// The share of the estimate for the time from the charge to `end`, capped at the estimate.
fn used_until(charge: &Charge, end: Timestamp) -> Credits {
    if charge.runtime_seconds == 0 {
        return charge.cost;
    }
    let ran_ms = u128::try_from(end.as_millisecond() - charge.charged_at.0.as_millisecond())
        .unwrap_or(0)
        .min(u128::from(charge.runtime_seconds) * 1000);
    let whole_ms = u128::from(charge.runtime_seconds) * 1000;
    let used = (u128::from(charge.cost.milli()) * ran_ms).div_ceil(whole_ms);
    Credits::from_milli(
        u64::try_from(used)
            .unwrap_or(u64::MAX)
            .min(charge.cost.milli()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::Period;
    use proptest::prelude::*;

    fn at(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    fn credits(s: &str) -> Credits {
        s.parse().expect("credits")
    }

    fn charge(name: &str, cost: &str, hours: u64, at_: Timestamp) -> Charge {
        Charge {
            name: name.into(),
            check: "budget".into(),
            cost: credits(cost),
            runtime_seconds: hours * 3600,
            charged_at: Time(at_),
            evictions: 0,
        }
    }

    fn daily(limit: &str) -> Budget {
        Budget {
            limit: credits(limit),
            period: Period::Day,
        }
    }

    #[test]
    fn charges_count_until_settled_then_only_what_was_used() {
        let now = at("2026-11-26T10:00:00Z");
        let today = Window::containing(Period::Day, now);
        let mut ledger = BudgetLedger::default();
        assert_eq!(
            ledger.check_fit(credits("8"), &daily("10"), &today),
            Fit::Fits {
                spent: Credits::ZERO
            }
        );
        assert!(ledger.charge("a", charge("a", "8", 4, now)));
        assert!(!ledger.charge("a", charge("a", "8", 4, now)), "never twice");
        assert_eq!(
            ledger.check_fit(credits("3"), &daily("10"), &today),
            Fit::Exceeds {
                spent: credits("8")
            }
        );
        assert_eq!(
            ledger.check_fit(credits("11"), &daily("10"), &today),
            Fit::Never
        );

        // Ran one of its four hours: 2 used, 6 back.
        let s = ledger
            .settle("a", at("2026-11-26T11:00:00Z"))
            .expect("open");
        assert_eq!((s.used, s.refund), (credits("2"), credits("6")));
        assert_eq!(ledger.settle("a", now), None, "settled once");
        assert_eq!(ledger.spent(&today), credits("2"));
        assert_eq!(
            ledger.check_fit(credits("8"), &daily("10"), &today),
            Fit::Fits {
                spent: credits("2")
            }
        );
    }

    #[test]
    fn running_past_the_estimate_costs_the_estimate_and_a_clock_going_back_costs_nothing() {
        let now = at("2026-11-26T10:00:00Z");
        let mut ledger = BudgetLedger::default();
        ledger.charge("a", charge("a", "5", 1, now));
        assert_eq!(
            ledger
                .settle("a", at("2026-11-27T10:00:00Z"))
                .map(|s| s.used),
            Some(credits("5"))
        );
        ledger.charge("b", charge("b", "5", 1, now));
        assert_eq!(
            ledger
                .settle("b", at("2026-11-26T09:00:00Z"))
                .map(|s| s.used),
            Some(Credits::ZERO)
        );
    }

    #[test]
    fn a_new_window_starts_empty_but_a_week_remembers_its_days() {
        let monday = at("2026-11-23T10:00:00Z");
        let wednesday = at("2026-11-25T10:00:00Z");
        let mut ledger = BudgetLedger::default();
        ledger.charge("a", charge("a", "5", 1, monday));
        ledger.settle("a", at("2026-11-23T12:00:00Z"));
        ledger.charge("b", charge("b", "3", 1, monday));
        assert_eq!(
            ledger.spent(&Window::containing(Period::Day, wednesday)),
            Credits::ZERO
        );
        assert_eq!(
            ledger.spent(&Window::containing(Period::Week, wednesday)),
            credits("8")
        );
        // The next Monday: a new week.
        assert_eq!(
            ledger.spent(&Window::containing(
                Period::Week,
                at("2026-11-30T00:00:00Z")
            )),
            Credits::ZERO
        );
        ledger.prune(at("2026-12-01T00:00:00Z"));
        assert!(ledger.settled_days().is_empty());
        assert!(
            ledger.open_charge("b").is_some(),
            "open charges stay until settled"
        );
    }

    #[test]
    fn round_trips_through_config_map_data_and_names_a_corrupt_key() {
        let now = at("2026-11-26T10:00:00Z");
        let mut ledger = BudgetLedger::default();
        ledger.charge("u1", charge("a", "5", 1, now));
        ledger.charge("u2", charge("b", "2", 2, now));
        ledger.settle("u2", now);
        let data = ledger.to_config_map_data();
        assert_eq!(
            data.get("settled.2026-11-26").map(String::as_str),
            Some("0")
        );
        assert!(data.contains_key("charge.u1"));
        assert_eq!(BudgetLedger::from_config_map_data(&data), Ok(ledger));
        for (key, value) in [
            ("settled.yesterday", "1"),
            ("settled.2026-11-26", "-1"),
            ("charge.u3", "{"),
            ("notes", "x"),
        ] {
            let mut bad = data.clone();
            bad.insert(key.into(), value.into());
            assert_eq!(
                BudgetLedger::from_config_map_data(&bad).map_err(|e| e.key),
                Err(key.to_string())
            );
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        /// Charge a Workload (if it fits) `cost` thousandths for `hours`.
        Charge { uid: u8, cost: u64, hours: u64 },
        /// Settle a Workload after it ran `minutes`.
        Settle { uid: u8, minutes: i64 },
        /// Time passes.
        Wait { hours: i64 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..6, 0u64..8_000, 0u64..5).prop_map(|(uid, cost, hours)| Op::Charge {
                uid,
                cost,
                hours
            }),
            (0u8..6, -30i64..600).prop_map(|(uid, minutes)| Op::Settle { uid, minutes }),
            (0i64..30).prop_map(|hours| Op::Wait { hours }),
        ]
    }

    proptest! {
        /// Charging only what fits, then settling and letting time pass in any order: the window
        /// never holds more than its budget, a settlement never gives back more than was charged
        /// nor uses more than the estimate, and settling never raises what a window has spent.
        #[test]
        fn spending_stays_within_the_budget_and_refunds_never_exceed_charges(
            limit in 0u64..20_000, weekly: bool, ops in proptest::collection::vec(op(), 0..60)
        ) {
            let budget = Budget {
                limit: Credits::from_milli(limit),
                period: if weekly { Period::Week } else { Period::Day },
            };
            let mut now = at("2026-11-26T10:00:00Z");
            let mut ledger = BudgetLedger::default();
            for op in ops {
                let window = Window::containing(budget.period, now);
                match op {
                    Op::Charge { uid, cost, hours } => {
                        let cost = Credits::from_milli(cost);
                        let fit = ledger.check_fit(cost, &budget, &window);
                        if matches!(fit, Fit::Fits { .. }) {
                            let c = Charge { runtime_seconds: hours * 3600, ..charge("wl", "0", 0, now) };
                            let c = Charge { cost, ..c };
                            let had = ledger.open_charge(&uid.to_string()).is_some();
                            prop_assert_eq!(ledger.charge(&uid.to_string(), c), !had);
                        }
                        prop_assert_eq!(fit == Fit::Never, cost > budget.limit);
                    }
                    Op::Settle { uid, minutes } => {
                        let before = ledger.spent(&window);
                        let end = now + k8s_openapi::jiff::SignedDuration::from_mins(minutes);
                        if let Some(s) = ledger.settle(&uid.to_string(), end) {
                            prop_assert!(s.used <= s.charge.cost);
                            prop_assert_eq!(s.used.saturating_add(s.refund), s.charge.cost);
                        }
                        prop_assert!(ledger.spent(&window) <= before);
                    }
                    Op::Wait { hours } => {
                        now += k8s_openapi::jiff::SignedDuration::from_hours(hours);
                        ledger.prune(now);
                    }
                }
                let window = Window::containing(budget.period, now);
                prop_assert!(ledger.spent(&window) <= budget.limit, "{:?}", ledger);
                let round_trip = BudgetLedger::from_config_map_data(&ledger.to_config_map_data());
                prop_assert_eq!(round_trip.as_ref(), Ok(&ledger));
            }
        }
    }
}

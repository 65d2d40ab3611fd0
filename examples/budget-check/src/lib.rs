//! A Kueue admission check that keeps each namespace within a daily or weekly budget.
//!
//! A budget (`500/week`, `40/day`, per namespace, in a ConfigMap) caps what a namespace may spend
//! in a window. A Workload's cost is estimated from its resource requests, its pods, and its
//! `maximumExecutionTimeSeconds` (or a default run time), at per-resource hourly prices. One that
//! fits is `Ready` and charged; one that would take the namespace over its budget gets `Retry`
//! until the window resets; one that costs more than the whole budget is `Rejected`. When a
//! Workload finishes or is evicted, what it did not use is given back. See the README for how to
//! run it.
//!
//! Layers, from pure to I/O:
//! - [`money`], [`quantity`], [`cost`]: credits, resource quantities, and a Workload's cost;
//! - [`window`]: budgets and the days and weeks they apply to;
//! - [`ledger`]: what a namespace has spent: charges, settlements, refunds;
//! - [`backend`]: where budgets and ledgers live (ConfigMaps, with optimistic concurrency);
//! - [`check`]: the [`AdmissionCheckController`](kueue_admission_sdk::AdmissionCheckController)
//!   that ties them to the SDK runtime, and the sweep that settles what nobody released.
//!
//! The error type, the reads of Workloads and ConfigMaps, and the sweep's leader task are shared
//! with the license example in [`ledger_common`].

pub mod backend;
pub mod check;
pub mod cost;
pub mod flags;
pub mod ledger;
pub mod money;
pub mod quantity;
pub mod window;

pub use backend::ConfigMapBackend;
pub use check::{BudgetCheck, Settings};
pub use ledger_common::Error;

/// The controller name the binary answers by default.
pub const DEFAULT_CONTROLLER_NAME: &str = "kueue-admission-checks.dev/budget";
/// The budgets ConfigMap the binary reads by default.
pub const DEFAULT_BUDGETS_CONFIGMAP: &str = "budgets";
/// The prefix of the ledger ConfigMaps the binary writes by default.
pub const DEFAULT_LEDGER_PREFIX: &str = "budget-ledger-";

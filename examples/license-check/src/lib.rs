//! A Kueue admission check that hands out floating licenses.
//!
//! A pool (a ConfigMap of feature → count) says how many licenses exist. A Workload asks for
//! some with the [`LICENSES_ANNOTATION`](request::LICENSES_ANNOTATION) annotation; it is `Ready`
//! once they are all free and holds them until it finishes or is evicted. While they are not
//! free it gets `Retry` with exponential backoff; a request the pool can never satisfy (an
//! unknown feature, more than exist) is `Rejected`. See the crate's README for how to run it.
//!
//! Layers, from pure to I/O:
//! - [`request`] and [`pool`]: reading what a Workload asks for and what exists;
//! - [`ledger`]: who holds what, and the rule that nothing beyond the pool is ever granted;
//! - [`backend`]: where the pool and the ledger live (ConfigMaps, with optimistic concurrency);
//! - [`check`]: the [`AdmissionCheckController`](kueue_admission_sdk::AdmissionCheckController)
//!   that ties them to the SDK runtime, and the sweep that reclaims what nobody released.
//!
//! The error type, the reads of Workloads and ConfigMaps, and the sweep's leader task are shared
//! with the budget example in [`ledger_common`].

pub mod backend;
pub mod check;
pub mod flags;
pub mod ledger;
pub mod pool;
pub mod request;

pub use backend::ConfigMapBackend;
pub use check::{LicenseCheck, Settings};
pub use ledger_common::Error;

/// The controller name the binary answers by default.
pub const DEFAULT_CONTROLLER_NAME: &str = "kueue-admission-checks.dev/license";
/// The pool ConfigMap the binary reads by default.
pub const DEFAULT_POOL_CONFIGMAP: &str = "license-pool";
/// The ledger ConfigMap the binary writes by default.
pub const DEFAULT_LEDGER_CONFIGMAP: &str = "license-ledger";

//! `alert-gate`: a Kueue admission check that admits batch work only while no firing
//! Alertmanager alert matches the selectors of its `AlertGate` parameters. One small crate on
//! `kueue-admission-sdk`: [`gate`] holds the parameters and the pure verdict, [`alertmanager`]
//! the HTTP client and its cache, [`check`] the trait implementation, [`flags`] the binary's
//! flags.

pub mod alertmanager;
pub mod check;
pub mod flags;
pub mod gate;

pub use check::AlertGateCheck;
pub use gate::{AlertGate, AlertGateSpec, WhileFiring};

/// The controllerName the binary answers by default.
pub const DEFAULT_CONTROLLER_NAME: &str = "kueue-admission-checks.dev/alert-gate";

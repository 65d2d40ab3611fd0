//! The reference CapacityBuffer admission check, built on `kueue-admission-sdk`: Kueue admits a
//! Workload once Karpenter has launched the Nodes for all of its pods.
//!
//! For each Workload that gets quota the check creates one `autoscaling.x-k8s.io/v1beta1`
//! CapacityBuffer per podset (Karpenter v1.14+, feature gate `CapacityBuffer`), shaped like the
//! podset's pods and selecting a node label that carries the Workload's uid, so Karpenter
//! launches Nodes for this Workload alone. When every buffer fits and every NodeClaim is
//! `Ready`, the check protects those Nodes from consolidation, shrinks the buffers to zero
//! (before any pod of the Workload exists: no capacity is made twice) and answers `Ready`
//! with pod set updates that send the pods there; the protection ends when the pods are bound.
//!
//! Layers, from pure to I/O:
//! - [`names`]: names, labels and annotations;
//! - [`plan`]: the buffers and pod set updates of an attempt;
//! - [`outcome`]: the buffers' conditions and NodeClaims (and the clock) → what to answer;
//! - [`config`]: the parameters (`CapacityBufferCheckConfig`);
//! - [`protection`]: the Nodes kept from consolidation until the pods are bound;
//! - [`check`]: the SDK trait implementation and the watches beside it;
//! - [`api`]: Karpenter's objects, as far as read.

pub mod api;
pub mod check;
pub mod config;
pub mod error;
pub mod metrics;
pub mod names;
pub mod outcome;
pub mod plan;
pub mod protection;

pub use check::{CapacityBufferCheck, Settings};
pub use config::CapacityBufferCheckConfig;
pub use error::Error;

/// The controllerName this controller answers by default.
pub const DEFAULT_CONTROLLER_NAME: &str = "kueue-admission-checks.dev/capacity-buffer";

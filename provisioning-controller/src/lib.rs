//! The reference ProvisioningRequest admission check, built on `kueue-admission-sdk`.
//!
//! A Workload is admitted only once cluster-autoscaler has provisioned capacity for all of its
//! pods. The check accepts Kueue's own `ProvisioningRequestConfig` as its AdmissionCheck's
//! parameters, so switching from Kueue's built-in check means changing only the
//! `controllerName`.
//!
//! Layers, from pure to I/O:
//! - [`names`]: names of requests and PodTemplates, within 253 characters, that parse back;
//! - [`plan`]: which podsets need capacity and the request (the PodTemplates from the SDK's
//!   [`kueue_admission_sdk::pod_template`]; `plan/merge`: merge policies and semantic equality);
//! - [`outcome`]: a request's conditions (and the clock) → the check's decision;
//! - [`config`]: the parameters (Kueue's ProvisioningRequestConfig) and this controller's extras;
//! - [`refusal`]: what the user reads when what the check must create is (or would be) refused;
//! - [`check`]: the SDK trait implementation, creating and reading requests;
//! - the SDK's [`kueue_admission_sdk::watched_cache`] and [`kueue_admission_sdk::flavors`]:
//!   objects (our requests, the ResourceFlavors the planner reads) kept by watches while this
//!   replica leads, read instead of the API server, unreadable (naming the refused verb) while a
//!   watch is refused;
//! - [`identity`]: which objects are ours (labels, annotations, "made for"; the rule checked
//!   before any delete, patch or use);
//! - [`requests`]: deleting what this instance made, and only that;
//! - [`request_watch`]: watching our requests, waking their Workloads, removing what nobody
//!   needs;
//! - [`topology`]: the warning on our AdmissionChecks when a ClusterQueue applies one to a
//!   topology-aware flavor (Kueue assigns the topology before we provision).

pub mod check;
pub mod config;
pub mod error;
pub mod identity;
pub mod metrics;
pub mod names;
pub mod outcome;
pub mod plan;
pub mod refusal;
pub mod request_watch;
pub mod requests;
pub mod topology;

pub use check::{ProvisioningCheck, Settings};
pub use config::ProvisioningParameters;
pub use error::Error;

/// The controllerName this controller answers by default.
///
/// Never Kueue's `kueue.x-k8s.io/provisioning-request`: Kueue's built-in controller always serves
/// that name while the ProvisioningRequest API exists, and deletes requests it does not own.
pub const DEFAULT_CONTROLLER_NAME: &str = "kueue-admission-checks.dev/provisioning-request";

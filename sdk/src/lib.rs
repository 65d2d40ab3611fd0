//! Build external [Kueue](https://kueue.sigs.k8s.io) admission checks in Rust.
//!
//! Kueue admits a Workload in two stages: it reserves quota, then waits until every
//! AdmissionCheck of the ClusterQueue reports `Ready` in the Workload's
//! `status.admissionChecks`. A check author implements [`AdmissionCheckController`]; the
//! crate's layers are:
//!
//! - [`api`]: the Kueue v1beta2 types a check reads;
//! - [`attempts`]: the check's own attempt count, kept on the Workload so it never goes back;
//! - [`retry`]: retry delays (Kueue's formula, generalised) and the attempt limit;
//! - [`check`]: the trait, the [`Decision`] it returns and the context it gets;
//! - [`release`]: what a check is told when a Workload no longer needs it;
//! - [`extensions`]: work a check runs beside the runtime while its replica leads;
//! - `decide` (inside the crate): the pure rules that turn a decision into a safe status write,
//!   or refuse it; [`testing::plan_once`] shows what they make of one;
//! - [`holding`]: whether what a check holds for a Workload (outside it) is still needed;
//! - [`configmap_store`]: state a check keeps in a ConfigMap, updated with optimistic concurrency;
//! - [`shadow`]: shadow mode, which decides and publishes what would be answered, writing nothing;
//! - [`runtime`]: the thin I/O shell that watches, reconciles and writes, with leader election;
//! - [`options`]: the flags and environment variables of a check binary;
//! - [`testing`]: builders, an offline client and API servers in memory to unit-test a check.
//!
//! The repository's `docs/writing-a-check.md` walks from an empty crate to a deployed controller,
//! and `docs/state-machine.md` shows the states the runtime moves an entry through.

// The README's example check is compiled as a doctest, so the crate's front page cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
mod readme {}

pub mod api;
pub mod attempts;
pub mod check;
pub mod cluster_queues;
pub mod configmap_store;
pub(crate) mod decide;
pub mod error;
pub mod extensions;
pub mod flavors;
pub mod hold;
pub mod holding;
pub mod lifecycle;
pub mod options;
pub mod pod_template;
pub mod release;
pub mod retry;
pub mod runtime;
pub mod shadow;
pub mod testing;
pub mod watched_cache;

/// The metrics library the runtime serves, for [`AdmissionCheckController::register_metrics`].
pub use prometheus_client;

pub use check::{
    AdmissionCheckController, ApiKind, CachedPodSets, CheckContext, CheckParameters, Decision,
    ErrorClass, NoParameters, ParametersKind, ReleaseContext, ReleaseReason, RetryDelay,
    Revalidate,
};
pub use cluster_queues::{ClusterQueues, QueueRule};
pub use decide::FlavorRule;
pub use error::Error;
pub use options::Options;
pub use retry::RetryPolicy;
pub use runtime::{
    Extensions, LeaderContext, LeaderElection, MetricsSecurity, RuntimeConfig, TlsSource,
    WorkloadWaker, run, run_until, termination_signal,
};

//! How the runtime runs a check ([`RuntimeConfig`], with its defaults), and how a run is told to
//! stop: what every part of the runtime is given, kept apart from [`super::run_until`], which
//! puts the parts together.

use super::lease::LeaderElection;

/// How the runtime runs a check.
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// Where `/metrics`, `/healthz` and `/readyz` are served; `None` serves nothing.
    pub metrics_address: Option<std::net::SocketAddr>,
    /// Prefix of the server-side apply field managers; each check gets its own manager, so one
    /// process serving several checks never strips another check's entry.
    pub field_manager: String,
    /// How many Workloads are reconciled at once.
    pub concurrency: u16,
    /// Elect a leader among replicas; `None` writes from this process unconditionally.
    pub leader_election: Option<LeaderElection>,
    /// The longest retry delay written; a longer one (from a policy or an explicit delay) is
    /// written as this, counted and announced. Kueue keeps the Workload's quota for the whole
    /// delay, so an absurd configuration must not hold it for years.
    pub max_retry_delay: std::time::Duration,
    /// How long a Workload keeps its quota after its check failed permanently (see
    /// [`crate::check::ErrorClass`]) before the runtime answers `Retry` for it: the time the
    /// user has to fix what the entry's message says without losing the reservation. The same
    /// hold applies to a decision Kueue would refuse, an attempt record the API server refuses,
    /// and a Workload holding quota for a check that cannot answer (inactive, or in shadow
    /// mode while a ClusterQueue lists it).
    pub permanent_failure_hold: std::time::Duration,
    /// How long work a check started before Kueue added its entry
    /// ([`crate::check::AdmissionCheckController::start_early`]) waits for the entry; then it is released
    /// ([`crate::ReleaseReason::EntryNotAdded`]) and started again only once the entry comes.
    pub early_start_wait: std::time::Duration,
    /// Shadow mode: decide for the Workloads holding quota in this scope and publish what would
    /// have been answered, writing no answers on Workloads (see [`crate::shadow`]). The one
    /// write: a Workload that holds quota with the entry of a check of this controller (its
    /// ClusterQueue lists the check, which is inactive meanwhile) gets the reason on the entry
    /// and, after [`Self::permanent_failure_hold`], a `Retry` that gives the quota back, so
    /// switching an enforcing check back to shadow mode strands nothing. `None`: the checks
    /// answer for real.
    pub shadow: Option<crate::shadow::ShadowScope>,
    /// Publish Normal events about the check's answers (`CheckReady`, `CheckPending`,
    /// `CheckRetryCarriedOver`); `false` keeps only Warning events (`CheckRetry`,
    /// `CheckRejected`, `CheckFailed`, ...), one API request less per answer. Shadow mode's
    /// `WouldAnswer` events are published either way: they are its output.
    pub normal_events: bool,
}

/// The default of [`RuntimeConfig::permanent_failure_hold`]: two minutes, enough to read the
/// message and fix an annotation, short enough not to starve a queue.
pub const DEFAULT_PERMANENT_FAILURE_HOLD: std::time::Duration = std::time::Duration::from_secs(120);

/// The default of [`RuntimeConfig::early_start_wait`]: five minutes, far beyond the seconds
/// Kueue takes to add an entry even under a burst, short enough that capacity asked for a
/// Workload that never gets the check is not kept for long.
pub const DEFAULT_EARLY_START_WAIT: std::time::Duration = std::time::Duration::from_secs(300);

/// The default of [`RuntimeConfig::field_manager`] (and of `--field-manager`).
pub const DEFAULT_FIELD_MANAGER: &str = "kueue-admission-sdk";

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            metrics_address: Some(std::net::SocketAddr::from(([0, 0, 0, 0], 8080))),
            field_manager: DEFAULT_FIELD_MANAGER.into(),
            concurrency: 10,
            leader_election: None,
            max_retry_delay: crate::retry::DEFAULT_MAX_RETRY_DELAY,
            permanent_failure_hold: DEFAULT_PERMANENT_FAILURE_HOLD,
            early_start_wait: DEFAULT_EARLY_START_WAIT,
            shadow: None,
            normal_events: true,
        }
    }
}

/// How a run is told to stop: cloneable, so each part that must stop can wait on it.
pub(super) type Shutdown = futures::future::Shared<futures::future::BoxFuture<'static, ()>>;

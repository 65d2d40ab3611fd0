//! How the runtime runs a check ([`RuntimeConfig`], with its defaults), and how a run is told to
//! stop: what every part of the runtime is given, kept apart from [`super::run_until`], which
//! puts the parts together.

use super::lease::LeaderElection;

/// How the runtime runs a check.
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// Where `/metrics` is served, as [`Self::metrics_security`] says; `None` serves no metrics.
    pub metrics_address: Option<std::net::SocketAddr>,
    /// How `/metrics` is served: HTTPS with every request's bearer token reviewed by the API
    /// server (the default), or plain HTTP to anyone who can reach the address.
    pub metrics_security: MetricsSecurity,
    /// Where the probes `/healthz` and `/readyz` are served: plain HTTP, no authentication (the
    /// kubelet probes without credentials); `None` serves no probes. It may equal
    /// [`Self::metrics_address`] only with [`MetricsSecurity::Plain`]: one listener then serves
    /// all three paths.
    pub health_address: Option<std::net::SocketAddr>,
    /// Prefix of the server-side apply field managers; each check gets its own manager, so one
    /// process serving several checks never strips another check's entry.
    pub field_manager: String,
    /// How many Workloads are reconciled at once, answers first (the main turns).
    pub concurrency: u16,
    /// For a check that [starts early](crate::AdmissionCheckController::starts_early): how many
    /// more turns are kept for early starts, beside [`Self::concurrency`] (0: early starts share
    /// the main turns, after answers and other work). A turn of either kind serves the other's
    /// work when none of its own waits.
    pub early_start_concurrency: u16,
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

/// How `/metrics` is served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetricsSecurity {
    /// HTTPS; each request needs a bearer token that the API server authenticates (a
    /// TokenReview) and authorises for `get` on the non-resource URL `/metrics` (a
    /// SubjectAccessReview), as Kubernetes components serve their metrics. No token or an invalid
    /// one gets 401, a token without the permission 403. Decisions are kept for
    /// [`crate::runtime::METRICS_AUTH_CACHE_TTL`] per token, for at most
    /// [`crate::runtime::METRICS_AUTH_CACHE_SIZE`] tokens. The controller's own account needs
    /// `create` on `tokenreviews` (authentication.k8s.io) and `subjectaccessreviews`
    /// (authorization.k8s.io).
    Authenticated {
        /// The certificate served.
        tls: TlsSource,
    },
    /// Plain HTTP with no authentication: whoever reaches the address reads the metrics.
    Plain,
}

/// Where the metrics server's certificate comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TlsSource {
    /// A self-signed certificate (ECDSA P-256, for `localhost`) generated at start: encrypted,
    /// but a scraper cannot verify it and must skip verification.
    SelfSigned,
    /// A certificate chain and its private key, PEM files read at start (e.g. a cert-manager
    /// Secret mounted as `tls.crt` and `tls.key`). A renewed certificate is served after a
    /// restart.
    Files {
        /// The certificate chain, leaf first.
        cert: std::path::PathBuf,
        /// The private key (PKCS#8, PKCS#1 or SEC1).
        key: std::path::PathBuf,
    },
}

/// The default of [`RuntimeConfig::metrics_address`] (and of `--metrics-address`): HTTPS on
/// 8443, as Kubernetes controllers serve authenticated metrics.
pub const DEFAULT_METRICS_ADDRESS: std::net::SocketAddr =
    std::net::SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 8443);

/// The default of [`RuntimeConfig::health_address`] (and of `--health-address`).
pub const DEFAULT_HEALTH_ADDRESS: std::net::SocketAddr =
    std::net::SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 8081);

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
            metrics_address: Some(DEFAULT_METRICS_ADDRESS),
            metrics_security: MetricsSecurity::Authenticated {
                tls: TlsSource::SelfSigned,
            },
            health_address: Some(DEFAULT_HEALTH_ADDRESS),
            field_manager: DEFAULT_FIELD_MANAGER.into(),
            concurrency: 10,
            early_start_concurrency: 10,
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

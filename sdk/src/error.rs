//! The one error type of the runtime, with a stable label per kind for metrics and events.

/// What can go wrong while running a check.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the API server failed (other than the 409 that a stale decision gets, which is
    /// normal and handled by deciding again).
    #[error("API request failed: {0}")]
    Api(#[from] kube::Error),
    /// The check's `decide` or `release` failed; it is retried with backoff.
    #[error("the check failed: {0}")]
    Check(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The check returned a decision that cannot be written (e.g. too many podSetUpdates); it
    /// is asked again with backoff.
    #[error("the check returned a decision that cannot be written: {0}")]
    InvalidDecision(String),
    /// The metrics and health endpoints could not be served (e.g. the address is taken).
    #[error("cannot serve metrics and health endpoints: {0}")]
    Serve(#[source] std::io::Error),
    /// A Workload in the cache lacks what every Workload from the API server has.
    #[error("malformed Workload: {0}")]
    MalformedWorkload(String),
    /// The cluster does not serve an API the check needs (its CRD is missing or at another
    /// version); the check is inactive until it does.
    #[error("API not served: {0}")]
    ApiNotServed(String),
    /// Flags, environment or kubeconfig do not describe a usable setup.
    #[error("configuration: {0}")]
    Config(String),
    /// The leader Lease could not be read or created (often RBAC: get, create and patch on
    /// `leases` in `coordination.k8s.io` are needed in the Lease's namespace).
    #[error("leader election: {0}")]
    LeaderElection(#[source] kube_lease_manager::LeaseManagerError),
    /// Another replica took the leader Lease; this one stopped writing and should restart.
    #[error("lost the leader Lease to another replica")]
    LeadershipLost,
}

impl Error {
    /// A stable, low-cardinality label for metrics (`kind`).
    pub fn label(&self) -> &'static str {
        match self {
            Error::Api(_) => "api",
            Error::Check(_) => "check",
            Error::InvalidDecision(_) => "invalid_decision",
            Error::MalformedWorkload(_) => "malformed_workload",
            Error::Serve(_) => "serve",
            Error::ApiNotServed(_) => "api_not_served",
            Error::Config(_) => "config",
            Error::LeaderElection(_) => "leader_election",
            Error::LeadershipLost => "leadership_lost",
        }
    }
}

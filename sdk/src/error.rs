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
    /// The metrics and health endpoints could not be served (e.g. the address is taken).
    #[error("cannot serve metrics and health endpoints: {0}")]
    Serve(#[source] std::io::Error),
    /// A Workload in the cache lacks what every Workload from the API server has.
    #[error("malformed Workload: {0}")]
    MalformedWorkload(String),
}

impl Error {
    /// A stable, low-cardinality label for metrics (`error_kind`).
    pub fn label(&self) -> &'static str {
        match self {
            Error::Api(_) => "api",
            Error::Check(_) => "check",
            Error::MalformedWorkload(_) => "malformed_workload",
            Error::Serve(_) => "serve",
        }
    }
}

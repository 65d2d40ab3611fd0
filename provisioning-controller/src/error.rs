//! The one error type of the provisioning controller.

/// What can go wrong while deciding or cleaning up. Never written into a Workload as a state:
/// the SDK runtime retries with backoff and shows the message in a `CheckFailed` event, the
/// logs and `kueue_ac_reconcile_errors_total`. A failed or stuck request is not an error but a
/// `Retry` with a message.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the API server failed.
    #[error("Kubernetes API: {0}")]
    Api(#[from] kube::Error),
    /// The Workload and the config do not give a request (e.g. a ResourceFlavor is missing).
    #[error("cannot plan the ProvisioningRequest: {0}")]
    Plan(#[from] crate::plan::PlanError),
    /// A Workload without a uid or namespace: not one read from the API server.
    #[error("workload {0} has no {1}")]
    MalformedWorkload(String, &'static str),
    /// A name this controller was about to use was taken meanwhile by an object it did not
    /// make; the next pass picks another name.
    #[error("{0}")]
    NameTaken(String),
    /// The SDK runtime stopped with an error.
    #[error(transparent)]
    Runtime(#[from] kueue_admission_sdk::Error),
}

impl Error {
    /// A stable label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Error::Api(_) => "api",
            Error::Plan(_) => "plan",
            Error::MalformedWorkload(..) => "malformed_workload",
            Error::NameTaken(_) => "name_taken",
            Error::Runtime(e) => e.label(),
        }
    }
}

//! The one error type of the license check.

use kueue_admission_sdk::configmap_store::StoreError;

/// What can go wrong. Nothing here is written into a Workload as a state: the runtime retries
/// with backoff and shows the message in an event on the Workload (`CheckFailed`,
/// `CheckReleaseFailed`) and in the logs. Bad user input (a malformed annotation, pool or
/// request) is not an error but a `Rejected` or `Pending` decision with a message.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the API server failed.
    #[error("Kubernetes API: {0}")]
    Api(#[from] kube::Error),
    /// The ledger ConfigMap could not be read or updated: unreadable (the check grants nothing
    /// until a person fixes it, rather than hand out licenses twice), not the check's, or
    /// changed under every attempt to update it.
    #[error(transparent)]
    Ledger(#[from] StoreError),
    /// A Workload without a uid: not one read from the API server.
    #[error("workload {0} has no uid")]
    NoUid(String),
}

//! The one error type of the budget check.

use kueue_admission_sdk::configmap_store::StoreError;

/// What can go wrong. Nothing here is written into a Workload as a state: the runtime retries
/// with backoff and shows the message in an event on the Workload (`CheckFailed`,
/// `CheckReleaseFailed`) and in the logs. Bad user input (a malformed budget, an unreadable
/// resource request) is not an error but a `Pending` or `Rejected` decision with a message.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the API server failed.
    #[error("Kubernetes API: {0}")]
    Api(#[from] kube::Error),
    /// A ledger ConfigMap could not be read or updated: unreadable (ignoring an entry could let
    /// a namespace overspend, so the check stops charging that namespace until a person fixes
    /// or deletes the key), not the check's, or changed under every attempt to update it.
    #[error(transparent)]
    Ledger(#[from] StoreError),
    /// A Workload without a uid or namespace: not one read from the API server.
    #[error("workload {0} has no uid or namespace")]
    NotFromTheApiServer(String),
}

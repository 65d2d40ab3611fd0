//! The one error type of the license check.

use crate::ledger::CorruptEntry;

/// What can go wrong. Nothing here is written into a Workload as a state: the runtime retries
/// with backoff and shows the message in an event on the Workload (`CheckFailed`,
/// `CheckReleaseFailed`) and in the logs. Bad user input (a malformed annotation, pool or
/// request) is not an error but a `Rejected` or `Pending` decision with a message.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the API server failed.
    #[error("Kubernetes API: {0}")]
    Api(#[from] kube::Error),
    /// The ledger ConfigMap holds an entry that cannot be read. Ignoring it could hand out
    /// licenses twice, so the check stops granting until a person fixes or deletes the key.
    #[error("ledger ConfigMap {configmap}: {source}; fix or delete that key")]
    CorruptLedger {
        /// `namespace/name` of the ledger.
        configmap: String,
        /// The entry and what is wrong with it.
        #[source]
        source: CorruptEntry,
    },
    /// The ledger changed under every attempt to update it (many writers at once); the
    /// runtime asks again after its error backoff.
    #[error("ledger ConfigMap {0} changed under each of {1} attempts to update it")]
    Contention(String, usize),
    /// A ConfigMap has the ledger's name but is not a ledger (someone else's): it is never
    /// read as one nor overwritten.
    #[error(
        "ConfigMap {0} is not a license ledger (label {1} is missing); it is left alone: \
         rename or delete it, or give the check another --ledger name"
    )]
    NotALedger(String, String),
    /// A Workload without a uid: not one read from the API server.
    #[error("workload {0} has no uid")]
    NoUid(String),
}

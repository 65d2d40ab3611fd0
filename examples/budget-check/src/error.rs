//! The one error type of the budget check.

use crate::ledger::CorruptEntry;

/// What can go wrong. Nothing here is written into a Workload as a state: the runtime retries
/// with backoff and shows the message in an event on the Workload (`CheckFailed`,
/// `CheckReleaseFailed`) and in the logs. Bad user input (a malformed budget, an unreadable
/// resource request) is not an error but a `Pending` or `Rejected` decision with a message.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the API server failed.
    #[error("Kubernetes API: {0}")]
    Api(#[from] kube::Error),
    /// A ledger ConfigMap holds an entry that cannot be read. Ignoring it could let a
    /// namespace overspend, so the check stops charging that namespace until a person fixes or
    /// deletes the key.
    #[error("ledger ConfigMap {configmap}: {source}; fix or delete that key")]
    CorruptLedger {
        /// `namespace/name` of the ledger.
        configmap: String,
        /// The entry and what is wrong with it.
        #[source]
        source: CorruptEntry,
    },
    /// The ledger changed under every attempt to update it; the runtime asks again after its
    /// error backoff.
    #[error("ledger ConfigMap {0} changed under each of {1} attempts to update it")]
    Contention(String, usize),
    /// A ConfigMap has the ledger's name but is not a ledger of this check (someone else's, or
    /// another instance's with another label): it is never read as one nor overwritten.
    #[error(
        "ConfigMap {0} is not a ledger of this check (label {1} is missing or names another \
         namespace); it is left alone: rename or delete it, or give the check another \
         --ledger-prefix"
    )]
    NotALedger(String, String),
    /// A Workload without a uid or namespace: not one read from the API server.
    #[error("workload {0} has no uid or namespace")]
    NotFromTheApiServer(String),
}

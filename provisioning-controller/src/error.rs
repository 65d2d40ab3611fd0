//! The one error type of the provisioning controller.

use kueue_admission_sdk::ErrorClass;

/// What can go wrong while deciding or cleaning up. A failed or stuck request is not an error
/// but a `Retry` with a message.
///
/// [`Error::Refused`] is permanent ([`Error::class`]): the SDK writes its message on the
/// Workload's entry, keeps the quota for `--permanent-failure-hold-seconds`, then answers
/// `Retry` (and `Rejected` past the config's `backoffLimitCount`). Everything else but an API
/// refusal of a malformed or invalid call is transient: retried with backoff and shown in a
/// `CheckFailed` event, the logs and `kueue_ac_reconcile_errors_total`.
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
    /// What this check must create for the Workload is refused by the API server, or would be
    /// (the parameters are checked before anything is created): retrying cannot fix it. The
    /// message names the object, the field, where its value comes from and the fix.
    #[error("{message}")]
    Refused {
        /// For the user: written on the Workload's entry and in an Event.
        message: String,
        /// The API server's answer, when it refused a call.
        #[source]
        api: Option<kube::Error>,
    },
}

impl Error {
    /// A stable label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Error::Api(_) => "api",
            Error::Plan(_) => "plan",
            Error::MalformedWorkload(..) => "malformed_workload",
            Error::NameTaken(_) => "name_taken",
            Error::Refused { .. } => "refused",
        }
    }
}

impl Error {
    /// Whether trying again can help: a refusal is permanent, with its message; other errors
    /// follow the SDK's rule (an API answer of 400, 405, 413, 415 or 422 is permanent).
    pub fn class(&self) -> ErrorClass {
        match self {
            Error::Refused { message, .. } => ErrorClass::permanent(message.clone()),
            Error::Api(e) => ErrorClass::of(e),
            Error::Plan(_) | Error::MalformedWorkload(..) | Error::NameTaken(_) => {
                ErrorClass::Transient
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("refused", reason)
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn refusals_are_permanent_with_their_message_and_outages_transient() {
        let refused = Error::Refused {
            message: "annotation x is too long".into(),
            api: Some(api(422, "Invalid")),
        };
        assert_eq!(
            refused.class(),
            ErrorClass::permanent("annotation x is too long")
        );
        assert!(matches!(
            Error::Api(api(422, "Invalid")).class(),
            ErrorClass::Permanent { .. }
        ));
        for transient in [
            Error::Api(api(500, "InternalError")),
            Error::Api(api(403, "Forbidden")),
            Error::Api(api(409, "Conflict")),
            Error::NameTaken("x".into()),
            Error::Plan(crate::plan::PlanError::NoQuotaReservation),
        ] {
            assert_eq!(transient.class(), ErrorClass::Transient, "{transient}");
        }
    }
}

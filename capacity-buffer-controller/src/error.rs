//! The one error type of the capacity-buffer controller.

use kueue_admission_sdk::ErrorClass;

/// What can go wrong while deciding or cleaning up. Capacity that does not come in time is not
/// an error but a `Retry`; pods Karpenter cannot place and a template it cannot resolve are
/// permanent errors: the SDK writes the message on the Workload's entry, keeps the quota for
/// its permanent-failure hold (the check is asked again on every change meanwhile, so capacity
/// that comes still admits), then answers `Retry`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the API server failed; `call` names it and the object.
    #[error("Kubernetes API, {call}: {source}")]
    Api {
        /// `create CapacityBuffer team-a/train-main-0a1b2c3d4e`.
        call: String,
        /// The API server's answer, or why there was none.
        #[source]
        source: kube::Error,
    },
    /// The Workload cannot be planned for (an unknown flavor, the dedication label taken).
    #[error("cannot plan the CapacityBuffers: {0}")]
    Plan(#[from] crate::plan::PlanError),
    /// Karpenter reports pods it cannot place, past the config's grace.
    #[error("{0}")]
    Unprovisionable(String),
    /// Karpenter cannot resolve a buffer's template.
    #[error("{0}")]
    Unresolved(String),
    /// A name this controller needs is held by an object it did not make.
    #[error("{0}")]
    NameTaken(String),
    /// A cache a decision reads cannot be read (its watch is refused or not listed yet).
    #[error("{0}")]
    Unavailable(kueue_admission_sdk::watched_cache::Unavailable),
    /// A Workload without a uid or namespace: not one read from the API server.
    #[error("workload {0} has no {1}")]
    MalformedWorkload(String, &'static str),
}

impl From<kueue_admission_sdk::watched_cache::Unavailable> for Error {
    fn from(u: kueue_admission_sdk::watched_cache::Unavailable) -> Self {
        Error::Unavailable(u)
    }
}

impl Error {
    /// For `map_err`: the failure of `verb` on the `kind` object `namespace/name`.
    pub fn api(
        verb: &str,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> impl FnOnce(kube::Error) -> Error {
        let object = if namespace.is_empty() {
            name.to_string()
        } else {
            format!("{namespace}/{name}")
        };
        let call = format!("{verb} {kind} {object}");
        move |source| Error::Api { call, source }
    }

    /// A stable label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Error::Api { .. } => "api",
            Error::Plan(_) => "plan",
            Error::Unprovisionable(_) => "unprovisionable",
            Error::Unresolved(_) => "unresolved",
            Error::NameTaken(_) => "name_taken",
            Error::Unavailable(_) => "unavailable",
            Error::MalformedWorkload(..) => "malformed_workload",
        }
    }

    /// Whether trying again can help.
    pub fn class(&self) -> ErrorClass {
        use kueue_admission_sdk::watched_cache::Unavailable;
        match self {
            Error::Api { source, .. } => ErrorClass::of(source),
            Error::Plan(crate::plan::PlanError::NoQuotaReservation) => ErrorClass::Transient,
            Error::Plan(e) => ErrorClass::permanent(e.to_string()),
            Error::Unprovisionable(m) | Error::Unresolved(m) | Error::NameTaken(m) => {
                ErrorClass::permanent(m.clone())
            }
            Error::Unavailable(u @ Unavailable::Refused { .. }) => ErrorClass::NotPermitted {
                message: u.to_string(),
            },
            Error::Unavailable(_) | Error::MalformedWorkload(..) => ErrorClass::Transient,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("refused", "Reason")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn every_error_has_a_label_and_a_class_that_says_who_fixes_it() {
        let call = Error::api("create", "CapacityBuffer", "team-a", "b")(api(422));
        assert_eq!(call.label(), "api");
        assert!(
            call.to_string()
                .starts_with("Kubernetes API, create CapacityBuffer team-a/b: "),
            "{call}"
        );
        assert!(matches!(call.class(), ErrorClass::Permanent { .. }));
        let forbidden = Error::api("create", "CapacityBuffer", "team-a", "b")(api(403));
        assert!(matches!(forbidden.class(), ErrorClass::NotPermitted { .. }));
        assert_eq!(
            Error::api("get", "Node", "", "n")(api(500)).class(),
            ErrorClass::Transient
        );
        let unplaceable = Error::Unprovisionable("cannot place 2 pods".into());
        assert_eq!(
            unplaceable.class(),
            ErrorClass::permanent("cannot place 2 pods")
        );
        let waiting = Error::Plan(crate::plan::PlanError::NoQuotaReservation);
        assert_eq!(waiting.class(), ErrorClass::Transient);
        assert!(matches!(
            Error::Plan(crate::plan::PlanError::NoPods).class(),
            ErrorClass::Permanent { .. }
        ));
    }
}

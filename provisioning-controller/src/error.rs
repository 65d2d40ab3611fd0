//! The one error type of the provisioning controller.

use std::fmt;

use kube::Resource;
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
    /// A call to the API server failed; the message names the call and the object.
    #[error("Kubernetes API, {call}: {source}")]
    Api {
        /// What was asked of which object (boxed: errors stay small).
        call: Box<ApiCall>,
        /// The API server's answer, or why there was none.
        #[source]
        source: kube::Error,
    },
    /// The Workload and the config do not give a request (e.g. a ResourceFlavor is missing).
    #[error("cannot plan the ProvisioningRequest: {0}")]
    Plan(#[from] crate::plan::PlanError),
    /// A Workload without a uid or namespace: not one read from the API server.
    #[error("workload {0} has no {1}")]
    MalformedWorkload(String, &'static str),
    /// A name this controller was about to use is held by an object it did not make, found by
    /// the create (the caches hold only this instance's objects); the next name is tried.
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
    /// This controller may not read what a decision needs (a watch of its caches refused):
    /// the operator must grant it. The SDK shows the message on the entry, keeps the quota for
    /// the permanent-failure hold while asking again, then answers `Retry`, never `Rejected`.
    #[error("{0}")]
    NotPermitted(String),
}

/// A call to the API server, as an [`Error::Api`] names it: `get PodTemplate team-a/ppt-x-main`,
/// `list AdmissionCheck in the cluster`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiCall {
    /// `get`, `list`, `create`, `patch` or `delete`.
    pub verb: &'static str,
    /// The kind of the object (of the objects listed).
    pub kind: String,
    /// `namespace/name`, the name of a cluster-scoped object, or where a list looked.
    pub object: String,
}

impl ApiCall {
    /// `verb` on the object of kind `K` named `name` in `namespace` (empty: cluster-scoped).
    pub fn on<K: Resource<DynamicType = ()>>(
        verb: &'static str,
        namespace: &str,
        name: &str,
    ) -> Self {
        let object = if namespace.is_empty() {
            name.to_string()
        } else {
            format!("{namespace}/{name}")
        };
        Self {
            verb,
            kind: K::kind(&()).into_owned(),
            object,
        }
    }

    /// A list of the objects of kind `K` in `namespace` (empty: the whole cluster) that carry
    /// the labels `selector` (empty: all).
    pub fn list<K: Resource<DynamicType = ()>>(namespace: &str, selector: &str) -> Self {
        let mut object = if namespace.is_empty() {
            "in the cluster".to_string()
        } else {
            format!("in namespace {namespace}")
        };
        if !selector.is_empty() {
            object.push_str(&format!(" labelled {selector}"));
        }
        Self {
            verb: "list",
            kind: K::kind(&()).into_owned(),
            object,
        }
    }
}

impl fmt::Display for ApiCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {}", self.verb, self.kind, self.object)
    }
}

impl Error {
    /// For `map_err`: the failure of `verb` on the object of kind `K` named `name` in
    /// `namespace` (empty: cluster-scoped).
    pub fn api<K: Resource<DynamicType = ()>>(
        verb: &'static str,
        namespace: &str,
        name: &str,
    ) -> impl FnOnce(kube::Error) -> Error {
        move |source| Error::Api {
            call: Box::new(ApiCall::on::<K>(verb, namespace, name)),
            source,
        }
    }

    /// For `map_err`: the failure of a list of the objects of kind `K` ([`ApiCall::list`]).
    pub fn api_list<K: Resource<DynamicType = ()>>(
        namespace: &str,
        selector: &str,
    ) -> impl FnOnce(kube::Error) -> Error {
        move |source| Error::Api {
            call: Box::new(ApiCall::list::<K>(namespace, selector)),
            source,
        }
    }

    /// A stable label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Error::Api { .. } => "api",
            Error::Plan(_) => "plan",
            Error::MalformedWorkload(..) => "malformed_workload",
            Error::NameTaken(_) => "name_taken",
            Error::Refused { .. } => "refused",
            Error::NotPermitted(_) => "not_permitted",
        }
    }
}

impl Error {
    /// Whether trying again can help: a refusal is permanent, with its message; other errors
    /// follow the SDK's rule (an API answer of 400, 405, 413, 415 or 422 is permanent).
    pub fn class(&self) -> ErrorClass {
        match self {
            Error::Refused { message, .. } => ErrorClass::permanent(message.clone()),
            Error::NotPermitted(message) => ErrorClass::NotPermitted {
                message: message.clone(),
            },
            Error::Api { source, .. } => ErrorClass::of(source),
            Error::Plan(_) | Error::MalformedWorkload(..) | Error::NameTaken(_) => {
                ErrorClass::Transient
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::PodTemplate;
    use kueue_admission_sdk::api::{AdmissionCheck, ProvisioningRequest, ResourceFlavor};

    use super::*;

    fn api(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("refused", reason)
                .with_code(code)
                .boxed(),
        )
    }

    fn failed_get(source: kube::Error) -> Error {
        Error::api::<PodTemplate>("get", "team-a", "ppt-a-main")(source)
    }

    #[test]
    fn api_errors_name_the_call_and_the_object_and_keep_their_label() {
        let get = failed_get(api(403, "Forbidden"));
        assert_eq!(get.label(), "api");
        let message = get.to_string();
        assert!(
            message.starts_with("Kubernetes API, get PodTemplate team-a/ppt-a-main: "),
            "{message}"
        );
        assert!(
            message.contains("refused"),
            "the API server's message: {message}"
        );
        let cluster_scoped = Error::api::<ResourceFlavor>("get", "", "spot")(api(500, "x"));
        assert!(
            cluster_scoped
                .to_string()
                .starts_with("Kubernetes API, get ResourceFlavor spot: "),
            "{cluster_scoped}"
        );
        let selector = "kueue-admission-checks.dev/instance=pr-1";
        for (list, call) in [
            (
                Error::api_list::<ProvisioningRequest>("team-a", selector)(api(500, "x")),
                format!("list ProvisioningRequest in namespace team-a labelled {selector}: "),
            ),
            (
                Error::api_list::<AdmissionCheck>("", "")(api(500, "x")),
                "list AdmissionCheck in the cluster: ".to_string(),
            ),
        ] {
            assert_eq!(list.label(), "api");
            assert!(list.to_string().contains(&call), "{list}");
        }
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
            failed_get(api(422, "Invalid")).class(),
            ErrorClass::Permanent { .. }
        ));
        for transient in [
            failed_get(api(500, "InternalError")),
            failed_get(api(409, "Conflict")),
            Error::NameTaken("x".into()),
            Error::Plan(crate::plan::PlanError::NoQuotaReservation),
        ] {
            assert_eq!(transient.class(), ErrorClass::Transient, "{transient}");
        }
        // RBAC's refusal is the operator's to fix: shown, never rejected.
        assert!(matches!(
            failed_get(api(403, "Forbidden")).class(),
            ErrorClass::NotPermitted { .. }
        ));
    }
}

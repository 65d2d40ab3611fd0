//! Our AdmissionChecks: which exist, their resolved parameters, and their `Active` condition.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::api::{ADMISSION_CHECK_ACTIVE, AdmissionCheck, find_condition};
use crate::check::{AdmissionCheckController, CheckParameters};
use crate::error::Error;
use crate::retry::RetryPolicy;

/// Condition reasons on our AdmissionChecks (the first two are Kueue's own).
pub(crate) mod reason {
    pub const ACTIVE: &str = "Active";
    pub const BAD_PARAMETERS_REF: &str = "BadParametersRef";
    pub const INVALID_PARAMETERS: &str = "InvalidParameters";
    /// The controller's RBAC does not let it read the parameters object.
    pub const PARAMETERS_FORBIDDEN: &str = "ParametersForbidden";
}

/// A check whose parameters resolved and validated, ready to decide.
#[derive(Debug)]
pub(crate) struct ActiveCheck<P> {
    pub parameters: P,
    pub policy: RetryPolicy,
    /// The `Active=True` message: that it is active, and what the runtime changes about its
    /// configuration (a retry delay cut to the ceiling).
    pub message: String,
}

/// The message of `Active=True` for a check whose policy is `policy`, under `ceiling`.
pub(crate) fn active_message(policy: &RetryPolicy, ceiling: std::time::Duration) -> String {
    const ACTIVE: &str = "The admission check is active";
    let longest = policy.longest_delay();
    if longest <= ceiling {
        return ACTIVE.to_string();
    }
    format!(
        "{ACTIVE}; its retry policy ({}) would wait up to {} before an attempt, more than the \
         ceiling of {} (--max-retry-delay-seconds): such delays are written as {}",
        crate::retry::describe(policy),
        crate::retry::human(longest),
        crate::retry::human(ceiling),
        crate::retry::human(ceiling),
    )
}

/// Why a check is not active: the `Active=False` reason and message.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Inactive {
    pub reason: &'static str,
    pub message: String,
}

/// The AdmissionChecks this controller answers, by name: active, or why not.
pub(crate) type CheckMap<P> = BTreeMap<String, Result<Arc<ActiveCheck<P>>, Inactive>>;
/// The map, shared by the AdmissionCheck loop (writer) and the Workload reconciles (readers).
pub(crate) type Registry<P> = Arc<RwLock<CheckMap<P>>>;

fn bad_ref(message: String) -> Inactive {
    Inactive {
        reason: reason::BAD_PARAMETERS_REF,
        message,
    }
}

/// Resolves and validates the parameters an AdmissionCheck names. `Err(Ok(..))` is a user
/// error to show on the check; `Err(Err(..))` a transient API failure to retry.
pub(crate) async fn resolve<C: AdmissionCheckController>(
    client: &Client,
    controller: &C,
    ac: &AdmissionCheck,
    max_retry_delay: std::time::Duration,
) -> Result<ActiveCheck<C::Parameters>, Result<Inactive, Error>> {
    let wanted = <C::Parameters as CheckParameters>::reference();
    let reference = ac.spec.parameters.as_ref();
    let parameters: C::Parameters = match (wanted, reference) {
        (None, None) => serde_json::from_value(serde_json::Value::Null).map_err(|e| {
            Ok(bad_ref(format!(
                "this controller's parameters type cannot be empty: {e}"
            )))
        })?,
        (None, Some(r)) => {
            return Err(Ok(bad_ref(format!(
                "this check takes no parameters, but spec.parameters names {} {}",
                r.kind, r.name
            ))));
        }
        (Some(kind), None) => {
            return Err(Ok(bad_ref(format!(
                "spec.parameters must name a {} ({}) object",
                kind.kind, kind.group
            ))));
        }
        (Some(kind), Some(r)) if r.kind != kind.kind || r.api_group != kind.group => {
            return Err(Ok(bad_ref(format!(
                "spec.parameters names a {} ({}); this controller reads {} ({})",
                r.kind, r.api_group, kind.kind, kind.group
            ))));
        }
        (Some(kind), Some(r)) => {
            let gvk = GroupVersionKind::gvk(kind.group, kind.version, kind.kind);
            let resource = ApiResource::from_gvk_with_plural(&gvk, kind.plural);
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
            let object = match api.get_opt(&r.name).await {
                Ok(Some(o)) => o,
                Ok(None) => {
                    return Err(Ok(bad_ref(format!(
                        "{} {:?} does not exist",
                        kind.kind, r.name
                    ))));
                }
                Err(e) => return Err(Err(Error::Api(e))),
            };
            serde_json::to_value(&object)
                .and_then(serde_json::from_value)
                .map_err(|e| {
                    Ok(Inactive {
                        reason: reason::INVALID_PARAMETERS,
                        message: format!("{} {:?} cannot be read: {e}", kind.kind, r.name),
                    })
                })?
        }
    };
    if let Err(message) = parameters.validate() {
        return Err(Ok(Inactive {
            reason: reason::INVALID_PARAMETERS,
            message,
        }));
    }
    let policy = controller.retry_policy(&parameters);
    if let Err(e) = policy.validate() {
        return Err(Ok(Inactive {
            reason: reason::INVALID_PARAMETERS,
            message: e.to_string(),
        }));
    }
    let message = active_message(&policy, max_retry_delay);
    Ok(ActiveCheck {
        parameters,
        policy,
        message,
    })
}

/// Whether the check carries `Active=True` for its current spec (written for this generation).
pub(crate) fn active_for_current_spec(ac: &AdmissionCheck) -> bool {
    ac.status
        .as_ref()
        .and_then(|s| find_condition(&s.conditions, ADMISSION_CHECK_ACTIVE))
        .is_some_and(|c| c.status == "True" && c.observed_generation == ac.metadata.generation)
}

/// What the registry holds for a check, without its parameters: absent, active (with its
/// `Active` message), or why not.
pub(crate) fn summary<P>(registry: &Registry<P>, check: &str) -> Option<Result<String, Inactive>> {
    let map = registry.read().unwrap_or_else(|p| p.into_inner());
    map.get(check).map(|state| {
        state
            .as_ref()
            .map(|a| a.message.clone())
            .map_err(Clone::clone)
    })
}

/// The `Active=False` to show for an API error while reading a check's parameters that only
/// the cluster's operator can fix (the controller's own RBAC), or `None` for a transient one.
pub(crate) fn unreadable<P: CheckParameters>(
    ac: &AdmissionCheck,
    error: &Error,
) -> Option<Inactive> {
    let (Error::Api(kube::Error::Api(status)), Some(kind), Some(r)) =
        (error, P::reference(), ac.spec.parameters.as_ref())
    else {
        return None;
    };
    status.is_forbidden().then(|| Inactive {
        reason: reason::PARAMETERS_FORBIDDEN,
        message: format!(
            "the controller may not read {} {:?} ({}); its RBAC must allow get, list and watch on {}",
            kind.kind,
            r.name,
            status.message,
            if kind.group.is_empty() {
                kind.plural.to_string()
            } else {
                format!("{}.{}", kind.plural, kind.group)
            }
        ),
    })
}

/// The `Active` condition a check should carry, or `None` if it already does.
pub(crate) fn desired_active_condition(
    ac: &AdmissionCheck,
    state: &Result<String, Inactive>,
    now: Timestamp,
) -> Option<Condition> {
    let (status, reason, message) = match state {
        Ok(message) => ("True", reason::ACTIVE, message.clone()),
        Err(i) => ("False", i.reason, i.message.clone()),
    };
    let current = ac
        .status
        .as_ref()
        .and_then(|s| find_condition(&s.conditions, ADMISSION_CHECK_ACTIVE));
    let generation = ac.metadata.generation;
    if let Some(c) = current
        && c.status == status
        && c.reason == reason
        && c.message == message
        && c.observed_generation == generation
    {
        return None;
    }
    let last_transition_time = match current {
        Some(c) if c.status == status => c.last_transition_time.clone(),
        _ => Time(now),
    };
    Some(Condition {
        type_: ADMISSION_CHECK_ACTIVE.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        last_transition_time,
        observed_generation: generation,
    })
}

/// Writes the `Active` condition with a server-side apply of that condition only.
pub(crate) async fn apply_active_condition(
    client: &Client,
    field_manager: &str,
    ac: &AdmissionCheck,
    condition: Condition,
) -> Result<(), Error> {
    let body = json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "AdmissionCheck",
        "metadata": {"name": ac.name_any()},
        "status": {"conditions": [condition]},
    });
    Api::<AdmissionCheck>::all(client.clone())
        .patch_status(
            &ac.name_any(),
            &PatchParams::apply(field_manager).force(),
            &Patch::Apply(&body),
        )
        .await?;
    Ok(())
}

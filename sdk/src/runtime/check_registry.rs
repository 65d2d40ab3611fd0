//! Our AdmissionChecks: which exist, their resolved parameters, and their `Active` condition.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::api::{ADMISSION_CHECK_ACTIVE, AdmissionCheck};
use crate::check::{AdmissionCheckController, ApiKind, CheckParameters};
use crate::error::Error;
use crate::retry::RetryPolicy;

/// Reasons of the `Active` condition on our AdmissionChecks; each is written as its variant's
/// name (`Active` and `BadParametersRef` are Kueue's own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reason {
    Active,
    BadParametersRef,
    InvalidParameters,
    /// The controller's RBAC does not let it read the parameters object.
    ParametersForbidden,
    /// The cluster does not serve an API the check needs (a CRD missing or at another version).
    ApiNotServed,
    /// The controller runs in shadow mode: it decides, but writes no answers.
    ShadowMode,
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}

/// What the `Active` condition says of a check that could answer (`active`, its `Active=True`
/// message) while the controller runs in shadow mode.
pub(crate) fn shadow_mode(scope: &crate::shadow::ShadowScope, active: &str) -> Inactive {
    Inactive {
        reason: Reason::ShadowMode,
        message: format!(
            "Shadow mode: the controller decides for Workloads holding quota on {} and publishes \
             what it would answer (Events WouldAnswer, metric kueue_ac_shadow_decisions_total) \
             without writing it. A ClusterQueue must not list this check meanwhile (one that \
             does is inactive); to enforce it, run the controller without --shadow. {active}.",
            scope.describe()
        ),
    }
}

/// A check whose parameters resolved and validated, ready to decide.
#[derive(Clone, Debug)]
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
    pub reason: Reason,
    pub message: String,
}

/// The AdmissionChecks this controller answers, by name: active, or why not.
pub(crate) type CheckMap<P> = BTreeMap<String, Result<Arc<ActiveCheck<P>>, Inactive>>;
/// The map, shared by the AdmissionCheck loop (writer) and the Workload reconciles (readers).
pub(crate) type Registry<P> = Arc<RwLock<CheckMap<P>>>;

fn bad_ref(message: String) -> Inactive {
    Inactive {
        reason: Reason::BadParametersRef,
        message,
    }
}

/// Whether the cluster serves each of `kinds` at its version, from the discovery endpoints:
/// `Err(Error::ApiNotServed)` naming the first that is not (and the versions of its group the
/// cluster serves instead), another `Err` for a failed discovery request.
pub(crate) async fn require_served(client: &Client, kinds: &[ApiKind]) -> Result<(), Error> {
    for kind in kinds {
        if let Some(why) = why_not_served(client, kind).await? {
            return Err(Error::ApiNotServed(format!(
                "this check needs {} ({}), and {why}; install or upgrade the \
                 CustomResourceDefinition that serves it (the check turns active by itself once \
                 it is served)",
                kind.resource_path(),
                kind.kind,
            )));
        }
    }
    Ok(())
}

/// `None` if the cluster serves `kind` at its version; else what it serves instead, in words.
/// `Err` for a failed discovery request.
pub(crate) async fn why_not_served(
    client: &Client,
    kind: &ApiKind,
) -> Result<Option<String>, Error> {
    let listed = if kind.group.is_empty() {
        client.list_core_api_resources(kind.version).await
    } else {
        client
            .list_api_group_resources(&format!("{}/{}", kind.group, kind.version))
            .await
    };
    Ok(Some(match listed {
        Ok(list) if list.resources.iter().any(|r| r.name == kind.plural) => return Ok(None),
        Ok(list) => format!(
            "{} serves no {} (kind {}): it serves {}",
            kind.group_version_path(),
            kind.plural,
            kind.kind,
            list.resources
                .iter()
                .filter(|r| !r.name.contains('/'))
                .map(|r| r.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Err(kube::Error::Api(status)) if status.code == 404 => {
            let groups = client.list_api_groups().await?;
            let served: Vec<&str> = groups
                .groups
                .iter()
                .filter(|g| g.name == kind.group)
                .flat_map(|g| g.versions.iter().map(|v| v.version.as_str()))
                .collect();
            if served.is_empty() {
                format!(
                    "the cluster serves no version of the API group {:?}",
                    kind.group
                )
            } else {
                format!(
                    "the cluster serves {:?} only at {}",
                    kind.group,
                    served.join(", ")
                )
            }
        }
        Err(e) => return Err(Error::Api(e)),
    }))
}

/// What resolving an AdmissionCheck found: it can answer, or what the user must fix first.
#[derive(Debug)]
pub(crate) enum Resolved<P> {
    Active(ActiveCheck<P>),
    Inactive(Inactive),
}

/// Resolves and validates the parameters an AdmissionCheck names. An `Err` is an API failure
/// to retry; what the user must fix is [`Resolved::Inactive`].
pub(crate) async fn resolve<C: AdmissionCheckController>(
    client: &Client,
    controller: &C,
    ac: &AdmissionCheck,
    max_retry_delay: std::time::Duration,
) -> Result<Resolved<C::Parameters>, Error> {
    let wanted = <C::Parameters as CheckParameters>::reference();
    let needed: Vec<ApiKind> = wanted
        .into_iter()
        .chain(controller.required_apis())
        .collect();
    require_served(client, &needed).await?;
    let parameters = match read_parameters::<C::Parameters>(client, ac).await? {
        Ok(parameters) => parameters,
        Err(inactive) => return Ok(Resolved::Inactive(inactive)),
    };
    let invalid = |message: String| {
        Resolved::Inactive(Inactive {
            reason: Reason::InvalidParameters,
            message,
        })
    };
    if let Err(message) = parameters.validate() {
        return Ok(invalid(message));
    }
    let policy = controller.retry_policy(&parameters);
    if let Err(e) = policy.validate() {
        return Ok(invalid(e.to_string()));
    }
    let message = active_message(&policy, max_retry_delay);
    Ok(Resolved::Active(ActiveCheck {
        parameters,
        policy,
        message,
    }))
}

/// Reads the parameters object `ac` names as a `P`: `Ok(Err(..))` says what is wrong with the
/// reference or the object, for the check's condition; `Err` is an API failure.
async fn read_parameters<P: CheckParameters>(
    client: &Client,
    ac: &AdmissionCheck,
) -> Result<Result<P, Inactive>, Error> {
    let reference = ac.spec.parameters.as_ref();
    let (kind, name) = match (P::reference(), reference) {
        (None, None) => {
            return Ok(
                serde_json::from_value(serde_json::Value::Null).map_err(|e| {
                    bad_ref(format!(
                        "this controller's parameters type cannot be empty: {e}"
                    ))
                }),
            );
        }
        (None, Some(r)) => {
            return Ok(Err(bad_ref(format!(
                "this check takes no parameters, but spec.parameters names {} {}",
                r.kind, r.name
            ))));
        }
        (Some(kind), None) => {
            return Ok(Err(bad_ref(format!(
                "spec.parameters must name a {} ({}) object",
                kind.kind, kind.group
            ))));
        }
        (Some(kind), Some(r)) if r.kind != kind.kind || r.api_group != kind.group => {
            return Ok(Err(bad_ref(format!(
                "spec.parameters names a {} ({}); this controller reads {} ({})",
                r.kind, r.api_group, kind.kind, kind.group
            ))));
        }
        (Some(kind), Some(r)) => (kind, &r.name),
    };
    let gvk = GroupVersionKind::gvk(kind.group, kind.version, kind.kind);
    let resource = ApiResource::from_gvk_with_plural(&gvk, kind.plural);
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let Some(object) = api.get_opt(name).await? else {
        return Ok(Err(bad_ref(format!(
            "{} {name:?} does not exist",
            kind.kind
        ))));
    };
    Ok(serde_json::to_value(&object)
        .and_then(serde_json::from_value)
        .map_err(|e| Inactive {
            reason: Reason::InvalidParameters,
            message: format!("{} {name:?} cannot be read: {e}", kind.kind),
        }))
}

/// Whether the check carries `Active=True` for its current spec (written for this generation).
pub(crate) fn active_for_current_spec(ac: &AdmissionCheck) -> bool {
    ac.active_condition()
        .is_some_and(|c| c.status == "True" && c.observed_generation == ac.metadata.generation)
}

/// The names of the checks in the registry, active or not.
pub(crate) fn names<P>(registry: &Registry<P>) -> Vec<String> {
    let map = registry.read().unwrap_or_else(|p| p.into_inner());
    map.keys().cloned().collect()
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

/// The `Active=False` to show for an error while resolving a check that only the cluster's
/// operator can fix, or `None` for a transient one (the check keeps what it had):
/// - an API the check needs is not served: nothing it does can work, so the check goes inactive
///   even if it was active;
/// - our own RBAC forbids reading the parameters: shown, unless the check is `Active` for its
///   current spec (turning it inactive would stop its ClusterQueues for what may be a passing
///   authorizer fault; it keeps the parameters this process last read, if any).
pub(crate) fn inactive_for<P: CheckParameters>(
    ac: &AdmissionCheck,
    error: &Error,
) -> Option<Inactive> {
    match error {
        Error::ApiNotServed(message) => Some(Inactive {
            reason: Reason::ApiNotServed,
            message: message.clone(),
        }),
        _ if active_for_current_spec(ac) => None,
        _ => unreadable::<P>(ac, error),
    }
}

/// The `Active=False` for our RBAC refusing to read a check's parameters, or `None`.
fn unreadable<P: CheckParameters>(ac: &AdmissionCheck, error: &Error) -> Option<Inactive> {
    let (Error::Api(kube::Error::Api(status)), Some(kind), Some(r)) =
        (error, P::reference(), ac.spec.parameters.as_ref())
    else {
        return None;
    };
    status.is_forbidden().then(|| Inactive {
        reason: Reason::ParametersForbidden,
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
        Ok(message) => ("True", Reason::Active, message.clone()),
        Err(i) => ("False", i.reason, i.message.clone()),
    };
    let current = ac.active_condition();
    let generation = ac.metadata.generation;
    if let Some(c) = current
        && c.status == status
        && c.reason == reason.to_string()
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
        reason: reason.to_string(),
        message,
        last_transition_time,
        observed_generation: generation,
    })
}

/// Writes the check's conditions of this controller (`Active`, and the claim of
/// [`super::claim`]) with a server-side apply of those conditions only: one left out is removed.
pub(crate) async fn apply_active_condition(
    client: &Client,
    field_manager: &str,
    ac: &AdmissionCheck,
    conditions: Vec<Condition>,
) -> Result<(), Error> {
    let body = json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "AdmissionCheck",
        "metadata": {"name": ac.name_any()},
        "status": {"conditions": conditions},
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

/// Discovery answers for scripted-API tests of [`why_not_served`] and its callers.
#[cfg(test)]
pub(crate) mod discovery_fixtures {
    use serde_json::json;

    /// `GET /apis/<group>/<version>`: an APIResourceList naming `names` (subresources too).
    pub(crate) fn resource_list(group_version: &str, names: &[&str]) -> serde_json::Value {
        json!({
            "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version,
            "resources": names.iter().map(|n| json!({
                "name": n, "singularName": "", "namespaced": true, "kind": "X", "verbs": ["get"],
            })).collect::<Vec<_>>(),
        })
    }

    /// The answer to `GET /apis/<group>/<version>` for a version the cluster does not serve.
    pub(crate) fn version_not_served(api: &crate::testing::ScriptedApi) {
        api.fail(
            404,
            "NotFound",
            "the server could not find the requested resource",
        );
    }

    /// `GET /apis`: an APIGroupList of `(group, versions)`.
    pub(crate) fn group_list(groups: &[(&str, &[&str])]) -> serde_json::Value {
        json!({
            "kind": "APIGroupList", "apiVersion": "v1",
            "groups": groups.iter().map(|(group, versions)| json!({
                "name": group,
                "versions": versions.iter().map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v})).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::ScriptedApi;

    const PROVISIONING_REQUEST: ApiKind = ApiKind {
        group: "autoscaling.x-k8s.io",
        version: "v1",
        kind: "ProvisioningRequest",
        plural: "provisioningrequests",
    };

    /// Users and alerts match on these strings: a renamed variant must not change one.
    #[test]
    fn reasons_are_written_as_documented() {
        let written = [
            Reason::Active,
            Reason::BadParametersRef,
            Reason::InvalidParameters,
            Reason::ParametersForbidden,
            Reason::ApiNotServed,
            Reason::ShadowMode,
        ]
        .map(|r| r.to_string());
        assert_eq!(
            written,
            [
                "Active",
                "BadParametersRef",
                "InvalidParameters",
                "ParametersForbidden",
                "ApiNotServed",
                "ShadowMode"
            ]
        );
    }

    fn resources(names: &[&str]) -> serde_json::Value {
        discovery_fixtures::resource_list("autoscaling.x-k8s.io/v1", names)
    }

    fn groups(versions: &[&str]) -> serde_json::Value {
        discovery_fixtures::group_list(&[
            ("autoscaling.x-k8s.io", versions),
            ("kueue.x-k8s.io", &["v1"]),
        ])
    }

    #[tokio::test]
    async fn a_served_api_passes_with_one_discovery_request() {
        let api = ScriptedApi::new();
        api.answer(
            200,
            resources(&["provisioningrequests", "provisioningrequests/status"]),
        );
        require_served(&api.client(), &[PROVISIONING_REQUEST])
            .await
            .expect("served");
        assert_eq!(api.calls(), ["GET /apis/autoscaling.x-k8s.io/v1"]);
    }

    #[tokio::test]
    async fn an_api_at_another_version_is_named_with_the_versions_served() {
        let api = ScriptedApi::new();
        discovery_fixtures::version_not_served(&api);
        api.answer(200, groups(&["v1beta1"]));
        let err = require_served(&api.client(), &[PROVISIONING_REQUEST])
            .await
            .expect_err("not served");
        assert_eq!(err.label(), "api_not_served");
        let message = err.to_string();
        assert!(
            message.contains("provisioningrequests.autoscaling.x-k8s.io/v1")
                && message.contains("only at v1beta1")
                && message.contains("CustomResourceDefinition"),
            "{message}"
        );
        assert_eq!(
            api.calls(),
            ["GET /apis/autoscaling.x-k8s.io/v1", "GET /apis"]
        );
    }

    #[tokio::test]
    async fn a_missing_group_or_resource_is_named() {
        let api = ScriptedApi::new();
        discovery_fixtures::version_not_served(&api);
        api.answer(200, groups(&[]));
        let err = require_served(&api.client(), &[PROVISIONING_REQUEST])
            .await
            .expect_err("no group");
        assert!(
            err.to_string()
                .contains("serves no version of the API group \"autoscaling.x-k8s.io\""),
            "{err}"
        );

        let api = ScriptedApi::new();
        api.answer(200, resources(&["provisioningrequestthings"]));
        let err = require_served(&api.client(), &[PROVISIONING_REQUEST])
            .await
            .expect_err("no such resource in the group");
        assert!(
            err.to_string().contains("serves no provisioningrequests")
                && err.to_string().contains("provisioningrequestthings"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_failing_discovery_is_an_api_error_to_retry_not_a_verdict() {
        for code in [500, 503, 429, 403] {
            let api = ScriptedApi::new();
            api.fail(code, "Failure", "discovery failed");
            let err = require_served(&api.client(), &[PROVISIONING_REQUEST])
                .await
                .expect_err("failed");
            assert_eq!(err.label(), "api", "{code}");
        }
    }

    fn admission_check(active: bool) -> AdmissionCheck {
        let mut ac: AdmissionCheck = serde_json::from_value(json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "AdmissionCheck",
            "metadata": {"name": "capacity", "generation": 2},
            "spec": {"controllerName": "example.com/capacity"},
        }))
        .expect("an AdmissionCheck");
        if active {
            ac.status = serde_json::from_value(json!({"conditions": [{
                "type": "Active", "status": "True", "reason": "Active", "message": "",
                "lastTransitionTime": "2026-11-25T00:00:00Z", "observedGeneration": 2,
            }]}))
            .expect("a status");
        }
        ac
    }

    #[test]
    fn an_api_not_served_turns_even_an_active_check_inactive_a_transient_error_does_not() {
        let not_served = Error::ApiNotServed("needs widgets.example.com/v1".into());
        for active in [false, true] {
            let inactive =
                inactive_for::<crate::check::NoParameters>(&admission_check(active), &not_served)
                    .expect("inactive");
            assert_eq!(inactive.reason, Reason::ApiNotServed);
            assert!(inactive.message.contains("widgets.example.com/v1"));
        }
        let transient = Error::Config("anything else".into());
        assert_eq!(
            inactive_for::<crate::check::NoParameters>(&admission_check(false), &transient),
            None
        );
    }
}

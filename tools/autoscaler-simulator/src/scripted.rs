//! The I/O of scripted mode ("fault injection"): a kube-runtime controller on the request watch
//! plays each scripted request's [`Script`] as [`decide`] says, at most one reconcile per
//! request at a time, a delayed step being one scheduled wake-up per request (the earliest
//! wins) that is dropped if the request is deleted meanwhile. Scripted requests react to watch
//! events at once, not on the autoscaler loop's cadence.
//!
//! PodTemplates are read from the shared watch cache; a request scripted by class whose
//! template is not cached yet reads it once from the API server, as before the cache existed.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::PodTemplate;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use kueue_admission_sdk::api::ProvisioningRequest;
use serde_json::json;
use tracing::{debug, info, warn};

use crate::conditions::{merged_conditions, whole_seconds};
use crate::script::{
    CLASS_DETAILS_ANNOTATION, Decision, SCRIPT_ANNOTATION, Script, attempt_of_name, decide,
    is_finished, new_condition, parse_class_details,
};
use crate::settings::Settings;
use crate::snapshot::template_annotations;

/// The field manager of the simulator's status writes.
pub const FIELD_MANAGER: &str = "autoscaler-simulator";

/// How long to wait before retrying a request whose reconcile failed: a tenth of its age,
/// between 1 and 30 seconds (a young request's PodTemplate may be on its way; an old one's is
/// likely gone for good).
fn retry_delay(age: Duration) -> Duration {
    (age / 10).clamp(Duration::from_secs(1), Duration::from_secs(30))
}

#[derive(Debug, thiserror::Error)]
enum ReconcileError {
    #[error("PodTemplate {namespace}/{name} of the first podset does not exist")]
    PodTemplateMissing { namespace: String, name: String },
    #[error("reading PodTemplate {namespace}/{name}: {source}")]
    PodTemplate {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error("writing the status: {0}")]
    Write(kube::Error),
}

struct Context {
    client: Client,
    settings: Settings,
    templates: Store<PodTemplate>,
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// The first pod template of a request: from the cache, else (`read_through`) from the API
/// server. `Ok(None)`: the request has no podset, or (without `read_through`) the template is
/// not cached.
async fn first_template(
    ctx: &Context,
    request: &ProvisioningRequest,
    read_through: bool,
) -> Result<Option<BTreeMap<String, String>>, ReconcileError> {
    let Some(podset) = request.spec.pod_sets.first() else {
        return Ok(None);
    };
    let namespace = request.namespace().unwrap_or_default();
    let name = podset.pod_template_ref.name.clone();
    let key = ObjectRef::new(&name).within(&namespace);
    if let Some(template) = ctx.templates.get(&key) {
        return Ok(Some(template_annotations(&template)));
    }
    if !read_through {
        return Ok(None);
    }
    let api: Api<PodTemplate> = Api::namespaced(ctx.client.clone(), &namespace);
    match api.get_opt(&name).await {
        Ok(Some(template)) => Ok(Some(template_annotations(&template))),
        Ok(None) => Err(ReconcileError::PodTemplateMissing { namespace, name }),
        Err(source) => Err(ReconcileError::PodTemplate {
            namespace,
            name,
            source,
        }),
    }
}

fn key_of(request: &ProvisioningRequest) -> String {
    format!(
        "{}/{}",
        request.namespace().unwrap_or_default(),
        request.name_any()
    )
}

fn age_of(request: &ProvisioningRequest) -> Duration {
    request
        .metadata
        .creation_timestamp
        .as_ref()
        .and_then(|t| Duration::try_from(Timestamp::now().duration_since(t.0)).ok())
        .unwrap_or(Duration::ZERO)
}

/// The script of a request, if it is scripted. A request scripted only by annotation whose
/// template is not cached yet is looked at again shortly (`Err(action)`).
async fn script_of(
    ctx: &Context,
    request: &ProvisioningRequest,
) -> Result<Result<Option<(Script, BTreeMap<String, String>)>, Action>, ReconcileError> {
    let by_class = ctx
        .settings
        .scripts_class(&request.spec.provisioning_class_name);
    let annotations = match first_template(ctx, request, by_class).await? {
        Some(annotations) => annotations,
        None if by_class || request.spec.pod_sets.is_empty() => BTreeMap::new(),
        None => return Ok(Err(Action::requeue(retry_delay(age_of(request))))),
    };
    let script = match annotations.get(SCRIPT_ANNOTATION) {
        None if by_class => ctx.settings.default_script.clone(),
        None => return Ok(Ok(None)),
        Some(text) => match text.parse::<Script>() {
            Ok(script) => script,
            Err(error) => {
                warn!(request = %key_of(request), script = %text, %error, "bad simulator script: ignoring the request");
                return Ok(Ok(None));
            }
        },
    };
    Ok(Ok(Some((script, annotations))))
}

async fn reconcile(
    request: Arc<ProvisioningRequest>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    if request.metadata.deletion_timestamp.is_some() || is_finished(request.status.as_ref()) {
        return Ok(Action::await_change());
    }
    let (script, annotations) = match script_of(&ctx, &request).await? {
        Err(later) => return Ok(later),
        Ok(None) => return Ok(Action::await_change()),
        Ok(Some(found)) => found,
    };
    let key = key_of(&request);
    let attempt = attempt_of_name(&request.name_any());
    let step = script.step(attempt);
    let now = whole_seconds(Timestamp::now());
    let decision = decide(request.status.as_ref(), step, now);
    debug!(request = %key, attempt, %step, ?decision, "scripted");
    if !decision.add.is_empty() {
        write(&ctx.client, &request, &annotations, &decision, now, &key).await?;
    }
    Ok(match decision.wake_at {
        Some(at) => {
            let wait =
                Duration::try_from(at.duration_since(Timestamp::now())).unwrap_or(Duration::ZERO);
            Action::requeue(wait)
        }
        None => Action::await_change(),
    })
}

/// Writes the decided conditions (and, with `Provisioned`, the class details) by a JSON merge
/// patch of the status, guarded by the resourceVersion the decision was made on.
async fn write(
    client: &Client,
    request: &ProvisioningRequest,
    annotations: &BTreeMap<String, String>,
    decision: &Decision,
    now: Timestamp,
    key: &str,
) -> Result<(), ReconcileError> {
    let generation = request.metadata.generation;
    let class = &request.spec.provisioning_class_name;
    let added = decision
        .add
        .iter()
        .map(|t| new_condition(t, class, generation, now))
        .collect();
    let existing = request
        .status
        .as_ref()
        .map_or(&[][..], |s| &s.conditions[..]);
    let mut status = json!({ "conditions": merged_conditions(existing, added) });
    if decision.provisions() {
        let text = annotations
            .get(CLASS_DETAILS_ANNOTATION)
            .map_or("", String::as_str);
        let (details, bad) = parse_class_details(text);
        if !bad.is_empty() {
            warn!(request = %key, entries = ?bad, "class details entries that are not key=value are left out");
        }
        if !details.is_empty() {
            status["provisioningClassDetails"] = json!(details);
        }
    }
    let patch = json!({
        "metadata": { "resourceVersion": request.resource_version() },
        "status": status,
    });
    let api: Api<ProvisioningRequest> =
        Api::namespaced(client.clone(), &request.namespace().unwrap_or_default());
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    match api
        .patch_status(&request.name_any(), &params, &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {
            info!(request = %key, conditions = ?decision.add, "scripted");
            Ok(())
        }
        Err(kube::Error::Api(status)) if status.code == 404 => {
            info!(request = %key, "the request was deleted meanwhile");
            Ok(())
        }
        Err(error) => Err(ReconcileError::Write(error)),
    }
}

fn error_policy(
    request: Arc<ProvisioningRequest>,
    error: &ReconcileError,
    _: Arc<Context>,
) -> Action {
    let delay = retry_delay(age_of(&request));
    let key = key_of(&request);
    let conflict = matches!(error, ReconcileError::Write(kube::Error::Api(s)) if s.code == 409);
    if conflict {
        info!(request = %key, "the request changed meanwhile; retrying");
    } else {
        warn!(request = %key, %error, retry_in = ?delay, "scripting the request failed");
    }
    Action::requeue(delay)
}

/// Plays the scripted requests among those `requests` (a reflected watch stream whose cache is
/// `store`) yields, until the stream ends. API errors are logged and retried, never fatal.
pub(crate) async fn run(
    client: Client,
    settings: Settings,
    requests: impl Stream<Item = Result<ProvisioningRequest, watcher::Error>> + Send + 'static,
    store: Store<ProvisioningRequest>,
    templates: Store<PodTemplate>,
) {
    let ctx = Arc::new(Context {
        client,
        settings,
        templates,
    });
    Controller::for_stream(requests, store)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok(_) => {}
                // Already logged by error_policy.
                Err(controller::Error::ReconcilerFailed(..)) => {}
                Err(controller::Error::ObjectNotFound(object)) => {
                    debug!(%object, "the request is gone");
                }
                Err(error) => warn!(%error, "watching ProvisioningRequests"),
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_with_age() {
        let secs = Duration::from_secs;
        assert_eq!(retry_delay(Duration::ZERO), secs(1));
        assert_eq!(retry_delay(secs(50)), secs(5));
        assert_eq!(retry_delay(secs(3600)), secs(30));
    }
}

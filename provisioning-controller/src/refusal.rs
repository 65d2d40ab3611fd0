//! Pure: what to tell the user when something this check must create is refused, or would be.
//!
//! Retrying cannot fix a value the API server finds invalid, so such a failure is permanent
//! ([`kueue_admission_sdk::ErrorClass::Permanent`]): the SDK writes the message on the
//! Workload's entry and in an Event, keeps the quota for a while, then answers `Retry`. The
//! message therefore says what was refused, which field, where its value comes from and how to
//! fix it, within a bounded length, and never repeats a value (it may be anything a user
//! wrote, a secret included): lengths, not contents.

use kueue_admission_sdk::ErrorClass;
use kueue_admission_sdk::check::{redact_quoted as redact, truncate_chars as truncate};

use crate::plan::{MAX_PARAMETER_LEN, MAX_PARAMETERS, PARAMETER_ANNOTATION_PREFIX};
use crate::plan::{ParameterSource, PlanError};

/// How much of the API server's own explanation is kept (characters).
const MAX_DETAILS: usize = 300;
/// How many of the API server's causes are named.
const MAX_CAUSES: usize = 3;

/// The Workload a refusal is about, and the config its request is made from.
#[derive(Clone, Copy, Debug)]
pub struct Subject<'a> {
    /// The Workload's namespace.
    pub namespace: &'a str,
    /// The Workload's name.
    pub workload: &'a str,
    /// The ProvisioningRequestConfig's name.
    pub config: &'a str,
}

/// How to change a parameter annotation where it counts: on the Workload. Kueue copies a Job's
/// annotations to its Workload only when it creates the Workload.
fn annotation_fix(s: &Subject<'_>, key: &str) -> String {
    format!(
        "Fix it on the Workload: kubectl annotate workload -n {ns} {wl} \
         {PARAMETER_ANNOTATION_PREFIX}{key}=<new value> --overwrite, or resubmit the Job with it fixed \
         (Kueue copies a Job's annotations only when it creates the Workload)",
        ns = s.namespace,
        wl = s.workload,
    )
}

/// The message for a plan that no ProvisioningRequest can be made from because of its
/// parameters, or `None` for a plan error that is not the user's to fix.
pub fn for_plan(error: &PlanError, s: &Subject<'_>) -> Option<String> {
    match error {
        PlanError::ParameterTooLong {
            key,
            len,
            from: ParameterSource::WorkloadAnnotation,
        } => Some(format!(
            "annotation {PARAMETER_ANNOTATION_PREFIX}{key} on this Workload is {len} characters long, \
             but a ProvisioningRequest takes at most {MAX_PARAMETER_LEN} per parameter \
             (spec.parameters[{key}]), so none can be created. {}",
            annotation_fix(s, key)
        )),
        PlanError::ParameterTooLong {
            key,
            len,
            from: ParameterSource::Config,
        } => Some(format!(
            "spec.parameters[{key}] of ProvisioningRequestConfig {config} is {len} characters long; a \
             ProvisioningRequest accepts at most {MAX_PARAMETER_LEN} characters per value, so no \
             ProvisioningRequest can be created. The cluster's operator must shorten it in the config \
             (a shorter annotation {PARAMETER_ANNOTATION_PREFIX}{key} on the Workload overrides it)",
            config = s.config,
        )),
        PlanError::TooManyParameters {
            count,
            from_annotations,
        } => Some(format!(
            "the ProvisioningRequest would have {count} parameters, {from_annotations} of them added by \
             {PARAMETER_ANNOTATION_PREFIX} annotations on this Workload to those of \
             ProvisioningRequestConfig {config}; a ProvisioningRequest accepts at most {MAX_PARAMETERS}. \
             Remove at least {excess} of those annotations on the Workload (kubectl annotate workload -n \
             {ns} {wl} {PARAMETER_ANNOTATION_PREFIX}<key>-), or resubmit the Job with fewer \
             (Kueue copies a Job's annotations only when it creates the Workload)",
            config = s.config,
            excess = count.saturating_sub(MAX_PARAMETERS),
            ns = s.namespace,
            wl = s.workload,
        )),
        // Confirmed gone (the read found nothing): Kueue keeps a flavor a ClusterQueue lists, so
        // it was forced out (its finalizer removed) while this Workload held quota on it. Waiting
        // would hold the quota for nothing; after the hold the Retry gives it back, and the
        // Workload is admitted again once the flavor is back (Kueue keeps the ClusterQueue
        // inactive until then).
        PlanError::UnknownFlavor { pod_set, flavor } => Some(format!(
            "ResourceFlavor {flavor} (assigned to podset {pod_set}) no longer exists: it was \
             removed while this Workload held quota on it, so no ProvisioningRequest can be \
             planned for it. Re-create the ResourceFlavor, or remove it from the ClusterQueue; \
             the Workload gives its quota back and is admitted again once its ClusterQueue is \
             active"
        )),
        _ => None,
    }
}

/// What the check tried to create.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The attempt's ProvisioningRequest.
    ProvisioningRequest,
    /// One of its PodTemplates.
    PodTemplate,
}

impl Kind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Kind::ProvisioningRequest => "ProvisioningRequest",
            Kind::PodTemplate => "PodTemplate",
        }
    }
}

/// The message for the API server refusing to create `object` (a `kind` in the Workload's
/// namespace) with `status`, or `None` when retrying may help (anything but a malformed or
/// invalid request, see [`ErrorClass::of_status`]). `annotation_keys` are the request
/// parameters the Workload's annotations set.
pub fn for_api(
    kind: Kind,
    object: &str,
    status: &kube::core::Status,
    annotation_keys: &[String],
    s: &Subject<'_>,
) -> Option<String> {
    if !matches!(
        ErrorClass::of_status(status.code, &status.reason, &status.message),
        ErrorClass::Permanent { .. }
    ) {
        return None;
    }
    let causes = named_causes(status);
    let details = truncate(&describe_causes(status, &causes, object), MAX_DETAILS);
    let reason = if status.reason.is_empty() {
        "Invalid"
    } else {
        status.reason.as_str()
    };
    let hint = fix_hint(kind, &causes, annotation_keys, s);
    Some(format!(
        "the API server refused to create {} {}/{object} ({reason}, {}): {details}. {hint}",
        kind.as_str(),
        s.namespace,
        status.code
    ))
}

type Cause = kube::core::response::StatusCause;

/// The causes of a refusal that name a field (all of them if none does). The API server adds a
/// cause without a field ("<nil>") saying that validation rules were skipped because of the
/// others: only noise next to them.
fn named_causes(status: &kube::core::Status) -> Vec<&Cause> {
    let all: Vec<&Cause> = status
        .details
        .as_ref()
        .map(|d| d.causes.iter().collect())
        .unwrap_or_default();
    let named = |c: &&Cause| !c.field.is_empty() && c.field != "<nil>";
    if all.iter().any(named) {
        all.into_iter().filter(named).collect()
    } else {
        all
    }
}

/// The causes, field by field (at most [`MAX_CAUSES`]), or the status message without them;
/// quoted values other than `object` redacted.
fn describe_causes(status: &kube::core::Status, causes: &[&Cause], object: &str) -> String {
    let keep = [object];
    if causes.is_empty() {
        return redact(&status.message, &keep);
    }
    let mut named: Vec<String> = causes
        .iter()
        .take(MAX_CAUSES)
        .map(|c| {
            let message = redact(&c.message, &keep);
            if c.field.is_empty() {
                message
            } else {
                format!("{}: {message}", c.field)
            }
        })
        .collect();
    if causes.len() > MAX_CAUSES {
        named.push(format!("{} more", causes.len() - MAX_CAUSES));
    }
    named.join("; ")
}

/// Where the refused value came from and what to fix: a Workload annotation, the config, the
/// Job, or the ResourceFlavor.
fn fix_hint(kind: Kind, causes: &[&Cause], annotation_keys: &[String], s: &Subject<'_>) -> String {
    let parameter_field = |key: &str| {
        causes.iter().any(|c| {
            c.field == format!("spec.parameters.{key}")
                || c.field == format!("spec.parameters[{key}]")
        })
    };
    match kind {
        Kind::ProvisioningRequest => {
            match annotation_keys.iter().find(|k| parameter_field(k.as_str())) {
                Some(key) => format!(
                    "The value of spec.parameters[{key}] comes from annotation \
                     {PARAMETER_ANNOTATION_PREFIX}{key} on this Workload. {}",
                    annotation_fix(s, key)
                ),
                None if causes.iter().any(|c| c.field.starts_with("spec.parameters")) => format!(
                    "spec.parameters come from ProvisioningRequestConfig {} and the Workload's \
                     {PARAMETER_ANNOTATION_PREFIX} annotations: fix the value there",
                    s.config
                ),
                None => format!(
                    "The request is made from the Workload's podsets and ProvisioningRequestConfig \
                     {}: fix the config, or the Job and submit it again",
                    s.config
                ),
            }
        }
        Kind::PodTemplate => "The PodTemplate is the Workload's podset template plus the node \
                              labels and tolerations of its ResourceFlavor: fix the ResourceFlavor, \
                              or the Job's pod template and submit the Job again"
            .to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Subject<'static> = Subject {
        namespace: "team-a",
        workload: "job-train-5f2a1",
        config: "capacity",
    };

    fn invalid(message: &str, causes: &[(&str, &str)]) -> kube::core::Status {
        let causes: Vec<serde_json::Value> = causes
            .iter()
            .map(|(field, message)| {
                serde_json::json!({"reason": "FieldValueTooLong", "message": message, "field": field})
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "status": "Failure",
            "message": message,
            "reason": "Invalid",
            "code": 422,
            "details": {"causes": causes},
        }))
        .expect("a Status")
    }

    /// What the user reads when parameter `key` is `len` characters long.
    fn too_long(key: &str, len: usize, from: ParameterSource) -> String {
        let err = PlanError::ParameterTooLong {
            key: key.into(),
            len,
            from,
        };
        for_plan(&err, &S).expect("the user's to fix")
    }

    fn assert_mentions(message: &str, parts: &[&str]) {
        for part in parts {
            assert!(message.contains(part), "{part:?} missing from {message}");
        }
    }

    #[test]
    fn a_long_annotation_names_the_annotation_the_limit_and_the_fix_on_the_workload() {
        let m = too_long(
            "ValidUntilSeconds",
            300,
            ParameterSource::WorkloadAnnotation,
        );
        assert_mentions(
            &m,
            &[
                "annotation provreq.kueue.x-k8s.io/ValidUntilSeconds on this Workload is 300 characters long",
                "spec.parameters[ValidUntilSeconds]",
                "at most 255",
                "kubectl annotate workload -n team-a job-train-5f2a1 provreq.kueue.x-k8s.io/ValidUntilSeconds=<new value> --overwrite",
                "resubmit the Job",
                "Kueue copies a Job's annotations only when it creates the Workload",
            ],
        );
        // Bounded, whatever the value: with usual names, within the SDK's 600 characters.
        assert!(m.chars().count() < 500, "{}", m.chars().count());
    }

    #[test]
    fn a_flavor_removed_under_the_workload_is_named_with_the_fix() {
        let err = PlanError::UnknownFlavor {
            pod_set: "main".into(),
            flavor: "spot".into(),
        };
        let m = for_plan(&err, &S).expect("the user's to fix");
        assert_mentions(
            &m,
            &[
                "ResourceFlavor spot (assigned to podset main) no longer exists",
                "Re-create the ResourceFlavor",
            ],
        );
        let class = crate::error::Error::Refused {
            message: m,
            api: None,
        }
        .class();
        assert!(
            matches!(class, ErrorClass::Permanent { .. }),
            "shown on the entry at once, quota kept only for the hold: {class:?}"
        );
    }

    #[test]
    fn a_long_config_value_is_the_operators_to_fix() {
        let m = too_long("k", 256, ParameterSource::Config);
        assert_mentions(&m, &["ProvisioningRequestConfig capacity", "operator"]);
    }

    #[test]
    fn too_many_parameters_says_how_many_annotations_to_remove() {
        let err = PlanError::TooManyParameters {
            count: 103,
            from_annotations: 5,
        };
        let m = for_plan(&err, &S).expect("permanent");
        assert_mentions(
            &m,
            &[
                "103 parameters, 5 of them added by",
                "Remove at least 3",
                "kubectl annotate workload -n team-a job-train-5f2a1",
            ],
        );
    }

    #[test]
    fn other_plan_errors_are_not_the_users() {
        assert_eq!(for_plan(&PlanError::NoQuotaReservation, &S), None);
        let unassigned = PlanError::MissingAssignment {
            pod_set: "main".into(),
        };
        assert_eq!(for_plan(&unassigned, &S), None);
    }

    #[test]
    fn a_refused_parameter_from_an_annotation_names_it_without_the_value() {
        let secret = "hunter2-".repeat(40);
        let status = invalid(
            &format!(
                "ProvisioningRequest.autoscaling.x-k8s.io \"wl-prov-1\" is invalid: \
                 spec.parameters.token: Invalid value: \"{secret}\": too long"
            ),
            &[(
                "spec.parameters.token",
                &format!("Invalid value: \"{secret}\": too long"),
            )],
        );
        let keys = vec!["token".to_string()];
        let m =
            for_api(Kind::ProvisioningRequest, "wl-prov-1", &status, &keys, &S).expect("permanent");
        assert!(!m.contains("hunter2"), "the value leaked: {m}");
        assert_mentions(
            &m,
            &[
                "refused to create ProvisioningRequest team-a/wl-prov-1 (Invalid, 422)",
                "spec.parameters.token: Invalid value: <320 characters>: too long",
                "annotation provreq.kueue.x-k8s.io/token on this Workload",
                "kubectl annotate workload -n team-a job-train-5f2a1 provreq.kueue.x-k8s.io/token=",
            ],
        );
    }

    #[test]
    fn the_servers_note_on_skipped_rules_is_left_out() {
        // What kube-apiserver v1.36 answers for a 256-character parameter.
        let status = invalid(
            "ProvisioningRequest.autoscaling.x-k8s.io \"r\" is invalid: [...]",
            &[
                (
                    "spec.parameters.ValidUntilSeconds",
                    "Too long: may not be more than 255 bytes",
                ),
                (
                    "<nil>",
                    "Invalid value: null: some validation rules were not checked because the \
                     object was invalid; correct the existing errors to complete validation",
                ),
            ],
        );
        let m = for_api(Kind::ProvisioningRequest, "r", &status, &[], &S).expect("permanent");
        assert!(
            m.contains(
                "(Invalid, 422): spec.parameters.ValidUntilSeconds: Too long: may not be more than \
                 255 bytes. spec.parameters come from ProvisioningRequestConfig capacity"
            ),
            "{m}"
        );
        assert!(!m.contains("<nil>"), "{m}");
    }

    #[test]
    fn a_refusal_without_causes_keeps_the_servers_message_redacted_and_bounded() {
        let status = invalid(&format!("bad \"{}\" value", "x".repeat(5000)), &[]);
        let m = for_api(Kind::PodTemplate, "ppt-a-main", &status, &[], &S).expect("permanent");
        assert!(m.contains("bad <5000 characters> value"), "{m}");
        assert!(m.contains("ResourceFlavor"), "{m}");
        let many: Vec<(String, String)> = (0..50)
            .map(|i| (format!("spec.template.spec.f{i}"), "y".repeat(100)))
            .collect();
        let many: Vec<(&str, &str)> = many.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        let m = for_api(
            Kind::PodTemplate,
            "ppt-a-main",
            &invalid("x", &many),
            &[],
            &S,
        )
        .expect("permanent");
        assert!(m.chars().count() < 700, "{}", m.chars().count());
    }

    #[test]
    fn outages_and_conflicts_are_not_refusals() {
        for (code, reason) in [
            (500, "InternalError"),
            (503, "ServiceUnavailable"),
            (409, "AlreadyExists"),
            (403, "Forbidden"),
            (429, "TooManyRequests"),
        ] {
            let status = kube::core::Status::failure("no", reason).with_code(code);
            assert_eq!(
                for_api(Kind::ProvisioningRequest, "r", &status, &[], &S),
                None,
                "{code}"
            );
        }
    }
}

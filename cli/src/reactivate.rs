//! `kueue-ac reactivate`: queue again a Workload that Kueue deactivated.
//!
//! Kueue (v0.15 to v0.19, `pkg/controller/core/workload_controller.go`) requeues a Workload set
//! back to `spec.active: true` only when its `Requeued` condition says `False` with reason
//! `Deactivated`, which a user's deactivation leaves. One Kueue deactivated itself (a check's
//! `Rejected`, a requeuing limit, a maximum execution time) says `DeactivatedDueTo<cause>`
//! instead, and stays evicted and unqueued for good after `spec.active: true`. This command
//! gives it the reason Kueue's own reactivation expects, then sets `spec.active: true`; Kueue
//! does the rest (`Requeued=True`, reason `Reactivated`, and the queue). It also removes the
//! checks' attempt records (`attempts.kueue-admission-checks.dev/*`) unless told to keep them,
//! so a check rejected past its retry limit gets its retries back.
//!
//! [`plan`] is pure (what to change, or why not); [`apply`] sends it: a merge patch of the
//! status, then one of the metadata and spec, each conditioned on the `resourceVersion` read.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use kueue_admission_sdk::api::{Workload, workload_condition as cond};
use kueue_admission_sdk::attempts::ANNOTATION_PREFIX;
use serde::Serialize;
use serde_json::json;

use crate::Error;

/// The `Requeued` reason with which Kueue requeues a reactivated Workload.
pub const DEACTIVATED: &str = "Deactivated";

/// What reactivating one Workload changes.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// The Workload's conditions with `Requeued` given the reason `Deactivated`; `None` when
    /// it has it already (a user's deactivation).
    pub conditions: Option<Vec<Condition>>,
    /// The reason `Requeued` had.
    pub requeued_reason: Option<String>,
    /// `spec.active` is set to true.
    pub activate: bool,
    /// Attempt-record annotations removed.
    pub removed_attempts: Vec<String>,
}

/// What to change to queue `wl` again, or why it cannot be (finished, still being evicted,
/// already queued). `keep_attempts` keeps the checks' attempt records.
pub fn plan(wl: &Workload, keep_attempts: bool) -> Result<Plan, String> {
    let name = wl.name_any();
    if wl.condition_is_true(cond::FINISHED) {
        return Err(format!(
            "Workload {name} has finished: nothing to reactivate"
        ));
    }
    if wl.condition_is_true(cond::QUOTA_RESERVED) || wl.condition_is_true(cond::DEACTIVATION_TARGET)
    {
        return Err(format!(
            "Workload {name} holds quota or is being deactivated: Kueue has not finished \
             evicting it; try again once QuotaReserved is False"
        ));
    }
    let requeued = wl.condition(cond::REQUEUED);
    let stuck_reason = requeued
        .filter(|c| c.status == "False" && c.reason != DEACTIVATED)
        .filter(|c| c.reason.starts_with(DEACTIVATED))
        .map(|c| c.reason.clone());
    if wl.is_active() && stuck_reason.is_none() {
        return Err(format!(
            "Workload {name} is active and Kueue does not hold it back for a deactivation: \
             nothing to reactivate (kueue-ac explain says what it waits for)"
        ));
    }
    let conditions = stuck_reason.as_ref().map(|_| {
        wl.status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|mut c| {
                if c.type_ == cond::REQUEUED {
                    c.message = format!(
                        "Reactivated with kueue-ac (Kueue deactivated it: {}): {}",
                        c.reason, c.message
                    );
                    c.reason = DEACTIVATED.into();
                }
                c
            })
            .collect()
    });
    let removed_attempts = if keep_attempts {
        Vec::new()
    } else {
        let prefix = format!("{ANNOTATION_PREFIX}/");
        wl.annotations()
            .keys()
            .filter(|k| k.starts_with(&prefix))
            .cloned()
            .collect()
    };
    Ok(Plan {
        conditions,
        requeued_reason: stuck_reason,
        activate: !wl.is_active(),
        removed_attempts,
    })
}

/// What was done, for the terminal.
pub fn describe(namespace: &str, name: &str, plan: &Plan) -> String {
    let mut lines = vec![format!("Workload {namespace}/{name}:")];
    if let Some(reason) = &plan.requeued_reason {
        lines.push(format!(
            "  Requeued reason {reason} -> {DEACTIVATED}, so that Kueue requeues it"
        ));
    }
    if plan.activate {
        lines.push("  spec.active: true".into());
    }
    if plan.removed_attempts.is_empty() {
        lines.push("  attempt records kept".into());
    } else {
        lines.push(format!(
            "  attempt records removed (the checks start again from Kueue's retryCount): {}",
            plan.removed_attempts.join(", ")
        ));
    }
    lines.push("Kueue queues it again; `kueue-ac explain` follows it.".into());
    let mut text = lines.join("\n");
    text.push('\n');
    text
}

/// Sends `plan` for `wl`: the status first (so Kueue's reconcile of the activation finds the
/// reason it requeues on), then the annotations and `spec.active`, each conditioned on the
/// `resourceVersion` the previous step left. A 409 means the Workload changed meanwhile: run
/// the command again.
pub async fn apply(client: &Client, wl: &Workload, plan: &Plan) -> Result<(), Error> {
    let namespace = wl.namespace().unwrap_or_default();
    let api: Api<Workload> = Api::namespaced(client.clone(), &namespace);
    let name = wl.name_any();
    let mut version = wl.resource_version();
    let params = PatchParams::default();
    if let Some(conditions) = &plan.conditions {
        let body = json!({
            "metadata": {"resourceVersion": version},
            "status": {"conditions": conditions},
        });
        let updated = api
            .patch_status(&name, &params, &Patch::Merge(&body))
            .await?;
        version = updated.resource_version();
    }
    let annotations: serde_json::Map<String, serde_json::Value> = plan
        .removed_attempts
        .iter()
        .map(|k| (k.clone(), serde_json::Value::Null))
        .collect();
    let mut body = json!({"metadata": {"resourceVersion": version}});
    if !annotations.is_empty() {
        body["metadata"]["annotations"] = annotations.into();
    }
    if plan.activate {
        body["spec"] = json!({"active": true});
    }
    if !annotations_or_spec(&body) {
        return Ok(());
    }
    api.patch(&name, &params, &Patch::Merge(&body)).await?;
    Ok(())
}

fn annotations_or_spec(body: &serde_json::Value) -> bool {
    body.get("spec").is_some() || body["metadata"].get("annotations").is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kueue_admission_sdk::testing::WorkloadBuilder;

    fn condition(type_: &str, status: &str, reason: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: "m".into(),
            last_transition_time: Time("2026-01-01T00:00:00Z".parse().expect("time")),
            observed_generation: None,
        }
    }

    /// A Workload Kueue deactivated after a check's Rejected: evicted, quota released,
    /// `Requeued=False` with the reason of the eviction, an attempt record on it.
    fn rejected() -> WorkloadBuilder {
        WorkloadBuilder::new("ns", "w")
            .annotation(
                "attempts.kueue-admission-checks.dev/c",
                "retries=3,evictions=3",
            )
            .annotation("team", "a")
            .with(|wl| {
                wl.spec.active = Some(false);
                wl.status.get_or_insert_with(Default::default).conditions = vec![
                    condition(cond::QUOTA_RESERVED, "False", "Pending"),
                    condition(cond::EVICTED, "True", "DeactivatedDueToAdmissionCheck"),
                    condition(cond::REQUEUED, "False", "DeactivatedDueToAdmissionCheck"),
                ];
            })
    }

    #[test]
    fn a_workload_kueue_deactivated_gets_the_reason_kueue_requeues_on() {
        let p = plan(&rejected().build(), false).expect("a plan");
        assert!(p.activate);
        assert_eq!(
            p.requeued_reason.as_deref(),
            Some("DeactivatedDueToAdmissionCheck")
        );
        let conditions = p.conditions.clone().expect("conditions");
        let requeued = conditions
            .iter()
            .find(|c| c.type_ == cond::REQUEUED)
            .expect("Requeued");
        assert_eq!(
            (requeued.status.as_str(), requeued.reason.as_str()),
            ("False", DEACTIVATED)
        );
        assert!(requeued.message.contains("DeactivatedDueToAdmissionCheck"));
        // Every other condition is sent as it was (a merge patch replaces the list).
        assert_eq!(conditions.len(), 3);
        assert!(
            conditions
                .iter()
                .any(|c| c.reason == "DeactivatedDueToAdmissionCheck")
        );
        assert_eq!(
            p.removed_attempts,
            ["attempts.kueue-admission-checks.dev/c"]
        );
        let kept = plan(&rejected().build(), true).expect("a plan");
        assert!(kept.removed_attempts.is_empty());
        let text = describe("ns", "w", &p);
        assert!(
            text.contains("DeactivatedDueToAdmissionCheck -> Deactivated"),
            "{text}"
        );
    }

    #[test]
    fn one_already_set_active_by_hand_is_still_queued() {
        let stuck = rejected().with(|wl| wl.spec.active = Some(true)).build();
        let p = plan(&stuck, true).expect("a plan");
        assert!(!p.activate);
        assert!(p.conditions.is_some());
    }

    #[test]
    fn a_users_deactivation_needs_only_the_activation() {
        let user = WorkloadBuilder::new("ns", "w")
            .with(|wl| {
                wl.spec.active = Some(false);
                wl.status.get_or_insert_with(Default::default).conditions =
                    vec![condition(cond::REQUEUED, "False", DEACTIVATED)];
            })
            .build();
        let p = plan(&user, false).expect("a plan");
        assert_eq!((p.activate, p.conditions), (true, None));
    }

    #[test]
    fn nothing_to_do_or_not_yet_is_refused_with_the_reason() {
        let queued = WorkloadBuilder::new("ns", "w").build();
        assert!(
            plan(&queued, false)
                .expect_err("active")
                .contains("nothing to reactivate")
        );
        let evicting = rejected()
            .with(|wl| {
                if let Some(s) = wl.status.as_mut() {
                    s.conditions[0].status = "True".into();
                }
            })
            .build();
        assert!(
            plan(&evicting, false)
                .expect_err("busy")
                .contains("try again")
        );
        let finished = rejected()
            .with(|wl| {
                if let Some(s) = wl.status.as_mut() {
                    s.conditions
                        .push(condition(cond::FINISHED, "True", "Succeeded"));
                }
            })
            .build();
        assert!(
            plan(&finished, false)
                .expect_err("finished")
                .contains("finished")
        );
    }
}

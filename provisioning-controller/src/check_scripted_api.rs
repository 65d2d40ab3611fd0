//! The creation of an attempt's objects against a scripted API server: each answer the API
//! server can give (a name already taken, by us or by someone else; forbidden; invalid; an
//! outage; a dropped connection) is set up exactly, and what was sent is asserted.

use std::collections::BTreeMap;

use kube::ResourceExt;
use kueue_admission_sdk::api::{CheckState, ProvisioningRequestConfigSpec, ResourceFlavorSpec};
use kueue_admission_sdk::testing::{ScriptedApi, WorkloadBuilder};

use super::{ProvisioningCheck, Settings};
use crate::cleanup::{INSTANCE_LABEL, MANAGED_BY};
use crate::error::Error;
use crate::identity::Identity;
use crate::plan::{self, Plan, PlanInput, RequestPlan};

const CHECK: &str = "prov";

struct Setup {
    check: ProvisioningCheck,
    wl: kueue_admission_sdk::api::Workload,
    plan: RequestPlan,
    api: ScriptedApi,
}

fn setup() -> Setup {
    let check = ProvisioningCheck::new(Settings {
        controller_name: "example.com/provisioning".into(),
        default_timeout: None,
    });
    let wl = WorkloadBuilder::new("ns", "wl")
        .uid("u-1")
        .pod_set("main", 2, "1")
        .check(CHECK, CheckState::Pending)
        .quota_reserved("cq", "flavor")
        .build();
    let config = ProvisioningRequestConfigSpec {
        provisioning_class_name: "check-capacity.autoscaling.x-k8s.io".into(),
        ..Default::default()
    };
    let flavors = BTreeMap::from([("flavor".to_string(), ResourceFlavorSpec::default())]);
    let planned = plan::plan(&PlanInput {
        workload: &wl,
        check: CHECK,
        attempt: 1,
        config: &config,
        flavors: &flavors,
    });
    let Ok(Plan::Request(plan)) = planned else {
        panic!("a request is needed: {planned:?}");
    };
    Setup {
        check,
        wl,
        plan,
        api: ScriptedApi::new(),
    }
}

impl Setup {
    async fn create(&self) -> Result<kueue_admission_sdk::api::ProvisioningRequest, Error> {
        let me = Identity {
            instance: self.check.instance(),
            workload: "wl",
            workload_uid: "u-1",
            check: CHECK,
        };
        self.check
            .create(&self.api.client(), &self.wl, &me, 1, &self.plan, "cfg")
            .await
    }

    /// The template as the API server returns it once created.
    fn template(&self) -> serde_json::Value {
        let mut t =
            plan::pod_template_objects(&self.plan, &self.wl, CHECK, 1, MANAGED_BY).remove(0);
        t.labels_mut()
            .insert(INSTANCE_LABEL.into(), self.check.instance().into());
        t.metadata.uid = Some("t-1".into());
        serde_json::to_value(t).unwrap_or_default()
    }

    /// The request as this instance makes it.
    fn ours(&self) -> serde_json::Value {
        let mut r = plan::request_object(&self.plan, &self.wl, CHECK, 1, MANAGED_BY);
        r.labels_mut()
            .insert(INSTANCE_LABEL.into(), self.check.instance().into());
        serde_json::to_value(r).unwrap_or_default()
    }

    /// Writes (anything but GET), as `METHOD resource`.
    fn writes(&self) -> Vec<String> {
        self.api
            .requests()
            .iter()
            .filter(|r| r.method != "GET")
            .map(|r| format!("{} {}", r.method, resource(&r.path)))
            .collect()
    }
}

/// `podtemplates` or `provisioningrequests`, from a path.
fn resource(path: &str) -> &str {
    let mut parts = path.rsplit('/');
    let last = parts.next().unwrap_or_default();
    if last == "podtemplates" || last == "provisioningrequests" {
        last
    } else {
        parts.next().unwrap_or_default()
    }
}

#[tokio::test]
async fn a_request_name_taken_by_someone_else_is_never_adopted_or_touched() {
    let s = setup();
    s.api.answer(201, s.template());
    s.api
        .fail(409, "AlreadyExists", "provisioningrequests already exists");
    // What holds the name: Kueue's built-in check's request (no instance label of ours).
    let mut foreign = s.ours();
    foreign["metadata"]["labels"] = serde_json::json!({"kueue.x-k8s.io/managed": "true"});
    s.api.answer(200, foreign);
    let err = s.create().await.expect_err("the name is taken");
    assert!(matches!(err, Error::NameTaken(_)), "{err}");
    assert!(
        err.to_string().contains("another name is tried next"),
        "{err}"
    );
    // Nothing patched or deleted: only our template was created.
    assert_eq!(
        s.writes(),
        ["POST podtemplates", "POST provisioningrequests"]
    );
}

#[tokio::test]
async fn our_own_request_found_after_a_restart_is_adopted_not_created_twice() {
    let s = setup();
    s.api.answer(201, s.template());
    s.api
        .fail(409, "AlreadyExists", "provisioningrequests already exists");
    s.api.answer(200, s.ours());
    let request = s.create().await.expect("ours is adopted");
    assert_eq!(request.name_any(), s.plan.name);
    assert_eq!(
        s.writes(),
        ["POST podtemplates", "POST provisioningrequests"]
    );
    assert_eq!(s.api.unused(), 0);
}

#[tokio::test]
async fn a_forbidden_or_failing_template_create_stops_before_the_request() {
    for (code, reason) in [
        (403, "Forbidden"),
        (500, "InternalError"),
        (429, "TooManyRequests"),
    ] {
        let s = setup();
        s.api.fail(code, reason, "podtemplates is not possible now");
        let err = s.create().await.expect_err("refused");
        assert!(matches!(err, Error::Api(_)), "{code}: {err}");
        assert!(
            !matches!(
                err.class(),
                kueue_admission_sdk::check::ErrorClass::Permanent { .. }
            ),
            "{code}: retried"
        );
        assert_eq!(s.writes(), ["POST podtemplates"], "{code}");
    }
}

#[tokio::test]
async fn a_dropped_connection_on_the_request_is_retried_later() {
    let s = setup();
    s.api.answer(201, s.template());
    s.api.drop_connection();
    let err = s.create().await.expect_err("dropped");
    assert_eq!(err.label(), "api");
    assert!(!matches!(
        err.class(),
        kueue_admission_sdk::check::ErrorClass::Permanent { .. }
    ));
}

#[tokio::test]
async fn a_request_the_api_server_finds_invalid_is_refused_for_good_with_a_message() {
    let s = setup();
    s.api.answer(201, s.template());
    s.api.answer(
        422,
        serde_json::json!({
            "apiVersion": "v1", "kind": "Status", "status": "Failure", "code": 422,
            "reason": "Invalid",
            "message": "ProvisioningRequest.autoscaling.x-k8s.io \"wl-prov-1\" is invalid: spec.parameters.x: Too long: may not be more than 255 bytes",
            "details": {"causes": [{"reason": "FieldValueTooLong", "field": "spec.parameters.x",
                "message": "Too long: may not be more than 255 bytes"}]},
        }),
    );
    let err = s.create().await.expect_err("invalid");
    let Error::Refused { message, .. } = &err else {
        panic!("not a refusal: {err}");
    };
    assert!(message.contains("spec.parameters.x"), "{message}");
    assert!(matches!(
        err.class(),
        kueue_admission_sdk::check::ErrorClass::Permanent { .. }
    ));
    assert_eq!(
        s.writes(),
        ["POST podtemplates", "POST provisioningrequests"]
    );
}

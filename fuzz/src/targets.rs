//! What is fuzzed, and the properties each target asserts (a panic is a broken property).
//!
//! Structured targets read their input as a JSON case; an input that is not a valid case is
//! uninteresting and returns at once (the mutator keeps most mutants valid). Name properties
//! are only asserted where the inputs are valid names themselves, as the API server guarantees
//! for object names.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kueue_admission_sdk::api::{
    AdmissionCheckState, CheckState, PodSetUpdate, ProvisioningRequest,
    ProvisioningRequestConfigSpec, ProvisioningRequestPodSetUpdatesNodeSelector,
    ResourceFlavorSpec, Workload, workload_condition as cond,
};
use kueue_admission_sdk::retry::{Backoff, ExponentialBackoff, MAX_DELAY};
use kueue_admission_sdk::testing::{PlanSettings, Planned, PlannedWrite, plan_once};
use kueue_admission_sdk::{CheckParameters, Decision, RetryPolicy};
use kueue_provisioning_controller::config::ProvisioningParameters;
use kueue_provisioning_controller::{names, outcome as prov_outcome, plan as prov_plan};
use serde::Deserialize;
use serde::de::DeserializeOwned;

/// A fuzz target.
#[derive(Clone, Copy, Debug)]
pub struct Target {
    /// Its name, also its corpus folder.
    pub name: &'static str,
    /// The functions it feeds.
    pub covers: &'static str,
    /// The properties it asserts.
    pub asserts: &'static str,
    /// Runs one input; panics when a property breaks. `false` when the input is not a case the
    /// target can read (not JSON of the case's shape, say), so nothing was checked.
    pub run: fn(&[u8]) -> bool,
}

/// Every target, in the order of the docs' table.
pub fn all() -> Vec<Target> {
    vec![
        Target {
            name: "sdk_decide",
            covers: "sdk testing::plan_once (decide::plan, decide::eligibility, decide::status_apply_patch)",
            asserts: "deterministic; a write (or no change) only when the Workload may be answered (holds \
                      quota, active, not evicted, finished or deleted, entry Pending or Ready under \
                      revalidation), a refusal as not needed or answered only when it may not; the entry is \
                      the check's, never carries retryCount, message within Kueue's limit, \
                      requeueAfterSeconds within the ceiling, podSetUpdates within the limit; gave_up only \
                      for an exhausted Retry; the apply body carries the read's resourceVersion",
            run: |input| on_case(input, sdk_decide),
        },
        Target {
            name: "sdk_retry",
            covers: "sdk RetryPolicy::{validate, delay, longest_delay, exhausted}, retry::requeue_after_seconds",
            asserts: "a valid policy's delays fit Kueue's int32 seconds, grow with the attempt without jitter, \
                      never exceed longest_delay before the limit; exhausted exactly past the limit",
            run: |input| on_case(input, sdk_retry),
        },
        Target {
            name: "sdk_attempt_record",
            covers: "sdk attempts::AttemptRecord::{parse, attempt_at}, attempts::annotation_key",
            asserts: "what parses prints back to itself; an attempt is at least 1; annotation keys are valid \
                      qualified names",
            run: |input| on_case(input, sdk_attempt_record),
        },
        Target {
            name: "sdk_text",
            covers: "sdk check::{truncate_chars, redact_quoted, ErrorClass::of_status}, runtime::lease_name_for, \
                     api::validation::{qualified_name, label_value}",
            asserts: "cuts stay within the limit and keep a prefix; a quoted secret (double or single quotes, \
                      in a webhook's 403 too) never reaches a message; a webhook's denial is permanent; \
                      lease names are DNS subdomains and stable; what passes for a label name or value \
                      is what Kubernetes takes",
            run: sdk_text,
        },
        Target {
            name: "prov_config",
            covers: "provisioning ProvisioningParameters::{validate, retry_policy, timeout_override, timeout}",
            asserts: "a config that validates gives a retry policy the SDK accepts (the check stays Active) \
                      and a readable timeout",
            run: |input| on_case(input, prov_config),
        },
        Target {
            name: "prov_plan",
            covers: "provisioning plan::{plan, request_object, pod_template_objects, annotation_parameters}",
            asserts: "deterministic; names are DNS subdomains within 253 characters that read back the attempt; \
                      every assigned podset is in exactly one planned podset; parameters within the CRD's \
                      limits; the objects built carry the planned names",
            run: |input| on_case(input, prov_plan),
        },
        Target {
            name: "prov_names",
            covers: "provisioning names::{request_name, alternative_request_name, attempt_of, request_attempt, \
                     pod_template_name, checks_may_share_names}",
            asserts: "valid names within 253 characters; the attempt reads back; the two names differ; \
                      deterministic; sharing is symmetric",
            run: |input| on_case(input, prov_names),
        },
        Target {
            name: "prov_outcome",
            covers: "provisioning outcome::{outcome, decision, pod_set_updates}",
            asserts: "deterministic; a timeout is never later than configured; revoked capacity rejects; \
                      provisioned is Ready with one update per podset naming the request",
            run: |input| on_case(input, prov_outcome_target),
        },
        Target {
            name: "prov_refusal",
            covers: "provisioning refusal::for_api (an API server's refusal of a created object)",
            asserts: "a value the API server quotes back (a parameter can be a secret) never reaches the \
                      message; transient codes are no refusal; the message stays bounded",
            run: |input| on_case(input, prov_refusal),
        },
        Target {
            name: "budget_quantity",
            covers: "budget-check quantity::parse_quantity",
            asserts: "a quantity read is finite and non-negative",
            run: |input| on_text(input, budget_quantity),
        },
        Target {
            name: "budget_prices",
            covers: "budget-check cost::Prices (the --prices flag)",
            asserts: "what parses prints back to itself; every priced resource has a name",
            run: |input| on_text(input, budget_prices),
        },
        Target {
            name: "budget_ledger",
            covers: "budget-check ledger::BudgetLedger::{from_config_map_data, to_config_map_data, spent}",
            asserts: "what reads writes back to the same data; one key per day",
            run: |input| on_case(input, budget_ledger),
        },
        Target {
            name: "budget_estimate",
            covers: "budget-check cost::estimate",
            asserts: "no panic on any Workload; an estimate has a positive runtime",
            run: |input| on_case(input, budget_estimate),
        },
        Target {
            name: "license_request",
            covers: "license-check request::{parse_licenses, format_licenses, requested_licenses}",
            asserts: "what parses prints back to itself; counts are at least 1; a Workload's request never panics",
            run: |input| on_case(input, license_request),
        },
    ]
}

/// Runs `target` on `input` read as its JSON case; `false` (nothing checked) when it is not one.
fn on_case<T: DeserializeOwned>(input: &[u8], target: fn(T) -> bool) -> bool {
    serde_json::from_slice(input).is_ok_and(target)
}

/// Runs `target` on `input` read as UTF-8 text; `false` (nothing checked) when it is not.
fn on_text(input: &[u8], target: fn(&str) -> bool) -> bool {
    std::str::from_utf8(input).is_ok_and(target)
}

/// A DNS-1123 subdomain of at most 253 characters (object names).
pub fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// A DNS-1123 label of at most 63 characters (podset names).
fn is_dns_label(name: &str) -> bool {
    name.len() <= 63 && !name.contains('.') && is_dns_subdomain(name)
}

fn has_duplicates<T: Ord>(items: impl Iterator<Item = T>) -> bool {
    let mut all: Vec<T> = items.collect();
    let n = all.len();
    all.sort();
    all.dedup();
    all.len() != n
}

fn timestamp(seconds: i64) -> Option<Timestamp> {
    Timestamp::from_second(seconds).ok()
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct PolicyCase {
    /// 0 immediate, 1 fixed, else exponential.
    kind: u8,
    base_seconds: u64,
    factor: f64,
    max_seconds: u64,
    jitter: f64,
    limit: Option<u32>,
}

impl PolicyCase {
    fn policy(&self) -> RetryPolicy {
        let backoff = match self.kind {
            0 => Backoff::Immediate,
            1 => Backoff::Fixed(Duration::from_secs(self.base_seconds)),
            _ => Backoff::Exponential(ExponentialBackoff {
                base: Duration::from_secs(self.base_seconds),
                factor: self.factor,
                max: Duration::from_secs(self.max_seconds),
                jitter: self.jitter,
            }),
        };
        RetryPolicy {
            backoff,
            retry_limit: self.limit,
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct DecideCase {
    workload: Option<Workload>,
    check: String,
    state: String,
    message: String,
    delay_seconds: Option<u64>,
    updates: Vec<PodSetUpdate>,
    policy: PolicyCase,
    max_retry_delay_seconds: u64,
    revalidate_ready: bool,
    now: i64,
    jitter_sample: f64,
}

impl DecideCase {
    fn decision(&self) -> Decision {
        let message = self.message.clone();
        match (self.state.as_str(), self.delay_seconds) {
            ("Ready", _) if self.updates.is_empty() => Decision::ready(message),
            ("Ready", _) => Decision::ready_with_updates(message, self.updates.clone()),
            ("Retry", None) => Decision::retry(message),
            ("Retry", Some(s)) => Decision::retry_after(message, Duration::from_secs(s)),
            ("Rejected", _) => Decision::rejected(message),
            (_, None) => Decision::pending(message),
            (_, Some(s)) => Decision::pending_recheck_after(message, Duration::from_secs(s)),
        }
    }
}

/// The rule the runtime answers by, restated from the Workload's own fields (the oracle for
/// `sdk_decide`): it holds quota, is active and not about to be deactivated, not evicted,
/// finished or being deleted, and the check's entry is `Pending` (or `Ready`, revalidating).
fn may_be_answered(wl: &Workload, check: &str, revalidate_ready: bool) -> bool {
    let entry_open = wl.admission_check(check).is_some_and(|e| {
        e.state == CheckState::Pending || (revalidate_ready && e.state == CheckState::Ready)
    });
    entry_open
        && wl.condition_is_true(cond::QUOTA_RESERVED)
        && wl.is_active()
        && !wl.condition_is_true(cond::DEACTIVATION_TARGET)
        && !wl.condition_is_true(cond::EVICTED)
        && !wl.condition_is_true(cond::FINISHED)
        && wl.metadata.deletion_timestamp.is_none()
}

fn sdk_decide(c: DecideCase) -> bool {
    let (Some(wl), Some(now)) = (c.workload.as_ref(), timestamp(c.now)) else {
        return false;
    };
    let policy = c.policy.policy();
    // The runtime refuses an invalid policy (the check goes Inactive) before anything is planned.
    if policy.validate().is_err() || !(0.0..1.0).contains(&c.jitter_sample) {
        return false;
    }
    let decision = c.decision();
    let asked_retry = decision.state() == CheckState::Retry;
    let settings = PlanSettings {
        policy,
        max_retry_delay: Duration::from_secs(c.max_retry_delay_seconds),
        revalidate_ready: c.revalidate_ready,
        now: Some(now),
        jitter_sample: c.jitter_sample,
    };
    let planned = plan_once(wl, &c.check, decision.clone(), &settings);
    assert_eq!(
        planned,
        plan_once(wl, &c.check, decision, &settings),
        "not deterministic"
    );
    let answerable = may_be_answered(wl, &c.check, c.revalidate_ready);
    match &planned {
        Planned::Write(w) => {
            assert!(
                answerable,
                "a write for a Workload that may not be answered"
            );
            assert_safe_write(w, wl, &c.check, &settings, asked_retry);
        }
        Planned::Unchanged { .. } => {
            assert!(
                answerable,
                "unchanged for a Workload that may not be answered"
            );
        }
        Planned::NotNeeded(_) | Planned::AlreadyAnswered(_) => {
            assert!(!answerable, "refused a Workload that may be answered");
        }
        Planned::Invalid(_) => {}
    }
    true
}

/// What every write `sdk_decide` plans keeps to: only the check's own entry, never Kueue's
/// `retryCount`, Kueue's limits, the delay ceiling, `Rejected` for `Retry` only past the retry
/// limit, and the apply conditioned on the read's `resourceVersion`.
fn assert_safe_write(
    w: &PlannedWrite,
    wl: &Workload,
    check: &str,
    settings: &PlanSettings,
    asked_retry: bool,
) {
    assert_eq!(w.entry.name, check, "another check's entry");
    assert_eq!(w.entry.retry_count, None, "retryCount belongs to Kueue");
    assert!(w.entry.message.chars().count() <= AdmissionCheckState::MAX_MESSAGE_CHARS);
    assert!(w.entry.pod_set_updates.len() <= AdmissionCheckState::MAX_POD_SET_UPDATES);
    if let Some(s) = w.entry.requeue_after_seconds {
        let ceiling = settings.max_retry_delay.min(MAX_DELAY).as_secs();
        assert!(s >= 0, "negative requeueAfterSeconds {s}");
        assert!(
            (s as u64) <= ceiling.max(1),
            "requeueAfterSeconds {s} over the ceiling {ceiling}"
        );
    }
    if w.gave_up {
        assert!(asked_retry, "gave up on a decision that was not Retry");
        assert_eq!(w.entry.state, CheckState::Rejected);
        assert!(
            settings.policy.exhausted(w.attempt),
            "gave up before the limit"
        );
    }
    match &w.status_apply {
        Some(body) => {
            assert_eq!(
                body["metadata"]["resourceVersion"].as_str(),
                wl.metadata.resource_version.as_deref(),
                "the write is not conditioned on the read"
            );
            assert_eq!(body["status"]["admissionChecks"][0]["name"], check);
        }
        None => assert!(wl.metadata.resource_version.is_none()),
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct RetryCase {
    policy: PolicyCase,
    attempt: u32,
    jitter_sample: f64,
}

fn sdk_retry(c: RetryCase) -> bool {
    use kueue_admission_sdk::retry::requeue_after_seconds;
    let policy = c.policy.policy();
    let _ = kueue_admission_sdk::retry::describe(&policy);
    let u = c.jitter_sample;
    if policy.validate().is_err() || !(0.0..1.0).contains(&u) {
        // Still safe: every delay is clamped, whatever the policy.
        assert!(policy.delay(c.attempt, u.clamp(0.0, 0.999)) <= MAX_DELAY);
        return true;
    }
    let n = c.attempt.max(1);
    let d = policy.delay(n, u);
    assert!(d <= MAX_DELAY, "delay {d:?} over Kueue's int32 seconds");
    // Whole seconds rounded up, none for no delay: never sooner than asked.
    match requeue_after_seconds(d) {
        Some(written) => assert!(
            written > 0 && written as u64 >= d.as_secs(),
            "{d:?} → {written}"
        ),
        None => assert!(d.is_zero(), "{d:?} written as no delay"),
    }
    let _ = kueue_admission_sdk::retry::human(d);
    assert!(
        policy.delay(n.saturating_add(1), 0.0) >= policy.delay(n, 0.0),
        "delays shrink"
    );
    if policy.retry_limit.is_none_or(|limit| n <= limit) {
        assert!(
            policy.longest_delay() >= policy.delay(n, 0.0),
            "longest_delay is not the longest"
        );
    }
    assert_eq!(
        policy.exhausted(n),
        policy.retry_limit.is_some_and(|limit| n > limit)
    );
    true
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
struct AttemptCase {
    record: String,
    evictions: i32,
    check: String,
}

fn sdk_attempt_record(c: AttemptCase) -> bool {
    use kueue_admission_sdk::attempts::{AttemptRecord, annotation_key};
    if let Some(r) = AttemptRecord::parse(&c.record) {
        assert_eq!(
            AttemptRecord::parse(&r.to_string()),
            Some(r),
            "does not read back"
        );
        assert!(r.attempt_at(c.evictions) >= 1, "attempt 0");
    }
    if is_dns_subdomain(&c.check) {
        let key = annotation_key(&c.check);
        let (prefix, name) = key.split_once('/').expect("a prefixed key");
        assert!(is_dns_subdomain(prefix), "{key:?}");
        assert!(
            !name.is_empty()
                && name.len() <= 63
                && name.starts_with(|ch: char| ch.is_ascii_alphanumeric())
                && name.ends_with(|ch: char| ch.is_ascii_alphanumeric())
                && name
                    .chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '-' | '_' | '.')),
            "annotation key {key:?} of check {:?}",
            c.check
        );
        assert_eq!(key, annotation_key(&c.check));
    }
    true
}

fn sdk_text(input: &[u8]) -> bool {
    use kueue_admission_sdk::check::{ErrorClass, redact_quoted, truncate_chars};
    let s = String::from_utf8_lossy(input);
    let chars = s.chars().count();
    for max in [0, 1, 2, 5, chars.saturating_sub(1), chars] {
        let cut = truncate_chars(&s, max);
        assert!(cut.chars().count() <= max, "{max}: {cut:?}");
        let kept = cut.strip_suffix('…').unwrap_or(&cut);
        assert!(s.starts_with(kept), "not a prefix");
    }
    // A value the API server quotes back must not reach a Workload or an Event.
    const SECRET: &str = "s3cr3t-Value";
    let plain: String = s.chars().filter(|c| *c != '"').collect();
    let middle = plain.chars().count() / 2;
    let head: String = plain.chars().take(middle).collect();
    let tail: String = plain.chars().skip(middle).collect();
    let quoted = format!("{head}\"{SECRET}\"{tail}");
    let redacted = redact_quoted(&quoted, &[]);
    assert!(!redacted.contains(SECRET), "secret in {redacted:?}");
    if let ErrorClass::Permanent { message } = ErrorClass::of_status(422, "Invalid", &quoted) {
        assert!(!message.contains(SECRET), "secret in {message:?}");
    }
    // Single-quoted too, and in a webhook's 403 denial (which is permanent).
    let plain: String = plain.chars().filter(|c| *c != '\'').collect();
    let single = format!("{head} '{SECRET}' {tail}").replace('"', "");
    let redacted = redact_quoted(&single, &[]);
    assert!(!redacted.contains(SECRET), "secret in {redacted:?}");
    let denial = format!("admission webhook \"w.example.com\" denied the request: {quoted}");
    match ErrorClass::of_status(403, "Forbidden", &denial) {
        ErrorClass::Permanent { message } => {
            assert!(!message.contains(SECRET), "secret in {message:?}");
        }
        other => panic!("a webhook's denial taken for RBAC: {denial:?}: {other:?}"),
    }
    // What passes for a label name or value is what Kubernetes takes.
    use kueue_admission_sdk::api::validation::{label_value, qualified_name};
    let label_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    for text in [s.as_ref(), plain.as_str()] {
        if label_value(text).is_ok() {
            assert!(text.len() <= 63 && text.chars().all(label_char), "{text:?}");
        }
        if qualified_name(text).is_ok() {
            let name = text.rsplit('/').next().unwrap_or_default();
            assert!(
                !name.is_empty() && name.len() <= 63 && name.chars().all(label_char),
                "{text:?}"
            );
        }
    }
    let lease = kueue_admission_sdk::runtime::lease_name_for(&s);
    assert!(is_dns_subdomain(&lease), "lease name {lease:?}");
    assert_eq!(kueue_admission_sdk::runtime::lease_name_for(&lease), lease);
    true
}

fn prov_config(params: ProvisioningParameters) -> bool {
    if params.validate().is_ok() {
        let policy = params.retry_policy();
        assert!(
            policy.validate().is_ok(),
            "a valid config gives a policy the SDK refuses: {:?}",
            policy.validate()
        );
        params
            .timeout_override()
            .expect("a valid config has a readable timeout");
        // Reading the timeout in force never fails for a valid config.
        let _ = params.timeout(Some(Duration::from_secs(600)));
    }
    true
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
struct PlanCase {
    workload: Option<Workload>,
    check: String,
    attempt: u32,
    config: ProvisioningRequestConfigSpec,
    flavors: BTreeMap<String, ResourceFlavorSpec>,
}

fn prov_plan(c: PlanCase) -> bool {
    let Some(wl) = c.workload.as_ref() else {
        return false;
    };
    // Podset names are the key of a list map in Kueue's CRD: the API server refuses duplicates.
    if has_duplicates(wl.spec.pod_sets.iter().map(|p| &p.name)) {
        return false;
    }
    let _ = prov_plan::annotation_parameters(wl);
    let planned = prov_plan::plan(&prov_plan::PlanInput {
        workload: wl,
        check: &c.check,
        attempt: c.attempt,
        config: &c.config,
        flavors: &c.flavors,
    });
    let again = prov_plan::plan(&prov_plan::PlanInput {
        workload: wl,
        check: &c.check,
        attempt: c.attempt,
        config: &c.config,
        flavors: &c.flavors,
    });
    assert_eq!(planned, again, "not deterministic");
    let Ok(prov_plan::Plan::Request(r)) = planned else {
        return true;
    };
    assert!(r.parameters.len() <= prov_plan::MAX_PARAMETERS);
    for (k, v) in &r.parameters {
        assert!(
            v.chars().count() <= prov_plan::MAX_PARAMETER_LEN,
            "parameter {k:?} too long"
        );
    }
    let wl_name = wl.metadata.name.clone().unwrap_or_default();
    let names_valid = is_dns_subdomain(&wl_name)
        && is_dns_subdomain(&c.check)
        && wl.spec.pod_sets.iter().all(|p| is_dns_label(&p.name));
    if names_valid {
        assert!(is_dns_subdomain(&r.name), "request name {:?}", r.name);
        assert_eq!(
            names::request_attempt(&r.name, &wl_name, &c.check),
            Some(c.attempt),
            "{:?} does not read back attempt {}",
            r.name,
            c.attempt
        );
        for p in &r.pod_sets {
            assert!(is_dns_subdomain(&p.template_name), "{:?}", p.template_name);
        }
    }
    let mut members: Vec<&String> = r.pod_sets.iter().flat_map(|p| &p.members).collect();
    let planned_members = members.len();
    members.sort();
    members.dedup();
    assert_eq!(members.len(), planned_members, "a podset planned twice");
    assert!(r.pod_sets.iter().all(|p| !p.members.is_empty()));
    let mut templates: Vec<&String> = r.pod_sets.iter().map(|p| &p.template_name).collect();
    templates.sort();
    templates.dedup();
    assert_eq!(
        templates.len(),
        r.pod_sets.len(),
        "two podsets share a template name"
    );
    let request = prov_plan::request_object(&r, wl, &c.check, c.attempt, "fuzz", &[]);
    assert_eq!(request.metadata.name.as_deref(), Some(r.name.as_str()));
    assert_eq!(request.spec.pod_sets.len(), r.pod_sets.len());
    let objects = prov_plan::pod_template_objects(&r, wl, &c.check, c.attempt, "fuzz");
    assert_eq!(objects.len(), r.pod_sets.len());
    for (o, p) in objects.iter().zip(&r.pod_sets) {
        assert_eq!(o.metadata.name.as_deref(), Some(p.template_name.as_str()));
    }
    true
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
struct NamesCase {
    workload: String,
    uid: String,
    check: String,
    other_check: String,
    attempt: u32,
    pod_set: String,
}

fn prov_names(c: NamesCase) -> bool {
    assert_eq!(
        names::checks_may_share_names(&c.check, &c.other_check),
        names::checks_may_share_names(&c.other_check, &c.check)
    );
    if !(is_dns_subdomain(&c.workload) && is_dns_subdomain(&c.check)) {
        return true;
    }
    let [first, second] = names::request_names(&c.workload, &c.uid, &c.check, c.attempt);
    for name in [&first, &second] {
        assert!(is_dns_subdomain(name), "{name:?}");
        assert_eq!(names::attempt_of(name), Some(c.attempt), "{name:?}");
    }
    assert_ne!(first, second, "the alternative name is the same");
    assert_eq!(
        names::request_attempt(&first, &c.workload, &c.check),
        Some(c.attempt)
    );
    assert_eq!(first, names::request_name(&c.workload, &c.check, c.attempt));
    if is_dns_label(&c.pod_set) {
        let template = names::pod_template_name(&first, &c.pod_set);
        assert!(is_dns_subdomain(&template), "{template:?}");
        assert_eq!(template, names::pod_template_name(&first, &c.pod_set));
    }
    true
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct OutcomeCase {
    request: Option<ProvisioningRequest>,
    admitted: bool,
    timeout_seconds: Option<u64>,
    now: i64,
    attempt: u32,
    pod_sets: Vec<String>,
    node_selector: Vec<ProvisioningRequestPodSetUpdatesNodeSelector>,
}

fn prov_outcome_target(c: OutcomeCase) -> bool {
    use prov_outcome::Outcome;
    let (Some(r), Some(now)) = (c.request.as_ref(), timestamp(c.now)) else {
        return false;
    };
    let timeout = c.timeout_seconds.map(Duration::from_secs);
    let o = prov_outcome::outcome(r, c.admitted, timeout, now);
    assert_eq!(o, prov_outcome::outcome(r, c.admitted, timeout, now));
    let name = r.metadata.name.clone().unwrap_or_default();
    let updates = || prov_outcome::pod_set_updates(r, &c.pod_sets, &c.node_selector);
    let d = prov_outcome::decision(&o, &name, c.attempt, updates);
    match &o {
        Outcome::Waiting {
            timeout_in: Some(left),
            ..
        } => {
            let limit = timeout.expect("a timeout left only with a timeout");
            assert!(*left <= limit, "{left:?} left of {limit:?}");
        }
        Outcome::TimedOut(limit) => assert_eq!(Some(*limit), timeout),
        Outcome::Revoked(_) => assert_eq!(d.state(), CheckState::Rejected),
        Outcome::Provisioned => {
            assert_eq!(d.state(), CheckState::Ready);
            let updates = prov_outcome::pod_set_updates(r, &c.pod_sets, &c.node_selector);
            assert_eq!(updates.len(), c.pod_sets.len());
            assert!(
                updates
                    .iter()
                    .all(|u| u.annotations.values().any(|v| *v == name))
            );
        }
        _ => {}
    }
    true
}

fn budget_quantity(s: &str) -> bool {
    if let Ok(v) = budget_check::quantity::parse_quantity(s) {
        assert!(v.is_finite() && v >= 0.0, "{s:?} read as {v}");
    }
    true
}

fn budget_prices(s: &str) -> bool {
    use budget_check::cost::Prices;
    if let Ok(p) = s.parse::<Prices>() {
        assert!(p.0.keys().all(|k| !k.is_empty()), "an unnamed resource");
        let printed = p.to_string();
        let again: Prices = printed
            .parse()
            .unwrap_or_else(|e| panic!("{printed:?} does not parse back: {e}"));
        assert_eq!(again.0, p.0, "{s:?} → {printed:?}");
    }
    true
}

fn budget_ledger(data: BTreeMap<String, String>) -> bool {
    use budget_check::ledger::BudgetLedger;
    let Ok(ledger) = BudgetLedger::from_config_map_data(&data) else {
        return true;
    };
    let written = ledger.to_config_map_data();
    let again = BudgetLedger::from_config_map_data(&written)
        .unwrap_or_else(|e| panic!("what the ledger wrote does not read back: {e:?}"));
    assert_eq!(again.to_config_map_data(), written, "not a round trip");
    assert_eq!(
        again.settled_days().len(),
        ledger.settled_days().len(),
        "days lost"
    );
    true
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct EstimateCase {
    workload: Option<Workload>,
    prices: String,
    default_runtime_seconds: u64,
}

fn budget_estimate(c: EstimateCase) -> bool {
    let (Some(wl), Ok(prices)) = (c.workload.as_ref(), c.prices.parse()) else {
        return false;
    };
    let runtime = Duration::from_secs(c.default_runtime_seconds.max(1));
    if let Ok(e) = budget_check::cost::estimate(wl, &prices, runtime) {
        assert!(!e.runtime.is_zero(), "an estimate over no time");
        assert!(e.resources.values().all(|v| v.is_finite() && *v >= 0.0));
    }
    true
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
struct LicenseCase {
    value: String,
    workload: Option<Workload>,
}

fn license_request(c: LicenseCase) -> bool {
    use license_check::request::{format_licenses, parse_licenses, requested_licenses};
    if let Ok(l) = parse_licenses(&c.value) {
        assert!(l.values().all(|n| *n >= 1));
        let printed = format_licenses(&l);
        assert_eq!(parse_licenses(&printed).as_ref(), Ok(&l), "{printed:?}");
    }
    if let Some(wl) = &c.workload
        && let Ok(l) = requested_licenses(wl)
    {
        assert!(l.values().all(|n| *n >= 1), "{l:?}");
    }
    true
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
struct RefusalCase {
    status: Option<kube_core_status::Status>,
    object: String,
    annotation_keys: Vec<String>,
    workload: String,
}

/// The `Status` type, under a short name.
mod kube_core_status {
    pub use kube::core::Status;
}

fn prov_refusal(c: RefusalCase) -> bool {
    use kueue_provisioning_controller::refusal::{Kind, Subject, for_api};
    let Some(mut status) = c.status else {
        return false;
    };
    // A secret the API server quotes back, in the message and in every cause.
    const SECRET: &str = "s3cr3t-Value";
    // Names the message may show on purpose: the secret must come only from the server's text.
    if [&c.object, &c.workload]
        .into_iter()
        .chain(&c.annotation_keys)
        .any(|n| n.contains(SECRET))
    {
        return false;
    }
    let quoted = format!("\"{SECRET}\"");
    status.message = format!("{} {quoted}", status.message.replace('"', ""));
    if let Some(details) = status.details.as_mut() {
        for cause in &mut details.causes {
            cause.message = format!("{} {quoted}", cause.message.replace('"', ""));
        }
    }
    let subject = Subject {
        namespace: "ns",
        workload: &c.workload,
        config: "cfg",
    };
    for kind in [Kind::ProvisioningRequest, Kind::PodTemplate] {
        let message = for_api(kind, &c.object, &status, &c.annotation_keys, &subject);
        // Only a refusal of what was sent has a message here; RBAC's is the SDK's to show.
        let transient = !matches!(
            kueue_admission_sdk::ErrorClass::of_status(
                status.code,
                &status.reason,
                &status.message
            ),
            kueue_admission_sdk::ErrorClass::Permanent { .. }
        );
        assert_eq!(
            message.is_none(),
            transient,
            "code {}: {message:?}",
            status.code
        );
        if let Some(m) = message {
            assert!(
                !m.contains(SECRET),
                "the quoted value reached the message: {m}"
            );
            assert!(
                m.chars().count() <= 8192,
                "{} characters",
                m.chars().count()
            );
        }
    }
    true
}

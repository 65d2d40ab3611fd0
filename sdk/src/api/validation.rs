//! Pure: the rules Kueue's Workload webhook, its CRD and the API server apply to an admission
//! check's `podSetUpdates`, so that a check's answer is refused here, with the reason, instead
//! of by the API server after the fact.
//!
//! Read from Kueue v0.19.2 (`pkg/webhooks/workload_webhook.go`, `validatePodSetUpdates`, and
//! the markers of `PodSetUpdate` in `apis/kueue/v1beta2/workload_types.go`) and from
//! Kubernetes' `IsQualifiedName`, `IsValidLabelValue`, `ValidateAnnotations` and the core
//! toleration rules a pod is created under:
//!
//! - at most [`AdmissionCheckState::MAX_POD_SET_UPDATES`] updates, each for a podset of the
//!   Workload, one per podset;
//! - label and node selector keys are qualified names (an optional DNS subdomain prefix of at
//!   most 253 characters and `/`, then a name of at most 63: letters, digits, `-`, `_`, `.`,
//!   beginning and ending with a letter or digit); their values are label values (at most 63,
//!   the same characters, possibly empty);
//! - annotation keys are qualified names (compared in lower case), all annotations together at
//!   most 256 KiB;
//! - at most 8 tolerations; a toleration key is a qualified name; without a key the operator is
//!   `Exists`; the operator is `Equal` or `Exists` (or absent); `Exists` takes no value; an
//!   `Equal` value is a label value; the effect is `NoSchedule`, `PreferNoSchedule` or
//!   `NoExecute` (or absent); `tolerationSeconds` only with `NoExecute`;
//! - additive only: a key the podset's pod template already has with another value makes the
//!   job fail to start (Kueue merges the updates into the template and refuses a conflict);
//! - and so, across checks: Kueue merges the updates of every `Ready` entry into the same pod
//!   template when it starts the job (`getPodSetsInfoFromStatus` in
//!   `pkg/controller/jobframework/reconciler.go`), and an annotation, label or node selector key
//!   two checks give different values makes the start fail for good: the Workload, already
//!   admitted, is finished with reason `FailedToStart` ([`conflicts_with_ready`]). Kueue's
//!   webhook does not compare the entries.
//!
//! Messages name the podset, the field and the key, never a value (a value may be anything a
//! check copied from elsewhere).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Toleration;

use super::{AdmissionCheckState, CheckState, PodSet, PodSetUpdate};

/// Longest name part of a qualified name, and longest label value.
pub const MAX_NAME_PART: usize = 63;
/// Longest DNS subdomain (the prefix of a qualified name).
pub const MAX_SUBDOMAIN: usize = 253;
/// Largest total size of a pod's annotations, keys and values, in bytes.
pub const MAX_ANNOTATIONS_BYTES: usize = 256 * 1024;
/// Most tolerations one podSetUpdate may carry (Kueue's CRD).
pub const MAX_TOLERATIONS: usize = 8;

/// What a label value may be made of, for messages.
const LABEL_CHARS: &str = "letters, digits, '-', '_' and '.', beginning and ending with a \
                           letter or digit";

/// Why `key` is not a qualified name (a label, node selector, annotation or toleration key).
pub fn qualified_name(key: &str) -> Result<(), String> {
    let name = match key.split('/').collect::<Vec<_>>().as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                return Err("its prefix (before '/') is empty".into());
            }
            dns_subdomain(prefix).map_err(|why| format!("its prefix (before '/') {why}"))?;
            name
        }
        _ => return Err("it has more than one '/'".into()),
    };
    if name.is_empty() {
        return Err("its name part is empty".into());
    }
    if name.len() > MAX_NAME_PART {
        return Err(format!(
            "its name part has {} characters, more than {MAX_NAME_PART}",
            name.len()
        ));
    }
    name_chars(name).map_err(|why| format!("its name part {why}"))
}

/// Why `value` is not a label value (of a label, a node selector or a toleration).
pub fn label_value(value: &str) -> Result<(), String> {
    if value.len() > MAX_NAME_PART {
        return Err(format!(
            "has {} characters, more than the {MAX_NAME_PART} a label value may have",
            value.len()
        ));
    }
    if value.is_empty() {
        return Ok(());
    }
    name_chars(value)
}

/// Letters, digits, `-`, `_` and `.`, beginning and ending with a letter or digit.
fn name_chars(text: &str) -> Result<(), String> {
    let alnum = |c: char| c.is_ascii_alphanumeric();
    if let Some((at, c)) = text
        .char_indices()
        .find(|(_, c)| !(alnum(*c) || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!(
            "has {} at position {}; it may have only {LABEL_CHARS}",
            describe_char(c),
            at + 1
        ));
    }
    if !text.starts_with(alnum) || !text.ends_with(alnum) {
        return Err(format!(
            "must begin and end with a letter or digit (it may have {LABEL_CHARS})"
        ));
    }
    Ok(())
}

/// Why `text` is not a DNS subdomain (lower case, at most 253 characters, dot-separated labels
/// of letters, digits and `-` that begin and end with a letter or digit).
pub fn dns_subdomain(text: &str) -> Result<(), String> {
    if text.len() > MAX_SUBDOMAIN {
        return Err(format!(
            "has {} characters, more than the {MAX_SUBDOMAIN} of a DNS subdomain",
            text.len()
        ));
    }
    let fine = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    for label in text.split('.') {
        if let Some(c) = label.chars().find(|c| !(fine(*c) || *c == '-')) {
            return Err(format!(
                "has {}; a DNS subdomain has only lower-case letters, digits, '-' and '.'",
                describe_char(c)
            ));
        }
        if !label.starts_with(fine) || !label.ends_with(fine) {
            return Err(
                "is not a DNS subdomain: each part between dots must begin and end \
                        with a lower-case letter or digit"
                    .into(),
            );
        }
    }
    Ok(())
}

/// A character for a message: printable ones quoted, others by code point.
fn describe_char(c: char) -> String {
    if c.is_control() || c.is_whitespace() {
        format!("the character U+{:04X}", u32::from(c))
    } else {
        format!("{c:?}")
    }
}

/// Why Kueue (its webhook, its CRD, or the job start that merges them into the pods) would
/// refuse `updates` for a Workload with `pod_sets`: the first problem found, naming the
/// podset, the field and the key.
pub fn pod_set_updates(pod_sets: &[PodSet], updates: &[PodSetUpdate]) -> Result<(), String> {
    if updates.len() > AdmissionCheckState::MAX_POD_SET_UPDATES {
        return Err(format!(
            "{} podSetUpdates, Kueue accepts at most {}",
            updates.len(),
            AdmissionCheckState::MAX_POD_SET_UPDATES
        ));
    }
    let names: Vec<&str> = pod_sets.iter().map(|p| p.name.as_str()).collect();
    let mut seen = BTreeSet::new();
    for update in updates {
        let Some(pod_set) = pod_sets.iter().find(|p| p.name == update.name) else {
            return Err(format!(
                "a podSetUpdate for podset {:?}, which the workload does not have (it has \
                 {names:?})",
                update.name
            ));
        };
        if !seen.insert(update.name.as_str()) {
            return Err(format!(
                "two podSetUpdates for podset {:?}; merge them into one",
                update.name
            ));
        }
        one_update(pod_set, update)
            .map_err(|why| format!("the podSetUpdate for podset {:?}: {why}", update.name))?;
    }
    Ok(())
}

/// Why `updates`, about to be written in a `Ready` entry of `check`, cannot stand beside the
/// podSetUpdates of the other checks' `Ready` entries in `entries`: a key one of them gives the
/// same podset with another value (annotations, labels, node selectors; tolerations are only
/// added). Kueue would admit the Workload and then fail to start the job. A key set to the same
/// value by several checks is fine.
pub fn conflicts_with_ready(
    check: &str,
    updates: &[PodSetUpdate],
    entries: &[AdmissionCheckState],
) -> Result<(), String> {
    let others = entries
        .iter()
        .filter(|e| e.name != check && e.state == CheckState::Ready);
    for other in others {
        for theirs in &other.pod_set_updates {
            let Some(ours) = updates.iter().find(|u| u.name == theirs.name) else {
                continue;
            };
            for (field, a, b) in [
                ("annotation", &ours.annotations, &theirs.annotations),
                ("label", &ours.labels, &theirs.labels),
                ("nodeSelector", &ours.node_selector, &theirs.node_selector),
            ] {
                if let Some(key) = a.iter().find_map(|(k, v)| (b.get(k)? != v).then_some(k)) {
                    return Err(format!(
                        "the podSetUpdate for podset {:?} gives {field} {key:?} another value \
                         than the Ready entry of check {:?} does: Kueue would admit the workload \
                         and then fail to start it (reason FailedToStart), as it cannot merge \
                         both into the pods; checks may set the same key only to the same value",
                        ours.name, other.name
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The rules for one podSetUpdate of `pod_set`.
fn one_update(pod_set: &PodSet, update: &PodSetUpdate) -> Result<(), String> {
    labels("labels", &update.labels)?;
    labels("nodeSelector", &update.node_selector)?;
    annotations(&update.annotations)?;
    tolerations(&update.tolerations)?;
    let template = &pod_set.template;
    let meta = template.metadata.as_ref();
    let spec = template.spec.as_ref();
    for (field, added, there) in [
        (
            "labels",
            &update.labels,
            meta.and_then(|m| m.labels.as_ref()),
        ),
        (
            "annotations",
            &update.annotations,
            meta.and_then(|m| m.annotations.as_ref()),
        ),
        (
            "nodeSelector",
            &update.node_selector,
            spec.and_then(|s| s.node_selector.as_ref()),
        ),
    ] {
        if let Some(key) = conflict(added, there) {
            return Err(format!(
                "{field} {key:?} is already set to another value in the podset's pod template; \
                 podSetUpdates only add (Kueue would fail to start the job)"
            ));
        }
    }
    Ok(())
}

/// A key both maps have with different values.
fn conflict<'a>(
    added: &'a BTreeMap<String, String>,
    there: Option<&BTreeMap<String, String>>,
) -> Option<&'a str> {
    let there = there?;
    added
        .iter()
        .find(|(k, v)| there.get(*k).is_some_and(|t| t != *v))
        .map(|(k, _)| k.as_str())
}

/// Labels or node selector entries: qualified keys, label values.
fn labels(field: &str, map: &BTreeMap<String, String>) -> Result<(), String> {
    for (key, value) in map {
        qualified_name(key).map_err(|why| format!("{field} key {key:?}: {why}"))?;
        label_value(value).map_err(|why| format!("{field} {key:?}: the value {why}"))?;
    }
    Ok(())
}

/// Annotations: qualified keys (in lower case), a total size within the limit.
fn annotations(map: &BTreeMap<String, String>) -> Result<(), String> {
    let mut bytes = 0usize;
    for (key, value) in map {
        qualified_name(&key.to_ascii_lowercase())
            .map_err(|why| format!("annotations key {key:?}: {why}"))?;
        bytes = bytes.saturating_add(key.len()).saturating_add(value.len());
    }
    if bytes > MAX_ANNOTATIONS_BYTES {
        return Err(format!(
            "the annotations have {bytes} bytes, more than the {MAX_ANNOTATIONS_BYTES} a pod \
             may have"
        ));
    }
    Ok(())
}

/// Tolerations, by Kueue's CRD rules and the core rules a pod is created under.
fn tolerations(list: &[Toleration]) -> Result<(), String> {
    if list.len() > MAX_TOLERATIONS {
        return Err(format!(
            "{} tolerations, Kueue accepts at most {MAX_TOLERATIONS}",
            list.len()
        ));
    }
    for (i, t) in list.iter().enumerate() {
        toleration(t).map_err(|why| format!("tolerations[{i}]: {why}"))?;
    }
    Ok(())
}

fn toleration(t: &Toleration) -> Result<(), String> {
    let key = t.key.as_deref().unwrap_or_default();
    let operator = t.operator.as_deref();
    if !key.is_empty() {
        qualified_name(key).map_err(|why| format!("the key {key:?}: {why}"))?;
    } else if operator != Some("Exists") {
        return Err("without a key the operator must be Exists (match every taint)".into());
    }
    match operator {
        None | Some("Equal") => label_value(t.value.as_deref().unwrap_or_default())
            .map_err(|why| format!("the value {why}"))?,
        Some("Exists") if t.value.is_some() => {
            return Err("the operator Exists takes no value".into());
        }
        Some("Exists") => {}
        Some(other) => {
            return Err(format!("the operator {other:?} is not Equal or Exists"));
        }
    }
    match t.effect.as_deref() {
        None | Some("NoSchedule" | "PreferNoSchedule" | "NoExecute") => {}
        Some(other) => {
            return Err(format!(
                "the effect {other:?} is not NoSchedule, PreferNoSchedule or NoExecute"
            ));
        }
    }
    if t.toleration_seconds.is_some() && t.effect.as_deref() != Some("NoExecute") {
        return Err("tolerationSeconds is set, which only the effect NoExecute takes".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, PodTemplateSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod_set(name: &str) -> PodSet {
        PodSet {
            name: name.into(),
            count: 1,
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(BTreeMap::from([("app".into(), "train".into())])),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    node_selector: Some(BTreeMap::from([("zone".into(), "a".into())])),
                    ..Default::default()
                }),
            },
            min_count: None,
        }
    }

    fn update(name: &str, change: impl FnOnce(&mut PodSetUpdate)) -> PodSetUpdate {
        let mut u = PodSetUpdate {
            name: name.into(),
            ..Default::default()
        };
        change(&mut u);
        u
    }

    /// Why one update of podset `main` is refused.
    fn refused(change: impl FnOnce(&mut PodSetUpdate)) -> String {
        pod_set_updates(&[pod_set("main")], &[update("main", change)]).expect_err("refused")
    }

    fn tol(key: Option<&str>, op: Option<&str>, value: Option<&str>) -> Toleration {
        Toleration {
            key: key.map(Into::into),
            operator: op.map(Into::into),
            value: value.map(Into::into),
            ..Default::default()
        }
    }

    #[test]
    fn qualified_names_follow_kubernetes() {
        for good in [
            "zone",
            "topology.kubernetes.io/zone",
            "a",
            "A_b.c-D",
            &"a".repeat(63),
            &format!("{}/x", "a".repeat(253)),
        ] {
            assert_eq!(qualified_name(good), Ok(()), "{good:?}");
        }
        for (bad, why) in [
            ("", "name part is empty"),
            ("/x", "prefix (before '/') is empty"),
            ("a/b/c", "more than one '/'"),
            ("example.com/", "name part is empty"),
            (&format!("example.com/{}", "a".repeat(70)), "70 characters"),
            ("-a", "begin and end"),
            ("a b", "U+0020 at position 2"),
            ("Example.com/a", "prefix (before '/') has 'E'"),
            ("exa_mple.com/a", "prefix"),
            (&format!("{}/x", "a".repeat(254)), "253"),
        ] {
            let got = qualified_name(bad).expect_err(bad);
            assert!(got.contains(why), "{bad:?}: {got}");
        }
    }

    #[test]
    fn label_values_may_be_empty_and_at_most_63() {
        assert_eq!(label_value(""), Ok(()));
        assert_eq!(label_value(&"v".repeat(63)), Ok(()));
        assert!(label_value(&"v".repeat(64)).is_err());
        assert!(label_value("eu/1").expect_err("slash").contains("'/'"));
        assert!(label_value("é").is_err(), "ASCII only");
        assert!(label_value("a.").is_err());
    }

    #[test]
    fn each_field_is_checked_and_named_with_the_podset() {
        let long_key = format!("example.com/{}", "k".repeat(70));
        for (change, expected) in [
            (
                Box::new(|u: &mut PodSetUpdate| {
                    u.node_selector.insert(long_key.clone(), "a".into());
                }) as Box<dyn FnOnce(&mut PodSetUpdate)>,
                "nodeSelector key",
            ),
            (
                Box::new(|u: &mut PodSetUpdate| {
                    u.node_selector.insert("pool".into(), "x".repeat(64));
                }),
                "nodeSelector \"pool\": the value has 64 characters",
            ),
            (
                Box::new(|u: &mut PodSetUpdate| {
                    u.labels.insert("team".into(), "a b".into());
                }),
                "labels \"team\": the value has the character U+0020",
            ),
            (
                Box::new(|u: &mut PodSetUpdate| {
                    u.annotations.insert("bad key".into(), "v".into());
                }),
                "annotations key \"bad key\"",
            ),
            (
                Box::new(|u: &mut PodSetUpdate| {
                    u.annotations
                        .insert("big".into(), "v".repeat(MAX_ANNOTATIONS_BYTES));
                }),
                "bytes, more than",
            ),
            (
                Box::new(|u: &mut PodSetUpdate| {
                    u.tolerations = vec![tol(Some("gpu"), Some("Equal"), Some("yes")); 9];
                }),
                "9 tolerations",
            ),
        ] {
            let got = refused(change);
            assert!(
                got.starts_with("the podSetUpdate for podset \"main\": ") && got.contains(expected),
                "{got}"
            );
        }
        // Annotation values are free (a request name, JSON): only the keys are names.
        let fine = update("main", |u| {
            u.annotations
                .insert("Example.COM/Key".into(), "{\"any\": \"thing\"}".into());
        });
        assert_eq!(pod_set_updates(&[pod_set("main")], &[fine]), Ok(()));
    }

    #[test]
    fn tolerations_follow_kueues_crd_and_the_pod_rules() {
        let fine = [
            tol(Some("gpu"), None, Some("yes")),
            tol(Some("gpu"), Some("Exists"), None),
            tol(None, Some("Exists"), None),
            Toleration {
                key: Some("node.kubernetes.io/unreachable".into()),
                operator: Some("Exists".into()),
                effect: Some("NoExecute".into()),
                toleration_seconds: Some(30),
                ..Default::default()
            },
        ];
        for t in &fine {
            assert_eq!(toleration(t), Ok(()), "{t:?}");
        }
        for (t, why) in [
            (tol(None, Some("Equal"), Some("x")), "without a key"),
            (tol(Some(""), None, None), "without a key"),
            (tol(Some("gpu"), Some("Exists"), Some("")), "takes no value"),
            (
                tol(Some("gpu"), Some("Lt"), Some("3")),
                "not Equal or Exists",
            ),
            (tol(Some("gpu"), Some("Equal"), Some("a b")), "the value"),
            (
                tol(Some("a/b/c"), Some("Exists"), None),
                "more than one '/'",
            ),
            (
                Toleration {
                    effect: Some("Sometimes".into()),
                    ..tol(Some("gpu"), Some("Exists"), None)
                },
                "the effect \"Sometimes\"",
            ),
            (
                Toleration {
                    toleration_seconds: Some(5),
                    effect: Some("NoSchedule".into()),
                    ..tol(Some("gpu"), Some("Exists"), None)
                },
                "tolerationSeconds",
            ),
        ] {
            let got = toleration(&t).expect_err("refused");
            assert!(got.contains(why), "{t:?}: {got}");
        }
    }

    #[test]
    fn updates_name_podsets_of_the_workload_once_each_and_only_add() {
        let pod_sets = [pod_set("main"), pod_set("aux")];
        let unknown = pod_set_updates(&pod_sets, &[update("other", |_| {})]).expect_err("unknown");
        assert!(
            unknown.contains("\"other\", which the workload does not have"),
            "{unknown}"
        );
        let twice = pod_set_updates(&pod_sets, &[update("main", |_| {}), update("main", |_| {})])
            .expect_err("twice");
        assert!(
            twice.contains("two podSetUpdates for podset \"main\""),
            "{twice}"
        );
        let many: Vec<PodSetUpdate> = (0..19).map(|_| update("main", |_| {})).collect();
        assert!(
            pod_set_updates(&pod_sets, &many)
                .expect_err("too many")
                .contains("19 podSetUpdates, Kueue accepts at most 18")
        );
        // The same value as the template is no conflict; another value is.
        let same = update("main", |u| {
            u.node_selector.insert("zone".into(), "a".into());
            u.labels.insert("app".into(), "train".into());
        });
        assert_eq!(pod_set_updates(&pod_sets, &[same]), Ok(()));
        let other = update("main", |u| {
            u.node_selector.insert("zone".into(), "b".into());
        });
        let got = pod_set_updates(&pod_sets, &[other]).expect_err("conflict");
        assert!(
            got.contains("nodeSelector \"zone\" is already set"),
            "{got}"
        );
        let label = update("aux", |u| {
            u.labels.insert("app".into(), "serve".into());
        });
        let got = pod_set_updates(&pod_sets, &[label]).expect_err("conflict");
        assert!(got.contains("podset \"aux\": labels \"app\""), "{got}");
    }
}

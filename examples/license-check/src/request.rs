//! What a Workload asks for, read from the `kueue-admission-checks.dev/licenses` annotation.
//!
//! The value is a comma-separated list of `feature=count`, e.g. `matlab=2, simulink=1`. On a
//! pod template (the usual place: Kueue copies a Job's pod template into the Workload) the
//! counts are per pod and multiply by the podset's pod count; on the Workload object itself
//! they are for the whole Workload. Everything found is added up.

use std::collections::BTreeMap;

use kube::ResourceExt;
use kueue_admission_sdk::api::Workload;

/// The annotation a Workload (or its pod template) asks for licenses with.
pub const LICENSES_ANNOTATION: &str = "kueue-admission-checks.dev/licenses";

/// A number of licenses per feature.
pub type Licenses = BTreeMap<String, u32>;

/// Parses `feature=count[,feature=count...]`. An empty value asks for nothing.
///
/// Feature names follow the rules of ConfigMap keys (the pool is a ConfigMap); counts are
/// whole numbers from 1; a feature given twice is an error rather than a guess.
pub fn parse_licenses(value: &str) -> Result<Licenses, String> {
    let mut licenses = Licenses::new();
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some((feature, count)) = item.split_once('=') else {
            return Err(format!("{item:?} is not feature=count"));
        };
        let (feature, count) = (feature.trim(), count.trim());
        check_feature_name(feature)?;
        let count = parse_count(count)
            .filter(|c| *c > 0)
            .ok_or_else(|| format!("{feature}={count}: the count must be a whole number from 1"))?;
        if licenses.insert(feature.to_string(), count).is_some() {
            return Err(format!("feature {feature:?} is given twice"));
        }
    }
    Ok(licenses)
}

/// A whole number without sign, as written in an annotation or a ConfigMap.
pub(crate) fn parse_count(s: &str) -> Option<u32> {
    // u32's parser accepts a leading '+'; a count is digits only.
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Feature names are ConfigMap keys: 1 to 253 of `[-._a-zA-Z0-9]`.
pub(crate) fn check_feature_name(feature: &str) -> Result<(), String> {
    let valid = !feature.is_empty()
        && feature.len() <= 253
        && feature
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{feature:?} is not a feature name (1 to 253 letters, digits, '-', '.' or '_')"
        ))
    }
}

/// Everything a Workload asks for: its own annotation, plus each podset's pod template
/// annotation times the podset's pod count (the admitted count under partial admission).
/// The error says where the bad value is.
pub fn requested_licenses(wl: &Workload) -> Result<Licenses, String> {
    let mut total = Licenses::new();
    if let Some(value) = wl.annotations().get(LICENSES_ANNOTATION) {
        let own = parse_licenses(value)
            .map_err(|e| format!("annotation {LICENSES_ANNOTATION} on the workload: {e}"))?;
        add(&mut total, &own, 1)?;
    }
    for pod_set in &wl.spec.pod_sets {
        let annotations = pod_set
            .template
            .metadata
            .as_ref()
            .and_then(|m| m.annotations.as_ref());
        let Some(value) = annotations.and_then(|a| a.get(LICENSES_ANNOTATION)) else {
            continue;
        };
        let per_pod = parse_licenses(value).map_err(|e| {
            format!(
                "annotation {LICENSES_ANNOTATION} on the pod template of podset {:?}: {e}",
                pod_set.name
            )
        })?;
        add(&mut total, &per_pod, wl.pod_count(&pod_set.name))?;
    }
    Ok(total)
}

fn add(total: &mut Licenses, more: &Licenses, times: u32) -> Result<(), String> {
    // A podset of 0 pods (Kueue allows count 0) asks for nothing: no `feature=0` entry, which
    // would show in messages and in the ledger as a booking of nothing.
    if times == 0 {
        return Ok(());
    }
    for (feature, count) in more {
        let sum = count
            .checked_mul(times)
            .and_then(|n| n.checked_add(total.get(feature).copied().unwrap_or(0)))
            .ok_or_else(|| {
                format!("the workload asks for more {feature} licenses than can be counted")
            })?;
        total.insert(feature.clone(), sum);
    }
    Ok(())
}

/// `matlab=2, simulink=1`, for messages.
pub fn format_licenses(licenses: &Licenses) -> String {
    let items: Vec<String> = licenses.iter().map(|(f, n)| format!("{f}={n}")).collect();
    items.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use kueue_admission_sdk::testing::WorkloadBuilder;

    fn licenses(items: &[(&str, u32)]) -> Licenses {
        items.iter().map(|(f, n)| (f.to_string(), *n)).collect()
    }

    #[test]
    fn parses_lists_with_spaces_and_an_empty_value() {
        assert_eq!(
            parse_licenses(" matlab=2 , simulink = 1,"),
            Ok(licenses(&[("matlab", 2), ("simulink", 1)]))
        );
        assert_eq!(parse_licenses(""), Ok(Licenses::new()));
        assert_eq!(
            format_licenses(&licenses(&[("a", 1), ("b", 2)])),
            "a=1, b=2"
        );
    }

    #[test]
    fn refuses_what_it_cannot_count_with_a_message_naming_the_item() {
        for (value, expected) in [
            ("matlab", "\"matlab\" is not feature=count"),
            (
                "matlab=-1",
                "matlab=-1: the count must be a whole number from 1",
            ),
            (
                "matlab=+1",
                "matlab=+1: the count must be a whole number from 1",
            ),
            (
                "matlab=0",
                "matlab=0: the count must be a whole number from 1",
            ),
            (
                "matlab=two",
                "matlab=two: the count must be a whole number from 1",
            ),
            (
                "matlab=99999999999",
                "matlab=99999999999: the count must be a whole number from 1",
            ),
            ("=1", "\"\" is not a feature name"),
            ("mat lab=1", "\"mat lab\" is not a feature name"),
            ("a=1,a=2", "feature \"a\" is given twice"),
        ] {
            let err = parse_licenses(value).expect_err(value);
            assert!(err.starts_with(expected), "{value}: {err}");
        }
    }

    fn with_template_annotation(builder: WorkloadBuilder, value: &str) -> Workload {
        let mut wl = builder.build();
        for ps in &mut wl.spec.pod_sets {
            ps.template
                .metadata
                .get_or_insert_with(Default::default)
                .annotations
                .get_or_insert_with(Default::default)
                .insert(LICENSES_ANNOTATION.into(), value.into());
        }
        wl
    }

    #[test]
    fn pod_template_counts_are_per_pod_and_workload_counts_are_for_all() {
        let mut wl = with_template_annotation(
            WorkloadBuilder::new("ns", "wl").pod_set("main", 3, "1"),
            "matlab=1",
        );
        assert_eq!(requested_licenses(&wl), Ok(licenses(&[("matlab", 3)])));
        wl.annotations_mut()
            .insert(LICENSES_ANNOTATION.into(), "matlab=1,ansys=2".into());
        assert_eq!(
            requested_licenses(&wl),
            Ok(licenses(&[("ansys", 2), ("matlab", 4)]))
        );
    }

    #[test]
    fn partial_admission_counts_the_assigned_pods() {
        let mut wl = with_template_annotation(
            WorkloadBuilder::new("ns", "wl")
                .pod_set("main", 4, "1")
                .quota_reserved("cq", "f"),
            "matlab=1",
        );
        let status = wl.status.as_mut().and_then(|s| s.admission.as_mut());
        status.expect("admission").pod_set_assignments[0].count = Some(2);
        assert_eq!(requested_licenses(&wl), Ok(licenses(&[("matlab", 2)])));
    }

    #[test]
    fn a_podset_of_no_pods_asks_for_nothing() {
        // Found by fuzzing: it added `matlab=0`, a booking of nothing shown in messages.
        let wl = with_template_annotation(
            WorkloadBuilder::new("ns", "wl").pod_set("main", 0, "1"),
            "matlab=1",
        );
        assert_eq!(requested_licenses(&wl), Ok(Licenses::new()));
    }

    /// A bad count names the podset; overflowing totals are an error, not a wrap.
    #[test]
    fn bad_template_annotations_say_what_is_wrong() {
        for (podset, pods, annotation, expected) in [
            ("workers", 1, "matlab=lots", "podset \"workers\""),
            (
                "main",
                100_000,
                "matlab=100000",
                "more matlab licenses than can be counted",
            ),
        ] {
            let wl = with_template_annotation(
                WorkloadBuilder::new("ns", "wl").pod_set(podset, pods, "1"),
                annotation,
            );
            let err = requested_licenses(&wl).expect_err(annotation);
            assert!(err.contains(expected), "{annotation}: {err}");
        }
    }
}

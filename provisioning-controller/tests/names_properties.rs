//! Properties of the names of requests and PodTemplates, for any valid Workload, check and
//! podset names up to 253 characters.

use std::collections::BTreeSet;

use kueue_provisioning_controller::names::{
    MAX_NAME_LEN, attempt_of, pod_template_name, request_attempt, request_name,
};
use proptest::prelude::*;

/// Kubernetes' DNS subdomain rule (IsDNS1123Subdomain): at most 253 characters, dot-separated
/// labels of lowercase letters, digits and '-', each starting and ending with a letter or digit.
fn is_subdomain(name: &str) -> bool {
    name.len() <= MAX_NAME_LEN
        && name.split('.').all(|label| {
            let bytes = label.as_bytes();
            !bytes.is_empty()
                && bytes
                    .iter()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
                && bytes[0] != b'-'
                && bytes[bytes.len() - 1] != b'-'
        })
}

/// DNS subdomains of every length from 1 to 253, short ones more often.
fn subdomain() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9]([a-z0-9-]{0,12}[a-z0-9])?",
        prop::collection::vec("[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", 1..9)
            .prop_map(|labels| labels.join(".")),
        (1usize..=MAX_NAME_LEN, "[a-z0-9]").prop_map(|(n, c)| c.repeat(n)),
    ]
    .prop_map(|mut s| {
        s.truncate(MAX_NAME_LEN);
        s.trim_end_matches(|c: char| !c.is_ascii_alphanumeric())
            .to_string()
    })
    .prop_filter("empty", |s| !s.is_empty())
}

/// Podset names are DNS labels (at most 63 characters).
fn pod_set_name() -> impl Strategy<Value = String> {
    "[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
}

fn attempt() -> impl Strategy<Value = u32> {
    prop_oneof![1u32..20, any::<u32>()]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn request_names_are_valid_and_parse_back(
        workload in subdomain(),
        check in subdomain(),
        attempt in attempt(),
    ) {
        prop_assert!(is_subdomain(&workload) && is_subdomain(&check));
        let name = request_name(&workload, &check, attempt);
        prop_assert!(name.len() <= MAX_NAME_LEN, "{} characters: {}", name.len(), name);
        prop_assert!(is_subdomain(&name), "not a DNS subdomain: {}", name);
        let suffix = format!("-{attempt}");
        prop_assert!(name.ends_with(&suffix));
        prop_assert_eq!(attempt_of(&name), Some(attempt));
        prop_assert_eq!(request_attempt(&name, &workload, &check), Some(attempt));
        prop_assert_eq!(&name, &request_name(&workload, &check, attempt));
        let full = format!("{workload}-{check}-{attempt}");
        if full.len() <= MAX_NAME_LEN {
            prop_assert_eq!(&name, &full);
        }
    }

    #[test]
    fn pod_template_names_are_valid(
        workload in subdomain(),
        check in subdomain(),
        attempt in attempt(),
        pod_set in pod_set_name(),
    ) {
        let request = request_name(&workload, &check, attempt);
        let name = pod_template_name(&request, &pod_set);
        prop_assert!(name.len() <= MAX_NAME_LEN);
        prop_assert!(is_subdomain(&name), "not a DNS subdomain: {}", name);
        prop_assert!(name.starts_with("ppt-"));
        prop_assert_eq!(&name, &pod_template_name(&request, &pod_set));
        let full = format!("ppt-{request}-{pod_set}");
        if full.len() <= MAX_NAME_LEN {
            prop_assert_eq!(&name, &full);
        }
    }

    #[test]
    fn distinct_inputs_get_distinct_names(
        inputs in prop::collection::vec((subdomain(), subdomain(), 1u32..4, pod_set_name()), 1..40),
    ) {
        // `<workload>-<check>` is what is named: ("a-b", "c") and ("a", "b-c") share names, as
        // in Kueue. Everything else must differ.
        let keys: BTreeSet<(String, u32)> = inputs
            .iter()
            .map(|(w, c, a, _)| (format!("{w}-{c}"), *a))
            .collect();
        let requests: BTreeSet<String> = inputs
            .iter()
            .map(|(w, c, a, _)| request_name(w, c, *a))
            .collect();
        prop_assert_eq!(keys.len(), requests.len());

        let template_keys: BTreeSet<(String, u32, &str)> = inputs
            .iter()
            .map(|(w, c, a, p)| (format!("{w}-{c}"), *a, p.as_str()))
            .collect();
        let templates: BTreeSet<String> = inputs
            .iter()
            .map(|(w, c, a, p)| pod_template_name(&request_name(w, c, *a), p))
            .collect();
        prop_assert_eq!(template_keys.len(), templates.len());
    }

    #[test]
    fn long_names_of_one_workload_differ_per_check(
        workload in (200usize..=MAX_NAME_LEN).prop_map(|n| "w".repeat(n)),
        checks in prop::collection::btree_set(subdomain(), 2..10),
    ) {
        let names: BTreeSet<String> = checks.iter().map(|c| request_name(&workload, c, 1)).collect();
        prop_assert_eq!(names.len(), checks.len());
        for name in &names {
            prop_assert!(is_subdomain(name));
        }
    }
}

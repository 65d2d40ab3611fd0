//! Names of the CapacityBuffers and PodTemplates of one attempt, and the labels and
//! annotations that tie them (and the Nodes made for them) to their Workload.

use sha2::{Digest, Sha256};

/// `app.kubernetes.io/managed-by` on everything this controller creates.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Its value.
pub const MANAGED_BY: &str = "kueue-capacity-buffer-controller";
/// Ties buffers and templates to one instance of this controller (one controllerName).
pub const INSTANCE_LABEL: &str = "kueue-admission-checks.dev/instance";
/// The Workload's uid: on buffers and templates, and on the Workload's pods (a pod set update),
/// which the Node protection counts.
pub const WORKLOAD_UID_LABEL: &str = "kueue-admission-checks.dev/workload-uid";
/// The attempt a buffer was made for.
pub const ATTEMPT_LABEL: &str = "kueue-admission-checks.dev/attempt";
/// The Workload's name (a label value may be too short for it).
pub const WORKLOAD_ANNOTATION: &str = "kueue-admission-checks.dev/workload";
/// The AdmissionCheck a buffer was made for.
pub const CHECK_ANNOTATION: &str = "kueue-admission-checks.dev/check";
/// The podset a buffer was made for.
pub const POD_SET_ANNOTATION: &str = "kueue-admission-checks.dev/pod-set";
/// On a buffer: when the check found its capacity ready and shrank it to zero replicas.
pub const CAPACITY_READY_ANNOTATION: &str = "kueue-admission-checks.dev/capacity-ready-at";
/// On a Node: the instance of this controller that protects it (only that one ends it).
pub const PROTECTED_BY_ANNOTATION: &str = "kueue-admission-checks.dev/protected-by";
/// On a Node: the uid of the Workload it is kept for (beside Karpenter's do-not-disrupt).
pub const PROTECTED_FOR_ANNOTATION: &str = "kueue-admission-checks.dev/protected-for";
/// On a Node: how many pods of that Workload must be bound before the protection ends.
pub const PROTECTED_PODS_ANNOTATION: &str = "kueue-admission-checks.dev/protected-pods";
/// On a Node: when the protection ends at the latest (RFC 3339).
pub const PROTECTED_UNTIL_ANNOTATION: &str = "kueue-admission-checks.dev/protected-until";

/// A CapacityBuffer's name is also the label value Karpenter puts on its virtual pods, so it
/// stays within a label value's 63 characters.
const MAX_NAME: usize = 63;
const HASH_LEN: usize = 10;

/// The name of the buffer (and of its PodTemplate) for one podset of one attempt: readable
/// (`<workload>-<podset>`, cut to fit) and unique (a hash of the Workload's uid, the check, the
/// podset and the attempt).
pub fn buffer_name(workload: &str, uid: &str, check: &str, pod_set: &str, attempt: u32) -> String {
    let hash = short_hash(&format!("{uid}/{check}/{pod_set}/{attempt}"));
    let mut base: String = format!("{workload}-{pod_set}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(MAX_NAME - HASH_LEN - 1)
        .collect();
    while base.ends_with('-') {
        base.pop();
    }
    while base.starts_with('-') {
        base.remove(0);
    }
    if base.is_empty() {
        return format!("cb-{hash}");
    }
    format!("{base}-{hash}")
}

fn short_hash(s: &str) -> String {
    let digest = Sha256::digest(s.as_bytes());
    let mut hex: String = digest
        .iter()
        .take(HASH_LEN / 2)
        .map(|b| format!("{b:02x}"))
        .collect();
    hex.truncate(HASH_LEN);
    hex
}

/// The instance label's value for a controllerName: short, stable, a valid label value.
pub fn instance(controller_name: &str) -> String {
    format!("cb-{}", short_hash(controller_name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names_are_readable_and_differ_by_attempt_podset_and_check() {
        let a = buffer_name("train", "uid-1", "capacity", "main", 1);
        assert!(a.starts_with("train-main-"), "{a}");
        assert_ne!(a, buffer_name("train", "uid-1", "capacity", "main", 2));
        assert_ne!(a, buffer_name("train", "uid-1", "capacity", "worker", 1));
        assert_ne!(a, buffer_name("train", "uid-1", "other", "main", 1));
        assert_ne!(a, buffer_name("train", "uid-2", "capacity", "main", 1));
        assert_eq!(a, buffer_name("train", "uid-1", "capacity", "main", 1));
    }

    proptest! {
        #[test]
        fn every_name_is_a_dns_label(workload in "[a-z0-9.-]{0,253}", pod_set in "[a-z0-9-]{1,63}", attempt: u32) {
            let name = buffer_name(&workload, "uid", "check", &pod_set, attempt);
            prop_assert!(name.len() <= 63, "{}", name);
            prop_assert!(kueue_admission_sdk::api::validation::label_value(&name).is_ok(), "{}", name);
            prop_assert!(name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'));
            prop_assert!(!name.starts_with('-') && !name.ends_with('-'));
        }
    }
}

//! Which ProvisioningRequests and PodTemplates are ours: the one rule checked before this
//! controller deletes, patches or adopts one, or names a request in podSetUpdates.
//!
//! A name proves nothing. Workload names are chosen by users, `<workload>-<check>-<attempt>` is
//! ambiguous (Workload `a` with check `b-c` and Workload `a-b` with check `c` both give
//! `a-b-c-1`), and Kueue's built-in check names its requests the same way. Only what this
//! controller writes on its objects tells: the instance label (a hash of the controllerName),
//! the Workload uid label and the check annotation. Everything else is foreign, whatever its
//! name, and is never deleted, patched or referenced.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use sha2::{Digest, Sha256};

/// The controllerName of Kueue's built-in provisioning check.
pub const KUEUE_CONTROLLER_NAME: &str = "kueue.x-k8s.io/provisioning-request";

/// Label Kueue's built-in check puts on its requests and PodTemplates.
pub const KUEUE_MANAGED_LABEL: &str = "kueue.x-k8s.io/managed";

/// The controller instance and the Workload and check it acts for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity<'a> {
    /// This instance's [`INSTANCE_LABEL`] value.
    pub instance: &'a str,
    /// The Workload's name.
    pub workload: &'a str,
    /// The Workload's uid.
    pub workload_uid: &'a str,
    /// The AdmissionCheck's name.
    pub check: &'a str,
}

impl<'a> Identity<'a> {
    /// The identity recorded on an object, for `instance`: what clean-up acts for once the
    /// Workload is gone. `None` unless the object records a Workload, its uid and a check.
    pub fn recorded_on(meta: &'a ObjectMeta, instance: &'a str) -> Option<Self> {
        let label = |k: &str| meta.labels.as_ref()?.get(k).filter(|v| !v.is_empty());
        let annotation = |k: &str| meta.annotations.as_ref()?.get(k).filter(|v| !v.is_empty());
        Some(Self {
            instance,
            workload: annotation(WORKLOAD_ANNOTATION)?,
            workload_uid: label(WORKLOAD_UID_LABEL)?,
            check: annotation(CHECK_ANNOTATION)?,
        })
    }
}

/// Whose an object is, seen from an [`Identity`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// Made by this instance for this Workload (same uid) and check: it may be used, patched
    /// and deleted.
    Ours,
    /// Made by this instance for this check and a Workload of the same name with another uid.
    /// Names are unique in a namespace, so that Workload no longer exists: the object is an
    /// orphan this instance may delete (once a fresh read confirms the Workload's uid).
    Predecessor,
    /// Anything else: Kueue's, another controller's or instance's, a user's, or made for
    /// another Workload or check. Never deleted, patched, adopted or referenced.
    Foreign,
}

/// The rule. Pure: reads only the object's labels and annotations.
pub fn ownership(meta: &ObjectMeta, me: &Identity<'_>) -> Ownership {
    let label = |k: &str| meta.labels.as_ref().and_then(|l| l.get(k));
    let annotation = |k: &str| meta.annotations.as_ref().and_then(|a| a.get(k));
    let same =
        |have: Option<&String>, want: &str| !want.is_empty() && have.is_some_and(|v| v == want);
    if !same(label(INSTANCE_LABEL), me.instance) || !same(annotation(CHECK_ANNOTATION), me.check) {
        return Ownership::Foreign;
    }
    if same(label(WORKLOAD_UID_LABEL), me.workload_uid) {
        return Ownership::Ours;
    }
    let recorded_uid = label(WORKLOAD_UID_LABEL).is_some_and(|v| !v.is_empty());
    if recorded_uid && same(annotation(WORKLOAD_ANNOTATION), me.workload) {
        Ownership::Predecessor
    } else {
        Ownership::Foreign
    }
}

/// Who made a foreign object, as far as its metadata tells, for messages and events.
pub fn describe_owner(meta: &ObjectMeta, me: &Identity<'_>) -> String {
    let label = |k: &str| meta.labels.as_ref().and_then(|l| l.get(k));
    let annotation = |k: &str| meta.annotations.as_ref().and_then(|a| a.get(k));
    let owners: Vec<String> = meta
        .owner_references
        .iter()
        .flatten()
        .map(|o| format!("{} {}", o.kind, o.name))
        .collect();
    let owned_by = if owners.is_empty() {
        String::new()
    } else {
        format!(", owned by {}", owners.join(", "))
    };
    if label(KUEUE_MANAGED_LABEL).is_some_and(|v| v == "true") {
        return format!("made by Kueue's built-in provisioning check{owned_by}");
    }
    if let Some(instance) = label(INSTANCE_LABEL) {
        let whose = if instance == me.instance {
            "this controller".to_string()
        } else {
            format!("another instance of this controller ({INSTANCE_LABEL}={instance})")
        };
        let workload = annotation(WORKLOAD_ANNOTATION).map_or("?", String::as_str);
        let check = annotation(CHECK_ANNOTATION).map_or("?", String::as_str);
        return format!("made by {whose} for Workload {workload} and check {check}{owned_by}");
    }
    if owners.is_empty() {
        "not made by this controller; it has no owner".into()
    } else {
        format!("not made by this controller{owned_by}")
    }
}

/// A label or annotation key in this project's domain, which is spelled here once.
macro_rules! domain_key {
    ($name:literal) => {
        concat!("kueue-admission-checks.dev/", $name)
    };
}

/// Label naming the controller instance (a hash of its controllerName) that owns an object,
/// so that two instances with different controllerNames never touch each other's requests.
pub const INSTANCE_LABEL: &str = domain_key!("instance");
/// Label holding the uid of the Workload the object was made for.
pub const WORKLOAD_UID_LABEL: &str = domain_key!("workload-uid");
/// Annotation holding the name of the Workload the object was made for.
pub const WORKLOAD_ANNOTATION: &str = domain_key!("workload");
/// Annotation holding the name of the AdmissionCheck the object was made for.
pub const CHECK_ANNOTATION: &str = domain_key!("check");
/// Annotation holding the attempt (1-based) the object was made for.
pub const ATTEMPT_ANNOTATION: &str = domain_key!("attempt");
/// Annotation of PodTemplates holding the name of their ProvisioningRequest.
pub const REQUEST_ANNOTATION: &str = domain_key!("request");

/// Label naming the controller that manages the object; its value is the `managed_by` argument.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// `app.kubernetes.io/managed-by` on every request and template this controller creates.
pub const MANAGED_BY: &str = "kueue-provisioning-controller";

/// The value of [`INSTANCE_LABEL`] for a controllerName: short, stable, a valid label value.
pub fn instance_label(controller_name: &str) -> String {
    let digest = Sha256::digest(controller_name.as_bytes());
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("pr-{hex}")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    use super::*;

    const ME: Identity<'static> = Identity {
        instance: "pr-1",
        workload: "a",
        workload_uid: "uid-a",
        check: "b-c",
    };

    fn meta(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> ObjectMeta {
        let map = |kv: &[(&str, &str)]| {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>()
        };
        ObjectMeta {
            name: Some("a-b-c-1".into()),
            namespace: Some("team".into()),
            labels: Some(map(labels)),
            annotations: Some(map(annotations)),
            ..ObjectMeta::default()
        }
    }

    fn ours(uid: &str, workload: &str, check: &str, instance: &str) -> ObjectMeta {
        meta(
            &[(INSTANCE_LABEL, instance), (WORKLOAD_UID_LABEL, uid)],
            &[(WORKLOAD_ANNOTATION, workload), (CHECK_ANNOTATION, check)],
        )
    }

    #[test]
    fn ours_only_with_instance_workload_uid_and_check_predecessor_with_another_uid() {
        use Ownership::{Foreign, Ours, Predecessor};
        // `ours`' arguments (uid, workload, check, instance) and what `ME` makes of the object.
        for case @ &(uid, workload, check, instance, expected) in &[
            ("uid-a", "a", "b-c", "pr-1", Ours),
            // Another instance of this controller (another controllerName).
            ("uid-a", "a", "b-c", "pr-2", Foreign),
            // Another check of the same Workload.
            ("uid-a", "a", "c", "pr-1", Foreign),
            // Another live Workload whose name and check concatenate to the same request name.
            ("uid-ab", "a-b", "b-c", "pr-1", Foreign),
            // A deleted Workload's object of the same name is a predecessor...
            ("uid-old", "a", "b-c", "pr-1", Predecessor),
            // ...but without a recorded uid it cannot be told apart: foreign.
            ("", "a", "b-c", "pr-1", Foreign),
            // Another instance's orphan is that instance's business.
            ("uid-old", "a", "b-c", "pr-2", Foreign),
        ] {
            let object = ours(uid, workload, check, instance);
            assert_eq!(ownership(&object, &ME), expected, "{case:?}");
        }
        // The right name says nothing.
        assert_eq!(ownership(&meta(&[], &[]), &ME), Ownership::Foreign);
        assert_eq!(ownership(&ObjectMeta::default(), &ME), Ownership::Foreign);
        // Half of the identity is not enough.
        for partial in [
            meta(&[(INSTANCE_LABEL, "pr-1")], &[(CHECK_ANNOTATION, "b-c")]),
            meta(
                &[(WORKLOAD_UID_LABEL, "uid-a")],
                &[(CHECK_ANNOTATION, "b-c")],
            ),
            meta(
                &[(INSTANCE_LABEL, "pr-1"), (WORKLOAD_UID_LABEL, "uid-a")],
                &[],
            ),
        ] {
            assert_eq!(ownership(&partial, &ME), Ownership::Foreign, "{partial:?}");
        }
    }

    #[test]
    fn an_empty_identity_owns_nothing() {
        let empty = Identity {
            instance: "",
            workload: "",
            workload_uid: "",
            check: "",
        };
        assert_eq!(ownership(&ours("", "", "", ""), &empty), Ownership::Foreign);
        let no_uid = Identity {
            workload_uid: "",
            ..ME
        };
        assert_eq!(
            ownership(&ours("", "a", "b-c", "pr-1"), &no_uid),
            Ownership::Foreign
        );
    }

    #[test]
    fn kueues_objects_are_foreign_and_described_as_kueues() {
        let mut k = meta(&[(KUEUE_MANAGED_LABEL, "true")], &[]);
        k.owner_references = Some(vec![OwnerReference {
            api_version: "kueue.x-k8s.io/v1beta2".into(),
            kind: "Workload".into(),
            name: "a-b".into(),
            uid: "uid-ab".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]);
        assert_eq!(ownership(&k, &ME), Ownership::Foreign);
        assert_eq!(
            describe_owner(&k, &ME),
            "made by Kueue's built-in provisioning check, owned by Workload a-b"
        );
        assert_eq!(
            describe_owner(&ours("uid-x", "x", "c", "pr-2"), &ME),
            format!(
                "made by another instance of this controller ({INSTANCE_LABEL}=pr-2) for \
                 Workload x and check c"
            )
        );
        assert_eq!(
            describe_owner(&ours("uid-ab", "a-b", "c", "pr-1"), &ME),
            "made by this controller for Workload a-b and check c"
        );
        assert_eq!(
            describe_owner(&meta(&[], &[]), &ME),
            "not made by this controller; it has no owner"
        );
    }

    #[test]
    fn the_recorded_identity_is_complete_or_none() {
        let m = ours("uid-a", "a", "b-c", "pr-1");
        let id = Identity::recorded_on(&m, "pr-1").expect("complete");
        assert_eq!(id, ME);
        assert_eq!(ownership(&m, &id), Ownership::Ours);
        // Recorded by another instance: read, but not ours.
        let other = ours("uid-a", "a", "b-c", "pr-2");
        let id = Identity::recorded_on(&other, "pr-1").expect("complete");
        assert_eq!(ownership(&other, &id), Ownership::Foreign);
        assert_eq!(
            Identity::recorded_on(&ours("", "a", "b-c", "pr-1"), "pr-1"),
            None
        );
        assert_eq!(Identity::recorded_on(&meta(&[], &[]), "pr-1"), None);
    }

    #[test]
    fn instance_labels_are_valid_label_values() {
        let v = instance_label("kueue-admission-checks.dev/provisioning-request");
        assert!(v.len() <= 63);
        assert!(v.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
        assert_eq!(
            v,
            instance_label("kueue-admission-checks.dev/provisioning-request")
        );
    }
}

//! Kueue `kueue.x-k8s.io/v1beta2` types, as an admission check controller sees them, and
//! cluster-autoscaler's `autoscaling.x-k8s.io/v1` ProvisioningRequest.
//!
//! Only v1beta2 is modelled: it is the storage version since Kueue v0.16 and exists since v0.15,
//! the oldest release this project supports. Fields a check never reads are left out; serde
//! ignores them when reading, and the runtime never writes whole objects back (status writes are
//! server-side applies of the fields it owns), so nothing unknown is lost.
//!
//! On the wire: a `None` field is left out, never `null` (`#[skip_serializing_none]`), so a
//! server-side apply claims no field it does not set; a struct whose every field may be missing
//! reads them as its `Default` (`#[serde(default)]` on the struct), and the fields the API
//! requires stay required. The tests in `wire_tests.rs` pin the exact JSON.

/// Declares a Kueue `kueue.x-k8s.io/v1beta2` kind from its spec struct: the group, the
/// version, the derives and the wire rule for `None` are said here once, so every kind moves to
/// another API version together. The bracket holds the kind's own `#[kube(...)]` arguments.
/// (An attribute list cannot be named in Rust; only a macro can share one.)
macro_rules! kueue_kind {
    ([$($kube:tt)*] $(#[$attr:meta])* $vis:vis struct $spec:ident $body:tt) => {
        #[serde_with::skip_serializing_none]
        #[derive(kube::CustomResource, serde::Serialize, serde::Deserialize, Clone, Debug, Default, PartialEq)]
        #[kube(group = "kueue.x-k8s.io", version = "v1beta2", schema = "disabled", derive = "PartialEq", $($kube)*)]
        $(#[$attr])*
        $vis struct $spec $body
    };
}

mod admissioncheck;
mod conditions;
mod provisioning;
mod quantity;
mod queues;
pub mod validation;
mod workload;

pub use admissioncheck::*;
pub use conditions::*;
pub use provisioning::*;
pub use quantity::*;
pub use queues::*;
pub use workload::*;

/// API group of every Kueue kind.
pub const KUEUE_GROUP: &str = "kueue.x-k8s.io";
/// The one Kueue API version this crate speaks.
pub const KUEUE_VERSION: &str = "v1beta2";

#[cfg(test)]
mod wire_tests;

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

mod admissioncheck;
mod conditions;
mod provisioning;
mod quantity;
mod queues;
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

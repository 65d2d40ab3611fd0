//! The reference ProvisioningRequest admission check (work in progress).
//!
//! It will admit a Workload only once cluster-autoscaler has provisioned capacity for all of its
//! pods, accepting Kueue's own `ProvisioningRequestConfig` as parameters.

/// The controllerName this controller answers by default.
///
/// Never Kueue's `kueue.x-k8s.io/provisioning-request`: Kueue's built-in controller always serves
/// that name while the ProvisioningRequest API exists, and deletes requests it does not own.
pub const DEFAULT_CONTROLLER_NAME: &str = "kueue-admission-checks.dev/provisioning-request";

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde::{Deserialize, Serialize};

kueue_kind! {
    [kind = "AdmissionCheck", status = "AdmissionCheckStatus"]
    /// `AdmissionCheck.spec`: which controller answers the check, and with which parameters.
    ///
    /// Cluster scoped. `controllerName` is immutable, so a cache of "checks that are mine" keyed by
    /// name stays correct for the lifetime of the object.
    #[serde(rename_all = "camelCase")]
    pub struct AdmissionCheckSpec {
        /// Names the controller that answers this check (1 to 253 characters, immutable).
        pub controller_name: String,
        /// Optional reference to a cluster-scoped object holding the check's parameters.
        pub parameters: Option<AdmissionCheckParametersReference>,
    }
}

/// `AdmissionCheck.spec.parameters`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct AdmissionCheckParametersReference {
    /// API group of the parameters object (for example `kueue.x-k8s.io`).
    pub api_group: String,
    /// Kind of the parameters object (for example `ProvisioningRequestConfig`).
    pub kind: String,
    /// Name of the cluster-scoped parameters object.
    pub name: String,
}

/// `AdmissionCheck.status`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct AdmissionCheckStatus {
    /// Kueue reads only the `Active` condition; the controller that owns the check must set it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// The condition type Kueue reads on an AdmissionCheck.
pub const ADMISSION_CHECK_ACTIVE: &str = "Active";

impl AdmissionCheck {
    /// Its `Active` condition, if any controller wrote one.
    pub fn active_condition(&self) -> Option<&Condition> {
        self.status
            .as_ref()
            .and_then(|s| crate::api::find_condition(&s.conditions, ADMISSION_CHECK_ACTIVE))
    }
}

//! Where budgets and ledgers live: ConfigMaps in the controller's namespace, out of reach of the
//! tenants whose spending they record. Each ledger is the SDK's [`OwnedConfigMap`], written with
//! optimistic concurrency. Unit tests run this same code against the SDK's
//! [`MemoryApi`](kueue_admission_sdk::testing::MemoryApi), an API server in memory, so no trait
//! stands between the check and its storage.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use kueue_admission_sdk::configmap_store::OwnedConfigMap;
pub use kueue_admission_sdk::configmap_store::{Saved, Versioned};
use ledger_common::read_config_map;

use crate::Error;
use crate::ledger::BudgetLedger;
use crate::window::Budget;

/// Label on each ledger ConfigMap; its value is the namespace whose spending it records.
pub const LEDGER_LABEL: &str = "kueue-admission-checks.dev/budget-ledger-for";

/// Budgets in one ConfigMap (tenant namespace → `credits/day` or `credits/week`), and one ledger
/// ConfigMap per tenant namespace, all in the controller's namespace.
#[derive(Clone, Debug)]
pub struct ConfigMapBackend {
    /// Namespace of the budgets and the ledgers.
    pub namespace: String,
    /// Name of the budgets ConfigMap, written by people.
    pub budgets: String,
    /// Ledgers are named this prefix plus the tenant namespace; written by the check only.
    pub ledger_prefix: String,
}

impl ConfigMapBackend {
    /// The ledger ConfigMap of `namespace`: the check's only when labelled
    /// [`LEDGER_LABEL`]`=<namespace>`.
    pub fn ledger_of(&self, namespace: &str) -> OwnedConfigMap {
        let name = format!("{}{namespace}", self.ledger_prefix);
        OwnedConfigMap::new(&self.namespace, name, LEDGER_LABEL, namespace)
    }

    /// The budget of a namespace: `Ok(Err(message))` when it has none or it is malformed.
    pub async fn budget(
        &self,
        client: &Client,
        namespace: &str,
    ) -> Result<Result<Budget, String>, Error> {
        let where_ = format!("the budgets ConfigMap {}/{}", self.namespace, self.budgets);
        let Some(data) = read_config_map(client, &self.namespace, &self.budgets).await? else {
            return Ok(Err(format!("{where_} does not exist")));
        };
        let Some(value) = data.get(namespace) else {
            return Ok(Err(format!(
                "namespace {namespace} has no budget: {where_} has no key {namespace:?}"
            )));
        };
        Ok(value.parse().map_err(|e| {
            format!("the budget of namespace {namespace} in {where_} is invalid: {e}")
        }))
    }

    /// A namespace's ledger and its version; an empty ledger without version if there is none.
    pub async fn load(
        &self,
        client: &Client,
        namespace: &str,
    ) -> Result<Versioned<BudgetLedger>, Error> {
        let ledger = self.ledger_of(namespace);
        Ok(ledger
            .load(client, BudgetLedger::from_config_map_data)
            .await?)
    }

    /// Writes a namespace's ledger if it is still at `version` (creates it when `None`).
    pub async fn save(
        &self,
        client: &Client,
        namespace: &str,
        ledger: &BudgetLedger,
        version: Option<&str>,
    ) -> Result<Saved, Error> {
        let data = ledger.to_config_map_data();
        Ok(self
            .ledger_of(namespace)
            .save(client, data, version)
            .await?)
    }

    /// The namespaces that have a ledger.
    pub async fn ledgers(&self, client: &Client) -> Result<Vec<String>, Error> {
        let list = Api::<ConfigMap>::namespaced(client.clone(), &self.namespace)
            .list(&ListParams::default().labels(LEDGER_LABEL))
            .await?;
        // Only ledgers under this check's names: another prefix's are another instance's.
        Ok(list
            .items
            .iter()
            .filter_map(|cm| {
                let ns = cm.labels().get(LEDGER_LABEL)?;
                (cm.name_any() == self.ledger_of(ns).name).then(|| ns.clone())
            })
            .collect())
    }

    /// `namespace/name` of a namespace's ledger, for messages.
    pub fn ledger_name(&self, namespace: &str) -> String {
        self.ledger_of(namespace).to_string()
    }
}

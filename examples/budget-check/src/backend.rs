//! Where budgets and ledgers live: ConfigMaps in the controller's namespace, out of reach of the
//! tenants whose spending they record. Ledgers are written with optimistic concurrency. The
//! [`Backend`] trait is the seam that lets unit tests run the whole check against memory.

use std::collections::BTreeMap;
use std::future::Future;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};
use kueue_admission_sdk::api::Workload;

use crate::error::Error;
use crate::ledger::BudgetLedger;
use crate::window::Budget;

/// Label on each ledger ConfigMap; its value is the namespace whose spending it records.
pub const LEDGER_LABEL: &str = "kueue-admission-checks.dev/budget-ledger-for";

/// Whether a ConfigMap is the ledger of `namespace` (the label this check writes on it), and
/// so may be read as one and overwritten.
pub fn is_ledger_of(cm: &ConfigMap, namespace: &str) -> bool {
    cm.labels().get(LEDGER_LABEL).map(String::as_str) == Some(namespace)
}

/// A value with the version it was read at (`None`: the object does not exist yet).
#[derive(Clone, Debug, PartialEq)]
pub struct Versioned<T> {
    /// The value.
    pub value: T,
    /// The `resourceVersion` it was read at; a save must carry it.
    pub version: Option<String>,
}

/// Whether a save landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Saved {
    /// Written.
    Written,
    /// Someone wrote the ledger since it was read (409): read again and decide again.
    Conflict,
}

/// What the check reads and writes. Every call gets the runtime's client.
pub trait Backend: Send + Sync + 'static {
    /// The budget of a namespace: `Ok(Err(message))` when it has none or it is malformed.
    fn budget(
        &self,
        client: &Client,
        namespace: &str,
    ) -> impl Future<Output = Result<Result<Budget, String>, Error>> + Send;

    /// A namespace's ledger and its version; an empty ledger without version if there is none.
    fn load(
        &self,
        client: &Client,
        namespace: &str,
    ) -> impl Future<Output = Result<Versioned<BudgetLedger>, Error>> + Send;

    /// Writes a namespace's ledger if it is still at `version` (creates it when `None`).
    fn save(
        &self,
        client: &Client,
        namespace: &str,
        ledger: &BudgetLedger,
        version: Option<&str>,
    ) -> impl Future<Output = Result<Saved, Error>> + Send;

    /// The namespaces that have a ledger.
    fn ledgers(&self, client: &Client) -> impl Future<Output = Result<Vec<String>, Error>> + Send;

    /// Reads a Workload fresh from the API server (not from a cache: a charge is judged
    /// against a Workload read after the ledger, never before).
    fn workload(
        &self,
        client: &Client,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<Workload>, Error>> + Send;

    /// `namespace/name` of a namespace's ledger, for messages.
    fn ledger_name(&self, namespace: &str) -> String;
}

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
    fn api(&self, client: &Client) -> Api<ConfigMap> {
        Api::namespaced(client.clone(), &self.namespace)
    }

    fn ledger_of(&self, namespace: &str) -> String {
        format!("{}{namespace}", self.ledger_prefix)
    }
}

impl Backend for ConfigMapBackend {
    async fn budget(
        &self,
        client: &Client,
        namespace: &str,
    ) -> Result<Result<Budget, String>, Error> {
        let where_ = format!("the budgets ConfigMap {}/{}", self.namespace, self.budgets);
        let Some(cm) = self.api(client).get_opt(&self.budgets).await? else {
            return Ok(Err(format!("{where_} does not exist")));
        };
        let data = cm.data.unwrap_or_default();
        let Some(value) = data.get(namespace) else {
            return Ok(Err(format!(
                "namespace {namespace} has no budget: {where_} has no key {namespace:?}"
            )));
        };
        Ok(value.parse().map_err(|e| {
            format!("the budget of namespace {namespace} in {where_} is invalid: {e}")
        }))
    }

    async fn load(
        &self,
        client: &Client,
        namespace: &str,
    ) -> Result<Versioned<BudgetLedger>, Error> {
        let Some(cm) = self.api(client).get_opt(&self.ledger_of(namespace)).await? else {
            return Ok(Versioned {
                value: BudgetLedger::default(),
                version: None,
            });
        };
        // Found by name only: it is ours only if labelled as this namespace's ledger.
        if !is_ledger_of(&cm, namespace) {
            return Err(Error::NotALedger(
                self.ledger_name(namespace),
                format!("{LEDGER_LABEL}={namespace}"),
            ));
        }
        let version = cm.resource_version();
        let ledger =
            BudgetLedger::from_config_map_data(&cm.data.unwrap_or_default()).map_err(|source| {
                Error::CorruptLedger {
                    configmap: self.ledger_name(namespace),
                    source,
                }
            })?;
        Ok(Versioned {
            value: ledger,
            version,
        })
    }

    async fn save(
        &self,
        client: &Client,
        namespace: &str,
        ledger: &BudgetLedger,
        version: Option<&str>,
    ) -> Result<Saved, Error> {
        let name = self.ledger_of(namespace);
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(self.namespace.clone()),
                resource_version: version.map(str::to_string),
                labels: Some(BTreeMap::from([(
                    LEDGER_LABEL.to_string(),
                    namespace.to_string(),
                )])),
                ..Default::default()
            },
            data: Some(ledger.to_config_map_data()),
            ..Default::default()
        };
        let api = self.api(client);
        let written = match version {
            None => api.create(&PostParams::default(), &cm).await,
            Some(_) => api.replace(&name, &PostParams::default(), &cm).await,
        };
        match written {
            Ok(_) => Ok(Saved::Written),
            // 409: a stale resourceVersion, or someone created the ledger first.
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(Saved::Conflict),
            Err(e) => Err(e.into()),
        }
    }

    async fn ledgers(&self, client: &Client) -> Result<Vec<String>, Error> {
        let list = self
            .api(client)
            .list(&ListParams::default().labels(LEDGER_LABEL))
            .await?;
        // Only ledgers under this check's names: another prefix's are another instance's.
        Ok(list
            .items
            .iter()
            .filter_map(|cm| {
                let ns = cm.labels().get(LEDGER_LABEL)?;
                (cm.name_any() == self.ledger_of(ns)).then(|| ns.clone())
            })
            .collect())
    }

    async fn workload(
        &self,
        client: &Client,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Workload>, Error> {
        Ok(Api::<Workload>::namespaced(client.clone(), namespace)
            .get_opt(name)
            .await?)
    }

    fn ledger_name(&self, namespace: &str) -> String {
        format!("{}/{}", self.namespace, self.ledger_of(namespace))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_map(labels: &[(&str, &str)]) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some("budget-ledger-team".into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn only_a_labelled_ledger_of_that_namespace_is_ours() {
        assert!(is_ledger_of(&config_map(&[(LEDGER_LABEL, "team")]), "team"));
        // The right name, someone else's ConfigMap.
        assert!(!is_ledger_of(&config_map(&[]), "team"));
        assert!(!is_ledger_of(&config_map(&[("app", "x")]), "team"));
        // Another namespace's ledger (prefixes that make names meet).
        assert!(!is_ledger_of(
            &config_map(&[(LEDGER_LABEL, "other")]),
            "team"
        ));
    }
}

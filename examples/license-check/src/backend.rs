//! Where the pool and the ledger live: two ConfigMaps, read and written with optimistic
//! concurrency. The [`Backend`] trait is the seam that lets unit tests run the whole check
//! against memory.

use std::collections::BTreeMap;
use std::future::Future;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};
use kueue_admission_sdk::api::Workload;

use crate::error::Error;
use crate::ledger::Ledger;
use crate::pool::Pool;

/// Label on the ledger ConfigMap, so people and tools can find it.
pub const LEDGER_LABEL: &str = "kueue-admission-checks.dev/license-ledger";

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
    /// The pool: `Ok(Err(message))` when it is missing or malformed (a message for the user).
    fn pool(
        &self,
        client: &Client,
    ) -> impl Future<Output = Result<Result<Pool, String>, Error>> + Send;

    /// The ledger and its version; an empty ledger without version if there is none yet.
    fn load(
        &self,
        client: &Client,
    ) -> impl Future<Output = Result<Versioned<Ledger>, Error>> + Send;

    /// Writes the ledger if it is still at `version` (creates it when `version` is `None`).
    fn save(
        &self,
        client: &Client,
        ledger: &Ledger,
        version: Option<&str>,
    ) -> impl Future<Output = Result<Saved, Error>> + Send;

    /// Reads a Workload fresh from the API server (not from a cache: a holding is judged
    /// against a Workload read after the ledger, never before).
    fn workload(
        &self,
        client: &Client,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<Workload>, Error>> + Send;

    /// `namespace/name` of the ledger, for messages.
    fn ledger_name(&self) -> String;
}

/// Whether a ConfigMap is a ledger (the label this check writes on it), and so may be read as
/// one and overwritten.
pub fn is_ledger(cm: &ConfigMap) -> bool {
    cm.labels().get(LEDGER_LABEL).map(String::as_str) == Some("true")
}

/// The pool and the ledger as ConfigMaps in one namespace.
#[derive(Clone, Debug)]
pub struct ConfigMapBackend {
    /// Namespace of both ConfigMaps.
    pub namespace: String,
    /// Name of the pool ConfigMap (feature → count), written by people.
    pub pool: String,
    /// Name of the ledger ConfigMap (Workload uid → holding), written by the check only.
    pub ledger: String,
}

impl ConfigMapBackend {
    fn api(&self, client: &Client) -> Api<ConfigMap> {
        Api::namespaced(client.clone(), &self.namespace)
    }
}

impl Backend for ConfigMapBackend {
    async fn pool(&self, client: &Client) -> Result<Result<Pool, String>, Error> {
        let where_ = format!(
            "the license pool ConfigMap {}/{}",
            self.namespace, self.pool
        );
        let Some(cm) = self.api(client).get_opt(&self.pool).await? else {
            return Ok(Err(format!("{where_} does not exist")));
        };
        let data = cm.data.unwrap_or_default();
        Ok(Pool::from_config_map_data(&data).map_err(|e| format!("{where_} is invalid: {e}")))
    }

    async fn load(&self, client: &Client) -> Result<Versioned<Ledger>, Error> {
        let Some(cm) = self.api(client).get_opt(&self.ledger).await? else {
            return Ok(Versioned {
                value: Ledger::default(),
                version: None,
            });
        };
        // Found by name only: it is ours only if labelled as a ledger.
        if !is_ledger(&cm) {
            return Err(Error::NotALedger(
                self.ledger_name(),
                format!("{LEDGER_LABEL}=true"),
            ));
        }
        let version = cm.resource_version();
        let ledger =
            Ledger::from_config_map_data(&cm.data.unwrap_or_default()).map_err(|source| {
                Error::CorruptLedger {
                    configmap: self.ledger_name(),
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
        ledger: &Ledger,
        version: Option<&str>,
    ) -> Result<Saved, Error> {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(self.ledger.clone()),
                namespace: Some(self.namespace.clone()),
                resource_version: version.map(str::to_string),
                labels: Some(BTreeMap::from([(
                    LEDGER_LABEL.to_string(),
                    "true".to_string(),
                )])),
                ..Default::default()
            },
            data: Some(ledger.to_config_map_data()),
            ..Default::default()
        };
        let api = self.api(client);
        let written = match version {
            None => api.create(&PostParams::default(), &cm).await,
            Some(_) => api.replace(&self.ledger, &PostParams::default(), &cm).await,
        };
        match written {
            Ok(_) => Ok(Saved::Written),
            // 409: a stale resourceVersion, or someone created the ledger first.
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(Saved::Conflict),
            Err(e) => Err(e.into()),
        }
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

    fn ledger_name(&self) -> String {
        format!("{}/{}", self.namespace, self.ledger)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_labelled_ledger_is_ours() {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some("license-ledger".into());
        // The right name, someone else's ConfigMap.
        assert!(!is_ledger(&cm));
        cm.labels_mut().insert(LEDGER_LABEL.into(), "false".into());
        assert!(!is_ledger(&cm));
        cm.labels_mut().insert(LEDGER_LABEL.into(), "true".into());
        assert!(is_ledger(&cm));
    }
}

//! Where the pool and the ledger live: two ConfigMaps; the ledger is the SDK's
//! [`OwnedConfigMap`], read and written with optimistic concurrency. Unit tests run this real
//! backend against the SDK's [`MemoryApi`](kueue_admission_sdk::testing::MemoryApi), an API
//! server in memory, so there is no seam to replace it.

use kube::Client;
use kueue_admission_sdk::configmap_store::OwnedConfigMap;
pub use kueue_admission_sdk::configmap_store::{Saved, Versioned};
use ledger_common::read_config_map;

use crate::Error;
use crate::ledger::Ledger;
use crate::pool::Pool;

/// Label on the ledger ConfigMap (value `true`), so people and tools can find it and the check
/// never overwrites a ConfigMap of that name that is not its ledger.
pub const LEDGER_LABEL: &str = "kueue-admission-checks.dev/license-ledger";

/// The pool and the ledger as ConfigMaps in one namespace. Every call gets the runtime's client.
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
    /// The ledger ConfigMap: the check's only when labelled [`LEDGER_LABEL`]`=true`.
    pub fn ledger_configmap(&self) -> OwnedConfigMap {
        OwnedConfigMap::new(&self.namespace, &self.ledger, LEDGER_LABEL, "true")
    }

    /// The pool: `Ok(Err(message))` when it is missing or malformed (a message for the user).
    pub async fn pool(&self, client: &Client) -> Result<Result<Pool, String>, Error> {
        let where_ = format!(
            "the license pool ConfigMap {}/{}",
            self.namespace, self.pool
        );
        let Some(data) = read_config_map(client, &self.namespace, &self.pool).await? else {
            return Ok(Err(format!("{where_} does not exist")));
        };
        Ok(Pool::from_config_map_data(&data).map_err(|e| format!("{where_} is invalid: {e}")))
    }

    /// The ledger and its version; an empty ledger without version if there is none yet.
    pub async fn load(&self, client: &Client) -> Result<Versioned<Ledger>, Error> {
        let ledger = self.ledger_configmap();
        Ok(ledger.load(client, Ledger::from_config_map_data).await?)
    }

    /// Writes the ledger if it is still at `version` (creates it when `version` is `None`).
    pub async fn save(
        &self,
        client: &Client,
        ledger: &Ledger,
        version: Option<&str>,
    ) -> Result<Saved, Error> {
        let data = ledger.to_config_map_data();
        Ok(self.ledger_configmap().save(client, data, version).await?)
    }

    /// `namespace/name` of the ledger, for messages.
    pub fn ledger_name(&self) -> String {
        self.ledger_configmap().to_string()
    }
}

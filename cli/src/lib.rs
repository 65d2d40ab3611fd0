//! `kueue-ac explain`: where a Kueue Workload stands and what would move it; `kueue-ac
//! reactivate`: queue again a Workload Kueue deactivated.
//!
//! Layers: [`fetch`] reads (get and list only), [`report`] turns what was read into a
//! [`report::Report`] (pure, time passed in), [`render`] prints it as text; `-o json` prints the
//! report itself. [`mod@reactivate`] plans a reactivation (pure) and sends it.

pub mod fetch;
pub mod reactivate;
pub mod render;
pub mod report;

/// What can go wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request to the API server failed (403: the RBAC in the README is missing).
    #[error("API request failed: {0}")]
    Api(#[from] kube::Error),
    /// The Workload or Job does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// The Job exists but Kueue made no Workload for it.
    #[error("{0}")]
    NoWorkload(String),
    /// Kubeconfig or flags unusable.
    #[error("configuration: {0}")]
    Config(String),
    /// The command does not apply to the Workload as it is (e.g. nothing to reactivate).
    #[error("{0}")]
    Refused(String),
}

impl Error {
    /// A stable label for each kind.
    pub fn label(&self) -> &'static str {
        match self {
            Error::Api(_) => "api",
            Error::NotFound(_) => "not_found",
            Error::NoWorkload(_) => "no_workload",
            Error::Config(_) => "config",
            Error::Refused(_) => "refused",
        }
    }
}

/// Reads and reports on `target` in `namespace` as of now.
pub async fn explain(
    client: &kube::Client,
    namespace: &str,
    target: &fetch::Target,
) -> Result<report::Report, Error> {
    let snapshot = fetch::snapshot(client, namespace, target).await?;
    Ok(report::report(
        &snapshot,
        k8s_openapi::jiff::Timestamp::now(),
    ))
}

/// Queues again the Workload `target` names in `namespace`, which Kueue deactivated (see
/// [`mod@reactivate`]); `keep_attempts` keeps the checks' attempt records. Returns what was done.
pub async fn reactivate(
    client: &kube::Client,
    namespace: &str,
    target: &fetch::Target,
    keep_attempts: bool,
) -> Result<String, Error> {
    let wl = fetch::workload(client, namespace, target).await?;
    let plan = reactivate::plan(&wl, keep_attempts).map_err(Error::Refused)?;
    reactivate::apply(client, &wl, &plan).await?;
    Ok(reactivate::describe(
        namespace,
        &kube::ResourceExt::name_any(&wl),
        &plan,
    ))
}

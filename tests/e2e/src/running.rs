//! One handle for everything a test runs in its own process (an SDK check, the provisioning
//! controller, the autoscaler simulator): stopped as SIGTERM would, killed as a crash would,
//! and asked for its metrics (plain, or authenticated over HTTPS with [`crate::scraper_token`])
//! and readiness.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use futures::FutureExt;
use futures::future::BoxFuture;
use kube::Client;
use kueue_admission_sdk::{AdmissionCheckController, RuntimeConfig};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How a run ended: `Err` with the error's text.
type Ended = Arc<Mutex<Option<std::result::Result<(), String>>>>;

/// Something running in this test process until it is stopped or killed (or dropped, which
/// kills it: nothing a test started outlives the test).
#[derive(Debug)]
#[must_use = "dropping a Running kills what it runs"]
pub struct Running {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
    /// Where its `/metrics` is served, if anywhere.
    pub http: Option<SocketAddr>,
    /// Where its probes `/healthz` and `/readyz` are served, if anywhere (plain HTTP).
    pub health: Option<SocketAddr>,
    /// `/metrics` is HTTPS and needs a bearer token.
    metrics_tls: bool,
    ended: Ended,
}

impl Running {
    /// Runs `check` with the SDK runtime (`run_until`) until stopped.
    pub fn check<C: AdmissionCheckController>(
        client: Client,
        check: C,
        config: RuntimeConfig,
    ) -> Self {
        let http = config.metrics_address;
        let health = config.health_address;
        let metrics_tls = matches!(
            config.metrics_security,
            kueue_admission_sdk::MetricsSecurity::Authenticated { .. }
        );
        let mut running = Self::spawn(http, move |shutdown| async move {
            kueue_admission_sdk::run_until(client, check, config, shutdown)
                .await
                .map_err(|e| e.to_string())
        });
        running.health = health;
        running.metrics_tls = metrics_tls;
        running
    }

    /// Runs what `run` returns, given the future that resolves when the test stops it; it serves
    /// plain metrics and probes at `http`, if anywhere.
    pub fn spawn<F, Fut>(http: Option<SocketAddr>, run: F) -> Self
    where
        F: FnOnce(BoxFuture<'static, ()>) -> Fut,
        Fut: Future<Output = std::result::Result<(), String>> + Send + 'static,
    {
        let (stop, stopped) = oneshot::channel::<()>();
        let shutdown = async move {
            let _ = stopped.await;
        }
        .boxed();
        let ended: Ended = Arc::default();
        let slot = ended.clone();
        let run = run(shutdown);
        let task = tokio::spawn(async move {
            let result = run.await;
            *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(result);
        });
        Self {
            stop: Some(stop),
            task,
            http,
            health: http,
            metrics_tls: false,
            ended,
        }
    }

    /// How it ended, once it has: "stopped", or "stopped with an error: ...".
    pub fn exited(&self) -> Option<String> {
        let ended = self.ended.lock().unwrap_or_else(|p| p.into_inner());
        ended.as_ref().map(|result| match result {
            Ok(()) => "stopped".to_string(),
            Err(e) => format!("stopped with an error: {e}"),
        })
    }

    /// Stops it as SIGTERM does and waits until it has; fails if it does not stop within 30 s
    /// or ended with an error.
    pub async fn stop(mut self) -> Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(30), &mut self.task)
            .await
            .context("it did not stop within 30 s")??;
        let ended = self.ended.lock().unwrap_or_else(|p| p.into_inner()).take();
        match ended {
            Some(Err(e)) => bail!("it stopped with an error: {e}"),
            _ => Ok(()),
        }
    }

    /// Stops each in turn, as [`Running::stop`]; the first error, after trying them all.
    pub async fn stop_all(all: impl IntoIterator<Item = Running>) -> Result<()> {
        let mut first_error = None;
        for running in all {
            if let Err(e) = running.stop().await {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Waits until it ends by itself (no stop is sent), at most `within`, and returns how:
    /// `Err` with the error's text.
    pub async fn ended_by_itself(
        mut self,
        within: Duration,
    ) -> Result<std::result::Result<(), String>> {
        tokio::time::timeout(within, &mut self.task)
            .await
            .with_context(|| format!("it did not end within {within:?}"))??;
        let ended = self.ended.lock().unwrap_or_else(|p| p.into_inner()).take();
        ended.context("it ended without an outcome")
    }

    /// Ends it at once without any clean-up, as a crash or `kill -9` would.
    pub async fn kill(mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
    }

    /// Where its `/metrics` is served; an error if nowhere.
    pub fn addr(&self) -> Result<SocketAddr> {
        self.http.context("it serves no metrics")
    }

    /// Where its probes are served; an error if nowhere.
    pub fn health_addr(&self) -> Result<SocketAddr> {
        self.health.context("it serves no probes")
    }

    /// Its `/metrics` text: over HTTPS with [`crate::scraper_token`] when its metrics are
    /// authenticated.
    pub async fn metrics(&self) -> Result<String> {
        let addr = self.addr()?;
        let (status, body) = if self.metrics_tls {
            let token = crate::scraper_token().await?;
            crate::https_get(addr, "/metrics", Some(&token)).await?
        } else {
            crate::http_get(addr, "/metrics").await?
        };
        ensure!(status == 200, "GET /metrics answered {status}: {body}");
        Ok(body)
    }

    /// One sample of its metrics, if the series exists.
    pub async fn metric(&self, series: &str) -> Result<Option<f64>> {
        Ok(crate::metric_sample(&self.metrics().await?, series))
    }

    /// The status code of `/readyz`, or `None` when nothing answers.
    pub async fn readyz(&self) -> Option<u16> {
        let addr = self.health?;
        crate::http_get(addr, "/readyz").await.ok().map(|(s, _)| s)
    }

    /// Waits until `/readyz` answers 200 (its caches synced).
    pub async fn wait_ready(&self) -> Result<()> {
        let deadline = tokio::time::Instant::now() + crate::DEFAULT_TIMEOUT;
        while self.readyz().await != Some(200) {
            ensure!(
                tokio::time::Instant::now() < deadline,
                "not ready within {:?}",
                crate::DEFAULT_TIMEOUT
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

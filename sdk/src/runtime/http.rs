//! `/metrics`, `/healthz` and `/readyz` over HTTP/1 (hyper).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tracing::{info, warn};

/// What the endpoints report.
#[derive(Debug)]
pub(crate) struct Health {
    pub registry: Registry,
    /// Set once the Workload and AdmissionCheck caches have synced.
    pub ready: AtomicBool,
    /// Why the runtime waits before it can even start its watches (e.g. a Kueue too old),
    /// shown by `/readyz` instead of "caches not synced yet".
    waiting_for: RwLock<Option<String>>,
}

impl Health {
    pub(crate) fn new(registry: Registry) -> Self {
        Health {
            registry,
            ready: AtomicBool::new(false),
            waiting_for: RwLock::new(None),
        }
    }

    pub(crate) fn set_waiting_for(&self, why: Option<String>) {
        *self.waiting_for.write().unwrap_or_else(|p| p.into_inner()) = why;
    }

    pub(crate) fn waiting_for(&self) -> Option<String> {
        self.waiting_for
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Serves the endpoints on `addr` (if any) until the returned task is dropped. Binding fails
/// loudly: a controller whose probes cannot be served would be killed by its liveness probe
/// anyway, so better to say why.
pub(crate) async fn start(
    addr: Option<SocketAddr>,
    health: &Arc<Health>,
) -> Result<Option<super::tasks::AbortOnDrop<()>>, crate::error::Error> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    let listener = TcpListener::bind(addr)
        .await
        .map_err(crate::error::Error::Serve)?;
    let server = tokio::spawn(serve(listener, health.clone()));
    Ok(Some(super::tasks::AbortOnDrop::new(server)))
}

async fn serve(listener: TcpListener, health: Arc<Health>) {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "serving /metrics, /healthz and /readyz");
    }
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(conn) => conn,
            Err(e) => {
                warn!(error = %e, "accepting an HTTP connection");
                continue;
            }
        };
        let health = health.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| respond(req, health.clone()));
            if let Err(e) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                warn!(error = %e, "serving an HTTP connection");
            }
        });
    }
}

async fn respond(
    req: Request<Incoming>,
    health: Arc<Health>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let text = |status: StatusCode, body: String, content_type: &'static str| {
        let mut resp = Response::new(Full::new(Bytes::from(body)));
        *resp.status_mut() = status;
        resp.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static(content_type),
        );
        resp
    };
    const PLAIN: &str = "text/plain; charset=utf-8";
    if req.method() != Method::GET {
        return Ok(text(
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET\n".into(),
            PLAIN,
        ));
    }
    Ok(match req.uri().path() {
        "/metrics" => {
            let mut body = String::new();
            match prometheus_client::encoding::text::encode(&mut body, &health.registry) {
                Ok(()) => text(
                    StatusCode::OK,
                    body,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                ),
                Err(e) => text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("encoding metrics: {e}\n"),
                    PLAIN,
                ),
            }
        }
        "/healthz" => text(StatusCode::OK, "ok\n".into(), PLAIN),
        "/readyz" if health.ready.load(Ordering::Acquire) => {
            text(StatusCode::OK, "ok\n".into(), PLAIN)
        }
        "/readyz" => text(
            StatusCode::SERVICE_UNAVAILABLE,
            match health.waiting_for() {
                Some(why) => format!("not started: {why}\n"),
                None => "caches not synced yet\n".into(),
            },
            PLAIN,
        ),
        _ => text(StatusCode::NOT_FOUND, "not found\n".into(), PLAIN),
    })
}

//! `/metrics` (HTTPS with authentication by default, see [`MetricsSecurity`]), `/healthz` and
//! `/readyz` (plain) over HTTP/1 (hyper).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use kube::Client;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

use super::config::{MetricsSecurity, RuntimeConfig, TlsSource};
use super::metrics_auth::{Gate, Verdict};
use super::tasks::AbortOnDrop;
use crate::error::Error;

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

/// How one listener serves `/metrics`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum MetricsOn {
    /// Not here.
    No,
    /// Plain HTTP, no authentication.
    Plain,
    /// HTTPS with this certificate, each request reviewed by the API server.
    Authenticated(TlsSource),
}

/// One address the runtime listens on, and what it serves there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Listener {
    pub addr: SocketAddr,
    pub metrics: MetricsOn,
    /// `/healthz` and `/readyz`.
    pub probes: bool,
}

/// The listeners `config` asks for; refused when the probes (plain, for the kubelet) and
/// authenticated metrics are given one address.
pub(crate) fn listeners(config: &RuntimeConfig) -> Result<Vec<Listener>, Error> {
    let metrics = match &config.metrics_security {
        MetricsSecurity::Plain => MetricsOn::Plain,
        MetricsSecurity::Authenticated { tls } => MetricsOn::Authenticated(tls.clone()),
    };
    // Port 0 is "any free port": two of those are two listeners.
    let shared = |m: SocketAddr, h: SocketAddr| m == h && m.port() != 0;
    Ok(match (config.metrics_address, config.health_address) {
        (Some(m), Some(h)) if shared(m, h) => {
            if metrics != MetricsOn::Plain {
                return Err(Error::Config(format!(
                    "metrics and probes are both given {m}, but the probes are plain HTTP \
                     without authentication (the kubelet has no token) and the metrics HTTPS \
                     with it: give the probes another address (--health-address), or serve \
                     the metrics plain (--metrics-secure=false)"
                )));
            }
            vec![Listener {
                addr: m,
                metrics,
                probes: true,
            }]
        }
        (m, h) => m
            .map(|addr| Listener {
                addr,
                metrics,
                probes: false,
            })
            .into_iter()
            .chain(h.map(|addr| Listener {
                addr,
                metrics: MetricsOn::No,
                probes: true,
            }))
            .collect(),
    })
}

/// Serves the endpoints `config` asks for until the returned tasks are dropped. Binding fails
/// loudly: a controller whose probes cannot be served would be killed by its liveness probe
/// anyway, so better to say why. `client` reviews the metrics scrapers' tokens.
pub(crate) async fn start(
    config: &RuntimeConfig,
    health: &Arc<Health>,
    client: &Client,
) -> Result<Vec<AbortOnDrop<()>>, Error> {
    let mut servers = Vec::new();
    for listener in listeners(config)? {
        // The certificate first: a bad file is a configuration error, not a bound port.
        let route = Route {
            metrics: !matches!(listener.metrics, MetricsOn::No),
            probes: listener.probes,
            gate: match &listener.metrics {
                MetricsOn::Authenticated(_) => Some(Gate::new(client.clone())),
                _ => None,
            },
        };
        let tls = match &listener.metrics {
            MetricsOn::Authenticated(source) => {
                Some(TlsAcceptor::from(super::tls::server_config(source)?))
            }
            _ => None,
        };
        let bound = TcpListener::bind(listener.addr)
            .await
            .map_err(Error::Serve)?;
        let addr = bound.local_addr().map_err(Error::Serve)?;
        let paths = match (route.metrics, route.probes) {
            (true, true) => "/metrics, /healthz and /readyz",
            (true, false) => "/metrics",
            _ => "/healthz and /readyz",
        };
        match (&listener.metrics, &tls) {
            (MetricsOn::Plain, _) => warn!(
                %addr,
                "serving /metrics over plain HTTP without authentication: anyone who reaches \
                 the address reads them"
            ),
            (MetricsOn::Authenticated(_), _) => info!(
                %addr,
                "serving {paths} over HTTPS; each request needs a bearer token allowed to get \
                 /metrics"
            ),
            (MetricsOn::No, _) => info!(%addr, "serving {paths} over plain HTTP"),
        }
        servers.push(AbortOnDrop::new(tokio::spawn(serve(
            bound,
            tls,
            Arc::new(route),
            health.clone(),
        ))));
    }
    Ok(servers)
}

/// What one listener answers.
#[derive(Debug)]
struct Route {
    metrics: bool,
    probes: bool,
    /// Set for authenticated metrics.
    gate: Option<Gate>,
}

/// How long a client may take over its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    route: Arc<Route>,
    health: Arc<Health>,
) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(conn) => conn,
            Err(e) => {
                warn!(error = %e, "accepting an HTTP connection");
                continue;
            }
        };
        let (route, health, tls) = (route.clone(), health.clone(), tls.clone());
        tokio::spawn(async move {
            match tls {
                None => connection(stream, route, health).await,
                Some(tls) => {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(stream)).await {
                        Ok(Ok(stream)) => connection(stream, route, health).await,
                        // Port scanners and TCP probes end here; nothing to warn about.
                        Ok(Err(e)) => debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => debug!(%peer, "TLS handshake timed out"),
                    }
                }
            }
        });
    }
}

async fn connection<IO>(io: IO, route: Arc<Route>, health: Arc<Health>)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |req| respond(req, route.clone(), health.clone()));
    if let Err(e) = http1::Builder::new()
        .serve_connection(TokioIo::new(io), service)
        .await
    {
        warn!(error = %e, "serving an HTTP connection");
    }
}

const PLAIN: &str = "text/plain; charset=utf-8";

fn text(status: StatusCode, body: String, content_type: &'static str) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    resp
}

/// The answer to a refused or failed review (`None`: allowed).
fn refusal(verdict: Result<Verdict, String>) -> Option<Response<Full<Bytes>>> {
    match verdict {
        Ok(Verdict::Allowed) => None,
        Ok(Verdict::Unauthenticated(why)) => {
            let mut resp = text(StatusCode::UNAUTHORIZED, format!("{why}\n"), PLAIN);
            resp.headers_mut().insert(
                hyper::header::WWW_AUTHENTICATE,
                hyper::header::HeaderValue::from_static("Bearer"),
            );
            Some(resp)
        }
        Ok(Verdict::Forbidden(why)) => Some(text(StatusCode::FORBIDDEN, format!("{why}\n"), PLAIN)),
        Err(why) => {
            warn!(error = %why, "cannot decide a metrics request");
            Some(text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("{why}\n"),
                PLAIN,
            ))
        }
    }
}

async fn respond(
    req: Request<Incoming>,
    route: Arc<Route>,
    health: Arc<Health>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    if req.method() != Method::GET {
        return Ok(text(
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET\n".into(),
            PLAIN,
        ));
    }
    Ok(match req.uri().path() {
        "/metrics" if route.metrics => {
            if let Some(gate) = &route.gate {
                let authorization = req
                    .headers()
                    .get(hyper::header::AUTHORIZATION)
                    .map(|v| v.as_bytes());
                if let Some(refused) = refusal(gate.check(authorization).await) {
                    return Ok(refused);
                }
            }
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
        "/healthz" if route.probes => text(StatusCode::OK, "ok\n".into(), PLAIN),
        "/readyz" if route.probes && health.ready.load(Ordering::Acquire) => {
            text(StatusCode::OK, "ok\n".into(), PLAIN)
        }
        "/readyz" if route.probes => text(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{DEFAULT_HEALTH_ADDRESS, DEFAULT_METRICS_ADDRESS};

    fn addr(s: &str) -> SocketAddr {
        s.parse().expect("an address")
    }

    #[test]
    fn by_default_metrics_and_probes_listen_apart() {
        let plan = listeners(&RuntimeConfig::default()).expect("planned");
        assert_eq!(
            plan,
            vec![
                Listener {
                    addr: DEFAULT_METRICS_ADDRESS,
                    metrics: MetricsOn::Authenticated(TlsSource::SelfSigned),
                    probes: false,
                },
                Listener {
                    addr: DEFAULT_HEALTH_ADDRESS,
                    metrics: MetricsOn::No,
                    probes: true,
                },
            ]
        );
    }

    #[test]
    fn one_address_serves_all_only_when_the_metrics_are_plain() {
        let one = addr("127.0.0.1:9090");
        let plain = RuntimeConfig {
            metrics_address: Some(one),
            health_address: Some(one),
            metrics_security: MetricsSecurity::Plain,
            ..Default::default()
        };
        assert_eq!(
            listeners(&plain).expect("planned"),
            vec![Listener {
                addr: one,
                metrics: MetricsOn::Plain,
                probes: true,
            }]
        );
        let secure = RuntimeConfig {
            metrics_security: MetricsSecurity::Authenticated {
                tls: TlsSource::SelfSigned,
            },
            ..plain.clone()
        };
        let err = listeners(&secure).expect_err("refused");
        assert_eq!(err.label(), "config");
        assert!(err.to_string().contains("--health-address"), "{err}");
        // Two "any free port" addresses are two listeners.
        let any = addr("127.0.0.1:0");
        let free = RuntimeConfig {
            metrics_address: Some(any),
            health_address: Some(any),
            ..secure
        };
        assert_eq!(listeners(&free).expect("planned").len(), 2);
    }

    #[test]
    fn off_serves_nothing_of_it() {
        let none = RuntimeConfig {
            metrics_address: None,
            health_address: None,
            ..Default::default()
        };
        assert!(listeners(&none).expect("planned").is_empty());
        let probes_only = RuntimeConfig {
            metrics_address: None,
            ..Default::default()
        };
        let plan = listeners(&probes_only).expect("planned");
        assert_eq!(plan.len(), 1);
        assert!(plan[0].probes && plan[0].metrics == MetricsOn::No);
    }

    #[test]
    fn refusals_answer_401_with_a_challenge_403_and_503() {
        assert!(refusal(Ok(Verdict::Allowed)).is_none());
        let unauthenticated =
            refusal(Ok(Verdict::Unauthenticated("no token".into()))).expect("refused");
        assert_eq!(unauthenticated.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(
            unauthenticated.headers()[hyper::header::WWW_AUTHENTICATE],
            "Bearer"
        );
        let forbidden = refusal(Ok(Verdict::Forbidden("no".into()))).expect("refused");
        assert_eq!(forbidden.status(), StatusCode::FORBIDDEN);
        let failed = refusal(Err("API down".into())).expect("refused");
        assert_eq!(failed.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
}

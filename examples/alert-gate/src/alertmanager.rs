//! Asking Alertmanager which alerts fire: `GET /api/v2/alerts` for active, unsilenced,
//! uninhibited alerts meeting the gate's matchers, with a deadline, and a short-lived cache so
//! that many Workloads looking at once cost one request per gate.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;

use crate::gate::{AlertGateSpec, FiringAlert};

/// How long one answer serves every Workload of a gate, by default: an alert that starts
/// firing is seen at most this late.
pub const DEFAULT_FRESH_FOR: Duration = Duration::from_secs(2);
/// How long Alertmanager may take to answer.
const DEADLINE: Duration = Duration::from_secs(5);
/// Largest answer read (a firing storm is summarised, not read whole).
const MAX_BODY: usize = 4 << 20;

/// An answer: the firing alerts, or why Alertmanager could not say.
type Answer = Result<Vec<FiringAlert>, String>;
/// Answers by request URL, with when they came.
type Cache = HashMap<String, (Instant, Answer)>;

/// A client for any number of Alertmanagers, with the cache.
#[derive(Debug)]
pub struct Alertmanagers {
    http: Client<HttpConnector, Empty<Bytes>>,
    cache: Mutex<Cache>,
    fresh_for: Duration,
}

impl Default for Alertmanagers {
    fn default() -> Self {
        Self::new(DEFAULT_FRESH_FOR)
    }
}

impl Alertmanagers {
    /// A client whose answers serve every Workload of a gate for `fresh_for` (zero: every
    /// decision asks).
    pub fn new(fresh_for: Duration) -> Self {
        Self {
            http: Client::builder(TokioExecutor::new()).build_http(),
            cache: Mutex::default(),
            fresh_for,
        }
    }

    /// The alerts firing for `spec`'s matchers, or why Alertmanager could not say.
    pub async fn firing(&self, spec: &AlertGateSpec) -> Answer {
        let url = alerts_url(spec);
        if let Some((at, answer)) = self.lock().get(&url)
            && at.elapsed() < self.fresh_for
        {
            return answer.clone();
        }
        let answer = match tokio::time::timeout(DEADLINE, self.ask(&url)).await {
            Ok(answer) => answer,
            Err(_) => Err(format!("no answer within {}s", DEADLINE.as_secs())),
        };
        self.lock().insert(url, (Instant::now(), answer.clone()));
        answer
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cache> {
        // Every critical section is one get or insert: a poisoned lock is sound.
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn ask(&self, url: &str) -> Answer {
        let uri: http::Uri = url.parse().map_err(|e| format!("bad URL {url}: {e}"))?;
        let response = self.http.get(uri).await.map_err(|e| {
            let cause = std::error::Error::source(&e)
                .map(|s| format!(": {s}"))
                .unwrap_or_default();
            format!("{e}{cause}")
        })?;
        let status = response.status();
        let body = http_body_util::Limited::new(response.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| format!("reading the answer: {e}"))?
            .to_bytes();
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body);
            return Err(format!("HTTP {status}: {}", text.trim()));
        }
        serde_json::from_slice(&body).map_err(|e| format!("not a list of alerts: {e}"))
    }
}

/// `GET {base}/api/v2/alerts?active=true&silenced=false&inhibited=false&filter=...`.
pub fn alerts_url(spec: &AlertGateSpec) -> String {
    let mut url = format!(
        "{}/api/v2/alerts?active=true&silenced=false&inhibited=false",
        spec.alertmanager_url.trim_end_matches('/')
    );
    for m in &spec.matchers {
        url.push_str("&filter=");
        url.push_str(&percent_encode(m.trim()));
    }
    url
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::WhileFiring;

    #[test]
    fn the_url_asks_for_active_unsilenced_alerts_meeting_every_matcher() {
        let spec = AlertGateSpec {
            alertmanager_url: "http://am:9093/".into(),
            matchers: vec!["severity=\"critical\"".into(), "team=~\"ml|batch\"".into()],
            while_firing: WhileFiring::Pending,
            recheck_seconds: None,
            retry_delay_seconds: None,
        };
        assert_eq!(
            alerts_url(&spec),
            "http://am:9093/api/v2/alerts?active=true&silenced=false&inhibited=false\
             &filter=severity%3D%22critical%22&filter=team%3D~%22ml%7Cbatch%22"
        );
    }

    #[tokio::test]
    async fn an_unreachable_alertmanager_is_an_error_with_its_reason() {
        // A port nothing listens on.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or(9);
        let spec = AlertGateSpec {
            alertmanager_url: format!("http://127.0.0.1:{port}"),
            matchers: vec!["a=b".into()],
            while_firing: WhileFiring::Pending,
            recheck_seconds: None,
            retry_delay_seconds: None,
        };
        let err = Alertmanagers::default()
            .firing(&spec)
            .await
            .expect_err("nothing listens");
        assert!(err.contains("onnect"), "{err}");
    }
}

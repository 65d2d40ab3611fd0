//! The runtime's default `/metrics` against the real API server: HTTPS with a self-signed
//! certificate, each request's bearer token authenticated (TokenReview) and authorised for `get`
//! on `/metrics` (SubjectAccessReview). No token or an invalid one gets 401, a ServiceAccount
//! without the permission 403, one bound to the chart's metrics reader ClusterRole the metrics;
//! the probes answer on their own port without a token.

use anyhow::{Context, Result, ensure};
use e2e::TestEnv;
use e2e::chart::{self, PROVISIONING_CHART};
use e2e::probe::{Probe, ProbeScript};
use kueue_admission_sdk::{MetricsSecurity, RuntimeConfig, TlsSource};
use serde_json::json;

const FIELD_MANAGER: &str = "e2e-metrics-auth";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_answer_only_a_token_allowed_to_get_them() -> Result<()> {
    let env = TestEnv::new("metrics-auth").await?;
    let (https, health) = e2e::free_local_addresses()?;
    let controller = Probe::new(env.own_controller_name("metrics-auth"), ProbeScript::new()).run(
        &env,
        env.client.clone(),
        |config| RuntimeConfig {
            metrics_address: Some(https),
            // The default, which the harness's settings replace with plain metrics.
            metrics_security: RuntimeConfig::default().metrics_security,
            health_address: Some(health),
            ..config
        },
    );
    ensure!(
        matches!(
            RuntimeConfig::default().metrics_security,
            MetricsSecurity::Authenticated {
                tls: TlsSource::SelfSigned
            }
        ),
        "the default is no longer HTTPS with a self-signed certificate"
    );

    // The probes: plain HTTP on their own port, no token; no metrics there.
    controller.wait_ready().await?;
    ensure!(e2e::http_get(health, "/healthz").await?.0 == 200);
    let (status, _) = e2e::http_get(health, "/metrics").await?;
    ensure!(
        status == 404,
        "the health port answered /metrics with {status}"
    );

    // No token, a malformed header, a token the API server does not know: 401.
    let (status, body) = e2e::https_get(https, "/metrics", None).await?;
    ensure!(status == 401, "no token: {status} {body}");
    ensure!(body.contains("bearer token"), "no token: {body}");
    let (status, body) = e2e::https_get(https, "/metrics", Some("not-a-token")).await?;
    ensure!(status == 401, "an invalid token: {status} {body}");
    // Plain HTTP on the HTTPS port gets no metrics.
    let plain = e2e::http_get(https, "/metrics").await;
    ensure!(
        !matches!(plain, Ok((200, _))),
        "plain HTTP on the metrics port was answered: {plain:?}"
    );

    // A ServiceAccount nobody allowed to read /metrics: 403, naming it.
    env.service_account("nobody").await?;
    let nobody = e2e::service_account_token(&env.client, &env.ns, "nobody").await?;
    let (status, body) = e2e::https_get(https, "/metrics", Some(&nobody)).await?;
    ensure!(
        status == 403,
        "a token without the permission: {status} {body}"
    );
    ensure!(
        body.contains(&format!("system:serviceaccount:{}:nobody", env.ns)),
        "{body}"
    );

    // Prometheus's ServiceAccount, bound to the ClusterRole the chart renders for scrapers.
    let reader = metrics_reader_of_the_chart(&env).await?;
    env.service_account("prometheus").await?;
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": env.cluster_name("prometheus-metrics")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": reader},
        "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": env.ns}],
    });
    chart::apply(&env.client, &binding, FIELD_MANAGER).await?;
    e2e::wait_until_may_read_metrics(&env.client, &env.ns, "prometheus").await?;
    let prometheus = e2e::service_account_token(&env.client, &env.ns, "prometheus").await?;
    let (status, body) = e2e::https_get(https, "/metrics", Some(&prometheus)).await?;
    ensure!(status == 200, "a token bound to {reader}: {status} {body}");
    ensure!(
        e2e::metric_sample(&body, "kueue_ac_leader") == Some(1.0),
        "the metrics text lacks kueue_ac_leader 1:\n{body}"
    );
    // Asked again within the cache's lifetime: the same answers.
    let (status, _) = e2e::https_get(https, "/metrics", Some(&prometheus)).await?;
    ensure!(status == 200, "the second scrape answered {status}");
    let (status, _) = e2e::https_get(https, "/metrics", Some(&nobody)).await?;
    ensure!(status == 403, "the second refused scrape answered {status}");

    controller.stop().await
}

/// The provisioning chart's ClusterRole for scrapers, rendered for a release named after the
/// test (so its name is the test's) and applied; returns its name.
async fn metrics_reader_of_the_chart(env: &TestEnv) -> Result<String> {
    let objects = chart::render(PROVISIONING_CHART, &env.ns, &env.ns, &[])?;
    let reader = chart::of_kind(&objects, "ClusterRole")
        .into_iter()
        .find(|r| {
            r["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.ends_with("-metrics-reader"))
        })
        .context("the chart renders no metrics reader ClusterRole")?;
    ensure!(
        reader["rules"] == json!([{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]),
        "the metrics reader grants more or less than get on /metrics: {reader:#}"
    );
    chart::apply(&env.client, reader, FIELD_MANAGER).await?;
    Ok(chart::name_of(reader)?.to_string())
}

//! The check: asks Alertmanager through the cache and answers with [`crate::gate::verdict`].

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use kueue_admission_sdk::api::{CheckState, workload_condition as cond};
use kueue_admission_sdk::{AdmissionCheckController, CheckContext, Decision, Revalidate};

use crate::alertmanager::Alertmanagers;
use crate::gate::{AlertGate, jittered, verdict};

/// Admission only while no matching alert fires.
#[derive(Clone, Debug)]
pub struct AlertGateCheck {
    controller_name: String,
    /// Look again at `Ready` answers this often, withdrawing them while an alert fires (only
    /// until Kueue admits: an admitted Workload is never asked again).
    withdraw_ready_every: Option<Duration>,
    alertmanagers: Arc<Alertmanagers>,
}

impl AlertGateCheck {
    /// A check answering AdmissionChecks of `controller_name`, never withdrawing a `Ready`,
    /// with answers of Alertmanager fresh for [`crate::alertmanager::DEFAULT_FRESH_FOR`].
    pub fn new(controller_name: impl Into<String>) -> Self {
        Self {
            controller_name: controller_name.into(),
            withdraw_ready_every: None,
            alertmanagers: Arc::default(),
        }
    }

    /// Looks again at `Ready` answers not yet admitted every `every` and withdraws them while
    /// a matching alert fires.
    pub fn withdraw_ready_every(mut self, every: Duration) -> Self {
        self.withdraw_ready_every = Some(every);
        self
    }

    /// One answer of an Alertmanager serves every Workload of a gate for `fresh_for`.
    pub fn answers_fresh_for(mut self, fresh_for: Duration) -> Self {
        self.alertmanagers = Arc::new(Alertmanagers::new(fresh_for));
        self
    }
}

impl AdmissionCheckController for AlertGateCheck {
    type Parameters = AlertGate;
    type Error = Infallible;

    fn controller_name(&self) -> &str {
        &self.controller_name
    }

    fn revalidate(&self) -> Revalidate {
        self.withdraw_ready_every
            .map_or(Revalidate::Never, Revalidate::Every)
    }

    async fn decide(&self, ctx: &CheckContext<'_, AlertGate>) -> Result<Decision, Infallible> {
        let spec = &ctx.parameters.spec;
        let firing = self.alertmanagers.firing(spec).await;
        let recheck = jittered(spec.recheck(), rand::random::<f64>());
        let decision = verdict(spec, &firing, recheck);
        if ctx.entry.state == CheckState::Ready {
            // Revalidating a Ready answer: withdrawn (a Retry, which gives the quota back until
            // the gate's retry delay has passed; the runtime writes no Pending over a Ready) only
            // while a matching alert fires and only before Kueue admitted the Workload (a
            // running job is never evicted), never because Alertmanager does not answer (a
            // monitoring outage must not stall work already let through).
            let admitted = ctx.workload.condition_is_true(cond::ADMITTED);
            return Ok(match (&firing, decision.state()) {
                (Ok(_), CheckState::Pending | CheckState::Retry) if !admitted => {
                    let held = decision.message().split("; looking again").next();
                    Decision::retry_after(
                        format!("withdrawn: {}", held.unwrap_or_default()),
                        ctx.parameters.spec.retry_delay(),
                    )
                }
                _ => Decision::ready(ctx.entry.message.clone()),
            });
        }
        Ok(decision)
    }
}

#[cfg(test)]
mod tests {
    use kueue_admission_sdk::testing::{WorkloadBuilder, decide_once};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::gate::{AlertGateSpec, WhileFiring};

    /// Serves `body` as the answer to every request, like Alertmanager's alert list.
    async fn fake_alertmanager(body: &'static str) -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut request = [0u8; 4096];
                let _ = stream.read(&mut request).await;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            }
        });
        addr
    }

    fn gate(addr: std::net::SocketAddr) -> AlertGate {
        AlertGate::new(
            "g",
            AlertGateSpec {
                alertmanager_url: format!("http://{addr}"),
                matchers: vec!["severity=\"critical\"".into()],
                while_firing: WhileFiring::Pending,
                recheck_seconds: None,
                retry_delay_seconds: None,
            },
        )
    }

    /// A Workload holding quota with the check's entry in `state`.
    fn holding_quota(state: CheckState) -> WorkloadBuilder {
        WorkloadBuilder::new("ns", "w")
            .check("c", state)
            .quota_reserved("cq", "f")
    }

    /// What the check answers for `wl` with its gate asking the Alertmanager at `alertmanager`.
    async fn answer(
        check: &AlertGateCheck,
        wl: &kueue_admission_sdk::api::Workload,
        alertmanager: std::net::SocketAddr,
    ) -> Decision {
        decide_once(check, wl, "c", &gate(alertmanager))
            .await
            .expect("decided")
    }

    #[tokio::test]
    async fn a_ready_answer_not_admitted_is_withdrawn_while_an_alert_fires_and_kept_when_nothing_answers()
     {
        let firing =
            fake_alertmanager(r#"[{"labels":{"alertname":"EtcdDown","severity":"critical"}}]"#)
                .await;
        let check = AlertGateCheck::new("example.com/g").answers_fresh_for(Duration::ZERO);
        let ready = holding_quota(CheckState::Ready).build();
        let d = answer(&check, &ready, firing).await;
        assert_eq!(d.state(), CheckState::Retry);
        assert_eq!(
            d.message(),
            "withdrawn: held back while 1 alert(s) matching severity=\"critical\" fire: EtcdDown{severity=critical}"
        );
        // Once admitted, a running job is never evicted for an alert.
        let admitted = holding_quota(CheckState::Ready).admitted().build();
        assert_eq!(
            answer(&check, &admitted, firing).await.state(),
            CheckState::Ready
        );

        // Alertmanager down: a Ready answer stands (a monitoring outage stalls nothing), but a
        // Pending one is never turned Ready.
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port");
        assert_eq!(
            answer(&check, &ready, closed).await.state(),
            CheckState::Ready
        );
        let pending = holding_quota(CheckState::Pending).build();
        assert_eq!(
            answer(&check, &pending, closed).await.state(),
            CheckState::Pending
        );

        let quiet = fake_alertmanager("[]").await;
        assert_eq!(
            answer(&check, &pending, quiet).await.state(),
            CheckState::Ready
        );
    }
}

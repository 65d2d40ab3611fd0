//! The client-side limits of a check's API client: a rate limit with the leader election
//! exempt and Events on a budget of their own, and a deadline for each request's answer.
//!
//! Every request waits its turn under the limit (tower's `RateLimit` behind a `Buffer`, first
//! come first served), except Lease requests: a leader that must renew its Lease while hundreds
//! of status writes are queued (a burst of Workloads) would otherwise miss the renewal deadline,
//! lose the lead and restart, which the chaos soak saw. Lease traffic is one request every few
//! seconds per replica, so leaving it out of the budget does not weaken the protection of the
//! API server.
//!
//! Events (events.k8s.io) wait in a queue of their own under a budget of the same size: the
//! Event a decision publishes then never delays the next Workload's status write, which a
//! shared budget made cost a fifth of the throughput of a burst (`make bench`). A check
//! publishes at most a few Events per decision, so the API server sees at most twice the
//! budget. (Kueue does otherwise: it puts one limiter on the configuration its clients, event
//! recorder included, are made from, so its Events share its budget.)

use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http::Request;
use kube::client::Body;
use tower::buffer::Buffer;
use tower::limit::RateLimit;
use tower::limit::rate::Rate;
use tower::util::BoxCloneService;
use tower::{BoxError, Layer, Service, ServiceExt};

/// Requests to this API group (Leases) are not counted against the budget.
const EXEMPT_PREFIX: &str = "/apis/coordination.k8s.io/";

/// Requests to this API group (Events) have a budget of their own.
const EVENTS_PREFIX: &str = "/apis/events.k8s.io/";

/// The longest a Lease request may go unanswered, whatever the general deadline: client-go's
/// leader election gives up a renewal after the same 10 s, well inside a 15 s Lease, so a
/// leader on a dead connection learns it before a standby takes over.
const LEASE_DEADLINE: Duration = Duration::from_secs(10);

/// Requests that may wait for the budget at once before callers wait to enqueue (kube's own
/// client buffer has the same bound).
const QUEUE: usize = 1024;

/// At most `burst` requests per `period`, Leases exempt, Events as many again on their own;
/// each request answered within
/// `deadline` (counted from when it is sent, not from when it joined the queue) or failed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BudgetLayer {
    pub burst: u64,
    pub period: Duration,
    pub deadline: Duration,
}

/// Fails a request whose answer (status and headers) has not come within its deadline. A
/// watch is exempt: it is answered at once and then streams for minutes by design. Without
/// this, a request on a connection that died silently waits for kube's read timeout (295 s)
/// while holding one of the reconcile turns.
#[derive(Clone)]
struct Deadline<S> {
    inner: S,
    general: Duration,
}

impl<S> Service<Request<Body>> for Deadline<S>
where
    S: Service<Request<Body>>,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<S::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let deadline = deadline_of(&request, self.general);
        let answer = self.inner.call(request);
        Box::pin(async move {
            let Some(deadline) = deadline else {
                return answer.await.map_err(Into::into);
            };
            match tokio::time::timeout(deadline, answer).await {
                Ok(answered) => answered.map_err(Into::into),
                Err(_) => Err(format!(
                    "no answer from the API server within {} s (--kube-api-timeout-seconds)",
                    deadline.as_secs_f64()
                )
                .into()),
            }
        })
    }
}

/// The deadline of `request`: none for a watch, at most [`LEASE_DEADLINE`] for a Lease.
fn deadline_of(request: &Request<Body>, general: Duration) -> Option<Duration> {
    let watch = request
        .uri()
        .query()
        .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
    if watch {
        None
    } else if request.uri().path().starts_with(EXEMPT_PREFIX) {
        Some(general.min(LEASE_DEADLINE))
    } else {
        Some(general)
    }
}

/// The service [`BudgetLayer`] makes.
#[derive(Clone)]
pub(crate) struct Budgeted<R> {
    limited: BoxCloneService<Request<Body>, R, BoxError>,
    events: BoxCloneService<Request<Body>, R, BoxError>,
    exempt: BoxCloneService<Request<Body>, R, BoxError>,
}

impl<S> Layer<S> for BudgetLayer
where
    S: Service<Request<Body>> + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Into<BoxError> + Send + Sync,
{
    type Service = Budgeted<S::Response>;

    fn layer(&self, inner: S) -> Self::Service {
        // Every path shares the one connection pool below, each request under its deadline.
        let shared = Buffer::new(
            Deadline {
                inner,
                general: self.deadline,
            },
            QUEUE,
        );
        let budget = |inner| {
            BoxCloneService::new(Buffer::new(
                RateLimit::new(inner, Rate::new(self.burst, self.period)),
                QUEUE,
            ))
        };
        Budgeted {
            limited: budget(shared.clone()),
            events: budget(shared.clone()),
            exempt: BoxCloneService::new(shared),
        }
    }
}

impl<R: Send + 'static> Service<Request<Body>> for Budgeted<R> {
    type Response = R;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<R, BoxError>>;

    /// Always ready: each request waits for its turn in its own future, so a Lease renewal is
    /// never stuck behind the queue.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let path = request.uri().path();
        let path = if path.starts_with(EXEMPT_PREFIX) {
            self.exempt.clone()
        } else if path.starts_with(EVENTS_PREFIX) {
            self.events.clone()
        } else {
            self.limited.clone()
        };
        Box::pin(path.oneshot(request))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn request(path: &str) -> Request<Body> {
        let mut request = Request::new(Body::empty());
        *request.uri_mut() = path.parse().expect("a valid path");
        request
    }

    /// A budget of one request an hour (per budget) before a server that counts what it
    /// serves.
    fn one_an_hour() -> (Budgeted<()>, Arc<AtomicUsize>) {
        let served = Arc::new(AtomicUsize::new(0));
        let counter = served.clone();
        let inner = tower::service_fn(move |_req: Request<Body>| {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                Ok::<_, BoxError>(())
            }
        });
        let svc = BudgetLayer {
            burst: 1,
            period: Duration::from_secs(3600),
            deadline: Duration::from_secs(30),
        }
        .layer(inner);
        (svc, served)
    }

    #[tokio::test]
    async fn a_lease_renewal_passes_a_spent_budget_and_the_rest_waits() {
        // One request an hour: the second Workload request cannot go before the test ends.
        let (svc, served) = one_an_hour();
        svc.clone()
            .oneshot(request("/apis/kueue.x-k8s.io/v1beta2/workloads"))
            .await
            .expect("the first request is within the budget");
        let waiting = tokio::spawn(
            svc.clone()
                .oneshot(request("/apis/kueue.x-k8s.io/v1beta2/workloads")),
        );
        // A bound only for a broken exemption (the renewal would wait an hour).
        tokio::time::timeout(
            Duration::from_secs(10),
            svc.clone().oneshot(request(
                "/apis/coordination.k8s.io/v1/namespaces/ns/leases/check",
            )),
        )
        .await
        .expect("the Lease request waited for the budget")
        .expect("served");
        assert_eq!(served.load(Ordering::SeqCst), 2);
        assert!(!waiting.is_finished(), "the budget was not enforced");
        waiting.abort();
    }

    #[tokio::test]
    async fn events_have_a_budget_of_their_own() {
        let (svc, served) = one_an_hour();
        let status = "/apis/kueue.x-k8s.io/v1beta2/namespaces/a/workloads/w/status";
        let event = "/apis/events.k8s.io/v1/namespaces/a/events";
        svc.clone()
            .oneshot(request(status))
            .await
            .expect("within the budget");
        // Bounds only for a broken budget (the second would wait an hour).
        tokio::time::timeout(Duration::from_secs(10), svc.clone().oneshot(request(event)))
            .await
            .expect("the Event waited for the status writes' budget")
            .expect("served");
        let second_event = tokio::spawn(svc.clone().oneshot(request(event)));
        let second_status = tokio::spawn(svc.clone().oneshot(request(status)));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(served.load(Ordering::SeqCst), 2);
        assert!(!second_event.is_finished(), "Events are not limited");
        assert!(!second_status.is_finished(), "the budget was not enforced");
        second_event.abort();
        second_status.abort();
    }

    /// A server that never answers anything.
    fn silent() -> impl Service<
        Request<Body>,
        Response = (),
        Error = BoxError,
        Future = impl Future<Output = Result<(), BoxError>> + Send + 'static,
    > + Send
    + 'static {
        tower::service_fn(|_req: Request<Body>| std::future::pending::<Result<(), BoxError>>())
    }

    #[tokio::test(start_paused = true)]
    async fn an_unanswered_request_fails_at_its_deadline_a_watch_never_does() {
        let svc = BudgetLayer {
            burst: 100,
            period: Duration::from_secs(1),
            deadline: Duration::from_secs(30),
        }
        .layer(silent());
        let started = tokio::time::Instant::now();
        let err = svc
            .clone()
            .oneshot(request(
                "/apis/kueue.x-k8s.io/v1beta2/namespaces/a/workloads/w/status?fieldManager=x",
            ))
            .await
            .expect_err("no answer");
        assert_eq!(started.elapsed(), Duration::from_secs(30));
        assert!(err.to_string().contains("within 30 s"), "{err}");

        // A Lease request gives up sooner, inside the Lease's own duration.
        let started = tokio::time::Instant::now();
        svc.clone()
            .oneshot(request(
                "/apis/coordination.k8s.io/v1/namespaces/ns/leases/check",
            ))
            .await
            .expect_err("no answer");
        assert_eq!(started.elapsed(), LEASE_DEADLINE);

        let watch = tokio::spawn(svc.clone().oneshot(request(
            "/apis/kueue.x-k8s.io/v1beta2/workloads?watch=true&resourceVersion=1",
        )));
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert!(!watch.is_finished(), "a watch was cut by the deadline");
        watch.abort();
    }
}

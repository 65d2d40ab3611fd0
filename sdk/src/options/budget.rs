//! The client-side rate limit of a check's API client, with the leader election exempt.
//!
//! Every request waits its turn under the limit (tower's `RateLimit` behind a `Buffer`, first
//! come first served), except Lease requests: a leader that must renew its Lease while hundreds
//! of status writes are queued (a burst of Workloads) would otherwise miss the renewal deadline,
//! lose the lead and restart, which the chaos soak saw. Lease traffic is one request every few
//! seconds per replica, so leaving it out of the budget does not weaken the protection of the
//! API server.

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

/// Requests that may wait for the budget at once before callers wait to enqueue (kube's own
/// client buffer has the same bound).
const QUEUE: usize = 1024;

/// At most `burst` requests per `period`, Leases exempt.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BudgetLayer {
    pub burst: u64,
    pub period: Duration,
}

/// The service [`BudgetLayer`] makes.
#[derive(Clone)]
pub(crate) struct Budgeted<R> {
    limited: BoxCloneService<Request<Body>, R, BoxError>,
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
        // Both paths share the one connection pool below.
        let shared = Buffer::new(inner, QUEUE);
        let limited = Buffer::new(
            RateLimit::new(shared.clone(), Rate::new(self.burst, self.period)),
            QUEUE,
        );
        Budgeted {
            limited: BoxCloneService::new(limited),
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
        let path = if request.uri().path().starts_with(EXEMPT_PREFIX) {
            self.exempt.clone()
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

    #[tokio::test]
    async fn a_lease_renewal_passes_a_spent_budget_and_the_rest_waits() {
        let served = Arc::new(AtomicUsize::new(0));
        let counter = served.clone();
        let inner = tower::service_fn(move |_req: Request<Body>| {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                Ok::<_, BoxError>(())
            }
        });
        // One request an hour: the second Workload request cannot go before the test ends.
        let svc = BudgetLayer {
            burst: 1,
            period: Duration::from_secs(3600),
        }
        .layer(inner);
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
}

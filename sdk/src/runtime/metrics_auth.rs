//! Who may read `/metrics`: the request's bearer token is authenticated by the API server (a
//! TokenReview) and the user it names authorised for `get` on the non-resource URL `/metrics`
//! (a SubjectAccessReview). The decisions are pure functions of the reviews' answers; a bounded
//! cache keeps them briefly so that a scraper costs two API requests per token and
//! [`METRICS_AUTH_CACHE_TTL`], not per scrape.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewStatus, UserInfo};
use k8s_openapi::api::authorization::v1::{SubjectAccessReview, SubjectAccessReviewStatus};
use kube::Client;
use kube::api::{Api, PostParams};
use sha2::{Digest, Sha256};
use tracing::debug;

/// How long a decision about a token is kept: a permission granted or withdrawn shows within
/// this time.
pub const METRICS_AUTH_CACHE_TTL: Duration = Duration::from_secs(30);

/// How many tokens' decisions are kept at most (about 100 bytes each); beyond that the one that
/// expires first is dropped.
pub const METRICS_AUTH_CACHE_SIZE: usize = 1024;

/// The path and verb a scraper needs, as RBAC names them (`nonResourceURLs`, `verbs`).
const PATH: &str = "/metrics";
const VERB: &str = "get";

/// What a request for `/metrics` gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// 200: the metrics.
    Allowed,
    /// 401: no token, or one the API server does not accept.
    Unauthenticated(String),
    /// 403: a valid token whose user may not `get` `/metrics`.
    Forbidden(String),
}

/// The bearer token of an `Authorization` header value, if it carries one.
pub(crate) fn bearer_token(authorization: Option<&[u8]>) -> Option<&str> {
    let value = std::str::from_utf8(authorization?).ok()?.trim();
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The user a TokenReview's answer authenticated, or why the request is refused.
pub(crate) fn authenticated(status: Option<&TokenReviewStatus>) -> Result<UserInfo, Verdict> {
    let refused = |why: String| Err(Verdict::Unauthenticated(why));
    let Some(status) = status else {
        return refused("the token review gave no answer".into());
    };
    if status.authenticated != Some(true) {
        return refused(match status.error.as_deref() {
            Some(e) if !e.is_empty() => format!("invalid token: {e}"),
            _ => "invalid token".into(),
        });
    }
    match &status.user {
        Some(user) if user.username.as_deref().is_some_and(|u| !u.is_empty()) => Ok(user.clone()),
        _ => refused("the token authenticates no user".into()),
    }
}

/// The SubjectAccessReview asking whether `user` may `get` `/metrics`.
pub(crate) fn access_review(user: &UserInfo) -> SubjectAccessReview {
    use k8s_openapi::api::authorization::v1::{NonResourceAttributes, SubjectAccessReviewSpec};
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: user.username.clone(),
            groups: user.groups.clone(),
            uid: user.uid.clone(),
            extra: user.extra.clone(),
            non_resource_attributes: Some(NonResourceAttributes {
                path: Some(PATH.into()),
                verb: Some(VERB.into()),
            }),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The verdict for `user` from a SubjectAccessReview's answer.
pub(crate) fn authorized(user: &UserInfo, status: Option<&SubjectAccessReviewStatus>) -> Verdict {
    let name = user.username.as_deref().unwrap_or_default();
    match status {
        Some(s) if s.allowed && s.denied != Some(true) => Verdict::Allowed,
        Some(s) => Verdict::Forbidden(match s.reason.as_deref() {
            Some(reason) if !reason.is_empty() => {
                format!("{name} may not {VERB} {PATH}: {reason}")
            }
            _ => format!("{name} may not {VERB} {PATH}"),
        }),
        None => Verdict::Forbidden(format!("the access review for {name} gave no answer")),
    }
}

/// Recent verdicts by token digest (tokens themselves are not kept), each valid for `ttl`, at
/// most `capacity` of them.
#[derive(Debug)]
pub(crate) struct VerdictCache {
    entries: HashMap<[u8; 32], (Verdict, Instant)>,
    ttl: Duration,
    capacity: usize,
}

impl VerdictCache {
    pub(crate) fn new(ttl: Duration, capacity: usize) -> Self {
        Self {
            entries: HashMap::new(),
            ttl,
            capacity: capacity.max(1),
        }
    }

    fn key(token: &str) -> [u8; 32] {
        Sha256::digest(token.as_bytes()).into()
    }

    /// The verdict about `token` decided less than the TTL before `now`.
    pub(crate) fn get(&self, token: &str, now: Instant) -> Option<Verdict> {
        match self.entries.get(&Self::key(token)) {
            Some((verdict, expires)) if now < *expires => Some(verdict.clone()),
            _ => None,
        }
    }

    /// Keeps `verdict` about `token`, decided at `now`; when full, expired entries go first,
    /// then the one that expires soonest.
    pub(crate) fn insert(&mut self, token: &str, verdict: Verdict, now: Instant) {
        let key = Self::key(token);
        if !self.entries.contains_key(&key) && self.entries.len() >= self.capacity {
            self.entries.retain(|_, (_, expires)| now < *expires);
            if self.entries.len() >= self.capacity {
                let soonest = self
                    .entries
                    .iter()
                    .min_by_key(|(_, (_, expires))| *expires)
                    .map(|(k, _)| *k);
                if let Some(soonest) = soonest {
                    self.entries.remove(&soonest);
                }
            }
        }
        self.entries.insert(key, (verdict, now + self.ttl));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

/// Decides requests for `/metrics` through the API server, with the verdicts cached.
pub(crate) struct Gate {
    client: Client,
    cache: Mutex<VerdictCache>,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate").finish_non_exhaustive()
    }
}

impl Gate {
    pub(crate) fn new(client: Client) -> Self {
        Self {
            client,
            cache: Mutex::new(VerdictCache::new(
                METRICS_AUTH_CACHE_TTL,
                METRICS_AUTH_CACHE_SIZE,
            )),
        }
    }

    /// The verdict on a request with this `Authorization` header; `Err` when the API server
    /// could not be asked (not cached: the next scrape asks again).
    pub(crate) async fn check(&self, authorization: Option<&[u8]>) -> Result<Verdict, String> {
        let Some(token) = bearer_token(authorization) else {
            return Ok(Verdict::Unauthenticated(
                "a bearer token is required (Authorization: Bearer <token>)".into(),
            ));
        };
        if let Some(verdict) = self.lock().get(token, Instant::now()) {
            return Ok(verdict);
        }
        let verdict = self.review(token).await?;
        debug!(?verdict, "reviewed a metrics scraper's token");
        self.lock().insert(token, verdict.clone(), Instant::now());
        Ok(verdict)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VerdictCache> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn review(&self, token: &str) -> Result<Verdict, String> {
        let review = TokenReview {
            spec: k8s_openapi::api::authentication::v1::TokenReviewSpec {
                token: token.to_string(),
                ..Default::default()
            },
            ..Default::default()
        };
        let reviewed = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| format!("cannot review the token (TokenReview): {e}"))?;
        let user = match authenticated(reviewed.status.as_ref()) {
            Ok(user) => user,
            Err(verdict) => return Ok(verdict),
        };
        let access = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &access_review(&user))
            .await
            .map_err(|e| format!("cannot review the access (SubjectAccessReview): {e}"))?;
        Ok(authorized(&user, access.status.as_ref()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str) -> UserInfo {
        UserInfo {
            username: Some(name.into()),
            groups: Some(vec!["system:serviceaccounts".into()]),
            uid: Some("u-1".into()),
            extra: Some([("scopes".to_string(), vec!["a".to_string()])].into()),
        }
    }

    #[test]
    fn only_a_bearer_token_counts() {
        assert_eq!(bearer_token(Some(b"Bearer abc")), Some("abc"));
        assert_eq!(bearer_token(Some(b"bearer  abc ")), Some("abc"));
        for bad in [
            &b"Basic abc"[..],
            b"Bearer",
            b"Bearer ",
            b"abc",
            b"\xff\xfe",
        ] {
            assert_eq!(bearer_token(Some(bad)), None, "{bad:?}");
        }
        assert_eq!(bearer_token(None), None);
    }

    #[test]
    fn an_unauthenticated_token_is_refused_with_the_reason() {
        assert_eq!(
            authenticated(None),
            Err(Verdict::Unauthenticated(
                "the token review gave no answer".into()
            ))
        );
        let status = TokenReviewStatus {
            authenticated: Some(false),
            error: Some("token expired".into()),
            ..Default::default()
        };
        assert_eq!(
            authenticated(Some(&status)),
            Err(Verdict::Unauthenticated(
                "invalid token: token expired".into()
            ))
        );
        let no_user = TokenReviewStatus {
            authenticated: Some(true),
            ..Default::default()
        };
        assert!(matches!(
            authenticated(Some(&no_user)),
            Err(Verdict::Unauthenticated(_))
        ));
        let ok = TokenReviewStatus {
            authenticated: Some(true),
            user: Some(user("alice")),
            ..Default::default()
        };
        assert_eq!(authenticated(Some(&ok)), Ok(user("alice")));
    }

    #[test]
    fn the_access_review_asks_for_the_whole_user_and_get_metrics() {
        let review = access_review(&user("alice"));
        let spec = review.spec;
        assert_eq!(spec.user.as_deref(), Some("alice"));
        assert_eq!(spec.groups, user("alice").groups);
        assert_eq!(spec.uid.as_deref(), Some("u-1"));
        assert_eq!(spec.extra, user("alice").extra);
        let attrs = spec.non_resource_attributes.expect("non-resource");
        assert_eq!(
            (attrs.path.as_deref(), attrs.verb.as_deref()),
            (Some("/metrics"), Some("get"))
        );
        assert!(spec.resource_attributes.is_none());
    }

    #[test]
    fn only_an_allowed_and_not_denied_access_gets_the_metrics() {
        let alice = user("alice");
        let allowed = SubjectAccessReviewStatus {
            allowed: true,
            ..Default::default()
        };
        assert_eq!(authorized(&alice, Some(&allowed)), Verdict::Allowed);
        let denied = SubjectAccessReviewStatus {
            allowed: true,
            denied: Some(true),
            reason: Some("a deny rule".into()),
            ..Default::default()
        };
        assert_eq!(
            authorized(&alice, Some(&denied)),
            Verdict::Forbidden("alice may not get /metrics: a deny rule".into())
        );
        let not_allowed = SubjectAccessReviewStatus::default();
        assert_eq!(
            authorized(&alice, Some(&not_allowed)),
            Verdict::Forbidden("alice may not get /metrics".into())
        );
        assert!(matches!(authorized(&alice, None), Verdict::Forbidden(_)));
    }

    #[test]
    fn the_cache_forgets_after_its_ttl() {
        let start = Instant::now();
        let mut cache = VerdictCache::new(Duration::from_secs(30), 10);
        cache.insert("t", Verdict::Allowed, start);
        assert_eq!(cache.get("t", start), Some(Verdict::Allowed));
        assert_eq!(
            cache.get("t", start + Duration::from_secs(29)),
            Some(Verdict::Allowed)
        );
        assert_eq!(cache.get("t", start + Duration::from_secs(30)), None);
        assert_eq!(cache.get("other", start), None);
    }

    #[test]
    fn the_cache_stays_within_its_bound() {
        let start = Instant::now();
        let mut cache = VerdictCache::new(Duration::from_secs(30), 3);
        for (i, token) in ["a", "b", "c"].into_iter().enumerate() {
            cache.insert(
                token,
                Verdict::Allowed,
                start + Duration::from_secs(i as u64),
            );
        }
        // Full: the one expiring soonest ("a") makes room.
        let later = start + Duration::from_secs(5);
        cache.insert("d", Verdict::Forbidden("no".into()), later);
        assert_eq!(cache.len(), 3);
        assert_eq!(cache.get("a", later), None);
        assert_eq!(cache.get("b", later), Some(Verdict::Allowed));
        assert_eq!(cache.get("d", later), Some(Verdict::Forbidden("no".into())));
        // Expired entries all go before a live one is dropped.
        let much_later = start + Duration::from_secs(33);
        cache.insert("e", Verdict::Allowed, much_later);
        assert_eq!(cache.len(), 2, "b and c expired, d and e remain");
        assert!(cache.get("d", much_later).is_some());
        // Replacing a kept token's verdict needs no room.
        cache.insert("e", Verdict::Unauthenticated("x".into()), much_later);
        assert_eq!(cache.len(), 2);
    }
}

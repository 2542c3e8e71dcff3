//! Delegated authentication and authorisation, as Kubernetes' own
//! extension servers do it: a bearer token is checked with a TokenReview
//! (optionally for one audience), and each action with a
//! SubjectAccessReview, so RBAC decides who may do what. Used by the
//! gateway (member routes) and by every metrics server (`get` on the path
//! `/metrics`).
//!
//! The apiserver is kept out of the hot path and out of an attacker's
//! reach: answers are cached briefly by token digest (never the token),
//! refused tokens too, and TokenReviews of tokens not seen before are
//! rate-limited as a whole, so a flood of made-up tokens never reaches it.
//! Callers that present the same unchecked token at once (a burst from one
//! client as its cache entry expires) share one TokenReview, so a single
//! busy caller never spends the limit meant for new tokens.

use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

/// How long an answer (either way) is reused.
pub const CACHE_FOR: Duration = Duration::from_secs(10);
/// Entries kept before expired ones are swept.
const SWEEP_ABOVE: usize = 10_000;

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("a bearer token is required")]
    Missing,
    #[error("the bearer token is not valid")]
    Invalid,
    #[error("too many new tokens at once; try again shortly")]
    RateLimited,
    #[error("Kubernetes API: {0}")]
    Api(#[from] kube::Error),
}

/// Who a token belongs to, as the TokenReview answered.
#[derive(Clone, Debug, PartialEq)]
pub struct Caller {
    pub user: String,
    pub uid: Option<String>,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// What a caller asks to do.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// `verb` on `resource` of API group `group` in `namespace`.
    Resource { namespace: String, verb: String, group: String, resource: String },
    /// `verb` on a URL path that is not an API resource (`get` `/metrics`).
    NonResource { path: String, verb: String },
}

/// A decision is the same for one user, its groups and one action.
type DecisionKey = (String, String, Action);

/// The bearer token of an `Authorization` header, if it carries one.
pub fn bearer(authorization: Option<&str>) -> Result<&str, AuthError> {
    authorization
        .and_then(|h| h.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or(AuthError::Missing)
}

pub struct DelegatedAuth {
    client: kube::Client,
    /// The audience a token must be minted for; `None`: the apiserver's
    /// own (any token the cluster accepts).
    audience: Option<String>,
    tokens: Mutex<HashMap<Vec<u8>, (Instant, Caller)>>,
    /// Digests of tokens refused recently: answered without a TokenReview.
    refused: Mutex<HashMap<Vec<u8>, Instant>>,
    decisions: Mutex<HashMap<DecisionKey, (Instant, bool)>>,
    /// One lock per token digest under review: the first caller reviews,
    /// the others wait for it and take its answer from the caches.
    reviewing: Mutex<HashMap<Vec<u8>, Arc<tokio::sync::Mutex<()>>>>,
    reviews: governor::DefaultDirectRateLimiter,
    /// TokenReviews made (for /metrics).
    pub token_reviews: prometheus_client::metrics::counter::Counter,
}

impl DelegatedAuth {
    /// `new_tokens_per_second`: TokenReviews of tokens not seen before, all
    /// callers together.
    pub fn new(client: kube::Client, audience: Option<String>, new_tokens_per_second: NonZeroU32) -> Self {
        use governor::{Quota, RateLimiter};
        Self {
            client,
            audience,
            tokens: Mutex::default(),
            refused: Mutex::default(),
            decisions: Mutex::default(),
            reviewing: Mutex::default(),
            reviews: RateLimiter::direct(Quota::per_second(new_tokens_per_second)),
            token_reviews: Default::default(),
        }
    }

    /// The caller `token` belongs to.
    pub async fn authenticate(&self, token: &str) -> Result<Caller, AuthError> {
        let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes()).as_ref().to_vec();
        if let Some(known) = self.known(&digest) {
            return known;
        }
        let turn = self.reviewing.lock().unwrap_or_else(|p| p.into_inner()).entry(digest.clone()).or_default().clone();
        let _turn = turn.lock().await;
        // Whoever held the turn before may have answered it.
        if let Some(known) = self.known(&digest) {
            return known;
        }
        // Removed however this call ends (a caller that goes away too), so
        // the map holds only reviews under way.
        let _done = Reviewing { map: &self.reviewing, digest: &digest };
        self.review(token, &digest).await
    }

    /// The cached answer for a token digest, either way, if still fresh.
    fn known(&self, digest: &[u8]) -> Option<Result<Caller, AuthError>> {
        let cached = self.tokens.lock().unwrap_or_else(|p| p.into_inner()).get(digest).cloned();
        if let Some((_, c)) = cached.filter(|(at, _)| at.elapsed() < CACHE_FOR) {
            return Some(Ok(c));
        }
        let refused = self.refused.lock().unwrap_or_else(|p| p.into_inner()).get(digest).copied();
        refused.filter(|at| at.elapsed() < CACHE_FOR).map(|_| Err(AuthError::Invalid))
    }

    /// One TokenReview, its answer cached.
    async fn review(&self, token: &str, digest: &[u8]) -> Result<Caller, AuthError> {
        let digest = digest.to_vec();
        if self.reviews.check().is_err() {
            return Err(AuthError::RateLimited);
        }
        self.token_reviews.inc();
        let review = TokenReview {
            spec: TokenReviewSpec { token: token.to_owned(), audiences: self.audience.clone().map(|a| vec![a]) },
            ..Default::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let status = api.create(&PostParams::default(), &review).await?.status.unwrap_or_default();
        // With an audience asked for, the answer must name it: a token for
        // another audience is not one for us.
        let for_us = match &self.audience {
            Some(a) => status.audiences.as_ref().is_some_and(|list| list.contains(a)),
            None => true,
        };
        let Some(user) = status.user.filter(|_| status.authenticated == Some(true) && for_us) else {
            remember(&self.refused, digest, Instant::now(), |at| at.elapsed() < CACHE_FOR);
            return Err(AuthError::Invalid);
        };
        let caller = Caller {
            user: user.username.unwrap_or_default(),
            uid: user.uid,
            groups: user.groups.unwrap_or_default(),
            extra: user.extra.unwrap_or_default(),
        };
        remember(&self.tokens, digest, (Instant::now(), caller.clone()), |(at, _)| at.elapsed() < CACHE_FOR);
        Ok(caller)
    }

    /// Whether RBAC lets `caller` do `action`.
    pub async fn allowed(&self, caller: &Caller, action: &Action) -> Result<bool, AuthError> {
        let key = (caller.user.clone(), caller.groups.join(","), action.clone());
        let cached = self.decisions.lock().unwrap_or_else(|p| p.into_inner()).get(&key).copied();
        if let Some((_, allowed)) = cached.filter(|(at, _)| at.elapsed() < CACHE_FOR) {
            return Ok(allowed);
        }
        let (resource_attributes, non_resource_attributes) = match action {
            Action::Resource { namespace, verb, group, resource } => (
                Some(ResourceAttributes {
                    namespace: Some(namespace.clone()),
                    verb: Some(verb.clone()),
                    group: Some(group.clone()),
                    resource: Some(resource.clone()),
                    ..Default::default()
                }),
                None,
            ),
            Action::NonResource { path, verb } => {
                (None, Some(NonResourceAttributes { path: Some(path.clone()), verb: Some(verb.clone()) }))
            }
        };
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(caller.user.clone()),
                uid: caller.uid.clone(),
                groups: Some(caller.groups.clone()),
                extra: Some(caller.extra.clone()),
                resource_attributes,
                non_resource_attributes,
            },
            ..Default::default()
        };
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let allowed = api.create(&PostParams::default(), &review).await?.status.is_some_and(|s| s.allowed);
        remember(&self.decisions, key, (Instant::now(), allowed), |(at, _)| at.elapsed() < CACHE_FOR);
        Ok(allowed)
    }
}

/// A token's turn to be reviewed, given back when the review ends.
struct Reviewing<'a> {
    map: &'a Mutex<HashMap<Vec<u8>, Arc<tokio::sync::Mutex<()>>>>,
    digest: &'a [u8],
}

impl Drop for Reviewing<'_> {
    fn drop(&mut self) {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).remove(self.digest);
    }
}

/// Inserts into a bounded cache, sweeping what `fresh` says has expired
/// once it holds many entries.
fn remember<K: std::hash::Hash + Eq, V>(cache: &Mutex<HashMap<K, V>>, key: K, value: V, fresh: impl Fn(&V) -> bool) {
    let mut cache = cache.lock().unwrap_or_else(|p| p.into_inner());
    if cache.len() > SWEEP_ABOVE {
        cache.retain(|_, v| fresh(v));
    }
    cache.insert(key, value);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_non_empty_bearer_token_is_taken() {
        assert_eq!(bearer(Some("Bearer abc")).ok(), Some("abc"));
        assert_eq!(bearer(Some("Bearer  abc ")).ok(), Some("abc"));
        for refused in [None, Some(""), Some("Bearer "), Some("Basic abc"), Some("bearer abc")] {
            assert!(matches!(bearer(refused), Err(AuthError::Missing)), "{refused:?}");
        }
    }

    /// An apiserver that answers every TokenReview after `delay`, as the
    /// user `who`, and counts them.
    fn reviewer(delay: Duration, reviews: Arc<std::sync::atomic::AtomicUsize>) -> kube::Client {
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let reviews = reviews.clone();
            async move {
                assert!(req.uri().path().ends_with("/tokenreviews"), "{}", req.uri());
                reviews.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(delay).await;
                let body = serde_json::json!({
                    "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {},
                    "status": {"authenticated": true, "user": {"username": "who", "groups": ["g"]}},
                });
                Ok::<_, std::convert::Infallible>(http::Response::new(kube::client::Body::from(
                    serde_json::to_vec(&body).unwrap(),
                )))
            }
        });
        kube::Client::new(service, "default")
    }

    #[tokio::test]
    async fn callers_with_the_same_new_token_share_one_token_review() {
        let reviews = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let limit = NonZeroU32::new(5).unwrap();
        let auth = DelegatedAuth::new(reviewer(Duration::from_millis(50), reviews.clone()), None, limit);
        // 40 at once: more than the new-token limit allows reviews of.
        let answers = futures::future::join_all((0..40).map(|_| auth.authenticate("one-token"))).await;
        for a in &answers {
            assert_eq!(a.as_ref().map(|c| c.user.as_str()).ok(), Some("who"), "{a:?}");
        }
        assert_eq!(reviews.load(std::sync::atomic::Ordering::SeqCst), 1, "one TokenReview for one token");
        assert!(auth.reviewing.lock().unwrap().is_empty(), "no review is left marked under way");
        // Different tokens are still each reviewed, within the limit.
        let tokens: Vec<String> = (0..3).map(|i| format!("t{i}")).collect();
        let others = futures::future::join_all(tokens.iter().map(|t| auth.authenticate(t))).await;
        assert!(others.iter().all(Result::is_ok));
        assert_eq!(reviews.load(std::sync::atomic::Ordering::SeqCst), 4);
    }
}

//! Member auth: the bearer token is a Kubernetes token, checked with a
//! TokenReview for the gateway's audience (a token minted for the apiserver,
//! or for any other audience, is refused); each action is then authorised
//! with a SubjectAccessReview against the Sandbox's namespace, so a member
//! may do through the gateway exactly what RBAC lets them do with kubectl.
//!
//! The apiserver is kept out of the hot path and out of an attacker's
//! reach: answers are cached briefly by token digest (never the token),
//! refused tokens too; TokenReviews of unknown tokens are rate-limited as a
//! whole, and every authenticated caller has a request rate of its own.

use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hangar_crds::ErrorCode;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::api::{Api, PostParams};

use crate::error::ApiError;

const CACHE_FOR: Duration = Duration::from_secs(10);

/// The gateway's rate limits.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Requests per second of one caller (user), and its burst.
    pub per_caller: NonZeroU32,
    pub per_caller_burst: NonZeroU32,
    /// TokenReviews per second of tokens not seen before, all callers
    /// together (a flood of made-up tokens must not reach the apiserver).
    pub token_reviews: NonZeroU32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            per_caller: NonZeroU32::new(50).expect("non-zero"),
            per_caller_burst: NonZeroU32::new(100).expect("non-zero"),
            token_reviews: NonZeroU32::new(100).expect("non-zero"),
        }
    }
}

type Keyed = governor::RateLimiter<
    String,
    governor::state::keyed::DefaultKeyedStateStore<String>,
    governor::clock::DefaultClock,
>;
type Direct = governor::DefaultDirectRateLimiter;

fn rate_limited(what: &str) -> ApiError {
    ApiError::new(ErrorCode::RateLimited, format!("too many {what}; try again shortly"))
}

#[derive(Clone, Debug, PartialEq)]
pub struct Caller {
    pub user: String,
    pub uid: Option<String>,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

pub struct Auth {
    client: kube::Client,
    /// The audience a member's token must be minted for; `None`: the
    /// apiserver's own (any token the cluster accepts).
    audience: Option<String>,
    tokens: Mutex<HashMap<Vec<u8>, (Instant, Caller)>>,
    /// Digests of tokens refused recently: answered without a TokenReview.
    refused: Mutex<HashMap<Vec<u8>, Instant>>,
    decisions: Mutex<HashMap<String, (Instant, bool)>>,
    per_caller: Keyed,
    reviews: Direct,
    /// TokenReviews made (for /metrics).
    pub token_reviews: prometheus_client::metrics::counter::Counter,
}

impl Auth {
    pub fn new(client: kube::Client, audience: Option<String>, limits: Limits) -> Self {
        use governor::{Quota, RateLimiter};
        Self {
            client,
            audience,
            tokens: Mutex::default(),
            refused: Mutex::default(),
            decisions: Mutex::default(),
            per_caller: RateLimiter::keyed(Quota::per_second(limits.per_caller).allow_burst(limits.per_caller_burst)),
            reviews: RateLimiter::direct(Quota::per_second(limits.token_reviews)),
            token_reviews: Default::default(),
        }
    }

    /// The caller behind `Authorization: Bearer …`.
    pub async fn authenticate(&self, authorization: Option<&str>) -> Result<Caller, ApiError> {
        let token = authorization
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| ApiError::new(ErrorCode::TokenInvalid, "a bearer token is required"))?;
        if token.starts_with("hgt_") {
            return Err(ApiError::new(ErrorCode::TokenInvalid, "session tokens are not accepted on member routes"));
        }
        let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes()).as_ref().to_vec();
        let cached = self.tokens.lock().unwrap_or_else(|p| p.into_inner()).get(&digest).cloned();
        if let Some((_, c)) = cached.filter(|(at, _)| at.elapsed() < CACHE_FOR) {
            return self.admit(c);
        }
        let refused = self.refused.lock().unwrap_or_else(|p| p.into_inner()).get(&digest).copied();
        if refused.is_some_and(|at| at.elapsed() < CACHE_FOR) {
            return Err(invalid());
        }
        if self.reviews.check().is_err() {
            return Err(rate_limited("new tokens at once"));
        }
        self.token_reviews.inc();
        let review = TokenReview {
            spec: TokenReviewSpec { token: token.to_owned(), audiences: self.audience.clone().map(|a| vec![a]) },
            ..Default::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let answer = api.create(&PostParams::default(), &review).await?;
        let status = answer.status.unwrap_or_default();
        // With an audience asked for, the answer must name it: a token for
        // another audience is not one for us.
        let for_us = match &self.audience {
            Some(a) => status.audiences.as_ref().is_some_and(|list| list.contains(a)),
            None => true,
        };
        let user = status.user.filter(|_| status.authenticated == Some(true) && for_us);
        let Some(user) = user else {
            let mut refused = self.refused.lock().unwrap_or_else(|p| p.into_inner());
            if refused.len() > 10_000 {
                refused.retain(|_, at| at.elapsed() < CACHE_FOR);
            }
            refused.insert(digest, Instant::now());
            return Err(invalid());
        };
        let caller = Caller {
            user: user.username.unwrap_or_default(),
            uid: user.uid,
            groups: user.groups.unwrap_or_default(),
            extra: user.extra.unwrap_or_default(),
        };
        let mut cache = self.tokens.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() > 10_000 {
            cache.retain(|_, (at, _)| at.elapsed() < CACHE_FOR);
        }
        cache.insert(digest, (Instant::now(), caller.clone()));
        drop(cache);
        self.admit(caller)
    }

    /// The caller, if within its request rate.
    fn admit(&self, caller: Caller) -> Result<Caller, ApiError> {
        self.admit_key(&caller.user)?;
        Ok(caller)
    }

    /// Whether `who` (a username, or a session token's identity) is within
    /// its request rate.
    pub fn admit_key(&self, who: &str) -> Result<(), ApiError> {
        if self.per_caller.len() > 10_000 {
            self.per_caller.retain_recent();
        }
        if self.per_caller.check_key(&who.to_owned()).is_err() {
            return Err(rate_limited("requests from this caller"));
        }
        Ok(())
    }

    /// May `caller` `verb` the `resource` (of hangar.dev) in `namespace`?
    pub async fn authorize(
        &self,
        caller: &Caller,
        namespace: &str,
        verb: &str,
        resource: &str,
    ) -> Result<(), ApiError> {
        let key = format!("{}\u{0}{}\u{0}{namespace}\u{0}{verb}\u{0}{resource}", caller.user, caller.groups.join(","));
        let cached = self.decisions.lock().unwrap_or_else(|p| p.into_inner()).get(&key).copied();
        let allowed = match cached {
            Some((at, allowed)) if at.elapsed() < CACHE_FOR => allowed,
            _ => {
                let review = SubjectAccessReview {
                    spec: SubjectAccessReviewSpec {
                        user: Some(caller.user.clone()),
                        uid: caller.uid.clone(),
                        groups: Some(caller.groups.clone()),
                        extra: Some(caller.extra.clone()),
                        resource_attributes: Some(ResourceAttributes {
                            namespace: Some(namespace.to_owned()),
                            verb: Some(verb.to_owned()),
                            group: Some(hangar_crds::GROUP.to_owned()),
                            resource: Some(resource.to_owned()),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                    ..Default::default()
                };
                let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
                let allowed = api.create(&PostParams::default(), &review).await?.status.is_some_and(|s| s.allowed);
                let mut cache = self.decisions.lock().unwrap_or_else(|p| p.into_inner());
                if cache.len() > 10_000 {
                    cache.retain(|_, (at, _)| at.elapsed() < CACHE_FOR);
                }
                cache.insert(key, (Instant::now(), allowed));
                allowed
            }
        };
        if allowed {
            Ok(())
        } else {
            Err(ApiError::new(
                ErrorCode::Forbidden,
                // Names neither the namespace nor anything else of the session.
                format!("you may not {verb} {resource} of this session"),
            ))
        }
    }
}

fn invalid() -> ApiError {
    ApiError::new(ErrorCode::TokenInvalid, "the bearer token is not valid")
}

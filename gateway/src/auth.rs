//! Member auth: the bearer token is a Kubernetes token, checked with a
//! TokenReview for the gateway's audience (a token minted for the apiserver,
//! or for any other audience, is refused); each action is then authorised
//! with a SubjectAccessReview against the Sandbox's namespace, so a member
//! may do through the gateway exactly what RBAC lets them do with kubectl.
//! Both are `hangar_runtime::delegated_auth` (cached by token digest,
//! TokenReviews of new tokens rate-limited as a whole); on top, every
//! authenticated caller has a request rate of its own.

use std::num::NonZeroU32;

use hangar_crds::ErrorCode;
use hangar_runtime::delegated_auth::{self, Action, AuthError, DelegatedAuth};

use crate::error::ApiError;

pub use hangar_runtime::delegated_auth::Caller;

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

fn rate_limited(what: &str) -> ApiError {
    ApiError::new(ErrorCode::RateLimited, format!("too many {what}; try again shortly"))
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> Self {
        match e {
            AuthError::Missing => ApiError::new(ErrorCode::TokenInvalid, "a bearer token is required"),
            AuthError::Invalid => ApiError::new(ErrorCode::TokenInvalid, "the bearer token is not valid"),
            AuthError::RateLimited => rate_limited("new tokens at once"),
            AuthError::Api(e) => e.into(),
        }
    }
}

pub struct Auth {
    delegated: DelegatedAuth,
    per_caller: Keyed,
}

impl Auth {
    pub fn new(client: kube::Client, audience: Option<String>, limits: Limits) -> Self {
        use governor::{Quota, RateLimiter};
        Self {
            delegated: DelegatedAuth::new(client, audience, limits.token_reviews),
            per_caller: RateLimiter::keyed(Quota::per_second(limits.per_caller).allow_burst(limits.per_caller_burst)),
        }
    }

    /// TokenReviews made (for /metrics).
    pub fn token_reviews(&self) -> prometheus_client::metrics::counter::Counter {
        self.delegated.token_reviews.clone()
    }

    /// The caller behind `Authorization: Bearer …`.
    pub async fn authenticate(&self, authorization: Option<&str>) -> Result<Caller, ApiError> {
        let token = delegated_auth::bearer(authorization)?;
        if token.starts_with("hgt_") {
            return Err(ApiError::new(ErrorCode::TokenInvalid, "session tokens are not accepted on member routes"));
        }
        let caller = self.delegated.authenticate(token).await?;
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
        let action = Action::Resource {
            namespace: namespace.to_owned(),
            verb: verb.to_owned(),
            group: hangar_crds::GROUP.to_owned(),
            resource: resource.to_owned(),
        };
        if self.delegated.allowed(caller, &action).await? {
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

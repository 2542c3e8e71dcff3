//! Member auth: the bearer token is a Kubernetes token, checked with a
//! TokenReview; each action is then authorised with a SubjectAccessReview
//! against the Sandbox's namespace, so a member may do through the gateway
//! exactly what RBAC lets them do with kubectl. Answers are cached briefly
//! (by token digest, never the token) to keep the apiserver out of the hot
//! path of a long-polling client.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hangar_crds::ErrorCode;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::api::{Api, PostParams};

use crate::error::ApiError;

const CACHE_FOR: Duration = Duration::from_secs(10);

#[derive(Clone, Debug, PartialEq)]
pub struct Caller {
    pub user: String,
    pub uid: Option<String>,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

pub struct Auth {
    client: kube::Client,
    tokens: Mutex<HashMap<Vec<u8>, (Instant, Caller)>>,
    decisions: Mutex<HashMap<String, (Instant, bool)>>,
}

impl Auth {
    pub fn new(client: kube::Client) -> Self {
        Self { client, tokens: Mutex::default(), decisions: Mutex::default() }
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
            return Ok(c);
        }
        let review = TokenReview {
            spec: TokenReviewSpec { token: token.to_owned(), ..Default::default() },
            ..Default::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let answer = api.create(&PostParams::default(), &review).await?;
        let status = answer.status.unwrap_or_default();
        let user = status.user.filter(|_| status.authenticated == Some(true));
        let Some(user) = user else {
            return Err(ApiError::new(ErrorCode::TokenInvalid, "the bearer token is not valid"));
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
        Ok(caller)
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

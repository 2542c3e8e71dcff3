//! Writes made in a session token's name (the gateway impersonates
//! `hangar:token:<namespace>:<name>` in group `hangar:session-tokens`; so
//! may anyone allowed to impersonate, e.g. with `kubectl --as`). RBAC lets
//! that group create and patch Commands and patch Sandboxes anywhere; this
//! is where each such write is held to the token: it must be active, of
//! this session, and hold the scope the write needs
//! (`hangar_core::tokens::scope::decide`, the gateway's decision too).
//!
//! - a Command create: `exec` (decided before the command's place is taken,
//!   in `commands`);
//! - a Command update: setting `spec.cancel` and nothing else, `exec`;
//! - a Sandbox update: `spec.state` (pause, resume, stop) or
//!   `spec.revokeAll`, `control`;
//! - anything else — a delete, a status write, a token, a template, any
//!   other field — is no token's.

use hangar_core::tokens::scope::{self, Action};
use hangar_crds::{Command, ErrorCode, Sandbox, SessionToken};
use k8s_openapi::api::authentication::v1::UserInfo;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, Operation};
use kube::runtime::reflector::ObjectRef;

use super::caches::Caches;
use super::{AdmissionError, Refusal};

pub struct TokenCallers {
    client: kube::Client,
    caches: Caches,
}

/// Who sent a request: its username, as the ledger keeps it.
pub fn sender(user: &UserInfo) -> Option<String> {
    user.username.clone()
}

fn forbidden(text: impl Into<String>) -> Refusal {
    Refusal::new(ErrorCode::TokenScopeForbidden, text)
}

impl TokenCallers {
    pub fn new(client: kube::Client, caches: &Caches) -> Self {
        Self { client, caches: caches.clone() }
    }

    /// `None` when `user` is no token identity; else the token, or why the
    /// request is refused (no such token).
    async fn token(
        &self,
        user: &UserInfo,
        namespace: &str,
    ) -> Result<Option<Result<SessionToken, Refusal>>, AdmissionError> {
        let in_group = user.groups.as_ref().is_some_and(|g| g.iter().any(|g| g == scope::GROUP));
        let username = user.username.as_deref().unwrap_or_default();
        let named = scope::token_of_identity(username);
        if !in_group && named.is_none() && !username.starts_with(scope::IDENTITY_PREFIX) {
            return Ok(None);
        }
        let Some((token_ns, name)) = named else {
            return Ok(Some(Err(forbidden("this identity names no session token"))));
        };
        if token_ns != namespace {
            return Ok(Some(Err(forbidden("this token is for another session"))));
        }
        let cached = self.caches.tokens.get(&ObjectRef::new(name).within(token_ns)).map(|t| (*t).clone());
        let token = match cached {
            Some(t) => Some(t),
            None => Api::<SessionToken>::namespaced(self.client.clone(), token_ns).get_opt(name).await?,
        };
        Ok(Some(token.ok_or_else(|| Refusal::new(ErrorCode::TokenInvalid, "no such session token"))))
    }

    async fn session(&self, namespace: &str, name: &str) -> Result<Option<Sandbox>, AdmissionError> {
        match self.caches.sandboxes.get(&ObjectRef::new(name).within(namespace)) {
            Some(s) => Ok(Some((*s).clone())),
            None => Ok(Api::<Sandbox>::namespaced(self.client.clone(), namespace).get_opt(name).await?),
        }
    }

    /// A Command create: `None` to go on (not a token, or a token that may),
    /// else the refusal.
    pub async fn command_create(
        &self,
        user: &UserInfo,
        namespace: &str,
        command: &Command,
    ) -> Result<Option<Refusal>, AdmissionError> {
        let Some(token) = self.token(user, namespace).await? else {
            return Ok(None);
        };
        let token = match token {
            Ok(t) => t,
            Err(r) => return Ok(Some(r)),
        };
        let Some(session) = self.session(namespace, &command.spec.sandbox).await? else {
            return Ok(Some(forbidden("this token is for another session")));
        };
        Ok(scope::decide(&token, &session, Action::SendCommand, Timestamp::now()).err())
    }

    /// Any other write by a token identity (the webhook configuration sends
    /// only those): `None` to allow.
    pub async fn write(&self, req: &AdmissionRequest<DynamicObject>) -> Result<Option<Refusal>, AdmissionError> {
        let namespace = req.namespace.clone().unwrap_or_default();
        let Some(token) = self.token(&req.user_info, &namespace).await? else {
            return Ok(None);
        };
        let token = match token {
            Ok(t) => t,
            Err(r) => return Ok(Some(r)),
        };
        let main = req.sub_resource.as_deref().unwrap_or_default().is_empty();
        let (session, action) = match (&req.operation, req.kind.kind.as_str(), main) {
            (Operation::Update, "Command", true) => {
                let (old, new): (Command, Command) = (typed(&req.old_object)?, typed(&req.object)?);
                let Some(session) = self.session(&namespace, &old.spec.sandbox).await? else {
                    return Ok(Some(forbidden("this token is for another session")));
                };
                if !old.belongs_to(&session) {
                    return Ok(Some(forbidden("this command is of another session")));
                }
                (session, scope::command_change(&old, &new))
            }
            (Operation::Update, "Sandbox", true) => {
                let (old, new): (Sandbox, Sandbox) = (typed(&req.old_object)?, typed(&req.object)?);
                let action = scope::sandbox_change(&old, &new);
                (old, action)
            }
            _ => return Ok(Some(forbidden("a session token cannot do this; a member of the namespace can"))),
        };
        Ok(scope::decide(&token, &session, action, Timestamp::now()).err())
    }
}

fn typed<K: serde::de::DeserializeOwned>(object: &Option<DynamicObject>) -> Result<K, AdmissionError> {
    let object = object.as_ref().ok_or(AdmissionError::NoObject)?;
    let value = serde_json::to_value(object).map_err(|source| AdmissionError::Decode { kind: "object", source })?;
    serde_json::from_value(value).map_err(|source| AdmissionError::Decode { kind: "object", source })
}

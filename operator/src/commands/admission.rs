//! Command admission, decided in the leader (`hangar_crds::command_admission`):
//! the webhook checks the caller's token scope and asks here whether the
//! session takes the command: it must exist and not have ended, and its
//! limits must hold (at most 247 commands in all, 64 not finished).
//!
//! The leader is the one process that numbers a session's commands, so it
//! decides them too, on the session's ledger in its memory
//! (`command_ledger::SessionLedger`) and its watch caches, under the
//! session's lock: no write to the apiserver on the way, and exact however
//! many webhook replicas ask at once. The place an admitted create takes is
//! written with its number, once the command is stored. Staleness is safe:
//! - a Sandbox not in the cache yet is read from the API;
//! - an end the webhook admitted is announced here before the apiserver
//!   stores it (`EndingNotice`), so a command sent right after is refused;
//! - a command created a moment ago and not in the cache yet holds its
//!   reservation, counted until it appears; one deleted a moment ago only
//!   makes the count stricter, except that its name would look taken, so a
//!   name the cache shows taken is checked against the API;
//! - after a restart or a change of leader the ledger is read again, and a
//!   command stored without a written place counts all the same.

use hangar_core::admission::command_creates;
use hangar_core::commands::ledger::{Create, Live, Place};
use hangar_core::refusal::Refusal;
use hangar_crds::command_admission::CommandAdmissionRequest;
use hangar_crds::{Command, DesiredState, Sandbox};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;

use crate::context::Context;
use crate::error::Result;

/// Decides `req`: the place it takes, or the refusal.
pub async fn decide(ctx: &Context, req: &CommandAdmissionRequest) -> Result<Result<Place, Refusal>> {
    let (ns, name) = (req.namespace.as_str(), req.sandbox.as_str());
    let cached = ctx.sandboxes.get().and_then(|s| s.get(&ObjectRef::new(name).within(ns))).map(|s| (*s).clone());
    let mut sandbox = match cached {
        Some(s) => Some(s),
        None => Api::<Sandbox>::namespaced(ctx.client.clone(), ns).get_opt(name).await?,
    };
    if let Some(s) = sandbox.as_mut()
        && ctx.numbering.is_ending(&s.uid().unwrap_or_default())
    {
        // Its end is admitted and on its way to the cache.
        s.spec.state = DesiredState::Ended;
    }
    let lock = ctx.numbering.lock_for(&format!("{ns}/{name}"));
    let mut held = lock.lock().await;
    if let Some(s) = &sandbox {
        held.load(ctx, &s.uid().unwrap_or_default()).await?;
    }
    let create = Create { uid: req.uid.clone(), name: req.name.clone(), sender: req.sender.clone() };
    let live = live_commands(ctx, ns, name, &create).await?;
    let now = Timestamp::now().as_second();
    let creates = [create];
    let mut decided = if req.dry_run || sandbox.is_none() {
        let mut scratch = held.current.clone();
        command_creates(ns, name, sandbox.as_ref(), &mut scratch, &creates, &live, now)
    } else {
        command_creates(ns, name, sandbox.as_ref(), &mut held.current, &creates, &live, now)
    };
    Ok(decided.remove(0))
}

/// Every command under the Sandbox's name, of any earlier session too
/// (their names are taken; the ledger counts only its own), from the
/// cache; a name the cache shows taken by another object is checked
/// against the API (it may have been deleted since).
async fn live_commands(ctx: &Context, ns: &str, name: &str, create: &Create) -> Result<Vec<Live>> {
    let mut live: Vec<Live> = ctx
        .commands
        .state()
        .iter()
        .filter(|c| c.metadata.namespace.as_deref() == Some(ns) && c.spec.sandbox == name)
        .map(|c| Live::of(c))
        .collect();
    if live.iter().any(|l| l.name == create.name && l.uid != create.uid)
        && Api::<Command>::namespaced(ctx.client.clone(), ns).get_opt(&create.name).await?.is_none()
    {
        live.retain(|l| l.name != create.name);
    }
    Ok(live)
}

/// The node service's admission routes: only the configured callers (the
/// webhook's identity, proven by its token's TokenReview) are answered.
pub mod service {
    use std::sync::Arc;

    use bytes::Bytes;
    use hangar_crds::command_admission::{CommandAdmissionAnswer, CommandAdmissionRequest, EndingNotice};
    use hangar_runtime::delegated_auth::DelegatedAuth;
    use hangar_runtime::https::RequestBody;
    use http::{Request, Response, StatusCode};
    use http_body_util::{BodyExt, Full};

    use crate::context::Context;
    use crate::workspace_keys::{caller_of, error, json};

    /// The refusal to send unless the request's token is one of the
    /// configured admission callers'.
    async fn caller_refused(
        ctx: &Context,
        auth: &DelegatedAuth,
        req: &Request<RequestBody>,
    ) -> Option<Response<Full<Bytes>>> {
        match caller_of(auth, req, "unauthorized").await {
            Ok(c) if ctx.settings.admission_callers.iter().any(|a| a == &c.user) => None,
            Ok(c) => {
                tracing::warn!(user = %c.user, "an admission request from a caller not configured");
                Some(error(StatusCode::FORBIDDEN, "forbidden"))
            }
            Err(refused) => Some(refused),
        }
    }

    async fn body<T: serde::de::DeserializeOwned>(req: Request<RequestBody>) -> Result<T, Response<Full<Bytes>>> {
        let bytes = req.into_body().collect().await.map_err(|_| error(StatusCode::PAYLOAD_TOO_LARGE, "too_large"))?;
        serde_json::from_slice(&bytes.to_bytes()).map_err(|_| error(StatusCode::BAD_REQUEST, "bad_request"))
    }

    /// `POST /v1/admission/commands`.
    pub async fn decide(ctx: &Arc<Context>, auth: &DelegatedAuth, req: Request<RequestBody>) -> Response<Full<Bytes>> {
        if let Some(refused) = caller_refused(ctx, auth, &req).await {
            return refused;
        }
        let asked: CommandAdmissionRequest = match body(req).await {
            Ok(a) => a,
            Err(r) => return r,
        };
        let span = tracing::info_span!("decide_command", namespace = %asked.namespace, sandbox = %asked.sandbox,
            command = %asked.name);
        let decided = tracing::Instrument::instrument(super::decide(ctx, &asked), span.clone()).await;
        let answer = match decided {
            Ok(Ok(_)) => CommandAdmissionAnswer { allowed: true, code: None, reason: None },
            Ok(Err(r)) => {
                span.in_scope(|| tracing::info!(code = r.code.as_str(), "command refused"));
                CommandAdmissionAnswer { allowed: false, code: Some(r.code.as_str().to_owned()), reason: Some(r.text) }
            }
            Err(e) => {
                span.in_scope(|| tracing::warn!(error = %e, "could not decide a command"));
                return error(StatusCode::SERVICE_UNAVAILABLE, "unavailable");
            }
        };
        json(StatusCode::OK, &answer)
    }

    /// `POST /v1/admission/endings`.
    pub async fn ending(ctx: &Arc<Context>, auth: &DelegatedAuth, req: Request<RequestBody>) -> Response<Full<Bytes>> {
        if let Some(refused) = caller_refused(ctx, auth, &req).await {
            return refused;
        }
        let notice: EndingNotice = match body(req).await {
            Ok(n) => n,
            Err(r) => return r,
        };
        tracing::info!(namespace = %notice.namespace, sandbox = %notice.sandbox, "an end was admitted");
        ctx.numbering.mark_ending(&notice.uid);
        json(StatusCode::OK, &serde_json::json!({}))
    }
}

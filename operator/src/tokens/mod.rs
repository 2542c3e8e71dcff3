//! The SessionToken controller: mints each new token's plaintext, keeps
//! only its digest, delivers the plaintext once, and keeps the token's
//! phase (`active` → `expired` or `revoked`, both final:
//! `hangar_core::tokens`).
//!
//! Delivery on the `kubectl apply` path: a Secret beside the token
//! (`<token>-hgt`, owned by it) holds the plaintext for
//! [`DELIVERY_SECONDS`] and is deleted then, or as soon as the token is
//! no longer active. The creator reads it once with their own rights in
//! their namespace; the operator may create and delete Secrets there but
//! never read one. Why a Secret: the creator has no other channel to the
//! controller, a Secret is what RBAC and audit already guard, and a short
//! life bounds how long a plaintext exists at rest. (The gateway's token
//! route answers the plaintext in its response instead.)
//!
//! Crash safety: the Secret is written before the digest. A pass that
//! crashed between the two is repeated with a new plaintext, which
//! replaces the Secret, so the recorded digest always matches what was
//! delivered; once a digest is recorded no plaintext is made again.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use hangar_core::tokens;
use hangar_crds::Sandbox;
use hangar_crds::session_token::{SessionToken, TokenPhase};
use hangar_runtime::controllers;
use hangar_runtime::kube_ext::{ignore_not_found, is_already_exists, try_swap_status};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::controller::Action as Requeue;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::{Instrument, info_span, warn};

use crate::context::Context;
use crate::error::{Error, Result};

/// How long the plaintext waits in its Secret for the creator.
pub const DELIVERY_SECONDS: i64 = 600;

/// The Secret that delivers token `name`'s plaintext.
pub fn delivery_secret_name(name: &str) -> String {
    format!("{name}-hgt")
}

pub async fn run(ctx: Arc<Context>) {
    let api: Api<SessionToken> = match ctx.settings.watch_namespaces.as_slice() {
        [one] => Api::namespaced(ctx.client.clone(), one),
        _ => Api::all(ctx.client.clone()),
    };
    let sandboxes: Api<Sandbox> = match ctx.settings.watch_namespaces.as_slice() {
        [one] => Api::namespaced(ctx.client.clone(), one),
        _ => Api::all(ctx.client.clone()),
    };
    let watched = ctx.settings.watch_namespaces.clone();
    let controller = controllers::controller(api, watcher::Config::default().any_semantic());
    // A session that ends (or goes) changes its tokens' phase: each
    // Sandbox change reconciles the tokens that name it.
    let tokens = controller.store();
    let _ = ctx.tokens.set(tokens.clone());
    controller
        .watches_stream(controllers::watch(sandboxes, watcher::Config::default()), move |sandbox: Sandbox| {
            let (ns, name) = (sandbox.namespace(), sandbox.name_any());
            tokens
                .state()
                .into_iter()
                .filter(|t| t.namespace() == ns && t.spec.sandbox == name)
                .map(|t| ObjectRef::from_obj(&*t))
                .collect::<Vec<_>>()
        })
        .shutdown_on_signal()
        .run(
            move |t, ctx| {
                let serves = watched.is_empty() || t.namespace().is_some_and(|ns| watched.contains(&ns));
                reconcile(t, ctx, serves)
            },
            |t, e, _| {
                warn!(token = %t.name_any(), error = %e, "session token reconcile failed; retrying");
                Requeue::requeue(Duration::from_secs(1))
            },
            ctx,
        )
        .for_each(|_| futures::future::ready(()))
        .await;
}

async fn reconcile(token: Arc<SessionToken>, ctx: Arc<Context>, serves: bool) -> Result<Requeue> {
    if !serves {
        return Ok(Requeue::await_change());
    }
    let ns = token.namespace().unwrap_or_default();
    let span = info_span!("reconcile_session_token", namespace = %ns, token = %token.name_any(), sandbox = %token.spec.sandbox);
    async move {
        let api: Api<SessionToken> = Api::namespaced(ctx.client.clone(), &ns);
        let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
        let sandbox = Api::<Sandbox>::namespaced(ctx.client.clone(), &ns).get_opt(&token.spec.sandbox).await?;
        let status = token.status.clone().unwrap_or_default();
        let now = Timestamp::now();
        let created = token.metadata.creation_timestamp.as_ref().map_or(now, |t| t.0);
        if status.digest.is_none() && status.phase.is_none() {
            if token.annotations().contains_key(hangar_crds::session_token::ISSUED_BY_GATEWAY_ANNOTATION) {
                return await_gateway(&api, &token, created, now).await;
            }
            return mint(&api, &secrets, &token, sandbox.as_ref(), created, now).await;
        }
        let expires = status.expires_at.as_ref().map_or(now, |t| t.0);
        // An ending session's tokens are revoked by its reset (its first
        // step, which also cancels what is still queued); here only those
        // of a session that is gone. Callers are refused from the moment
        // the session ends either way (`tokens::scope`).
        let ending = sandbox.as_ref().is_some_and(Sandbox::has_ended);
        let next = tokens::phase(status.phase, token.spec.revoked, &token.spec.scopes, expires, sandbox.is_none(), now);
        if Some(next.phase) != status.phase {
            let mut patch = json!({"phase": next.phase, "reason": next.reason});
            if next.phase == TokenPhase::Revoked {
                patch["revokedAt"] = json!(Time(now));
            }
            if !try_swap_status(&api, &*token, patch).await? {
                return Ok(Requeue::requeue(Duration::from_millis(50)));
            }
            tracing::info!(phase = ?next.phase, reason = next.reason, "session token");
        }
        // The plaintext waits only while the token is active, and not
        // past its delivery deadline.
        let deliver_until = created + SignedDuration::from_secs(DELIVERY_SECONDS);
        if let Some(secret) = status.secret_name.as_deref()
            && (next.phase != TokenPhase::Active || now >= deliver_until)
        {
            ignore_not_found(secrets.delete(secret, &DeleteParams::default()).await)?;
            try_swap_status(&api, &*token, json!({"secretName": null})).await?;
            return Ok(Requeue::await_change());
        }
        if next.phase != TokenPhase::Active {
            if !ending {
                cancel_its_queued_commands(&ctx, &token).await?;
            }
            return Ok(Requeue::await_change());
        }
        let mut wake = expires;
        if status.secret_name.is_some() {
            wake = wake.min(deliver_until);
        }
        let left = wake.duration_since(now).unsigned_abs();
        Ok(Requeue::requeue(left + Duration::from_millis(100)))
    }
    .instrument(span)
    .await
}

/// A token the gateway's token route made: the gateway mints its plaintext,
/// answers it in its response and records the digest itself; the operator
/// makes no Secret for it. One the gateway never issued (it crashed between
/// the create and the status) is revoked after [`GATEWAY_ISSUE_SECONDS`].
pub const GATEWAY_ISSUE_SECONDS: i64 = 60;

async fn await_gateway(
    api: &Api<SessionToken>,
    token: &SessionToken,
    created: Timestamp,
    now: Timestamp,
) -> Result<Requeue> {
    let deadline = created + SignedDuration::from_secs(GATEWAY_ISSUE_SECONDS);
    if now < deadline {
        return Ok(Requeue::requeue(deadline.duration_since(now).unsigned_abs() + Duration::from_millis(100)));
    }
    let patch = json!({"phase": "revoked", "reason": "not_issued", "revokedAt": Time(now)});
    try_swap_status(api, token, patch).await?;
    Ok(Requeue::await_change())
}

/// Every command `token` sent that has not started is cancelled: a token's
/// end ends its authority (a command it started runs on). Commands not yet
/// numbered are cancelled as they are numbered (`commands`).
async fn cancel_its_queued_commands(ctx: &Context, token: &SessionToken) -> Result<()> {
    let ns = token.namespace().unwrap_or_default();
    let identity = tokens::scope::identity(&ns, &token.name_any());
    let api: Api<hangar_crds::Command> = Api::namespaced(ctx.client.clone(), &ns);
    for c in ctx.commands.state() {
        let st = c.status.clone().unwrap_or_default();
        if c.namespace().as_deref() == Some(ns.as_str())
            && st.sender.as_deref() == Some(identity.as_str())
            && st.phase == Some(hangar_crds::CommandPhase::Queued)
        {
            crate::commands::cancel_queued(&api, &c, crate::commands::TOKEN_ENDED).await?;
            tracing::info!(command = %c.name_any(), "cancelled: the token that sent it ended");
        }
    }
    Ok(())
}

/// A new token: nothing minted for a session that is gone or has ended, or
/// past the session's 32 active tokens (in creation order: two made at once
/// past the admission check cannot both be the 32nd); else the plaintext
/// into its Secret, then the digest into the status.
async fn mint(
    api: &Api<SessionToken>,
    secrets: &Api<Secret>,
    token: &SessionToken,
    sandbox: Option<&Sandbox>,
    created: Timestamp,
    now: Timestamp,
) -> Result<Requeue> {
    // Decided on the token as stored, not as cached: the cache can lag our
    // own last status write (a pass woken by the delivery Secret's creation
    // sees the token still unminted), and minting again would replace the
    // delivered plaintext under a digest already recorded for the first.
    let Some(stored) = api.get_opt(&token.name_any()).await? else {
        return Ok(Requeue::await_change());
    };
    if stored.status.as_ref().is_some_and(|s| s.digest.is_some() || s.phase.is_some()) {
        return Ok(Requeue::requeue(Duration::from_millis(50)));
    }
    let token = &stored;
    let earlier = |t: &SessionToken| {
        let key = |t: &SessionToken| (t.metadata.creation_timestamp.as_ref().map(|c| c.0), t.name_any());
        key(t) < key(token)
    };
    let refused = match sandbox {
        None => Some("sandbox_not_found"),
        Some(s) if s.has_ended() => Some("session_ended"),
        Some(s) => {
            let siblings = api.list(&Default::default()).await?.items;
            let before = siblings.iter().filter(|t| earlier(t));
            tokens::token_create("", "", Some(s), before, token.uid().as_deref(), now)
                .err()
                .map(|_| "sandbox_token_limit")
        }
    };
    if let Some(reason) = refused {
        let patch = json!({"phase": "revoked", "reason": reason, "revokedAt": Time(now)});
        try_swap_status(api, token, patch).await?;
        return Ok(Requeue::await_change());
    }
    let sandbox = sandbox.expect("checked");
    let expires = tokens::expires_for(sandbox, created, token.spec.ttl_seconds);
    let plaintext = hangar_keys::token::new_plaintext().map_err(Error::Key)?;
    let name = delivery_secret_name(&token.name_any());
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            owner_references: token.controller_owner_ref(&()).map(|r| vec![r]),
            labels: Some([("hangar.dev/session-token".to_owned(), token.name_any())].into()),
            ..Default::default()
        },
        data: Some([("token".to_owned(), ByteString(plaintext.as_bytes().to_vec()))].into()),
        type_: Some("Opaque".into()),
        ..Default::default()
    };
    // One left by a pass that crashed before recording its digest (or put
    // there by someone else) is not this token's: replaced.
    if let Err(e) = secrets.create(&PostParams::default(), &secret).await {
        if !is_already_exists(&e) {
            return Err(e.into());
        }
        ignore_not_found(secrets.delete(&name, &DeleteParams::default()).await)?;
        secrets.create(&PostParams::default(), &secret).await?;
    }
    let patch = json!({
        "phase": "active",
        "digest": hangar_keys::token::digest(&plaintext),
        "expiresAt": Time(expires),
        "sessionId": sandbox.uid(),
        "secretName": name,
    });
    if !try_swap_status(api, token, patch).await? {
        // Changed meanwhile: the next pass mints again and replaces the Secret.
        return Ok(Requeue::requeue(Duration::from_millis(50)));
    }
    tracing::info!(expires_at = %expires, "session token minted; its plaintext waits in its Secret");
    Ok(Requeue::requeue(Duration::from_secs(1)))
}

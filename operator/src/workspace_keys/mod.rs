//! The workspace key service: hands a session's 64-byte workspace key to
//! the worker on that session's instance, and to nothing else. It runs in
//! the leader only (the nonces it issued live in its memory), over TLS.
//! The same listener (the operator's node service) also serves a session
//! node its session's commands (`node::commands_feed`) and the admission
//! webhook its command admission decisions (`commands::admission`).
//!
//! The worker proves which instance it runs on with the EC2 identity
//! document and its `rsa2048` signature (checked against the configured
//! regional certificate), plus a nonce issued here and used once. The
//! operator then asks the Sandbox and a fresh DescribeInstances whether
//! that instance is the session's current one, running, tagged with the
//! session, of this account, in this boot (`hangar_core::workspace_key`).
//! A refusal tells the caller nothing of why; the log and
//! `hangar_workspace_key_requests{result}` do.

pub mod nonces;

use std::sync::Arc;
use std::time::Instant;

use base64::Engine;
use bytes::Bytes;
use hangar_core::workspace_key::{IdentityDocument, KeyRefusal, SessionNow, judge};
use hangar_crds::Sandbox;
use hangar_crds::workspace_key::{KEY_PATH, KeyRequest, KeyResponse, NONCE_PATH, NonceResponse, REFUSED};
use hangar_keys::instance_identity::{RegionalCertificate, verify};
use hangar_runtime::https::{self, RequestBody};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::runtime::events::EventType;
use tracing::{info, warn};
use zeroize::Zeroizing;

use crate::context::Context;
use nonces::Nonces;

/// A key request is a few kilobytes (the document and its signature).
const MAX_BODY: usize = 16 * 1024;

pub struct KeyService {
    ctx: Arc<Context>,
    /// The node service's other routes: a session's commands for its
    /// node, and command admission for the webhook; callers proven by
    /// their tokens.
    commands: crate::node::commands_feed::CommandsFeed,
    auth: Arc<hangar_runtime::delegated_auth::DelegatedAuth>,
    regional: RegionalCertificate,
    nonces: Nonces,
}

/// Why no key was handed over.
#[derive(Debug, thiserror::Error)]
enum HandOverError {
    #[error("refused: {0}")]
    Refused(#[from] KeyRefusal),
    /// The apiserver or EC2 did not answer: the worker asks again.
    #[error("could not decide now: {0}")]
    Unavailable(String),
}

impl KeyService {
    pub fn new(ctx: Arc<Context>, regional: RegionalCertificate) -> Arc<Self> {
        let rate = std::num::NonZeroU32::new(50).expect("non-zero");
        let auth = Arc::new(hangar_runtime::delegated_auth::DelegatedAuth::new(ctx.client.clone(), None, rate));
        let commands = crate::node::commands_feed::CommandsFeed::new(ctx.clone(), auth.clone());
        Arc::new(Self { ctx, regional, nonces: Nonces::default(), commands, auth })
    }

    /// Serves until the process ends.
    pub async fn serve(self: Arc<Self>, listener: tokio::net::TcpListener, tls: Arc<rustls::ServerConfig>) {
        let limits = https::Limits { max_body_bytes: MAX_BODY, ..https::Limits::default() };
        https::serve(listener, tls, limits, https::shutdown_signal(), move |req| {
            let svc = self.clone();
            async move { svc.handle(req).await }
        })
        .await;
    }

    async fn handle(&self, req: Request<RequestBody>) -> Response<Full<Bytes>> {
        match (req.method(), req.uri().path()) {
            (&Method::POST, NONCE_PATH) => match self.nonces.issue() {
                Some(nonce) => json(StatusCode::OK, &NonceResponse { nonce }),
                None => error(StatusCode::SERVICE_UNAVAILABLE, "too_many_nonces"),
            },
            (&Method::POST, KEY_PATH) => {
                let body = match req.into_body().collect().await {
                    Ok(b) => b.to_bytes(),
                    Err(_) => return error(StatusCode::PAYLOAD_TOO_LARGE, "request_too_large"),
                };
                let started = Instant::now();
                let (namespace, name) =
                    serde_json::from_slice::<KeyRequest>(&body).map(|r| (r.namespace, r.sandbox)).unwrap_or_default();
                match self.hand_over(&body).await {
                    Ok(key) => {
                        self.ctx.metrics.workspace_key_granted(started.elapsed());
                        info!(%namespace, sandbox = %name, "workspace key handed to the session's instance");
                        let key = Zeroizing::new(base64::engine::general_purpose::STANDARD.encode(key.as_slice()));
                        json(StatusCode::OK, &KeyResponse { key: key.to_string() })
                    }
                    Err(HandOverError::Refused(r)) => {
                        self.ctx.metrics.workspace_key_refused(r.reason());
                        warn!(%namespace, sandbox = %name, reason = r.reason(), "workspace key refused: {r}");
                        error(StatusCode::FORBIDDEN, REFUSED)
                    }
                    Err(e @ HandOverError::Unavailable(_)) => {
                        warn!(%namespace, sandbox = %name, error = %e, "workspace key request not decided");
                        error(StatusCode::SERVICE_UNAVAILABLE, "unavailable")
                    }
                }
            }
            (&Method::GET, hangar_crds::node_commands::PATH) => self.commands.handle(req).await,
            (&Method::POST, hangar_crds::command_admission::PATH) => {
                crate::commands::admission::service::decide(&self.ctx, &self.auth, req).await
            }
            (&Method::POST, hangar_crds::command_admission::ENDING_PATH) => {
                crate::commands::admission::service::ending(&self.ctx, &self.auth, req).await
            }
            _ => error(StatusCode::NOT_FOUND, "not_found"),
        }
    }

    async fn hand_over(&self, body: &[u8]) -> Result<Zeroizing<Vec<u8>>, HandOverError> {
        let req: KeyRequest = serde_json::from_slice(body).map_err(|_| KeyRefusal::Malformed)?;
        // Used up whatever follows, so a request can be tried only once.
        if !self.nonces.take(&req.nonce) {
            return Err(KeyRefusal::Nonce.into());
        }
        verify(&self.regional, req.document.as_bytes(), &req.signature).map_err(|_| KeyRefusal::Signature)?;
        let doc: IdentityDocument = serde_json::from_str(&req.document).map_err(|_| KeyRefusal::Malformed)?;
        let ctx = &self.ctx;
        let sandboxes: Api<Sandbox> = Api::namespaced(ctx.client.clone(), &req.namespace);
        let sandbox = sandboxes
            .get_opt(&req.sandbox)
            .await
            .map_err(|e| HandOverError::Unavailable(e.to_string()))?
            .filter(|s| s.metadata.uid.as_deref() == Some(req.session_id.as_str()));
        let status = sandbox.as_ref().and_then(|s| s.status.as_ref());
        let session = sandbox.as_ref().map(|_| SessionNow {
            session_id: &req.session_id,
            phase: status.and_then(|s| s.phase),
            instance_id: status.and_then(|s| s.instance_id.as_deref()),
            region: &ctx.settings.aws_region,
        });
        let instance = match &session {
            // Described only for a session that could be served: a caller
            // cannot make the operator describe arbitrary ids.
            Some(_) => ctx
                .ec2
                .describe_for_identity(&doc.instance_id)
                .await
                .map_err(|e| HandOverError::Unavailable(e.to_string()))?,
            None => None,
        };
        judge(&doc, session.as_ref(), instance.as_ref())?;
        let key = self.session_key(&req.session_id).await?;
        if let Some(sandbox) = &sandbox {
            let note = format!("workspace key handed to instance {}", doc.instance_id);
            crate::lifecycle::publish(ctx, sandbox, "WorkspaceKeyHandedOver", &note, EventType::Normal);
        }
        Ok(key)
    }

    async fn session_key(&self, session_id: &str) -> Result<Zeroizing<Vec<u8>>, HandOverError> {
        let ctx = &self.ctx;
        let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ctx.settings.system_namespace);
        let secret = secrets
            .get_opt(&crate::keys::secret_name(session_id))
            .await
            .map_err(|e| HandOverError::Unavailable(e.to_string()))?
            // Made before the instance is launched: gone means destroyed.
            .ok_or(KeyRefusal::SessionNotServing)?;
        let sealed = secret
            .data
            .as_ref()
            .and_then(|d| d.get("sealed-key"))
            .ok_or_else(|| HandOverError::Unavailable("the session key Secret has no sealed key".into()))?;
        ctx.org_key
            .unseal(&sealed.0, session_id)
            .map_err(|e| HandOverError::Unavailable(format!("the session key does not open: {e}")))
    }
}

/// The caller a request's bearer token belongs to (a TokenReview, cached),
/// for the node service's routes that take a Kubernetes token; else the
/// answer to send: 401 with `unauthorized_code`, 429, or 503 when the
/// apiserver did not answer.
pub(crate) async fn caller_of<B>(
    auth: &hangar_runtime::delegated_auth::DelegatedAuth,
    req: &Request<B>,
    unauthorized_code: &str,
) -> Result<hangar_runtime::delegated_auth::Caller, Response<Full<Bytes>>> {
    use hangar_runtime::delegated_auth::{AuthError, bearer};
    let authorization = req.headers().get(http::header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    let caller = match bearer(authorization) {
        Ok(token) => auth.authenticate(token).await,
        Err(e) => Err(e),
    };
    caller.map_err(|e| match e {
        AuthError::Api(e) => {
            warn!(path = %req.uri().path(), error = %e, "could not review a token");
            error(StatusCode::SERVICE_UNAVAILABLE, "unavailable")
        }
        AuthError::RateLimited => error(StatusCode::TOO_MANY_REQUESTS, "rate_limited"),
        _ => error(StatusCode::UNAUTHORIZED, unauthorized_code),
    })
}

pub(crate) fn json<T: serde::Serialize>(status: StatusCode, body: &T) -> Response<Full<Bytes>> {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .header("cache-control", "no-store")
        .body(Full::new(Bytes::from(bytes)))
        .unwrap_or_default()
}

pub(crate) fn error(status: StatusCode, code: &str) -> Response<Full<Bytes>> {
    json(status, &serde_json::json!({ "error": code }))
}

//! The route table of the session API (ARCHITECTURE §5): members (a
//! Kubernetes bearer token) and session tokens (`hgt_…` with a
//! `Hangar-Proof`) on the same routes, each route one act
//! ([`Act`]); `/v1/sandbox-session/…` takes a `control` token alone.

use std::sync::Arc;
use std::time::Duration;

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::header::AUTHORIZATION;
use axum::http::{HeaderMap, Method, Request, Response, StatusCode, Uri};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use hangar_core::session::requests;
use hangar_core::tokens::scope::{self, Action};
use hangar_crds::{Command, ErrorCode, Sandbox, SessionToken};
use hangar_runtime::https::RequestBody;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::acting::Acting;
use crate::auth::{Auth, Caller};
use crate::error::ApiError;
use crate::index::Index;
use crate::output::OutputReader;
use crate::session_tokens::SessionTokens;
use crate::{commands, openapi, sessions, tokens, views};

/// Attach counts as "a client attached" for idle purposes; the operator
/// reads this annotation.
pub use hangar_core::idle::ATTACHED_AT_ANNOTATION;
const MAX_BODY: usize = 1 << 20;
pub const PROOF_HEADER: &str = "hangar-proof";

pub struct Gateway {
    pub client: kube::Client,
    pub auth: Auth,
    pub index: Index,
    pub tokens: SessionTokens,
    pub output: OutputReader,
    /// How long an output read waits for new bytes (25 s).
    pub long_poll: Duration,
    /// Requests by method and status, and their durations.
    pub http: hangar_runtime::admin::HttpMetrics,
    /// The cap on output reads waiting at once.
    pub long_polls: crate::output::LongPolls,
    /// The groups of a member passed on when acting as them.
    pub impersonable_groups: Vec<String>,
    /// `https://host[:port]` proofs name in `htu`; `None`: the request's Host.
    pub public_url: Option<String>,
}

type Reply = Result<(StatusCode, Json<Value>), ApiError>;

fn ok(status: StatusCode, body: Value) -> Reply {
    Ok((status, Json(body)))
}

/// The route table. Unknown routes answer 404 `not_found`, known routes
/// with another method 405, both in the contract's error shape.
pub fn router(gw: Arc<Gateway>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { Json(json!({"ok": true})) }))
        .route("/v1/openapi.json", get(|| async { Json(openapi::document()) }))
        .route("/v1/sandboxes", post(start_session))
        .route("/v1/sandbox-templates", get(templates))
        .route("/v1/certificate-keys", get(certificate_keys))
        .route("/v1/sandboxes/{id}", get(state))
        .route("/v1/sandboxes/{id}/attach", get(attach))
        .route("/v1/sandboxes/{id}/commands", get(list_commands).post(send_command))
        .route("/v1/sandboxes/{id}/commands/{cid}/output", get(output))
        .route("/v1/sandboxes/{id}/commands/{cid}/cancel", post(cancel))
        .route("/v1/sandboxes/{id}/pause", post(|s, p, c| lifecycle(s, p, c, requests::Request::Pause)))
        .route("/v1/sandboxes/{id}/resume", post(|s, p, c| lifecycle(s, p, c, requests::Request::Resume)))
        .route("/v1/sandboxes/{id}/stop", post(|s, p, c| lifecycle(s, p, c, requests::Request::Stop)))
        .route("/v1/sandboxes/{id}/revoke-all", post(|s, p, c| lifecycle(s, p, c, requests::Request::RevokeAll)))
        .route("/v1/sandboxes/{id}/tokens", post(mint_token))
        .route("/v1/sandboxes/{id}/tokens/{name}", delete(revoke_token))
        .route("/v1/sandboxes/{id}/snapshots", post(snapshot))
        .route("/v1/sandboxes/{id}/certificate", get(certificate))
        .route("/v1/sandbox-session/pause", post(|s, c| token_lifecycle(s, c, requests::Request::Pause)))
        .route("/v1/sandbox-session/resume", post(|s, c| token_lifecycle(s, c, requests::Request::Resume)))
        .route("/v1/sandbox-session/stop", post(|s, c| token_lifecycle(s, c, requests::Request::Stop)))
        .route("/v1/sandbox-session/revoke-all", post(|s, c| token_lifecycle(s, c, requests::Request::RevokeAll)))
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(gw)
}

/// Serves one request through `router`, logged and counted.
pub async fn handle(gw: Arc<Gateway>, router: Router, req: Request<RequestBody>) -> Response<axum::body::Body> {
    let started = std::time::Instant::now();
    let (method, path) = (req.method().clone(), req.uri().path().to_owned());
    let response = match router.oneshot(req.map(axum::body::Body::new)).await {
        Ok(r) => r,
        Err(never) => match never {},
    };
    let status = response.status().as_u16();
    tracing::info!(%method, %path, status, ms = started.elapsed().as_millis() as u64, "request");
    gw.http.observe(method.as_str(), status, started.elapsed());
    response
}

async fn no_route(method: Method, uri: Uri) -> ApiError {
    ApiError::not_found(format!("no route {method} {}", uri.path()))
}

async fn wrong_method(method: Method, uri: Uri) -> ApiError {
    ApiError::method_not_allowed(format!("{} does not take {method}", uri.path()))
}

fn no_session(id: &str) -> ApiError {
    ApiError::new(ErrorCode::SandboxNotFound, format!("no session {id}"))
}

/// What a route does: the act a token needs the scope of, and the RBAC
/// verb and resource a member needs in the session's namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    State,
    Attach,
    ListCommands,
    ReadOutput,
    SendCommand,
    CancelCommand,
    Lifecycle(requests::Request),
    MintToken,
    RevokeToken,
    Snapshot,
    Certificate,
}

impl Act {
    fn token_action(self) -> Action {
        match self {
            Act::State | Act::Certificate => Action::ReadState,
            Act::Attach => Action::Attach,
            Act::ListCommands => Action::ListCommands,
            Act::ReadOutput => Action::ReadOutput,
            Act::SendCommand => Action::SendCommand,
            Act::CancelCommand => Action::CancelCommand,
            Act::Lifecycle(requests::Request::Pause) => Action::Pause,
            Act::Lifecycle(requests::Request::Resume) => Action::Resume,
            Act::Lifecycle(requests::Request::Stop) => Action::Stop,
            Act::Lifecycle(requests::Request::RevokeAll) => Action::RevokeAll,
            Act::MintToken | Act::RevokeToken | Act::Snapshot => Action::MemberOnly,
        }
    }

    fn rbac(self) -> (&'static str, &'static str) {
        match self {
            Act::State | Act::Attach | Act::Certificate => ("get", "sandboxes"),
            Act::ListCommands => ("list", "commands"),
            Act::ReadOutput => ("get", "commands"),
            Act::SendCommand => ("create", "commands"),
            Act::CancelCommand => ("patch", "commands"),
            Act::Lifecycle(_) | Act::Snapshot => ("patch", "sandboxes"),
            Act::MintToken => ("create", "sessiontokens"),
            Act::RevokeToken => ("patch", "sessiontokens"),
        }
    }
}

/// What auth needs of a request: its method, URI (a proof names both)
/// and headers.
pub struct Call {
    pub method: Method,
    pub uri: Uri,
    pub headers: HeaderMap,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Call {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Call { method: parts.method.clone(), uri: parts.uri.clone(), headers: parts.headers.clone() })
    }
}

/// Who is calling.
pub enum Principal {
    Member(Caller),
    Token(Arc<SessionToken>),
}

/// An authorised request: who, the session, and the identity its writes
/// are made as.
pub struct Authorised {
    pub principal: Principal,
    pub session: Arc<Sandbox>,
    pub acting: Acting,
}

impl Authorised {
    /// The rate-limit and Idempotency-Key owner: the member's username or
    /// the token's identity.
    pub fn who(&self) -> &str {
        &self.acting.user
    }
}

fn bearer(headers: &HeaderMap) -> Result<&str, ApiError> {
    headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| ApiError::new(ErrorCode::TokenInvalid, "a bearer token is required"))
}

/// The URL a proof must name: the public base (or this request's Host)
/// and the path.
fn request_url(gw: &Gateway, headers: &HeaderMap, uri: &Uri) -> String {
    let base = match &gw.public_url {
        Some(b) => b.trim_end_matches('/').to_owned(),
        None => {
            let host = headers.get(axum::http::header::HOST).and_then(|h| h.to_str().ok());
            let host = host.or_else(|| uri.authority().map(|a| a.as_str())).unwrap_or_default();
            format!("https://{host}")
        }
    };
    format!("{base}{}", uri.path())
}

/// A session token and its proof, or `token_invalid`.
async fn token_caller(gw: &Gateway, call: &Call) -> Result<Arc<SessionToken>, ApiError> {
    let bearer = bearer(&call.headers)?;
    let proof = call.headers.get(PROOF_HEADER).and_then(|v| v.to_str().ok());
    let url = request_url(gw, &call.headers, &call.uri);
    let token = gw.tokens.authenticate(bearer, proof, call.method.as_str(), &url).await?;
    gw.auth.admit_key(&Acting::token(&token).user)?;
    Ok(token)
}

/// Authenticates (first: an unknown caller learns nothing), finds the
/// session and authorises `act` on it.
///
/// A member: a caller who may not even read the session gets the very
/// answer a session that does not exist gets, so probing ids reveals
/// nothing; `forbidden` is only for one who can see the session but not do
/// this to it. A token: anything but its own session is
/// `token_scope_forbidden`, whether or not the other exists.
async fn authorised(gw: &Gateway, call: &Call, id: &str, act: Act) -> Result<Authorised, ApiError> {
    let headers = &call.headers;
    if bearer(headers)?.starts_with(hangar_keys::token::PREFIX) {
        let token = token_caller(gw, call).await?;
        let session = gw
            .index
            .session(id)
            .ok_or_else(|| ApiError::new(ErrorCode::TokenScopeForbidden, "this token is for another session"))?;
        scope::decide(&token, &session, act.token_action(), Timestamp::now())?;
        let acting = Acting::token(&token);
        return Ok(Authorised { principal: Principal::Token(token), session, acting });
    }
    let caller = gw.auth.authenticate(headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok())).await?;
    let acting = Acting::member(&caller, &gw.impersonable_groups);
    // Authorised as the identity its writes will be made as.
    let caller = Caller { groups: acting.review_groups(&caller), ..caller };
    let session = gw.index.session(id).ok_or_else(|| no_session(id))?;
    let ns = session.namespace().unwrap_or_default();
    match gw.auth.authorize(&caller, &ns, "get", "sandboxes").await {
        Err(e) if e.code == ErrorCode::Forbidden.as_str() => return Err(no_session(id)),
        other => other?,
    }
    let (verb, resource) = act.rbac();
    if (verb, resource) != ("get", "sandboxes") {
        gw.auth.authorize(&caller, &ns, verb, resource).await?;
    }
    Ok(Authorised { principal: Principal::Member(caller), session, acting })
}

async fn state(State(gw): State<Arc<Gateway>>, Path(id): Path<String>, call: Call) -> Reply {
    let a = authorised(&gw, &call, &id, Act::State).await?;
    ok(StatusCode::OK, views::session(&a.session))
}

/// The signed session certificate, as stored (verify it offline with
/// `hangar cert verify`); 409 `sandbox_certificate_pending` until the reset
/// has signed it.
async fn certificate(
    State(gw): State<Arc<Gateway>>,
    Path(id): Path<String>,
    call: Call,
) -> Result<axum::response::Response, ApiError> {
    let a = authorised(&gw, &call, &id, Act::Certificate).await?;
    let session_id = a.session.uid().unwrap_or_default();
    let signed = a.session.status.as_ref().and_then(|s| s.certificate.as_ref()).is_some_and(|c| c.signed_at.is_some());
    let stored = if signed {
        gw.output.store.certificate(&session_id).await.map_err(|e| {
            tracing::warn!(error = %e, "could not read a session certificate from the output store");
            ApiError::internal("the output store did not answer; try again")
        })?
    } else {
        None
    };
    let Some(file) = stored else {
        return Err(ApiError::new(
            ErrorCode::SandboxCertificatePending,
            "the session certificate is signed when the session's reset completes",
        ));
    };
    Ok(axum::response::IntoResponse::into_response(([(axum::http::header::CONTENT_TYPE, "application/json")], file)))
}

async fn list_commands(State(gw): State<Arc<Gateway>>, Path(id): Path<String>, call: Call) -> Reply {
    let a = authorised(&gw, &call, &id, Act::ListCommands).await?;
    let list: Vec<Value> = gw.index.commands_of(&a.session).iter().map(|c| views::command(c, None)).collect();
    ok(StatusCode::OK, json!({"commands": list}))
}

async fn send_command(
    State(gw): State<Arc<Gateway>>,
    Path(id): Path<String>,
    call: Call,
    body: Result<Bytes, BytesRejection>,
) -> Reply {
    let a = authorised(&gw, &call, &id, Act::SendCommand).await?;
    let body = body.map_err(body_error)?;
    let new = commands::parse(&body)?;
    let key = idempotency_key(&call.headers)?;
    let (c, replayed) = commands::send(&gw.client, &a.acting, &a.session, &new, key).await?;
    ok(if replayed { StatusCode::OK } else { StatusCode::CREATED }, views::command(&c, None))
}

async fn cancel(State(gw): State<Arc<Gateway>>, Path((id, cid)): Path<(String, String)>, call: Call) -> Reply {
    let a = authorised(&gw, &call, &id, Act::CancelCommand).await?;
    command_of(&gw, &a.session, &cid).await?;
    let c = commands::cancel(&gw.client, &a.acting, &a.session.namespace().unwrap_or_default(), &cid).await?;
    ok(StatusCode::OK, views::command(&c, None))
}

/// A command of this session, from the index or (just created) the API.
async fn command_of(gw: &Gateway, session: &Sandbox, cid: &str) -> Result<Command, ApiError> {
    let ns = session.namespace().unwrap_or_default();
    let found = match gw.index.commands.get(&ObjectRef::new(cid).within(&ns)) {
        Some(c) => Some((*c).clone()),
        None => Api::<Command>::namespaced(gw.client.clone(), &ns).get_opt(cid).await?,
    };
    found
        .filter(|c| c.belongs_to(session))
        .ok_or_else(|| ApiError::new(ErrorCode::SandboxNotFound, format!("no command {cid} in this session")))
}

/// The session's state and each command's status and stored offset; marks
/// the session attached (for 30 s, for idle purposes).
async fn attach(State(gw): State<Arc<Gateway>>, Path(id): Path<String>, call: Call) -> Reply {
    let a = authorised(&gw, &call, &id, Act::Attach).await?;
    let session = a.session.as_ref();
    let sid = session.uid().unwrap_or_default();
    if !session.has_ended() {
        let api: Api<Sandbox> = Api::namespaced(gw.client.clone(), &session.namespace().unwrap_or_default());
        let patch = json!({"metadata": {"annotations": {ATTACHED_AT_ANNOTATION: Timestamp::now().to_string()}}});
        api.patch(&session.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await?;
    }
    let mut list = Vec::new();
    for c in gw.index.commands_of(session) {
        let st = c.status.clone().unwrap_or_default();
        let offset = match (st.number, views::phase(&c).is_final(), st.output_bytes) {
            (Some(_), true, Some(b)) => Some(b as u64),
            (Some(n), _, _) => Some(gw.output.stored_end(&sid, n as u32).await?),
            (None, _, _) => Some(0),
        };
        list.push(views::command(&c, offset));
    }
    ok(StatusCode::OK, json!({"session": views::session(session), "commands": list}))
}

/// Chunks past `after`, waiting up to the long-poll for new bytes or the
/// command's end.
async fn output(
    State(gw): State<Arc<Gateway>>,
    Path((id, cid)): Path<(String, String)>,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
    call: Call,
) -> Result<axum::response::Response, ApiError> {
    let a = authorised(&gw, &call, &id, Act::ReadOutput).await?;
    let _place = gw.long_polls.enter(a.who())?;
    let session = a.session.clone();
    // A query that does not parse is answered in the contract's shape too.
    let Query(query) = query.map_err(|e| ApiError::new(ErrorCode::BadRequest, format!("query: {e}")))?;
    let after = match query.get("after") {
        Some(a) => a.parse::<u64>().map_err(|_| ApiError::new(ErrorCode::BadRequest, "after must be a byte offset"))?,
        None => 0,
    };
    let (gw, session, cid) = (gw.as_ref(), session.as_ref(), cid.as_str());
    let sid = session.uid().unwrap_or_default();
    if session.status.as_ref().and_then(|s| s.output_erased_at.as_ref()).is_some() {
        gw.output.forget(&sid);
        return Err(ApiError::new(
            ErrorCode::SandboxOutputErased,
            "the session's output retention ended; its keys are destroyed",
        ));
    }
    let deadline = std::time::Instant::now() + gw.long_poll;
    // A command the operator has not numbered yet has no output: wait.
    let mut cmd = command_of(gw, session, cid).await?;
    while cmd.status.as_ref().and_then(|s| s.number).is_none() && std::time::Instant::now() < deadline {
        tokio::time::sleep(gw.output.poll).await;
        cmd = command_of(gw, session, cid).await?;
    }
    let Some(number) = cmd.status.as_ref().and_then(|s| s.number) else {
        return Ok(crate::output::page(&cmd, after, &[], false));
    };
    let wait = deadline.saturating_duration_since(std::time::Instant::now());
    let latest = std::sync::Mutex::new(cmd.clone());
    let (chunks, fin) = gw
        .output
        .read_waiting(&sid, number as u32, after, wait, || async {
            let c = command_of(gw, session, cid).await?;
            let fin = views::phase(&c).is_final();
            *latest.lock().unwrap_or_else(|p| p.into_inner()) = c;
            Ok(fin)
        })
        .await?;
    let cmd = latest.into_inner().unwrap_or_else(|p| p.into_inner());
    Ok(crate::output::page(&cmd, after, &chunks, fin))
}

fn body_error(e: BytesRejection) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        return ApiError::new(ErrorCode::BadRequest, format!("the body is larger than {MAX_BODY} bytes"));
    }
    ApiError::new(ErrorCode::BadRequest, format!("body: {e}"))
}

/// The `Idempotency-Key` header: printable ASCII, at most 255 characters.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<&str>, ApiError> {
    let Some(v) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let key = v.to_str().ok().filter(|k| !k.is_empty() && k.len() <= 255);
    key.map(Some)
        .ok_or_else(|| ApiError::new(ErrorCode::BadRequest, "Idempotency-Key must be 1-255 printable characters"))
}

/// Pause, resume, stop, Revoke All of session `id` (a member, or a token
/// with `control`).
async fn lifecycle(
    State(gw): State<Arc<Gateway>>,
    Path(id): Path<String>,
    call: Call,
    request: requests::Request,
) -> Reply {
    let a = authorised(&gw, &call, &id, Act::Lifecycle(request)).await?;
    apply_lifecycle(&gw, &a, request).await
}

/// The same through `/v1/sandbox-session/…`: a `control` token alone,
/// for the session it was made for.
async fn token_lifecycle(State(gw): State<Arc<Gateway>>, call: Call, request: requests::Request) -> Reply {
    if !bearer(&call.headers)?.starts_with(hangar_keys::token::PREFIX) {
        return Err(ApiError::new(ErrorCode::TokenInvalid, "this route takes a session token"));
    }
    let token = token_caller(&gw, &call).await?;
    let sid = token.status.as_ref().and_then(|s| s.session_id.clone()).unwrap_or_default();
    let session =
        gw.index.session(&sid).ok_or_else(|| ApiError::new(ErrorCode::TokenInvalid, "the token's session is gone"))?;
    scope::decide(&token, &session, Act::Lifecycle(request).token_action(), Timestamp::now())?;
    let acting = Acting::token(&token);
    let a = Authorised { principal: Principal::Token(token), session, acting };
    apply_lifecycle(&gw, &a, request).await
}

async fn apply_lifecycle(gw: &Gateway, a: &Authorised, request: requests::Request) -> Reply {
    let session = sessions::current(gw, &a.session).await?;
    let Some(patch) = requests::change(&session, request, Timestamp::now())? else {
        return ok(StatusCode::OK, views::session(&session));
    };
    let ns = session.namespace().unwrap_or_default();
    let changed: Sandbox = a.acting.patch(&gw.client, &ns, &session.name_any(), &patch).await?;
    // Accepted: the operator carries it out (the phase follows).
    ok(StatusCode::ACCEPTED, views::session(&changed))
}

/// `POST /v1/sandboxes/{id}/tokens`: a member makes a token; its
/// plaintext is in this response and nowhere else.
async fn mint_token(
    State(gw): State<Arc<Gateway>>,
    Path(id): Path<String>,
    call: Call,
    body: Result<Bytes, BytesRejection>,
) -> Reply {
    let a = authorised(&gw, &call, &id, Act::MintToken).await?;
    let body = body.map_err(body_error)?;
    let (status, view) = tokens::mint(&gw, &a, &body).await?;
    ok(status, view)
}

/// `DELETE /v1/sandboxes/{id}/tokens/{name}`: revoke (final).
async fn revoke_token(State(gw): State<Arc<Gateway>>, Path((id, name)): Path<(String, String)>, call: Call) -> Reply {
    let a = authorised(&gw, &call, &id, Act::RevokeToken).await?;
    ok(StatusCode::OK, tokens::revoke(&gw, &a, &name).await?)
}

/// `POST /v1/sandboxes/{id}/snapshots`: a live-state snapshot is not
/// offered (501); any other kind is not one.
async fn snapshot(
    State(gw): State<Arc<Gateway>>,
    Path(id): Path<String>,
    call: Call,
    body: Result<Bytes, BytesRejection>,
) -> Reply {
    authorised(&gw, &call, &id, Act::Snapshot).await?;
    let body = body.map_err(body_error)?;
    let v: Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::new(ErrorCode::BadRequest, format!("body is not JSON: {e}")))?;
    match v.get("kind").and_then(Value::as_str) {
        Some("live_state") => Err(ApiError::new(
            ErrorCode::SandboxLiveSnapshotUnsupported,
            "a live-state snapshot (memory and processes) is not offered; the workspace survives a pause",
        )),
        _ => Err(ApiError::new(ErrorCode::SandboxRequestInvalid, "kind must be live_state")),
    }
}

/// `POST /v1/sandboxes`: a member starts a session.
async fn start_session(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Reply {
    let caller = member(&gw, &headers, "start a session").await?;
    let body = body.map_err(body_error)?;
    let key = idempotency_key(&headers)?;
    let (status, view) = sessions::start(&gw, &caller, &body, key).await?;
    ok(status, view)
}

/// `GET /v1/sandbox-templates[?namespace=ns]`: the registered templates a
/// session can start from: the shared ones, and with `namespace` (where the
/// caller may create sessions) that namespace's own too.
async fn templates(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Reply {
    let caller = member(&gw, &headers, "list templates").await?;
    let Query(query) = query.map_err(|e| ApiError::new(ErrorCode::BadRequest, format!("query: {e}")))?;
    let namespace = query.get("namespace").map(String::as_str);
    if let Some(ns) = namespace {
        gw.auth.authorize(&caller, ns, "create", "sandboxes").await?;
    }
    ok(StatusCode::OK, json!({"templates": sessions::templates(&gw, namespace).await?}))
}

/// Every key that has signed a session certificate, by id (base64 Ed25519
/// public keys, as `hangar cert verify --key` takes them).
async fn certificate_keys(State(gw): State<Arc<Gateway>>, headers: HeaderMap) -> Reply {
    member(&gw, &headers, "list the certificate keys").await?;
    let published = gw.output.maps.get_opt(hangar_crds::CERTIFICATE_KEYS_CONFIGMAP).await?;
    ok(StatusCode::OK, json!({"keys": published.and_then(|m| m.data).unwrap_or_default()}))
}

/// The member calling a route no session token may use (`what` it does).
async fn member(gw: &Gateway, headers: &HeaderMap, what: &str) -> Result<Caller, ApiError> {
    if bearer(headers)?.starts_with(hangar_keys::token::PREFIX) {
        return Err(ApiError::new(ErrorCode::TokenScopeForbidden, format!("a session token cannot {what}")));
    }
    gw.auth.authenticate(headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok())).await
}

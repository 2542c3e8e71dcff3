//! The route table of the session API (first part: member routes for a
//! session's state, attach, and its commands and their output).

use std::sync::Arc;
use std::time::Duration;

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::header::AUTHORIZATION;
use axum::http::{HeaderMap, Method, Request, Response, StatusCode, Uri};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine;
use hangar_crds::{Command, ErrorCode, Sandbox};
use hangar_runtime::https::RequestBody;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::auth::{Auth, Caller};
use crate::error::ApiError;
use crate::index::Index;
use crate::output::OutputReader;
use crate::{commands, views};

/// Attach counts as "a client attached" for idle purposes; the operator
/// reads this annotation.
pub const ATTACHED_AT_ANNOTATION: &str = "hangar.dev/attached-at";
const MAX_BODY: usize = 1 << 20;

pub struct Gateway {
    pub client: kube::Client,
    pub auth: Auth,
    pub index: Index,
    pub output: OutputReader,
    /// How long an output read waits for new bytes (25 s).
    pub long_poll: Duration,
    /// Requests by method and status, and their durations.
    pub http: hangar_runtime::admin::HttpMetrics,
    /// The cap on output reads waiting at once.
    pub long_polls: crate::output::LongPolls,
}

type Reply = Result<(StatusCode, Json<Value>), ApiError>;

fn ok(status: StatusCode, body: Value) -> Reply {
    Ok((status, Json(body)))
}

/// The route table. Unknown routes and methods answer 400 `bad_request`
/// in the contract's error shape.
pub fn router(gw: Arc<Gateway>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { Json(json!({"ok": true})) }))
        .route("/v1/sandboxes/{id}", get(state))
        .route("/v1/sandboxes/{id}/attach", get(attach))
        .route("/v1/sandboxes/{id}/commands", get(list_commands).post(send_command))
        .route("/v1/sandboxes/{id}/commands/{cid}/output", get(output))
        .route("/v1/sandboxes/{id}/commands/{cid}/cancel", post(cancel))
        .fallback(no_route)
        .method_not_allowed_fallback(no_route)
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
    ApiError::new(ErrorCode::BadRequest, format!("no route {method} {}", uri.path()))
}

fn no_session(id: &str) -> ApiError {
    ApiError::new(ErrorCode::SandboxNotFound, format!("no session {id}"))
}

/// Authenticates (first: an unknown caller learns nothing), finds the
/// session and authorises `verb` on `resource` in its namespace. A caller
/// who may not even read the session gets the very answer a session that
/// does not exist gets, so probing ids reveals nothing; `forbidden` is only
/// for one who can see the session but not do this to it.
async fn authorised(
    gw: &Gateway,
    headers: &HeaderMap,
    id: &str,
    verb: &str,
    resource: &str,
) -> Result<(Caller, Arc<Sandbox>), ApiError> {
    let authorization = headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok());
    let caller = gw.auth.authenticate(authorization).await?;
    let session = gw.index.session(id).ok_or_else(|| no_session(id))?;
    let ns = session.namespace().unwrap_or_default();
    match gw.auth.authorize(&caller, &ns, "get", "sandboxes").await {
        Err(e) if e.code == ErrorCode::Forbidden.as_str() => return Err(no_session(id)),
        other => other?,
    }
    if (verb, resource) != ("get", "sandboxes") {
        gw.auth.authorize(&caller, &ns, verb, resource).await?;
    }
    Ok((caller, session))
}

async fn state(State(gw): State<Arc<Gateway>>, Path(id): Path<String>, headers: HeaderMap) -> Reply {
    let (_, session) = authorised(&gw, &headers, &id, "get", "sandboxes").await?;
    ok(StatusCode::OK, views::session(&session))
}

async fn list_commands(State(gw): State<Arc<Gateway>>, Path(id): Path<String>, headers: HeaderMap) -> Reply {
    let (_, session) = authorised(&gw, &headers, &id, "list", "commands").await?;
    let list: Vec<Value> = gw.index.commands_of(&session).iter().map(|c| views::command(c, None)).collect();
    ok(StatusCode::OK, json!({"commands": list}))
}

async fn send_command(
    State(gw): State<Arc<Gateway>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Reply {
    let (caller, session) = authorised(&gw, &headers, &id, "create", "commands").await?;
    let body = body.map_err(|e| ApiError::new(ErrorCode::BadRequest, format!("body: {e}")))?;
    let new = commands::parse(&body)?;
    let api: Api<Command> = Api::namespaced(gw.client.clone(), &session.namespace().unwrap_or_default());
    let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok());
    let (c, replayed) = commands::send(&api, &session, &new, &caller.user, key).await?;
    ok(if replayed { StatusCode::OK } else { StatusCode::CREATED }, views::command(&c, None))
}

async fn cancel(State(gw): State<Arc<Gateway>>, Path((id, cid)): Path<(String, String)>, headers: HeaderMap) -> Reply {
    let (_, session) = authorised(&gw, &headers, &id, "patch", "commands").await?;
    command_of(&gw, &session, &cid).await?;
    let api: Api<Command> = Api::namespaced(gw.client.clone(), &session.namespace().unwrap_or_default());
    let c = commands::cancel(&api, &cid).await?;
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
async fn attach(State(gw): State<Arc<Gateway>>, Path(id): Path<String>, headers: HeaderMap) -> Reply {
    let (_, session) = authorised(&gw, &headers, &id, "get", "sandboxes").await?;
    let session = session.as_ref();
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
    headers: HeaderMap,
) -> Reply {
    let (caller, session) = authorised(&gw, &headers, &id, "get", "commands").await?;
    let _place = gw.long_polls.enter(&caller.user)?;
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
        return ok(StatusCode::OK, output_body(&cmd, after, &[], false));
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
    ok(StatusCode::OK, output_body(&cmd, after, &chunks, fin))
}

fn output_body(cmd: &Command, after: u64, chunks: &[hangar_output::Chunk], fin: bool) -> Value {
    let b64 = base64::engine::general_purpose::STANDARD;
    let next = chunks.last().map(|c| c.offset + c.data.len() as u64).unwrap_or(after);
    let list: Vec<Value> = chunks
        .iter()
        .map(|c| json!({"stream": c.stream.as_str(), "offset": c.offset, "data": b64.encode(&c.data)}))
        .collect();
    json!({
        "chunks": list,
        "next": next,
        "final": fin,
        "status": views::phase(cmd).as_str(),
        "exitCode": cmd.status.as_ref().and_then(|s| s.exit_code),
    })
}

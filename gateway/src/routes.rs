//! The route table of the session API (first part: member routes for a
//! session's state, attach, and its commands and their output).

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use hangar_crds::{Command, ErrorCode, Sandbox};
use hangar_runtime::https::{Body, RequestBody};
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Method, Request, Response, StatusCode};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use serde_json::{Value, json};

use crate::auth::Auth;
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
}

type Reply = Result<(StatusCode, Value), ApiError>;

pub async fn handle(gw: Arc<Gateway>, req: Request<RequestBody>) -> Response<Body> {
    let started = std::time::Instant::now();
    let (method, path) = (req.method().clone(), req.uri().path().to_owned());
    let reply = route(&gw, req).await;
    let (status, body) = match reply {
        Ok(ok) => ok,
        Err(e) => (StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), e.body()),
    };
    tracing::info!(%method, %path, status = status.as_u16(), ms = started.elapsed().as_millis() as u64, "request");
    gw.http.observe(method.as_str(), status.as_u16(), started.elapsed());
    let mut r = Response::new(Full::new(Bytes::from(serde_json::to_vec(&body).expect("json"))));
    *r.status_mut() = status;
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    r
}

async fn route(gw: &Gateway, req: Request<RequestBody>) -> Reply {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let authorization = header("authorization");
    let idempotency_key = header("idempotency-key");
    if method == Method::GET && path == "/healthz" {
        return Ok((StatusCode::OK, json!({"ok": true})));
    }
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest = match segments.as_slice() {
        ["v1", "sandboxes", id, rest @ ..] => (*id, rest.to_vec()),
        _ => return Err(ApiError::new(ErrorCode::BadRequest, format!("no route {method} {path}"))),
    };
    let caller = gw.auth.authenticate(authorization.as_deref()).await?;
    let (id, rest) = rest;
    let session =
        gw.index.session(id).ok_or_else(|| ApiError::new(ErrorCode::SandboxNotFound, format!("no session {id}")))?;
    let ns = session.namespace().unwrap_or_default();
    match (method.clone(), rest.as_slice()) {
        (Method::GET, []) => {
            gw.auth.authorize(&caller, &ns, "get", "sandboxes").await?;
            Ok((StatusCode::OK, views::session(&session)))
        }
        (Method::GET, ["attach"]) => {
            gw.auth.authorize(&caller, &ns, "get", "sandboxes").await?;
            attach(gw, &session).await
        }
        (Method::GET, ["commands"]) => {
            gw.auth.authorize(&caller, &ns, "list", "commands").await?;
            let list: Vec<Value> = gw.index.commands_of(&session).iter().map(|c| views::command(c, None)).collect();
            Ok((StatusCode::OK, json!({"commands": list})))
        }
        (Method::POST, ["commands"]) => {
            gw.auth.authorize(&caller, &ns, "create", "commands").await?;
            let body = read_body(req).await?;
            let new = commands::parse(&body)?;
            let api: Api<Command> = Api::namespaced(gw.client.clone(), &ns);
            let (c, replayed) = commands::send(&api, &session, &new, idempotency_key.as_deref()).await?;
            let status = if replayed { StatusCode::OK } else { StatusCode::CREATED };
            Ok((status, views::command(&c, None)))
        }
        (Method::GET, ["commands", cid, "output"]) => {
            gw.auth.authorize(&caller, &ns, "get", "commands").await?;
            let after = query_param(&query, "after")
                .map(|a| {
                    a.parse::<u64>().map_err(|_| ApiError::new(ErrorCode::BadRequest, "after must be a byte offset"))
                })
                .transpose()?
                .unwrap_or(0);
            output(gw, &session, cid, after).await
        }
        (Method::POST, ["commands", cid, "cancel"]) => {
            gw.auth.authorize(&caller, &ns, "patch", "commands").await?;
            command_of(gw, &session, cid).await?;
            let api: Api<Command> = Api::namespaced(gw.client.clone(), &ns);
            let c = commands::cancel(&api, cid).await?;
            Ok((StatusCode::OK, views::command(&c, None)))
        }
        _ => Err(ApiError::new(ErrorCode::BadRequest, format!("no route {method} {path}"))),
    }
}

async fn read_body(req: Request<RequestBody>) -> Result<Bytes, ApiError> {
    Limited::new(req.into_body(), MAX_BODY)
        .collect()
        .await
        .map(|b| b.to_bytes())
        .map_err(|e| ApiError::new(ErrorCode::BadRequest, format!("body: {e}")))
}

fn query_param<'a>(query: &'a str, name: &str) -> Option<&'a str> {
    query.split('&').find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
}

/// A command of this session, from the index or (just created) the API.
async fn command_of(gw: &Gateway, session: &Sandbox, cid: &str) -> Result<Command, ApiError> {
    let ns = session.namespace().unwrap_or_default();
    let found = match gw.index.commands.get(&ObjectRef::new(cid).within(&ns)) {
        Some(c) => Some((*c).clone()),
        None => Api::<Command>::namespaced(gw.client.clone(), &ns).get_opt(cid).await?,
    };
    found
        .filter(|c| c.spec.sandbox == session.name_any())
        .ok_or_else(|| ApiError::new(ErrorCode::SandboxNotFound, format!("no command {cid} in this session")))
}

/// The session's state and each command's status and stored offset; marks
/// the session attached (for 30 s, for idle purposes).
async fn attach(gw: &Gateway, session: &Sandbox) -> Reply {
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
    Ok((StatusCode::OK, json!({"session": views::session(session), "commands": list})))
}

/// Chunks past `after`, waiting up to the long-poll for new bytes or the
/// command's end.
async fn output(gw: &Gateway, session: &Sandbox, cid: &str, after: u64) -> Reply {
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
        return Ok((StatusCode::OK, output_body(&cmd, after, &[], false)));
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
    Ok((StatusCode::OK, output_body(&cmd, after, &chunks, fin)))
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

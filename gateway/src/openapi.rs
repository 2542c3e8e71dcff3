//! The gateway's OpenAPI 3.1 document (`GET /v1/openapi.json`), built from
//! [`ROUTES`]; the e2e suite checks every route it lists answers (and that
//! a route it does not list is 404).

use serde_json::{Map, Value, json};

/// (method, path, summary, auth): `member`, `token` (a session token with
/// the scope named), or both.
pub const ROUTES: &[(&str, &str, &str, &str)] = &[
    ("post", "/v1/sandboxes", "Start a session (Idempotency-Key: same key and body, same session)", "member"),
    ("get", "/v1/sandboxes/{id}", "State, attempts, billing", "member | token:read"),
    (
        "get",
        "/v1/sandboxes/{id}/attach",
        "State and each command's status and stored output offset",
        "member | token:read",
    ),
    ("post", "/v1/sandboxes/{id}/commands", "Send a command (Idempotency-Key)", "member | token:exec"),
    ("get", "/v1/sandboxes/{id}/commands", "List commands", "member | token:read"),
    (
        "get",
        "/v1/sandboxes/{id}/commands/{cid}/output",
        "Output chunks past ?after=N, waiting up to 25 s",
        "member | token:read",
    ),
    ("post", "/v1/sandboxes/{id}/commands/{cid}/cancel", "Cancel a command", "member | token:exec"),
    ("post", "/v1/sandboxes/{id}/pause", "Pause (mode commands)", "member | token:control"),
    ("post", "/v1/sandboxes/{id}/resume", "Resume a paused session", "member | token:control"),
    ("post", "/v1/sandboxes/{id}/stop", "End the session", "member | token:control"),
    ("post", "/v1/sandboxes/{id}/revoke-all", "End the session as Revoke All", "member | token:control"),
    ("post", "/v1/sandboxes/{id}/tokens", "Mint a session token (plaintext in this response only)", "member"),
    ("delete", "/v1/sandboxes/{id}/tokens/{name}", "Revoke a session token", "member"),
    (
        "post",
        "/v1/sandboxes/{id}/snapshots",
        "Snapshots: live_state is 501 sandbox_live_snapshot_unsupported",
        "member",
    ),
    (
        "get",
        "/v1/sandboxes/{id}/certificate",
        "The signed session certificate (409 sandbox_certificate_pending until the reset signs it)",
        "member | token:read",
    ),
    ("post", "/v1/sandbox-session/pause", "Pause the token's session", "token:control"),
    ("post", "/v1/sandbox-session/resume", "Resume the token's session", "token:control"),
    ("post", "/v1/sandbox-session/stop", "End the token's session", "token:control"),
    ("post", "/v1/sandbox-session/revoke-all", "Revoke All on the token's session", "token:control"),
    ("get", "/v1/sandbox-templates", "Templates a session can start from", "member"),
    ("get", "/v1/certificate-keys", "Every key that has signed a session certificate, by id", "member"),
    ("get", "/v1/openapi.json", "This document", "none"),
];

/// Every error the API answers, with its HTTP status.
fn errors() -> Value {
    let codes: Vec<Value> =
        hangar_crds::ErrorCode::ALL.iter().map(|c| json!({"code": c.as_str(), "status": c.http_status()})).collect();
    json!(codes)
}

pub fn document() -> Value {
    let mut paths = Map::new();
    for (method, path, summary, auth) in ROUTES {
        let params: Vec<Value> = path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
            .map(|name| json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}}))
            .collect();
        let mut op = json!({
            "summary": summary,
            "x-hangar-auth": auth,
            "parameters": params,
            "responses": {
                "default": {"description": "An error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}},
            },
        });
        if *auth != "none" && *auth != "member" {
            op["security"] = json!([{"member": []}, {"sessionToken": [], "hangarProof": []}]);
        }
        if auth.starts_with("token") {
            op["security"] = json!([{"sessionToken": [], "hangarProof": []}]);
        }
        if *auth == "member" {
            op["security"] = json!([{"member": []}]);
        }
        let entry = paths.entry(path.to_string()).or_insert_with(|| json!({}));
        entry[*method] = op;
    }
    json!({
        "openapi": "3.1.0",
        "info": {"title": "hangar session API", "version": env!("CARGO_PKG_VERSION")},
        "paths": paths,
        "components": {
            "securitySchemes": {
                "member": {"type": "http", "scheme": "bearer", "description": "A Kubernetes token for the gateway's audience"},
                "sessionToken": {"type": "http", "scheme": "bearer", "description": "hgt_…"},
                "hangarProof": {"type": "apiKey", "in": "header", "name": "Hangar-Proof",
                                "description": "Compact JWS (ES256) by the token's P-256 key: htm, htu, iat (±60 s), jti (single use), ath"},
            },
            "schemas": {
                "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "object",
                    "required": ["code", "message"], "properties": {"code": {"type": "string"}, "message": {"type": "string"}}}}},
            },
        },
        "x-hangar-errors": errors(),
    })
}

//! Sessions: `POST /v1/sandboxes` (a member starts one, with an optional
//! `Idempotency-Key`), the current state of one, and the templates a
//! session can start from.
//!
//! A start with a key gets a Sandbox name derived from (namespace, caller,
//! key) and the SHA-256 of its request in an annotation: the same key and
//! body give the same session again (201, then 200); the same key with
//! another body is refused (400 `sandbox_request_invalid`).

use hangar_crds::{ErrorCode, Sandbox, SandboxSpec, SandboxTemplate};
use kube::ResourceExt;
use kube::api::{Api, ListParams, ObjectMeta};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::acting::Acting;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::routes::Gateway;
use crate::views;
use axum::http::StatusCode;

/// The annotation holding the SHA-256 of a start request's spec.
pub const REQUEST_ANNOTATION: &str = "hangar.dev/start-request-sha256";

#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
struct StartRequest {
    namespace: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(flatten)]
    spec: Map<String, Value>,
}

/// The session as the API has it now (the cache may be a moment behind a
/// change the caller just made).
pub async fn current(gw: &Gateway, session: &Sandbox) -> Result<Sandbox, ApiError> {
    let api: Api<Sandbox> = Api::namespaced(gw.client.clone(), &session.namespace().unwrap_or_default());
    api.get_opt(&session.name_any())
        .await?
        .filter(|s| s.uid() == session.uid())
        .ok_or_else(|| ApiError::new(ErrorCode::SandboxNotFound, "the session is gone"))
}

fn sha256_hex(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes).as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// The fields a Sandbox spec has (its CRD schema's).
fn spec_fields() -> Vec<String> {
    use kube::CustomResourceExt;
    let crd = Sandbox::crd();
    let schema = crd.spec.versions.first().and_then(|v| v.schema.as_ref()).and_then(|s| s.open_api_v3_schema.as_ref());
    let spec = schema.and_then(|s| s.properties.as_ref()).and_then(|p| p.get("spec"));
    spec.and_then(|s| s.properties.as_ref()).map(|p| p.keys().cloned().collect()).unwrap_or_default()
}

pub async fn start(
    gw: &Gateway,
    caller: &Caller,
    body: &[u8],
    key: Option<&str>,
) -> Result<(StatusCode, Value), ApiError> {
    let req: StartRequest =
        serde_json::from_slice(body).map_err(|e| ApiError::new(ErrorCode::BadRequest, format!("body: {e}")))?;
    let known = spec_fields();
    if let Some(unknown) = req.spec.keys().find(|k| !known.contains(k)) {
        return Err(ApiError::new(ErrorCode::BadRequest, format!("{unknown} is not a field of a session")));
    }
    let spec: SandboxSpec = serde_json::from_value(Value::Object(req.spec.clone()))
        .map_err(|e| ApiError::new(ErrorCode::SandboxRequestInvalid, e.to_string()))?;
    let acting = Acting::member(caller, &gw.impersonable_groups);
    let reviewer = Caller { groups: acting.review_groups(caller), ..caller.clone() };
    gw.auth.authorize(&reviewer, &req.namespace, "create", "sandboxes").await?;
    let canonical = serde_json::to_vec(&serde_json::to_value(&spec).map_err(|e| ApiError::internal(e.to_string()))?)
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let request_sha = sha256_hex(&canonical);
    let mut meta = ObjectMeta {
        namespace: Some(req.namespace.clone()),
        annotations: Some([(REQUEST_ANNOTATION.to_owned(), request_sha.clone())].into()),
        ..Default::default()
    };
    let keyed = key.map(|k| {
        format!("sbx-{}", &sha256_hex(format!("{}\u{0}{}\u{0}{k}", req.namespace, acting.user).as_bytes())[..24])
    });
    match (&req.name, &keyed) {
        (Some(n), _) => meta.name = Some(n.clone()),
        (None, Some(n)) => meta.name = Some(n.clone()),
        (None, None) => meta.generate_name = Some("sbx-".into()),
    }
    let manifest = Sandbox { metadata: meta, spec, status: None };
    match acting.create_raw(&gw.client, &req.namespace, &manifest).await {
        Ok(made) => Ok((StatusCode::CREATED, views::session(&made))),
        Err(kube::Error::Api(e)) if e.reason == "AlreadyExists" && key.is_some() => {
            let name = manifest.metadata.name.clone().unwrap_or_default();
            let api: Api<Sandbox> = Api::namespaced(gw.client.clone(), &req.namespace);
            let existing = api.get(&name).await?;
            if existing.annotations().get(REQUEST_ANNOTATION) != Some(&request_sha) {
                return Err(ApiError::new(
                    ErrorCode::SandboxRequestInvalid,
                    "this Idempotency-Key was used to start a different session",
                ));
            }
            Ok((StatusCode::OK, views::session(&existing)))
        }
        Err(kube::Error::Api(e)) if e.reason == "AlreadyExists" => {
            Err(ApiError::new(ErrorCode::SandboxRequestInvalid, "a session of this name exists"))
        }
        Err(e) => Err(e.into()),
    }
}

/// The templates a session can start from (those the operator starts
/// from: every one not `Rejected`), as `name@version` with what their signed
/// manifest lists.
pub async fn templates(gw: &Gateway) -> Result<Vec<Value>, ApiError> {
    let api: Api<SandboxTemplate> = Api::all(gw.client.clone());
    let list = api.list(&ListParams::default()).await?.items;
    Ok(list
        .iter()
        .filter(|t| t.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Rejected"))
        .map(|t| {
            json!({
                "template": format!("{}@{}", t.spec.name, t.spec.version),
                "image": t.spec.manifest.image,
                "sbomDigest": t.spec.manifest.sbom_digest,
                "buildNetworkPolicy": t.spec.manifest.build_network_policy,
                "owner": t.spec.owner,
                "registeredAt": t.status.as_ref().and_then(|s| s.registered_at.clone()),
            })
        })
        .collect())
}

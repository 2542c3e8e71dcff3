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
use crate::hex::sha256_hex;
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

struct Started {
    namespace: String,
    name: Option<String>,
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

/// The fields a Sandbox spec has (its CRD schema's).
fn spec_fields() -> Vec<String> {
    use kube::CustomResourceExt;
    let crd = Sandbox::crd();
    let schema = crd.spec.versions.first().and_then(|v| v.schema.as_ref()).and_then(|s| s.open_api_v3_schema.as_ref());
    let spec = schema.and_then(|s| s.properties.as_ref()).and_then(|p| p.get("spec"));
    spec.and_then(|s| s.properties.as_ref()).map(|p| p.keys().cloned().collect()).unwrap_or_default()
}

/// A start request: (namespace, name, spec), or why it is not one (400).
pub fn parse_start(body: &[u8]) -> Result<(String, Option<String>, SandboxSpec), ApiError> {
    let req: StartRequest =
        serde_json::from_slice(body).map_err(|e| ApiError::new(ErrorCode::BadRequest, format!("body: {e}")))?;
    let known = spec_fields();
    if let Some(unknown) = req.spec.keys().find(|k| !known.contains(k)) {
        return Err(ApiError::new(ErrorCode::BadRequest, format!("{unknown} is not a field of a session")));
    }
    let spec: SandboxSpec = serde_json::from_value(Value::Object(req.spec))
        .map_err(|e| ApiError::new(ErrorCode::SandboxRequestInvalid, e.to_string()))?;
    Ok((req.namespace, req.name, spec))
}

pub async fn start(
    gw: &Gateway,
    caller: &Caller,
    body: &[u8],
    key: Option<&str>,
) -> Result<(StatusCode, Value), ApiError> {
    let (namespace, name, spec) = parse_start(body)?;
    let req = Started { namespace, name };
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

/// The templates a session in `namespace` can start from (shared ones
/// when `None`): registered (the operator verified the release signature)
/// and visible there, as `name@version` with what their signed manifest
/// lists.
pub async fn templates(gw: &Gateway, namespace: Option<&str>) -> Result<Vec<Value>, ApiError> {
    let api: Api<SandboxTemplate> = Api::all(gw.client.clone());
    let list = api.list(&ListParams::default()).await?.items;
    Ok(list
        .iter()
        .filter(|t| t.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Registered"))
        .filter(|t| match namespace {
            Some(ns) => hangar_core::templates::visible_to(t, ns),
            None => t.spec.owner.is_none(),
        })
        .map(|t| {
            json!({
                "template": format!("{}@{}", t.spec.name, t.spec.version),
                "image": t.spec.manifest.image,
                "sbomDigest": t.spec.manifest.sbom_digest,
                "buildNetworkPolicy": t.spec.manifest.build_network_policy,
                "owner": t.spec.owner,
                "signedBy": t.spec.signed_by,
                "registeredAt": t.status.as_ref().and_then(|s| s.registered_at.clone()),
            })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_start_names_its_namespace_and_only_fields_of_a_session() {
        let (ns, name, spec) =
            parse_start(br#"{"namespace":"t","mode":"commands","image":"r/i@sha256:aa","tenant":"acme"}"#).unwrap();
        assert_eq!((ns.as_str(), name, spec.tenant.as_deref()), ("t", None, Some("acme")));
        assert_eq!(parse_start(br#"{"namespace":"t","colour":"red"}"#).unwrap_err().code, "bad_request");
        assert_eq!(parse_start(br#"{"mode":"agent"}"#).unwrap_err().code, "bad_request", "no namespace");
        assert_eq!(parse_start(br#"{"namespace":"t","mode":"sideways"}"#).unwrap_err().code, "sandbox_request_invalid");
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

        /// Any body: a start or a 400, never a panic.
        #[test]
        fn any_body_is_a_start_or_a_400(body in proptest::collection::vec(any::<u8>(), 0..400)) {
            if let Err(e) = parse_start(&body) {
                prop_assert_eq!(e.status, 400);
            }
        }

        /// JSON objects of known and unknown fields with values of any type.
        #[test]
        fn any_object_is_a_start_or_a_400(
            fields in proptest::collection::btree_map(
                prop_oneof![Just("namespace".to_owned()), Just("mode".to_owned()), Just("image".to_owned()),
                            Just("tenant".to_owned()), Just("stopAfterSeconds".to_owned()), "[a-z]{1,8}"],
                prop_oneof![Just(json!(null)), any::<i64>().prop_map(|n| json!(n)), ".{0,20}".prop_map(|s| json!(s)),
                            Just(json!(["x"])), Just(json!({"a": 1}))],
                0..6)
        ) {
            let body = serde_json::to_vec(&fields).unwrap();
            if let Err(e) = parse_start(&body) {
                prop_assert_eq!(e.status, 400);
            }
        }
    }
}

//! `POST /v1/sandboxes/{id}/tokens` and `DELETE …/tokens/{name}`.
//!
//! A member makes a token: the gateway creates the SessionToken as the
//! member (RBAC, the 32-token admission and the schema all apply), mints
//! its plaintext and records only the digest, with the expiry and the
//! session it is for; the plaintext is in the response and nowhere else
//! (no Secret). A token the gateway made but could not record is never
//! usable, and the operator revokes it after a minute.

use hangar_crds::session_token::{ISSUED_BY_GATEWAY_ANNOTATION, Jwk, Scope, SessionTokenSpec};
use hangar_crds::{ErrorCode, SessionToken};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::routes::{Authorised, Gateway};
use axum::http::StatusCode;

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct MintRequest {
    #[serde(default)]
    name: Option<String>,
    scopes: Vec<Scope>,
    #[serde(default)]
    ttl_seconds: Option<i64>,
    public_key: Jwk,
}

/// A token's view (never its digest or plaintext).
pub fn view(t: &SessionToken) -> Value {
    let st = t.status.clone().unwrap_or_default();
    json!({
        "name": t.name_any(),
        "scopes": t.spec.scopes,
        "phase": st.phase,
        "expiresAt": st.expires_at,
        "revokedAt": st.revoked_at,
        "sessionId": st.session_id,
    })
}

fn parse_mint(body: &[u8]) -> Result<MintRequest, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::new(ErrorCode::BadRequest, format!("body: {e}")))
}

pub async fn mint(gw: &Gateway, a: &Authorised, body: &[u8]) -> Result<(StatusCode, Value), ApiError> {
    let req = parse_mint(body)?;
    let session = crate::sessions::current(gw, &a.session).await?;
    let ns = session.namespace().unwrap_or_default();
    let mut meta = ObjectMeta {
        namespace: Some(ns.clone()),
        annotations: Some([(ISSUED_BY_GATEWAY_ANNOTATION.to_owned(), "true".to_owned())].into()),
        ..Default::default()
    };
    match req.name {
        Some(n) => meta.name = Some(n),
        None => meta.generate_name = Some(format!("{}-", session.name_any())),
    }
    let spec = SessionTokenSpec {
        sandbox: session.name_any(),
        scopes: req.scopes,
        ttl_seconds: req.ttl_seconds.unwrap_or(hangar_crds::session_token::DEFAULT_TTL_SECONDS),
        public_key: req.public_key,
        revoked: false,
    };
    let made: SessionToken =
        a.acting.create(&gw.client, &ns, &SessionToken { metadata: meta, spec, status: None }).await?;
    let plaintext = hangar_keys::token::new_plaintext().map_err(|e| ApiError::internal(e.to_string()))?;
    let digest = hangar_keys::token::digest(&plaintext);
    let created = made.metadata.creation_timestamp.as_ref().map_or_else(Timestamp::now, |t| t.0);
    let expires = hangar_core::tokens::expires_for(&session, created, made.spec.ttl_seconds);
    let status = json!({"status": {
        "phase": "active", "digest": digest, "expiresAt": Time(expires), "sessionId": session.uid(),
    }});
    let api: Api<SessionToken> = Api::namespaced(gw.client.clone(), &ns);
    let issued = api.patch_status(&made.name_any(), &PatchParams::default(), &Patch::Merge(&status)).await?;
    // The client uses the token next: wait until this gateway knows it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !gw.tokens.knows(&digest) && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let mut body = view(&issued);
    body["token"] = json!(plaintext.as_str());
    tracing::info!(token = %issued.name_any(), session = %session.uid().unwrap_or_default(), "session token issued");
    Ok((StatusCode::CREATED, body))
}

pub async fn revoke(gw: &Gateway, a: &Authorised, name: &str) -> Result<Value, ApiError> {
    let ns = a.session.namespace().unwrap_or_default();
    let api: Api<SessionToken> = Api::namespaced(gw.client.clone(), &ns);
    let ours = |t: &SessionToken| {
        t.spec.sandbox == a.session.name_any()
            && t.status
                .as_ref()
                .and_then(|s| s.session_id.as_ref())
                .is_none_or(|sid| Some(sid) == a.session.uid().as_ref())
    };
    let Some(token) = api.get_opt(name).await?.filter(ours) else {
        return Err(ApiError::new(ErrorCode::SandboxNotFound, format!("no token {name} in this session")));
    };
    if token.spec.revoked {
        return Ok(view(&token));
    }
    let revoked: SessionToken = a.acting.patch(&gw.client, &ns, name, &json!({"spec": {"revoked": true}})).await?;
    let mut v = view(&revoked);
    // Refused from now on, whatever the operator has recorded yet.
    v["phase"] = json!("revoked");
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

        /// Any body: a mint request or 400 `bad_request`, never a panic.
        #[test]
        fn any_body_is_a_mint_or_a_400(body in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Err(e) = parse_mint(&body) {
                prop_assert_eq!((e.status, e.code), (400, "bad_request"));
            }
        }

        #[test]
        fn any_scopes_and_keys_are_a_mint_or_a_400(scopes in proptest::collection::vec("[a-z]{0,8}", 0..4),
                                                  ttl in any::<i64>(), x in ".{0,50}") {
            let body = json!({"scopes": scopes, "ttlSeconds": ttl,
                              "publicKey": {"kty": "EC", "crv": "P-256", "x": x, "y": "y"}});
            if let Err(e) = parse_mint(&serde_json::to_vec(&body).unwrap()) {
                prop_assert_eq!((e.status, e.code), (400, "bad_request"));
            }
        }
    }
}

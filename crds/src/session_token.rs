//! `SessionToken`: a scoped, key-bound credential for one session.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub const DEFAULT_TTL_SECONDS: i64 = 3600;

/// Marks a token made by the gateway's token route: the gateway mints its
/// plaintext (answered in its response, nowhere else) and records its
/// digest; the operator makes no delivery Secret for it.
pub const ISSUED_BY_GATEWAY_ANNOTATION: &str = "hangar.dev/issued-by-gateway";

/// A session token. The plaintext (`hgt_…`) is shown once; only its SHA-384
/// digest is stored.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "hangar.dev",
    version = "v1alpha1",
    kind = "SessionToken",
    namespaced,
    shortname = "sbxtoken",
    category = "hangar",
    status = "SessionTokenStatus",
    derive = "PartialEq",
    printcolumn = r#"{"name":"Sandbox","type":"string","jsonPath":".spec.sandbox"}"#,
    printcolumn = r#"{"name":"Scopes","type":"string","jsonPath":".spec.scopes"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Expires","type":"date","jsonPath":".status.expiresAt"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct SessionTokenSpec {
    /// Name of the Sandbox, in the same namespace.
    pub sandbox: String,
    /// 1–3 distinct of `read`, `exec`, `control`.
    pub scopes: Vec<Scope>,
    /// Lifetime, 60 s–24 h (default 1 h), never past the session's maximum.
    #[serde(default = "default_ttl_seconds")]
    pub ttl_seconds: i64,
    /// The P-256 public key every request's `Hangar-Proof` is signed with.
    pub public_key: Jwk,
    /// Revoke the token. `true` is final: a revoked token never comes back.
    #[serde(default)]
    pub revoked: bool,
}

fn default_ttl_seconds() -> i64 {
    DEFAULT_TTL_SECONDS
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
/// `read`: state, attach, the command list and each command's output.
/// `exec`: send and cancel commands. `control`: pause, resume, stop and
/// Revoke All.
#[serde(rename_all = "lowercase")]
pub enum Scope {
    Read,
    Exec,
    Control,
}

/// An EC P-256 public key as a JWK (RFC 7517/7518).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct Jwk {
    /// Must be `EC`.
    pub kty: String,
    /// Must be `P-256`.
    pub crv: String,
    /// base64url (no padding) of the 32-byte X coordinate.
    pub x: String,
    /// base64url (no padding) of the 32-byte Y coordinate.
    pub y: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionTokenStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<TokenPhase>,
    /// `sha384:<hex>` of the plaintext token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<Time>,
    /// The session (`status.sessionId` of the Sandbox) the token was made
    /// for: a Sandbox re-created under the same name is another session,
    /// which the token never reaches. Written once, with the digest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// Secret holding the plaintext once, for the creator to read and delete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TokenPhase {
    Active,
    Expired,
    Revoked,
}

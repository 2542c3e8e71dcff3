//! The workspace key hand-over between a session's worker and the
//! operator (HTTPS, the operator's key service): the worker asks for a
//! nonce, then for the key with its instance identity document, the
//! document's `rsa2048` signature and the nonce.

use serde::{Deserialize, Serialize};

/// `POST`: a fresh single-use nonce (`NonceResponse`).
pub const NONCE_PATH: &str = "/v1/workspace-keys/nonces";
/// `POST` a `KeyRequest`: the session's key (`KeyResponse`), or 403.
pub const KEY_PATH: &str = "/v1/workspace-keys";

#[derive(Serialize, Deserialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub struct NonceResponse {
    pub nonce: String,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KeyRequest {
    /// The session's Sandbox and its id (the Sandbox's uid).
    pub namespace: String,
    pub sandbox: String,
    pub session_id: String,
    /// The instance identity document, exactly as IMDS served it.
    pub document: String,
    /// IMDS's `rsa2048`: base64 of the PKCS#7 signature.
    pub signature: String,
    pub nonce: String,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyResponse {
    /// The 64-byte workspace key, base64.
    pub key: String,
}

/// The answer to a refused request: nothing about which check failed
/// (the operator logs and counts that).
pub const REFUSED: &str = "workspace_key_refused";

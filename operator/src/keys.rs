//! Session keys in the cluster: each session's 64-byte workspace key
//! (`hangar_keys::session`), sealed under the organisation key and kept in
//! a Secret in the operator's namespace. Destroying the Secret destroys
//! the key: the sealed bytes alone open nothing.

use base64::Engine;

pub use hangar_keys::OrgKey;
/// Making, sealing or opening a key failed.
pub use hangar_keys::SealError as KeyError;
pub use hangar_keys::session::{SESSION_KEY_LEN, new_session_key};

pub fn secret_name(session_id: &str) -> String {
    format!("hangar-session-key-{session_id}")
}

/// The Secret type hangar gives a session's sealed key.
pub const SECRET_TYPE: &str = "hangar.dev/sealed-session-key";

/// Whether `secret` is one hangar made for session `session_id`: immutable,
/// of hangar's type, and its sealed key opens under the organisation key
/// for this session (the seal's context is the session id, so another
/// session's sealed key does not open either). Nobody without the
/// organisation key can make one that passes, so a Secret someone else
/// put under the session's name is never trusted.
pub fn is_own_session_key(secret: &k8s_openapi::api::core::v1::Secret, org_key: &OrgKey, session_id: &str) -> bool {
    let sealed = secret.data.as_ref().and_then(|d| d.get("sealed-key"));
    secret.type_.as_deref() == Some(SECRET_TYPE)
        && secret.immutable == Some(true)
        && sealed.is_some_and(|s| org_key.unseal(&s.0, session_id).is_ok_and(|k| k.len() == SESSION_KEY_LEN))
}

pub fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

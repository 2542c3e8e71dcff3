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

pub fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

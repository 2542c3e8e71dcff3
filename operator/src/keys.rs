//! Session keys: 64 random bytes per session (the workspace encryption
//! key), sealed under the organisation key (`hangar_output::OrgKey`) and
//! kept in a Secret in the operator's namespace. Destroying the Secret
//! destroys the key: the sealed bytes alone open nothing.

use base64::Engine;

pub use hangar_output::OrgKey;
/// Making, sealing or opening a key failed.
pub use hangar_output::SealError as KeyError;

pub const SESSION_KEY_LEN: usize = 64;

pub fn new_session_key() -> Result<[u8; SESSION_KEY_LEN], KeyError> {
    hangar_output::random_bytes()
}

pub fn secret_name(session_id: &str) -> String {
    format!("hangar-session-key-{session_id}")
}

pub fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

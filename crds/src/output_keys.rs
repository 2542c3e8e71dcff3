//! Where the keys of command output live. Each attempt's output is sealed
//! under a key made for that attempt. The worker makes the key on its node
//! and hands it in as a Secret it may create but never read
//! (`handoff_secret_name`); the operator seals it under the organisation key
//! into the session's output-key Secret (`sealed_secret_name`, one entry per
//! attempt) and deletes the hand-off. That Secret outlives the session by
//! `outputRetentionDays`; deleting it erases the output.

/// The worker's hand-off of one attempt's key, in the operator's namespace.
pub fn handoff_secret_name(session_id: &str, attempt: i64) -> String {
    format!("hangar-output-key-{session_id}-{attempt}")
}

/// The session's sealed output keys, in the operator's namespace.
pub fn sealed_secret_name(session_id: &str) -> String {
    format!("hangar-output-keys-{session_id}")
}

/// The entry of `sealed_secret_name` holding one attempt's sealed key.
pub fn sealed_entry(attempt: i64) -> String {
    format!("attempt-{attempt}")
}

/// The hand-off Secret's data entry holding the raw key.
pub const HANDOFF_KEY: &str = "key";
/// Labels on both Secrets, so the operator finds hand-offs by session.
pub const SESSION_ID_LABEL: &str = "hangar.dev/session-id";
pub const ATTEMPT_LABEL: &str = "hangar.dev/attempt";
/// What the sealed key is bound to (AEAD associated data), so a sealed key
/// cannot be moved to another session or attempt.
pub fn seal_context(session_id: &str, attempt: i64) -> String {
    format!("output/{session_id}/{attempt}")
}

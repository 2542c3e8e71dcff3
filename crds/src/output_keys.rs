//! Where the keys of command output live. Each attempt's output is sealed
//! under a key made for that attempt. The worker makes the key on its node
//! and hands it in as a Secret it may create but never read
//! (`handoff_secret_name`); the operator seals it under the organisation key
//! into the session's output-key Secret (`sealed_secret_name`, one entry per
//! attempt) and deletes the hand-off. That Secret outlives the session by
//! `outputRetentionDays`; deleting it erases the output.

/// The prefix of every hand-off made on node `node_name`: the admission
/// policy lets a worker create Secrets under its own node's prefix only.
pub fn handoff_prefix(node_name: &str) -> String {
    format!("hangar-output-key.{node_name}.")
}

/// The worker's hand-off of one attempt's key, in the operator's namespace,
/// named by the node it was made on, so the operator takes a session's key
/// only from the session's own node.
pub fn handoff_secret_name(node_name: &str, session_id: &str, attempt: i64) -> String {
    format!("{}{session_id}-{attempt}", handoff_prefix(node_name))
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

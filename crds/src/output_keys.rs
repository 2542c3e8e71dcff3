//! Where the keys of command output live. Each attempt's output is sealed
//! under a key made for that attempt. The worker makes the key on its node
//! and hands it in as a Secret it may create but never read
//! (`handoff_secret_name`); the operator seals it under the output
//! key-encryption key (`OUTPUT_KEK_SECRET`, not the organisation key) into
//! the session's sealed output keys (`sealed_keys_name`, a ConfigMap: it
//! holds only ciphertext, one entry per attempt) and deletes the hand-off.
//! That ConfigMap outlives the session by `outputRetentionDays`; deleting
//! it erases the output.
//!
//! Custody: the gateway, which reads output, holds the output KEK and reads
//! the sealed output keys, and no other Secret; the organisation key and
//! the workspace keys it seals are the operator's alone.

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

/// The session's sealed output keys (a ConfigMap), in the operator's
/// namespace.
pub fn sealed_keys_name(session_id: &str) -> String {
    format!("hangar-output-keys-{session_id}")
}

/// The Secret holding the output key-encryption key, in the operator's
/// namespace: made by the operator, read by it and the gateway.
pub const OUTPUT_KEK_SECRET: &str = "hangar-output-kek";
/// The Secret holding the organisation key (the operator's alone).
pub const ORG_KEY_SECRET: &str = "hangar-org-key";

/// The entry of `sealed_keys_name` holding one attempt's sealed key.
pub fn sealed_entry(attempt: i64) -> String {
    format!("attempt-{attempt}")
}

/// The hand-off Secret's data entry holding the raw key.
pub const HANDOFF_KEY: &str = "key";
/// Labels on the hand-offs and the sealed keys, by session.
pub const SESSION_ID_LABEL: &str = "hangar.dev/session-id";
pub const ATTEMPT_LABEL: &str = "hangar.dev/attempt";
/// What the sealed key is bound to (AEAD associated data), so a sealed key
/// cannot be moved to another session or attempt.
pub fn seal_context(session_id: &str, attempt: i64) -> String {
    format!("output/{session_id}/{attempt}")
}

//! Idle (mode commands only): a session is idle when no command runs and no
//! client attached in the last 30 s; after `idleTimeoutSeconds` of it the
//! session pauses or ends (`idleAction`). The phase machine keeps the timer
//! (`status.idleSince`); these are the contract's numbers.

/// The annotation the gateway stamps when a client attaches (RFC 3339).
pub const ATTACHED_AT_ANNOTATION: &str = "hangar.dev/attached-at";

/// An attach counts as activity for this long.
pub const ATTACHED_FOR_SECONDS: i64 = 30;
/// `idleTimeoutSeconds`: bounds and default.
pub const MIN_TIMEOUT_SECONDS: i64 = 60;
pub const MAX_TIMEOUT_SECONDS: i64 = 86_400;
pub const DEFAULT_TIMEOUT_SECONDS: i64 = 900;

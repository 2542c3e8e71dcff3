//! The worker's heartbeat Lease: the one object through which a node's
//! worker reports to the operator (renewals, which attempt it serves, and
//! that it closed the workspace for a pause). Both sides use these names.

/// The Lease of a session, in the operator's namespace.
pub fn lease_name(session_id: &str) -> String {
    format!("hangar-session-{session_id}")
}

/// Which attempt the worker holding the Lease serves.
pub const ATTEMPT: &str = "hangar.dev/attempt";
/// Set to the attempt number once that attempt's workspace is closed.
pub const WORKSPACE_CLOSED: &str = "hangar.dev/workspace-closed";
/// RFC 3339 time the workspace was closed (for the pause latency figures).
pub const WORKSPACE_CLOSED_AT: &str = "hangar.dev/workspace-closed-at";
/// `<namespace>/<name>` of the Sandbox, so a Lease change maps to it.
pub const SANDBOX: &str = "hangar.dev/sandbox";
/// The worker renews at least this often.
pub const RENEW_SECONDS: u64 = 10;

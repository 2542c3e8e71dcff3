//! The worker's heartbeat Lease: the one object through which a node's
//! worker reports to the operator (renewals, which attempt it serves, and
//! that it closed the workspace for a pause). Both sides use these names.

/// The heartbeat Lease of the worker on node `node_name`, in the
/// operator's namespace. Named by node, not by session: a worker's identity
/// carries its node's name, and the admission policy lets it write this
/// Lease only, so no node can renew, fake or close another session's.
pub fn lease_name(node_name: &str) -> String {
    format!("hangar-node-{node_name}")
}

/// The session the worker serves (the operator trusts a Lease only for
/// the session running on that node, and only if this names it).
pub const SESSION_ID: &str = "hangar.dev/session-id";

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

//! The worker's per-node account: a ServiceAccount in the operator's
//! namespace named after the node, which the operator binds to the
//! session-worker ClusterRole in the session's namespace while the session
//! runs there. The worker mints its token (the node restriction policy
//! lets a worker mint only for its own node's account) and reads its
//! session with it: nothing of another namespace.

/// The account of the worker on `node_name`.
pub fn account_name(node_name: &str) -> String {
    format!("hangar-node-{node_name}")
}

/// The label on the account and its RoleBinding, valued with the session id:
/// the one every per-session object carries, so the orphan sweep finds
/// them all by it.
pub use crate::output_keys::SESSION_ID_LABEL;

/// The session a node serves, in labels a kubelet cannot write: the
/// NodeRestriction admission plugin refuses a node any change to labels
/// under `node-restriction.kubernetes.io` (and to its own taints, whose
/// `hangar.dev/session` value is the session id). Only the operator writes
/// them; the worker learns its session from them, never from
/// `hangar.dev/session`, which stays for selectors but a kubelet may edit.
pub const BINDING_SESSION_LABEL: &str = "hangar.node-restriction.kubernetes.io/session";
pub const BINDING_NAMESPACE_LABEL: &str = "hangar.node-restriction.kubernetes.io/session-namespace";

/// The taint on a session's node: `hangar.dev/session=<sessionId>:NoSchedule`.
pub const SESSION_TAINT: &str = "hangar.dev/session";

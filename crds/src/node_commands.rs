//! The commands a session node may read, served by the operator's node
//! service (the same TLS listener as the workspace key hand-over).
//!
//! RBAC cannot narrow a list or a watch to one session's objects, so a
//! worker bound to read Commands in its session's namespace would read the
//! argv and env of every other session there. Instead the worker holds no
//! read right on Commands at all: it asks the operator, as its node's
//! account, and the operator answers with the commands of the one session
//! bound to that node, and only those numbered for it (bound by uid).

use serde::{Deserialize, Serialize};

use crate::Command;

/// `GET ?namespace=&sandbox=&after=`: the session's commands
/// ([`NodeCommands`]), at once when they differ from version `after`
/// (or `after` is absent), else when they next change or after
/// [`WAIT_SECONDS`].
pub const PATH: &str = "/v1/node/commands";

/// The longest a request waits for a change.
pub const WAIT_SECONDS: u64 = 25;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeCommandsQuery {
    pub namespace: String,
    pub sandbox: String,
    /// The version the caller holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub struct NodeCommands {
    /// Changes whenever a command of the session is added, changed or
    /// removed; opaque to the caller.
    pub version: String,
    pub commands: Vec<Command>,
}

/// The answer to a refused request, the same whatever was wrong (no such
/// session, another node's, a token of no node account).
pub const REFUSED: &str = "node_commands_refused";

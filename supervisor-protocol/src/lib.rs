//! hangar-supervisor-protocol: the worker ⇄ supervisor messages, one JSON
//! object per line over the Unix socket. Shared by the worker
//! (`hangar-worker`, which holds the credentials) and the in-sandbox
//! supervisor (`hangar-supervisor`, which holds none); it depends on serde
//! alone, so neither side pulls in the other's dependencies through it.
//!
//! Output bytes travel base64-encoded, each chunk marked with its stream and
//! its byte offset in the command's output (the supervisor, which reads the
//! pipes, is the one that knows the order of the bytes).
//!
//! Delivery is at least once: every message from the supervisor carries a
//! sequence number and stays in its outbox until the worker acknowledges it
//! (after the output is on the node's spool or the status is written). A
//! worker that restarts gets every unacknowledged message again and drops
//! what it already has by offset, so nothing is lost or written twice.

use serde::{Deserialize, Serialize};

/// Written by the worker inside the workspace once it is open (on a real
/// node: mapped and mounted, so the file is on the encrypted filesystem)
/// and removed when it closes. The supervisor starts nothing before it
/// sees it: whatever ran earlier would write to the node's root disk
/// under the mount point, in the clear, and be hidden by the mount.
pub const WORKSPACE_OPEN_MARKER: &str = ".hangar/open";

/// From the worker to the supervisor.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum ToSupervisor {
    /// Run a command (argv, env, working directory, timeout). A second Run
    /// with an id the supervisor has already seen is ignored.
    Run { id: u32, argv: Vec<String>, env: Vec<(String, String)>, cwd: Option<String>, timeout_seconds: u64 },
    /// Cancel a running command: SIGTERM, then SIGKILL after the grace.
    Cancel { id: u32 },
    /// The session is pausing: end every running command.
    KillAll,
    /// Every message up to and including `seq` is processed: drop them.
    Ack { upto: u64 },
}

/// The first line on every connection, not sequenced: who the worker is
/// talking to. `boot` changes when the supervisor (the container) restarts;
/// `known` lists every command id this supervisor has accepted.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Hello {
    pub boot: String,
    pub known: Vec<u32>,
}

/// A sequenced message from the supervisor.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Sequenced {
    pub seq: u64,
    pub msg: FromSupervisor,
}

/// From the supervisor to the worker.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum FromSupervisor {
    Started {
        id: u32,
        pid: u32,
    },
    /// Could not start (no such program, bad directory, …).
    Failed {
        id: u32,
        message: String,
    },
    /// `offset` is the position of the chunk's first byte in the command's
    /// output (stdout and stderr together).
    Output {
        id: u32,
        stream: OutputStream,
        offset: u64,
        data_b64: String,
    },
    /// The process ended. `exit_code` is absent when a signal ended it.
    Exited {
        id: u32,
        exit_code: Option<i32>,
        signal: Option<i32>,
        ended_by: EndedBy,
    },
    /// Mode agent: the agent's own command ended.
    AgentExited {
        exit_code: Option<i32>,
        signal: Option<i32>,
    },
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum OutputStream {
    Stdout,
    Stderr,
}

/// Why a process ended: by itself, or because it was told to.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum EndedBy {
    Itself,
    Timeout,
    Cancel,
    KillAll,
}

//! Worker ⇄ supervisor messages, one JSON object per line over the Unix
//! socket. Output bytes travel base64-encoded, each chunk marked with its
//! stream; offsets are the worker's business (it owns the output store).

use serde::{Deserialize, Serialize};

/// From the worker to the supervisor.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum ToSupervisor {
    /// Run a command (argv, env, working directory, timeout).
    Run { id: u32, argv: Vec<String>, env: Vec<(String, String)>, cwd: Option<String>, timeout_seconds: u64 },
    /// Cancel a running command: SIGTERM, then SIGKILL after the grace.
    Cancel { id: u32 },
    /// The session is pausing: end every running command.
    KillAll,
}

/// From the supervisor to the worker.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum FromSupervisor {
    Started { id: u32, pid: u32 },
    /// Could not start (no such program, bad directory, …).
    Failed { id: u32, message: String },
    Output { id: u32, stream: OutputStream, data_b64: String },
    /// The process ended. `exit_code` is absent when a signal ended it.
    Exited { id: u32, exit_code: Option<i32>, signal: Option<i32>, ended_by: EndedBy },
    /// Mode agent: the agent's own command ended.
    AgentExited { exit_code: Option<i32>, signal: Option<i32> },
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

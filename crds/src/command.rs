//! `Command`: one program run inside a session in mode commands.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub const DEFAULT_TIMEOUT_SECONDS: i64 = 3600;

/// Who created the command: written by the apiserver itself on create (the
/// chart's `command-sender` MutatingAdmissionPolicy, from the request's
/// username, replacing whatever the client wrote) and kept unchanged by a
/// ValidatingAdmissionPolicy; the operator copies it to `status.sentBy`.
pub const SENDER_ANNOTATION: &str = "hangar.dev/sender";

/// A command sent to a session. No stdin, no TTY, no interactive shell: the
/// schema has no such fields, so strict field validation refuses them.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "hangar.dev",
    version = "v1alpha1",
    kind = "Command",
    namespaced,
    shortname = "sbxcmd",
    category = "hangar",
    status = "CommandStatus",
    derive = "PartialEq",
    // `kubectl get sbxcmd --field-selector spec.sandbox=NAME`; the worker
    // watches only its session's commands this way.
    selectable = ".spec.sandbox",
    printcolumn = r#"{"name":"Sandbox","type":"string","jsonPath":".spec.sandbox"}"#,
    printcolumn = r#"{"name":"Number","type":"integer","jsonPath":".status.number"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Exit","type":"integer","jsonPath":".status.exitCode"}"#,
    printcolumn = r#"{"name":"Sent By","type":"string","jsonPath":".status.sentBy"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct CommandSpec {
    /// Name of the Sandbox, in the same namespace.
    pub sandbox: String,
    /// Program and arguments (1 or more).
    pub argv: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Working directory in the agent container; `/workspace` when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    /// 1–86400, default 3600. Past it the command ends `timed_out`.
    #[serde(default = "default_timeout_seconds")]
    pub timeout_seconds: i64,
    /// Cancel the command. `true` is final; a cancelled queued command never runs.
    #[serde(default)]
    pub cancel: bool,
}

impl Command {
    /// Who created it, as the apiserver wrote it ([`SENDER_ANNOTATION`]).
    pub fn sender(&self) -> Option<&str> {
        self.metadata.annotations.as_ref()?.get(SENDER_ANNOTATION).map(String::as_str)
    }

    /// Whether this command belongs to the session `sandbox`: it names the
    /// Sandbox, in its namespace, and was not admitted for an earlier
    /// Sandbox of the same name (bound by uid; one not yet numbered is
    /// not bound yet).
    pub fn belongs_to(&self, sandbox: &crate::Sandbox) -> bool {
        self.metadata.namespace == sandbox.metadata.namespace
            && Some(&self.spec.sandbox) == sandbox.metadata.name.as_ref()
            && match self.status.as_ref().and_then(|s| s.sandbox_uid.as_ref()) {
                Some(uid) => Some(uid) == sandbox.metadata.uid.as_ref(),
                None => true,
            }
    }
}

/// The command's job on the session certificate: `<sessionId>/cmd/<n>`.
pub fn job_id(session_id: &str, number: i64) -> String {
    format!("{session_id}/cmd/{number}")
}

/// The most commands one session takes, and the most not yet finished.
pub const MAX_PER_SESSION: i64 = 247;
pub const MAX_UNFINISHED: i64 = 64;
/// The most commands running at once in one session.
pub const MAX_RUNNING: usize = 16;

fn default_timeout_seconds() -> i64 {
    DEFAULT_TIMEOUT_SECONDS
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct EnvVar {
    pub name: String,
    #[serde(default)]
    pub value: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CommandStatus {
    /// Number in the session, from 1, without gaps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub number: Option<i64>,
    /// `<sessionId>/cmd/<number>`, the job on the session certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<CommandPhase>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The attempt the command ran in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// Bytes of output stored so far (the offset a reader can read up to).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_bytes: Option<i64>,
    /// Who sent the command: the SessionToken's name when a token sent it,
    /// else the member's username. Written once, by the operator, from what
    /// the apiserver told the admission webhook: nobody can forge it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent_by: Option<String>,
    /// The full identity that sent it (`hangar:token:<namespace>:<name>`
    /// for a token). Written once, with `sentBy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The uid of the Sandbox this command was admitted for: the command
    /// belongs to that session only, not to a later Sandbox of the same
    /// name. Written once, with the number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_uid: Option<String>,
    /// The node the session runs on, stamped by the operator: only the
    /// worker on this node may write this status (an admission policy on
    /// the worker's node-bound identity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CommandPhase {
    Queued,
    Running,
    Cancelling,
    Exited,
    Cancelled,
    KilledAtPause,
    TimedOut,
    OutcomeUnknown,
}

impl CommandPhase {
    pub const ALL: [CommandPhase; 8] = [
        CommandPhase::Queued,
        CommandPhase::Running,
        CommandPhase::Cancelling,
        CommandPhase::Exited,
        CommandPhase::Cancelled,
        CommandPhase::KilledAtPause,
        CommandPhase::TimedOut,
        CommandPhase::OutcomeUnknown,
    ];

    pub const FINAL: [CommandPhase; 5] = [
        CommandPhase::Exited,
        CommandPhase::Cancelled,
        CommandPhase::KilledAtPause,
        CommandPhase::TimedOut,
        CommandPhase::OutcomeUnknown,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            CommandPhase::Queued => "queued",
            CommandPhase::Running => "running",
            CommandPhase::Cancelling => "cancelling",
            CommandPhase::Exited => "exited",
            CommandPhase::Cancelled => "cancelled",
            CommandPhase::KilledAtPause => "killed_at_pause",
            CommandPhase::TimedOut => "timed_out",
            CommandPhase::OutcomeUnknown => "outcome_unknown",
        }
    }

    /// The last five statuses are final: a command never leaves them.
    pub const fn is_final(self) -> bool {
        matches!(
            self,
            CommandPhase::Exited
                | CommandPhase::Cancelled
                | CommandPhase::KilledAtPause
                | CommandPhase::TimedOut
                | CommandPhase::OutcomeUnknown
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exactly_five_phases_are_final() {
        use CommandPhase::*;
        let all = [Queued, Running, Cancelling, Exited, Cancelled, KilledAtPause, TimedOut, OutcomeUnknown];
        assert_eq!(all.iter().filter(|p| p.is_final()).count(), 5);
        assert!(!Cancelling.is_final());
        for p in all {
            assert_eq!(serde_json::to_value(p).unwrap(), serde_json::json!(p.as_str()));
            assert_eq!(CommandPhase::FINAL.contains(&p), p.is_final());
        }
    }
}

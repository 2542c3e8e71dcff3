//! Command admission between the admission webhook and the operator's
//! leader (HTTPS, the operator's node service): the webhook checks the
//! caller's token scope, then asks the leader whether the session takes
//! the command. The leader is the one place that decides and numbers a
//! session's commands, so it holds the session's ledger in memory and
//! answers without a write to the apiserver, exactly, however many webhook
//! replicas ask.

use serde::{Deserialize, Serialize};

/// `POST` a [`CommandAdmissionRequest`]: a [`CommandAdmissionAnswer`].
pub const PATH: &str = "/v1/admission/commands";
/// `POST` an [`EndingNotice`]: 204. The webhook tells the leader of an end
/// it admits (a Sandbox's `state: Ended`, or its deletion) before the
/// apiserver stores it, so a command created right after is refused even
/// while the leader's watch has not seen the end yet.
pub const ENDING_PATH: &str = "/v1/admission/endings";

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CommandAdmissionRequest {
    pub namespace: String,
    /// The Sandbox the command names.
    pub sandbox: String,
    /// The Command's uid (given before validating admission) and name.
    pub uid: String,
    pub name: String,
    /// Who sends it, as the apiserver told the webhook.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender: Option<String>,
    /// Decide only: reserve nothing.
    #[serde(default)]
    pub dry_run: bool,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CommandAdmissionAnswer {
    pub allowed: bool,
    /// When refused: the contract's error code and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EndingNotice {
    pub namespace: String,
    pub sandbox: String,
    /// The Sandbox's uid: the session that ends.
    pub uid: String,
}

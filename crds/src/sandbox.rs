//! `Sandbox`: one agent session on a dedicated arm64 node.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Desired state of a sandbox session. Validation that the schema cannot
/// express with types alone lives in CEL rules added by `crate::schema`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "hangar.dev",
    version = "v1alpha1",
    kind = "Sandbox",
    namespaced,
    shortname = "sbx",
    category = "hangar",
    status = "SandboxStatus",
    derive = "PartialEq",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".spec.mode"}"#,
    printcolumn = r#"{"name":"State","type":"string","jsonPath":".spec.state","priority":1}"#,
    printcolumn = r#"{"name":"Instance","type":"string","jsonPath":".status.instanceId"}"#,
    printcolumn = r#"{"name":"Attempt","type":"integer","jsonPath":".status.attempt","priority":1}"#,
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".status.nodeName","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct SandboxSpec {
    /// `agent` (default): the agent's command is the main process and the
    /// session ends with it. `commands`: no main process; runs the Commands
    /// sent to it; only this mode can pause.
    #[serde(default)]
    pub mode: Mode,
    /// Agent image, pinned by digest (`repo@sha256:<64 hex>`). Exactly one of
    /// `image` and `template`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// A registered SandboxTemplate, `name@version`. Exactly one of `image`
    /// and `template`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// The agent's command (mode agent). Empty means the image's entrypoint.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Containers started beside the agent, each pinned by digest.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub companions: Vec<Companion>,
    /// The customer this session serves; only this tenant's secrets attach.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Mode commands only: seconds idle before `idleAction` (60–86400).
    /// Unset means 900 in mode commands (see `SandboxSpec::idle_policy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_seconds: Option<i64>,
    /// Mode commands only: `end` (the default) or `pause`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_action: Option<IdleAction>,
    /// Hard stop: most metered compute seconds across all attempts
    /// (3600–604800). A pause does not use it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_after_seconds: Option<i64>,
    /// Days command output is kept after the session ends (1–90).
    #[serde(default = "default_output_retention_days")]
    pub output_retention_days: i64,
    /// Instance shape: `tiny`, `small` (default), `medium`, `large`.
    #[serde(default)]
    pub size: Size,
    /// Destinations the session may reach.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Egress>,
    /// Secrets of the session's tenant mounted into the agent container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<Attachment>,
    /// `Running` (default), `Paused` (mode commands only) or `Ended`.
    /// `Ended` is final.
    #[serde(default)]
    pub state: DesiredState,
    /// Revoke All: ends the session and every token. `true` is final.
    #[serde(default)]
    pub revoke_all: bool,
}

pub const DEFAULT_OUTPUT_RETENTION_DAYS: i64 = 30;
pub const DEFAULT_IDLE_TIMEOUT_SECONDS: i64 = 900;

fn default_output_retention_days() -> i64 {
    DEFAULT_OUTPUT_RETENTION_DAYS
}

/// What happens when a session in mode commands has been idle long enough.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdlePolicy {
    pub timeout_seconds: i64,
    pub action: IdleAction,
}

impl Sandbox {
    /// Ended, or on its way there: asked to end (state Ended, or deleted),
    /// or in a phase of the reset or after it. Nothing new starts in it.
    pub fn has_ended(&self) -> bool {
        let phase = self.status.as_ref().and_then(|s| s.phase);
        self.spec.state == DesiredState::Ended
            || self.metadata.deletion_timestamp.is_some()
            || matches!(phase, Some(Phase::Stopping | Phase::Ended | Phase::Failed | Phase::ResetIncomplete))
    }
}

impl SandboxSpec {
    /// The idle settings in force. The defaults (900 s, `end`) depend on the
    /// mode, which an OpenAPI default cannot express, so they are applied
    /// here, in the one function the operator and webhook both call, instead
    /// of being written into the object.
    pub fn idle_policy(&self) -> Option<IdlePolicy> {
        match self.mode {
            Mode::Agent => None,
            Mode::Commands => Some(IdlePolicy {
                timeout_seconds: self.idle_timeout_seconds.unwrap_or(DEFAULT_IDLE_TIMEOUT_SECONDS),
                action: self.idle_action.unwrap_or_default(),
            }),
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    Agent,
    Commands,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum IdleAction {
    #[default]
    End,
    Pause,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Size {
    Tiny,
    #[default]
    Small,
    Medium,
    Large,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum DesiredState {
    #[default]
    Running,
    Paused,
    Ended,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Companion {
    /// Container name (DNS label), unique within the session.
    pub name: String,
    /// Image pinned by digest.
    pub image: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Egress {
    /// Host names (optionally `*.` wildcards) the session may reach.
    #[serde(default)]
    pub allow: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Attachment {
    /// A Secret of the session's tenant, in the Sandbox's namespace: it
    /// carries the label `hangar.dev/tenant=<spec.tenant>`.
    pub secret_name: String,
    /// Absolute path of a directory in the agent container: each key of
    /// the Secret is a file there (read-only). Read again at each attempt;
    /// a Secret deleted meanwhile is not attached.
    pub destination: String,
    /// Companions (by name) that also get it; none unless listed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub companions: Vec<String>,
}

/// The label that gives a Secret to a tenant: only a session of that
/// tenant may attach it.
pub const TENANT_LABEL: &str = "hangar.dev/tenant";

/// Observed state of a session, written only by the operator.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxStatus {
    /// The session id: the Sandbox's `metadata.uid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// Number of the current attempt (from 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempts: Vec<Attempt>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// Memory of the session's shape.
    #[serde(rename = "memoryGiB", default, skip_serializing_if = "Option::is_none")]
    pub memory_gib: Option<i64>,
    /// How the session ended, e.g. `completed`, `outcome_unknown`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// Why it stopped, e.g. `stop_after`, `idle_timeout`, `cancelled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
    /// Mode agent: the agent's exit code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Metered compute of all attempts, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_seconds: Option<i64>,
    /// Mode commands: the part of `computeSeconds` spent idle (no command
    /// running, no client attached in the last 30 s), flagged apart for
    /// billing; counted when each idle stretch ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub billing: Option<Billing>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate: Option<Certificate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commands: Option<CommandCounts>,
    /// When the output keys were destroyed (`outputRetentionDays` after the
    /// end): from then on output reads answer 410 `sandbox_output_erased`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_erased_at: Option<Time>,
    /// Whether the workspace volume is attached to the instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_attached: Option<bool>,
    /// Progress of the pause in flight (phase pausing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause: Option<PauseProgress>,
    /// The last resume that could not start the instance: the session
    /// stays paused and that request is not tried again. A new request — a
    /// new generation of the spec, or a new value of the annotation
    /// `hangar.dev/retry-resume` — tries again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_failed: Option<ResumeFailure>,
    /// Mode commands: idle (no command running, no client attached in the
    /// last 30 s) since then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_since: Option<Time>,
    /// Paused by `idleAction: pause` while the spec asked for running: the
    /// resume request then in force (generation / `hangar.dev/retry-resume`).
    /// A new request resumes it (the gateway's resume route makes one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_paused_request: Option<String>,
    /// When the running attempt's metered compute reaches
    /// `stopAfterSeconds`. The worker hands it to the node (the file
    /// `HARD_STOP_FILE_NAME` in its spool), whose own timer powers the
    /// instance off then, whatever happens to the operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hard_stop_at: Option<Time>,
    /// Every interruption of the session, oldest first: the attempt it
    /// ended, why, when it was seen and when the session recovered. The
    /// last one without `recoveredAt` is in progress (phase interrupted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interruptions: Vec<Interruption>,
    /// When EC2 warned (EventBridge, spot interruption warning) that the
    /// current instance is about to be reclaimed: a stop that follows is an
    /// interruption even while pausing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaim_warned_at: Option<Time>,
    /// The image preflight: every image the session runs (agent and
    /// companions) read from its registry before any instance starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_preflight: Option<ImagePreflight>,
    /// Reset steps confirmed so far, in order (phases stopping,
    /// reset_incomplete, ended, failed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reset: Vec<ResetStepStatus>,
    /// While the reset runs (phases stopping, reset_incomplete): the step
    /// not yet confirmed, what it waits for or why it failed, and since
    /// when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset_pending: Option<ResetPending>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PauseProgress {
    /// When the pause was asked for (the 90 s grace counts from here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_at: Option<Time>,
    /// When the worker reported the workspace closed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_closed_at: Option<Time>,
    /// When StopInstances was called.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_requested_at: Option<Time>,
    /// True when the instance was stopped without the worker's report.
    #[serde(default)]
    pub forced: bool,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResumeFailure {
    /// The request that failed: `<generation>/<hangar.dev/retry-resume>`.
    pub request: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<Time>,
    /// Why, as EC2 said it.
    pub reason: String,
}

/// The image preflight's state and what it found.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImagePreflight {
    pub state: PreflightState,
    /// Refused: the contract's code (`preflight_architecture`,
    /// `preflight_too_large`) or why the image could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// Refused: the reason and the next step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Passed: each image, the linux/arm64 manifest it runs and its size.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<CheckedImage>,
    /// When the preflight began (a registry that stays unreachable fails
    /// the session after the operator's preflight timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum PreflightState {
    /// Reading the images from their registries (`image_preflight_pending`).
    #[default]
    Pending,
    Passed,
    Refused,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CheckedImage {
    /// As the spec names it (`repo@sha256:…`).
    pub image: String,
    /// The digest of its linux/arm64 image manifest (an index's entry).
    pub manifest_digest: String,
    /// Compressed size, each layer at the larger of declared and stored.
    pub compressed_bytes: i64,
}

/// The node-side hard-stop deadline's file in the worker's spool directory
/// (Unix seconds; absent: no deadline).
pub const HARD_STOP_FILE_NAME: &str = "hard-stop-at";

/// One interruption: the instance stopped or vanished, or its worker went
/// silent, and nobody asked for a pause.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Interruption {
    /// The attempt it ended.
    pub attempt: i64,
    pub cause: InterruptionCause,
    pub detected_at: Time,
    /// The worker's last heartbeat before it: compute is metered to here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat_at: Option<Time>,
    /// Worker lost: when the instance was stopped to be started again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_requested_at: Option<Time>,
    /// When StartInstances was last asked for the recovery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_requested_at: Option<Time>,
    /// When the recovery attempt ran with its worker reporting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovered_at: Option<Time>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum InterruptionCause {
    /// The instance stopped under the session (a spot reclamation).
    Reclaimed,
    /// The instance runs but its worker stopped reporting.
    WorkerLost,
    /// The instance was terminated or is gone.
    HostLost,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResetStepStatus {
    /// `revoke_tokens`, `cancel_queued_commands`, `terminate_instance`,
    /// `delete_volume`, `destroy_key`, `sign_certificate`.
    pub step: String,
    pub confirmed_at: Time,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResetPending {
    pub step: String,
    /// What the step waits for, or (phase reset_incomplete) why its last
    /// try failed.
    pub message: String,
    pub since: Time,
}

/// Session phase. `failed`: ended before its instance existed, the reset
/// complete. `reset_incomplete`: a reset step is not yet confirmed.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Launching,
    Running,
    Pausing,
    Paused,
    Resuming,
    Interrupted,
    Stopping,
    Ended,
    Failed,
    ResetIncomplete,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Attempt {
    pub number: i64,
    pub cause: AttemptCause,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<AttemptEnd>,
    #[serde(default)]
    pub compute_seconds: i64,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AttemptCause {
    Launch,
    Resume,
    Recovery,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AttemptEnd {
    Paused,
    Interrupted,
    HostLost,
    WorkerLost,
    StartFailed,
    SessionEnded,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Billing {
    /// Most the compute can cost when `stopAfterSeconds` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_at_most_cents: Option<i64>,
    /// Charged once, when the instance first runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimum_charge_cents: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_cents: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_cents: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_cents: Option<i64>,
    /// The minimum (once the instance has run), compute and storage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_cents: Option<i64>,
    /// Set at the end: compute counted to the second rather than per
    /// started minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trued_up: Option<bool>,
}

/// The ConfigMap (in the operator's namespace) where every key that has
/// signed a session certificate is published, `keyId → base64 public key`;
/// entries are only ever added, so a certificate signed before a rotation
/// still finds its key. The gateway serves it at `GET /v1/certificate-keys`.
pub const CERTIFICATE_KEYS_CONFIGMAP: &str = "hangar-certificate-keys";

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Certificate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signed_at: Option<Time>,
    /// Where the signed record is kept: its object key in the output
    /// store (the gateway serves it at `GET /v1/sandboxes/{id}/certificate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record_ref: Option<String>,
    /// `sha256:<hex>` of the signed record's bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// The id of the key that signed it (keys rotate by id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CommandCounts {
    pub total: i64,
    pub unfinished: i64,
    pub running: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_defaults_apply_in_commands_mode_only() {
        let spec: SandboxSpec = serde_json::from_value(serde_json::json!({"mode": "commands"})).unwrap();
        assert_eq!(spec.idle_policy(), Some(IdlePolicy { timeout_seconds: 900, action: IdleAction::End }));
        let agent: SandboxSpec = serde_json::from_value(serde_json::json!({})).unwrap();
        assert_eq!(agent.mode, Mode::Agent);
        assert_eq!(agent.idle_policy(), None);
        let set: SandboxSpec = serde_json::from_value(
            serde_json::json!({"mode": "commands", "idleTimeoutSeconds": 60, "idleAction": "pause"}),
        )
        .unwrap();
        assert_eq!(set.idle_policy(), Some(IdlePolicy { timeout_seconds: 60, action: IdleAction::Pause }));
    }
}

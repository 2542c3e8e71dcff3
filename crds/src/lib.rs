//! The `hangar.dev/v1alpha1` API: `Sandbox`, `Command`, `SessionToken`
//! (namespaced) and `SandboxTemplate` (cluster-scoped).
//!
//! The Rust types are the source of truth; `manifests::all()` turns them into
//! the CRDs (with the CEL rules of `schema`), `crdgen` writes those to
//! `crds/manifests/` and the Helm chart, and a test fails when the files on
//! disk drift from the types.

pub mod command;
pub mod command_admission;
pub mod error_code;
pub mod heartbeat;
pub mod manifests;
pub mod node_commands;
pub mod output_keys;
pub mod sandbox;
pub mod sandbox_template;
mod schema;
pub mod session_token;
pub mod worker_identity;
pub mod workspace_key;

pub use command::{Command, CommandPhase, CommandSpec, CommandStatus, EnvVar, job_id};
pub use error_code::ErrorCode;
pub use sandbox::{
    Attachment, Attempt, AttemptCause, AttemptEnd, Billing, CERTIFICATE_KEYS_CONFIGMAP, Certificate, CheckedImage,
    CommandCounts, Companion, DesiredState, Egress, IdleAction, IdlePolicy, ImagePreflight, Interruption,
    InterruptionCause, Mode, PauseProgress, Phase, PreflightState, ResetPending, ResetStepStatus, ResumeFailure,
    Sandbox, SandboxSpec, SandboxStatus, Size, TENANT_LABEL,
};
pub use sandbox_template::{SandboxTemplate, SandboxTemplateSpec, SandboxTemplateStatus, TemplateManifest};
pub use session_token::{Jwk, Scope, SessionToken, SessionTokenSpec, SessionTokenStatus, TokenPhase};

/// API group and version of every kind.
pub const GROUP: &str = "hangar.dev";
pub const VERSION: &str = "v1alpha1";

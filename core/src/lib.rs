//! hangar-core: the contract's rules as pure functions over the API types.
//! No Kubernetes client, no AWS SDK, no I/O: the operator, the webhook and
//! the gateway call these, so they cannot disagree.
//!
//! - `session/`: the Sandbox phase machine and its plan (`phase_machine`),
//!   the observed instance state (`instance`), the reset steps (`reset`),
//!   how a session ends (`ending`: stop reasons, outcomes)
//! - `commands/`: numbering (`numbering`) and the per-session limits
//!   (`limits`)
//! - `admission`: the decisions the admission webhook serves, with the
//!   contract's error codes
//! - `refusal`: a refusal and its contract error code
//! - `idle`, `hard_stop`, `retention`: the session's clocks
//! - `billing`: the billing record (compute, idle, paused storage, minimum)
//! - `tokens`: a session token's expiry and phase
//! - `images`: the image preflight (platform, size)
//! - `templates`: what a template release signs; which template a session may use
//! - `tenants`: which Secrets a session may attach
//! - `workspace_key`: which proven instance gets a session's workspace key

pub mod admission;
pub mod billing;
pub mod commands;
pub mod hard_stop;
pub mod idle;
pub mod images;
pub mod refusal;
pub mod retention;
pub mod session;
pub mod templates;
pub mod tenants;
pub mod tokens;
pub mod workspace_key;

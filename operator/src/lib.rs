//! hangar-operator: runs each Sandbox session on a dedicated arm64 EC2 node.
//!
//! - `lifecycle/`: the Sandbox controller (the reconcile pipeline around
//!   `hangar_core::session::phase_machine`); `sandbox_status`: its status
//!   write (server-side apply)
//! - `ec2/`: the node provider (launch, stop, start, terminate, volumes,
//!   the batched instance watcher, user data), configured by its own
//!   `Ec2Settings`; `orphan_sweep`: instances and volumes whose session
//!   is gone
//! - `images/`: the image preflight (registry reads, cached checks)
//! - `node/`: node labels and taint, the agent Pod
//! - `commands/`: the Command controller (numbering, cancel of queued ones);
//!   `numbering_state`: what it remembers between reconciles;
//!   `command_ledger`: where the sessions' ledgers of admitted commands are
//! - `templates/`: the SandboxTemplate controller (Registered or Rejected,
//!   from the release signature)
//! - `tokens/`: the SessionToken controller (mint, digest, one delivery,
//!   phases)
//! - `keys`: session keys sealed under the organisation key
//! - `output_keys`: sealing the output keys workers hand in
//! - `output_retention`: destroying them `outputRetentionDays` after the end
//! - `metrics`: the prometheus-client registry and the raw benchmark samples

pub mod certificates;
pub mod command_ledger;
pub mod commands;
pub mod context;
pub mod ec2;
pub mod error;
pub mod failpoint;
pub mod images;
pub mod keys;
pub mod lifecycle;
pub mod metrics;
pub mod node;
pub mod numbering_state;
pub mod orphan_sweep;
pub mod output_keys;
pub mod output_retention;
pub mod own_writes;
pub mod sandbox_status;
pub mod settings;
pub mod templates;
pub mod tokens;
pub mod workspace_keys;

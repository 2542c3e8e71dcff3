//! The session's node, the agent Pod bound to it, and the per-node account
//! of the worker there.

pub mod agent_pod;
pub mod commands_feed;
pub mod labels;
pub mod worker_account;

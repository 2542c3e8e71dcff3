//! The session's node and the agent Pod bound to it.

pub mod agent_pod;
pub mod labels;

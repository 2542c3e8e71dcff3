//! The node side of a session: the worker (node-scoped, holds the
//! credentials) and the in-sandbox supervisor (the agent container's
//! entrypoint, holds none), which talk over a Unix socket in the JSON-lines
//! protocol of `protocol`. The worker's parts: `commands` (the runner),
//! `supervisor_link`, `attempt_key`, `workspace`.

pub mod attempt_key;
pub mod commands;
pub mod protocol;
pub mod supervisor;
pub mod supervisor_link;
pub mod workspace;

//! The node side of a session: the worker (node-scoped, holds the
//! credentials) and the in-sandbox supervisor (the agent container's
//! entrypoint, holds none), which talk over a Unix socket in the JSON-lines
//! protocol of `protocol`.

pub mod protocol;
pub mod supervisor;

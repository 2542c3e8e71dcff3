//! hangar-worker: the node side of a session that holds the credentials
//! (the binary in `main.rs`: heartbeat, workspace, the command runner).
//! It talks to the in-sandbox supervisor (crate `hangar-supervisor`, which
//! holds none) over a Unix socket, in the JSON-lines messages of
//! `hangar_supervisor_protocol`; it does not link the supervisor.
//!
//! - `commands`: the command runner; `commands::plan` holds its decisions
//!   (no I/O), `commands::journal` the hand-over journal on the node, and
//!   `commands` itself the I/O (Command watch, supervisor link, output
//!   writes, compare-and-swap status patches);
//! - `supervisor_link`: the worker's end of the supervisor socket;
//! - `attempt_key`: the key an attempt's output is sealed under;
//! - `workspace`: opening and closing `/workspace` (LUKS2 under the
//!   session key);
//! - `workspace_key`: getting that key for a proven instance;
//! - `hard_stop`: the attempt's compute deadline, handed to the node;
//! - `metrics`: its series on the admin server's `/metrics`.

pub mod attempt_key;
pub mod commands;
pub mod hard_stop;
pub mod metrics;
pub mod supervisor_link;
pub mod workspace;
pub mod workspace_key;

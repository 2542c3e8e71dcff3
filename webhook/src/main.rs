//! hangar-webhook. Admission rules beyond the schema (limits, token scope,
//! numbering) and the gateway arrive with the commands issue; the schema and
//! CEL rules in `hangar-crds` already enforce everything they can express.

fn main() -> std::process::ExitCode {
    eprintln!("hangar-webhook {}: no admission handlers are built in yet", env!("CARGO_PKG_VERSION"));
    std::process::ExitCode::FAILURE
}

//! hangar-worker. The per-node worker (heartbeat, workspace, commands,
//! output) arrives with the lifecycle and commands issues.

fn main() -> std::process::ExitCode {
    eprintln!("hangar-worker {}: not built in yet", env!("CARGO_PKG_VERSION"));
    std::process::ExitCode::FAILURE
}

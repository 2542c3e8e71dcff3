//! hangar-supervisor: the agent container's entrypoint (the logic is in the
//! library, `lib.rs`).
//! `hangar-supervisor --mode commands|agent --socket PATH [--workdir DIR]
//! [--grace-seconds N] [-- ARGV...]`
//! `hangar-supervisor --install PATH`: copies this binary to PATH and ends
//! (the agent Pod's init container, from hangar's supervisor image, puts it
//! where the tenant's image runs it).
//! `hangar-supervisor --version`

use std::process::ExitCode;
use std::time::Duration;

use hangar_supervisor::{Config, serve};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    if args.first().map(String::as_str) == Some("--version") {
        println!("hangar-supervisor {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    if let Some(dest) = flag("--install") {
        return match install(std::path::Path::new(&dest)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("hangar-supervisor: install to {dest}: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let mode = flag("--mode").unwrap_or_else(|| "commands".into());
    let Some(socket) = flag("--socket") else {
        eprintln!("usage: hangar-supervisor --mode commands|agent --socket PATH [-- ARGV...]");
        return ExitCode::from(2);
    };
    let agent: Vec<String> = args.iter().skip_while(|a| *a != "--").skip(1).cloned().collect();
    let agent = match mode.as_str() {
        "agent" if !agent.is_empty() => Some(agent),
        "agent" => {
            eprintln!("hangar-supervisor: mode agent needs the agent's command after --");
            return ExitCode::from(2);
        }
        _ => None,
    };
    let cfg = Config {
        socket: socket.into(),
        default_cwd: flag("--workdir").unwrap_or_else(|| "/workspace".into()).into(),
        grace: Duration::from_secs(flag("--grace-seconds").and_then(|g| g.parse().ok()).unwrap_or(10)),
    };
    wait_for_workspace(&cfg.default_cwd).await;
    match serve(cfg, agent).await {
        Ok(None) => ExitCode::SUCCESS,
        // Mode agent: the container ends with the agent, with its code.
        Ok(Some(end)) => {
            eprintln!("hangar-supervisor: the agent ended ({end:?})");
            ExitCode::from(end.container_exit_code())
        }
        Err(e) => {
            eprintln!("hangar-supervisor: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Copies this binary to `dest` (mode 0555), through a temporary file and
/// a rename, so a restarted init container never leaves half a binary.
fn install(dest: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let tmp = dest.with_extension("installing");
    std::fs::copy(std::env::current_exe()?, &tmp)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o555))?;
    std::fs::rename(&tmp, dest)
}

/// Waits until the worker has opened the workspace (its marker is there):
/// nothing runs on the bare mount point.
async fn wait_for_workspace(workdir: &std::path::Path) {
    let marker = workdir.join(hangar_supervisor_protocol::WORKSPACE_OPEN_MARKER);
    if marker.exists() {
        return;
    }
    eprintln!("hangar-supervisor: waiting for the worker to open {}", workdir.display());
    while !marker.exists() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

//! The supervisor as a real process on a real Unix socket: output marked by
//! stream with continuous offsets, exit codes, timeouts (SIGTERM then
//! SIGKILL), cancel, output kept while no worker is connected, and
//! at-least-once delivery: whatever the worker did not acknowledge comes
//! again on the next connection, and a repeated Run is not run twice.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use base64::Engine;
use hangar_supervisor_protocol::{EndedBy, FromSupervisor, Hello, OutputStream, Sequenced, ToSupervisor};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

type Lines = tokio::io::Lines<BufReader<tokio::net::unix::OwnedReadHalf>>;

struct Supervisor(Child);

impl Drop for Supervisor {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What the worker does once the workspace is open (the supervisor waits
/// for it).
fn open_workspace(dir: &Path) {
    let marker = dir.join(hangar_supervisor_protocol::WORKSPACE_OPEN_MARKER);
    std::fs::create_dir_all(marker.parent().unwrap()).unwrap();
    std::fs::write(marker, b"open\n").unwrap();
}

async fn start(dir: &Path) -> (Supervisor, std::path::PathBuf) {
    start_in(dir, "commands", &["--grace-seconds", "1"]).await
}

/// The supervisor in `mode` with `extra` arguments, once its socket answers.
async fn start_in(dir: &Path, mode: &str, extra: &[&str]) -> (Supervisor, std::path::PathBuf) {
    let socket = dir.join("supervisor.sock");
    open_workspace(dir);
    let child = Command::new(env!("CARGO_BIN_EXE_hangar-supervisor"))
        .args(["--mode", mode, "--socket", socket.to_str().unwrap(), "--workdir", dir.to_str().unwrap()])
        .args(extra)
        .spawn()
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while UnixStream::connect(&socket).await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "supervisor socket never appeared");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (Supervisor(child), socket)
}

/// Reads messages until `id` exits; returns (stdout, stderr, exit message)
/// and checks the offsets are continuous from 0 across both streams.
async fn collect(lines: &mut Lines, id: u32) -> (Vec<u8>, Vec<u8>, FromSupervisor) {
    let mut out: HashMap<OutputStream, Vec<u8>> = HashMap::new();
    let mut next_offset = 0;
    let read = async {
        while let Some(line) = lines.next_line().await.unwrap() {
            match serde_json::from_str::<Sequenced>(&line).unwrap().msg {
                FromSupervisor::Output { id: i, stream, offset, data_b64 } if i == id => {
                    let bytes = base64::engine::general_purpose::STANDARD.decode(data_b64).unwrap();
                    assert_eq!(offset, next_offset, "offsets are continuous");
                    next_offset += bytes.len() as u64;
                    out.entry(stream).or_default().extend(bytes)
                }
                m @ FromSupervisor::Exited { id: i, .. } if i == id => return m,
                _ => {}
            }
        }
        panic!("socket closed");
    };
    let exited = tokio::time::timeout(Duration::from_secs(20), read).await.expect("command did not exit in time");
    (
        out.remove(&OutputStream::Stdout).unwrap_or_default(),
        out.remove(&OutputStream::Stderr).unwrap_or_default(),
        exited,
    )
}

fn run(id: u32, script: &str, timeout_seconds: u64) -> ToSupervisor {
    ToSupervisor::Run {
        id,
        argv: vec!["sh".into(), "-c".into(), script.into()],
        env: vec![("GREETING".into(), "hello".into())],
        cwd: None,
        timeout_seconds,
    }
}

/// Connects and reads the supervisor's hello.
async fn connect(socket: &Path) -> (Lines, tokio::net::unix::OwnedWriteHalf, Hello) {
    let (r, w) = UnixStream::connect(socket).await.unwrap().into_split();
    let mut lines = BufReader::new(r).lines();
    let hello = serde_json::from_str(&lines.next_line().await.unwrap().unwrap()).unwrap();
    (lines, w, hello)
}

async fn send(w: &mut tokio::net::unix::OwnedWriteHalf, m: &ToSupervisor) {
    let mut line = serde_json::to_vec(m).unwrap();
    line.push(b'\n');
    w.write_all(&line).await.unwrap();
}

#[tokio::test]
async fn output_is_marked_by_stream_and_the_exit_code_reported() {
    let dir = tempfile::tempdir().unwrap();
    let (_sup, socket) = start(dir.path()).await;
    let (mut lines, mut w, _) = connect(&socket).await;
    send(&mut w, &run(1, "echo $GREETING; pwd; echo oops >&2; exit 3", 60)).await;
    let (out, err, exited) = collect(&mut lines, 1).await;
    assert_eq!(
        String::from_utf8(out).unwrap(),
        format!("hello\n{}\n", dir.path().display()),
        "env and default working directory"
    );
    assert_eq!(err, b"oops\n");
    assert_eq!(exited, FromSupervisor::Exited { id: 1, exit_code: Some(3), signal: None, ended_by: EndedBy::Itself });
}

#[tokio::test]
async fn a_timeout_ends_the_command_and_its_children() {
    let dir = tempfile::tempdir().unwrap();
    let (_sup, socket) = start(dir.path()).await;
    let (mut lines, mut w, _) = connect(&socket).await;
    // The shell ignores SIGTERM, so only the SIGKILL after the grace ends it.
    send(&mut w, &run(2, "trap '' TERM; echo started; sleep 30 & wait", 1)).await;
    let (out, _, exited) = collect(&mut lines, 2).await;
    assert_eq!(out, b"started\n");
    assert_eq!(exited, FromSupervisor::Exited { id: 2, exit_code: None, signal: Some(9), ended_by: EndedBy::Timeout });
}

#[tokio::test]
async fn cancel_sends_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let (_sup, socket) = start(dir.path()).await;
    let (mut lines, mut w, _) = connect(&socket).await;
    send(&mut w, &run(3, "echo running; exec sleep 30", 60)).await;
    // Wait until it runs, then cancel.
    loop {
        let line = lines.next_line().await.unwrap().unwrap();
        if matches!(serde_json::from_str::<Sequenced>(&line).unwrap().msg, FromSupervisor::Output { id: 3, .. }) {
            break;
        }
    }
    send(&mut w, &ToSupervisor::Cancel { id: 3 }).await;
    let (_, _, exited) = collect(&mut lines, 3).await;
    assert_eq!(exited, FromSupervisor::Exited { id: 3, exit_code: None, signal: Some(15), ended_by: EndedBy::Cancel });
}

#[tokio::test]
async fn output_made_while_no_worker_is_connected_is_delivered_later() {
    let dir = tempfile::tempdir().unwrap();
    let (_sup, socket) = start(dir.path()).await;
    let (lines, mut w, _) = connect(&socket).await;
    send(&mut w, &run(4, "sleep 0.3; echo while-away", 60)).await;
    drop(lines);
    drop(w); // the worker restarts
    let (mut lines, _w, hello) = connect(&socket).await;
    assert_eq!(hello.known, vec![4], "the supervisor tells a new worker which commands it has");
    let (out, _, exited) = collect(&mut lines, 4).await;
    assert_eq!(out, b"while-away\n");
    assert!(matches!(exited, FromSupervisor::Exited { exit_code: Some(0), .. }));
}

#[tokio::test]
async fn unacknowledged_messages_come_again_and_a_repeated_run_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let (_sup, socket) = start(dir.path()).await;
    let (mut lines, mut w, first) = connect(&socket).await;
    assert!(first.known.is_empty());
    send(&mut w, &run(5, "echo one; echo two >&2; echo three", 60)).await;
    let (out, err, _) = collect(&mut lines, 5).await;
    assert_eq!((out.as_slice(), err.as_slice()), (&b"one\nthree\n"[..], &b"two\n"[..]));
    // The worker "crashes" without acknowledging: everything comes again,
    // with the same sequence numbers and offsets.
    drop((lines, w));
    let (mut lines, mut w, hello) = connect(&socket).await;
    assert_eq!(hello.boot, first.boot, "same supervisor");
    send(&mut w, &run(5, "echo must-not-run-twice", 60)).await;
    let (out, err, exited) = collect(&mut lines, 5).await;
    assert_eq!((out.as_slice(), err.as_slice()), (&b"one\nthree\n"[..], &b"two\n"[..]), "re-delivered, not re-run");
    assert!(matches!(exited, FromSupervisor::Exited { exit_code: Some(0), .. }));
    // Acknowledge everything: the next connection gets nothing old.
    send(&mut w, &ToSupervisor::Ack { upto: u64::MAX }).await;
    send(&mut w, &run(6, "echo six", 60)).await;
    let (out, _, _) = collect(&mut lines, 6).await;
    assert_eq!(out, b"six\n");
    drop((lines, w));
    let (mut lines, mut w, _) = connect(&socket).await;
    send(&mut w, &ToSupervisor::Ack { upto: 0 }).await;
    let first_line = tokio::time::timeout(Duration::from_secs(10), lines.next_line()).await.unwrap().unwrap().unwrap();
    let m: Sequenced = serde_json::from_str(&first_line).unwrap();
    assert!(
        matches!(m.msg, FromSupervisor::Output { id: 6, .. } | FromSupervisor::Started { id: 6, .. }),
        "only command 6's messages (sent after the ack) remain: {m:?}"
    );
}

/// Code in the sandbox reaches the socket's path (it is mounted into the
/// agent container): it connects while the worker is away, to be served
/// in the worker's place. The supervisor drops it unheard: it gets no
/// hello, its acknowledgement throws nothing away, its command never runs,
/// and the worker, back, gets every message.
#[tokio::test]
async fn a_process_in_the_sandbox_is_refused_on_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let (_sup, socket) = start(dir.path()).await;
    let connected = dir.path().join("intruder-connected");
    let pwned = dir.path().join("pwned");
    let intruder = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/socket_intruder.py");
    let (lines, mut w, _) = connect(&socket).await;
    send(
        &mut w,
        &ToSupervisor::Run {
            id: 7,
            argv: vec![
                "python3".into(),
                intruder.into(),
                socket.display().to_string(),
                connected.display().to_string(),
                pwned.display().to_string(),
            ],
            env: vec![],
            cwd: None,
            timeout_seconds: 60,
        },
    )
    .await;
    // The worker goes away (a restart) and comes back only once the
    // intruder's connection is in: the supervisor has nobody else to serve.
    drop((lines, w));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !connected.exists() {
        assert!(tokio::time::Instant::now() < deadline, "the intruder never connected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (mut lines, _w, hello) = connect(&socket).await;
    let (out, _, exited) = collect(&mut lines, 7).await;
    assert_eq!(String::from_utf8_lossy(&out), "refused\n", "the intruder was not served");
    assert!(matches!(exited, FromSupervisor::Exited { exit_code: Some(0), .. }));
    assert_eq!(hello.known, vec![7], "the intruder's command was never accepted");
    assert!(!pwned.exists(), "the intruder's command never ran");
}

/// Pids of live (not zombie) processes whose command line holds `token`.
fn processes_with(token: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let zombie = stat.rsplit_once(')').and_then(|(_, t)| t.split_whitespace().next()) == Some("Z");
        if !zombie && String::from_utf8_lossy(&cmdline).contains(token) {
            found.push(pid);
        }
    }
    found
}

/// Starts a busy command carrying a unique token (`script` gets it as $1),
/// waits until it runs, ends the supervisor with `signal`, and checks no
/// process of the command is left.
async fn commands_end_with_the_supervisor(signal: nix::sys::signal::Signal, script: &str) {
    let dir = tempfile::tempdir().unwrap();
    let (mut sup, socket) = start(dir.path()).await;
    let (mut lines, mut w, _) = connect(&socket).await;
    let token = format!("hangar-orphan-check-{}-{signal}", std::process::id());
    send(&mut w, &run(7, &format!(": {token}; echo started; {script}"), 3600)).await;
    loop {
        let line = lines.next_line().await.unwrap().unwrap();
        if matches!(serde_json::from_str::<Sequenced>(&line).unwrap().msg, FromSupervisor::Output { id: 7, .. }) {
            break;
        }
    }
    assert!(!processes_with(&token).is_empty(), "the command runs");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(sup.0.id() as i32), signal).unwrap();
    let _ = sup.0.wait();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !processes_with(&token).is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "commands outlived the supervisor: {:?}",
            processes_with(&token)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// SIGKILL leaves the supervisor no chance: each command's own process
/// dies with it (PDEATHSIG). Its descendants are ended by the PID namespace
/// the supervisor is PID 1 of (a container; the node simulator's
/// `unshare`), which `e2e/tests/commands.rs` checks.
#[tokio::test]
async fn a_killed_supervisor_takes_its_commands_with_it() {
    commands_end_with_the_supervisor(nix::sys::signal::Signal::SIGKILL, "while :; do sleep 0.05; done").await;
}

/// SIGTERM (the runtime stopping the container): every process group it
/// started is killed, children of the command included.
#[tokio::test]
async fn a_terminated_supervisor_ends_every_command_and_its_children() {
    let script = "(while :; do sleep 0.05; done) & while :; do sleep 0.05; done";
    commands_end_with_the_supervisor(nix::sys::signal::Signal::SIGTERM, script).await;
}

#[tokio::test]
async fn in_mode_agent_the_agents_exit_is_reported_and_ends_the_container_with_its_code() {
    let dir = tempfile::tempdir().unwrap();
    let agent = ["--", "sh", "-c", "while [ ! -e go ]; do sleep 0.02; done; exit 7"];
    let (mut sup, socket) = start_in(dir.path(), "agent", &agent).await;
    let child = &mut sup.0;
    let (mut lines, mut w, _) = connect(&socket).await;
    assert!(child.try_wait().unwrap().is_none(), "it runs while the agent runs");
    std::fs::write(dir.path().join("go"), b"").unwrap();
    // The worker hears of the end and acknowledges it ...
    let read = async {
        while let Some(line) = lines.next_line().await.unwrap() {
            let m: Sequenced = serde_json::from_str(&line).unwrap();
            if let FromSupervisor::AgentExited { exit_code, signal } = m.msg {
                return (m.seq, exit_code, signal);
            }
        }
        panic!("socket closed before the agent's end was reported");
    };
    let (seq, exit_code, signal) = tokio::time::timeout(Duration::from_secs(10), read).await.unwrap();
    assert_eq!((exit_code, signal), (Some(7), None));
    send(&mut w, &ToSupervisor::Ack { upto: seq }).await;
    // ... and the container ends with the agent's code, at once.
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(started.elapsed() < Duration::from_secs(4), "still up after its agent ended and was acknowledged");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(status.code(), Some(7));
}

#[tokio::test]
async fn nothing_starts_before_the_worker_has_opened_the_workspace() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("supervisor.sock");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_hangar-supervisor"))
        .args(["--mode", "agent", "--socket", socket.to_str().unwrap(), "--workdir", dir.path().to_str().unwrap()])
        .args(["--", "sh", "-c", "touch ran; sleep 30"])
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
    let said = tokio::time::timeout(Duration::from_secs(10), stderr.next_line()).await.unwrap().unwrap().unwrap();
    assert!(said.contains("waiting for the worker to open"), "{said}");
    // It waits before it serves or starts the agent.
    assert!(!dir.path().join("ran").exists(), "the agent ran on the bare mount point");
    assert!(!socket.exists(), "the socket is served before the workspace is open");
    open_workspace(dir.path());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !dir.path().join("ran").exists() {
        assert!(tokio::time::Instant::now() < deadline, "the agent did not start once the workspace was open");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

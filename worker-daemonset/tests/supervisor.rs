//! The supervisor as a real process on a real Unix socket: output marked by
//! stream, exit codes, timeouts (SIGTERM then SIGKILL), cancel, and output
//! kept while no worker is connected.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use base64::Engine;
use hangar_worker::protocol::{EndedBy, FromSupervisor, OutputStream, ToSupervisor};
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

async fn start(dir: &Path) -> (Supervisor, std::path::PathBuf) {
    let socket = dir.join("supervisor.sock");
    let child = Command::new(env!("CARGO_BIN_EXE_hangar-supervisor"))
        .args(["--mode", "commands", "--socket", socket.to_str().unwrap(), "--workdir", dir.to_str().unwrap()])
        .args(["--grace-seconds", "1"])
        .spawn()
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while UnixStream::connect(&socket).await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "supervisor socket never appeared");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (Supervisor(child), socket)
}

/// Reads messages until `id` exits; returns (stdout, stderr, exit message).
async fn collect(lines: &mut Lines, id: u32) -> (Vec<u8>, Vec<u8>, FromSupervisor) {
    let mut out: HashMap<OutputStream, Vec<u8>> = HashMap::new();
    let read = async {
        while let Some(line) = lines.next_line().await.unwrap() {
            match serde_json::from_str::<FromSupervisor>(&line).unwrap() {
                FromSupervisor::Output { id: i, stream, data_b64 } if i == id => {
                    out.entry(stream).or_default().extend(base64::engine::general_purpose::STANDARD.decode(data_b64).unwrap())
                }
                m @ FromSupervisor::Exited { id: i, .. } if i == id => return m,
                _ => {}
            }
        }
        panic!("socket closed");
    };
    let exited = tokio::time::timeout(Duration::from_secs(20), read).await.expect("command did not exit in time");
    (out.remove(&OutputStream::Stdout).unwrap_or_default(), out.remove(&OutputStream::Stderr).unwrap_or_default(), exited)
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

async fn connect(socket: &Path) -> (Lines, tokio::net::unix::OwnedWriteHalf) {
    let (r, w) = UnixStream::connect(socket).await.unwrap().into_split();
    (BufReader::new(r).lines(), w)
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
    let (mut lines, mut w) = connect(&socket).await;
    send(&mut w, &run(1, "echo $GREETING; pwd; echo oops >&2; exit 3", 60)).await;
    let (out, err, exited) = collect(&mut lines, 1).await;
    assert_eq!(String::from_utf8(out).unwrap(), format!("hello\n{}\n", dir.path().display()), "env and default working directory");
    assert_eq!(err, b"oops\n");
    assert_eq!(exited, FromSupervisor::Exited { id: 1, exit_code: Some(3), signal: None, ended_by: EndedBy::Itself });
}

#[tokio::test]
async fn a_timeout_ends_the_command_and_its_children() {
    let dir = tempfile::tempdir().unwrap();
    let (_sup, socket) = start(dir.path()).await;
    let (mut lines, mut w) = connect(&socket).await;
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
    let (mut lines, mut w) = connect(&socket).await;
    send(&mut w, &run(3, "echo running; exec sleep 30", 60)).await;
    // Wait until it runs, then cancel.
    loop {
        let line = lines.next_line().await.unwrap().unwrap();
        if matches!(serde_json::from_str(&line).unwrap(), FromSupervisor::Output { id: 3, .. }) {
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
    let (lines, mut w) = connect(&socket).await;
    send(&mut w, &run(4, "sleep 0.3; echo while-away", 60)).await;
    drop(lines);
    drop(w); // the worker restarts
    let (mut lines, _w) = connect(&socket).await;
    let (out, _, exited) = collect(&mut lines, 4).await;
    assert_eq!(out, b"while-away\n");
    assert!(matches!(exited, FromSupervisor::Exited { exit_code: Some(0), .. }));
}

//! Nothing a simulated container ran outlives it, however it ends: the
//! node simulator runs the supervisor as PID 1 of a PID namespace of its
//! own, tied to the `unshare` process the harness holds (which itself gets
//! SIGKILL when the harness dies). Here that process is SIGKILLed, as a
//! dying test would leave it, with a command and its child running: none
//! of them may be left on the machine.

use std::time::{Duration, Instant};

use hangar_e2e::node_sim::container_command;
use hangar_e2e::operator::workspace_binary;
use hangar_e2e::process::{ChildProcess, RunDir, processes_with};
use hangar_supervisor_protocol::ToSupervisor;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;

#[test]
fn a_container_killed_outright_leaves_no_process_behind() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: a PID namespace needs root (CI and make up run as root)");
        return;
    }
    let dir = RunDir::new("hangar-no-orphans").unwrap();
    let socket = dir.path.join("supervisor.sock");
    // The worker's part: the workspace is open.
    let marker = dir.path.join(hangar_supervisor_protocol::WORKSPACE_OPEN_MARKER);
    std::fs::create_dir_all(marker.parent().unwrap()).unwrap();
    std::fs::write(&marker, b"open\n").unwrap();
    let mut cmd = container_command(&workspace_binary("hangar-supervisor"));
    cmd.args(["--mode", "commands", "--socket", socket.to_str().unwrap(), "--workdir", dir.path.to_str().unwrap()]);
    let mut container = ChildProcess::spawn("container", cmd, &dir.path.join("supervisor.log")).unwrap();

    let deadline = Instant::now() + Duration::from_secs(10);
    let stream = loop {
        match UnixStream::connect(&socket) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("supervisor socket: {e}\n{}", container.log_tail(20)),
        }
    };
    let token = format!("hangar-no-orphans-{}", std::process::id());
    // A busy command and a busy child of it in the background.
    let script = format!(": {token}; (while :; do sleep 0.05; done) & echo started; while :; do sleep 0.05; done");
    let run = ToSupervisor::Run {
        id: 1,
        argv: vec!["sh".into(), "-c".into(), script],
        env: vec![],
        cwd: None,
        timeout_seconds: 3600,
    };
    let mut line = serde_json::to_vec(&run).unwrap();
    line.push(b'\n');
    (&stream).write_all(&line).unwrap();
    let mut lines = BufReader::new(&stream).lines();
    lines.next().expect("hello").unwrap();
    lines.next().expect("a message of the command").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while processes_with(&token).len() < 2 {
        assert!(Instant::now() < deadline, "the command and its child never both ran");
        std::thread::sleep(Duration::from_millis(20));
    }

    container.kill();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !processes_with(&token).is_empty() {
        assert!(Instant::now() < deadline, "left behind: {:?}", processes_with(&token));
        std::thread::sleep(Duration::from_millis(20));
    }
}

//! hangar-supervisor: the in-sandbox supervisor, PID 1 of the agent
//! container (the binary in `main.rs`; this library is its whole logic, so
//! the tests can drive it). It runs the commands the worker hands it (argv,
//! env, working directory), captures stdout and stderr as marked chunks,
//! enforces timeouts (SIGTERM, then SIGKILL after a grace), cancels on
//! request and reports exit codes, in the messages of
//! `hangar_supervisor_protocol`. Nothing it ran outlives it: each command
//! gets PR_SET_PDEATHSIG, and every process group it started is killed when
//! it ends (SIGTERM, SIGINT or a listener error).
//!
//! It holds no credentials and talks only to the worker, over a Unix socket;
//! the crate depends on no Kubernetes or cloud client, so the binary cannot
//! link one. Messages stay in an outbox until the worker acknowledges them,
//! so a worker restart (even a kill -9 with messages in the socket) loses
//! none.

use std::collections::{HashMap, HashSet, VecDeque};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use hangar_supervisor_protocol::{EndedBy, FromSupervisor, Hello, OutputStream, Sequenced, ToSupervisor};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::Notify;

pub struct Config {
    pub socket: PathBuf,
    /// Working directory when a command names none (`/workspace`).
    pub default_cwd: PathBuf,
    /// Between SIGTERM and SIGKILL.
    pub grace: Duration,
}

/// Unacknowledged output above this holds the command's pipes (the process
/// blocks on write, as on a slow terminal) instead of growing memory.
const OUTBOX_LIMIT_BYTES: usize = 8 << 20;

/// Outbound messages, kept until the worker acknowledges them.
#[derive(Default)]
struct Outbox {
    state: Mutex<OutboxState>,
    ready: Notify,
    drained: Notify,
}

#[derive(Default)]
struct OutboxState {
    queue: VecDeque<(Sequenced, usize)>,
    last_seq: u64,
    bytes: usize,
    /// Every command id accepted since this supervisor started.
    known: HashSet<u32>,
}

impl Outbox {
    fn send(&self, msg: FromSupervisor) {
        let size = match &msg {
            FromSupervisor::Output { data_b64, .. } => data_b64.len(),
            _ => 0,
        };
        let mut st = self.state.lock().expect("outbox");
        st.last_seq += 1;
        let seq = st.last_seq;
        st.queue.push_back((Sequenced { seq, msg }, size));
        st.bytes += size;
        drop(st);
        self.ready.notify_one();
    }

    fn ack(&self, upto: u64) {
        let mut st = self.state.lock().expect("outbox");
        while st.queue.front().is_some_and(|(m, _)| m.seq <= upto) {
            let (_, size) = st.queue.pop_front().expect("front");
            st.bytes -= size;
        }
        drop(st);
        self.drained.notify_waiters();
    }

    /// Waits until the unacknowledged output is under the limit.
    async fn room(&self) {
        loop {
            let drained = self.drained.notified();
            tokio::pin!(drained);
            drained.as_mut().enable();
            if self.state.lock().expect("outbox").bytes < OUTBOX_LIMIT_BYTES {
                return;
            }
            drained.await;
        }
    }

    /// Waits until every message is acknowledged, or `within` passes.
    async fn acknowledged(&self, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let drained = self.drained.notified();
            tokio::pin!(drained);
            drained.as_mut().enable();
            if self.state.lock().expect("outbox").queue.is_empty() {
                return;
            }
            if tokio::time::timeout_at(deadline, drained).await.is_err() {
                return;
            }
        }
    }

    /// The first unacknowledged message after `cursor`.
    fn after(&self, cursor: u64) -> Option<Sequenced> {
        let st = self.state.lock().expect("outbox");
        st.queue.iter().find(|(m, _)| m.seq > cursor).map(|(m, _)| m.clone())
    }
}

/// Running commands: id → (process group, why it is being ended).
type Running = Arc<Mutex<HashMap<u32, (i32, Option<EndedBy>)>>>;

/// How the agent ended (mode agent): the container ends with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AgentEnd {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
}

impl AgentEnd {
    /// The container's exit code, as a runtime reports it: the agent's
    /// code, or 128 + the signal that ended it.
    pub fn container_exit_code(&self) -> u8 {
        match (self.exit_code, self.signal) {
            (Some(c), _) => c.clamp(0, 255) as u8,
            (None, Some(s)) => (128 + s).clamp(0, 255) as u8,
            (None, None) => 1,
        }
    }
}

/// How long an ended agent's report waits for the worker's acknowledgement
/// before the container ends anyway (the Pod's status carries the end too).
const AGENT_END_REPORT_WAIT: Duration = Duration::from_secs(5);

/// Serves the worker until told to stop; in mode agent, until the agent
/// ends, which ends the supervisor (the container's main process) with it:
/// `Ok(Some(end))`.
pub async fn serve(cfg: Config, agent: Option<Vec<String>>) -> std::io::Result<Option<AgentEnd>> {
    let _ = std::fs::remove_file(&cfg.socket);
    let listener = UnixListener::bind(&cfg.socket)?;
    let outbox = Arc::new(Outbox::default());
    let running: Running = Arc::default();
    let cfg = Arc::new(cfg);
    let boot = format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
    );
    let result = match agent {
        None => accept_loop(&listener, &cfg, &outbox, &running, &boot).await.map(|()| None),
        Some(argv) => {
            let agent = tokio::spawn(run_agent(argv, cfg.clone(), outbox.clone()));
            // The worker keeps being served while the end is reported.
            let ended = async {
                let end = agent.await.unwrap_or(AgentEnd { exit_code: None, signal: None });
                outbox.acknowledged(AGENT_END_REPORT_WAIT).await;
                end
            };
            tokio::select! {
                served = accept_loop(&listener, &cfg, &outbox, &running, &boot) => served.map(|()| None),
                end = ended => Ok(Some(end)),
            }
        }
    };
    // However the supervisor ends (SIGTERM from the runtime, a failed
    // listener), the commands it started end with it: nothing it ran may
    // outlive it.
    kill_all_groups(&running);
    result
}

async fn accept_loop(
    listener: &UnixListener,
    cfg: &Arc<Config>,
    outbox: &Arc<Outbox>,
    running: &Running,
    boot: &str,
) -> std::io::Result<()> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    // Worker connections that came while another was served: the next one
    // is served when the current one ends.
    let mut waiting: VecDeque<tokio::net::UnixStream> = VecDeque::new();
    loop {
        let stream = match waiting.pop_front() {
            Some(stream) => stream,
            None => tokio::select! {
                accepted = accept_worker(listener) => accepted?,
                _ = term.recv() => return Ok(()),
                _ = int.recv() => return Ok(()),
            },
        };
        let (read, write) = stream.into_split();
        let writer = tokio::spawn(deliver(write, outbox.clone(), boot.to_owned()));
        let mut lines = BufReader::new(read).lines();
        loop {
            let line = tokio::select! {
                line = lines.next_line() => line,
                // Keep accepting while serving, so a process in the sandbox
                // is refused at once, whoever is connected.
                accepted = accept_worker(listener) => {
                    if waiting.len() == MAX_WAITING_WORKERS {
                        waiting.pop_front();
                    }
                    waiting.push_back(accepted?);
                    continue;
                }
                _ = term.recv() => return Ok(()),
                _ = int.recv() => return Ok(()),
            };
            let Ok(Some(line)) = line else { break };
            match serde_json::from_str::<ToSupervisor>(&line) {
                Ok(msg) => handle(msg, cfg, outbox, running),
                Err(e) => eprintln!("supervisor: bad message: {e}"),
            }
        }
        // The worker went away; commands keep running, output is kept
        // until a worker acknowledges it.
        writer.abort();
    }
}

/// Worker connections waiting their turn; a worker that restarted more
/// often than this has left only stale ones behind.
const MAX_WAITING_WORKERS: usize = 4;

/// The next connection from outside the sandbox. Code in the sandbox can
/// reach the socket's path; only the worker, outside the container, may
/// speak here: a refused peer learns nothing (no hello) and takes no turn.
/// Cancel-safe: nothing is awaited after a connection is accepted.
async fn accept_worker(listener: &UnixListener) -> std::io::Result<tokio::net::UnixStream> {
    loop {
        let (stream, _) = listener.accept().await?;
        match sandbox_peer(&stream) {
            None => return Ok(stream),
            Some(pid) => eprintln!("supervisor: refused a connection from pid {pid} inside the sandbox"),
        }
    }
}

/// The peer's pid when it runs inside this sandbox: in the supervisor's own
/// PID namespace when the supervisor is that namespace's PID 1 (a
/// container: the worker, in another namespace, shows as pid 0), or a
/// descendant of the supervisor (a command it started, or theirs) when it
/// runs without a namespace of its own.
fn sandbox_peer(stream: &tokio::net::UnixStream) -> Option<i32> {
    // Without credentials the peer cannot be told apart: refuse it.
    let Ok(cred) = stream.peer_cred() else { return Some(-1) };
    let pid = cred.pid().unwrap_or(0);
    if pid <= 0 {
        return None;
    }
    let me = std::process::id() as i32;
    (me == 1 || descends_from(pid, me)).then_some(pid)
}

/// Whether `pid`'s chain of parents (from /proc) reaches `ancestor`.
fn descends_from(mut pid: i32, ancestor: i32) -> bool {
    // A chain longer than pid_max cannot exist; the bound only guards
    // against a loop in what /proc showed while processes came and went.
    for _ in 0..4_194_304 {
        if pid == ancestor {
            return true;
        }
        if pid <= 1 {
            return false;
        }
        match parent_of(pid) {
            Some(parent) => pid = parent,
            // The process is gone, or /proc hides it: not ours to trust.
            None => return true,
        }
    }
    true
}

/// The parent pid from `/proc/<pid>/stat` (its fourth field, after the
/// command name in parentheses, which may itself hold spaces or ')').
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(1)?.parse().ok()
}

/// Writes the hello, then every unacknowledged message in order, then new
/// ones as they come.
async fn deliver(mut write: tokio::net::unix::OwnedWriteHalf, outbox: Arc<Outbox>, boot: String) {
    let mut known: Vec<u32> = outbox.state.lock().expect("outbox").known.iter().copied().collect();
    known.sort_unstable();
    if write_line(&mut write, &Hello { boot, known }).await.is_err() {
        return;
    }
    let mut cursor = 0;
    loop {
        let ready = outbox.ready.notified();
        match outbox.after(cursor) {
            Some(m) => {
                if write_line(&mut write, &m).await.is_err() {
                    return;
                }
                cursor = m.seq;
            }
            None => ready.await,
        }
    }
}

async fn write_line(write: &mut tokio::net::unix::OwnedWriteHalf, m: &impl serde::Serialize) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(m).expect("serialisable");
    line.push(b'\n');
    write.write_all(&line).await
}

fn handle(msg: ToSupervisor, cfg: &Arc<Config>, outbox: &Arc<Outbox>, running: &Running) {
    match msg {
        ToSupervisor::Run { id, argv, env, cwd, timeout_seconds } => {
            // At most once per id: a worker that restarted may ask again.
            if !outbox.state.lock().expect("outbox").known.insert(id) {
                return;
            }
            // Registered before the task starts, so a KillAll or Cancel that
            // arrives right behind the Run still reaches this command.
            running.lock().expect("running").insert(id, (0, None));
            tokio::spawn(run_command(
                id,
                argv,
                env,
                cwd,
                timeout_seconds,
                cfg.clone(),
                outbox.clone(),
                running.clone(),
            ));
        }
        ToSupervisor::Cancel { id } => end(running, Some(id), EndedBy::Cancel, cfg.grace),
        ToSupervisor::KillAll => end(running, None, EndedBy::KillAll, cfg.grace),
        ToSupervisor::Ack { upto } => outbox.ack(upto),
    }
}

/// SIGTERM to the command's process group (or every one), SIGKILL after
/// the grace if it is still there.
fn end(running: &Running, id: Option<u32>, why: EndedBy, grace: Duration) {
    let mut map = running.lock().expect("running");
    let mut groups = Vec::new();
    for (cid, (pgid, ended)) in map.iter_mut() {
        if id.is_none_or(|i| i == *cid) && ended.is_none() {
            *ended = Some(why);
            // Group 0: not spawned yet; it sees the flag and never starts.
            if *pgid != 0 {
                groups.push(*pgid);
            }
        }
    }
    drop(map);
    signal_groups(groups, grace);
}

/// SIGKILL to every process group this supervisor started.
fn kill_all_groups(running: &Running) {
    let groups: Vec<i32> =
        running.lock().expect("running").values().map(|(pgid, _)| *pgid).filter(|p| *p > 0).collect();
    for pgid in groups {
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
}

fn signal_groups(groups: Vec<i32>, grace: Duration) {
    for pgid in groups {
        let group = Pid::from_raw(pgid);
        let _ = killpg(group, Signal::SIGTERM);
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            let _ = killpg(group, Signal::SIGKILL);
        });
    }
}

fn command(argv: &[String], env: &[(String, String)], cwd: &std::path::Path) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(&argv[0]);
    cmd.args(&argv[1..]).envs(env.iter().cloned()).current_dir(cwd);
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    // Its own process group, so a timeout or cancel ends its children too.
    cmd.as_std_mut().process_group(0);
    die_with_supervisor(cmd.as_std_mut());
    cmd
}

/// The command dies with the supervisor even when the supervisor is killed
/// outright (a process group is not reached by the parent's death). The
/// supervisor's runtime is single-threaded, so the forking thread (whose
/// exit is what PDEATHSIG watches) lives as long as the process.
#[allow(unsafe_code, reason = "pre_exec is unsafe; the hook only calls prctl between fork and exec")]
fn die_with_supervisor(cmd: &mut std::process::Command) {
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from));
    }
}

#[allow(clippy::too_many_arguments)]
async fn run_command(
    id: u32,
    argv: Vec<String>,
    env: Vec<(String, String)>,
    cwd: Option<String>,
    timeout_seconds: u64,
    cfg: Arc<Config>,
    outbox: Arc<Outbox>,
    running: Running,
) {
    let dir = cwd.map(PathBuf::from).unwrap_or_else(|| cfg.default_cwd.clone());
    let ended_before_start = running.lock().expect("running").get(&id).and_then(|(_, e)| *e);
    if let Some(ended_by) = ended_before_start {
        running.lock().expect("running").remove(&id);
        outbox.send(FromSupervisor::Exited { id, exit_code: None, signal: None, ended_by });
        return;
    }
    if argv.is_empty() {
        running.lock().expect("running").remove(&id);
        outbox.send(FromSupervisor::Failed { id, message: "empty argv".into() });
        return;
    }
    let mut child = match command(&argv, &env, &dir).spawn() {
        Ok(c) => c,
        Err(e) => {
            running.lock().expect("running").remove(&id);
            outbox.send(FromSupervisor::Failed { id, message: format!("{}: {e}", argv[0]) });
            return;
        }
    };
    let pid = child.id().unwrap_or(0);
    let ended_meanwhile = {
        let mut map = running.lock().expect("running");
        let entry = map.entry(id).or_insert((0, None));
        entry.0 = pid as i32;
        entry.1.is_some()
    };
    if ended_meanwhile {
        signal_groups(vec![pid as i32], cfg.grace);
    }
    outbox.send(FromSupervisor::Started { id, pid });
    let offset = Arc::new(Mutex::new(0u64));
    let out = tokio::spawn(pump(
        id,
        OutputStream::Stdout,
        child.stdout.take().expect("piped"),
        outbox.clone(),
        offset.clone(),
    ));
    let err = tokio::spawn(pump(id, OutputStream::Stderr, child.stderr.take().expect("piped"), outbox.clone(), offset));
    let timeout = Duration::from_secs(timeout_seconds.max(1));
    let status = tokio::select! {
        s = child.wait() => s,
        _ = tokio::time::sleep(timeout) => {
            end(&running, Some(id), EndedBy::Timeout, cfg.grace);
            child.wait().await
        }
    };
    // All output is queued before the exit is reported.
    let _ = out.await;
    let _ = err.await;
    let ended_by = running.lock().expect("running").remove(&id).and_then(|(_, e)| e).unwrap_or(EndedBy::Itself);
    let (exit_code, signal) = match status {
        Ok(s) => (s.code(), s.signal()),
        Err(_) => (None, None),
    };
    outbox.send(FromSupervisor::Exited { id, exit_code, signal, ended_by });
}

/// Reads one pipe. Both pipes of a command share `offset`; a chunk takes
/// its offset and enters the outbox under that one lock, so the outbox
/// holds each command's chunks in offset order.
async fn pump(
    id: u32,
    stream: OutputStream,
    mut pipe: impl AsyncRead + Unpin,
    outbox: Arc<Outbox>,
    offset: Arc<Mutex<u64>>,
) {
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        outbox.room().await;
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let data_b64 = base64::engine::general_purpose::STANDARD.encode(&buf[..n]);
                let mut at = offset.lock().expect("offset");
                outbox.send(FromSupervisor::Output { id, stream, offset: *at, data_b64 });
                *at += n as u64;
            }
        }
    }
}

/// Mode agent: the agent's command is the main process; its exit is the
/// end of the session.
async fn run_agent(argv: Vec<String>, cfg: Arc<Config>, outbox: Arc<Outbox>) -> AgentEnd {
    let status =
        match command(&argv, &[], &cfg.default_cwd).stdout(Stdio::inherit()).stderr(Stdio::inherit()).status().await {
            Ok(s) => s,
            Err(e) => {
                // The runtime's convention for a command that cannot run;
                // the why goes where the kubelet reads a container's
                // termination message, so the session's end can say it.
                let why = format!("cannot start the agent {}: {e}", argv[0]);
                eprintln!("supervisor: {why}");
                let path = std::env::var_os("HANGAR_TERMINATION_MESSAGE_PATH").unwrap_or("/dev/termination-log".into());
                let _ = std::fs::write(path, &why);
                let end = AgentEnd { exit_code: Some(127), signal: None };
                outbox.send(FromSupervisor::AgentExited { exit_code: end.exit_code, signal: None });
                return end;
            }
        };
    let end = AgentEnd { exit_code: status.code(), signal: status.signal() };
    outbox.send(FromSupervisor::AgentExited { exit_code: end.exit_code, signal: end.signal });
    end
}

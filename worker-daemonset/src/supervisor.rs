//! The in-sandbox supervisor: PID 1 of the agent container. It runs the
//! commands the worker hands it (argv, env, working directory), captures
//! stdout and stderr as marked chunks, enforces timeouts (SIGTERM, then
//! SIGKILL after a grace), cancels on request and reports exit codes. It
//! holds no credentials and talks only to the worker, over a Unix socket.
//! Messages produced while no worker is connected (a worker restart) are
//! kept and delivered when one connects again.

use std::collections::{HashMap, VecDeque};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;
use tokio::sync::Notify;

use crate::protocol::{EndedBy, FromSupervisor, OutputStream, ToSupervisor};

pub struct Config {
    pub socket: PathBuf,
    /// Working directory when a command names none (`/workspace`).
    pub default_cwd: PathBuf,
    /// Between SIGTERM and SIGKILL.
    pub grace: Duration,
}

/// Outbound messages, kept until a worker has read them.
#[derive(Default)]
struct Outbox {
    queue: Mutex<VecDeque<FromSupervisor>>,
    ready: Notify,
}

impl Outbox {
    fn send(&self, m: FromSupervisor) {
        self.queue.lock().expect("outbox").push_back(m);
        self.ready.notify_one();
    }
}

/// Running commands: id → (process group, why it is being ended).
type Running = Arc<Mutex<HashMap<u32, (i32, Option<EndedBy>)>>>;

pub async fn serve(cfg: Config, agent: Option<Vec<String>>) -> std::io::Result<()> {
    let _ = std::fs::remove_file(&cfg.socket);
    let listener = UnixListener::bind(&cfg.socket)?;
    let outbox = Arc::new(Outbox::default());
    let running: Running = Arc::default();
    let cfg = Arc::new(cfg);
    if let Some(argv) = agent {
        tokio::spawn(run_agent(argv, cfg.clone(), outbox.clone()));
    }
    loop {
        let (stream, _) = listener.accept().await?;
        let (read, write) = stream.into_split();
        let writer = tokio::spawn(deliver(write, outbox.clone()));
        let mut lines = BufReader::new(read).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            match serde_json::from_str::<ToSupervisor>(&line) {
                Ok(msg) => handle(msg, &cfg, &outbox, &running),
                Err(e) => eprintln!("supervisor: bad message: {e}"),
            }
        }
        // The worker went away; commands keep running, output is kept.
        writer.abort();
    }
}

/// Writes queued messages to the connected worker, in order; a message is
/// dropped from the queue only once written.
async fn deliver(mut write: tokio::net::unix::OwnedWriteHalf, outbox: Arc<Outbox>) {
    loop {
        let next = outbox.queue.lock().expect("outbox").front().cloned();
        match next {
            Some(m) => {
                let mut line = serde_json::to_vec(&m).expect("serialisable");
                line.push(b'\n');
                if write.write_all(&line).await.is_err() {
                    return;
                }
                outbox.queue.lock().expect("outbox").pop_front();
            }
            None => outbox.ready.notified().await,
        }
    }
}

fn handle(msg: ToSupervisor, cfg: &Arc<Config>, outbox: &Arc<Outbox>, running: &Running) {
    match msg {
        ToSupervisor::Run { id, argv, env, cwd, timeout_seconds } => {
            tokio::spawn(run_command(id, argv, env, cwd, timeout_seconds, cfg.clone(), outbox.clone(), running.clone()));
        }
        ToSupervisor::Cancel { id } => end(running, Some(id), EndedBy::Cancel, cfg.grace),
        ToSupervisor::KillAll => end(running, None, EndedBy::KillAll, cfg.grace),
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
            groups.push(*pgid);
        }
    }
    for pgid in groups {
        // SAFETY: signalling a process group we created.
        unsafe { libc::kill(-pgid, libc::SIGTERM) };
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
        });
    }
}

fn command(argv: &[String], env: &[(String, String)], cwd: &std::path::Path) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(&argv[0]);
    cmd.args(&argv[1..]).envs(env.iter().cloned()).current_dir(cwd);
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    // Its own process group, so a timeout or cancel ends its children too.
    cmd.as_std_mut().process_group(0);
    cmd
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
    if argv.is_empty() {
        outbox.send(FromSupervisor::Failed { id, message: "empty argv".into() });
        return;
    }
    let mut child = match command(&argv, &env, &dir).spawn() {
        Ok(c) => c,
        Err(e) => {
            outbox.send(FromSupervisor::Failed { id, message: format!("{}: {e}", argv[0]) });
            return;
        }
    };
    let pid = child.id().unwrap_or(0);
    running.lock().expect("running").insert(id, (pid as i32, None));
    outbox.send(FromSupervisor::Started { id, pid });
    let out = tokio::spawn(pump(id, OutputStream::Stdout, child.stdout.take().expect("piped"), outbox.clone()));
    let err = tokio::spawn(pump(id, OutputStream::Stderr, child.stderr.take().expect("piped"), outbox.clone()));
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

async fn pump(id: u32, stream: OutputStream, mut pipe: impl AsyncRead + Unpin, outbox: Arc<Outbox>) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => outbox.send(FromSupervisor::Output {
                id,
                stream,
                data_b64: base64::engine::general_purpose::STANDARD.encode(&buf[..n]),
            }),
        }
    }
}

/// Mode agent: the agent's command is the main process; its exit is the
/// end of the session.
async fn run_agent(argv: Vec<String>, cfg: Arc<Config>, outbox: Arc<Outbox>) {
    let status = match command(&argv, &[], &cfg.default_cwd).stdout(Stdio::inherit()).stderr(Stdio::inherit()).status().await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("supervisor: cannot start the agent {}: {e}", argv[0]);
            outbox.send(FromSupervisor::AgentExited { exit_code: Some(127), signal: None });
            return;
        }
    };
    outbox.send(FromSupervisor::AgentExited { exit_code: status.code(), signal: status.signal() });
}

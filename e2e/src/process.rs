//! Child processes that never outlive the test (or `make up`) that started
//! them: each is killed on drop, and the kernel kills it (PR_SET_PDEATHSIG)
//! if this process dies first, even by SIGKILL.
//!
//! PDEATHSIG fires when the *thread* that forked the child exits, so every
//! child is forked by one spawner thread that lives as long as the process.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::error::{HarnessError, Result, io};

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

fn spawner() -> &'static Mutex<mpsc::Sender<SpawnRequest>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("hangar-e2e-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
                // The channel is held in a static and never closes, so this
                // thread (and with it PDEATHSIG) lasts until the process ends.
                loop {
                    std::thread::park();
                }
            })
            .expect("spawn the spawner thread");
        Mutex::new(tx)
    })
}

/// A running child process with its output in `log`.
pub struct ChildProcess {
    pub name: String,
    pub log: PathBuf,
    child: Child,
    /// How it was started (program, arguments, environment changes,
    /// directory), so it can be started again the same way.
    recipe: Recipe,
}

struct Recipe {
    program: std::ffi::OsString,
    args: Vec<std::ffi::OsString>,
    env: Vec<(std::ffi::OsString, Option<std::ffi::OsString>)>,
    dir: Option<PathBuf>,
}

impl Recipe {
    fn of(cmd: &Command) -> Self {
        Self {
            program: cmd.get_program().to_owned(),
            args: cmd.get_args().map(ToOwned::to_owned).collect(),
            env: cmd.get_envs().map(|(k, v)| (k.to_owned(), v.map(ToOwned::to_owned))).collect(),
            dir: cmd.get_current_dir().map(Path::to_path_buf),
        }
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args);
        for (k, v) in &self.env {
            match v {
                Some(v) => cmd.env(k, v),
                None => cmd.env_remove(k),
            };
        }
        if let Some(d) = &self.dir {
            cmd.current_dir(d);
        }
        cmd
    }
}

impl ChildProcess {
    /// Starts `cmd` with stdout and stderr appended to `log`.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> Result<Self> {
        let recipe = Recipe::of(&cmd);
        let out = File::options().create(true).append(true).open(log).map_err(io(format!("open {}", log.display())))?;
        let err = out.try_clone().map_err(io("dup log"))?;
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        // Its own process group, so Ctrl-C in `make up` reaches us first and
        // we stop children in order.
        cmd.process_group(0);
        die_with_parent(&mut cmd);
        let (tx, rx) = mpsc::channel();
        spawner().lock().expect("spawner lock").send((cmd, tx)).expect("spawner thread alive");
        let child = rx.recv().expect("spawner reply").map_err(io(format!("start {name}")))?;
        Ok(Self { name: name.to_owned(), log: log.to_path_buf(), child, recipe })
    }

    /// SIGKILL, then the same command again (same ports, same log): a
    /// crash and a restart, as a kubelet would do it.
    pub fn respawn(&mut self) -> Result<()> {
        self.kill();
        *self = Self::spawn(&self.name.clone(), self.recipe.command(), &self.log.clone())?;
        Ok(())
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// `Err(Exited)` when the process has already ended.
    pub fn check_alive(&mut self) -> Result<()> {
        match self.child.try_wait() {
            Ok(Some(status)) => {
                Err(HarnessError::Exited { name: self.name.clone(), status, log_tail: tail(&self.log, 40) })
            }
            _ => Ok(()),
        }
    }

    /// How it ended, once it has.
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }

    /// SIGKILL now, like pulling the power.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then SIGKILL after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        if let Ok(None) = self.child.try_wait() {
            let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
            let deadline = Instant::now() + grace;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(3));
    }
}

/// The child gets SIGKILL when the thread that forked it (the spawner,
/// which lives as long as this process) ends, however this process dies.
#[allow(unsafe_code, reason = "a pre_exec hook is unsafe by signature; it only calls prctl")]
fn die_with_parent(cmd: &mut Command) {
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from));
    }
}

/// The last `lines` lines of a log file.
pub fn tail(path: &Path, lines: usize) -> String {
    let Ok(mut f) = File::open(path) else { return String::new() };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(16 * 1024)));
    let mut buf = String::new();
    let _ = f.read_to_string(&mut buf);
    let all: Vec<&str> = buf.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A port that was free on 127.0.0.1 a moment ago, for a server the
/// harness starts next, which may bind it seconds later (after its own
/// dependencies answer). It is taken below the kernel's ephemeral range:
/// a port from that range (what binding port 0 gives) can meanwhile become
/// the source port of any outgoing connection on the machine, and the
/// server then fails with "address in use". Each call in a process gets
/// another port; the start is spread by process id, so concurrent harness
/// processes rarely try the same ones.
pub fn free_port() -> u16 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    const FLOOR: u32 = 10_000;
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    if ephemeral_low > FLOOR + 1_000 {
        let span = ephemeral_low - FLOOR;
        let start = std::process::id().wrapping_mul(2_654_435_761) % span;
        for _ in 0..span {
            let i = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let port = FLOOR + (start + i) % span;
            if TcpListener::bind(("127.0.0.1", port as u16)).is_ok() {
                return port as u16;
            }
        }
    }
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("bind 127.0.0.1:0")
}

/// Polls `ready` every 50 ms until it returns true, the child exits, or
/// `timeout` passes.
pub fn wait_until(
    what: &str,
    child: &mut ChildProcess,
    timeout: Duration,
    mut ready: impl FnMut() -> bool,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        child.check_alive()?;
        if ready() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(HarnessError::NotReady {
                what: what.to_owned(),
                seconds: timeout.as_secs(),
                log_tail: child.log_tail(40),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn port_open(port: u16) -> bool {
    TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200)).is_ok()
}

/// A minimal HTTP/1.0 request on loopback: `(status, body)`.
pub fn http_request(port: u16, method: &str, path: &str, headers: &[(&str, &str)]) -> std::io::Result<(u16, String)> {
    use std::io::Write;
    let mut s = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut req = format!("{method} {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes())?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    let status = resp.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = resp.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    Ok((status, body))
}

pub fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    http_request(port, "GET", path, &[])
}

/// A scratch directory for one control plane, removed on drop.
pub struct RunDir {
    pub path: PathBuf,
    keep: bool,
}

impl RunDir {
    pub fn new(prefix: &str) -> Result<Self> {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let base = std::env::temp_dir();
        sweep_dead(&base, prefix);
        let path = base.join(format!("{prefix}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).map_err(io(format!("create {}", path.display())))?;
        Ok(Self { path, keep: false })
    }

    /// A fixed directory (for `make up`, so KUBECONFIG has a stable path).
    pub fn fixed(path: PathBuf) -> Result<Self> {
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).map_err(io(format!("create {}", path.display())))?;
        Ok(Self { path, keep: true })
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if !self.keep && std::env::var_os("HANGAR_KEEP_RUN_DIRS").is_none() {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Removes `<prefix>-<pid>-<n>` directories left by processes that are gone
/// (a test binary's shared control plane is never dropped, only killed).
fn sweep_dead(base: &Path, prefix: &str) {
    let Ok(entries) = std::fs::read_dir(base) else { return };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(&format!("{prefix}-")) else { continue };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<i32>().ok()) else { continue };
        if kill(Pid::from_raw(pid), None).is_err() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Pids of live (not zombie) processes whose command line holds `token`:
/// for tests that check nothing they started is left on the machine.
pub fn processes_with(token: &str) -> Vec<i32> {
    let mut found = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else { return found };
    for entry in procs.flatten() {
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

/// Runs `cmd` to its end: its stdout, or `Command` with its stderr when it
/// fails.
pub fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().map_err(io(format!("run {cmd:?}")))?;
    if !out.status.success() {
        return Err(HarnessError::Command {
            command: format!("{cmd:?}"),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

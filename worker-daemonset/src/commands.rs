//! The command runner: watches the Commands of this node's session, hands
//! them to the supervisor in number order (at most 16 running), writes their
//! output to the store and reports each status.
//!
//! Every status change is a compare-and-swap on the Command (merge patch
//! with its resourceVersion), and the CRD refuses any change of a final
//! status, so the worker, the operator (cancel of queued commands, the end
//! of a session) and a restarted worker can never overwrite one another.
//!
//! Crash safety: a command is marked `running` before it is handed over,
//! and the hand-over is journalled on the node with the supervisor's boot
//! id. After a restart the supervisor's hello says which commands it has:
//! one it has keeps running (its output and exit come again, unacknowledged);
//! one journalled for an earlier boot ran in a container that is gone and
//! ends `outcome_unknown`; one never journalled was never handed over and is
//! handed over now.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::Duration;

use base64::Engine;
use futures::StreamExt;
use hangar_crds::command::MAX_RUNNING;
use hangar_crds::{Command, CommandPhase, Phase};
use hangar_output::{AttemptKey, OutputStore, OutputWriter, Stream};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use hangar_runtime::kube_ext::{Swap, swap_status};
use kube::api::Api;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};

use crate::attempt_key;
use crate::protocol::{EndedBy, FromSupervisor, Hello, OutputStream, Sequenced, ToSupervisor};
use crate::supervisor_link::{Incoming, LinkError, SupervisorLink};

/// Output of one command is written in chunks of up to this many bytes
/// (consecutive messages are joined): fewer, larger objects and fsyncs.
const CHUNK_BYTES: usize = 4 << 20;

#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("output: {0}")]
    Output(#[from] hangar_output::WriteError),
    #[error("output store: {0}")]
    Store(#[from] object_store::Error),
    #[error("attempt key: {0}")]
    Key(#[from] attempt_key::KeyError),
    #[error("supervisor: {0}")]
    Link(#[from] LinkError),
    #[error("journal {path}: {source}")]
    Journal {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("could not record the final status of command {0}")]
    Unsettled(String),
    #[error("output message is not base64: {0}")]
    Base64(#[from] base64::DecodeError),
}

/// What the runner needs to know of the session, from the Sandbox watch.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SessionState {
    pub phase: Option<Phase>,
    pub attempt: i64,
}

pub struct RunnerConfig {
    pub namespace: String,
    pub sandbox: String,
    pub session_id: String,
    pub system_namespace: String,
    /// Node-local disk: output spool, attempt keys, hand-over journal.
    pub spool_root: PathBuf,
    pub store: OutputStore,
    pub socket: PathBuf,
}

pub struct Runner {
    cfg: RunnerConfig,
    api: Api<Command>,
    secrets: Api<Secret>,
    link: SupervisorLink,
    /// Commands of the session by name, as last seen (watch or own writes).
    commands: BTreeMap<String, Command>,
    state: SessionState,
    /// Attempt the key and writers below belong to.
    attempt: i64,
    key: Option<[u8; 32]>,
    writers: HashMap<u32, OutputWriter>,
    hello: Option<Hello>,
    /// After a reset, messages of the old connection are dropped until the
    /// next hello.
    awaiting_hello: bool,
    recovered: bool,
    /// The first full list of Commands has arrived.
    listed: bool,
    killall_sent: Option<String>,
    cancel_sent: Vec<u32>,
    acked: u64,
    drained: watch::Sender<Option<i64>>,
}

impl Runner {
    pub fn new(client: Client, cfg: RunnerConfig, drained: watch::Sender<Option<i64>>) -> (Self, mpsc::Receiver<Incoming>) {
        let (link, incoming) = SupervisorLink::start(cfg.socket.clone());
        let runner = Self {
            api: Api::namespaced(client.clone(), &cfg.namespace),
            secrets: Api::namespaced(client, &cfg.system_namespace),
            cfg,
            link,
            commands: BTreeMap::new(),
            state: SessionState::default(),
            attempt: 0,
            key: None,
            writers: HashMap::new(),
            hello: None,
            awaiting_hello: true,
            recovered: false,
            listed: false,
            killall_sent: None,
            cancel_sent: Vec::new(),
            acked: 0,
            drained,
        };
        (runner, incoming)
    }

    pub async fn run(mut self, mut incoming: mpsc::Receiver<Incoming>, mut state: watch::Receiver<SessionState>) {
        let wc = watcher::Config::default().fields(&format!("spec.sandbox={}", self.cfg.sandbox));
        let mut events = watcher(self.api.clone(), wc).boxed();
        let mut listing: Option<BTreeMap<String, Command>> = None;
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        self.flush_spool().await;
        loop {
            tokio::select! {
                ev = events.next() => match ev {
                    Some(Ok(watcher::Event::Init)) => listing = Some(BTreeMap::new()),
                    Some(Ok(watcher::Event::InitApply(c))) => {
                        if let Some(l) = listing.as_mut() { l.insert(c.name_any(), c); }
                    }
                    Some(Ok(watcher::Event::InitDone)) => {
                        if let Some(l) = listing.take() { self.commands = l; self.listed = true; }
                    }
                    Some(Ok(watcher::Event::Apply(c))) => self.observe(c),
                    Some(Ok(watcher::Event::Delete(c))) => { self.commands.remove(&c.name_any()); }
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "command watch");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    None => return,
                },
                changed = state.changed() => {
                    if changed.is_err() { return; }
                    self.state = state.borrow_and_update().clone();
                }
                // Messages wait (in the channel, then in the supervisor's
                // outbox) until we know the commands and hold the key.
                m = incoming.recv(), if self.listed && self.key.is_some() => match m {
                    Some(m) => self.receive(m, &mut incoming).await,
                    None => return,
                },
                _ = tick.tick() => {}
            }
            if let Err(e) = self.schedule().await {
                tracing::warn!(error = %e, "command runner");
            }
        }
    }

    /// Keeps the newer of the watched object and our own last write.
    fn observe(&mut self, c: Command) {
        let newer = |a: &Command, b: &Command| {
            let rv = |c: &Command| c.resource_version().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            rv(a) >= rv(b)
        };
        match self.commands.get(&c.name_any()) {
            Some(old) if !newer(&c, old) => {}
            _ => {
                self.commands.insert(c.name_any(), c);
            }
        }
    }

    fn by_number(&self, n: u32) -> Option<&Command> {
        self.commands.values().find(|c| number(c) == Some(n))
    }

    /// Runs in this attempt and has not ended.
    fn live_here(&self, c: &Command) -> bool {
        matches!(phase(c), Some(CommandPhase::Running | CommandPhase::Cancelling))
            && c.status.as_ref().and_then(|s| s.attempt) == Some(self.attempt)
    }

    // ---- supervisor messages -------------------------------------------

    async fn receive(&mut self, first: Incoming, incoming: &mut mpsc::Receiver<Incoming>) {
        let mut batch = Vec::new();
        let mut hello = None;
        match first {
            Incoming::Hello(h) => hello = Some(h),
            Incoming::Message(m) => {
                batch.push(m);
                // Take what is already waiting, to write larger chunks.
                while batch.len() < 1024 {
                    match incoming.try_recv() {
                        Ok(Incoming::Message(m)) => batch.push(m),
                        Ok(Incoming::Hello(h)) => {
                            hello = Some(h);
                            break;
                        }
                        Err(_) => break,
                    }
                }
            }
        }
        if !batch.is_empty() && !self.awaiting_hello {
            match self.process(batch).await {
                Ok(Some(seq)) => {
                    if seq > self.acked && self.link.send(&ToSupervisor::Ack { upto: seq }).await.is_ok() {
                        self.acked = seq;
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    // Not acknowledged: the supervisor delivers it again on
                    // the next connection.
                    tracing::warn!(error = %e, "processing supervisor messages; reconnecting to get them again");
                    self.link.reset().await;
                    self.awaiting_hello = true;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        if let Some(h) = hello {
            tracing::info!(boot = %h.boot, known = h.known.len(), "supervisor connected");
            self.hello = Some(h);
            self.awaiting_hello = false;
            self.recovered = false;
            self.killall_sent = None;
            self.cancel_sent.clear();
            self.acked = 0;
        }
    }

    /// Processes messages in order; returns the last sequence number done.
    async fn process(&mut self, batch: Vec<Sequenced>) -> Result<Option<u64>, RunnerError> {
        let mut done = None;
        let mut i = 0;
        while i < batch.len() {
            let Sequenced { seq, msg } = &batch[i];
            match msg {
                FromSupervisor::Output { id, stream, offset, data_b64 } => {
                    // Join the contiguous chunks of this command and stream.
                    let b64 = base64::engine::general_purpose::STANDARD;
                    let mut bytes = b64.decode(data_b64)?;
                    let mut last = *seq;
                    while let Some(Sequenced { seq, msg: FromSupervisor::Output { id: i2, stream: s2, offset: o2, data_b64 } }) =
                        batch.get(i + 1)
                    {
                        if i2 != id || s2 != stream || *o2 != offset + bytes.len() as u64 || bytes.len() >= CHUNK_BYTES {
                            break;
                        }
                        // Decoded straight onto the chunk: no second copy,
                        // and no doubling of its capacity.
                        bytes.reserve_exact(data_b64.len() / 4 * 3);
                        b64.decode_vec(data_b64, &mut bytes)?;
                        last = *seq;
                        i += 1;
                    }
                    self.write_output(*id, *stream, *offset, bytes).await?;
                    done = Some(last);
                }
                FromSupervisor::Started { .. } => done = Some(*seq),
                FromSupervisor::Failed { id, message } => {
                    self.finish(*id, CommandPhase::Exited, Some(127), Some(format!("cannot start: {message}"))).await?;
                    done = Some(*seq);
                }
                FromSupervisor::Exited { id, exit_code, signal, ended_by } => {
                    let (phase, code, reason) = final_status(*ended_by, *exit_code, *signal);
                    self.finish(*id, phase, code, reason).await?;
                    done = Some(*seq);
                }
                FromSupervisor::AgentExited { exit_code, signal } => {
                    tracing::info!(?exit_code, ?signal, "the agent's command ended");
                    done = Some(*seq);
                }
            }
            i += 1;
        }
        Ok(done)
    }

    async fn writer(&mut self, id: u32) -> Result<&mut OutputWriter, RunnerError> {
        if !self.writers.contains_key(&id) {
            let key = self.key.ok_or(LinkError::NotConnected).map_err(RunnerError::Link)?;
            let w = OutputWriter::open(
                self.cfg.store.clone(),
                self.cfg.spool_root.join("output"),
                &self.cfg.session_id,
                id,
                self.attempt as u32,
                AttemptKey::from_bytes(&key).expect("32-byte key"),
            )
            .await?;
            self.writers.insert(id, w);
        }
        Ok(self.writers.get_mut(&id).expect("inserted"))
    }

    async fn write_output(&mut self, id: u32, stream: OutputStream, offset: u64, bytes: Vec<u8>) -> Result<(), RunnerError> {
        let stream = match stream {
            OutputStream::Stdout => Stream::Stdout,
            OutputStream::Stderr => Stream::Stderr,
        };
        self.writer(id).await?.write_at(stream, offset, bytes).await?;
        Ok(())
    }

    /// Records a final status (once: a command already final stays as it is).
    async fn finish(&mut self, id: u32, to: CommandPhase, exit_code: Option<i32>, reason: Option<String>) -> Result<(), RunnerError> {
        let output_bytes = match self.writers.remove(&id) {
            Some(w) => w.offset(),
            None => self.cfg.store.stored_end(&self.cfg.session_id, id).await?,
        };
        let Some(cmd) = self.by_number(id).cloned() else { return Ok(()) };
        let mut status = json!({
            "phase": to.as_str(),
            "finishedAt": Time(Timestamp::now()),
            "outputBytes": output_bytes,
        });
        if let Some(code) = exit_code {
            status["exitCode"] = json!(code);
        }
        if let Some(r) = reason {
            status["reason"] = json!(r);
        }
        self.transition_final(cmd, status).await
    }

    /// A compare-and-swap to a final status, re-read on a conflict. If it
    /// still cannot be written, the error leaves the supervisor's message
    /// unacknowledged, so it comes again.
    async fn transition_final(&mut self, mut cmd: Command, status: Value) -> Result<(), RunnerError> {
        for _ in 0..3 {
            if phase(&cmd).is_some_and(CommandPhase::is_final) {
                return Ok(());
            }
            if self.cas(&cmd, status.clone()).await? {
                return Ok(());
            }
            cmd = self.api.get(&cmd.name_any()).await?;
            self.observe(cmd.clone());
        }
        if phase(&cmd).is_some_and(CommandPhase::is_final) {
            return Ok(());
        }
        Err(RunnerError::Unsettled(cmd.name_any()))
    }

    /// Merge-patches the status if the object is still at `cmd`'s version.
    /// False when someone else changed it first (or the change would leave
    /// a final status, which the CRD refuses).
    async fn cas(&mut self, cmd: &Command, status: Value) -> Result<bool, RunnerError> {
        match swap_status(&self.api, cmd, status).await? {
            Swap::Swapped(updated) => {
                self.observe(updated);
                Ok(true)
            }
            Swap::LostRace => Ok(false),
            Swap::Refused(e) => {
                // Reading again shows why (e.g. already final); anything
                // else stays unsettled and is reported by the caller.
                tracing::info!(command = %cmd.name_any(), reason = %e.message, "status change refused");
                Ok(false)
            }
        }
    }

    // ---- scheduling ----------------------------------------------------

    async fn schedule(&mut self) -> Result<(), RunnerError> {
        let state = self.state.clone();
        if state.attempt <= 0 || !matches!(state.phase, Some(Phase::Running | Phase::Pausing)) {
            return Ok(());
        }
        if state.attempt != self.attempt {
            self.attempt = state.attempt;
            self.key = None;
            self.writers.clear();
            self.recovered = false;
        }
        if self.key.is_none() {
            let key = attempt_key::load_or_create(&self.cfg.spool_root, &self.secrets, &self.cfg.session_id, self.attempt).await?;
            attempt_key::forget_earlier(&self.cfg.spool_root, &self.cfg.session_id, self.attempt);
            self.key = Some(key);
        }
        let Some(boot) = self.hello.as_ref().map(|h| h.boot.clone()) else { return Ok(()) };
        if self.awaiting_hello {
            return Ok(());
        }
        if !self.recovered {
            self.recover().await?;
            self.recovered = true;
        }
        match state.phase {
            Some(Phase::Running) => {
                self.cancel_running().await?;
                self.start_queued(&boot).await?;
            }
            Some(Phase::Pausing) => {
                if self.killall_sent.as_deref() != Some(boot.as_str()) {
                    self.link.send(&ToSupervisor::KillAll).await?;
                    self.killall_sent = Some(boot);
                }
                if !self.commands.values().any(|c| self.live_here(c)) {
                    self.drained.send_replace(Some(self.attempt));
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// After a (re)connection: settle every command marked running.
    async fn recover(&mut self) -> Result<(), RunnerError> {
        let hello = self.hello.clone().expect("connected");
        let live: Vec<Command> = self
            .commands
            .values()
            .filter(|c| matches!(phase(c), Some(CommandPhase::Running | CommandPhase::Cancelling)))
            .cloned()
            .collect();
        for c in live {
            let Some(n) = number(&c) else { continue };
            let attempt = c.status.as_ref().and_then(|s| s.attempt);
            if attempt != Some(self.attempt) {
                let reason = format!("running when attempt {} ended", attempt.unwrap_or(0));
                self.transition_final(c, unknown(&reason)).await?;
                continue;
            }
            if hello.known.contains(&n) {
                continue;
            }
            match self.journal_read(n) {
                Some(b) if b != hello.boot => {
                    self.transition_final(c, unknown("the container it ran in restarted")).await?;
                }
                _ if self.state.phase == Some(Phase::Pausing) => {
                    let status = json!({"phase": "killed_at_pause", "finishedAt": Time(Timestamp::now()), "outputBytes": 0});
                    self.transition_final(c, status).await?;
                }
                // Marked running but never handed over: hand it over now.
                _ => self.hand_over(&c, n, &hello.boot).await?,
            }
        }
        Ok(())
    }

    async fn cancel_running(&mut self) -> Result<(), RunnerError> {
        let wanted: Vec<Command> =
            self.commands.values().filter(|c| c.spec.cancel && self.live_here(c)).cloned().collect();
        for c in wanted {
            let Some(n) = number(&c) else { continue };
            if phase(&c) == Some(CommandPhase::Running) && !self.cas(&c, json!({"phase": "cancelling"})).await? {
                continue; // changed meanwhile; the next event brings it
            }
            if !self.cancel_sent.contains(&n) {
                self.link.send(&ToSupervisor::Cancel { id: n }).await?;
                self.cancel_sent.push(n);
            }
        }
        Ok(())
    }

    async fn start_queued(&mut self, boot: &str) -> Result<(), RunnerError> {
        let running = self.commands.values().filter(|c| self.live_here(c)).count();
        let mut queued: Vec<Command> = self
            .commands
            .values()
            .filter(|c| phase(c) == Some(CommandPhase::Queued) && !c.spec.cancel && number(c).is_some())
            .cloned()
            .collect();
        queued.sort_by_key(number);
        for c in queued.into_iter().take(MAX_RUNNING.saturating_sub(running)) {
            let n = number(&c).expect("filtered");
            let status = json!({"phase": "running", "attempt": self.attempt, "startedAt": Time(Timestamp::now())});
            if self.cas(&c, status).await? {
                self.hand_over(&c, n, boot).await?;
            }
        }
        Ok(())
    }

    async fn hand_over(&mut self, c: &Command, n: u32, boot: &str) -> Result<(), RunnerError> {
        self.journal_write(n, boot)?;
        let run = ToSupervisor::Run {
            id: n,
            argv: c.spec.argv.clone(),
            env: c.spec.env.iter().map(|e| (e.name.clone(), e.value.clone())).collect(),
            cwd: c.spec.working_dir.clone(),
            timeout_seconds: c.spec.timeout_seconds.max(1) as u64,
        };
        if let Err(e) = self.link.send(&run).await {
            // Not delivered (a partial line is no message): forget the
            // journal entry, so the next connection hands it over again
            // instead of taking it for a command lost with its container.
            let _ = std::fs::remove_file(self.journal_path(n));
            return Err(e.into());
        }
        Ok(())
    }

    // ---- node-local state ----------------------------------------------

    fn journal_path(&self, n: u32) -> PathBuf {
        self.cfg.spool_root.join("journal").join(&self.cfg.session_id).join(n.to_string())
    }

    fn journal_read(&self, n: u32) -> Option<String> {
        std::fs::read_to_string(self.journal_path(n)).ok()
    }

    fn journal_write(&self, n: u32, boot: &str) -> Result<(), RunnerError> {
        let path = self.journal_path(n);
        let err = |source| RunnerError::Journal { path: path.clone(), source };
        std::fs::create_dir_all(path.parent().expect("has a parent")).map_err(err)?;
        std::fs::write(&path, boot).map_err(err)
    }

    /// Sends chunks a previous worker spooled but did not upload.
    async fn flush_spool(&self) {
        let spool = self.cfg.spool_root.join("output");
        if let Err(e) = hangar_output::resend_spooled(&self.cfg.store, &spool, &self.cfg.session_id).await {
            tracing::warn!(error = %e, "re-sending spooled output");
        }
    }
}

fn number(c: &Command) -> Option<u32> {
    c.status.as_ref().and_then(|s| s.number).and_then(|n| u32::try_from(n).ok())
}

fn phase(c: &Command) -> Option<CommandPhase> {
    c.status.as_ref().and_then(|s| s.phase)
}

fn unknown(reason: &str) -> Value {
    json!({"phase": "outcome_unknown", "finishedAt": Time(Timestamp::now()), "reason": reason})
}

/// The final status of a process that ended: who ended it decides.
pub fn final_status(ended_by: EndedBy, exit_code: Option<i32>, signal: Option<i32>) -> (CommandPhase, Option<i32>, Option<String>) {
    let by_signal = signal.map(|s| format!("ended by signal {s}"));
    match ended_by {
        EndedBy::Itself => (CommandPhase::Exited, exit_code, by_signal),
        EndedBy::Timeout => (CommandPhase::TimedOut, None, Some("ran past timeoutSeconds".into())),
        EndedBy::Cancel => (CommandPhase::Cancelled, None, Some("cancelled while running".into())),
        EndedBy::KillAll => (CommandPhase::KilledAtPause, None, Some("the session paused while it ran".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn who_ended_the_process_decides_its_final_status() {
        assert_eq!(final_status(EndedBy::Itself, Some(3), None), (CommandPhase::Exited, Some(3), None));
        assert_eq!(
            final_status(EndedBy::Itself, None, Some(9)),
            (CommandPhase::Exited, None, Some("ended by signal 9".into())),
            "a process killed by someone else still exited by itself as far as we asked"
        );
        assert_eq!(final_status(EndedBy::Timeout, None, Some(15)).0, CommandPhase::TimedOut);
        assert_eq!(final_status(EndedBy::Cancel, Some(0), None).0, CommandPhase::Cancelled);
        assert_eq!(final_status(EndedBy::KillAll, None, Some(9)).0, CommandPhase::KilledAtPause);
        for by in [EndedBy::Itself, EndedBy::Timeout, EndedBy::Cancel, EndedBy::KillAll] {
            assert!(final_status(by, Some(0), None).0.is_final());
        }
    }
}

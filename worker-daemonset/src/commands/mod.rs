//! The command runner: watches the Commands of this node's session, hands
//! them to the supervisor in number order (at most `MAX_RUNNING`, 16, at
//! once), writes their output to the store and reports each status.
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
//!
//! - `plan`: the decisions, with no I/O (what to hand over, the status each
//!   supervisor message means, how a hello settles the commands marked
//!   running), unit-tested;
//! - `journal`: the hand-over journal on the node's disk;
//! - this module: the I/O around them (the Command watch, the supervisor
//!   link, the output writes, the compare-and-swap status patches through
//!   `hangar_runtime::kube_ext::swap_status`).

pub mod feed;
pub mod journal;
pub mod plan;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::Duration;

use base64::Engine;
use hangar_crds::{Command, CommandPhase, CommandStatus, Phase};
use hangar_output::{AttemptKey, OutputStore, OutputWriter, Stream};
use hangar_runtime::kube_ext::{Swap, swap_status};
use hangar_supervisor_protocol::{FromSupervisor, Hello, OutputStream, Sequenced, ToSupervisor};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::{Client, ResourceExt};
use tokio::sync::{mpsc, watch};

use crate::attempt_key;
use crate::supervisor_link::{Incoming, LinkError, SupervisorLink};
use journal::{Journal, JournalError};
use plan::{Ending, Recovery};

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
    #[error("session commands: {0}")]
    Feed(#[from] feed::FeedError),
    #[error(transparent)]
    Journal(#[from] JournalError),
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
    /// The node this worker runs on (its hand-offs are named by it).
    pub node_name: String,
    pub system_namespace: String,
    /// Node-local disk: output spool, attempt keys, hand-over journal.
    pub spool_root: PathBuf,
    pub store: OutputStore,
    pub socket: PathBuf,
    pub metrics: crate::metrics::WorkerMetrics,
}

pub struct Runner {
    cfg: RunnerConfig,
    /// Status writes only: the commands are read from `feed`.
    api: Api<Command>,
    feed: feed::CommandsFeed,
    /// The version of the commands last read from `feed`.
    feed_version: Option<String>,
    secrets: Api<Secret>,
    link: SupervisorLink,
    journal: Journal,
    /// Commands of the session by name, as last seen (feed or own writes).
    commands: BTreeMap<String, Command>,
    /// The first full list of Commands has arrived.
    listed: bool,
    state: SessionState,
    /// Attempt the key and writers below belong to.
    attempt: i64,
    key: Option<hangar_output::KeyBytes<32>>,
    writers: HashMap<u32, OutputWriter>,
    /// The supervisor connection since its hello. None before the first
    /// hello, and after a reset: messages of the old connection are dropped
    /// until the next hello.
    conn: Option<Connection>,
    drained: watch::Sender<Option<i64>>,
}

/// What the runner did on one supervisor connection; each hello starts
/// afresh.
struct Connection {
    hello: Hello,
    /// The commands marked running are settled against this hello (and the
    /// current attempt).
    recovered: bool,
    killall_sent: bool,
    cancel_sent: Vec<u32>,
    acked: u64,
}

impl Connection {
    fn new(hello: Hello) -> Self {
        Self { hello, recovered: false, killall_sent: false, cancel_sent: Vec::new(), acked: 0 }
    }
}

fn now() -> Time {
    Time(Timestamp::now())
}

impl Runner {
    /// `session`: the per-node account's client (the Commands' status);
    /// `feed`: the session's commands, as that account; `node`: the
    /// worker's own client (its attempt key's hand-off).
    pub fn new(
        session: Client,
        feed: feed::CommandsFeed,
        node: Client,
        cfg: RunnerConfig,
        drained: watch::Sender<Option<i64>>,
    ) -> (Self, mpsc::Receiver<Incoming>) {
        let (link, incoming) = SupervisorLink::start(cfg.socket.clone());
        let runner = Self {
            api: Api::namespaced(session, &cfg.namespace),
            feed,
            feed_version: None,
            secrets: Api::namespaced(node, &cfg.system_namespace),
            journal: Journal::new(&cfg.spool_root, &cfg.session_id),
            cfg,
            link,
            commands: BTreeMap::new(),
            listed: false,
            state: SessionState::default(),
            attempt: 0,
            key: None,
            writers: HashMap::new(),
            conn: None,
            drained,
        };
        (runner, incoming)
    }

    pub async fn run(mut self, mut incoming: mpsc::Receiver<Incoming>, mut state: watch::Receiver<SessionState>) {
        let (feed_tx, mut feed_rx) = mpsc::channel(4);
        let follow = tokio::spawn(self.feed.clone().follow(feed_tx));
        let _stop_following = AbortOnDrop(follow);
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        self.flush_spool().await;
        loop {
            tokio::select! {
                now = feed_rx.recv() => match now {
                    Some(now) => self.apply_feed(now),
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

    /// Whether `c` was admitted for this session, not for an earlier
    /// Sandbox of the same name (bound by uid when numbered).
    fn is_of_this_session(&self, c: &Command) -> bool {
        c.status.as_ref().and_then(|s| s.sandbox_uid.as_deref()).is_none_or(|uid| uid == self.cfg.session_id)
    }

    /// The session's commands as the feed now sends them: commands it no
    /// longer holds are gone; the others are observed.
    fn apply_feed(&mut self, now: hangar_crds::node_commands::NodeCommands) {
        let names: std::collections::HashSet<String> = now.commands.iter().map(|c| c.name_any()).collect();
        self.commands.retain(|name, _| names.contains(name));
        for c in now.commands {
            self.observe(c);
        }
        self.feed_version = Some(now.version);
        self.listed = true;
    }

    /// Keeps the newer of the fed object and our own last write.
    fn observe(&mut self, c: Command) {
        if !self.is_of_this_session(&c) {
            return;
        }
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
        self.commands.values().find(|c| plan::number(c) == Some(n))
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
        if !batch.is_empty() && self.conn.is_some() {
            match self.process(batch).await {
                Ok(Some(seq)) => {
                    if let Some(conn) = self.conn.as_mut()
                        && seq > conn.acked
                        && self.link.send(&ToSupervisor::Ack { upto: seq }).await.is_ok()
                    {
                        conn.acked = seq;
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    // Not acknowledged: the supervisor delivers it again on
                    // the next connection.
                    tracing::warn!(error = %e, "processing supervisor messages; reconnecting to get them again");
                    self.link.reset().await;
                    self.conn = None;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        if let Some(h) = hello {
            tracing::info!(boot = %h.boot, known = h.known.len(), "supervisor connected");
            self.conn = Some(Connection::new(h));
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
                    while let Some(Sequenced {
                        seq,
                        msg: FromSupervisor::Output { id: i2, stream: s2, offset: o2, data_b64 },
                    }) = batch.get(i + 1)
                    {
                        if i2 != id || s2 != stream || *o2 != offset + bytes.len() as u64 || bytes.len() >= CHUNK_BYTES
                        {
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
                FromSupervisor::AgentExited { exit_code, signal } => {
                    tracing::info!(?exit_code, ?signal, "the agent's command ended");
                    done = Some(*seq);
                }
                msg => {
                    if let Some((id, ending)) = plan::ending(msg) {
                        self.finish(id, ending).await?;
                    }
                    done = Some(*seq);
                }
            }
            i += 1;
        }
        Ok(done)
    }

    async fn writer(&mut self, id: u32) -> Result<&mut OutputWriter, RunnerError> {
        if !self.writers.contains_key(&id) {
            let key = self.key.clone().ok_or(LinkError::NotConnected).map_err(RunnerError::Link)?;
            let w = OutputWriter::open(
                self.cfg.store.clone(),
                self.cfg.spool_root.join("output"),
                &self.cfg.session_id,
                id,
                self.attempt as u32,
                AttemptKey::from_bytes(key.as_slice()).expect("32-byte key"),
            )
            .await?;
            self.writers.insert(id, w);
        }
        Ok(self.writers.get_mut(&id).expect("inserted"))
    }

    async fn write_output(
        &mut self,
        id: u32,
        stream: OutputStream,
        offset: u64,
        bytes: Vec<u8>,
    ) -> Result<(), RunnerError> {
        let stream = match stream {
            OutputStream::Stdout => Stream::Stdout,
            OutputStream::Stderr => Stream::Stderr,
        };
        self.writer(id).await?.write_at(stream, offset, bytes).await?;
        Ok(())
    }

    /// Records a final status (once: a command already final stays as it is).
    async fn finish(&mut self, id: u32, ending: Ending) -> Result<(), RunnerError> {
        let output_bytes = match self.writers.remove(&id) {
            Some(mut w) => {
                // Every byte stored before the final status says so.
                w.flush().await?;
                w.offset()
            }
            None => self.cfg.store.stored_end(&self.cfg.session_id, id).await?,
        };
        let Some(cmd) = self.by_number(id).cloned() else {
            return Ok(());
        };
        let status = ending.status(now(), Some(output_bytes));
        let phase = status.phase;
        self.transition_final(cmd, status).await?;
        if let Some(phase) = phase {
            self.cfg.metrics.finished(phase.as_str(), output_bytes);
        }
        Ok(())
    }

    /// A compare-and-swap to a final status, re-read on a conflict. If it
    /// still cannot be written, the error leaves the supervisor's message
    /// unacknowledged, so it comes again.
    async fn transition_final(&mut self, mut cmd: Command, status: CommandStatus) -> Result<(), RunnerError> {
        for _ in 0..3 {
            if plan::phase(&cmd).is_some_and(CommandPhase::is_final) {
                return Ok(());
            }
            if self.cas(&cmd, &status).await? {
                return Ok(());
            }
            // Someone else wrote it: wait for the feed to show what.
            let now = self.feed.fetch(self.feed_version.as_deref(), Duration::from_secs(5)).await?;
            self.apply_feed(now);
            match self.commands.get(&cmd.name_any()) {
                Some(now) => cmd = now.clone(),
                None => return Ok(()),
            }
        }
        if plan::phase(&cmd).is_some_and(CommandPhase::is_final) {
            return Ok(());
        }
        Err(RunnerError::Unsettled(cmd.name_any()))
    }

    /// Merge-patches the status if the object is still at `cmd`'s version.
    /// False when someone else changed it first (or the change would leave
    /// a final status, which the CRD refuses).
    async fn cas(&mut self, cmd: &Command, status: &CommandStatus) -> Result<bool, RunnerError> {
        let patch = serde_json::to_value(status).expect("a status serialises");
        match swap_status(&self.api, cmd, patch).await? {
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
            if let Some(conn) = self.conn.as_mut() {
                conn.recovered = false;
            }
        }
        if self.key.is_none() {
            let key = attempt_key::load_or_create(&self.cfg, &self.secrets, self.attempt).await?;
            attempt_key::forget_earlier(&self.cfg.spool_root, &self.cfg.session_id, self.attempt);
            self.key = Some(key);
        }
        let Some(conn) = self.conn.as_ref() else {
            return Ok(());
        };
        let hello = conn.hello.clone();
        if !conn.recovered {
            self.recover(&hello).await?;
            if let Some(conn) = self.conn.as_mut() {
                conn.recovered = true;
            }
        }
        match state.phase {
            Some(Phase::Running) => {
                self.cancel_running().await?;
                self.start_queued(&hello.boot).await?;
            }
            Some(Phase::Pausing) => {
                if let Some(conn) = self.conn.as_mut()
                    && !conn.killall_sent
                {
                    self.link.send(&ToSupervisor::KillAll).await?;
                    conn.killall_sent = true;
                }
                if plan::drained(self.commands.values(), self.attempt) {
                    self.drained.send_replace(Some(self.attempt));
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// After a (re)connection: settle every command marked running.
    async fn recover(&mut self, hello: &Hello) -> Result<(), RunnerError> {
        let pausing = self.state.phase == Some(Phase::Pausing);
        let steps: Vec<(u32, Command, Recovery)> =
            plan::after_hello(self.commands.values(), self.attempt, hello, pausing, |n| self.journal.read(n), &now())
                .into_iter()
                .map(|(n, c, step)| (n, c.clone(), step))
                .collect();
        for (n, c, step) in steps {
            match step {
                Recovery::Keep => {}
                Recovery::HandOver => self.hand_over(&c, n, &hello.boot).await?,
                Recovery::Settle(status) => self.transition_final(c, *status).await?,
            }
        }
        Ok(())
    }

    async fn cancel_running(&mut self) -> Result<(), RunnerError> {
        let wanted: Vec<(u32, Command)> =
            plan::to_cancel(self.commands.values(), self.attempt).into_iter().map(|(n, c)| (n, c.clone())).collect();
        for (n, c) in wanted {
            if plan::phase(&c) == Some(CommandPhase::Running) && !self.cas(&c, &plan::cancelling()).await? {
                continue; // changed meanwhile; the next event brings it
            }
            if let Some(conn) = self.conn.as_mut()
                && !conn.cancel_sent.contains(&n)
            {
                self.link.send(&ToSupervisor::Cancel { id: n }).await?;
                conn.cancel_sent.push(n);
            }
        }
        Ok(())
    }

    async fn start_queued(&mut self, boot: &str) -> Result<(), RunnerError> {
        let next: Vec<(u32, Command)> =
            plan::to_hand_over(self.commands.values(), self.attempt).into_iter().map(|(n, c)| (n, c.clone())).collect();
        for (n, c) in next {
            if self.cas(&c, &plan::running(self.attempt, now())).await? {
                self.hand_over(&c, n, boot).await?;
            }
        }
        Ok(())
    }

    /// Journals the hand-over, then sends the Run.
    async fn hand_over(&mut self, c: &Command, n: u32, boot: &str) -> Result<(), RunnerError> {
        self.journal.write(n, boot)?;
        if let Err(e) = self.link.send(&plan::run(c, n)).await {
            // Not delivered (a partial line is no message).
            self.journal.forget(n);
            return Err(e.into());
        }
        Ok(())
    }

    /// Sends chunks a previous worker spooled but did not upload.
    async fn flush_spool(&self) {
        let spool = self.cfg.spool_root.join("output");
        if let Err(e) = hangar_output::resend_spooled(&self.cfg.store, &spool, &self.cfg.session_id).await {
            tracing::warn!(error = %e, "re-sending spooled output");
        }
    }
}

/// Ends the feed's long-poll task with the runner.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

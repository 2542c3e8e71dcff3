//! Admission of a new Command: its session must exist and not have ended,
//! and the session's limits hold — at most 247 commands in all and 64 not
//! yet finished.
//!
//! Exact under concurrent creates, with any number of webhook replicas:
//! each admitted create reserves its place in the session's command ledger
//! (`hangar_core::commands::ledger`, a ConfigMap in the operator's
//! namespace named by the session's uid, written by compare-and-swap). No
//! count a tenant can edit or delete is trusted: the ledger is out of the
//! tenant's reach, a repeated review or a create of an existing name takes
//! no place, and a reservation whose command never appeared is released.
//! Numbers are given by the operator, after the create.
//!
//! Fast: a batch reads the Sandbox and the session's Commands from watch
//! caches and the ledger as this replica last wrote it; in the common case
//! it costs one round trip: the compare-and-swap, with a read of the
//! Sandbox from the API beside it (whether the session has ended must be
//! current). Staleness is safe:
//! - a Sandbox not in the cache yet is read from the API;
//! - a command created a moment ago and not in the cache yet holds a
//!   reservation that is counted anyway, and one deleted a moment ago only
//!   makes the count stricter — except that its name would look taken, so a
//!   name the cache shows as taken is checked against the API;
//! - a ledger another writer changed fails the compare-and-swap and is read
//!   again from the API.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hangar_core::admission::command_creates;
use hangar_core::commands::ledger::{self, Create, Ledger, Live, Place};
use hangar_crds::{Command, Sandbox};
use hangar_runtime::json_document;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::oneshot;

use super::caches::Caches;
use super::{AdmissionError, Refusal};

/// A decision, or why none could be made (shared by a whole batch).
pub type Decided = Result<Result<Place, Refusal>, Arc<AdmissionError>>;

/// A waiting create and where its answer goes.
type Waiting = (Create, oneshot::Sender<Decided>);

/// One session's waiting admissions and its turn. Concurrent creates for
/// one session are decided together: whoever holds the session's turn takes
/// every request queued so far, reads the session once, decides them in
/// arrival order and reserves all the admitted places with one
/// compare-and-swap.
#[derive(Default)]
struct SessionQueue {
    waiting: Mutex<Vec<Waiting>>,
    turn: tokio::sync::Mutex<()>,
    /// The ledger as this replica last wrote it (and its version).
    last_written: Mutex<Option<(String, json_document::Read<Ledger>)>>,
}

/// Command admission: the API, the watch caches and the sessions' queues.
pub struct CommandAdmission {
    client: kube::Client,
    ledgers: Api<ConfigMap>,
    sandboxes: Store<Sandbox>,
    commands: Store<Command>,
    queues: Mutex<HashMap<String, Arc<SessionQueue>>>,
}

impl CommandAdmission {
    pub fn new(client: kube::Client, caches: &Caches, system_namespace: &str) -> Self {
        let ledgers = Api::namespaced(client.clone(), system_namespace);
        Self {
            client,
            ledgers,
            sandboxes: caches.sandboxes.clone(),
            commands: caches.commands.clone(),
            queues: Mutex::default(),
        }
    }

    fn queue(&self, key: String) -> Arc<SessionQueue> {
        let mut map = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        // Drop queues nobody holds, so the map does not grow with sessions.
        if map.len() > 1024 {
            map.retain(|_, q| Arc::strong_count(q) > 1);
        }
        map.entry(key).or_default().clone()
    }

    /// Reads, decides and (unless a dry run) reserves the command's place.
    pub async fn admit(&self, namespace: &str, command: &Command, sender: Option<String>, dry_run: bool) -> Decided {
        let name = &command.spec.sandbox;
        let create = Create { uid: command.uid().unwrap_or_default(), name: command.name_any(), sender };
        let queue = self.queue(format!("{namespace}/{name}"));
        if dry_run {
            // Decided on a read; nothing is reserved.
            let creates = [create];
            let mut session = self.read(&queue, namespace, name, &creates, false).await.map_err(Arc::new)?;
            let now = Timestamp::now().as_second();
            let sandbox = session.sandbox.as_ref();
            let mut decided =
                command_creates(namespace, name, sandbox, &mut session.ledger, &creates, &session.live, now);
            return Ok(decided.remove(0));
        }
        let (tx, mut rx) = oneshot::channel();
        queue.waiting.lock().unwrap_or_else(|p| p.into_inner()).push((create, tx));
        let turn = queue.turn.lock().await;
        // A batch decided while this one waited for its turn may hold it.
        if let Ok(decided) = rx.try_recv() {
            return decided;
        }
        let batch = std::mem::take(&mut *queue.waiting.lock().unwrap_or_else(|p| p.into_inner()));
        let (creates, answers): (Vec<Create>, Vec<_>) = batch.into_iter().unzip();
        match self.decide_batch(&queue, namespace, name, &creates).await {
            Ok(decisions) => {
                for (tx, d) in answers.into_iter().zip(decisions) {
                    let _ = tx.send(Ok(d));
                }
            }
            Err(e) => {
                let e = Arc::new(e);
                for tx in answers {
                    let _ = tx.send(Err(e.clone()));
                }
            }
        }
        drop(turn);
        rx.await.unwrap_or_else(|_| Err(Arc::new(AdmissionError::Contended)))
    }

    /// The session: the Sandbox (cache; the API on a miss or when `fresh`),
    /// its commands (cache; a name among `creates` the cache shows taken is
    /// checked against the API) and its ledger (as last written here,
    /// unless `fresh`).
    async fn read(
        &self,
        queue: &SessionQueue,
        namespace: &str,
        name: &str,
        creates: &[Create],
        fresh: bool,
    ) -> Result<Session, AdmissionError> {
        // From the cache when it has it (confirmed from the API alongside
        // the reservation, see `decide_batch`); a miss, or a fresh read, asks
        // the API.
        let cached = self.sandboxes.get(&ObjectRef::new(name).within(namespace)).map(|s| (*s).clone());
        let (sandbox, confirmed) = match cached {
            Some(s) if !fresh => (Some(s), false),
            _ => (Api::<Sandbox>::namespaced(self.client.clone(), namespace).get_opt(name).await?, true),
        };
        let Some(sandbox) = sandbox else {
            return Ok(Session { sandbox: None, confirmed, ledger: Ledger::default(), stored: None, live: Vec::new() });
        };
        let session_id = sandbox.uid().unwrap_or_default();
        let doc = ledger::document_name(&session_id);
        let remembered = queue.last_written.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let stored = match remembered {
            Some((d, read)) if d == doc && !fresh => read,
            _ => json_document::read(&self.ledgers, &doc).await?,
        };
        // Every command under this Sandbox's name, of any earlier session
        // too: their names are taken. The ledger counts only its own, by uid.
        let ns = Some(namespace.to_owned());
        let mut live: Vec<Live> = self
            .commands
            .state()
            .iter()
            .filter(|c| c.metadata.namespace == ns && c.spec.sandbox == name)
            .map(|c| Live::of(c))
            .collect();
        let commands: Api<Command> = Api::namespaced(self.client.clone(), namespace);
        for create in creates {
            if live.iter().any(|l| l.name == create.name && l.uid != create.uid)
                && commands.get_opt(&create.name).await?.is_none()
            {
                // Deleted since the cache saw it: the name is free.
                live.retain(|l| l.name != create.name);
            }
        }
        Ok(Session { sandbox: Some(sandbox), confirmed, ledger: stored.document.clone(), stored: Some(stored), live })
    }

    /// Decides the creates in arrival order on one read of the session and
    /// reserves the admitted ones together; a lost race reads again, from
    /// the API.
    async fn decide_batch(
        &self,
        queue: &SessionQueue,
        namespace: &str,
        name: &str,
        creates: &[Create],
    ) -> Result<Vec<Result<Place, Refusal>>, AdmissionError> {
        for attempt in 0..64u32 {
            let mut session = self.read(queue, namespace, name, creates, attempt > 0).await?;
            let now = Timestamp::now().as_second();
            let sandbox = session.sandbox.as_ref();
            let decisions = command_creates(namespace, name, sandbox, &mut session.ledger, creates, &session.live, now);
            let reserved = decisions.iter().any(|d| d == &Ok(Place::Reserved));
            let (Some(sandbox), Some(stored), true) = (&session.sandbox, &session.stored, reserved) else {
                return Ok(decisions);
            };
            let session_id = sandbox.uid().unwrap_or_default();
            let doc = ledger::document_name(&session_id);
            let labels = ledger::document_labels(&session_id);
            // A Sandbox from the cache is confirmed from the API while the
            // reservation is written (one round trip, not two): a client
            // that ended its session and then sends a command must be
            // refused (read-your-writes), and the cache may be a moment
            // behind. A reservation written for a session that turns out
            // to have ended is never used and is released after 30 s.
            let sandboxes: Api<Sandbox> = Api::namespaced(self.client.clone(), namespace);
            let confirm =
                async { if session.confirmed { Ok(Some(sandbox.clone())) } else { sandboxes.get_opt(name).await } };
            let write = json_document::write(&self.ledgers, &doc, labels, stored, &session.ledger);
            let (current, written) = tokio::join!(confirm, write);
            let current = current?;
            if current.as_ref().and_then(|s| s.uid()) != Some(session_id.clone())
                || current.as_ref().is_some_and(Sandbox::has_ended)
            {
                // Ended, gone or re-created since the cache saw it: decide
                // again on what the API says.
                let mut again = session.ledger.clone();
                let decisions =
                    command_creates(namespace, name, current.as_ref(), &mut again, creates, &session.live, now);
                if decisions.iter().all(Result::is_err) {
                    return Ok(decisions);
                }
                continue;
            }
            if let Some(written) = written? {
                *queue.last_written.lock().unwrap_or_else(|p| p.into_inner()) = Some((doc, written));
                return Ok(decisions);
            }
            // Another replica, or the operator numbering, wrote first.
            if attempt > 0 {
                let jitter = u64::from(attempt % 7) * 3;
                tokio::time::sleep(Duration::from_millis(2 + jitter)).await;
            }
        }
        Err(AdmissionError::Contended)
    }
}

/// What a decision reads: the session, its ledger and its commands.
struct Session {
    sandbox: Option<Sandbox>,
    /// The Sandbox was read from the API, not the cache.
    confirmed: bool,
    ledger: Ledger,
    stored: Option<json_document::Read<Ledger>>,
    live: Vec<Live>,
}

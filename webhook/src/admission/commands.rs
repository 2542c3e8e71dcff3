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
use kube::api::{Api, ListParams};
use tokio::sync::oneshot;

use super::{AdmissionError, Refusal};

/// Admissions waiting per session. Concurrent creates for one session are
/// decided together: whoever holds the session's turn takes every request
/// queued so far, reads the session once, decides them in arrival order and
/// reserves all the admitted places with one compare-and-swap. A burst of
/// 64 creates then costs a few rounds, not 64 (the compare-and-swap still
/// guards against other replicas).
#[derive(Default)]
pub struct SessionQueues(Mutex<HashMap<String, Arc<SessionQueue>>>);

/// A decision, or why none could be made (shared by a whole batch).
pub type Decided = Result<Result<Place, Refusal>, Arc<AdmissionError>>;

/// A waiting create and where its answer goes.
type Waiting = (Create, oneshot::Sender<Decided>);

/// One session's waiting admissions and its turn.
#[derive(Default)]
struct SessionQueue {
    waiting: Mutex<Vec<Waiting>>,
    turn: tokio::sync::Mutex<()>,
}

impl SessionQueues {
    fn get(&self, key: String) -> Arc<SessionQueue> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        // Drop queues nobody holds, so the map does not grow with sessions.
        if map.len() > 1024 {
            map.retain(|_, q| Arc::strong_count(q) > 1);
        }
        map.entry(key).or_default().clone()
    }
}

/// Where the ledgers are kept.
pub struct Ledgers {
    pub api: Api<ConfigMap>,
}

impl Ledgers {
    pub fn new(client: kube::Client, system_namespace: &str) -> Self {
        Self { api: Api::namespaced(client, system_namespace) }
    }
}

/// Reads, decides and (unless a dry run) reserves the command's place.
pub async fn admit(
    client: &kube::Client,
    ledgers: &Ledgers,
    queues: &SessionQueues,
    namespace: &str,
    command: &Command,
    dry_run: bool,
) -> Decided {
    let name = &command.spec.sandbox;
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), namespace);
    let commands: Api<Command> = Api::namespaced(client.clone(), namespace);
    let create = Create { uid: command.uid().unwrap_or_default(), name: command.name_any() };
    if dry_run {
        // Decided on a fresh read; nothing is reserved.
        let mut session = read(ledgers, &sandboxes, &commands, name).await.map_err(Arc::new)?;
        let now = Timestamp::now().as_second();
        let sandbox = session.sandbox.as_ref();
        let mut decided = command_creates(namespace, name, sandbox, &mut session.ledger, &[create], &session.live, now);
        return Ok(decided.remove(0));
    }
    let queue = queues.get(format!("{namespace}/{name}"));
    let (tx, mut rx) = oneshot::channel();
    queue.waiting.lock().unwrap_or_else(|p| p.into_inner()).push((create, tx));
    let turn = queue.turn.lock().await;
    // A batch decided while this one waited for its turn may hold it.
    if let Ok(decided) = rx.try_recv() {
        return decided;
    }
    let batch = std::mem::take(&mut *queue.waiting.lock().unwrap_or_else(|p| p.into_inner()));
    let (creates, answers): (Vec<Create>, Vec<_>) = batch.into_iter().unzip();
    match decide_batch(ledgers, &sandboxes, &commands, namespace, name, &creates).await {
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

/// What a decision reads: the session, its ledger and its commands.
struct Session {
    sandbox: Option<Sandbox>,
    ledger: Ledger,
    stored: Option<json_document::Read<Ledger>>,
    live: Vec<Live>,
}

async fn read(
    ledgers: &Ledgers,
    sandboxes: &Api<Sandbox>,
    commands: &Api<Command>,
    name: &str,
) -> Result<Session, AdmissionError> {
    let Some(sandbox) = sandboxes.get_opt(name).await? else {
        return Ok(Session { sandbox: None, ledger: Ledger::default(), stored: None, live: Vec::new() });
    };
    let session_id = sandbox.uid().unwrap_or_default();
    let stored: json_document::Read<Ledger> =
        json_document::read(&ledgers.api, &ledger::document_name(&session_id)).await?;
    // Every command under this Sandbox's name, of any earlier session too:
    // their names are taken. The ledger counts only its own, by uid.
    let list = commands.list(&ListParams::default().fields(&format!("spec.sandbox={name}"))).await?.items;
    Ok(Session {
        sandbox: Some(sandbox),
        ledger: stored.document.clone(),
        stored: Some(stored),
        live: list.iter().map(Live::of).collect(),
    })
}

/// Decides the creates in arrival order on one read of the session and
/// reserves the admitted ones together; a lost race reads again.
async fn decide_batch(
    ledgers: &Ledgers,
    sandboxes: &Api<Sandbox>,
    commands: &Api<Command>,
    namespace: &str,
    name: &str,
    creates: &[Create],
) -> Result<Vec<Result<Place, Refusal>>, AdmissionError> {
    for attempt in 0..64u32 {
        let mut session = read(ledgers, sandboxes, commands, name).await?;
        let now = Timestamp::now().as_second();
        let decisions = command_creates(
            namespace,
            name,
            session.sandbox.as_ref(),
            &mut session.ledger,
            creates,
            &session.live,
            now,
        );
        let reserved = decisions.iter().any(|d| d == &Ok(Place::Reserved));
        let (Some(sandbox), Some(stored), true) = (&session.sandbox, &session.stored, reserved) else {
            return Ok(decisions);
        };
        let session_id = sandbox.uid().unwrap_or_default();
        let doc = ledger::document_name(&session_id);
        let labels = ledger::document_labels(&session_id);
        if json_document::write(&ledgers.api, &doc, labels, stored, &session.ledger).await? {
            return Ok(decisions);
        }
        // Another replica, or the operator numbering, wrote first: read again.
        let jitter = u64::from(attempt % 7) * 3;
        tokio::time::sleep(Duration::from_millis(2 + jitter)).await;
    }
    Err(AdmissionError::Contended)
}

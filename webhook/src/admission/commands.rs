//! Admission of a new Command: its session must exist and not have ended,
//! and the session's limits hold — at most 247 commands in all and 64 not
//! yet finished.
//!
//! Exact under concurrent creates, with any number of webhook replicas:
//! each admission reserves its place by a compare-and-swap on a counter
//! kept on the Sandbox (`hangar.dev/commands-admitted`, a JSON patch that
//! tests the value it read). The counter only grows, so it can over-count
//! (a create refused later by the apiserver) and refuse early, never
//! under-count and admit a 248th. Unfinished = admitted − finished, where
//! finished comes from a fresh list: a stale list only makes it stricter.
//! Numbers are not given here but by the operator, after the create, so a
//! create that fails later leaves no gap.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hangar_core::admission::command_create;
use hangar_core::commands::limits::{Counts, decide_in_order};
use hangar_crds::{Command, CommandPhase, Sandbox};
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;
use tokio::sync::oneshot;

use super::{AdmissionError, Refusal};

pub const ADMITTED_ANNOTATION: &str = "hangar.dev/commands-admitted";

/// Admissions waiting per session. Concurrent creates for one session are
/// decided together: whoever holds the session's turn takes every request
/// queued so far, reads the session once, decides them in arrival order and
/// reserves all the admitted places with one compare-and-swap. A burst of
/// 64 creates then costs a few rounds, not 64 (the compare-and-swap still
/// guards against other replicas).
#[derive(Default)]
pub struct SessionQueues(Mutex<HashMap<String, Arc<SessionQueue>>>);

/// One session's waiting admissions and its turn.
#[derive(Default)]
struct SessionQueue {
    waiting: Mutex<Vec<oneshot::Sender<Decided>>>,
    turn: tokio::sync::Mutex<()>,
}

/// A decision, or why none could be made (shared by a whole batch).
pub type Decided = Result<Result<(), Refusal>, Arc<AdmissionError>>;

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

/// Reads, decides and (unless a dry run) reserves the command's place.
pub async fn admit(
    client: &kube::Client,
    queues: &SessionQueues,
    namespace: &str,
    command: &Command,
    dry_run: bool,
) -> Decided {
    let name = &command.spec.sandbox;
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), namespace);
    let commands: Api<Command> = Api::namespaced(client.clone(), namespace);
    if dry_run {
        // Decided on a fresh read; nothing is reserved.
        let (sandbox, counts, _) = read(&sandboxes, &commands, name).await.map_err(Arc::new)?;
        return Ok(command_create(namespace, name, sandbox.as_ref(), counts));
    }
    let queue = queues.get(format!("{namespace}/{name}"));
    let (tx, mut rx) = oneshot::channel();
    queue.waiting.lock().unwrap_or_else(|p| p.into_inner()).push(tx);
    let turn = queue.turn.lock().await;
    // A batch decided while this one waited for its turn may hold it.
    if let Ok(decided) = rx.try_recv() {
        return decided;
    }
    let batch = std::mem::take(&mut *queue.waiting.lock().unwrap_or_else(|p| p.into_inner()));
    match decide_batch(&sandboxes, &commands, namespace, name, batch.len()).await {
        Ok(decisions) => {
            for (tx, d) in batch.into_iter().zip(decisions) {
                let _ = tx.send(Ok(d));
            }
        }
        Err(e) => {
            let e = Arc::new(e);
            for tx in batch {
                let _ = tx.send(Err(e.clone()));
            }
        }
    }
    drop(turn);
    rx.await.unwrap_or_else(|_| Err(Arc::new(AdmissionError::Contended)))
}

/// The session, its counts (admitted: the larger of the counter and the
/// commands that exist) and the counter as read.
async fn read(
    sandboxes: &Api<Sandbox>,
    commands: &Api<Command>,
    name: &str,
) -> Result<(Option<Sandbox>, Counts, Option<i64>), AdmissionError> {
    let Some(sandbox) = sandboxes.get_opt(name).await? else {
        return Ok((None, Counts::default(), None));
    };
    let list = commands.list(&ListParams::default().fields(&format!("spec.sandbox={name}"))).await?.items;
    let finished =
        list.iter().filter(|c| c.status.as_ref().and_then(|st| st.phase).is_some_and(CommandPhase::is_final)).count()
            as i64;
    let counter = sandbox.annotations().get(ADMITTED_ANNOTATION).and_then(|v| v.parse::<i64>().ok());
    let admitted = counter.unwrap_or(0).max(list.len() as i64);
    Ok((Some(sandbox), Counts { admitted, finished }, counter))
}

/// Decides `n` creates in arrival order on one read of the session and
/// reserves the admitted ones together; a lost race reads again.
async fn decide_batch(
    sandboxes: &Api<Sandbox>,
    commands: &Api<Command>,
    namespace: &str,
    name: &str,
    n: usize,
) -> Result<Vec<Result<(), Refusal>>, AdmissionError> {
    for attempt in 0..64u32 {
        let (sandbox, counts, counter) = read(sandboxes, commands, name).await?;
        let (decisions, accepted) =
            decide_in_order(n, counts, |c| command_create(namespace, name, sandbox.as_ref(), c));
        let Some(sandbox) = sandbox.filter(|_| accepted > 0) else {
            return Ok(decisions);
        };
        match reserve(sandboxes, &sandbox, counter, counts.admitted + accepted).await {
            Ok(()) => return Ok(decisions),
            Err(kube::Error::Api(e)) if e.code == 409 || e.code == 422 => {
                // Another replica moved the counter first: read again.
                let jitter = u64::from(attempt % 7) * 3;
                tokio::time::sleep(Duration::from_millis(2 + jitter)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(AdmissionError::Contended)
}

/// Moves the counter from what was read (`seen`) to `next`, or fails.
async fn reserve(api: &Api<Sandbox>, sandbox: &Sandbox, seen: Option<i64>, next: i64) -> Result<(), kube::Error> {
    let path = format!("/metadata/annotations/{}", ADMITTED_ANNOTATION.replace('~', "~0").replace('/', "~1"));
    let ops = match seen {
        Some(v) => json!([
            {"op": "test", "path": path, "value": v.to_string()},
            {"op": "replace", "path": path, "value": next.to_string()},
        ]),
        // No counter yet: only if nothing changed since the read.
        None if sandbox.metadata.annotations.is_some() => json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": sandbox.resource_version()},
            {"op": "add", "path": path, "value": next.to_string()},
        ]),
        None => json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": sandbox.resource_version()},
            {"op": "add", "path": "/metadata/annotations", "value": {ADMITTED_ANNOTATION: next.to_string()}},
        ]),
    };
    let patch: json_patch::Patch = serde_json::from_value(ops).expect("valid JSON patch");
    api.patch(&sandbox.name_any(), &PatchParams::default(), &Patch::<()>::Json(patch)).await?;
    Ok(())
}

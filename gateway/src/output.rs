//! Reading command output: the attempt keys (sealed under the organisation
//! key in the session's output-key Secret, or still in the worker's
//! hand-off for a moment after it made them), and reads past an offset
//! that wait for new bytes.
//!
//! Waiting polls the store's listing every `poll` (20 ms by default): the
//! worker writes no per-chunk signal anywhere else, by design. With S3 each
//! waiting reader costs a LIST per poll; a push from the worker to the
//! gateway replica holding the reader is the planned refinement.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hangar_crds::{ErrorCode, output_keys};
use hangar_output::{AttemptKey, Chunk, OrgKey, OutputStore, ReadError};
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;

use crate::error::ApiError;

/// One output response carries about this much (a reader pages on with
/// `next`): bounded memory per request, whatever the command wrote.
pub const MAX_RESPONSE_BYTES: u64 = 8 << 20;

/// Whose output: the session's id, and the node its worker runs on (whose
/// hand-offs alone are its keys).
#[derive(Clone, Copy, Debug)]
pub struct Of<'a> {
    pub id: &'a str,
    pub node: Option<&'a str>,
}

pub struct OutputReader {
    pub store: OutputStore,
    secrets: Api<Secret>,
    org: OrgKey,
    /// Opened keys per session (they never change once made).
    keys: Mutex<HashMap<String, HashMap<u32, [u8; 32]>>>,
    pub poll: Duration,
}

impl OutputReader {
    pub fn new(store: OutputStore, secrets: Api<Secret>, org: OrgKey) -> Self {
        Self { store, secrets, org, keys: Mutex::default(), poll: Duration::from_millis(20) }
    }

    /// Opens attempt `attempt`'s key from the Secrets and caches it: the
    /// sealed entry, else the worker's hand-off not sealed yet. Read twice,
    /// since the operator may seal a hand-off (and delete it) between the
    /// two reads. `None`: no key exists (destroyed, or never made).
    async fn fetch_key(&self, session: Of<'_>, attempt: u32) -> Result<Option<[u8; 32]>, ApiError> {
        let session_id = session.id;
        let a = i64::from(attempt);
        for _ in 0..2 {
            let sealed = self.secrets.get_opt(&output_keys::sealed_secret_name(session_id)).await?;
            let entry = sealed.and_then(|s| s.data).and_then(|d| d.get(&output_keys::sealed_entry(a)).cloned());
            let key = match entry {
                Some(v) => Some(
                    self.org
                        .unseal(&v.0, &output_keys::seal_context(session_id, a))
                        .map_err(|e| ApiError::internal(format!("output key of attempt {a}: {e}")))?,
                ),
                // Not sealed yet: the hand-off from the session's own node.
                None if session.node.is_some() => {
                    let node = session.node.unwrap_or_default();
                    let handoff = self.secrets.get_opt(&output_keys::handoff_secret_name(node, session_id, a)).await?;
                    handoff.and_then(|s| s.data).and_then(|d| d.get(output_keys::HANDOFF_KEY).cloned()).map(|k| k.0)
                }
                None => None,
            };
            if let Some(k) = key.and_then(|k| <[u8; 32]>::try_from(k.as_slice()).ok()) {
                self.keys
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(session_id.to_owned())
                    .or_default()
                    .insert(attempt, k);
                return Ok(Some(k));
            }
        }
        Ok(None)
    }

    /// Forgets a session's keys (they were destroyed).
    pub fn forget(&self, session_id: &str) {
        self.keys.lock().unwrap_or_else(|p| p.into_inner()).remove(session_id);
    }

    /// The chunks past `after`; 410 once the keys are destroyed. Keys are
    /// looked up only for the attempts the chunks belong to, and only when
    /// not cached: a long-poll does no Secret reads once it has them.
    pub async fn read(&self, session: Of<'_>, number: u32, after: u64) -> Result<Vec<Chunk>, ApiError> {
        let session_id = session.id;
        let mut fetched = Vec::new();
        loop {
            let keys = self.keys.lock().unwrap_or_else(|p| p.into_inner()).get(session_id).cloned().unwrap_or_default();
            let key = |a: u32| keys.get(&a).map(|k| AttemptKey::from_bytes(k).expect("32-byte key"));
            match self.store.read_after_at_most(session_id, number, after, MAX_RESPONSE_BYTES, &key).await {
                Ok(chunks) => return Ok(chunks),
                Err(ReadError::Erased(a)) if !fetched.contains(&a) => {
                    fetched.push(a);
                    self.fetch_key(session, a).await?;
                }
                Err(ReadError::Erased(a)) => {
                    return Err(ApiError::new(
                        ErrorCode::SandboxOutputErased,
                        format!("the output of attempt {a} is erased: its retention ended and its key was destroyed"),
                    ));
                }
                Err(e) => return Err(ApiError::internal(format!("output store: {e}"))),
            }
        }
    }

    /// How far the command's output is stored without a gap.
    pub async fn stored_end(&self, session_id: &str, number: u32) -> Result<u64, ApiError> {
        self.store.stored_end(session_id, number).await.map_err(|e| ApiError::internal(format!("output store: {e}")))
    }

    /// Reads past `after`, waiting until there are bytes, `is_final()`
    /// says the command ended, or `wait` passes.
    pub async fn read_waiting<F, Fut>(
        &self,
        session: Of<'_>,
        number: u32,
        after: u64,
        wait: Duration,
        mut is_final: F,
    ) -> Result<(Vec<Chunk>, bool), ApiError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<bool, ApiError>>,
    {
        let deadline = Instant::now() + wait;
        loop {
            // Final first: the worker stores all output before the final
            // status, so a read after seeing it misses nothing.
            let fin = is_final().await?;
            let chunks = self.read(session, number, after).await?;
            if !chunks.is_empty() || fin || Instant::now() >= deadline {
                return Ok((chunks, fin));
            }
            tokio::time::sleep(self.poll.min(deadline.saturating_duration_since(Instant::now()))).await;
        }
    }
}

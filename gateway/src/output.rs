//! Reading command output: the attempt keys (sealed under the output
//! key-encryption key in the session's sealed output keys, a ConfigMap the
//! operator writes), and reads past an offset that wait for new bytes.
//!
//! Custody: the gateway holds the output key-encryption key and no other
//! key; it never reads a raw hand-off (a Secret), the organisation key or a
//! workspace key. An attempt whose key the operator has not sealed yet
//! reads as "nothing yet", not as erased or finished.
//!
//! Waiting: the worker writes no per-chunk signal anywhere but the store,
//! so the store is polled — by one follower per command with waiting
//! readers (`follow`), which lists the command's chunks every `poll`
//! (`FOLLOW_EVERY`, 20 ms)
//! and tells every reader how far the output is stored. However many
//! clients long-poll one command, the store sees one listing per poll; a
//! reader reads chunks only once there are bytes past its offset.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hangar_crds::{ErrorCode, output_keys};
use hangar_output::{AttemptKey, Chunk, OrgKey, OutputStore, Page, ReadError};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use tokio::sync::watch;
use zeroize::Zeroizing;

use crate::error::ApiError;

/// One output response carries about this much (a reader pages on with
/// `next`): bounded memory per request, whatever the command wrote.
pub const MAX_RESPONSE_BYTES: u64 = 8 << 20;

/// A session's opened output keys by attempt (wiped when dropped).
type AttemptKeys = HashMap<u32, Zeroizing<[u8; 32]>>;

/// Per (session id, command number): the sender of how far its output is
/// stored.
type Followers = HashMap<(String, u32), Arc<watch::Sender<u64>>>;

pub struct OutputReader {
    pub store: OutputStore,
    /// The sealed output keys (ConfigMaps in the operator's namespace; the
    /// published certificate keys too).
    pub(crate) maps: Api<ConfigMap>,
    /// The output key-encryption key.
    kek: OrgKey,
    /// Opened keys per session (they never change once made).
    keys: Mutex<HashMap<String, AttemptKeys>>,
    /// How often a command's follower lists its chunks (`FOLLOW_EVERY`).
    pub poll: Duration,
    /// One follower per command with waiting readers: how far its output
    /// is stored.
    followers: Arc<Mutex<Followers>>,
}

/// How often a command's follower lists its stored chunks while readers
/// wait: a wake waits up to this long for the listing that sees new bytes.
pub const FOLLOW_EVERY: Duration = Duration::from_millis(20);

impl OutputReader {
    pub fn new(store: OutputStore, maps: Api<ConfigMap>, kek: OrgKey) -> Self {
        Self { store, maps, kek, keys: Mutex::default(), poll: FOLLOW_EVERY, followers: Arc::default() }
    }

    /// How far command `number`'s output is stored, kept current by the
    /// command's one follower (started here if none runs); the follower
    /// stops when its last reader is gone.
    pub fn follow(&self, session_id: &str, number: u32) -> watch::Receiver<u64> {
        let key = (session_id.to_owned(), number);
        let mut map = self.followers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = map.get(&key) {
            return tx.subscribe();
        }
        let (tx, rx) = watch::channel(0);
        let tx = Arc::new(tx);
        map.insert(key.clone(), tx.clone());
        let (store, followers, poll) = (self.store.clone(), self.followers.clone(), self.poll);
        tokio::spawn(async move {
            loop {
                match store.stored_end(&key.0, key.1).await {
                    Ok(end) => {
                        tx.send_if_modified(|v| std::mem::replace(v, end) != end);
                    }
                    Err(e) => tracing::warn!(error = %e, "output store"),
                }
                tokio::time::sleep(poll).await;
                let mut map = followers.lock().unwrap_or_else(|p| p.into_inner());
                if tx.receiver_count() == 0 {
                    map.remove(&key);
                    return;
                }
            }
        });
        rx
    }

    /// Commands followed now (for the tests and /metrics).
    pub fn followed(&self) -> usize {
        self.followers.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Opens attempt `attempt`'s key from the sealed output keys and
    /// caches it. `None`: not sealed (not yet, or destroyed).
    async fn fetch_key(&self, session_id: &str, attempt: u32) -> Result<Option<Zeroizing<[u8; 32]>>, ApiError> {
        let a = i64::from(attempt);
        let sealed = self.maps.get_opt(&output_keys::sealed_keys_name(session_id)).await?;
        let Some(entry) = sealed.and_then(|s| s.binary_data).and_then(|mut d| d.remove(&output_keys::sealed_entry(a)))
        else {
            return Ok(None);
        };
        let key = self
            .kek
            .unseal(&entry.0, &output_keys::seal_context(session_id, a))
            .map_err(|e| ApiError::internal(format!("output key of attempt {a}: {e}")))?;
        let key = <[u8; 32]>::try_from(key.as_slice())
            .map(Zeroizing::new)
            .map_err(|_| ApiError::internal(format!("output key of attempt {a} is not 32 bytes")))?;
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        keys.entry(session_id.to_owned()).or_default().insert(attempt, key.clone());
        Ok(Some(key))
    }

    /// Forgets a session's keys (they were destroyed).
    pub fn forget(&self, session_id: &str) {
        self.keys.lock().unwrap_or_else(|p| p.into_inner()).remove(session_id);
    }

    /// The chunks past `after` (one page of at most about
    /// `MAX_RESPONSE_BYTES`), or `None` while a key they need is not
    /// sealed. Keys are looked up only for the attempts the chunks belong
    /// to, and only when not cached: a long-poll does no reads of keys once
    /// it has them. (Erased output is answered before reading: the route
    /// looks at `status.outputErasedAt`.)
    pub async fn read(&self, session_id: &str, number: u32, after: u64) -> Result<Option<Page>, ApiError> {
        let mut fetched = Vec::new();
        loop {
            let keys = self.keys.lock().unwrap_or_else(|p| p.into_inner()).get(session_id).cloned().unwrap_or_default();
            let key = |a: u32| keys.get(&a).map(|k| AttemptKey::from_bytes(k.as_slice()).expect("32-byte key"));
            match self.store.read_after_at_most(session_id, number, after, MAX_RESPONSE_BYTES, &key).await {
                Ok(page) => return Ok(Some(page)),
                Err(ReadError::Erased(a)) if !fetched.contains(&a) => {
                    fetched.push(a);
                    if self.fetch_key(session_id, a).await?.is_none() {
                        return Ok(None);
                    }
                }
                Err(ReadError::Erased(_)) => return Ok(None),
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
        session_id: &str,
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
        let mut stored = self.follow(session_id, number);
        let mut first = true;
        loop {
            // Final first: the worker stores all output before the final
            // status, so a read after seeing it misses nothing.
            let fin = is_final().await?;
            let past = *stored.borrow_and_update() > after;
            if std::mem::take(&mut first) || past || fin {
                // A key not sealed yet: nothing to give, and not final
                // either (the client would take "final, no bytes" for all).
                // Final only on the last page: a command that ended with
                // more than a page stored is read to its end first.
                if let Some(Page { chunks, more }) = self.read(session_id, number, after).await?
                    && (!chunks.is_empty() || fin)
                {
                    return Ok((chunks, fin && !more));
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok((Vec::new(), false));
            }
            // New bytes wake the reader at once; the status (from the
            // gateway's index) is looked at every poll.
            let _ = tokio::time::timeout(self.poll.max(Duration::from_millis(100)).min(left), stored.changed()).await;
        }
    }
}

/// An output response (`chunks`, `next`, `final`, `status`, `exitCode`),
/// written straight from the chunks: each chunk's base64 goes once into
/// the body, with no JSON tree holding a second copy of up to 8 MiB.
pub fn page(cmd: &hangar_crds::Command, after: u64, chunks: &[Chunk], fin: bool) -> axum::response::Response {
    use axum::response::IntoResponse;
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let next = chunks.last().map(|c| c.offset + c.data.len() as u64).unwrap_or(after);
    let size: usize = chunks.iter().map(|c| c.data.len().div_ceil(3) * 4 + 64).sum();
    let mut body = String::with_capacity(size + 160);
    body.push_str("{\"chunks\":[");
    for (i, c) in chunks.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        // The stream name and the base64 alphabet need no escaping.
        body.push_str(&format!("{{\"stream\":\"{}\",\"offset\":{},\"data\":\"", c.stream.as_str(), c.offset));
        b64.encode_string(&c.data, &mut body);
        body.push_str("\"}");
    }
    let tail = serde_json::json!({
        "next": next,
        "final": fin,
        "status": crate::views::phase(cmd).as_str(),
        "exitCode": cmd.status.as_ref().and_then(|s| s.exit_code),
    });
    body.push_str("],");
    // `{"next":…}` without its opening brace.
    body.push_str(&tail.to_string()[1..]);
    ([(axum::http::header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// The cap on output reads waiting at once: in all, and per caller (each
/// holds a connection and a follower subscription for up to 25 s).
pub struct LongPolls {
    total: Arc<tokio::sync::Semaphore>,
    per_caller: Mutex<HashMap<String, usize>>,
    max_per_caller: usize,
}

/// A place among the waiting reads, given back on drop.
pub struct PollPermit<'a> {
    _total: tokio::sync::OwnedSemaphorePermit,
    caller: String,
    polls: &'a LongPolls,
}

impl LongPolls {
    pub fn new(max_total: usize, max_per_caller: usize) -> Self {
        Self { total: Arc::new(tokio::sync::Semaphore::new(max_total)), per_caller: Mutex::default(), max_per_caller }
    }

    /// A place for `caller`'s read, or 429 `rate_limited`.
    pub fn enter(&self, caller: &str) -> Result<PollPermit<'_>, ApiError> {
        let full = || ApiError::new(ErrorCode::RateLimited, "too many output reads waiting at once; try again shortly");
        let total = self.total.clone().try_acquire_owned().map_err(|_| full())?;
        let mut per = self.per_caller.lock().unwrap_or_else(|p| p.into_inner());
        let n = per.entry(caller.to_owned()).or_default();
        if *n >= self.max_per_caller {
            return Err(full());
        }
        *n += 1;
        Ok(PollPermit { _total: total, caller: caller.to_owned(), polls: self })
    }
}

impl Drop for PollPermit<'_> {
    fn drop(&mut self) {
        let mut per = self.polls.per_caller.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = per.get_mut(&self.caller) {
            *n -= 1;
            if *n == 0 {
                per.remove(&self.caller);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reader(dir: &std::path::Path) -> OutputReader {
        // A client that is never called: followers read only the store.
        let config = kube::Config::new("https://127.0.0.1:9".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let org = OrgKey::from_bytes(&[7u8; 32]).unwrap();
        OutputReader::new(OutputStore::local(dir).unwrap(), Api::namespaced(client, "x"), org)
    }

    #[tokio::test]
    async fn a_page_is_the_contracts_json_with_each_chunk_in_base64() {
        use base64::Engine;
        let cmd: hangar_crds::Command = serde_json::from_value(serde_json::json!({
            "apiVersion": "hangar.dev/v1alpha1", "kind": "Command", "metadata": {"name": "c"},
            "spec": {"sandbox": "s", "argv": ["true"]},
            "status": {"phase": "exited", "exitCode": 3},
        }))
        .unwrap();
        let chunks = [
            Chunk {
                stream: hangar_output::Stream::Stdout,
                offset: 10,
                data: axum::body::Bytes::from_static(b"hello \"x\"\n"),
            },
            Chunk {
                stream: hangar_output::Stream::Stderr,
                offset: 21,
                data: axum::body::Bytes::from(vec![0u8, 255, 7]),
            },
        ];
        let read = |resp: axum::response::Response| async move {
            assert_eq!(resp.headers()[axum::http::header::CONTENT_TYPE], "application/json");
            let body = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
            serde_json::from_slice::<serde_json::Value>(&body).expect("valid JSON")
        };
        let b64 = base64::engine::general_purpose::STANDARD;
        assert_eq!(
            read(page(&cmd, 10, &chunks, true)).await,
            serde_json::json!({
                "chunks": [
                    {"stream": "stdout", "offset": 10, "data": b64.encode(b"hello \"x\"\n")},
                    {"stream": "stderr", "offset": 21, "data": b64.encode([0u8, 255, 7])},
                ],
                "next": 24, "final": true, "status": "exited", "exitCode": 3,
            })
        );
        assert_eq!(
            read(page(&cmd, 7, &[], false)).await,
            serde_json::json!({"chunks": [], "next": 7, "final": false, "status": "exited", "exitCode": 3})
        );
    }

    #[tokio::test]
    async fn many_readers_of_one_command_share_one_follower_which_stops_after_the_last() {
        hangar_runtime::telemetry::init();
        let dir = tempfile::tempdir().unwrap();
        let out = reader(dir.path());
        let readers: Vec<_> = (0..50).map(|_| out.follow("s", 1)).collect();
        let other = out.follow("s", 2);
        assert_eq!(out.followed(), 2, "one follower per command, not per reader");
        drop(readers);
        drop(other);
        let deadline = Instant::now() + Duration::from_secs(5);
        while out.followed() > 0 {
            assert!(Instant::now() < deadline, "followers without readers stop");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[test]
    fn waiting_reads_are_capped_in_all_and_per_caller() {
        let polls = LongPolls::new(3, 2);
        let a1 = polls.enter("a").unwrap();
        let _a2 = polls.enter("a").unwrap();
        assert_eq!(polls.enter("a").err().map(|e| e.status), Some(429), "a third for one caller");
        let _b1 = polls.enter("b").unwrap();
        assert_eq!(polls.enter("c").err().map(|e| e.status), Some(429), "four in all");
        drop(a1);
        assert!(polls.enter("c").is_ok(), "a place given back is free again");
    }
}

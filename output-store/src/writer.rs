//! The worker's side: each chunk is sealed, written to the node's spool
//! (fsync'd), uploaded, then removed from the spool. After a worker restart
//! or a resume, `open` re-sends whatever is still spooled (the same bytes,
//! since sealing is deterministic per position) and continues at the next
//! offset: nothing lost, nothing duplicated, offsets continuous.

use std::io::Write;
use std::path::{Path, PathBuf};

use bytes::Bytes;

use crate::store::{OutputStore, Stream, aad, chunk_name, parse_chunk_name};
use hangar_keys::{AttemptKey, SealError};

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("spool {path}: {source}")]
    Spool {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    #[error(transparent)]
    Seal(#[from] SealError),
    #[error("chunk at offset {got} leaves a gap: the output is stored up to {expected}")]
    Gap { expected: u64, got: u64 },
}

pub struct OutputWriter {
    store: OutputStore,
    spool: PathBuf,
    session: String,
    command: u32,
    attempt: u32,
    key: AttemptKey,
    offset: u64,
    /// An upload failed and the spool is not sent again yet: the store has
    /// a gap until it is.
    unsent: bool,
}

impl OutputWriter {
    /// Opens a command's output for `attempt`: uploads anything left in the
    /// spool, and continues after the last stored or spooled byte.
    pub async fn open(
        store: OutputStore,
        spool_root: PathBuf,
        session: &str,
        command: u32,
        attempt: u32,
        key: AttemptKey,
    ) -> Result<Self, WriteError> {
        let spool = spool_dir(&spool_root, session, command);
        std::fs::create_dir_all(&spool).map_err(|source| WriteError::Spool { path: spool.clone(), source })?;
        let spooled_end = resend_dir(&store, &spool, session, command).await?;
        let mut w = Self { store, spool, session: session.to_owned(), command, attempt, key, offset: 0, unsent: false };
        let stored_end = w.store.stored_end(&w.session, command).await?;
        w.offset = stored_end.max(spooled_end);
        Ok(w)
    }

    /// The offset after the last chunk written.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Makes sure every chunk written is in the store: after a failed
    /// upload, sends everything still spooled again, in order (a command's
    /// final status is written only after its output is stored).
    pub async fn flush(&mut self) -> Result<(), WriteError> {
        if self.unsent {
            tracing::warn!(command = self.command, "an upload failed; sending the spool again");
            resend_dir(&self.store, &self.spool, &self.session, self.command).await?;
            self.unsent = false;
        }
        Ok(())
    }

    /// Appends one chunk; returns the offset after it.
    pub async fn append(&mut self, stream: Stream, bytes: &[u8]) -> Result<u64, WriteError> {
        self.append_owned(stream, bytes.to_vec()).await
    }

    /// As `append`, sealing the buffer in place (one copy of the chunk in
    /// memory, whatever its size). Returns once the chunk is spooled (on
    /// disk, fsync'd) and stored. (Uploading it while the next chunk is
    /// sealed was measured: 7% faster for 11 MiB more worker memory, too
    /// close to the worker's 64 MiB budget.)
    pub async fn append_owned(&mut self, stream: Stream, bytes: Vec<u8>) -> Result<u64, WriteError> {
        if bytes.is_empty() {
            return Ok(self.offset);
        }
        // A gap an earlier failed upload left is closed first.
        self.flush().await?;
        let len = bytes.len() as u64;
        let sealed =
            self.key.seal_owned(self.command, self.offset, &aad(&self.session, self.command, stream), bytes)?;
        let name = chunk_name(stream, self.offset, self.attempt);
        let path = self.spool.join(&name);
        write_synced(&path, &sealed).map_err(|source| WriteError::Spool { path: path.clone(), source })?;
        self.offset += len;
        if let Err(e) = upload(&self.store, &self.spool, &self.session, self.command, &name, Bytes::from(sealed)).await
        {
            // Spooled: sent again by the next write or flush, or by the
            // next worker.
            self.unsent = true;
            return Err(e);
        }
        Ok(self.offset)
    }

    /// Writes the chunk whose first byte is at `offset`: the part already
    /// stored (a chunk delivered again after a restart) is skipped, so
    /// writing the same chunk twice stores it once.
    pub async fn write_at(&mut self, stream: Stream, offset: u64, mut bytes: Vec<u8>) -> Result<u64, WriteError> {
        if offset > self.offset {
            return Err(WriteError::Gap { expected: self.offset, got: offset });
        }
        let skip = (self.offset - offset) as usize;
        if skip >= bytes.len() {
            return Ok(self.offset);
        }
        bytes.drain(..skip);
        self.append_owned(stream, bytes).await
    }

    /// Test hook: spools a chunk and "crashes" before uploading it.
    #[doc(hidden)]
    pub fn append_spooled_only(&mut self, stream: Stream, bytes: &[u8]) -> Result<u64, WriteError> {
        let sealed = self.key.seal(self.command, self.offset, &aad(&self.session, self.command, stream), bytes)?;
        let path = self.spool.join(chunk_name(stream, self.offset, self.attempt));
        write_synced(&path, &sealed).map_err(|source| WriteError::Spool { path, source })?;
        self.offset += bytes.len() as u64;
        Ok(self.offset)
    }
}

/// Uploads what a previous worker spooled but did not upload, for every
/// command of `session` (at start, before any command is opened). The
/// chunks are sent as they are: sealed already, no key needed.
pub async fn resend_spooled(store: &OutputStore, spool_root: &Path, session: &str) -> Result<(), WriteError> {
    let dir = spool_root.join(session);
    let Ok(entries) = std::fs::read_dir(&dir) else { return Ok(()) };
    for e in entries.flatten() {
        let name = e.file_name();
        if let Some(command) = name.to_str().and_then(|n| n.strip_prefix("cmd-")).and_then(|n| n.parse().ok()) {
            resend_dir(store, &e.path(), session, command).await?;
        }
    }
    Ok(())
}

fn spool_dir(spool_root: &Path, session: &str, command: u32) -> PathBuf {
    spool_root.join(session).join(format!("cmd-{command}"))
}

/// Uploads every chunk spooled in `spool`; returns the end offset they reach.
async fn resend_dir(store: &OutputStore, spool: &Path, session: &str, command: u32) -> Result<u64, WriteError> {
    let mut names: Vec<String> = std::fs::read_dir(spool)
        .map_err(|source| WriteError::Spool { path: spool.to_path_buf(), source })?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| parse_chunk_name(n).is_some())
        .collect();
    names.sort();
    let mut end = 0;
    for name in names {
        let path = spool.join(&name);
        let sealed = std::fs::read(&path).map_err(|source| WriteError::Spool { path: path.clone(), source })?;
        let (offset, _, _) = parse_chunk_name(&name).expect("filtered");
        end = end.max(offset + sealed.len() as u64 - 16);
        tracing::info!(chunk = %name, "re-sending a spooled chunk");
        upload(store, spool, session, command, &name, Bytes::from(sealed)).await?;
    }
    Ok(end)
}

/// Puts a sealed chunk in the store, then drops it from the spool.
async fn upload(
    store: &OutputStore,
    spool: &Path,
    session: &str,
    command: u32,
    name: &str,
    sealed: Bytes,
) -> Result<(), WriteError> {
    store.put(session, command, name, sealed).await?;
    let path = spool.join(name);
    std::fs::remove_file(&path).map_err(|source| WriteError::Spool { path, source })
}

fn write_synced(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

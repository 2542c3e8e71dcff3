//! Where chunks live and how a reader gets the bytes past an offset.
//!
//! One object per chunk, named so a listing alone says what each holds:
//! `<session>/cmd/<n>/<offset, 20 digits>-<stream>-<attempt>`. The names
//! sort by offset, and a chunk's length is its size less the 16-byte tag.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use hangar_keys::{AttemptKey, SealError};

const TAG_LEN: u64 = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "stdout" => Some(Stream::Stdout),
            "stderr" => Some(Stream::Stderr),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    pub stream: Stream,
    pub offset: u64,
    pub data: Bytes,
}

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The attempt's key is destroyed (retention over): `sandbox_output_erased`.
    #[error("the output of attempt {0} is erased")]
    Erased(u32),
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    #[error("chunk {0}: {1}")]
    Seal(String, SealError),
}

/// What one read gives: the chunks, and whether more stored chunks follow
/// them (the read stopped at its size cap). A reader may call the output
/// final only on a page with nothing more after it.
#[derive(Clone, Debug, Default)]
pub struct Page {
    pub chunks: Vec<Chunk>,
    pub more: bool,
}

/// A chunk as listed: where it is and what it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub path: Path,
    pub offset: u64,
    pub len: u64,
    pub stream: Stream,
    pub attempt: u32,
}

pub(crate) fn chunk_name(stream: Stream, offset: u64, attempt: u32) -> String {
    format!("{offset:020}-{}-{attempt}", stream.as_str())
}

pub(crate) fn parse_chunk_name(name: &str) -> Option<(u64, Stream, u32)> {
    let mut parts = name.splitn(3, '-');
    let offset = parts.next()?.parse().ok()?;
    let stream = Stream::parse(parts.next()?)?;
    let attempt = parts.next()?.parse().ok()?;
    Some((offset, stream, attempt))
}

/// Associated data every chunk is sealed with.
pub(crate) fn aad(session: &str, command: u32, stream: Stream) -> Vec<u8> {
    format!("{session}/cmd/{command}/{}", stream.as_str()).into_bytes()
}

#[derive(Clone)]
pub struct OutputStore {
    store: Arc<dyn ObjectStore>,
    listed: Arc<Mutex<Listed>>,
}

/// Per command, the chunks already listed from offset 0 without a gap.
/// A stored chunk never changes, so the next listing of the command starts
/// after the last of them (S3's `start-after`) instead of from its first
/// chunk: a long-poll's follower and a reader paging through 1 GiB see
/// only what is new, not hundreds of objects per call.
#[derive(Default)]
struct Listed {
    commands: HashMap<(String, u32), Arc<Vec<Entry>>>,
    entries: usize,
}

/// The listing cache's bound (entries, ~150 bytes each); past it the cache
/// starts again empty.
const MAX_LISTED_ENTRIES: usize = 200_000;

impl OutputStore {
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        Self { store, listed: Arc::default() }
    }

    /// A local directory (the default outside production).
    pub fn local(dir: &std::path::Path) -> Result<Self, object_store::Error> {
        std::fs::create_dir_all(dir).map_err(|e| object_store::Error::Generic { store: "local", source: e.into() })?;
        Ok(Self::new(Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir)?)))
    }

    /// An S3 bucket; `endpoint` overrides AWS (moto in tests).
    pub fn s3(bucket: &str, region: &str, endpoint: Option<&str>) -> Result<Self, object_store::Error> {
        let mut b = object_store::aws::AmazonS3Builder::from_env().with_bucket_name(bucket).with_region(region);
        if let Some(e) = endpoint {
            b = b.with_endpoint(e).with_allow_http(true).with_virtual_hosted_style_request(false);
        }
        Ok(Self::new(Arc::new(b.build()?)))
    }

    /// `s3://bucket` (region and endpoint from the arguments, credentials
    /// from the AWS environment) or a local directory (`file:///dir` or a
    /// plain path).
    pub fn from_url(url: &str, region: &str, endpoint: Option<&str>) -> Result<Self, object_store::Error> {
        match url.strip_prefix("s3://") {
            Some(bucket) => Self::s3(bucket.trim_end_matches('/'), region, endpoint),
            None => Self::local(std::path::Path::new(url.strip_prefix("file://").unwrap_or(url))),
        }
    }

    fn certificate_path(session: &str) -> Path {
        Path::from(format!("{session}/certificate.json"))
    }

    /// Stores the session's signed certificate (replacing one a crashed
    /// pass stored before it could record it); its object key.
    pub async fn put_certificate(&self, session: &str, file: Vec<u8>) -> Result<String, object_store::Error> {
        let path = Self::certificate_path(session);
        self.store.put(&path, PutPayload::from(file)).await?;
        Ok(path.to_string())
    }

    /// The session's signed certificate, once there is one.
    pub async fn certificate(&self, session: &str) -> Result<Option<Bytes>, object_store::Error> {
        match self.store.get(&Self::certificate_path(session)).await {
            Ok(r) => Ok(Some(r.bytes().await?)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn prefix(session: &str, command: u32) -> Path {
        Path::from(format!("{session}/cmd/{command}"))
    }

    pub(crate) async fn put(
        &self,
        session: &str,
        command: u32,
        name: &str,
        sealed: Bytes,
    ) -> Result<(), object_store::Error> {
        let path = Self::prefix(session, command).join(name);
        self.store.put(&path, PutPayload::from_bytes(sealed)).await.map(|_| ())
    }

    /// The chunks of a command from offset 0 up to the first gap, in
    /// offset order (one chunk per offset). Lists only past what an earlier
    /// call found.
    pub(crate) async fn contiguous(&self, session: &str, command: u32) -> Result<Arc<Vec<Entry>>, object_store::Error> {
        let key = (session.to_owned(), command);
        let known =
            self.listed.lock().unwrap_or_else(|p| p.into_inner()).commands.get(&key).cloned().unwrap_or_default();
        let prefix = Self::prefix(session, command);
        let listing = match known.last() {
            Some(last) => self.store.list_with_offset(Some(&prefix), &last.path),
            None => self.store.list(Some(&prefix)),
        };
        let metas: Vec<_> = listing.try_collect().await?;
        let mut new: Vec<Entry> = metas
            .into_iter()
            .filter_map(|m| {
                let (offset, stream, attempt) = parse_chunk_name(m.location.filename()?)?;
                Some(Entry { offset, len: m.size.saturating_sub(TAG_LEN), stream, attempt, path: m.location })
            })
            .collect();
        new.sort_by_key(|e| e.offset);
        let mut end = known.last().map(|e| e.offset + e.len).unwrap_or(0);
        let mut grown = None;
        for e in new {
            // Another copy of a chunk already had (a re-send) is skipped.
            if e.offset < end {
                continue;
            }
            if e.offset > end {
                break;
            }
            end += e.len;
            grown.get_or_insert_with(|| known.as_ref().clone()).push(e);
        }
        let Some(grown) = grown else { return Ok(known) };
        let grown = Arc::new(grown);
        let mut listed = self.listed.lock().unwrap_or_else(|p| p.into_inner());
        if listed.entries + grown.len() > MAX_LISTED_ENTRIES {
            *listed = Listed::default();
        }
        let replaced = listed.commands.insert(key, grown.clone()).map_or(0, |old| old.len());
        listed.entries = listed.entries + grown.len() - replaced;
        Ok(grown)
    }

    /// How far the output is stored without a gap: a reader can read up to
    /// here (what attach reports per command).
    pub async fn stored_end(&self, session: &str, command: u32) -> Result<u64, object_store::Error> {
        Ok(self.contiguous(session, command).await?.last().map(|e| e.offset + e.len).unwrap_or(0))
    }

    /// The bytes past `after`, chunk by chunk, up to the first gap. `key`
    /// gives the key of an attempt, or `None` once it is destroyed.
    pub async fn read_after(
        &self,
        session: &str,
        command: u32,
        after: u64,
        key: &(dyn Fn(u32) -> Option<AttemptKey> + Sync),
    ) -> Result<Vec<Chunk>, ReadError> {
        Ok(self.read_after_at_most(session, command, after, u64::MAX, key).await?.chunks)
    }

    /// As `read_after`, stopping after the chunk that reaches `max_bytes`
    /// (a reader pages through long output with the next offset).
    pub async fn read_after_at_most(
        &self,
        session: &str,
        command: u32,
        after: u64,
        max_bytes: u64,
        key: &(dyn Fn(u32) -> Option<AttemptKey> + Sync),
    ) -> Result<Page, ReadError> {
        let entries = self.contiguous(session, command).await?;
        let mut out = Vec::new();
        let mut taken = 0u64;
        // The first chunk that holds bytes past `after` (they are in order).
        let first = entries.partition_point(|e| e.offset + e.len <= after);
        for e in &entries[first..] {
            if taken >= max_bytes {
                return Ok(Page { chunks: out, more: true });
            }
            taken += e.len;
            let k = key(e.attempt).ok_or(ReadError::Erased(e.attempt))?;
            let sealed = self.store.get(&e.path).await?.bytes().await?;
            let plain = k
                .open_owned(command, e.offset, &aad(session, command, e.stream), Vec::from(sealed))
                .map_err(|err| ReadError::Seal(e.path.to_string(), err))?;
            let skip = after.saturating_sub(e.offset) as usize;
            out.push(Chunk {
                stream: e.stream,
                offset: e.offset + skip as u64,
                data: Bytes::from(plain).slice(skip..),
            });
        }
        Ok(Page { chunks: out, more: false })
    }

    /// Raw sealed bytes of every chunk (tests check nothing is in the clear).
    pub async fn raw_objects(&self, session: &str, command: u32) -> Result<Vec<Bytes>, object_store::Error> {
        let metas: Vec<_> = self.store.list(Some(&Self::prefix(session, command))).try_collect().await?;
        let mut out = Vec::new();
        for m in metas {
            out.push(self.store.get(&m.location).await?.bytes().await?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_names_round_trip_and_sort_by_offset() {
        let a = chunk_name(Stream::Stdout, 5, 1);
        let b = chunk_name(Stream::Stderr, 40, 2);
        assert!(a < b);
        assert_eq!(parse_chunk_name(&a), Some((5, Stream::Stdout, 1)));
        assert_eq!(parse_chunk_name(&b), Some((40, Stream::Stderr, 2)));
        assert_eq!(parse_chunk_name("junk"), None);
    }

    /// A chunk of `len` bytes at `offset` (its object is `len` + the tag).
    async fn put(store: &OutputStore, offset: u64, len: usize, attempt: u32) {
        let name = chunk_name(Stream::Stdout, offset, attempt);
        store.put("s", 1, &name, Bytes::from(vec![0u8; len + TAG_LEN as usize])).await.expect("put");
    }

    #[tokio::test]
    async fn the_readable_run_stops_at_a_gap_and_grows_when_it_is_filled() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = OutputStore::local(dir.path()).expect("store");
        put(&store, 0, 5, 1).await;
        put(&store, 5, 3, 1).await;
        put(&store, 10, 2, 1).await;
        assert_eq!(store.stored_end("s", 1).await.expect("listed"), 8, "offset 8..10 is not stored yet");
        // Listed again from after the cached run: the gap filled, a re-sent
        // copy of a chunk already had (another attempt's name) skipped.
        put(&store, 8, 2, 1).await;
        put(&store, 5, 3, 2).await;
        let run = store.contiguous("s", 1).await.expect("listed");
        assert_eq!(run.iter().map(|e| (e.offset, e.len)).collect::<Vec<_>>(), [(0, 5), (5, 3), (8, 2), (10, 2)]);
        assert_eq!(store.stored_end("s", 1).await.expect("listed"), 12);
        assert_eq!(store.listed.lock().expect("cache").entries, 4);
    }
}

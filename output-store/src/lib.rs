//! Command output, as the contract describes it: one byte stream per
//! command, each chunk marked stdout or stderr, addressed by byte offset
//! from 0, sealed under a key made for the attempt that produced it, kept in
//! an object store (a local directory by default, S3 in production). Nothing
//! here talks to Kubernetes.
//!
//! - chunks are sealed by `hangar_keys::AttemptKey`: AES-256-GCM, the nonce
//!   derived from (command, offset), so a chunk sent twice is
//!   byte-identical (idempotent re-sends);
//! - `store`: object names and the reader (`read_after`);
//! - `writer`: the worker side, which spools each sealed chunk to local disk
//!   before uploading it, so a chunk survives a worker restart and is sent
//!   again, with offsets continuous and nothing lost or duplicated.

pub mod store;
pub mod writer;

pub use hangar_keys::{AttemptKey, KeyBytes, OrgKey, SealError, random_bytes};
pub use object_store::Error as StoreError;
pub use store::{Chunk, OutputStore, Page, ReadError, Stream};
pub use writer::{OutputWriter, WriteError, resend_spooled};

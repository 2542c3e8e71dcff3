//! hangar-keys: every key hangar makes and how it is sealed. No I/O: where
//! a key is kept (a Secret, a file on the node) is the caller's business.
//!
//! - `seal`: the organisation key ([`OrgKey`]), which seals other keys;
//!   the attempt key ([`AttemptKey`]), which seals command output chunks
//! - `session`: the 64-byte workspace key made for each session
//! - `proof`: a session token's proof of possession (`Hangar-Proof`)
//! - `token`: session tokens (`hgt_…`) and the digest kept of them
//! - `instance_identity`: the EC2 instance identity document's PKCS#7
//!   signature, checked against the regional certificate
//! - `template_signing`: Ed25519 signatures of template releases, the
//!   platform's trusted keys
//! - `session_certificate`: the signed session certificate file (Ed25519
//!   over canonical JSON)
//!
//! Raw key bytes are `zeroize::Zeroizing`: wiped from memory when dropped.

pub mod instance_identity;
pub mod proof;
pub mod seal;
pub mod session;
pub mod session_certificate;
pub mod template_signing;
pub mod token;

pub use seal::{AttemptKey, KeyBytes, OrgKey, SealError, random_bytes, random_key};

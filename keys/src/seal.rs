//! AES-256-GCM, twice:
//! - `AttemptKey` seals output chunks. The nonce is (command number ‖
//!   offset): unique for every chunk under one key, since an offset is
//!   written once per command and a key belongs to one attempt; and a chunk
//!   sealed twice is byte-identical, so re-sends are idempotent.
//! - `OrgKey` (the organisation key) seals other keys: session workspace
//!   keys and attempt output keys, with a random nonce stored in front and
//!   the owner (session, attempt) as associated data.

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use zeroize::Zeroizing;

/// Raw key bytes: wiped from memory when dropped. (ring's own key
/// schedules are not; they live only as long as the key object.)
pub type KeyBytes<const N: usize> = Zeroizing<[u8; N]>;

/// `N` random key bytes, wiped when dropped.
pub fn random_key<const N: usize>() -> Result<KeyBytes<N>, SealError> {
    let mut b = Zeroizing::new([0u8; N]);
    SystemRandom::new().fill(b.as_mut()).map_err(|_| SealError::Random)?;
    Ok(b)
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SealError {
    #[error("an attempt key must be 32 bytes, got {0}")]
    KeyLength(usize),
    #[error("the system random source failed")]
    Random,
    #[error("does not open with this key (tampered, or sealed for another owner or under another key)")]
    Open,
}

/// The key one attempt's output is sealed under.
pub struct AttemptKey {
    key: LessSafeKey,
}

fn aes_key(bytes: &[u8]) -> Result<LessSafeKey, SealError> {
    let unbound = UnboundKey::new(&AES_256_GCM, bytes).map_err(|_| SealError::KeyLength(bytes.len()))?;
    Ok(LessSafeKey::new(unbound))
}

/// `N` random bytes from the system source.
pub fn random_bytes<const N: usize>() -> Result<[u8; N], SealError> {
    let mut b = [0u8; N];
    SystemRandom::new().fill(&mut b).map_err(|_| SealError::Random)?;
    Ok(b)
}

impl AttemptKey {
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, SealError> {
        Ok(Self { key: aes_key(bytes)? })
    }

    pub fn generate() -> Result<KeyBytes<32>, SealError> {
        random_key()
    }

    fn nonce(command: u32, offset: u64) -> Nonce {
        let mut n = [0u8; 12];
        n[..4].copy_from_slice(&command.to_be_bytes());
        n[4..].copy_from_slice(&offset.to_be_bytes());
        Nonce::assume_unique_for_key(n)
    }

    /// `aad` binds the chunk to its session, command, stream and offset.
    pub fn seal(&self, command: u32, offset: u64, aad: &[u8], plain: &[u8]) -> Result<Vec<u8>, SealError> {
        self.seal_owned(command, offset, aad, plain.to_vec())
    }

    /// As `seal`, in the buffer it is given (no copy of a large chunk).
    pub fn seal_owned(&self, command: u32, offset: u64, aad: &[u8], mut buf: Vec<u8>) -> Result<Vec<u8>, SealError> {
        self.key
            .seal_in_place_append_tag(Self::nonce(command, offset), Aad::from(aad), &mut buf)
            .map_err(|_| SealError::Random)?;
        Ok(buf)
    }

    pub fn open(&self, command: u32, offset: u64, aad: &[u8], sealed: &[u8]) -> Result<Vec<u8>, SealError> {
        self.open_owned(command, offset, aad, sealed.to_vec())
    }

    /// As `open`, in the buffer it is given (no copy of a large chunk).
    pub fn open_owned(&self, command: u32, offset: u64, aad: &[u8], mut buf: Vec<u8>) -> Result<Vec<u8>, SealError> {
        let len = self
            .key
            .open_in_place(Self::nonce(command, offset), Aad::from(aad), &mut buf)
            .map_err(|_| SealError::Open)?
            .len();
        buf.truncate(len);
        Ok(buf)
    }
}

/// The organisation key, which seals other keys.
pub struct OrgKey {
    key: LessSafeKey,
}

impl OrgKey {
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, SealError> {
        Ok(Self { key: aes_key(bytes)? })
    }

    pub fn generate_bytes() -> Result<KeyBytes<32>, SealError> {
        random_key()
    }

    /// nonce ‖ ciphertext ‖ tag, bound to `context` (whose key it is) so a
    /// sealed key cannot be moved to another owner.
    pub fn seal(&self, plaintext: &[u8], context: &str) -> Result<Vec<u8>, SealError> {
        let nonce: [u8; NONCE_LEN] = random_bytes()?;
        // Sealed in place: the buffer holds ciphertext when it is returned.
        let mut buf = plaintext.to_vec();
        self.key
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(context.as_bytes()), &mut buf)
            .map_err(|_| SealError::Random)?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&buf);
        Ok(out)
    }

    /// The key sealed in `sealed`, wiped from memory when dropped.
    pub fn unseal(&self, sealed: &[u8], context: &str) -> Result<Zeroizing<Vec<u8>>, SealError> {
        if sealed.len() < NONCE_LEN {
            return Err(SealError::Open);
        }
        let (nonce, body) = sealed.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| SealError::Open)?;
        let mut buf = Zeroizing::new(body.to_vec());
        let len = self
            .key
            .open_in_place(nonce, Aad::from(context.as_bytes()), buf.as_mut_slice())
            .map_err(|_| SealError::Open)?
            .len();
        buf.truncate(len);
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealing_is_deterministic_per_position_and_bound_to_it() {
        let key = AttemptKey::from_bytes(AttemptKey::generate().unwrap().as_slice()).unwrap();
        let a = key.seal(1, 0, b"s/1/stdout", b"hello").unwrap();
        assert_eq!(a, key.seal(1, 0, b"s/1/stdout", b"hello").unwrap(), "a re-sent chunk is identical");
        assert_ne!(&a[..5], b"hello");
        assert_eq!(key.open(1, 0, b"s/1/stdout", &a).unwrap(), b"hello");
        assert_eq!(key.open(1, 5, b"s/1/stdout", &a), Err(SealError::Open), "moved to another offset");
        assert_eq!(key.open(1, 0, b"s/1/stderr", &a), Err(SealError::Open), "relabelled stream");
        let other = AttemptKey::from_bytes(AttemptKey::generate().unwrap().as_slice()).unwrap();
        assert_eq!(other.open(1, 0, b"s/1/stdout", &a), Err(SealError::Open));
    }

    #[test]
    fn sealed_keys_open_only_with_the_org_key_and_their_owner() {
        let org = OrgKey::from_bytes(OrgKey::generate_bytes().unwrap().as_slice()).unwrap();
        let key: [u8; 64] = random_bytes().unwrap();
        let sealed = org.seal(&key, "session-a").unwrap();
        assert!(!sealed.windows(16).any(|w| key.windows(16).any(|k| k == w)), "plaintext must not appear");
        assert_eq!(org.unseal(&sealed, "session-a").unwrap().as_slice(), key);
        assert_eq!(org.unseal(&sealed, "session-b"), Err(SealError::Open));
        let other = OrgKey::from_bytes(OrgKey::generate_bytes().unwrap().as_slice()).unwrap();
        assert_eq!(other.unseal(&sealed, "session-a"), Err(SealError::Open));
        assert!(matches!(OrgKey::from_bytes(&[0; 16]), Err(SealError::KeyLength(16))));
    }
}

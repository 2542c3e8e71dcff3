//! Sealing a chunk: AES-256-GCM under the attempt's key. The nonce is
//! (command number ‖ offset): unique for every chunk under one key, since an
//! offset is written once per command and a key belongs to one attempt.

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SealError {
    #[error("an attempt key must be 32 bytes, got {0}")]
    KeyLength(usize),
    #[error("the system random source failed")]
    Random,
    #[error("chunk does not open with this key (tampered, or another attempt's)")]
    Open,
}

/// The key one attempt's output is sealed under.
pub struct AttemptKey {
    key: LessSafeKey,
}

impl AttemptKey {
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, SealError> {
        let unbound = UnboundKey::new(&AES_256_GCM, bytes).map_err(|_| SealError::KeyLength(bytes.len()))?;
        Ok(Self { key: LessSafeKey::new(unbound) })
    }

    pub fn generate() -> Result<[u8; 32], SealError> {
        let mut b = [0u8; 32];
        SystemRandom::new().fill(&mut b).map_err(|_| SealError::Random)?;
        Ok(b)
    }

    fn nonce(command: u32, offset: u64) -> Nonce {
        let mut n = [0u8; 12];
        n[..4].copy_from_slice(&command.to_be_bytes());
        n[4..].copy_from_slice(&offset.to_be_bytes());
        Nonce::assume_unique_for_key(n)
    }

    /// `aad` binds the chunk to its session, command, stream and offset.
    pub fn seal(&self, command: u32, offset: u64, aad: &[u8], plain: &[u8]) -> Result<Vec<u8>, SealError> {
        let mut buf = plain.to_vec();
        self.key
            .seal_in_place_append_tag(Self::nonce(command, offset), Aad::from(aad), &mut buf)
            .map_err(|_| SealError::Random)?;
        Ok(buf)
    }

    pub fn open(&self, command: u32, offset: u64, aad: &[u8], sealed: &[u8]) -> Result<Vec<u8>, SealError> {
        let mut buf = sealed.to_vec();
        let plain = self
            .key
            .open_in_place(Self::nonce(command, offset), Aad::from(aad), &mut buf)
            .map_err(|_| SealError::Open)?;
        Ok(plain.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealing_is_deterministic_per_position_and_bound_to_it() {
        let key = AttemptKey::from_bytes(&AttemptKey::generate().unwrap()).unwrap();
        let a = key.seal(1, 0, b"s/1/stdout", b"hello").unwrap();
        assert_eq!(a, key.seal(1, 0, b"s/1/stdout", b"hello").unwrap(), "a re-sent chunk is identical");
        assert_ne!(&a[..5], b"hello");
        assert_eq!(key.open(1, 0, b"s/1/stdout", &a).unwrap(), b"hello");
        assert_eq!(key.open(1, 5, b"s/1/stdout", &a), Err(SealError::Open), "moved to another offset");
        assert_eq!(key.open(1, 0, b"s/1/stderr", &a), Err(SealError::Open), "relabelled stream");
        let other = AttemptKey::from_bytes(&AttemptKey::generate().unwrap()).unwrap();
        assert_eq!(other.open(1, 0, b"s/1/stdout", &a), Err(SealError::Open));
    }
}

//! Session keys: 64 random bytes per session (the workspace encryption
//! key), sealed with AES-256-GCM under the organisation key and kept in a
//! Secret in the operator's namespace. Destroying the Secret destroys the
//! key: the sealed bytes alone open nothing.

use base64::Engine;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

pub const SESSION_KEY_LEN: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("the organisation key must be 32 bytes, got {0}")]
    OrgKeyLength(usize),
    #[error("the system random source failed")]
    Random,
    #[error("sealed key is malformed or was sealed under another key")]
    Unseal,
}

pub struct OrgKey {
    key: LessSafeKey,
}

impl OrgKey {
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, KeyError> {
        let unbound = UnboundKey::new(&AES_256_GCM, bytes).map_err(|_| KeyError::OrgKeyLength(bytes.len()))?;
        Ok(Self { key: LessSafeKey::new(unbound) })
    }

    pub fn generate_bytes() -> Result<[u8; 32], KeyError> {
        let mut b = [0u8; 32];
        SystemRandom::new().fill(&mut b).map_err(|_| KeyError::Random)?;
        Ok(b)
    }

    /// nonce ‖ ciphertext ‖ tag, bound to `context` (the session id) so a
    /// sealed key cannot be moved to another session.
    pub fn seal(&self, plaintext: &[u8], context: &str) -> Result<Vec<u8>, KeyError> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new().fill(&mut nonce).map_err(|_| KeyError::Random)?;
        let mut buf = plaintext.to_vec();
        self.key
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(context.as_bytes()), &mut buf)
            .map_err(|_| KeyError::Random)?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&buf);
        Ok(out)
    }

    pub fn unseal(&self, sealed: &[u8], context: &str) -> Result<Vec<u8>, KeyError> {
        if sealed.len() < NONCE_LEN {
            return Err(KeyError::Unseal);
        }
        let (nonce, body) = sealed.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| KeyError::Unseal)?;
        let mut buf = body.to_vec();
        let plain = self.key.open_in_place(nonce, Aad::from(context.as_bytes()), &mut buf).map_err(|_| KeyError::Unseal)?;
        Ok(plain.to_vec())
    }
}

pub fn new_session_key() -> Result<[u8; SESSION_KEY_LEN], KeyError> {
    let mut k = [0u8; SESSION_KEY_LEN];
    SystemRandom::new().fill(&mut k).map_err(|_| KeyError::Random)?;
    Ok(k)
}

pub fn secret_name(session_id: &str) -> String {
    format!("hangar-session-key-{session_id}")
}

pub fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_keys_open_only_with_the_org_key_and_their_session() {
        let org = OrgKey::from_bytes(&OrgKey::generate_bytes().unwrap()).unwrap();
        let key = new_session_key().unwrap();
        let sealed = org.seal(&key, "session-a").unwrap();
        assert!(!sealed.windows(16).any(|w| key.windows(16).any(|k| k == w)), "plaintext must not appear");
        assert_eq!(org.unseal(&sealed, "session-a").unwrap(), key);
        assert!(matches!(org.unseal(&sealed, "session-b"), Err(KeyError::Unseal)));
        let other = OrgKey::from_bytes(&OrgKey::generate_bytes().unwrap()).unwrap();
        assert!(matches!(other.unseal(&sealed, "session-a"), Err(KeyError::Unseal)));
        assert!(matches!(OrgKey::from_bytes(&[0; 16]), Err(KeyError::OrgKeyLength(16))));
    }
}

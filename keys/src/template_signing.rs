//! Template releases are signed with Ed25519 (ring). The platform trusts a
//! set of named public keys; a template names the key that signed it
//! (`spec.signedBy`) and carries the signature over its release payload
//! (`hangar_core::templates::signing_payload`).
//!
//! Keys as text: a public key is the base64 of its 32 bytes; a signing key
//! is the base64 of its PKCS#8 document (what `generate` returns).

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair, UnparsedPublicKey};
use zeroize::Zeroizing;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SigningError {
    #[error("the key {0} is not a base64 Ed25519 public key of 32 bytes")]
    BadPublicKey(String),
    #[error("the signing key is not a base64 Ed25519 PKCS#8 document")]
    BadSigningKey,
    #[error("could not make a key")]
    Random,
}

/// Why a signature does not check out (the template's status says it).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Rejection {
    #[error("names key {0}, which the platform does not trust")]
    UnknownKey(String),
    #[error("is not base64")]
    NotBase64,
    #[error("does not verify under key {0}")]
    DoesNotVerify(String),
}

/// The public keys the platform trusts, by name.
#[derive(Clone, Debug, Default)]
pub struct TrustedKeys(BTreeMap<String, Vec<u8>>);

impl TrustedKeys {
    /// From `(name, base64 public key)` pairs.
    pub fn from_pairs(pairs: &[(String, String)]) -> Result<Self, SigningError> {
        let mut keys = BTreeMap::new();
        for (name, b64) in pairs {
            let bytes = STANDARD.decode(b64.trim()).map_err(|_| SigningError::BadPublicKey(name.clone()))?;
            if bytes.len() != 32 {
                return Err(SigningError::BadPublicKey(name.clone()));
            }
            keys.insert(name.clone(), bytes);
        }
        Ok(Self(keys))
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }

    /// Checks `signature` (base64) over `payload` under the key `signed_by`.
    pub fn verify(&self, signed_by: &str, payload: &[u8], signature: &str) -> Result<(), Rejection> {
        let key = self.0.get(signed_by).ok_or_else(|| Rejection::UnknownKey(signed_by.to_owned()))?;
        let sig = STANDARD.decode(signature.trim()).map_err(|_| Rejection::NotBase64)?;
        UnparsedPublicKey::new(&ED25519, key)
            .verify(payload, &sig)
            .map_err(|_| Rejection::DoesNotVerify(signed_by.to_owned()))
    }
}

/// A new signing key: (base64 PKCS#8 to keep secret, base64 public key to
/// trust).
pub fn generate() -> Result<(Zeroizing<String>, String), SigningError> {
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).map_err(|_| SigningError::Random)?;
    let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).map_err(|_| SigningError::Random)?;
    Ok((Zeroizing::new(STANDARD.encode(pkcs8.as_ref())), STANDARD.encode(pair.public_key().as_ref())))
}

/// Signs `payload` with the signing key (base64 PKCS#8); base64 signature.
pub fn sign(signing_key: &str, payload: &[u8]) -> Result<String, SigningError> {
    let der = Zeroizing::new(STANDARD.decode(signing_key.trim()).map_err(|_| SigningError::BadSigningKey)?);
    // v1 (openssl genpkey) or v2 (ring) PKCS#8: a v2 public key is checked.
    let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der).map_err(|_| SigningError::BadSigningKey)?;
    Ok(STANDARD.encode(pair.sign(payload).as_ref()))
}

/// The public key (base64) of a signing key.
pub fn public_key(signing_key: &str) -> Result<String, SigningError> {
    let der = Zeroizing::new(STANDARD.decode(signing_key.trim()).map_err(|_| SigningError::BadSigningKey)?);
    // v1 (openssl genpkey) or v2 (ring) PKCS#8: a v2 public key is checked.
    let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der).map_err(|_| SigningError::BadSigningKey)?;
    Ok(STANDARD.encode(pair.public_key().as_ref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_only_under_its_key_and_payload() {
        let (secret, public) = generate().unwrap();
        let (other_secret, other_public) = generate().unwrap();
        assert_eq!(public_key(&secret).unwrap(), public);
        let keys = TrustedKeys::from_pairs(&[("release".into(), public), ("other".into(), other_public)]).unwrap();
        let sig = sign(&secret, b"payload").unwrap();
        assert_eq!(keys.verify("release", b"payload", &sig), Ok(()));
        assert_eq!(keys.verify("release", b"payload!", &sig), Err(Rejection::DoesNotVerify("release".into())));
        assert_eq!(keys.verify("other", b"payload", &sig), Err(Rejection::DoesNotVerify("other".into())));
        assert_eq!(keys.verify("nobody", b"payload", &sig), Err(Rejection::UnknownKey("nobody".into())));
        assert_eq!(keys.verify("release", b"payload", "%%%"), Err(Rejection::NotBase64));
        let forged = sign(&other_secret, b"payload").unwrap();
        assert!(keys.verify("release", b"payload", &forged).is_err());
        assert!(TrustedKeys::from_pairs(&[("short".into(), STANDARD.encode([1u8; 31]))]).is_err());
    }
}

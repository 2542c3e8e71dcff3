//! The signed session certificate as a file: canonical JSON (RFC 8785,
//! JCS) of `{"certificate": …, "signature": {"alg", "keyId", "value"}}`,
//! where `value` is the Ed25519 signature (base64) of [`DOMAIN`] followed
//! by the JCS bytes of the same document without `value` (so the key id
//! and algorithm are signed too). The file itself must be canonical,
//! so any changed byte either changes what is signed or makes the file
//! non-canonical: both are refused.

use serde_json::{Value, json};

use crate::template_signing::{self, Rejection, SigningError, TrustedKeys};

/// Signed before the certificate's bytes, so no signature over another
/// kind of hangar document can pass for a certificate's.
pub const DOMAIN: &[u8] = b"hangar.dev/session-certificate/v1\n";

pub const ALGORITHM: &str = "Ed25519";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CertificateRejection {
    #[error("not JSON: {0}")]
    NotJson(String),
    #[error("not in canonical form (RFC 8785): the file was changed")]
    NotCanonical,
    #[error("has no {0}")]
    Missing(&'static str),
    #[error("is signed with {0}, not Ed25519")]
    Algorithm(String),
    #[error("signature {0}")]
    Signature(#[from] Rejection),
}

fn canonical(value: &Value) -> Vec<u8> {
    // A serde_json::Value always serialises; numbers are integers here.
    serde_json_canonicalizer::to_vec(value).unwrap_or_default()
}

fn signed_bytes(certificate: &Value, key_id: &str) -> Vec<u8> {
    let unsigned = json!({"certificate": certificate, "signature": {"alg": ALGORITHM, "keyId": key_id}});
    [DOMAIN, &canonical(&unsigned)].concat()
}

/// The certificate file for `certificate`, signed with `signing_key`
/// (base64 PKCS#8) under the id `key_id`.
pub fn sign(certificate: &Value, signing_key: &str, key_id: &str) -> Result<Vec<u8>, SigningError> {
    let value = template_signing::sign(signing_key, &signed_bytes(certificate, key_id))?;
    let file = json!({
        "certificate": certificate,
        "signature": {"alg": ALGORITHM, "keyId": key_id, "value": value},
    });
    Ok(canonical(&file))
}

/// The key id a certificate file names (to pick the public key to check it
/// with).
pub fn key_id(file: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(file).ok()?;
    v.pointer("/signature/keyId")?.as_str().map(str::to_owned)
}

/// Checks a certificate file under `public_key` (base64 of its 32 bytes);
/// the certificate it signs.
pub fn verify(file: &[u8], public_key: &str) -> Result<Value, CertificateRejection> {
    let v: Value = serde_json::from_slice(file).map_err(|e| CertificateRejection::NotJson(e.to_string()))?;
    if canonical(&v) != file {
        return Err(CertificateRejection::NotCanonical);
    }
    let certificate = v.get("certificate").ok_or(CertificateRejection::Missing("certificate"))?;
    let signature = v.get("signature").ok_or(CertificateRejection::Missing("signature"))?;
    let field =
        |name: &'static str| signature.get(name).and_then(Value::as_str).ok_or(CertificateRejection::Missing(name));
    let alg = field("alg")?;
    if alg != ALGORITHM {
        return Err(CertificateRejection::Algorithm(alg.to_owned()));
    }
    let key_id = field("keyId")?;
    let keys = TrustedKeys::from_pairs(&[(key_id.to_owned(), public_key.to_owned())])
        .map_err(|_| Rejection::UnknownKey(key_id.to_owned()))?;
    keys.verify(key_id, &signed_bytes(certificate, key_id), field("value")?)?;
    Ok(certificate.clone())
}

/// `sha256:<hex>` of a certificate file (its digest in the Sandbox status).
pub fn digest(file: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, file);
    let hex: String = d.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn certificate() -> Value {
        json!({"format": "hangar.dev/session-certificate/v1", "sessionId": "u-1",
               "jobs": [{"jobId": "u-1/cmd/1", "outcome": "completed", "exitCode": 0}],
               "start": {"tenant": "acme", "note": "é ✓"}})
    }

    #[test]
    fn every_changed_byte_is_refused() {
        let (secret, public) = template_signing::generate().unwrap();
        let file = sign(&certificate(), &secret, "k1").unwrap();
        assert_eq!(verify(&file, &public).unwrap(), certificate());
        assert_eq!(key_id(&file).as_deref(), Some("k1"));
        for i in 0..file.len() {
            for delta in [1u8, 0x20, 0x80] {
                let mut changed = file.clone();
                changed[i] = changed[i].wrapping_add(delta);
                assert!(
                    verify(&changed, &public).is_err(),
                    "byte {i} + {delta} still verifies: {}",
                    String::from_utf8_lossy(&changed)
                );
            }
        }
    }

    #[test]
    fn another_key_or_a_reformatted_file_is_refused() {
        let (secret, _) = template_signing::generate().unwrap();
        let (_, other) = template_signing::generate().unwrap();
        let file = sign(&certificate(), &secret, "k1").unwrap();
        assert!(matches!(verify(&file, &other), Err(CertificateRejection::Signature(_))));
        let pretty = serde_json::to_vec_pretty(&serde_json::from_slice::<Value>(&file).unwrap()).unwrap();
        assert_eq!(verify(&pretty, &other), Err(CertificateRejection::NotCanonical));
        assert!(matches!(verify(b"{", &other), Err(CertificateRejection::NotJson(_))));
    }
}

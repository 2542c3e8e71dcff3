//! The EC2 instance identity document's `rsa2048` signature: a PKCS#7
//! (CMS) SignedData by the region's AWS certificate, SHA-256 with RSA. The
//! certificate is not in the message: the platform configures it (AWS
//! publishes one per region; the tests configure a test CA's), and it is
//! the only key a document is checked against. Verification only: the
//! private key is AWS's.
//!
//! The document travels beside its signature (as IMDS serves them); when
//! the SignedData carries the content as well, the two must be the same
//! bytes, so a document can never be swapped under a valid signature.

use base64::Engine;
use cms::content_info::ContentInfo;
use cms::signed_data::{SignedData, SignerIdentifier};
use der::asn1::{ObjectIdentifier, OctetString};
use der::{Decode, DecodePem, Encode};
use rsa::pkcs1v15::{Signature, VerifyingKey};
use rsa::pkcs8::DecodePublicKey;
use rsa::signature::Verifier;
use sha2::{Digest, Sha256};
use x509_cert::Certificate;

const ID_SIGNED_DATA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.7.2");
const ID_DATA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.7.1");
const ID_SHA256: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.16.840.1.101.3.4.2.1");
const ID_RSA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.1");
const ID_SHA256_WITH_RSA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.11");
const ID_CONTENT_TYPE: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.9.3");
const ID_MESSAGE_DIGEST: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.9.4");

/// Why a document's signature is not accepted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IdentityError {
    #[error("the regional certificate is not a PEM X.509 certificate with an RSA key")]
    Certificate,
    #[error("the signature is not base64 DER")]
    Encoding,
    #[error("the signature is not a CMS SignedData with exactly one signer")]
    NotSignedData,
    #[error("the signature uses {0}, not SHA-256 with RSA")]
    Unsupported(&'static str),
    #[error("the signed content is not the document sent")]
    ContentMismatch,
    #[error("the signed digest is not the document's")]
    DigestMismatch,
    #[error("signed by a certificate other than the regional one")]
    OtherSigner,
    #[error("the signature does not verify under the regional certificate")]
    BadSignature,
}

/// The region's certificate: the one key identity documents are checked
/// against.
#[derive(Clone, Debug)]
pub struct RegionalCertificate {
    key: VerifyingKey<Sha256>,
    issuer: Vec<u8>,
    serial: Vec<u8>,
}

impl RegionalCertificate {
    pub fn from_pem(pem: &str) -> Result<Self, IdentityError> {
        let cert = Certificate::from_pem(pem.trim().as_bytes()).map_err(|_| IdentityError::Certificate)?;
        let tbs = &cert.tbs_certificate;
        let spki = tbs.subject_public_key_info.to_der().map_err(|_| IdentityError::Certificate)?;
        let public = rsa::RsaPublicKey::from_public_key_der(&spki).map_err(|_| IdentityError::Certificate)?;
        Ok(Self {
            key: VerifyingKey::new(public),
            issuer: tbs.issuer.to_der().map_err(|_| IdentityError::Certificate)?,
            serial: tbs.serial_number.as_bytes().to_vec(),
        })
    }
}

/// Checks that `signature_b64` (IMDS's `rsa2048`, base64 of DER; line
/// breaks allowed) is the regional certificate's signature of `document`.
pub fn verify(cert: &RegionalCertificate, document: &[u8], signature_b64: &str) -> Result<(), IdentityError> {
    let compact: String = signature_b64.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    let der = base64::engine::general_purpose::STANDARD.decode(compact).map_err(|_| IdentityError::Encoding)?;
    let info = ContentInfo::from_der(&der).map_err(|_| IdentityError::Encoding)?;
    if info.content_type != ID_SIGNED_DATA {
        return Err(IdentityError::NotSignedData);
    }
    let signed: SignedData = info.content.decode_as().map_err(|_| IdentityError::NotSignedData)?;
    let mut signers = signed.signer_infos.0.iter();
    let (Some(signer), None) = (signers.next(), signers.next()) else {
        return Err(IdentityError::NotSignedData);
    };
    if let Some(content) = &signed.encap_content_info.econtent {
        let content: OctetString = content.decode_as().map_err(|_| IdentityError::NotSignedData)?;
        if content.as_bytes() != document {
            return Err(IdentityError::ContentMismatch);
        }
    }
    if signer.digest_alg.oid != ID_SHA256 {
        return Err(IdentityError::Unsupported("a digest other than SHA-256"));
    }
    if ![ID_RSA, ID_SHA256_WITH_RSA].contains(&signer.signature_algorithm.oid) {
        return Err(IdentityError::Unsupported("a signature other than RSA PKCS#1 v1.5"));
    }
    match &signer.sid {
        SignerIdentifier::IssuerAndSerialNumber(id) => {
            let issuer = id.issuer.to_der().map_err(|_| IdentityError::NotSignedData)?;
            if issuer != cert.issuer || id.serial_number.as_bytes() != cert.serial {
                return Err(IdentityError::OtherSigner);
            }
        }
        // Named by key identifier: only the signature itself can tell.
        SignerIdentifier::SubjectKeyIdentifier(_) => {}
    }
    let signature = Signature::try_from(signer.signature.as_bytes()).map_err(|_| IdentityError::BadSignature)?;
    let digest = Sha256::digest(document);
    let signed_bytes = match &signer.signed_attrs {
        // With signed attributes (as AWS signs), the signature covers them
        // (DER, as a SET), and they carry the content's digest and type.
        Some(attrs) => {
            let attr = |oid| attrs.iter().find(|a| a.oid == oid).and_then(|a| a.values.get(0));
            let message_digest: OctetString = attr(ID_MESSAGE_DIGEST)
                .ok_or(IdentityError::NotSignedData)?
                .decode_as()
                .map_err(|_| IdentityError::NotSignedData)?;
            if message_digest.as_bytes() != digest.as_slice() {
                return Err(IdentityError::DigestMismatch);
            }
            let content_type: ObjectIdentifier = attr(ID_CONTENT_TYPE)
                .ok_or(IdentityError::NotSignedData)?
                .decode_as()
                .map_err(|_| IdentityError::NotSignedData)?;
            if content_type != ID_DATA {
                return Err(IdentityError::NotSignedData);
            }
            attrs.to_der().map_err(|_| IdentityError::NotSignedData)?
        }
        None => document.to_vec(),
    };
    cert.key.verify(&signed_bytes, &signature).map_err(|_| IdentityError::BadSignature)
}

#[cfg(test)]
mod tests {
    //! Fixtures made once with `openssl cms -sign -binary -nodetach -md
    //! sha256 -nocerts` (another implementation than the one checked).
    use super::*;

    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/instance_identity");

    fn read(name: &str) -> String {
        std::fs::read_to_string(format!("{FIXTURES}/{name}")).expect("fixture")
    }

    fn regional() -> RegionalCertificate {
        RegionalCertificate::from_pem(&read("regional.crt")).expect("the regional certificate")
    }

    #[test]
    fn a_document_signed_by_the_regional_certificate_verifies() {
        assert_eq!(verify(&regional(), read("document.json").as_bytes(), &read("document.rsa2048")), Ok(()));
    }

    #[test]
    fn line_breaks_in_the_base64_are_allowed() {
        let wrapped: String = read("document.rsa2048")
            .as_bytes()
            .chunks(64)
            .map(|c| format!("{}\n", std::str::from_utf8(c).expect("ascii")))
            .collect();
        assert_eq!(verify(&regional(), read("document.json").as_bytes(), &wrapped), Ok(()));
    }

    #[test]
    fn a_changed_document_is_refused() {
        let doc = read("document.json").replace("i-0123456789abcdef0", "i-0fedcba9876543210");
        assert_eq!(verify(&regional(), doc.as_bytes(), &read("document.rsa2048")), Err(IdentityError::ContentMismatch));
    }

    #[test]
    fn a_signature_by_another_certificate_is_refused() {
        let r = verify(&regional(), read("document.json").as_bytes(), &read("document.other-signer.rsa2048"));
        assert_eq!(r, Err(IdentityError::OtherSigner));
        // Even had it named the regional certificate, its key is not that one.
        let other = RegionalCertificate::from_pem(&read("other.crt")).expect("other");
        assert_eq!(
            verify(&other, read("document.json").as_bytes(), &read("document.rsa2048")),
            Err(IdentityError::OtherSigner)
        );
    }

    #[test]
    fn a_flipped_signature_byte_is_refused() {
        let mut der = base64::engine::general_purpose::STANDARD.decode(read("document.rsa2048")).expect("b64");
        let last = der.len() - 1;
        der[last] ^= 1;
        let tampered = base64::engine::general_purpose::STANDARD.encode(der);
        let r = verify(&regional(), read("document.json").as_bytes(), &tampered);
        assert_eq!(r, Err(IdentityError::BadSignature));
    }

    #[test]
    fn garbage_is_refused_as_encoding() {
        assert_eq!(verify(&regional(), b"{}", "not base64!"), Err(IdentityError::Encoding));
        assert_eq!(verify(&regional(), b"{}", "AAAA"), Err(IdentityError::Encoding));
        assert!(RegionalCertificate::from_pem("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----").is_err());
    }
}

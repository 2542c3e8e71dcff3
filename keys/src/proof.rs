//! Proof of possession for session tokens (after RFC 9449, DPoP): every
//! request carries `Hangar-Proof`, a compact JWS signed with ES256 by the
//! P-256 key the token is bound to. Its claims tie it to this request and
//! this token:
//!
//! - `htm`: the request's method; `htu`: its URL (no query, no fragment);
//! - `iat`: when it was made, within ±60 s of now;
//! - `jti`: single use (the caller keeps the seen ones, see
//!   [`ReplayWindow`]: a proof older than the window is refused anyway);
//! - `ath`: base64url SHA-256 of the token.
//!
//! Only `alg: ES256` is accepted (never `none`, never an HMAC, whatever the
//! header says); the signature is checked by `ring`. A proof is at most
//! [`MAX_PROOF_BYTES`]: nothing larger is even decoded.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::signature::{ECDSA_P256_SHA256_FIXED, UnparsedPublicKey};
use serde::Deserialize;

/// How far `iat` may be from now, either way.
pub const SKEW_SECONDS: i64 = 60;
/// A proof is never longer than this (a real one is ~400 bytes).
pub const MAX_PROOF_BYTES: usize = 4096;
/// A `jti` is 1–128 characters.
pub const MAX_JTI_CHARS: usize = 128;

/// Why a proof is refused. Every case is `token_invalid` to the caller; the
/// kind is for logs and tests.
#[derive(Debug, thiserror::Error, PartialEq, Eq, Clone, Copy)]
pub enum ProofError {
    #[error("no Hangar-Proof header")]
    Missing,
    #[error("the proof is not a compact JWS")]
    Malformed,
    #[error("the proof's algorithm is not ES256")]
    Algorithm,
    #[error("the token's public key is not a P-256 JWK")]
    Key,
    #[error("the proof's signature does not verify")]
    Signature,
    #[error("the proof is for another method")]
    Method,
    #[error("the proof is for another URL")]
    Url,
    #[error("the proof was made more than 60 s from now")]
    Time,
    #[error("the proof is for another token")]
    TokenHash,
    #[error("the proof's jti is missing or too long")]
    Jti,
    #[error("the proof's jti was seen before")]
    Replayed,
}

/// The token's key: the JWK's coordinates.
#[derive(Clone, Copy, Debug)]
pub struct PublicKey<'a> {
    pub kty: &'a str,
    pub crv: &'a str,
    pub x: &'a str,
    pub y: &'a str,
}

impl PublicKey<'_> {
    /// The SEC1 uncompressed point (`04 || x || y`).
    fn sec1(&self) -> Result<Vec<u8>, ProofError> {
        if self.kty != "EC" || self.crv != "P-256" {
            return Err(ProofError::Key);
        }
        let x = URL_SAFE_NO_PAD.decode(self.x).map_err(|_| ProofError::Key)?;
        let y = URL_SAFE_NO_PAD.decode(self.y).map_err(|_| ProofError::Key)?;
        if x.len() != 32 || y.len() != 32 {
            return Err(ProofError::Key);
        }
        let mut point = Vec::with_capacity(65);
        point.push(4);
        point.extend_from_slice(&x);
        point.extend_from_slice(&y);
        Ok(point)
    }
}

/// Whether `jwk` is a usable P-256 public key (a token naming any other is
/// refused when it is made).
pub fn key_is_valid(jwk: PublicKey<'_>) -> bool {
    jwk.sec1().is_ok_and(|p| point_on_curve(&p))
}

fn point_on_curve(sec1: &[u8]) -> bool {
    // ring has no "parse a public key" call; `ring::agreement` does check a
    // peer's point, so agree once with a throwaway key.
    let rng = ring::rand::SystemRandom::new();
    let Ok(mine) = ring::agreement::EphemeralPrivateKey::generate(&ring::agreement::ECDH_P256, &rng) else {
        return false;
    };
    let peer = ring::agreement::UnparsedPublicKey::new(&ring::agreement::ECDH_P256, sec1);
    ring::agreement::agree_ephemeral(mine, &peer, |_| ()).is_ok()
}

/// The request a proof must be for.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    pub method: &'a str,
    /// `https://host[:port]/path` of the request, without query.
    pub url: &'a str,
    /// The bearer token (`hgt_…`).
    pub token: &'a str,
    /// Unix seconds now.
    pub now: i64,
}

/// What a verified proof says (the caller checks `jti` for replay).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    pub jti: String,
    pub iat: i64,
}

#[derive(Deserialize)]
struct Header {
    alg: String,
}

#[derive(Deserialize)]
struct Claims {
    htm: String,
    htu: String,
    iat: i64,
    jti: String,
    ath: String,
}

/// Verifies `proof` against the token's `key` and `request`.
pub fn verify(proof: &str, key: PublicKey<'_>, request: Request<'_>) -> Result<Verified, ProofError> {
    if proof.is_empty() {
        return Err(ProofError::Missing);
    }
    if proof.len() > MAX_PROOF_BYTES {
        return Err(ProofError::Malformed);
    }
    let mut parts = proof.split('.');
    let (Some(h), Some(p), Some(s), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Err(ProofError::Malformed);
    };
    let header: Header = decode_json(h)?;
    if header.alg != "ES256" {
        return Err(ProofError::Algorithm);
    }
    let signature = URL_SAFE_NO_PAD.decode(s).map_err(|_| ProofError::Malformed)?;
    if signature.len() != 64 {
        return Err(ProofError::Signature);
    }
    let signed = &proof[..h.len() + 1 + p.len()];
    UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, key.sec1()?)
        .verify(signed.as_bytes(), &signature)
        .map_err(|_| ProofError::Signature)?;
    // Claims are read only once the signature holds: nothing unsigned is
    // ever interpreted.
    let claims: Claims = decode_json(p)?;
    if claims.htm != request.method {
        return Err(ProofError::Method);
    }
    if normalise_url(&claims.htu) != Some(normalise_url(request.url).ok_or(ProofError::Url)?) {
        return Err(ProofError::Url);
    }
    if (claims.iat - request.now).abs() > SKEW_SECONDS {
        return Err(ProofError::Time);
    }
    if claims.ath != token_hash(request.token) {
        return Err(ProofError::TokenHash);
    }
    if claims.jti.is_empty() || claims.jti.chars().count() > MAX_JTI_CHARS {
        return Err(ProofError::Jti);
    }
    Ok(Verified { jti: claims.jti, iat: claims.iat })
}

fn decode_json<T: serde::de::DeserializeOwned>(part: &str) -> Result<T, ProofError> {
    let bytes = URL_SAFE_NO_PAD.decode(part).map_err(|_| ProofError::Malformed)?;
    serde_json::from_slice(&bytes).map_err(|_| ProofError::Malformed)
}

/// `ath`: base64url SHA-256 of the token.
pub fn token_hash(token: &str) -> String {
    URL_SAFE_NO_PAD.encode(ring::digest::digest(&ring::digest::SHA256, token.as_bytes()))
}

/// The URL as compared: scheme and host lower-cased, the default port
/// dropped, no query or fragment (RFC 9449 §4.3).
fn normalise_url(url: &str) -> Option<String> {
    let url = url.split(['?', '#']).next()?;
    let (scheme, rest) = url.split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    if scheme != "https" && scheme != "http" {
        return None;
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.is_empty() || authority.contains('@') {
        return None;
    }
    let mut authority = authority.to_ascii_lowercase();
    let default = if scheme == "https" { ":443" } else { ":80" };
    if let Some(stripped) = authority.strip_suffix(default) {
        authority = stripped.to_owned();
    }
    Some(format!("{scheme}://{authority}{path}"))
}

/// The `jti`s seen in the last `2 × SKEW_SECONDS` (a proof older than that
/// is refused for its `iat`, so forgetting it then is safe). Bounded: past
/// `capacity` live entries a new `jti` is refused rather than remembered
/// badly.
pub struct ReplayWindow {
    seen: std::collections::HashMap<String, i64>,
    order: std::collections::VecDeque<(i64, String)>,
    capacity: usize,
}

impl ReplayWindow {
    pub fn new(capacity: usize) -> Self {
        Self { seen: Default::default(), order: Default::default(), capacity }
    }

    /// Records `jti` (from a proof made at `iat`) at `now`; `Err` when it
    /// was seen within the window.
    pub fn claim(&mut self, jti: &str, now: i64) -> Result<(), ProofError> {
        while let Some((at, _)) = self.order.front() {
            if now - at <= 2 * SKEW_SECONDS {
                break;
            }
            let (_, old) = self.order.pop_front().expect("front exists");
            self.seen.remove(&old);
        }
        if self.seen.contains_key(jti) {
            return Err(ProofError::Replayed);
        }
        if self.seen.len() >= self.capacity {
            return Err(ProofError::Replayed);
        }
        self.seen.insert(jti.to_owned(), now);
        self.order.push_back((now, jti.to_owned()));
        Ok(())
    }
}

/// A key pair to sign proofs with (clients, tests and benchmarks; the
/// gateway only verifies).
pub struct Signer {
    pair: ring::signature::EcdsaKeyPair,
    rng: ring::rand::SystemRandom,
}

impl Signer {
    pub fn generate() -> Self {
        Self::generate_keeping().0
    }

    /// A new key pair and its PKCS#8 document, for a client that keeps the
    /// key (to sign proofs later: [`Signer::from_pkcs8`]).
    pub fn generate_keeping() -> (Self, zeroize::Zeroizing<Vec<u8>>) {
        use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair};
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).expect("P-256 key");
        let kept = zeroize::Zeroizing::new(pkcs8.as_ref().to_vec());
        (Self::from_pkcs8(&kept).expect("a key just made"), kept)
    }

    /// The signer of a kept PKCS#8 document; `None` if it is not a P-256 key.
    pub fn from_pkcs8(pkcs8: &[u8]) -> Option<Self> {
        use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair};
        let rng = ring::rand::SystemRandom::new();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8, &rng).ok()?;
        Some(Self { pair, rng })
    }

    /// The public key's JWK coordinates (`x`, `y`).
    pub fn jwk_xy(&self) -> (String, String) {
        use ring::signature::KeyPair;
        let point = self.pair.public_key().as_ref();
        (URL_SAFE_NO_PAD.encode(&point[1..33]), URL_SAFE_NO_PAD.encode(&point[33..65]))
    }

    /// A compact JWS of `header` and `claims` (JSON), signed ES256.
    pub fn sign_json(&self, header: &serde_json::Value, claims: &serde_json::Value) -> String {
        let h = URL_SAFE_NO_PAD.encode(serde_json::to_vec(header).expect("json"));
        let p = URL_SAFE_NO_PAD.encode(serde_json::to_vec(claims).expect("json"));
        let input = format!("{h}.{p}");
        let sig = self.pair.sign(&self.rng, input.as_bytes()).expect("sign");
        format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig.as_ref()))
    }

    /// A proof for `method` `url` with `token`, made at `iat`, with `jti`.
    pub fn proof(&self, method: &str, url: &str, token: &str, iat: i64, jti: &str) -> String {
        self.sign_json(
            &serde_json::json!({"alg": "ES256", "typ": "hangar-proof+jwt"}),
            &serde_json::json!({"htm": method, "htu": url, "iat": iat, "jti": jti, "ath": token_hash(token)}),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const URL: &str = "https://gw.example:8443/v1/sandboxes/s1/commands";
    const TOKEN: &str = "hgt_abc";
    const NOW: i64 = 1_800_000_000;

    #[test]
    fn a_kept_key_signs_as_the_key_it_was() {
        let (signer, pkcs8) = Signer::generate_keeping();
        let again = Signer::from_pkcs8(&pkcs8).expect("a P-256 PKCS#8 document");
        assert_eq!(again.jwk_xy(), signer.jwk_xy());
        assert!(Signer::from_pkcs8(b"not a key").is_none());
    }

    fn key(s: &Signer) -> (String, String) {
        s.jwk_xy()
    }

    fn check(s: &Signer, proof: &str) -> Result<Verified, ProofError> {
        let (x, y) = key(s);
        let k = PublicKey { kty: "EC", crv: "P-256", x: &x, y: &y };
        verify(proof, k, Request { method: "POST", url: URL, token: TOKEN, now: NOW })
    }

    #[test]
    fn a_proof_for_this_request_and_token_verifies() {
        let s = Signer::generate();
        let v = check(&s, &s.proof("POST", URL, TOKEN, NOW - 5, "j1")).unwrap();
        assert_eq!(v, Verified { jti: "j1".into(), iat: NOW - 5 });
        // The URL compares without query, default port or case of the host.
        let s2 = Signer::generate();
        let (x, y) = key(&s2);
        let k = PublicKey { kty: "EC", crv: "P-256", x: &x, y: &y };
        let p = s2.proof("GET", "https://GW.example/v1/x", TOKEN, NOW, "j");
        let req = Request { method: "GET", url: "https://gw.example:443/v1/x?after=3", token: TOKEN, now: NOW };
        assert!(verify(&p, k, req).is_ok());
    }

    #[test]
    fn every_mismatch_is_refused_with_its_reason() {
        let s = Signer::generate();
        let other = Signer::generate();
        let cases = [
            (s.proof("GET", URL, TOKEN, NOW, "j"), ProofError::Method),
            (s.proof("POST", "https://gw.example:8443/v1/sandboxes/s2/commands", TOKEN, NOW, "j"), ProofError::Url),
            (s.proof("POST", "https://evil.example:8443/v1/sandboxes/s1/commands", TOKEN, NOW, "j"), ProofError::Url),
            (s.proof("POST", URL, TOKEN, NOW - 61, "j"), ProofError::Time),
            (s.proof("POST", URL, TOKEN, NOW + 61, "j"), ProofError::Time),
            (s.proof("POST", URL, "hgt_other", NOW, "j"), ProofError::TokenHash),
            (s.proof("POST", URL, TOKEN, NOW, ""), ProofError::Jti),
            (s.proof("POST", URL, TOKEN, NOW, &"j".repeat(129)), ProofError::Jti),
            (other.proof("POST", URL, TOKEN, NOW, "j"), ProofError::Signature),
            (String::new(), ProofError::Missing),
            ("a.b".into(), ProofError::Malformed),
            ("a.b.c.d".into(), ProofError::Malformed),
            ("x".repeat(MAX_PROOF_BYTES + 1), ProofError::Malformed),
        ];
        for (proof, want) in cases {
            assert_eq!(check(&s, &proof), Err(want), "{proof:.60}");
        }
    }

    #[test]
    fn only_es256_is_accepted_whatever_the_header_says() {
        let s = Signer::generate();
        let claims = json!({"htm": "POST", "htu": URL, "iat": NOW, "jti": "j", "ath": token_hash(TOKEN)});
        let enc = |v: &serde_json::Value| URL_SAFE_NO_PAD.encode(serde_json::to_vec(v).unwrap());
        let none = format!("{}.{}.", enc(&json!({"alg": "none"})), enc(&claims));
        assert_eq!(check(&s, &none), Err(ProofError::Algorithm));
        // An HS256 "signature" keyed with the public key (the classic confusion).
        let hs = format!("{}.{}.{}", enc(&json!({"alg": "HS256"})), enc(&claims), URL_SAFE_NO_PAD.encode([7u8; 32]));
        assert_eq!(check(&s, &hs), Err(ProofError::Algorithm));
        // Signed by the right key but claiming another algorithm.
        let es384 = s.sign_json(&json!({"alg": "ES384"}), &claims);
        assert_eq!(check(&s, &es384), Err(ProofError::Algorithm));
        // Right algorithm, the signature of another header.
        let good = s.proof("POST", URL, TOKEN, NOW, "j");
        let parts: Vec<&str> = good.split('.').collect();
        let swapped = format!("{}.{}.{}", enc(&json!({"alg": "ES256", "kid": "x"})), parts[1], parts[2]);
        assert_eq!(check(&s, &swapped), Err(ProofError::Signature));
    }

    #[test]
    fn keys_must_be_p256_points() {
        let s = Signer::generate();
        let (x, y) = s.jwk_xy();
        assert!(key_is_valid(PublicKey { kty: "EC", crv: "P-256", x: &x, y: &y }));
        assert!(!key_is_valid(PublicKey { kty: "EC", crv: "P-384", x: &x, y: &y }));
        assert!(!key_is_valid(PublicKey { kty: "RSA", crv: "P-256", x: &x, y: &y }));
        assert!(!key_is_valid(PublicKey { kty: "EC", crv: "P-256", x: &x, y: &x }), "not on the curve");
        assert!(!key_is_valid(PublicKey { kty: "EC", crv: "P-256", x: "AA", y: &y }));
    }

    #[test]
    fn a_jti_is_accepted_once_within_the_window() {
        let mut w = ReplayWindow::new(3);
        assert_eq!(w.claim("a", NOW), Ok(()));
        assert_eq!(w.claim("a", NOW + 100), Err(ProofError::Replayed));
        assert_eq!(w.claim("b", NOW + 1), Ok(()));
        // Past the window the old ones are forgotten (their proofs are stale anyway).
        assert_eq!(w.claim("c", NOW + 200), Ok(()));
        assert_eq!(w.claim("a", NOW + 200), Ok(()));
        // Full: refuse rather than forget a live one.
        assert_eq!(w.claim("d", NOW + 200), Ok(()));
        assert_eq!(w.claim("e", NOW + 200), Err(ProofError::Replayed));
    }

    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

            /// Any string is refused without a panic (a proof by a random
            /// key cannot verify).
            #[test]
            fn arbitrary_proofs_are_refused(proof in ".{0,600}") {
                let s = Signer::generate_cached();
                prop_assert!(check(s, &proof).is_err());
            }

            /// Three base64url parts of any bytes: still refused, never a panic.
            #[test]
            fn arbitrary_jws_parts_are_refused(h in proptest::collection::vec(any::<u8>(), 0..200),
                                               p in proptest::collection::vec(any::<u8>(), 0..300),
                                               sig in proptest::collection::vec(any::<u8>(), 0..80)) {
                let s = Signer::generate_cached();
                let proof = format!("{}.{}.{}", URL_SAFE_NO_PAD.encode(h), URL_SAFE_NO_PAD.encode(p), URL_SAFE_NO_PAD.encode(sig));
                prop_assert!(check(s, &proof).is_err());
            }

            /// A valid proof with any one byte changed is refused.
            #[test]
            fn a_changed_byte_breaks_a_valid_proof(at in any::<prop::sample::Index>(), to in any::<u8>()) {
                let s = Signer::generate_cached();
                let good = s.proof("POST", URL, TOKEN, NOW, "j");
                let mut bytes = good.clone().into_bytes();
                let i = at.index(bytes.len());
                prop_assume!(bytes[i] != to);
                bytes[i] = to;
                let changed = String::from_utf8_lossy(&bytes).into_owned();
                prop_assume!(changed != good);
                // Base64url's last character can carry unused bits: a change
                // that decodes to the same bytes is the same proof.
                let same = changed.split('.').map(|p| URL_SAFE_NO_PAD.decode(p).ok()).collect::<Vec<_>>()
                    == good.split('.').map(|p| URL_SAFE_NO_PAD.decode(p).ok()).collect::<Vec<_>>();
                prop_assume!(!same);
                prop_assert!(check(s, &changed).is_err());
            }

            /// URLs of any shape never panic the comparison.
            #[test]
            fn arbitrary_urls_never_panic(u in ".{0,200}") {
                let _ = normalise_url(&u);
            }
        }
    }

    impl Signer {
        fn generate_cached() -> &'static Signer {
            static S: std::sync::OnceLock<Signer> = std::sync::OnceLock::new();
            S.get_or_init(Signer::generate)
        }
    }
}

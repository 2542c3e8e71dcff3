//! Session tokens: `hgt_` and 32 random bytes (base64url, no padding). The
//! plaintext is shown once; only its SHA-384 digest (`sha384:<hex>`) is
//! ever stored.

use base64::Engine;
use zeroize::Zeroizing;

use crate::seal::{SealError, random_key};

pub const PREFIX: &str = "hgt_";

/// A new token's plaintext, wiped from memory when dropped.
pub fn new_plaintext() -> Result<Zeroizing<String>, SealError> {
    let bytes = random_key::<32>()?;
    Ok(Zeroizing::new(format!("{PREFIX}{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes.as_slice()))))
}

/// `sha384:<hex>` of a token's plaintext: what the cluster keeps of it.
pub fn digest(plaintext: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA384, plaintext.as_bytes());
    let hex: String = d.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha384:{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_prefixed_random_and_stored_only_as_its_digest() {
        let a = new_plaintext().unwrap();
        let b = new_plaintext().unwrap();
        assert!(a.starts_with(PREFIX) && a.len() == PREFIX.len() + 43, "{}", a.len());
        assert_ne!(*a, *b);
        let d = digest(&a);
        assert!(d.starts_with("sha384:") && d.len() == 7 + 96);
        assert_eq!(d, digest(&a));
        assert!(!d.contains(&a[PREFIX.len()..]));
    }
}

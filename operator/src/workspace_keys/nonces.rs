//! The nonces a worker must present with its identity document: issued by
//! this operator, each accepted once and only within a minute. Kept in
//! memory: a restarted (or newly elected) operator knows none, so a nonce
//! can never be accepted twice; the worker just asks for a new one.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine;

/// How long an issued nonce may be used.
pub const NONCE_TTL: Duration = Duration::from_secs(60);
/// Outstanding nonces at most: anyone may ask for one, so the map is
/// bounded (expired ones are dropped first).
pub const MAX_OUTSTANDING: usize = 10_000;

#[derive(Default)]
pub struct Nonces {
    issued: Mutex<HashMap<String, Instant>>,
}

impl Nonces {
    /// A fresh nonce, or `None` when too many are outstanding.
    pub fn issue(&self) -> Option<String> {
        let bytes = hangar_keys::random_bytes::<32>().ok()?;
        let nonce = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
        let mut issued = self.issued.lock().unwrap_or_else(|p| p.into_inner());
        if issued.len() >= MAX_OUTSTANDING {
            issued.retain(|_, at| at.elapsed() < NONCE_TTL);
            if issued.len() >= MAX_OUTSTANDING {
                return None;
            }
        }
        issued.insert(nonce.clone(), Instant::now());
        Some(nonce)
    }

    /// True once for a nonce issued here less than a minute ago; it is
    /// used up either way.
    pub fn take(&self, nonce: &str) -> bool {
        let at = self.issued.lock().unwrap_or_else(|p| p.into_inner()).remove(nonce);
        at.is_some_and(|at| at.elapsed() < NONCE_TTL)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nonce_is_accepted_once() {
        let n = Nonces::default();
        let a = n.issue().expect("a nonce");
        assert!(n.take(&a));
        assert!(!n.take(&a), "used up");
        assert!(!n.take("never-issued"));
    }

    #[test]
    fn an_expired_nonce_is_refused() {
        let n = Nonces::default();
        let a = n.issue().expect("a nonce");
        n.issued.lock().unwrap().insert(a.clone(), Instant::now() - NONCE_TTL);
        assert!(!n.take(&a));
    }

    #[test]
    fn outstanding_nonces_are_bounded() {
        let n = Nonces::default();
        let old = Instant::now() - NONCE_TTL;
        n.issued.lock().unwrap().extend((0..MAX_OUTSTANDING).map(|i| (format!("live-{i}"), Instant::now())));
        assert!(n.issue().is_none(), "full of live nonces");
        n.issued.lock().unwrap().insert("live-0".into(), old);
        assert!(n.issue().is_some(), "an expired one makes room");
    }
}

//! Session-token auth: `Authorization: Bearer hgt_…` and `Hangar-Proof`.
//!
//! The token is found by its SHA-384 digest (the only thing stored of it)
//! in a watch of SessionTokens; the proof is checked against the token's
//! public key and this request (`hangar_keys::proof`), and its `jti` is
//! claimed once across the replicas (`replay`). Whether the token may do the act is
//! `hangar_core::tokens::scope::decide` — the admission webhook's decision
//! too, for the write the gateway then makes as the token's identity.
//!
//! Every failure is `token_invalid` (401) without saying which check
//! failed: an attacker learns nothing about which tokens exist.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use hangar_crds::{ErrorCode, SessionToken};
use hangar_keys::proof::{self, ProofError, PublicKey};
use hangar_runtime::kube_ext::log_watch_errors;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};

use crate::error::ApiError;
use crate::replay::ReplayGuard;

pub struct SessionTokens {
    pub store: Store<SessionToken>,
    by_digest: Arc<Mutex<HashMap<String, ObjectRef<SessionToken>>>>,
    replay: Arc<ReplayGuard>,
}

type DigestIndex = HashMap<String, ObjectRef<SessionToken>>;

fn digest_of(token: &SessionToken) -> Option<String> {
    token.status.as_ref().and_then(|s| s.digest.clone())
}

/// Keeps the digest index as the watch says: a deleted token leaves it,
/// and a relist replaces it whole once complete (so tokens deleted while
/// the watch was down leave it too); until then the old one serves.
fn apply_to_index(index: &mut DigestIndex, relist: &mut Option<DigestIndex>, event: &watcher::Event<SessionToken>) {
    match event {
        watcher::Event::Apply(t) => {
            if let Some(d) = digest_of(t) {
                index.insert(d, ObjectRef::from_obj(t));
            }
        }
        watcher::Event::Delete(t) => {
            let gone = ObjectRef::from_obj(t);
            index.retain(|_, r| *r != gone);
        }
        watcher::Event::Init => *relist = Some(DigestIndex::new()),
        watcher::Event::InitApply(t) => {
            if let (Some(fresh), Some(d)) = (relist.as_mut(), digest_of(t)) {
                fresh.insert(d, ObjectRef::from_obj(t));
            }
        }
        watcher::Event::InitDone => {
            if let Some(fresh) = relist.take() {
                *index = fresh;
            }
        }
    }
}

impl SessionTokens {
    /// Starts the watch (and the digest index beside it) and waits for its
    /// first list.
    pub async fn start(
        client: kube::Client,
        replay: Arc<ReplayGuard>,
    ) -> Result<Self, reflector::store::WriterDropped> {
        let (store, writer) = reflector::store();
        let by_digest: Arc<Mutex<HashMap<String, ObjectRef<SessionToken>>>> = Arc::default();
        let index = by_digest.clone();
        let events =
            reflector::reflector(writer, watcher(Api::<SessionToken>::all(client), watcher::Config::default()))
                .default_backoff();
        let mut log = log_watch_errors("SessionToken");
        let mut relist = None;
        tokio::spawn(events.for_each(move |event| {
            if let Ok(e) = &event {
                let mut index = index.lock().unwrap_or_else(|p| p.into_inner());
                apply_to_index(&mut index, &mut relist, e);
            }
            log(event.map(|_| ()))
        }));
        store.wait_until_ready().await?;
        Ok(Self { store, by_digest, replay })
    }

    /// Whether the watch has delivered a token with `digest`.
    pub fn knows(&self, digest: &str) -> bool {
        self.by_digest.lock().unwrap_or_else(|p| p.into_inner()).contains_key(digest)
    }

    /// The token for this bearer and proof, or `token_invalid`.
    pub async fn authenticate(
        &self,
        bearer: &str,
        proof_header: Option<&str>,
        method: &str,
        url: &str,
    ) -> Result<Arc<SessionToken>, ApiError> {
        let digest = hangar_keys::token::digest(bearer);
        let found = self.by_digest.lock().unwrap_or_else(|p| p.into_inner()).get(&digest).cloned();
        let token = found
            .and_then(|r| self.store.get(&r))
            // The index may name a token since deleted or re-made: the
            // stored digest is what counts.
            .filter(|t| t.status.as_ref().and_then(|s| s.digest.as_deref()) == Some(digest.as_str()))
            .ok_or_else(|| refused(None))?;
        let jwk = &token.spec.public_key;
        let key = PublicKey { kty: &jwk.kty, crv: &jwk.crv, x: &jwk.x, y: &jwk.y };
        let now = k8s_openapi::jiff::Timestamp::now().as_second();
        let request = proof::Request { method, url, token: bearer, now };
        let verified = proof::verify(proof_header.unwrap_or_default(), key, request).map_err(|e| refused(Some(e)))?;
        if !self.replay.claim(&verified.jti, now).await? {
            return Err(refused(Some(ProofError::Replayed)));
        }
        Ok(token)
    }
}

fn refused(why: Option<ProofError>) -> ApiError {
    // The reason goes to the log only.
    tracing::info!(
        reason = why.map(|w| w.to_string()).unwrap_or_else(|| "unknown token".into()),
        "session token refused"
    );
    ApiError::new(ErrorCode::TokenInvalid, "the session token or its proof is not valid")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(name: &str, digest: &str) -> SessionToken {
        let mut t: SessionToken = serde_json::from_value(serde_json::json!({
            "apiVersion": "hangar.dev/v1alpha1", "kind": "SessionToken",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"sandbox": "box", "scopes": ["read"], "ttlSeconds": 600,
                     "publicKey": {"kty": "EC", "crv": "P-256", "x": "x", "y": "y"}},
        }))
        .unwrap();
        t.status = Some(hangar_crds::SessionTokenStatus { digest: Some(digest.into()), ..Default::default() });
        t
    }

    #[test]
    fn deleted_and_relisted_tokens_leave_the_digest_index() {
        let (mut index, mut relist) = (DigestIndex::new(), None);
        for e in [watcher::Event::Apply(token("a", "d-a")), watcher::Event::Apply(token("b", "d-b"))] {
            apply_to_index(&mut index, &mut relist, &e);
        }
        apply_to_index(&mut index, &mut relist, &watcher::Event::Delete(token("a", "d-a")));
        assert!(!index.contains_key("d-a") && index.contains_key("d-b"));
        // A relist without b (deleted while the watch was down): b goes,
        // but only once the relist is complete.
        apply_to_index(&mut index, &mut relist, &watcher::Event::Init);
        apply_to_index(&mut index, &mut relist, &watcher::Event::InitApply(token("c", "d-c")));
        assert!(index.contains_key("d-b"), "the old index serves during the relist");
        apply_to_index(&mut index, &mut relist, &watcher::Event::InitDone);
        assert_eq!(index.keys().collect::<Vec<_>>(), ["d-c"]);
    }
}

//! A proof's `jti` is accepted once across every gateway replica.
//!
//! Each `jti` has one owner among the replicas, chosen by rendezvous
//! hashing over the current members (so a change of members moves only the
//! `jti`s of the member that came or went). A replica claims a `jti` in its
//! own window when it owns it, and otherwise asks the owner over the peer
//! port. The peer protocol carries no credential (a `jti` is no secret once
//! the proof is used): requests and answers are authenticated by an HMAC
//! under a key every replica derives from the output key-encryption key it
//! already holds, and an answer is bound to its request's nonce, so nobody
//! else can claim, or answer for, a `jti`. If the owner cannot be asked the
//! request is refused (503): never accepted twice, at the price of a retry.
//!
//! Members: a fixed list (`--peers`), or the addresses a DNS name resolves
//! to (a headless Service), refreshed every few seconds. While replicas see
//! different member lists (a replica starting or stopping) two of them can
//! own one `jti` for those seconds; the proof's ±60 s window bounds it.

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use hangar_keys::proof::{ProofError, ReplayWindow, SKEW_SECONDS};
use ring::hmac;
use serde::{Deserialize, Serialize};

use crate::error::ApiError;
use crate::hex::hex;

/// `jti`s remembered at once by one replica.
const CAPACITY: usize = 1_000_000;
const PEER_TIMEOUT: Duration = Duration::from_millis(500);

pub struct ReplayGuard {
    local: Mutex<ReplayWindow>,
    peers: Option<Peers>,
}

struct Peers {
    me: String,
    members: Arc<RwLock<Vec<String>>>,
    key: hmac::Key,
    http: reqwest::Client,
}

/// Who the members are.
#[derive(Clone, Debug)]
pub enum Members {
    Fixed(Vec<String>),
    /// `name:port`: the addresses `name` resolves to.
    Dns(String),
}

#[derive(Serialize, Deserialize, Debug)]
pub struct Claim {
    pub jti: String,
    pub at: i64,
    pub nonce: String,
    pub mac: String,
}

#[derive(Serialize, Deserialize, Debug)]
pub struct Answer {
    pub fresh: bool,
    pub mac: String,
}

fn claim_mac(key: &hmac::Key, jti: &str, at: i64, nonce: &str) -> String {
    hex(hmac::sign(key, format!("claim\u{0}{jti}\u{0}{at}\u{0}{nonce}").as_bytes()).as_ref())
}

fn answer_mac(key: &hmac::Key, jti: &str, nonce: &str, fresh: bool) -> String {
    hex(hmac::sign(key, format!("answer\u{0}{jti}\u{0}{nonce}\u{0}{fresh}").as_bytes()).as_ref())
}

fn verify_mac(key: &hmac::Key, message: &str, mac: &str) -> bool {
    let bytes: Option<Vec<u8>> =
        (0..mac.len()).step_by(2).map(|i| mac.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok())).collect();
    bytes.is_some_and(|b| hmac::verify(key, message.as_bytes(), &b).is_ok())
}

/// The owner of `jti` among `members` (rendezvous hashing).
pub fn owner<'a>(members: &'a [String], jti: &str) -> Option<&'a String> {
    members.iter().max_by_key(|m| {
        let d = ring::digest::digest(&ring::digest::SHA256, format!("{m}\u{0}{jti}").as_bytes());
        let mut first = [0u8; 8];
        first.copy_from_slice(&d.as_ref()[..8]);
        (u64::from_be_bytes(first), (*m).clone())
    })
}

fn unavailable() -> ApiError {
    ApiError {
        status: 503,
        code: "unavailable",
        message: "the proof's single use could not be checked just now; send a new proof".into(),
    }
}

impl ReplayGuard {
    /// One replica alone.
    pub fn alone() -> Self {
        Self { local: Mutex::new(ReplayWindow::new(CAPACITY)), peers: None }
    }

    /// With peers: `me` is this replica's peer address as the members list
    /// it; `kek` the output key-encryption key (the MAC key is derived from
    /// it).
    pub fn with_peers(me: String, members: Members, kek: &[u8]) -> Self {
        let derived = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, kek), b"hangar-gateway-jti-claims");
        let key = hmac::Key::new(hmac::HMAC_SHA256, derived.as_ref());
        let list = Arc::new(RwLock::new(match &members {
            Members::Fixed(m) => m.clone(),
            Members::Dns(_) => vec![me.clone()],
        }));
        if let Members::Dns(name) = members {
            let list = list.clone();
            tokio::spawn(async move {
                loop {
                    match tokio::net::lookup_host(name.as_str()).await {
                        Ok(addrs) => {
                            let mut found: Vec<String> = addrs.map(|a| a.to_string()).collect();
                            found.sort();
                            found.dedup();
                            if !found.is_empty() {
                                *list.write().unwrap_or_else(|p| p.into_inner()) = found;
                            }
                        }
                        Err(e) => tracing::warn!(%name, error = %e, "could not resolve the gateway's peers"),
                    }
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
            });
        }
        let http = hangar_runtime::https::plain_http_client(PEER_TIMEOUT).expect("an HTTP client without TLS roots");
        Self { local: Mutex::new(ReplayWindow::new(CAPACITY)), peers: Some(Peers { me, members: list, key, http }) }
    }

    fn claim_here(&self, jti: &str, at: i64) -> Result<(), ProofError> {
        self.local.lock().unwrap_or_else(|p| p.into_inner()).claim(jti, at)
    }

    /// Claims `jti` at `now`: `Ok(true)` the first time anywhere,
    /// `Ok(false)` seen before.
    pub async fn claim(&self, jti: &str, now: i64) -> Result<bool, ApiError> {
        let Some(peers) = &self.peers else {
            return Ok(self.claim_here(jti, now).is_ok());
        };
        let owner = {
            let members = peers.members.read().unwrap_or_else(|p| p.into_inner());
            owner(&members, jti).cloned().unwrap_or_else(|| peers.me.clone())
        };
        if owner == peers.me {
            return Ok(self.claim_here(jti, now).is_ok());
        }
        let nonce = hex(&hangar_keys::random_bytes::<16>().map_err(|_| unavailable())?);
        let claim = Claim { jti: jti.to_owned(), at: now, mac: claim_mac(&peers.key, jti, now, &nonce), nonce };
        let url = format!("http://{owner}/v1/internal/jti-claims");
        let answer = async {
            let r = peers.http.post(&url).json(&claim).send().await?.error_for_status()?;
            r.json::<Answer>().await
        }
        .await
        .map_err(|e| {
            tracing::warn!(peer = %owner, error = %e, "could not ask the owner of a proof's jti");
            unavailable()
        })?;
        let genuine =
            verify_mac(&peers.key, &format!("answer\u{0}{jti}\u{0}{}\u{0}{}", claim.nonce, answer.fresh), &answer.mac);
        if !genuine {
            tracing::warn!(peer = %owner, "an answer about a jti that no replica signed");
            return Err(unavailable());
        }
        Ok(answer.fresh)
    }

    /// A peer's claim (the peer port's handler): `None` when it is not a
    /// replica's (bad MAC, or a time outside the window).
    pub fn answer(&self, claim: &Claim, now: i64) -> Option<Answer> {
        let peers = self.peers.as_ref()?;
        let message = format!("claim\u{0}{}\u{0}{}\u{0}{}", claim.jti, claim.at, claim.nonce);
        if !verify_mac(&peers.key, &message, &claim.mac) || (claim.at - now).abs() > SKEW_SECONDS {
            return None;
        }
        let fresh = self.claim_here(&claim.jti, now).is_ok();
        Some(Answer { fresh, mac: answer_mac(&peers.key, &claim.jti, &claim.nonce, fresh) })
    }
}

/// The peer port: `POST /v1/internal/jti-claims` (plain HTTP; see the
/// module docs for why that is enough).
pub fn peer_router(guard: Arc<ReplayGuard>) -> axum::Router {
    use axum::http::StatusCode;
    use axum::routing::post;
    axum::Router::new()
        .route(
            "/v1/internal/jti-claims",
            post(move |axum::Json(claim): axum::Json<Claim>| {
                let guard = guard.clone();
                async move {
                    let now = k8s_openapi::jiff::Timestamp::now().as_second();
                    match guard.answer(&claim, now) {
                        Some(a) => Ok(axum::Json(a)),
                        None => Err(StatusCode::FORBIDDEN),
                    }
                }
            }),
        )
        .layer(axum::extract::DefaultBodyLimit::max(4096))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_owner_per_jti_and_a_leaver_moves_only_its_own() {
        let three: Vec<String> = ["a:1", "b:1", "c:1"].map(String::from).to_vec();
        let two: Vec<String> = ["a:1", "b:1"].map(String::from).to_vec();
        let mut owned_by_c = 0;
        for i in 0..300 {
            let jti = format!("j{i}");
            let o3 = owner(&three, &jti).unwrap();
            let o2 = owner(&two, &jti).unwrap();
            if o3 == "c:1" {
                owned_by_c += 1;
            } else {
                assert_eq!(o3, o2, "{jti} moved though its owner stayed");
            }
        }
        assert!((60..140).contains(&owned_by_c), "spread evenly: {owned_by_c}");
    }

    #[test]
    fn claims_and_answers_are_authenticated() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let _g = rt.enter();
        let guard = ReplayGuard::with_peers("a:1".into(), Members::Fixed(vec!["a:1".into()]), &[7u8; 32]);
        let other = ReplayGuard::with_peers("a:1".into(), Members::Fixed(vec!["a:1".into()]), &[8u8; 32]);
        let key = &guard.peers.as_ref().unwrap().key;
        let claim = Claim { jti: "j".into(), at: 100, nonce: "n".into(), mac: claim_mac(key, "j", 100, "n") };
        let answer = guard.answer(&claim, 100).unwrap();
        assert!(answer.fresh);
        assert!(verify_mac(key, "answer\u{0}j\u{0}n\u{0}true", &answer.mac));
        assert!(!guard.answer(&claim, 101).unwrap().fresh, "the second claim: seen");
        assert!(other.answer(&claim, 100).is_none(), "another key: not a replica");
        let forged = Claim { mac: "00".repeat(32), ..claim };
        assert!(guard.answer(&forged, 100).is_none());
        let stale = Claim { jti: "k".into(), at: 0, nonce: "n".into(), mac: claim_mac(key, "k", 0, "n") };
        assert!(guard.answer(&stale, 100).is_none(), "outside the window");
    }
}

//! A session token's life: when it expires and which phase it is in.
//!
//! - It expires `ttlSeconds` after it was made, and never later than the
//!   session could still run: `stopAfterSeconds` less the compute already
//!   used, counted from the token's creation (a pause only moves the
//!   session's end later, so this bound is safe).
//! - `revoked` and `expired` are final: a token in either never becomes
//!   active again, whatever a retry, a restart or an old manifest says.
//! - When its session ends, a token is revoked — except one whose scopes
//!   are `read` only, which keeps reading state and output until it
//!   expires.

pub mod scope;

use hangar_crds::session_token::{Scope, TokenPhase};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// When a token made at `created` with `ttl_seconds` expires, given the
/// compute its session has left (`None`: no hard stop).
pub fn expires_at(created: Timestamp, ttl_seconds: i64, compute_left: Option<i64>) -> Timestamp {
    let ttl = ttl_seconds.min(compute_left.unwrap_or(i64::MAX)).max(0);
    created + SignedDuration::from_secs(ttl)
}

/// When a token for `session` made at `created` expires.
pub fn expires_for(session: &hangar_crds::Sandbox, created: Timestamp, ttl_seconds: i64) -> Timestamp {
    let compute_left = session
        .spec
        .stop_after_seconds
        .map(|limit| limit - session.status.as_ref().and_then(|s| s.compute_seconds).unwrap_or(0));
    expires_at(created, ttl_seconds, compute_left)
}

/// What the token is now, and why when not active.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Now {
    pub phase: TokenPhase,
    pub reason: Option<&'static str>,
}

/// The token's phase: `current` as recorded, `revoked` from its spec,
/// whether its session has ended.
pub fn phase(
    current: Option<TokenPhase>,
    revoked: bool,
    scopes: &[Scope],
    expires_at: Timestamp,
    session_ended: bool,
    now: Timestamp,
) -> Now {
    let read_only = scopes.iter().all(|s| *s == Scope::Read);
    match current {
        Some(TokenPhase::Revoked) => Now { phase: TokenPhase::Revoked, reason: None },
        Some(TokenPhase::Expired) => Now { phase: TokenPhase::Expired, reason: None },
        _ if revoked => Now { phase: TokenPhase::Revoked, reason: Some("revoked") },
        _ if session_ended && !read_only => Now { phase: TokenPhase::Revoked, reason: Some("session_ended") },
        _ if now >= expires_at => Now { phase: TokenPhase::Expired, reason: Some("ttl_elapsed") },
        _ => Now { phase: TokenPhase::Active, reason: None },
    }
}

/// A session has at most this many active tokens.
pub const MAX_ACTIVE_PER_SESSION: usize = 32;

/// Whether `token` holds one of its session's places: it is active, or
/// made and not yet issued, and not revoked in its spec.
pub fn holds_a_place(token: &hangar_crds::SessionToken, session: &hangar_crds::Sandbox, now: Timestamp) -> bool {
    let status = token.status.clone().unwrap_or_default();
    let ours = token.metadata.namespace == session.metadata.namespace
        && Some(&token.spec.sandbox) == session.metadata.name.as_ref()
        && (status.session_id.is_none() || status.session_id == session.metadata.uid);
    let live = match (status.phase, status.expires_at) {
        (Some(TokenPhase::Revoked | TokenPhase::Expired), _) => false,
        (_, Some(at)) => now < at.0,
        (_, None) => true,
    };
    ours && live && !token.spec.revoked && token.metadata.deletion_timestamp.is_none()
}

/// A new token for `session`, given its tokens: the session takes tokens
/// (exists, not ended) and has room for one more.
pub fn token_create<'a>(
    namespace: &str,
    name: &str,
    session: Option<&hangar_crds::Sandbox>,
    tokens: impl IntoIterator<Item = &'a hangar_crds::SessionToken>,
    new_uid: Option<&str>,
    now: Timestamp,
) -> Result<(), crate::refusal::Refusal> {
    use hangar_crds::ErrorCode;
    let Some(session) = session else {
        return Err(crate::refusal::Refusal::new(
            ErrorCode::SandboxNotFound,
            format!("no Sandbox {name} in namespace {namespace}"),
        ));
    };
    if session.has_ended() {
        return Err(crate::refusal::Refusal::new(
            ErrorCode::SandboxEnded,
            "the session has ended; it takes no new tokens",
        ));
    }
    let held = tokens
        .into_iter()
        .filter(|t| t.metadata.uid.as_deref() != new_uid || new_uid.is_none())
        .filter(|t| holds_a_place(t, session, now))
        .count();
    if held >= MAX_ACTIVE_PER_SESSION {
        return Err(crate::refusal::Refusal::new(
            ErrorCode::SandboxTokenLimit,
            format!("a session has at most {MAX_ACTIVE_PER_SESSION} active tokens; revoke one first"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn a_token_never_outlives_its_sessions_compute() {
        let created = t("2026-12-01T10:00:00Z");
        assert_eq!(expires_at(created, 3600, None), t("2026-12-01T11:00:00Z"));
        assert_eq!(expires_at(created, 3600, Some(600)), t("2026-12-01T10:10:00Z"));
        assert_eq!(expires_at(created, 3600, Some(-5)), created, "no compute left: expired at once");
    }

    #[test]
    fn the_33rd_active_token_is_refused_and_ended_ones_free_places() {
        use serde_json::json;
        let now = t("2026-12-01T10:00:00Z");
        let session: hangar_crds::Sandbox = serde_json::from_value(json!({
            "apiVersion": "hangar.dev/v1alpha1", "kind": "Sandbox",
            "metadata": {"name": "box", "namespace": "ns", "uid": "u1"},
            "spec": {"mode": "commands", "image": "r/i@sha256:aa"},
        }))
        .unwrap();
        let tok = |i: usize, phase: &str, sandbox: &str| -> hangar_crds::SessionToken {
            serde_json::from_value(json!({
                "apiVersion": "hangar.dev/v1alpha1", "kind": "SessionToken",
                "metadata": {"name": format!("t{i}"), "namespace": "ns", "uid": format!("tu{i}")},
                "spec": {"sandbox": sandbox, "scopes": ["read"], "publicKey": {"kty": "EC", "crv": "P-256", "x": "x", "y": "y"}},
                "status": {"phase": phase, "expiresAt": "2026-12-01T11:00:00Z", "sessionId": "u1"},
            }))
            .unwrap()
        };
        let mut tokens: Vec<_> = (0..32).map(|i| tok(i, "active", "box")).collect();
        let code = |tokens: &[hangar_crds::SessionToken]| {
            token_create("ns", "box", Some(&session), tokens, Some("new"), now).err().map(|r| r.code.as_str())
        };
        assert_eq!(code(&tokens), Some("sandbox_token_limit"));
        // A repeated review of one of the 32 is not a 33rd.
        assert_eq!(token_create("ns", "box", Some(&session), &tokens, Some("tu0"), now), Ok(()));
        tokens[0] = tok(0, "revoked", "box");
        assert_eq!(code(&tokens), None);
        tokens.push(tok(40, "active", "other-box"));
        tokens.push(tok(41, "expired", "box"));
        assert_eq!(code(&tokens), None, "another session's and ended tokens hold no place");
        assert_eq!(
            token_create("ns", "gone", None, &tokens, None, now).unwrap_err().code.as_str(),
            "sandbox_not_found"
        );
    }

    #[test]
    fn revoked_and_expired_are_final() {
        let exp = t("2026-12-01T11:00:00Z");
        let early = t("2026-12-01T10:30:00Z");
        let exec = [Scope::Exec];
        assert_eq!(phase(None, false, &exec, exp, false, early).phase, TokenPhase::Active);
        assert_eq!(phase(Some(TokenPhase::Active), true, &exec, exp, false, early).reason, Some("revoked"));
        assert_eq!(phase(Some(TokenPhase::Active), false, &exec, exp, false, exp).phase, TokenPhase::Expired);
        // An old manifest with revoked: false, a restart, a later time: no way back.
        assert_eq!(phase(Some(TokenPhase::Revoked), false, &exec, exp, false, early).phase, TokenPhase::Revoked);
        assert_eq!(phase(Some(TokenPhase::Expired), false, &exec, exp, false, early).phase, TokenPhase::Expired);
    }

    #[test]
    fn a_read_only_token_outlives_its_session_and_no_other() {
        let exp = t("2026-12-01T11:00:00Z");
        let now = t("2026-12-01T10:30:00Z");
        assert_eq!(phase(None, false, &[Scope::Read], exp, true, now).phase, TokenPhase::Active);
        let mixed = phase(None, false, &[Scope::Read, Scope::Exec], exp, true, now);
        assert_eq!((mixed.phase, mixed.reason), (TokenPhase::Revoked, Some("session_ended")));
        assert_eq!(phase(None, false, &[Scope::Read], exp, true, exp).phase, TokenPhase::Expired);
    }
}

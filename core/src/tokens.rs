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

use hangar_crds::session_token::{Scope, TokenPhase};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// When a token made at `created` with `ttl_seconds` expires, given the
/// compute its session has left (`None`: no hard stop).
pub fn expires_at(created: Timestamp, ttl_seconds: i64, compute_left: Option<i64>) -> Timestamp {
    let ttl = ttl_seconds.min(compute_left.unwrap_or(i64::MAX)).max(0);
    created + SignedDuration::from_secs(ttl)
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

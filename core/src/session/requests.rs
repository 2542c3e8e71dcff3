//! Pause, resume, stop and Revoke All as requests (the gateway's routes, by
//! a member or a `control` token): whether the session takes the request
//! now, and the change of the Sandbox's spec it makes.
//!
//! - pause: a session in mode `agent` cannot (`sandbox_pause_unavailable`);
//!   one that is not running does not (`sandbox_not_running`);
//! - resume: a paused (or pausing) session resumes; asking a session that
//!   already runs changes nothing;
//! - stop and Revoke All work in every state before the end;
//! - after the end, nothing (`sandbox_ended`).

use hangar_crds::sandbox::{DesiredState, Mode, Phase, PreflightState};
use hangar_crds::{ErrorCode, Sandbox};
use serde_json::{Value, json};

use crate::refusal::Refusal;

/// The annotation whose new value asks again for a resume that failed.
pub const RETRY_RESUME_ANNOTATION: &str = "hangar.dev/retry-resume";

/// Which resume request the Sandbox makes now: its spec's generation and
/// the retry annotation. A resume that failed is not tried again for the
/// same request (no hot loop); a new one tries again.
pub fn resume_request(session: &Sandbox) -> String {
    let retry = session.metadata.annotations.as_ref().and_then(|a| a.get(RETRY_RESUME_ANNOTATION));
    format!("{}/{}", session.metadata.generation.unwrap_or(0), retry.map_or("", String::as_str))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    Pause,
    Resume,
    Stop,
    RevokeAll,
}

/// The merge patch of the Sandbox `request` makes at `now` (`None`:
/// already so). A session paused while its spec says Running (for idle, or
/// after a resume that failed) is resumed by a new request: a new value of
/// the retry annotation.
pub fn change(
    session: &Sandbox,
    request: Request,
    now: k8s_openapi::jiff::Timestamp,
) -> Result<Option<Value>, Refusal> {
    let preflight = session.status.as_ref().and_then(|s| s.image_preflight.as_ref());
    if session.has_ended() {
        // A session that never ran because an image failed its preflight
        // answers with that refusal (422), which says what to fix.
        if let Some(p) = preflight.filter(|p| p.state == PreflightState::Refused)
            && let Some(code) = p.code.as_deref().and_then(ErrorCode::parse)
        {
            return Err(Refusal::new(code, p.message.clone().unwrap_or_default()));
        }
        return Err(Refusal::new(ErrorCode::SandboxEnded, "the session has ended"));
    }
    let phase = session.status.as_ref().and_then(|s| s.phase);
    match request {
        Request::Pause => {
            if session.spec.mode == Mode::Agent {
                return Err(Refusal::new(
                    ErrorCode::SandboxPauseUnavailable,
                    "a session in mode agent cannot pause: its agent is the main process, and processes do not survive a pause",
                ));
            }
            if preflight.is_some_and(|p| p.state == PreflightState::Pending) {
                return Err(Refusal::new(
                    ErrorCode::ImagePreflightPending,
                    "the session's images are still being checked; it is not running yet",
                ));
            }
            if session.spec.state != DesiredState::Running || phase != Some(Phase::Running) {
                let now = phase.map_or_else(|| "starting".to_owned(), |p| format!("{p:?}").to_lowercase());
                return Err(Refusal::new(
                    ErrorCode::SandboxNotRunning,
                    format!("only a running session pauses; this one is {now}"),
                ));
            }
            Ok(Some(json!({"spec": {"state": "Paused"}})))
        }
        Request::Resume if session.spec.state == DesiredState::Paused => {
            Ok(Some(json!({"spec": {"state": "Running"}})))
        }
        Request::Resume if matches!(phase, Some(Phase::Paused | Phase::Pausing)) => {
            Ok(Some(json!({"metadata": {"annotations": {RETRY_RESUME_ANNOTATION: now.as_nanosecond().to_string()}}})))
        }
        Request::Resume => Ok(None),
        Request::Stop => Ok(Some(json!({"spec": {"state": "Ended"}}))),
        Request::RevokeAll => Ok(Some(json!({"spec": {"revokeAll": true}}))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(mode: &str, state: &str, phase: &str) -> Sandbox {
        serde_json::from_value(json!({
            "apiVersion": "hangar.dev/v1alpha1", "kind": "Sandbox",
            "metadata": {"name": "box", "namespace": "ns", "uid": "u"},
            "spec": {"mode": mode, "image": "r/i@sha256:aa", "state": state},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    fn code(r: Result<Option<Value>, Refusal>) -> String {
        match r {
            Ok(Some(v)) => v["spec"].to_string(),
            Ok(None) => "unchanged".into(),
            Err(r) => r.code.as_str().into(),
        }
    }

    #[test]
    fn a_session_under_or_after_a_failed_preflight_says_so() {
        let now = "2026-12-01T10:00:00Z".parse().unwrap();
        let mut s = session("commands", "Running", "launching");
        s.status.as_mut().unwrap().image_preflight =
            Some(hangar_crds::ImagePreflight { state: PreflightState::Pending, ..Default::default() });
        assert_eq!(code(change(&s, Request::Pause, now)), "image_preflight_pending");
        let mut failed = session("commands", "Running", "failed");
        failed.status.as_mut().unwrap().image_preflight = Some(hangar_crds::ImagePreflight {
            state: PreflightState::Refused,
            code: Some("preflight_too_large".into()),
            message: Some("r/i is 9 GiB".into()),
            ..Default::default()
        });
        let refusal = change(&failed, Request::Resume, now).unwrap_err();
        assert_eq!((refusal.code, refusal.code.http_status()), (ErrorCode::PreflightTooLarge, 422));
    }

    #[test]
    fn the_contracts_answers() {
        let cases = [
            ("commands", "Running", "running", Request::Pause, r#"{"state":"Paused"}"#),
            ("agent", "Running", "running", Request::Pause, "sandbox_pause_unavailable"),
            ("commands", "Running", "launching", Request::Pause, "sandbox_not_running"),
            ("commands", "Paused", "paused", Request::Pause, "sandbox_not_running"),
            ("commands", "Paused", "paused", Request::Resume, r#"{"state":"Running"}"#),
            ("commands", "Paused", "pausing", Request::Resume, r#"{"state":"Running"}"#),
            ("commands", "Running", "running", Request::Resume, "unchanged"),
            // Paused for idle (or after a failed resume) with the spec at Running: a new request.
            ("commands", "Running", "paused", Request::Resume, "null"),
            ("commands", "Paused", "paused", Request::Stop, r#"{"state":"Ended"}"#),
            ("agent", "Running", "launching", Request::RevokeAll, r#"{"revokeAll":true}"#),
            ("commands", "Ended", "stopping", Request::Stop, "sandbox_ended"),
            ("commands", "Running", "ended", Request::Resume, "sandbox_ended"),
            ("commands", "Running", "failed", Request::RevokeAll, "sandbox_ended"),
        ];
        for (mode, state, phase, req, want) in cases {
            let now = "2026-12-01T10:00:00Z".parse().unwrap();
            assert_eq!(code(change(&session(mode, state, phase), req, now)), want, "{mode} {state} {phase} {req:?}");
        }
    }
}

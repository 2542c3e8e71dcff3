//! What a session token may do: one decision, called by the gateway before
//! it acts and by the admission webhook for every write made in a token's
//! name, so the two cannot disagree.
//!
//! A token acts on the one session it was made for (same namespace, same
//! Sandbox name, same session uid — a re-created Sandbox of the same name is
//! another session), while it is active, within its scopes:
//! `read` (state, attach, commands, output), `exec` (send and cancel
//! commands), `control` (pause, resume, stop, Revoke All). Nothing else —
//! starting sessions, making or revoking tokens — is ever a token's.
//!
//! After its session ends only a `read`-only token still works, and only
//! to read.

use hangar_crds::session_token::{Scope, TokenPhase};
use hangar_crds::{ErrorCode, Sandbox, SandboxSpec, SessionToken};
use k8s_openapi::jiff::Timestamp;

use crate::refusal::Refusal;

/// The username a token acts as towards the apiserver (the gateway
/// impersonates it), so RBAC, audit and admission see the token.
pub fn identity(namespace: &str, name: &str) -> String {
    format!("{IDENTITY_PREFIX}{namespace}:{name}")
}

pub const IDENTITY_PREFIX: &str = "hangar:token:";
/// The group every token identity is in (RBAC binds it; the admission
/// webhook checks each write of it against the token).
pub const GROUP: &str = "hangar:session-tokens";

/// The token (namespace, name) a username names, if it is a token identity.
pub fn token_of_identity(username: &str) -> Option<(&str, &str)> {
    let rest = username.strip_prefix(IDENTITY_PREFIX)?;
    let (ns, name) = rest.split_once(':')?;
    (!ns.is_empty() && !name.is_empty() && !name.contains(':')).then_some((ns, name))
}

/// What `Command.status.sentBy` shows for `sender`: a token's name, else
/// the username.
pub fn sent_by(sender: &str) -> &str {
    token_of_identity(sender).map_or(sender, |(_, name)| name)
}

/// An act on a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    ReadState,
    Attach,
    ListCommands,
    ReadOutput,
    SendCommand,
    CancelCommand,
    Pause,
    Resume,
    Stop,
    RevokeAll,
    /// Acts no token may do: making or revoking tokens, snapshots, starting
    /// sessions, anything else.
    MemberOnly,
}

impl Action {
    /// The scope it needs (`None`: no token may).
    pub fn scope(self) -> Option<Scope> {
        match self {
            Action::ReadState | Action::Attach | Action::ListCommands | Action::ReadOutput => Some(Scope::Read),
            Action::SendCommand | Action::CancelCommand => Some(Scope::Exec),
            Action::Pause | Action::Resume | Action::Stop | Action::RevokeAll => Some(Scope::Control),
            Action::MemberOnly => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Action::ReadState => "read the state",
            Action::Attach => "attach",
            Action::ListCommands => "list commands",
            Action::ReadOutput => "read output",
            Action::SendCommand => "send a command",
            Action::CancelCommand => "cancel a command",
            Action::Pause => "pause",
            Action::Resume => "resume",
            Action::Stop => "stop",
            Action::RevokeAll => "Revoke All",
            Action::MemberOnly => "do this",
        }
    }
}

/// Whether `token` is active at `now`, whatever the operator has recorded
/// yet: revoked in spec, past its expiry, or ended with its session all
/// count at once.
pub fn active(token: &SessionToken, session: Option<&Sandbox>, now: Timestamp) -> Result<(), Refusal> {
    let status = token.status.clone().unwrap_or_default();
    let invalid = |why: &str| Err(Refusal::new(ErrorCode::TokenInvalid, format!("the token is {why}")));
    let Some(expires_at) = status.expires_at.as_ref().map(|t| t.0) else {
        return invalid("not issued yet");
    };
    let ended = session.is_some_and(Sandbox::has_ended);
    let now = crate::tokens::phase(status.phase, token.spec.revoked, &token.spec.scopes, expires_at, ended, now);
    match now.phase {
        TokenPhase::Active if status.digest.is_some() => Ok(()),
        TokenPhase::Active => invalid("not issued yet"),
        TokenPhase::Expired => invalid("expired"),
        TokenPhase::Revoked => invalid("revoked"),
    }
}

/// Whether `token` may do `action` on `session` at `now`.
pub fn decide(token: &SessionToken, session: &Sandbox, action: Action, now: Timestamp) -> Result<(), Refusal> {
    active(token, Some(session), now)?;
    let bound = token.metadata.namespace == session.metadata.namespace
        && Some(&token.spec.sandbox) == session.metadata.name.as_ref()
        && token.status.as_ref().and_then(|s| s.session_id.as_ref()) == session.metadata.uid.as_ref()
        && session.metadata.uid.is_some();
    if !bound {
        // The same answer whether or not the other session exists.
        return Err(Refusal::new(ErrorCode::TokenScopeForbidden, "this token is for another session"));
    }
    let Some(needed) = action.scope() else {
        return Err(Refusal::new(
            ErrorCode::TokenScopeForbidden,
            "a session token cannot do this; a member of the namespace can",
        ));
    };
    if !token.spec.scopes.contains(&needed) {
        return Err(Refusal::new(
            ErrorCode::TokenScopeForbidden,
            format!("to {} a token needs the scope {}", action.as_str(), scope_name(needed)),
        ));
    }
    if session.has_ended() && needed != Scope::Read {
        return Err(Refusal::new(ErrorCode::SandboxEnded, "the session has ended; a token can only read it"));
    }
    Ok(())
}

pub fn scope_name(scope: Scope) -> &'static str {
    match scope {
        Scope::Read => "read",
        Scope::Exec => "exec",
        Scope::Control => "control",
    }
}

/// The act a change of a Sandbox's spec is, for a token: only `state` and
/// `revokeAll` may change, one act at a time; any other change of the
/// object (spec, labels, annotations, finalizers) is no token's.
pub fn sandbox_change(old: &Sandbox, new: &Sandbox) -> Action {
    use hangar_crds::sandbox::DesiredState;
    let mut rest = new.spec.clone();
    rest.state = old.spec.state;
    rest.revoke_all = old.spec.revoke_all;
    // The retry annotation is how a resume is asked for again (the
    // gateway's resume route sets it): a control act, nothing else.
    let retry = crate::session::requests::RETRY_RESUME_ANNOTATION;
    let without_retry = |s: &Sandbox| {
        let mut a = s.metadata.annotations.clone().unwrap_or_default();
        let value = a.remove(retry);
        (a, value)
    };
    let ((old_annotations, old_retry), (new_annotations, new_retry)) = (without_retry(old), without_retry(new));
    let same_meta = old.metadata.labels == new.metadata.labels
        && old_annotations == new_annotations
        && old.metadata.finalizers == new.metadata.finalizers
        && old.metadata.owner_references == new.metadata.owner_references;
    if rest != old.spec || !same_meta {
        return Action::MemberOnly;
    }
    if old_retry != new_retry {
        return if old.spec == new.spec { Action::Resume } else { Action::MemberOnly };
    }
    let (a, b): (&SandboxSpec, &SandboxSpec) = (&old.spec, &new.spec);
    match (a.state != b.state, a.revoke_all != b.revoke_all) {
        (false, true) if b.revoke_all => Action::RevokeAll,
        // A change of nothing the token may change: still only a control act.
        (false, false) => Action::Pause,
        (true, false) => match b.state {
            DesiredState::Paused => Action::Pause,
            DesiredState::Running => Action::Resume,
            DesiredState::Ended => Action::Stop,
        },
        _ => Action::MemberOnly,
    }
}

/// The act a change of a Command is, for a token: setting `cancel` and
/// nothing else.
pub fn command_change(old: &hangar_crds::Command, new: &hangar_crds::Command) -> Action {
    let mut rest = new.spec.clone();
    rest.cancel = old.spec.cancel;
    let same_meta = old.metadata.labels == new.metadata.labels
        && old.metadata.annotations == new.metadata.annotations
        && old.metadata.finalizers == new.metadata.finalizers;
    if rest == old.spec && same_meta && new.spec.cancel { Action::CancelCommand } else { Action::MemberOnly }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hangar_crds::session_token::SessionTokenStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    const NOW: &str = "2026-12-01T10:00:00Z";

    fn session(uid: &str, phase: &str) -> Sandbox {
        serde_json::from_value(json!({
            "apiVersion": "hangar.dev/v1alpha1", "kind": "Sandbox",
            "metadata": {"name": "box", "namespace": "team-a", "uid": uid},
            "spec": {"mode": "commands", "image": "r/i@sha256:aa"},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    fn token(scopes: &[&str], f: impl FnOnce(&mut SessionToken)) -> SessionToken {
        let mut tok: SessionToken = serde_json::from_value(json!({
            "apiVersion": "hangar.dev/v1alpha1", "kind": "SessionToken",
            "metadata": {"name": "tok", "namespace": "team-a"},
            "spec": {"sandbox": "box", "scopes": scopes,
                     "publicKey": {"kty": "EC", "crv": "P-256", "x": "x", "y": "y"}},
        }))
        .unwrap();
        tok.status = Some(SessionTokenStatus {
            phase: Some(TokenPhase::Active),
            digest: Some("sha384:00".into()),
            expires_at: Some(Time(t("2026-12-01T11:00:00Z"))),
            session_id: Some("uid-1".into()),
            ..Default::default()
        });
        f(&mut tok);
        tok
    }

    fn code(r: Result<(), Refusal>) -> &'static str {
        r.err().map(|r| r.code.as_str()).unwrap_or("allowed")
    }

    #[test]
    fn each_scope_allows_its_acts_and_no_other() {
        let s = session("uid-1", "running");
        let now = t(NOW);
        let table = [
            (vec!["read"], Action::ReadState, "allowed"),
            (vec!["read"], Action::ReadOutput, "allowed"),
            (vec!["read"], Action::SendCommand, "token_scope_forbidden"),
            (vec!["read"], Action::Pause, "token_scope_forbidden"),
            (vec!["exec"], Action::SendCommand, "allowed"),
            (vec!["exec"], Action::CancelCommand, "allowed"),
            (vec!["exec"], Action::Pause, "token_scope_forbidden"),
            (vec!["exec"], Action::ReadState, "token_scope_forbidden"),
            (vec!["control"], Action::Stop, "allowed"),
            (vec!["control"], Action::RevokeAll, "allowed"),
            (vec!["control"], Action::SendCommand, "token_scope_forbidden"),
            (vec!["read", "exec", "control"], Action::MemberOnly, "token_scope_forbidden"),
        ];
        for (scopes, action, want) in table {
            assert_eq!(code(decide(&token(&scopes, |_| ()), &s, action, now)), want, "{scopes:?} {action:?}");
        }
    }

    #[test]
    fn a_token_ends_at_once_whatever_is_recorded() {
        let s = session("uid-1", "running");
        let now = t(NOW);
        let revoked_in_spec = token(&["exec"], |t| t.spec.revoked = true);
        assert_eq!(code(decide(&revoked_in_spec, &s, Action::SendCommand, now)), "token_invalid");
        let past = token(&["exec"], |_| ());
        assert_eq!(code(decide(&past, &s, Action::SendCommand, t("2026-12-01T11:00:00Z"))), "token_invalid");
        let recorded = token(&["exec"], |t| t.status.as_mut().unwrap().phase = Some(TokenPhase::Revoked));
        assert_eq!(code(decide(&recorded, &s, Action::SendCommand, now)), "token_invalid");
        let unissued = token(&["exec"], |t| t.status = None);
        assert_eq!(code(decide(&unissued, &s, Action::SendCommand, now)), "token_invalid");
    }

    #[test]
    fn a_token_is_for_its_own_session_only() {
        let now = t(NOW);
        let tok = token(&["read", "exec"], |_| ());
        // Same name, re-created: another session.
        assert_eq!(code(decide(&tok, &session("uid-2", "running"), Action::ReadState, now)), "token_scope_forbidden");
        let mut other_ns = session("uid-1", "running");
        other_ns.metadata.namespace = Some("team-b".into());
        assert_eq!(code(decide(&tok, &other_ns, Action::ReadState, now)), "token_scope_forbidden");
        let mut other_name = session("uid-1", "running");
        other_name.metadata.name = Some("other".into());
        assert_eq!(code(decide(&tok, &other_name, Action::ReadState, now)), "token_scope_forbidden");
    }

    #[test]
    fn after_the_end_only_a_read_only_token_reads() {
        let ended = session("uid-1", "ended");
        let now = t(NOW);
        assert_eq!(code(decide(&token(&["read"], |_| ()), &ended, Action::Attach, now)), "allowed");
        assert_eq!(code(decide(&token(&["read"], |_| ()), &ended, Action::SendCommand, now)), "token_scope_forbidden");
        assert_eq!(code(decide(&token(&["read", "exec"], |_| ()), &ended, Action::ReadState, now)), "token_invalid");
        assert_eq!(code(decide(&token(&["exec"], |_| ()), &ended, Action::SendCommand, now)), "token_invalid");
    }

    #[test]
    fn identities_name_one_token() {
        assert_eq!(identity("team-a", "tok"), "hangar:token:team-a:tok");
        assert_eq!(token_of_identity("hangar:token:team-a:tok"), Some(("team-a", "tok")));
        for bad in ["hangar:token:team-a", "hangar:token::tok", "hangar:token:a:b:c", "alice"] {
            assert_eq!(token_of_identity(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_token_changes_only_state_and_revoke_all() {
        use hangar_crds::sandbox::DesiredState;
        let old = session("uid-1", "running");
        let with = |f: &dyn Fn(&mut Sandbox)| {
            let mut s = old.clone();
            f(&mut s);
            sandbox_change(&old, &s)
        };
        assert_eq!(with(&|s| s.spec.state = DesiredState::Paused), Action::Pause);
        assert_eq!(with(&|s| s.spec.state = DesiredState::Ended), Action::Stop);
        assert_eq!(with(&|s| s.spec.revoke_all = true), Action::RevokeAll);
        assert_eq!(with(&|s| s.spec.stop_after_seconds = Some(999_999)), Action::MemberOnly);
        assert_eq!(with(&|s| s.spec.image = Some("evil@sha256:bb".into())), Action::MemberOnly);
        assert_eq!(
            with(&|s| {
                s.metadata.annotations = Some([("a".to_owned(), "b".to_owned())].into());
                s.spec.state = DesiredState::Paused;
            }),
            Action::MemberOnly
        );
        let mut paused = old.clone();
        paused.spec.state = DesiredState::Paused;
        assert_eq!(sandbox_change(&paused, &old), Action::Resume);
    }
}

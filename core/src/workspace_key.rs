//! Who gets a session's workspace key: only the worker on the session's
//! own instance, in this boot. The worker proves the instance with its
//! EC2 identity document (signed by the region's AWS certificate; checked
//! in `hangar_keys::instance_identity`) and a nonce the operator issued;
//! this decides whether that proven instance is the one the session runs
//! on now, from what the Sandbox status and a fresh DescribeInstances say.

use hangar_crds::Phase;
use k8s_openapi::jiff::Timestamp;
use serde::Deserialize;

/// The fields of an instance identity document hangar reads.
#[derive(Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct IdentityDocument {
    pub instance_id: String,
    pub region: String,
    pub account_id: String,
    /// When the instance last entered `pending`: this boot's start.
    pub pending_time: String,
}

/// The instance as DescribeInstances shows it now.
#[derive(Clone, Debug, Default)]
pub struct InstanceNow {
    pub running: bool,
    /// Its `hangar.dev/session-id` tag.
    pub session_id: Option<String>,
    /// The account that owns it (the reservation's owner).
    pub owner_account: Option<String>,
    /// Its launch time, seconds: the start of its current boot (EC2
    /// updates it at each start).
    pub launch_time: Option<i64>,
}

/// The session the worker asks for, from its Sandbox.
#[derive(Clone, Debug)]
pub struct SessionNow<'a> {
    pub session_id: &'a str,
    pub phase: Option<Phase>,
    /// `status.instanceId`: the instance of its current attempt.
    pub instance_id: Option<&'a str>,
    /// The region the operator runs sessions in.
    pub region: &'a str,
}

/// Why no key is handed over. The worker only hears "refused"; the reason
/// goes to the operator's log and metrics (`reason()`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyRefusal {
    #[error("the request is not a key request")]
    Malformed,
    #[error("the nonce was never issued, is used or has expired")]
    Nonce,
    #[error("the identity document is not signed by the regional certificate")]
    Signature,
    #[error("no session with that id is in a phase that runs an instance")]
    SessionNotServing,
    #[error("the document is of another region")]
    OtherRegion,
    #[error("the document is of an instance other than the session's current one")]
    OtherInstance,
    #[error("the instance is not running")]
    InstanceNotRunning,
    #[error("the instance does not carry the session's tag")]
    NotTagged,
    #[error("the document is of another account")]
    OtherAccount,
    #[error("the document is of an earlier boot of the instance")]
    EarlierBoot,
}

impl KeyRefusal {
    /// A stable label for metrics and logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::Nonce => "nonce",
            Self::Signature => "signature",
            Self::SessionNotServing => "session_not_serving",
            Self::OtherRegion => "other_region",
            Self::OtherInstance => "other_instance",
            Self::InstanceNotRunning => "instance_not_running",
            Self::NotTagged => "not_tagged",
            Self::OtherAccount => "other_account",
            Self::EarlierBoot => "earlier_boot",
        }
    }

    pub const ALL: [KeyRefusal; 10] = [
        Self::Malformed,
        Self::Nonce,
        Self::Signature,
        Self::SessionNotServing,
        Self::OtherRegion,
        Self::OtherInstance,
        Self::InstanceNotRunning,
        Self::NotTagged,
        Self::OtherAccount,
        Self::EarlierBoot,
    ];
}

/// Phases in which a worker may be starting on the session's instance
/// (a first boot, a resume, a recovery, a restarted worker mid-session).
fn serves(phase: Option<Phase>) -> bool {
    matches!(phase, Some(Phase::Launching | Phase::Running | Phase::Pausing | Phase::Resuming | Phase::Interrupted))
}

/// Decides for a signature already verified. `session` is `None` when no
/// Sandbox has that session id; `instance` when EC2 does not know it.
pub fn judge(
    doc: &IdentityDocument,
    session: Option<&SessionNow<'_>>,
    instance: Option<&InstanceNow>,
) -> Result<(), KeyRefusal> {
    let session = session.filter(|s| serves(s.phase)).ok_or(KeyRefusal::SessionNotServing)?;
    if doc.region != session.region {
        return Err(KeyRefusal::OtherRegion);
    }
    if session.instance_id != Some(doc.instance_id.as_str()) {
        return Err(KeyRefusal::OtherInstance);
    }
    let instance = instance.filter(|i| i.running).ok_or(KeyRefusal::InstanceNotRunning)?;
    if instance.session_id.as_deref() != Some(session.session_id) {
        return Err(KeyRefusal::NotTagged);
    }
    if instance.owner_account.as_deref() != Some(doc.account_id.as_str()) {
        return Err(KeyRefusal::OtherAccount);
    }
    let pending = doc.pending_time.parse::<Timestamp>().map_err(|_| KeyRefusal::Malformed)?;
    if instance.launch_time != Some(pending.as_second()) {
        return Err(KeyRefusal::EarlierBoot);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc() -> IdentityDocument {
        IdentityDocument {
            instance_id: "i-1".into(),
            region: "ap-southeast-2".into(),
            account_id: "123456789012".into(),
            pending_time: "2026-12-01T10:00:00Z".into(),
        }
    }

    fn session(phase: Phase) -> SessionNow<'static> {
        SessionNow { session_id: "s-1", phase: Some(phase), instance_id: Some("i-1"), region: "ap-southeast-2" }
    }

    fn instance() -> InstanceNow {
        InstanceNow {
            running: true,
            session_id: Some("s-1".into()),
            owner_account: Some("123456789012".into()),
            launch_time: Some("2026-12-01T10:00:00Z".parse::<Timestamp>().unwrap().as_second()),
        }
    }

    #[test]
    fn the_sessions_own_instance_in_this_boot_gets_the_key() {
        for phase in [Phase::Launching, Phase::Running, Phase::Pausing, Phase::Resuming, Phase::Interrupted] {
            assert_eq!(judge(&doc(), Some(&session(phase)), Some(&instance())), Ok(()), "{phase:?}");
        }
    }

    #[test]
    fn every_mismatch_has_its_refusal() {
        let s = session(Phase::Running);
        let i = instance();
        let cases: Vec<(IdentityDocument, Option<SessionNow>, Option<InstanceNow>, KeyRefusal)> = vec![
            (doc(), None, Some(i.clone()), KeyRefusal::SessionNotServing),
            (doc(), Some(session(Phase::Paused)), Some(i.clone()), KeyRefusal::SessionNotServing),
            (doc(), Some(session(Phase::Ended)), Some(i.clone()), KeyRefusal::SessionNotServing),
            (
                IdentityDocument { region: "us-east-1".into(), ..doc() },
                Some(s.clone()),
                Some(i.clone()),
                KeyRefusal::OtherRegion,
            ),
            (
                IdentityDocument { instance_id: "i-2".into(), ..doc() },
                Some(s.clone()),
                Some(i.clone()),
                KeyRefusal::OtherInstance,
            ),
            (doc(), Some(SessionNow { instance_id: None, ..s.clone() }), Some(i.clone()), KeyRefusal::OtherInstance),
            (doc(), Some(s.clone()), None, KeyRefusal::InstanceNotRunning),
            (doc(), Some(s.clone()), Some(InstanceNow { running: false, ..i.clone() }), KeyRefusal::InstanceNotRunning),
            (
                doc(),
                Some(s.clone()),
                Some(InstanceNow { session_id: Some("s-2".into()), ..i.clone() }),
                KeyRefusal::NotTagged,
            ),
            (doc(), Some(s.clone()), Some(InstanceNow { session_id: None, ..i.clone() }), KeyRefusal::NotTagged),
            (
                IdentityDocument { account_id: "999999999999".into(), ..doc() },
                Some(s.clone()),
                Some(i.clone()),
                KeyRefusal::OtherAccount,
            ),
            (
                IdentityDocument { pending_time: "2026-12-01T09:00:00Z".into(), ..doc() },
                Some(s.clone()),
                Some(i.clone()),
                KeyRefusal::EarlierBoot,
            ),
            (
                IdentityDocument { pending_time: "yesterday".into(), ..doc() },
                Some(s.clone()),
                Some(i.clone()),
                KeyRefusal::Malformed,
            ),
        ];
        for (d, s, i, want) in cases {
            assert_eq!(judge(&d, s.as_ref(), i.as_ref()), Err(want), "{d:?} {s:?} {i:?}");
        }
    }

    #[test]
    fn reasons_are_distinct() {
        let mut seen = std::collections::HashSet::new();
        assert!(KeyRefusal::ALL.iter().all(|r| seen.insert(r.reason())));
    }
}

//! The reset that runs at every end of a session: each step is confirmed by
//! observation, in this order, and the session is `reset_incomplete` until
//! every one is.

/// A reset step, as `status.reset[].step` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ResetStep {
    /// Every token with more than `read` scope (a `read` token keeps
    /// reading the ended session until it expires, as the contract says).
    RevokeTokens,
    CancelQueuedCommands,
    TerminateInstance,
    /// Only once the instance that held it is gone.
    DeleteVolume,
    /// Only once the volume is gone.
    DestroyKey,
    /// Last: the certificate records every step before it.
    SignCertificate,
}

impl ResetStep {
    /// The steps in the order they run.
    pub const ORDER: [ResetStep; 6] = [
        Self::RevokeTokens,
        Self::CancelQueuedCommands,
        Self::TerminateInstance,
        Self::DeleteVolume,
        Self::DestroyKey,
        Self::SignCertificate,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::RevokeTokens => "revoke_tokens",
            Self::CancelQueuedCommands => "cancel_queued_commands",
            Self::TerminateInstance => "terminate_instance",
            Self::DeleteVolume => "delete_volume",
            Self::DestroyKey => "destroy_key",
            Self::SignCertificate => "sign_certificate",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ORDER.into_iter().find(|step| step.as_str() == s)
    }

    /// What the reset waits for while this step is pending.
    pub const fn waiting_for(self) -> &'static str {
        match self {
            Self::RevokeTokens => "revoking the session's tokens",
            Self::CancelQueuedCommands => "cancelling the queued commands",
            Self::TerminateInstance => "terminating the instance",
            Self::DeleteVolume => "deleting the workspace volume",
            Self::DestroyKey => "destroying the workspace key",
            Self::SignCertificate => "signing the session certificate",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_step_reads_back_from_its_name() {
        for step in ResetStep::ORDER {
            assert_eq!(ResetStep::parse(step.as_str()), Some(step));
        }
        assert_eq!(ResetStep::parse("withdraw_everything"), None);
    }
}

//! The reset that runs at every end of a session: each step is confirmed by
//! observation, in this order, and the session is `reset_incomplete` until
//! every one is.

/// A reset step, as `status.reset[].step` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ResetStep {
    CancelQueuedCommands,
    TerminateInstance,
    /// Only once the instance that held it is gone.
    DeleteVolume,
    /// Only once the volume is gone.
    DestroyKey,
}

impl ResetStep {
    /// The steps in the order they run.
    pub const ORDER: [ResetStep; 4] =
        [Self::CancelQueuedCommands, Self::TerminateInstance, Self::DeleteVolume, Self::DestroyKey];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::CancelQueuedCommands => "cancel_queued_commands",
            Self::TerminateInstance => "terminate_instance",
            Self::DeleteVolume => "delete_volume",
            Self::DestroyKey => "destroy_key",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ORDER.into_iter().find(|step| step.as_str() == s)
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
        assert_eq!(ResetStep::parse("sign_certificate"), None);
    }
}

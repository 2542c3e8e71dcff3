//! How a session ends: why it was stopped (`status.stopReason`) and its
//! outcome (`status.outcome`).

/// Why the session is ending.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The Sandbox was deleted.
    Deleted,
    /// `spec.revokeAll` was set.
    RevokeAll,
    /// `spec.state: Ended`.
    Cancelled,
    /// Mode agent: the agent's process exited.
    AgentExited,
    /// Mode agent: the agent's command could not be started (the detail is
    /// the container's termination message).
    AgentStartFailed(String),
    /// The instance was terminated or vanished under the session.
    InstanceLost,
    /// Interrupted and not recovered: mode agent (never recovers), or not
    /// running again within the recovery window.
    InterruptionLost,
    /// No instance could be launched (capacity in every type and zone).
    InsufficientCapacity(String),
    /// EC2 refused the launch for another reason.
    LaunchFailed(String),
    /// `spec.template` names no template the session may use (none
    /// registered for its namespace, or one whose signature does not verify).
    Template(crate::refusal::Refusal),
    /// An image failed its preflight (or could not be read) before any
    /// instance started: the refusal's code and why.
    Preflight(crate::refusal::Refusal),
    /// Mode commands: idle for `idleTimeoutSeconds` with `idleAction: end`.
    IdleTimeout,
    /// The metered compute reached `stopAfterSeconds`.
    StopAfter,
    /// Paused for the longest a session may stay paused (7 days).
    PausedTooLong,
}

impl StopReason {
    /// The code at the start of `status.stopReason`.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Deleted => "deleted",
            Self::RevokeAll => "revoke_all",
            Self::Cancelled => "cancelled",
            Self::AgentExited => "agent_exited",
            Self::AgentStartFailed(_) => "agent_start_failed",
            Self::InstanceLost => "instance_lost",
            Self::InterruptionLost => "interruption_lost",
            Self::InsufficientCapacity(_) => "insufficient_capacity",
            Self::LaunchFailed(_) => "launch_failed",
            Self::Template(r) | Self::Preflight(r) => r.code.as_str(),
            Self::IdleTimeout => "idle_timeout",
            Self::StopAfter => "stop_after",
            Self::PausedTooLong => "paused_too_long",
        }
    }

    /// `status.stopReason`: the code, then the detail when there is one.
    pub fn text(&self) -> String {
        match self {
            Self::InsufficientCapacity(d) | Self::LaunchFailed(d) | Self::AgentStartFailed(d) => {
                format!("{}: {d}", self.code())
            }
            Self::Template(r) | Self::Preflight(r) => r.message(),
            _ => self.code().to_owned(),
        }
    }
}

/// The session's outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The agent ran to its end (mode agent).
    Completed,
    /// What happened inside cannot be known (the instance was lost).
    OutcomeUnknown,
}

impl Outcome {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::OutcomeUnknown => "outcome_unknown",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_reason_starts_with_its_code() {
        assert_eq!(StopReason::Cancelled.text(), "cancelled");
        assert_eq!(
            StopReason::InsufficientCapacity("InsufficientInstanceCapacity: none left".into()).text(),
            "insufficient_capacity: InsufficientInstanceCapacity: none left"
        );
    }
}

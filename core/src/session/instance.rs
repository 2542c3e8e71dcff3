//! The instance's state as the phase machine sees it (EC2's names, without
//! the SDK).

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstanceState {
    Pending,
    Running,
    Stopping,
    Stopped,
    ShuttingDown,
    Terminated,
}

impl InstanceState {
    /// Shutting down or terminated: it will never run again.
    pub fn is_gone(self) -> bool {
        matches!(self, Self::ShuttingDown | Self::Terminated)
    }
}

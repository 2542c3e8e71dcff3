//! EC2 errors, classified once so callers match on kinds, not strings.

use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ec2ErrorKind {
    /// RequestLimitExceeded, Throttling: retry with jittered backoff.
    Throttled,
    /// InsufficientInstanceCapacity and friends: try the next type or zone.
    InsufficientCapacity,
    /// Unknown AMI, subnet, security group, instance type: the session
    /// cannot launch with this configuration; fail it with the reason.
    InvalidConfiguration,
    /// The instance or volume does not exist (any more).
    NotFound,
    /// The resource is in a state that forbids the call (e.g. stopping a
    /// stopping instance); the reconcile tries again later.
    IncorrectState,
    /// Transport failures, 5xx and the rest: retried by the reconcile loop.
    Transient,
}

#[derive(Debug, thiserror::Error)]
#[error("EC2 {operation}: {code}: {message}")]
pub struct Ec2Error {
    pub operation: &'static str,
    pub kind: Ec2ErrorKind,
    pub code: String,
    pub message: String,
}

impl Ec2Error {
    pub fn classify(operation: &'static str, code: Option<&str>, message: Option<&str>) -> Self {
        let code = code.unwrap_or("Unknown").to_owned();
        let kind = kind_of(&code);
        Self { operation, kind, code, message: message.unwrap_or("").to_owned() }
    }

    pub fn is(&self, kind: Ec2ErrorKind) -> bool {
        self.kind == kind
    }
}

pub fn kind_of(code: &str) -> Ec2ErrorKind {
    use Ec2ErrorKind::*;
    match code {
        "RequestLimitExceeded" | "Throttling" | "ThrottlingException" | "RequestThrottled" => Throttled,
        "InsufficientInstanceCapacity"
        | "InsufficientHostCapacity"
        | "InsufficientCapacity"
        | "InsufficientVolumeCapacity"
        | "InsufficientFreeAddressesInSubnet"
        | "Unsupported" => InsufficientCapacity,
        "InvalidInstanceID.NotFound" | "InvalidInstanceID.Malformed" | "InvalidVolume.NotFound" => NotFound,
        "IncorrectInstanceState" | "IncorrectState" | "VolumeInUse" | "InvalidVolume.ZoneMismatch" => IncorrectState,
        c if c.starts_with("InvalidAMIID")
            || c.starts_with("InvalidSubnet")
            || c.starts_with("InvalidGroup")
            || c.starts_with("InvalidParameter")
            || c == "InvalidInstanceType"
            || c == "UnauthorizedOperation"
            || c == "InvalidKeyPair.NotFound" =>
        {
            InvalidConfiguration
        }
        _ => Transient,
    }
}

/// Jittered exponential backoff for throttling: base·2^n, capped, with
/// "equal jitter" (half fixed, half random) so retries of many sessions
/// spread out instead of arriving together.
pub fn throttle_backoff(attempt: u32, base: Duration, cap: Duration, random: u64) -> Duration {
    let exp = base.saturating_mul(1u32 << attempt.min(16));
    let ceiling = exp.min(cap);
    let half = ceiling / 2;
    let jitter_ms = if half.as_millis() == 0 { 0 } else { random % (half.as_millis() as u64 + 1) };
    half + Duration::from_millis(jitter_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_kinds() {
        assert_eq!(kind_of("RequestLimitExceeded"), Ec2ErrorKind::Throttled);
        assert_eq!(kind_of("InsufficientInstanceCapacity"), Ec2ErrorKind::InsufficientCapacity);
        assert_eq!(kind_of("InvalidAMIID.NotFound"), Ec2ErrorKind::InvalidConfiguration);
        assert_eq!(kind_of("InvalidSubnetID.NotFound"), Ec2ErrorKind::InvalidConfiguration);
        assert_eq!(kind_of("InvalidInstanceID.NotFound"), Ec2ErrorKind::NotFound);
        assert_eq!(kind_of("IncorrectInstanceState"), Ec2ErrorKind::IncorrectState);
        assert_eq!(kind_of("InternalError"), Ec2ErrorKind::Transient);
    }

    #[test]
    fn backoff_grows_is_capped_and_jittered() {
        let base = Duration::from_millis(100);
        let cap = Duration::from_secs(5);
        let d0 = throttle_backoff(0, base, cap, 0);
        let d3 = throttle_backoff(3, base, cap, 0);
        assert_eq!(d0, Duration::from_millis(50));
        assert_eq!(d3, Duration::from_millis(400));
        assert!(throttle_backoff(30, base, cap, u64::MAX) <= cap);
        assert_ne!(throttle_backoff(3, base, cap, 7), throttle_backoff(3, base, cap, 123));
    }
}

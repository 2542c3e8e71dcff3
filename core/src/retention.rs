//! Output retention: a session's output is kept `outputRetentionDays`
//! (1–90) after the session ends; then its keys are destroyed and reads
//! answer 410 `sandbox_output_erased`.

use hangar_crds::SandboxStatus;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// When the session ended: its last reset step's confirmation before the
/// certificate (which records this time, so signing it cannot move it).
pub fn ended_at(status: &SandboxStatus) -> Option<Timestamp> {
    let signing = crate::session::reset::ResetStep::SignCertificate.as_str();
    status.reset.iter().filter(|r| r.step != signing).map(|r| r.confirmed_at.0).max()
}

/// `ended + days` (a day being `day_seconds` long, shorter in tests).
pub fn erase_after(ended: Timestamp, days: i64, day_seconds: u64) -> Timestamp {
    ended + SignedDuration::from_secs(days.max(1) * day_seconds as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deadline_is_the_end_plus_the_retention_in_scaled_days() {
        let ended: Timestamp = "2026-11-30T10:00:00Z".parse().unwrap();
        assert_eq!(erase_after(ended, 30, 86400).to_string(), "2026-12-30T10:00:00Z");
        assert_eq!(erase_after(ended, 2, 1).to_string(), "2026-11-30T10:00:02Z", "a scaled clock: 1 s per day");
        let status: SandboxStatus = serde_yaml::from_str(
            "reset: [{step: a, confirmedAt: '2026-11-30T10:00:01Z'}, {step: b, confirmedAt: '2026-11-30T10:00:03Z'}]",
        )
        .unwrap();
        assert_eq!(ended_at(&status).unwrap().to_string(), "2026-11-30T10:00:03Z");
    }
}

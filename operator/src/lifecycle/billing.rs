//! The billing record in the status (`hangar_core::billing`): read off what
//! the status records at each write, and trued up once at the end.

use hangar_core::billing::{self, Usage};
use hangar_crds::{Phase, Sandbox, SandboxStatus};

use crate::settings::{Settings, shape_of};

/// The record for `status` as it is about to be written, `now` in seconds.
/// Paused storage grows per started hour only, so a paused session's
/// record changes once an hour, not at every reconcile.
pub fn record(
    settings: &Settings,
    sandbox: &Sandbox,
    status: &SandboxStatus,
    now: i64,
) -> hangar_crds::sandbox::Billing {
    let vcpus = status.instance_type.as_deref().and_then(shape_of).map(|(cpu, _)| i64::from(cpu)).unwrap_or(0);
    let usage = Usage {
        vcpus,
        volume_gib: i64::from(settings.volume_gib),
        compute_seconds: status.compute_seconds.unwrap_or(0),
        idle_seconds: status.idle_seconds.unwrap_or(0),
        pauses: billing::pauses(&status.attempts, now),
        first_ran: status.attempts.iter().any(|a| a.started_at.is_some()),
        stop_after_seconds: sandbox.spec.stop_after_seconds,
        over: matches!(status.phase, Some(Phase::Ended | Phase::Failed)),
    };
    billing::record(&settings.prices(), &usage)
}

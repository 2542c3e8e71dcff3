//! kstatus conditions: `Ready` (True only while running), with the phase as
//! reason, so Argo CD and Flux report a session's health without custom
//! health checks.

use hangar_crds::{Phase, SandboxStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

pub fn ready(previous: &[Condition], status: &SandboxStatus, generation: Option<i64>) -> Vec<Condition> {
    let phase = status.phase.unwrap_or(Phase::Launching);
    let (value, reason, message) = match phase {
        Phase::Running => ("True", "Running", "the session is running".to_owned()),
        Phase::Launching => ("False", "Launching", "starting the session's instance".to_owned()),
        Phase::Pausing => ("False", "Pausing", "closing the workspace and stopping the instance".to_owned()),
        Phase::Paused => match &status.resume_failed {
            None => ("False", "Paused", "instance stopped; workspace kept".to_owned()),
            Some(f) => (
                "False",
                "ResumeFailed",
                format!(
                    "the last resume could not start the instance ({}); paused until a new request \
                     (annotation hangar.dev/retry-resume with a new value, or a new spec)",
                    f.reason
                ),
            ),
        },
        Phase::Resuming => ("False", "Resuming", "starting the same instance again".to_owned()),
        Phase::Interrupted => ("False", "Interrupted", "the instance or its worker stopped reporting".to_owned()),
        Phase::Stopping => {
            let step = status.reset_pending.as_ref().map_or("", |p| p.message.as_str());
            ("False", "Stopping", format!("running the reset: {step}"))
        }
        Phase::ResetIncomplete => {
            let pending = status.reset_pending.as_ref();
            let step = pending.map_or("unknown", |p| p.step.as_str());
            let why = pending.map_or("", |p| p.message.as_str());
            ("False", "ResetIncomplete", format!("reset step {step} is not confirmed: {why}"))
        }
        Phase::Ended => ("False", "Ended", format!("ended: {}", status.stop_reason.as_deref().unwrap_or("unknown"))),
        Phase::Failed => ("False", "Failed", format!("failed: {}", status.stop_reason.as_deref().unwrap_or("unknown"))),
    };
    let old = previous.iter().find(|c| c.type_ == "Ready");
    let last_transition_time = match old {
        Some(c) if c.status == value => c.last_transition_time.clone(),
        _ => Time(Timestamp::now()),
    };
    let mut out: Vec<Condition> = previous.iter().filter(|c| c.type_ != "Ready").cloned().collect();
    out.push(Condition {
        type_: "Ready".into(),
        status: value.into(),
        reason: reason.into(),
        message,
        observed_generation: generation,
        last_transition_time,
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_follows_the_phase_and_keeps_its_transition_time() {
        let running = SandboxStatus { phase: Some(Phase::Running), ..Default::default() };
        let first = ready(&[], &running, Some(3));
        assert_eq!((first[0].status.as_str(), first[0].reason.as_str()), ("True", "Running"));
        assert_eq!(first[0].observed_generation, Some(3));
        let again = ready(&first, &running, Some(3));
        assert_eq!(again[0].last_transition_time, first[0].last_transition_time);
        let paused = SandboxStatus { phase: Some(Phase::Paused), ..Default::default() };
        assert_eq!(ready(&first, &paused, Some(4))[0].status, "False");
    }
}

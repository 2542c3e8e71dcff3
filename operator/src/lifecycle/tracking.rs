//! Benchmark tracking, apart from the pipeline: when a session's node was
//! first seen Ready and when the last watch event that completed its
//! prerequisites arrived, both measured to the moment `running` is written.

use hangar_core::session::phase_machine as phase;
use hangar_crds::{Phase, SandboxStatus};
use k8s_openapi::jiff::Timestamp;

use crate::context::Context;

/// For the benchmark: node Ready first seen (this attempt) → running, and
/// the last related watch event → running.
pub(super) fn track_prerequisites(
    ctx: &Context,
    (namespace, name, session): (&str, &str, &str),
    pass_started_ms: i64,
    before: &SandboxStatus,
    after: &SandboxStatus,
    obs: &phase::Observed,
) {
    let now = Timestamp::now().as_millisecond();
    let attempt = after.attempt.unwrap_or(0);
    let mut seen = ctx.metrics.first_seen.lock().unwrap_or_else(|p| p.into_inner());
    let entry = seen.entry(session.to_owned()).or_default();
    if entry.attempt != attempt {
        *entry = crate::metrics::FirstSeen { attempt, ..Default::default() };
    }
    if obs.node_ready == Some(true) {
        entry.node_ready.get_or_insert(now);
    }
    if after.phase == Some(Phase::Running) && before.phase != Some(Phase::Running) {
        let e = *entry;
        let trigger = ctx.metrics.last_trigger(namespace, name);
        if let Some(t) = e.node_ready {
            ctx.metrics.node_ready_to_running((now - t).max(0) as u64);
        }
        if let Some(t) = trigger {
            let total = (now - t).max(0);
            let queued = (pass_started_ms - t).clamp(0, total);
            if queued >= super::SLOW_PASS.as_millis() as i64 {
                tracing::info!(queued_ms = queued, total_ms = total, "running waited for its pass");
            }
            ctx.metrics.event_to_running(total as u64, queued as u64);
        }
    }
    if matches!(after.phase, Some(Phase::Ended | Phase::Failed)) {
        seen.remove(session);
    }
}

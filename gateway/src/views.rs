//! The JSON bodies of the routes, built from the Kubernetes objects.

use hangar_crds::{Command, CommandPhase, Sandbox};
use kube::ResourceExt;
use serde_json::{Value, json};

/// A session: state, attempts (cause, end, compute time), billing.
pub fn session(s: &Sandbox) -> Value {
    let st = s.status.clone().unwrap_or_default();
    json!({
        "id": s.uid(),
        "name": s.name_any(),
        "namespace": s.namespace(),
        "mode": s.spec.mode,
        "tenant": s.spec.tenant,
        "state": s.spec.state,
        "phase": st.phase,
        "attempt": st.attempt,
        "attempts": st.attempts,
        "instanceType": st.instance_type,
        "zone": st.zone,
        "outcome": st.outcome,
        "stopReason": st.stop_reason,
        "exitCode": st.exit_code,
        "computeSeconds": st.compute_seconds,
        "idleSeconds": st.idle_seconds,
        "billing": st.billing,
        "commands": st.commands,
        // The preflight's state; refused: the code, the reason and the next step.
        "imagePreflight": st.image_preflight,
    })
}

/// A command's status; an unnumbered one is reported `queued` (the
/// operator numbers it within moments).
pub fn phase(c: &Command) -> CommandPhase {
    c.status.as_ref().and_then(|s| s.phase).unwrap_or(CommandPhase::Queued)
}

pub fn command(c: &Command, stored_offset: Option<u64>) -> Value {
    let st = c.status.clone().unwrap_or_default();
    let mut v = json!({
        "id": c.name_any(),
        "number": st.number,
        "jobId": st.job_id,
        "argv": c.spec.argv,
        "status": phase(c).as_str(),
        "exitCode": st.exit_code,
        "attempt": st.attempt,
        "queuedAt": st.queued_at,
        "startedAt": st.started_at,
        "finishedAt": st.finished_at,
        "outputBytes": st.output_bytes,
        "sentBy": st.sent_by,
        "reason": st.reason,
    });
    if let Some(o) = stored_offset {
        v["storedOffset"] = json!(o);
    }
    v
}

//! The session certificate: what the session was and did, built at the end
//! of the reset from the Sandbox's status and its commands' final statuses.
//! Signing is `hangar_keys::certificate`; this module only decides what is
//! in it, and maps each command to its job outcome as the document orders:
//!
//! | command status | job outcome |
//! |---|---|
//! | exited | completed, with its exit code (or none when the process gave none) |
//! | cancelled, cancelling | cancelled |
//! | killed_at_pause | cancelled, reason `paused` |
//! | timed_out | ended abnormally, reason `timed_out` |
//! | outcome_unknown | ended abnormally, reason `outcome_unknown` and how its attempt ended |
//! | queued at the end (cancelled by the reset before it started) | not started |

use hangar_crds::{Command, CommandPhase, CommandStatus, Mode, Sandbox, SandboxStatus};
use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// The certificate format's version (a verifier refuses one it does not know).
pub const FORMAT: &str = "hangar.dev/session-certificate/v1";

/// The reason the reset gives the commands it cancels before they start.
pub const CANCELLED_BY_THE_END: &str = "session_ended";

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SessionCertificate {
    pub format: String,
    pub session_id: String,
    pub start: StartRecord,
    pub attempts: Vec<AttemptRecord>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interruptions: Vec<InterruptionRecord>,
    /// One per command, in number order.
    pub jobs: Vec<Job>,
    /// Mode agent: the agent's command as a process of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentRecord>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub companions: Vec<ImageRecord>,
    pub end: EndRecord,
    /// When the output keys are destroyed (`outputRetentionDays` after
    /// the end): no output can be read after it.
    pub output_erased_after: String,
    pub signed_at: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StartRecord {
    pub namespace: String,
    pub sandbox: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    pub mode: String,
    pub size: String,
    /// `name@version` when the session came from a template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// The agent's image as the session named it (by digest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The linux/arm64 manifest the agent image ran (from the preflight).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_manifest: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_gib: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_after_seconds: Option<i64>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AttemptRecord {
    pub number: i64,
    pub cause: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<String>,
    pub compute_seconds: i64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct InterruptionRecord {
    pub attempt: i64,
    pub cause: String,
    pub detected_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovered_at: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Job {
    /// `<sessionId>/cmd/<n>`.
    pub job_id: String,
    pub number: i64,
    pub outcome: JobOutcome,
    /// Completed: the process's exit code, when it gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum JobOutcome {
    Completed,
    Cancelled,
    EndedAbnormally,
    NotStarted,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AgentRecord {
    pub command: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ImageRecord {
    pub name: String,
    pub image: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EndRecord {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
    pub compute_seconds: i64,
    pub idle_seconds: i64,
    /// The reset steps confirmed before signing, in order.
    pub reset: Vec<String>,
}

/// A command's job outcome, its exit code and reason; `None` for a command
/// still unfinished (the reset settles every command before it signs).
pub fn job_outcome(status: &CommandStatus, attempts: &[hangar_crds::Attempt]) -> Option<(JobOutcome, Option<String>)> {
    let outcome = match status.phase? {
        CommandPhase::Exited => (JobOutcome::Completed, None),
        CommandPhase::Cancelled
            if status.started_at.is_none() && status.reason.as_deref() == Some(CANCELLED_BY_THE_END) =>
        {
            (JobOutcome::NotStarted, None)
        }
        CommandPhase::Cancelled | CommandPhase::Cancelling => (JobOutcome::Cancelled, None),
        CommandPhase::KilledAtPause => (JobOutcome::Cancelled, Some("paused".to_owned())),
        CommandPhase::TimedOut => (JobOutcome::EndedAbnormally, Some("timed_out".to_owned())),
        CommandPhase::OutcomeUnknown => {
            let end = attempts.iter().find(|a| Some(a.number) == status.attempt).and_then(|a| a.end);
            let how = end.map_or_else(|| "unknown".to_owned(), |e| enum_str(&e));
            (JobOutcome::EndedAbnormally, Some(format!("outcome_unknown: attempt ended {how}")))
        }
        CommandPhase::Queued => (JobOutcome::NotStarted, None),
        CommandPhase::Running => return None,
    };
    Some(outcome)
}

/// The wire name of a status enum (its serde rename), so the certificate
/// says exactly what the status says.
fn enum_str<T: Serialize>(v: &T) -> String {
    serde_json::to_value(v).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
}

/// How long a retention day lasts, and when the certificate is signed.
#[derive(Clone, Copy, Debug)]
pub struct Signing {
    pub signed_at: Timestamp,
    pub retention_day_seconds: u64,
}

/// The certificate of `sandbox` (whose reset has confirmed every step
/// before signing) and its `commands`: only the commands bound to this
/// session and numbered count, in number order.
pub fn build(sandbox: &Sandbox, status: &SandboxStatus, commands: &[Command], signing: Signing) -> SessionCertificate {
    let session_id = sandbox.metadata.uid.clone().unwrap_or_default();
    let spec = &sandbox.spec;
    let ts = |t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time| t.0.to_string();
    let checked = status.image_preflight.as_ref().map(|p| p.images.as_slice()).unwrap_or_default();
    let agent_image = spec.image.clone().or_else(|| checked.first().map(|c| c.image.clone()));
    let image_manifest =
        agent_image.as_ref().and_then(|i| checked.iter().find(|c| &c.image == i)).map(|c| c.manifest_digest.clone());

    let mut ours: Vec<(&Command, &CommandStatus, i64)> = commands
        .iter()
        .filter_map(|c| {
            let st = c.status.as_ref()?;
            (st.sandbox_uid.as_deref() == Some(session_id.as_str())).then_some(())?;
            Some((c, st, st.number?))
        })
        .collect();
    ours.sort_by_key(|(_, _, n)| *n);
    let jobs = ours
        .iter()
        .filter_map(|(_, st, number)| {
            let (outcome, reason) = job_outcome(st, &status.attempts)?;
            Some(Job {
                job_id: st.job_id.clone().unwrap_or_else(|| format!("{session_id}/cmd/{number}")),
                number: *number,
                outcome,
                exit_code: if outcome == JobOutcome::Completed { st.exit_code } else { None },
                reason,
                attempt: st.attempt,
                started_at: st.started_at.as_ref().map(ts),
                finished_at: st.finished_at.as_ref().map(ts),
            })
        })
        .collect();

    let ended_at = crate::retention::ended_at(status);
    let erase = crate::retention::erase_after(
        ended_at.unwrap_or(signing.signed_at),
        spec.output_retention_days,
        signing.retention_day_seconds,
    );
    SessionCertificate {
        format: FORMAT.to_owned(),
        session_id: session_id.clone(),
        start: StartRecord {
            namespace: sandbox.metadata.namespace.clone().unwrap_or_default(),
            sandbox: sandbox.metadata.name.clone().unwrap_or_default(),
            tenant: spec.tenant.clone(),
            mode: enum_str(&spec.mode),
            size: enum_str(&spec.size),
            template: spec.template.clone(),
            image: agent_image,
            image_manifest,
            created_at: sandbox.metadata.creation_timestamp.as_ref().map(ts),
            instance_type: status.instance_type.clone(),
            memory_gib: status.memory_gib,
            stop_after_seconds: spec.stop_after_seconds,
        },
        attempts: status
            .attempts
            .iter()
            .map(|a| AttemptRecord {
                number: a.number,
                cause: enum_str(&a.cause),
                started_at: a.started_at.as_ref().map(ts),
                ended_at: a.ended_at.as_ref().map(ts),
                end: a.end.map(|e| enum_str(&e)),
                compute_seconds: a.compute_seconds,
            })
            .collect(),
        interruptions: status
            .interruptions
            .iter()
            .map(|i| InterruptionRecord {
                attempt: i.attempt,
                cause: enum_str(&i.cause),
                detected_at: ts(&i.detected_at),
                recovered_at: i.recovered_at.as_ref().map(ts),
            })
            .collect(),
        jobs,
        agent: (spec.mode == Mode::Agent)
            .then(|| AgentRecord { command: spec.command.clone(), exit_code: status.exit_code }),
        companions: spec
            .companions
            .iter()
            .map(|c| ImageRecord { name: c.name.clone(), image: c.image.clone() })
            .collect(),
        end: EndRecord {
            ended_at: ended_at.map(|t| t.to_string()),
            outcome: status.outcome.clone(),
            stop_reason: status.stop_reason.clone(),
            compute_seconds: status.compute_seconds.unwrap_or(0),
            idle_seconds: status.idle_seconds.unwrap_or(0),
            reset: status.reset.iter().map(|r| r.step.clone()).collect(),
        },
        output_erased_after: erase.to_string(),
        signed_at: signing.signed_at.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(yaml: &str) -> CommandStatus {
        serde_yaml::from_str(yaml).unwrap()
    }

    fn attempts() -> Vec<hangar_crds::Attempt> {
        serde_yaml::from_str(
            "- {number: 1, cause: launch, startedAt: '2026-12-01T10:00:00Z', endedAt: '2026-12-01T10:05:00Z', end: interrupted}\n\
             - {number: 2, cause: recovery, startedAt: '2026-12-01T10:07:00Z', endedAt: '2026-12-01T10:09:00Z', end: session_ended}",
        )
        .unwrap()
    }

    #[test]
    fn every_final_status_maps_to_the_documents_outcome() {
        let a = attempts();
        let cases = [
            ("{phase: exited, exitCode: 3}", Some((JobOutcome::Completed, None))),
            ("{phase: exited}", Some((JobOutcome::Completed, None))),
            ("{phase: cancelled, startedAt: '2026-12-01T10:01:00Z'}", Some((JobOutcome::Cancelled, None))),
            ("{phase: cancelled, reason: token_ended}", Some((JobOutcome::Cancelled, None))),
            ("{phase: cancelling}", Some((JobOutcome::Cancelled, None))),
            ("{phase: killed_at_pause}", Some((JobOutcome::Cancelled, Some("paused".into())))),
            ("{phase: timed_out}", Some((JobOutcome::EndedAbnormally, Some("timed_out".into())))),
            (
                "{phase: outcome_unknown, attempt: 1}",
                Some((JobOutcome::EndedAbnormally, Some("outcome_unknown: attempt ended interrupted".into()))),
            ),
            ("{phase: cancelled, reason: session_ended}", Some((JobOutcome::NotStarted, None))),
            ("{phase: queued}", Some((JobOutcome::NotStarted, None))),
            ("{phase: running}", None),
        ];
        for (yaml, want) in cases {
            assert_eq!(job_outcome(&status(yaml), &a), want, "{yaml}");
        }
    }

    #[test]
    fn the_certificate_lists_this_sessions_numbered_commands_in_order() {
        let sandbox: Sandbox = serde_yaml::from_str(
            "apiVersion: hangar.dev/v1alpha1\nkind: Sandbox\n\
             metadata: {name: s, namespace: team, uid: u-1, creationTimestamp: '2026-12-01T09:59:59Z'}\n\
             spec: {mode: commands, image: 'r/a@sha256:aa', tenant: acme, outputRetentionDays: 2}\n",
        )
        .unwrap();
        let status: SandboxStatus = serde_yaml::from_str(
            "attempts:\n\
             - {number: 1, cause: launch, startedAt: '2026-12-01T10:00:00Z', endedAt: '2026-12-01T10:05:00Z', end: session_ended, computeSeconds: 300}\n\
             computeSeconds: 300\noutcome: completed\nstopReason: cancelled\n\
             reset:\n- {step: revoke_tokens, confirmedAt: '2026-12-01T10:05:01Z'}\n- {step: destroy_key, confirmedAt: '2026-12-01T10:05:09Z'}\n",
        )
        .unwrap();
        let command = |name: &str, yaml: &str| -> Command {
            serde_yaml::from_str(&format!(
                "apiVersion: hangar.dev/v1alpha1\nkind: Command\nmetadata: {{name: {name}, namespace: team}}\n\
                 spec: {{sandbox: s, argv: [true]}}\nstatus: {yaml}\n"
            ))
            .unwrap()
        };
        let commands = vec![
            command("b", "{number: 2, phase: exited, exitCode: 0, sandboxUid: u-1}"),
            command("a", "{number: 1, phase: timed_out, exitCode: 137, sandboxUid: u-1}"),
            command("other", "{number: 1, phase: exited, sandboxUid: u-0}"),
            command("unnumbered", "{phase: cancelled, sandboxUid: u-1}"),
        ];
        let signed_at: Timestamp = "2026-12-01T10:05:10Z".parse().unwrap();
        let c = build(&sandbox, &status, &commands, Signing { signed_at, retention_day_seconds: 86400 });
        assert_eq!(c.jobs.iter().map(|j| j.job_id.as_str()).collect::<Vec<_>>(), ["u-1/cmd/1", "u-1/cmd/2"]);
        assert_eq!(c.jobs[0].outcome, JobOutcome::EndedAbnormally);
        assert_eq!(c.jobs[0].exit_code, None, "only a completed job carries an exit code");
        assert_eq!(c.jobs[1].exit_code, Some(0));
        assert_eq!(c.start.tenant.as_deref(), Some("acme"));
        assert_eq!(c.end.ended_at.as_deref(), Some("2026-12-01T10:05:09Z"));
        assert_eq!(c.output_erased_after, "2026-12-03T10:05:09Z", "two days after the end");
        assert_eq!(c.agent, None, "mode commands has no agent process");
    }
}

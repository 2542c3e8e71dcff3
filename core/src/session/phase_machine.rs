//! The session phase machine, as pure code: from what the operator observed
//! (instance, node, worker heartbeat, agent Pod, key, commands) and the
//! Sandbox's current status, it decides the next status and the side
//! effects to make. No client here; the operator's `lifecycle/` does the
//! I/O.
//!
//! launching → running → pausing → paused → resuming → running → stopping →
//! ended, plus failed (ended before any instance existed) and
//! reset_incomplete (a reset step failed and is being retried).

use std::time::Duration;

use hangar_crds::{
    Attempt, AttemptCause, AttemptEnd, CheckedImage, ImagePreflight, Interruption, InterruptionCause, Mode,
    PauseProgress, Phase, PreflightState, ResetPending, ResetStepStatus, SandboxStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::ending::{Outcome, StopReason};
use super::instance::InstanceState;
use super::reset::ResetStep;

/// What the Sandbox's spec and metadata ask for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Desired {
    Run,
    Pause,
    /// End the session; the reason becomes `status.stopReason`.
    End(StopReason),
}

/// The worker's latest heartbeat, if it is fresh.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerReport {
    pub attempt: i64,
    pub workspace_closed: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentState {
    Absent,
    Pending,
    Running,
    Exited(i32),
}

/// The image preflight as the operator found it: checks in flight, every
/// image passed, or one refused (or a template that cannot be used).
#[derive(Clone, Debug, PartialEq)]
pub enum ImageCheck {
    /// Some image is still being read; `note` says what it waits for (a
    /// registry that does not answer, say).
    Pending {
        note: Option<String>,
    },
    Passed(Vec<CheckedImage>),
    Refused(StopReason),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VolumeState {
    /// Not looked at this time (nothing in this phase needs it).
    Unknown,
    Absent,
    Present {
        attached: bool,
    },
}

#[derive(Clone, Debug)]
pub struct Observed {
    pub now: Timestamp,
    pub mode: Mode,
    pub desired: Desired,
    /// `None`: no instance of this session exists (or ever did).
    pub instance: Option<InstanceState>,
    pub volume: VolumeState,
    /// `None`: no Node has registered for the instance.
    pub node_ready: Option<bool>,
    pub node_prepared: bool,
    pub worker: Option<WorkerReport>,
    pub agent: AgentState,
    pub key_present: bool,
    pub unfinished_commands: usize,
    /// Tokens of the session still active with more than `read` scope
    /// (read only while the session ends).
    pub tokens_to_revoke: usize,
    pub pause_grace: Duration,
    /// The resume request the Sandbox makes now
    /// (`super::requests::resume_request`).
    pub resume_request: String,
    /// Mode commands: whether the session is active now, and its idle policy
    /// (the timeout already in real time). `None` in mode agent.
    pub idle: Option<Idle>,
    /// `stopAfterSeconds` in real time: the metered compute of all attempts
    /// at which the session ends (`None`: no hard stop).
    pub stop_after: Option<Duration>,
    /// The longest a session stays paused before it ends (7 days).
    pub max_pause: Duration,
    /// When the worker last renewed its heartbeat for this session (any
    /// attempt, fresh or not).
    pub last_heartbeat: Option<Timestamp>,
    /// A worker silent this long, its instance running, is lost (60 s).
    /// `None`: the heartbeats are not known yet (e.g. just after a restart,
    /// before the Lease cache has listed), so no worker is judged lost.
    pub worker_lost_after: Option<Duration>,
    /// How long an interrupted session waits to run again (30 min).
    pub recovery_window: Duration,
    /// How often StartInstances is asked again while it waits.
    pub recovery_retry: Duration,
    /// Commands marked running (or cancelling).
    pub running_commands: usize,
    /// Mode agent: the agent container's termination message, if it ended
    /// with one (the supervisor writes why the agent could not start).
    pub agent_message: Option<String>,
    /// EC2 warned that the instance is about to be reclaimed.
    pub reclaim_warned: bool,
    /// The image preflight (consulted only before the first launch).
    pub images: ImageCheck,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Idle {
    /// A command runs, or a client attached in the last 30 s.
    pub active: bool,
    pub timeout: Duration,
    pub action: hangar_crds::IdleAction,
}

/// A side effect, executed in order by the reconciler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Read the session's images from their registries (in the background;
    /// the result wakes the session).
    PreflightImages,
    EnsureKey,
    Launch,
    EnsureVolume,
    AttachVolume,
    PrepareNode,
    CreateAgentPod,
    /// A normal StopInstances (the OS shuts down cleanly), never forced.
    StopInstance,
    StartInstance,
    /// StartInstances for a recovery: capacity refusals are waited out
    /// (asked again after `recovery_retry`), not a failed resume.
    RecoverInstance,
    /// Every command marked running ends `outcome_unknown` (it ran on an
    /// attempt that was lost) and never runs again.
    SettleInterruptedCommands,
    /// Every token of the session beyond `read` scope is revoked.
    RevokeTokens,
    CancelQueuedCommands,
    TerminateInstance,
    DeleteVolume,
    DestroyKey,
    /// Build, sign and store the session certificate (records
    /// `status.certificate`).
    SignCertificate,
}

impl Action {
    /// The reset step this action carries out, if it is one.
    pub const fn reset_step(&self) -> Option<ResetStep> {
        Some(match self {
            Self::RevokeTokens => ResetStep::RevokeTokens,
            Self::CancelQueuedCommands => ResetStep::CancelQueuedCommands,
            Self::TerminateInstance => ResetStep::TerminateInstance,
            Self::DeleteVolume => ResetStep::DeleteVolume,
            Self::DestroyKey => ResetStep::DestroyKey,
            Self::SignCertificate => ResetStep::SignCertificate,
            _ => return None,
        })
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub status: SandboxStatus,
    pub actions: Vec<Action>,
    /// Kubernetes Events to record: (reason, note).
    pub events: Vec<(&'static str, String)>,
    /// Look again after this long even if nothing is watched to change.
    pub requeue_after: Option<Duration>,
}

pub fn plan(current: &SandboxStatus, obs: &Observed) -> Plan {
    let mut p = Plan { status: current.clone(), actions: vec![], events: vec![], requeue_after: None };
    let phase = current.phase.unwrap_or(Phase::Launching);
    p.status.phase = Some(phase);
    match phase {
        Phase::Launching => launching(&mut p, obs),
        Phase::Running => running(&mut p, obs),
        Phase::Pausing => pausing(&mut p, obs),
        Phase::Paused => paused(&mut p, obs),
        Phase::Resuming => resuming(&mut p, obs),
        Phase::Stopping | Phase::ResetIncomplete => stopping(&mut p, obs),
        Phase::Interrupted => interrupted(&mut p, obs),
        Phase::Ended | Phase::Failed => {}
    }
    p.status.hard_stop_at = hard_stop_at(&p, obs);
    p
}

/// While an attempt runs under `stopAfterSeconds`: when its compute, added
/// to the ended attempts', reaches the limit.
fn hard_stop_at(p: &Plan, obs: &Observed) -> Option<Time> {
    let limit = obs.stop_after?;
    if !matches!(p.status.phase, Some(Phase::Launching | Phase::Running | Phase::Resuming | Phase::Interrupted)) {
        return None;
    }
    let current = p.status.attempts.iter().find(|a| Some(a.number) == p.status.attempt && a.end.is_none())?;
    let start = current.started_at.as_ref()?.0;
    let before: i64 = p.status.attempts.iter().filter(|a| a.end.is_some()).map(|a| a.compute_seconds).sum();
    let left = limit.as_millis() as i64 - before * 1000;
    Some(ts(start.checked_add(k8s_openapi::jiff::SignedDuration::from_millis(left.max(0))).unwrap_or(start)))
}

fn ts(t: Timestamp) -> Time {
    Time(t)
}

fn set_phase(p: &mut Plan, phase: Phase, reason: &'static str, note: String) {
    if p.status.phase != Some(phase) {
        p.status.phase = Some(phase);
        p.events.push((reason, note));
    }
}

fn current_attempt(p: &mut Plan) -> Option<&mut Attempt> {
    let n = p.status.attempt?;
    p.status.attempts.iter_mut().find(|a| a.number == n)
}

fn open_attempt(p: &mut Plan, cause: AttemptCause) {
    p.status.reclaim_warned_at = None;
    let number = p.status.attempt.unwrap_or(0) + 1;
    p.status.attempt = Some(number);
    p.status.attempts.push(Attempt { number, cause, started_at: None, ended_at: None, end: None, compute_seconds: 0 });
}

/// Marks the current attempt's instance as running from now (metering starts).
fn attempt_running(p: &mut Plan, now: Timestamp) {
    if let Some(a) = current_attempt(p)
        && a.started_at.is_none()
    {
        a.started_at = Some(ts(now));
    }
}

fn end_attempt(p: &mut Plan, end: AttemptEnd, now: Timestamp) {
    let Some(a) = current_attempt(p) else { return };
    if a.end.is_some() {
        return;
    }
    a.end = Some(end);
    // Metered to `now`, never before the attempt started.
    let now = a.started_at.as_ref().map_or(now, |s| now.max(s.0));
    a.ended_at = Some(ts(now));
    if let Some(start) = &a.started_at {
        a.compute_seconds = (now.as_second() - start.0.as_second()).max(0);
    }
    let total: i64 = p.status.attempts.iter().map(|a| a.compute_seconds).sum();
    p.status.compute_seconds = Some(total);
}

/// Node Ready, the worker of this attempt heartbeating, the agent running.
fn attempt_ready(p: &Plan, obs: &Observed) -> bool {
    obs.instance == Some(InstanceState::Running)
        && obs.node_ready == Some(true)
        && obs.worker.as_ref().is_some_and(|w| Some(w.attempt) == p.status.attempt)
        && obs.agent == AgentState::Running
}

/// Keeps the node and the agent Pod in place while an attempt comes up.
fn bring_up(p: &mut Plan, obs: &Observed) {
    if obs.node_ready.is_some() {
        if !obs.node_prepared {
            p.actions.push(Action::PrepareNode);
        }
        if obs.agent == AgentState::Absent {
            p.actions.push(Action::CreateAgentPod);
        }
    }
}

fn launching(p: &mut Plan, obs: &Observed) {
    if let Desired::End(reason) = &obs.desired {
        return begin_stop(p, obs, reason);
    }
    // Before the first launch, every image passes its preflight: nothing
    // is made (no key, no EC2 call) until then. A pass that launched but
    // lost its status write records the (cached) result afterwards.
    let launched = obs.instance.is_some() || p.status.instance_id.is_some();
    if !launched && !preflight_passed(p, obs) {
        return;
    }
    if launched && matches!(&obs.images, ImageCheck::Passed(images) if !images.is_empty()) {
        preflight_passed(p, obs);
    }
    if !obs.key_present {
        p.actions.push(Action::EnsureKey);
    }
    if p.status.attempts.is_empty() {
        open_attempt(p, AttemptCause::Launch);
    }
    match obs.instance {
        None => p.actions.push(Action::Launch),
        Some(state) if state.is_gone() => {
            // Gone before it ever ran: nothing to recover on a launch.
            end_outcome_unknown(p, obs, &StopReason::InstanceLost)
        }
        Some(state) => {
            match obs.volume {
                VolumeState::Absent => p.actions.push(Action::EnsureVolume),
                VolumeState::Present { attached: false } if state == InstanceState::Running => {
                    p.actions.push(Action::AttachVolume)
                }
                VolumeState::Present { attached: true } => p.status.volume_attached = Some(true),
                _ => {}
            }
            if state == InstanceState::Running {
                attempt_running(p, obs.now);
                bring_up(p, obs);
            }
            if attempt_ready(p, obs) && p.status.volume_attached == Some(true) {
                set_phase(p, Phase::Running, "Running", "node ready, worker reporting, agent running".into());
            }
        }
    }
}

/// Folds the preflight into the status; `true` once every image passed.
fn preflight_passed(p: &mut Plan, obs: &Observed) -> bool {
    let already = p.status.image_preflight.as_ref().is_some_and(|i| i.state == PreflightState::Passed);
    match &obs.images {
        _ if already => true,
        ImageCheck::Passed(images) => {
            let total: i64 = images.iter().map(|i| i.compressed_bytes).sum();
            let started_at = p.status.image_preflight.as_ref().and_then(|i| i.started_at.clone());
            p.status.image_preflight = Some(ImagePreflight {
                state: PreflightState::Passed,
                images: images.clone(),
                started_at,
                ..Default::default()
            });
            p.events.push((
                "PreflightPassed",
                format!("{} image(s) are linux/arm64, {total} bytes compressed", images.len()),
            ));
            true
        }
        ImageCheck::Pending { note } => {
            let started_at = p.status.image_preflight.as_ref().and_then(|i| i.started_at.clone());
            let started = started_at.is_none();
            p.status.image_preflight = Some(ImagePreflight {
                state: PreflightState::Pending,
                code: Some(hangar_crds::ErrorCode::ImagePreflightPending.as_str().into()),
                message: Some(note.clone().unwrap_or_else(|| "reading the images from their registries".into())),
                started_at: Some(started_at.unwrap_or_else(|| ts(obs.now))),
                ..Default::default()
            });
            if started {
                p.events.push(("ImagePreflight", "checking the images before any instance starts".into()));
            }
            p.actions.push(Action::PreflightImages);
            false
        }
        ImageCheck::Refused(reason) => {
            let text = reason.text();
            let message = text.split_once(": ").map_or(text.as_str(), |(_, m)| m).to_owned();
            let started_at = p.status.image_preflight.as_ref().and_then(|i| i.started_at.clone());
            p.status.image_preflight = Some(ImagePreflight {
                state: PreflightState::Refused,
                code: Some(reason.code().into()),
                message: Some(message),
                started_at,
                ..Default::default()
            });
            p.events.push(("PreflightFailed", text));
            begin_stop(p, obs, reason);
            false
        }
    }
}

/// An idle stretch ends (activity, or the session leaves running): its
/// seconds go to `status.idleSeconds`, the compute spent idle.
fn end_idle(p: &mut Plan, now: Timestamp) {
    if let Some(since) = p.status.idle_since.take() {
        let secs = (now.as_second() - since.0.as_second()).max(0);
        p.status.idle_seconds = Some(p.status.idle_seconds.unwrap_or(0) + secs);
    }
}

fn begin_pause(p: &mut Plan, obs: &Observed, note: &str) {
    end_idle(p, obs.now);
    p.status.pause = Some(PauseProgress { requested_at: Some(ts(obs.now)), ..Default::default() });
    set_phase(p, Phase::Pausing, "Pausing", note.into());
    p.requeue_after = Some(obs.pause_grace);
}

/// Compute metered so far: the ended attempts', and the current one's
/// since it started running (a pause does not count).
fn compute_used(p: &Plan, now: Timestamp) -> Duration {
    let secs: i64 = p
        .status
        .attempts
        .iter()
        .map(|a| match (&a.end, &a.started_at) {
            (None, Some(start)) => (now.as_second() - start.0.as_second()).max(0),
            _ => a.compute_seconds,
        })
        .sum();
    Duration::from_secs(secs.max(0) as u64)
}

fn running(p: &mut Plan, obs: &Observed) {
    if let Desired::End(reason) = &obs.desired {
        return begin_stop(p, obs, reason);
    }
    // Before the interruption checks: at the limit the node stops itself,
    // which is the hard stop, not a reclamation. The deadline the node was
    // given counts as reached (metering in whole seconds may say a moment
    // less).
    if let Some(limit) = obs.stop_after {
        let used = compute_used(p, obs.now);
        let deadline_passed = p.status.hard_stop_at.as_ref().is_some_and(|t| obs.now >= t.0);
        if used >= limit || deadline_passed {
            return begin_stop(p, obs, &StopReason::StopAfter);
        }
        let left = limit - used;
        wait_at_most(p, left);
    }
    if detect_interruption(p, obs, false) {
        return;
    }
    if obs.mode == Mode::Agent
        && let AgentState::Exited(code) = obs.agent
    {
        p.status.exit_code = Some(code);
        // 127 with the supervisor's message: it never ran, so no outcome.
        // The message is capped: code in the sandbox can write it too.
        if let (127, Some(why)) = (code, obs.agent_message.as_deref()) {
            let why: String = why.chars().filter(|c| !c.is_control()).take(200).collect();
            return begin_stop(p, obs, &StopReason::AgentStartFailed(why));
        }
        p.status.outcome = Some(Outcome::Completed.as_str().into());
        return begin_stop(p, obs, &StopReason::AgentExited);
    }
    if obs.desired == Desired::Pause && obs.mode == Mode::Commands {
        return begin_pause(p, obs, "closing the workspace before stopping the instance");
    }
    if let Some(idle) = obs.idle {
        if idle.active {
            end_idle(p, obs.now);
        } else {
            let since = p.status.idle_since.as_ref().map_or(obs.now, |t| t.0);
            p.status.idle_since = Some(ts(since));
            let idle_for = Duration::from_secs((obs.now.as_second() - since.as_second()).max(0) as u64);
            if idle_for >= idle.timeout {
                end_idle(p, obs.now);
                match idle.action {
                    hangar_crds::IdleAction::End => return begin_stop(p, obs, &StopReason::IdleTimeout),
                    hangar_crds::IdleAction::Pause => {
                        // The spec still says Running: this request stays
                        // paused; a new one resumes.
                        p.status.idle_paused_request = Some(obs.resume_request.clone());
                        return begin_pause(p, obs, "idle: closing the workspace before stopping the instance");
                    }
                }
            }
            let left = idle.timeout - idle_for;
            wait_at_most(p, left);
        }
    }
    // Look again when the worker would count as lost if it stays silent.
    if let (Some(after), Some(hb)) = (obs.worker_lost_after, obs.last_heartbeat) {
        let left = after.saturating_sub(elapsed(obs.now, hb)) + Duration::from_millis(100);
        wait_at_most(p, left);
    }
    // Keep the pieces in place (e.g. a node relabelled by hand).
    bring_up(p, obs);
}

fn elapsed(now: Timestamp, since: Timestamp) -> Duration {
    Duration::from_millis((now.as_millisecond() - since.as_millisecond()).max(0) as u64)
}

fn wait_at_most(p: &mut Plan, d: Duration) {
    p.requeue_after = Some(p.requeue_after.map_or(d, |r| r.min(d)));
}

/// The current attempt's worker has been silent for `worker_lost_after`
/// (counted from its last heartbeat, or from the attempt's start if it
/// never renewed one since).
fn worker_silent(p: &Plan, obs: &Observed) -> bool {
    let Some(after) = obs.worker_lost_after else { return false };
    let started = p.status.attempts.last().and_then(|a| a.started_at.as_ref()).map(|t| t.0);
    let since = match (obs.last_heartbeat, started) {
        (Some(hb), Some(s)) => hb.max(s),
        (Some(hb), None) => hb,
        (None, Some(s)) => s,
        (None, None) => return false,
    };
    elapsed(obs.now, since) >= after
}

/// The Interruption section: while running (or pausing), an instance that
/// stopped without hangar asking, that is gone, or that runs with its
/// worker silent interrupts the session. Returns true when it took over.
fn detect_interruption(p: &mut Plan, obs: &Observed, pausing: bool) -> bool {
    use super::instance::InstanceState as S;
    if obs.reclaim_warned && p.status.reclaim_warned_at.is_none() {
        p.status.reclaim_warned_at = Some(ts(obs.now));
        p.events.push(("ReclaimWarning", "EC2 warned that the instance is about to be reclaimed".into()));
    }
    let our_stop = pausing && p.status.pause.as_ref().is_some_and(|pp| pp.stop_requested_at.is_some());
    let cause = match obs.instance {
        None | Some(S::ShuttingDown | S::Terminated) => InterruptionCause::HostLost,
        // A stop hangar asked for is the pause, unless EC2 warned of a
        // reclamation first: a reclamation while pausing is an interruption.
        Some(S::Stopping | S::Stopped) if our_stop && p.status.reclaim_warned_at.is_none() => return false,
        Some(S::Stopping | S::Stopped) => InterruptionCause::Reclaimed,
        // While pausing the instance is stopped anyway.
        Some(S::Running) if !pausing && worker_silent(p, obs) => InterruptionCause::WorkerLost,
        _ => return false,
    };
    interrupt(p, obs, cause);
    true
}

fn interrupt(p: &mut Plan, obs: &Observed, cause: InterruptionCause) {
    let attempt = p.status.attempt.unwrap_or(1);
    // Compute counts to the last heartbeat.
    let started = current_attempt(p).and_then(|a| a.started_at.as_ref().map(|t| t.0));
    let last_heartbeat = obs.last_heartbeat.filter(|hb| started.is_none_or(|s| *hb >= s) && *hb <= obs.now);
    let end = match cause {
        InterruptionCause::Reclaimed => AttemptEnd::Interrupted,
        InterruptionCause::WorkerLost => AttemptEnd::WorkerLost,
        InterruptionCause::HostLost => AttemptEnd::HostLost,
    };
    end_attempt(p, end, last_heartbeat.unwrap_or(obs.now));
    p.status.interruptions.push(Interruption {
        attempt,
        cause,
        detected_at: ts(obs.now),
        last_heartbeat_at: last_heartbeat.map(ts),
        stop_requested_at: None,
        start_requested_at: None,
        recovered_at: None,
    });
    p.status.pause = None;
    end_idle(p, obs.now);
    p.status.reclaim_warned_at = None;
    let why = match cause {
        InterruptionCause::Reclaimed => "the instance stopped and nobody asked for a pause",
        InterruptionCause::WorkerLost => "the worker stopped reporting while the instance runs",
        InterruptionCause::HostLost => "the instance is terminated or gone",
    };
    if cause == InterruptionCause::HostLost || obs.mode == Mode::Agent {
        // Nothing to recover (host gone), or nothing that may be recovered
        // (mode agent would start its command again from the beginning).
        if obs.running_commands > 0 {
            p.actions.push(Action::SettleInterruptedCommands);
        }
        p.events.push(("Interrupted", format!("attempt {attempt}: {why}; the session ends")));
        let reason =
            if cause == InterruptionCause::HostLost { StopReason::InstanceLost } else { StopReason::InterruptionLost };
        return end_outcome_unknown(p, obs, &reason);
    }
    set_phase(p, Phase::Interrupted, "Interrupted", format!("attempt {attempt}: {why}; recovering"));
    interrupted(p, obs);
}

/// Phase interrupted (mode commands): worker lost → stop the instance, then
/// start it; stopped → start it (or wait for EC2 to) within the recovery
/// window; running again with its worker reporting → recovered as a new
/// attempt (cause `recovery`); gone or not back in time → ended
/// `outcome_unknown`. A pause asked for meanwhile ends in paused.
fn interrupted(p: &mut Plan, obs: &Observed) {
    use super::instance::InstanceState as S;
    if obs.running_commands > 0 {
        p.actions.push(Action::SettleInterruptedCommands);
    }
    if let Desired::End(reason) = &obs.desired {
        return begin_stop(p, obs, reason);
    }
    let Some(mut int) = p.status.interruptions.last().cloned().filter(|i| i.recovered_at.is_none()) else {
        // No record of it (an older operator's status): nothing to recover.
        return end_outcome_unknown(p, obs, &StopReason::InterruptionLost);
    };
    if obs.mode == Mode::Agent {
        return end_outcome_unknown(p, obs, &StopReason::InterruptionLost);
    }
    let waited = elapsed(obs.now, int.detected_at.0);
    let lost = |p: &mut Plan, obs: &Observed, why: String| {
        p.events.push(("NotRecovered", why));
        end_outcome_unknown(p, obs, &StopReason::InterruptionLost);
    };
    let recovery_open = current_attempt(p).is_some_and(|a| a.cause == AttemptCause::Recovery && a.end.is_none());
    match obs.instance {
        None | Some(S::ShuttingDown | S::Terminated) => {
            end_attempt(p, AttemptEnd::HostLost, obs.now);
            return end_outcome_unknown(p, obs, &StopReason::InstanceLost);
        }
        Some(S::Stopped) => {
            if recovery_open {
                // It ran again and stopped again before the worker reported.
                end_attempt(p, AttemptEnd::Interrupted, obs.now);
            }
            if obs.desired == Desired::Pause {
                set_phase(p, Phase::Paused, "Paused", "interrupted while a pause was asked for; workspace kept".into());
                return;
            }
            if waited >= obs.recovery_window {
                let note = format!("not running again within {}s", obs.recovery_window.as_secs());
                return lost(p, obs, note);
            }
            let asked = int.start_requested_at.as_ref().map(|t| elapsed(obs.now, t.0));
            if asked.is_none_or(|a| a >= obs.recovery_retry) {
                p.actions.push(Action::RecoverInstance);
                int.start_requested_at = Some(ts(obs.now));
                wait_at_most(p, obs.recovery_retry);
            } else if let Some(a) = asked {
                wait_at_most(p, obs.recovery_retry - a);
            }
            wait_at_most(p, obs.recovery_window - waited);
        }
        Some(S::Stopping) => wait_at_most(p, Duration::from_secs(1)),
        Some(S::Pending) => {}
        Some(S::Running) => {
            let stopped_since = int.start_requested_at.is_some();
            if int.cause == InterruptionCause::WorkerLost && !stopped_since && !recovery_open {
                // Stop it (normally) and start it again; asked again if the
                // stop has not shown after a retry interval.
                let asked = int.stop_requested_at.as_ref().map(|t| elapsed(obs.now, t.0));
                if asked.is_none_or(|a| a >= obs.recovery_retry) {
                    p.actions.push(Action::StopInstance);
                    int.stop_requested_at = Some(ts(obs.now));
                }
                wait_at_most(p, obs.recovery_retry);
            } else {
                // Running again: the recovery attempt.
                if !recovery_open {
                    open_attempt(p, AttemptCause::Recovery);
                }
                attempt_running(p, obs.now);
                bring_up(p, obs);
                if attempt_ready(p, obs) {
                    int.recovered_at = Some(ts(obs.now));
                    let n = p.status.attempt.unwrap_or(0);
                    set_phase(p, Phase::Running, "Recovered", format!("attempt {n} running (cause recovery)"));
                } else if waited >= obs.recovery_window {
                    end_attempt(p, AttemptEnd::StartFailed, obs.now);
                    let note = format!("not reporting again within {}s", obs.recovery_window.as_secs());
                    if let Some(last) = p.status.interruptions.last_mut() {
                        *last = int;
                    }
                    return lost(p, obs, note);
                }
            }
        }
    }
    if let Some(last) = p.status.interruptions.last_mut() {
        *last = int;
    }
    if p.status.phase == Some(Phase::Interrupted) {
        wait_at_most(p, obs.recovery_window.saturating_sub(waited) + Duration::from_millis(100));
    }
}

fn pausing(p: &mut Plan, obs: &Observed) {
    if let Desired::End(reason) = &obs.desired {
        return begin_stop(p, obs, reason);
    }
    if detect_interruption(p, obs, true) {
        return;
    }
    let attempt = p.status.attempt;
    let mut progress = p.status.pause.clone().unwrap_or_default();
    let requested = progress.requested_at.as_ref().map(|t| t.0).unwrap_or(obs.now);
    let closed = obs.worker.as_ref().is_some_and(|w| w.workspace_closed && Some(w.attempt) == attempt);
    if closed && progress.workspace_closed_at.is_none() {
        progress.workspace_closed_at = Some(ts(obs.now));
    }
    match obs.instance {
        Some(InstanceState::Stopped) => {
            end_attempt(p, AttemptEnd::Paused, obs.now);
            p.status.pause = Some(progress);
            set_phase(p, Phase::Paused, "Paused", "instance stopped; workspace volume kept".into());
            return;
        }
        // Stopping: our own stop under way. Gone: an interruption, taken
        // over above.
        Some(InstanceState::Stopping | InstanceState::ShuttingDown | InstanceState::Terminated) | None => {}
        Some(_) => {
            let waited = Duration::from_secs((obs.now.as_second() - requested.as_second()).max(0) as u64);
            if progress.stop_requested_at.is_none() {
                if closed {
                    p.actions.push(Action::StopInstance);
                    progress.stop_requested_at = Some(ts(obs.now));
                } else if waited >= obs.pause_grace {
                    // Without the report, stopped anyway — still a normal
                    // stop: the OS shuts down cleanly (the document asks
                    // for no forced stop).
                    p.actions.push(Action::StopInstance);
                    progress.stop_requested_at = Some(ts(obs.now));
                    progress.forced = true;
                    p.events.push((
                        "PauseForced",
                        format!("no workspace-closed report within {}s; stopping anyway", obs.pause_grace.as_secs()),
                    ));
                } else {
                    p.requeue_after = Some(obs.pause_grace - waited);
                }
            }
        }
    }
    p.status.pause = Some(progress);
}

fn paused(p: &mut Plan, obs: &Observed) {
    if let Desired::End(reason) = &obs.desired {
        return begin_stop(p, obs, reason);
    }
    // Paused since the last attempt ended: after the longest pause, the end.
    if let Some(since) = p.status.attempts.iter().rev().find_map(|a| a.ended_at.as_ref()).map(|t| t.0) {
        let paused_for = Duration::from_secs((obs.now.as_second() - since.as_second()).max(0) as u64);
        if paused_for >= obs.max_pause {
            return begin_stop(p, obs, &StopReason::PausedTooLong);
        }
        p.requeue_after = Some(obs.max_pause - paused_for);
    }
    match &obs.desired {
        Desired::End(_) => {}
        Desired::Run => {
            // This very request already failed to start the instance, or
            // was paused for idle: stay paused until a new one (no attempt
            // opened per reconcile).
            if p.status.resume_failed.as_ref().is_some_and(|f| f.request == obs.resume_request)
                || p.status.idle_paused_request.as_ref() == Some(&obs.resume_request)
            {
                return;
            }
            p.status.idle_paused_request = None;
            open_attempt(p, AttemptCause::Resume);
            p.status.pause = None;
            p.actions.push(Action::StartInstance);
            set_phase(p, Phase::Resuming, "Resuming", "starting the same instance".into());
        }
        Desired::Pause => {
            if obs.instance.is_none_or(|s| s.is_gone()) {
                end_outcome_unknown(p, obs, &StopReason::InstanceLost);
            }
        }
    }
}

fn resuming(p: &mut Plan, obs: &Observed) {
    if let Desired::End(reason) = &obs.desired {
        return begin_stop(p, obs, reason);
    }
    match obs.instance {
        Some(InstanceState::Stopped) => {
            // StartInstances was refused or lost; ask again (idempotent).
            p.actions.push(Action::StartInstance);
        }
        Some(InstanceState::Running) => {
            attempt_running(p, obs.now);
            bring_up(p, obs);
            if attempt_ready(p, obs) {
                p.status.resume_failed = None;
                set_phase(p, Phase::Running, "Resumed", format!("attempt {} running", p.status.attempt.unwrap_or(0)));
            }
        }
        None | Some(InstanceState::ShuttingDown) | Some(InstanceState::Terminated) => {
            end_attempt(p, AttemptEnd::HostLost, obs.now);
            end_outcome_unknown(p, obs, &StopReason::InstanceLost);
        }
        _ => {}
    }
}

/// The resume could not start the instance: back to paused, attempt ends
/// `start_failed`, and `request` is recorded so it is not tried again
/// (called by the reconciler when StartInstances fails).
pub fn start_failed(status: &mut SandboxStatus, now: Timestamp, request: &str, reason: &str) {
    let mut p = Plan { status: status.clone(), actions: vec![], events: vec![], requeue_after: None };
    end_attempt(&mut p, AttemptEnd::StartFailed, now);
    p.status.phase = Some(Phase::Paused);
    p.status.resume_failed =
        Some(hangar_crds::ResumeFailure { request: request.to_owned(), at: Some(ts(now)), reason: reason.to_owned() });
    *status = p.status;
}

/// Ends the session not knowing what happened inside (the instance or the
/// interrupted attempt was lost).
fn end_outcome_unknown(p: &mut Plan, obs: &Observed, reason: &StopReason) {
    p.status.outcome = Some(Outcome::OutcomeUnknown.as_str().into());
    begin_stop(p, obs, reason);
}

fn begin_stop(p: &mut Plan, obs: &Observed, reason: &StopReason) {
    end_idle(p, obs.now);
    if p.status.stop_reason.is_none() {
        p.status.stop_reason = Some(reason.text());
    }
    set_phase(p, Phase::Stopping, "Stopping", format!("ending the session ({}); running the reset", reason.code()));
    stopping(p, obs);
}

fn confirmed(status: &SandboxStatus, step: ResetStep) -> bool {
    status.reset.iter().any(|s| s.step == step.as_str())
}

/// Whether a pass has any use for the workspace volume as EC2 shows it
/// (one DescribeVolumes), from the status it starts from and the instance.
/// Launching, until the volume is attached, except while the instance is
/// pending with the volume known: then nothing can be done with it (it is
/// attached once the instance runs), and the passes of that wait (a watch
/// event each) would each describe it. The
/// reset: only a pass that can reach the DeleteVolume step, which is not
/// confirmed yet and comes after the instance's termination (steps run in
/// order, so while the instance is not gone no pass gets that far).
pub fn needs_workspace_volume(phase: Phase, status: &SandboxStatus, instance: Option<InstanceState>) -> bool {
    match phase {
        Phase::Launching => {
            status.volume_attached != Some(true)
                && (status.volume_id.is_none() || instance != Some(InstanceState::Pending))
        }
        Phase::Stopping | Phase::ResetIncomplete => {
            !confirmed(status, ResetStep::DeleteVolume)
                && (confirmed(status, ResetStep::TerminateInstance)
                    || instance.is_none_or(|s| s == InstanceState::Terminated))
        }
        _ => false,
    }
}

/// The step the reset waits on, and why; `since` kept while it stays the
/// same step.
pub fn pending(p: &mut Plan, step: ResetStep, now: Timestamp, message: String) {
    let since = match &p.status.reset_pending {
        Some(r) if r.step == step.as_str() => r.since.clone(),
        _ => ts(now),
    };
    p.status.reset_pending = Some(ResetPending { step: step.as_str().to_owned(), message, since });
}

fn stopping(p: &mut Plan, obs: &Observed) {
    let instance_gone = obs.instance.is_none_or(|s| s == InstanceState::Terminated);
    if instance_gone || matches!(obs.instance, Some(InstanceState::ShuttingDown)) {
        end_attempt(p, AttemptEnd::SessionEnded, obs.now);
    }
    for step in ResetStep::ORDER {
        if confirmed(&p.status, step) {
            continue;
        }
        if step == ResetStep::TerminateInstance && obs.instance == Some(InstanceState::ShuttingDown) {
            // Termination is under way: wait for it rather than ask again.
            pending(p, step, obs.now, "waiting for the instance to finish terminating".to_owned());
            p.requeue_after = Some(Duration::from_secs(2));
            return;
        }
        let (done, action) = match step {
            ResetStep::RevokeTokens => (obs.tokens_to_revoke == 0, Action::RevokeTokens),
            ResetStep::CancelQueuedCommands => (obs.unfinished_commands == 0, Action::CancelQueuedCommands),
            ResetStep::TerminateInstance => (instance_gone, Action::TerminateInstance),
            ResetStep::DeleteVolume => (obs.volume == VolumeState::Absent, Action::DeleteVolume),
            ResetStep::DestroyKey => (!obs.key_present, Action::DestroyKey),
            ResetStep::SignCertificate => {
                (p.status.certificate.as_ref().is_some_and(|c| c.signed_at.is_some()), Action::SignCertificate)
            }
        };
        if done {
            p.status.reset.push(ResetStepStatus { step: step.as_str().to_owned(), confirmed_at: ts(obs.now) });
            continue;
        }
        // Steps run in order: the volume is deleted only once the instance
        // that held it is gone, the key only once the volume is, the
        // certificate signed only once everything it records is final.
        pending(p, step, obs.now, step.waiting_for().to_owned());
        p.actions.push(action);
        p.requeue_after = Some(Duration::from_secs(2));
        return;
    }
    p.status.reset_pending = None;
    let failed = p.status.instance_id.is_none() && p.status.attempts.iter().all(|a| a.started_at.is_none());
    p.status.volume_attached = None;
    p.status.node_name = None;
    if failed {
        set_phase(p, Phase::Failed, "Failed", "ended before its instance existed; reset complete".into());
    } else {
        set_phase(p, Phase::Ended, "Ended", "reset complete".into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn obs(now: i64) -> Observed {
        Observed {
            now: at(now),
            mode: Mode::Commands,
            desired: Desired::Run,
            instance: None,
            volume: VolumeState::Unknown,
            node_ready: None,
            node_prepared: false,
            worker: None,
            agent: AgentState::Absent,
            key_present: true,
            unfinished_commands: 0,
            tokens_to_revoke: 0,
            pause_grace: Duration::from_secs(90),
            resume_request: "1/".into(),
            idle: None,
            stop_after: None,
            max_pause: Duration::from_secs(7 * 86_400),
            last_heartbeat: None,
            worker_lost_after: None,
            recovery_window: Duration::from_secs(1800),
            recovery_retry: Duration::from_secs(30),
            running_commands: 0,
            reclaim_warned: false,
            agent_message: None,
            images: ImageCheck::Passed(vec![]),
        }
    }

    fn ready(now: i64, attempt: i64) -> Observed {
        Observed {
            instance: Some(InstanceState::Running),
            volume: VolumeState::Present { attached: true },
            node_ready: Some(true),
            node_prepared: true,
            worker: Some(WorkerReport { attempt, workspace_closed: false }),
            agent: AgentState::Running,
            last_heartbeat: Some(at(now)),
            ..obs(now)
        }
    }

    fn status(phase: Phase) -> SandboxStatus {
        SandboxStatus { phase: Some(phase), ..Default::default() }
    }

    #[test]
    fn launching_without_instance_launches_and_opens_attempt_1() {
        let p = plan(&SandboxStatus::default(), &Observed { key_present: false, ..obs(0) });
        assert_eq!(p.actions, vec![Action::EnsureKey, Action::Launch]);
        assert_eq!(p.status.phase, Some(Phase::Launching));
        assert_eq!(p.status.attempt, Some(1));
        assert_eq!(p.status.attempts[0].cause, AttemptCause::Launch);
    }

    #[test]
    fn nothing_is_made_until_every_image_passed_its_preflight() {
        let pending = Observed { key_present: false, images: ImageCheck::Pending { note: None }, ..obs(0) };
        let p = plan(&SandboxStatus::default(), &pending);
        assert_eq!(p.actions, vec![Action::PreflightImages], "no key, no launch while checking");
        let pre = p.status.image_preflight.clone().unwrap();
        assert_eq!((pre.state, pre.code.as_deref()), (PreflightState::Pending, Some("image_preflight_pending")));
        assert!(p.status.attempts.is_empty());
        // Still pending later: the start time stays the first one.
        let again = plan(&p.status, &Observed { now: at(5), ..pending.clone() });
        assert_eq!(again.status.image_preflight.unwrap().started_at, pre.started_at);

        let image =
            CheckedImage { image: "r/i@sha256:aa".into(), manifest_digest: "sha256:bb".into(), compressed_bytes: 42 };
        let passed = Observed { key_present: false, images: ImageCheck::Passed(vec![image.clone()]), ..obs(6) };
        let p = plan(&p.status, &passed);
        assert_eq!(p.actions, vec![Action::EnsureKey, Action::Launch]);
        let pre = p.status.image_preflight.clone().unwrap();
        assert_eq!((pre.state, pre.images), (PreflightState::Passed, vec![image]));
        // Once passed, the check is not consulted again (a resume, say).
        let later = plan(&p.status, &Observed { images: ImageCheck::Pending { note: None }, ..obs(7) });
        assert!(!later.actions.contains(&Action::PreflightImages));
    }

    #[test]
    fn a_refused_image_fails_the_session_before_any_instance() {
        let refusal =
            crate::refusal::Refusal::new(hangar_crds::ErrorCode::PreflightArchitecture, "r/i is a linux/amd64 image");
        let o = Observed {
            key_present: false,
            volume: VolumeState::Absent,
            images: ImageCheck::Refused(StopReason::Preflight(refusal)),
            ..obs(0)
        };
        let p = plan(&SandboxStatus::default(), &o);
        assert_eq!(p.actions, vec![Action::SignCertificate], "no EC2 call, only the certificate");
        assert_eq!(p.status.reset_pending.as_ref().map(|r| r.step.as_str()), Some("sign_certificate"));
        assert!(p.events.iter().any(|(r, _)| *r == "PreflightFailed"));
        let p = plan(&signed(p.status), &o);
        assert!(p.actions.is_empty(), "{:?}", p.actions);
        assert_eq!(p.status.reset_pending, None);
        assert_eq!(p.status.phase, Some(Phase::Failed));
        assert_eq!(p.status.stop_reason.as_deref(), Some("preflight_architecture: r/i is a linux/amd64 image"));
        let pre = p.status.image_preflight.unwrap();
        assert_eq!((pre.state, pre.code.as_deref()), (PreflightState::Refused, Some("preflight_architecture")));
    }

    #[test]
    fn launching_creates_then_attaches_the_volume_in_the_running_instance() {
        let mut o = obs(1);
        o.instance = Some(InstanceState::Pending);
        o.volume = VolumeState::Absent;
        let p = plan(&SandboxStatus::default(), &o);
        assert_eq!(p.actions, vec![Action::EnsureVolume]);
        o.instance = Some(InstanceState::Running);
        o.volume = VolumeState::Present { attached: false };
        let p = plan(&p.status, &o);
        assert_eq!(p.actions, vec![Action::AttachVolume]);
        assert!(p.status.attempts[0].started_at.is_some(), "metering starts when the instance runs");
    }

    #[test]
    fn launching_prepares_the_node_and_the_agent_pod_then_runs() {
        let mut o = ready(2, 1);
        o.node_prepared = false;
        o.agent = AgentState::Absent;
        o.worker = None;
        let p = plan(&SandboxStatus::default(), &o);
        assert_eq!(p.actions, vec![Action::PrepareNode, Action::CreateAgentPod]);
        assert_eq!(p.status.phase, Some(Phase::Launching));
        let p = plan(&p.status, &ready(3, 1));
        assert_eq!(p.status.phase, Some(Phase::Running));
        assert_eq!(p.events[0].0, "Running");
        assert!(p.actions.is_empty());
    }

    #[test]
    fn a_stale_attempts_heartbeat_does_not_count() {
        let s = SandboxStatus { attempt: Some(2), ..status(Phase::Resuming) };
        let p = plan(&s, &ready(0, 1));
        assert_eq!(p.status.phase, Some(Phase::Resuming));
    }

    #[test]
    fn pause_waits_for_the_workspace_report_then_stops() {
        let s = SandboxStatus { attempt: Some(1), ..status(Phase::Running) };
        let p = plan(&s, &Observed { desired: Desired::Pause, ..ready(10, 1) });
        assert_eq!(p.status.phase, Some(Phase::Pausing));
        assert!(p.actions.is_empty(), "nothing stops before the worker closes the workspace");

        let mut o = Observed { desired: Desired::Pause, ..ready(20, 1) };
        let p2 = plan(&p.status, &o);
        assert!(p2.actions.is_empty());
        assert_eq!(p2.requeue_after, Some(Duration::from_secs(80)));

        o.worker = Some(WorkerReport { attempt: 1, workspace_closed: true });
        let p3 = plan(&p2.status, &o);
        assert_eq!(p3.actions, vec![Action::StopInstance]);
        let pause = p3.status.pause.clone().unwrap();
        assert!(pause.workspace_closed_at.is_some() && !pause.forced);

        // Called again before the stop shows: no second StopInstances.
        assert!(plan(&p3.status, &o).actions.is_empty());
    }

    /// Attempt 1: ran 0–100 s, then paused.
    fn first_attempt_paused_at_100() -> Attempt {
        Attempt {
            number: 1,
            cause: AttemptCause::Launch,
            started_at: Some(Time(at(0))),
            ended_at: Some(Time(at(100))),
            end: Some(AttemptEnd::Paused),
            compute_seconds: 100,
        }
    }

    #[test]
    fn a_session_paused_for_seven_days_ends() {
        let mut s = SandboxStatus { attempt: Some(1), ..status(Phase::Paused) };
        s.attempts.push(first_attempt_paused_at_100());
        let o = |now| Observed { desired: Desired::Pause, instance: Some(InstanceState::Stopped), ..obs(now) };
        let day6 = plan(&s, &o(100 + 6 * 86_400));
        assert_eq!(day6.status.phase, Some(Phase::Paused));
        assert_eq!(day6.requeue_after, Some(Duration::from_secs(86_400)), "wakes at the end of day 7");
        let day7 = plan(&s, &o(100 + 7 * 86_400));
        assert_eq!(day7.status.stop_reason.as_deref(), Some("paused_too_long"));
    }

    #[test]
    fn the_hard_stop_counts_compute_across_attempts_not_pauses() {
        let mut s = SandboxStatus { attempt: Some(2), ..status(Phase::Running) };
        s.attempts.push(first_attempt_paused_at_100());
        // Resumed at t=1000 (900 s paused, not counted).
        s.attempts.push(Attempt {
            number: 2,
            cause: AttemptCause::Resume,
            started_at: Some(Time(at(1000))),
            ended_at: None,
            end: None,
            compute_seconds: 0,
        });
        let limit = Some(Duration::from_secs(150));
        let early = plan(&s, &Observed { stop_after: limit, ..ready(1040, 2) });
        assert_eq!(early.status.phase, Some(Phase::Running));
        assert_eq!(early.requeue_after, Some(Duration::from_secs(10)), "wakes when the limit comes");
        assert_eq!(early.status.hard_stop_at, Some(Time(at(1050))), "the node's deadline: 1000 + (150 - 100)");
        let at_limit = plan(&s, &Observed { stop_after: limit, ..ready(1050, 2) });
        assert_eq!(at_limit.status.phase, Some(Phase::Stopping));
        assert_eq!(at_limit.status.stop_reason.as_deref(), Some("stop_after"));
        assert_eq!(at_limit.status.hard_stop_at, None);
        // The node stopped itself at the limit: that is the hard stop, not
        // an interruption.
        let stopped = Observed { stop_after: limit, instance: Some(InstanceState::Stopped), ..ready(1051, 2) };
        assert_eq!(plan(&s, &stopped).status.stop_reason.as_deref(), Some("stop_after"));
        // Also when whole-second metering says a moment less than the limit.
        let mut given = s.clone();
        given.hard_stop_at = Some(Time(at(1049)));
        let early_stop = Observed { stop_after: limit, instance: Some(InstanceState::Stopped), ..ready(1049, 2) };
        assert_eq!(plan(&given, &early_stop).status.stop_reason.as_deref(), Some("stop_after"));
    }

    #[test]
    fn idle_ends_or_pauses_after_its_timeout_and_activity_resets_it() {
        use hangar_crds::IdleAction;
        let s = SandboxStatus { attempt: Some(1), ..status(Phase::Running) };
        let idle = |active, action| Some(Idle { active, timeout: Duration::from_secs(60), action });
        // Idle from t=10: the timer starts, the requeue is the time left.
        let p = plan(&s, &Observed { idle: idle(false, IdleAction::End), ..ready(10, 1) });
        assert_eq!(p.status.idle_since, Some(Time(at(10))));
        assert_eq!(p.requeue_after, Some(Duration::from_secs(60)));
        // Activity resets it.
        let busy = plan(&p.status, &Observed { idle: idle(true, IdleAction::End), ..ready(40, 1) });
        assert_eq!(busy.status.idle_since, None);
        assert_eq!(busy.status.idle_seconds, Some(30), "the idle stretch is recorded");
        // Idle long enough: end, stop reason idle_timeout.
        let ended = plan(&p.status, &Observed { idle: idle(false, IdleAction::End), ..ready(70, 1) });
        assert_eq!(ended.status.phase, Some(Phase::Stopping));
        assert_eq!(ended.status.stop_reason.as_deref(), Some("idle_timeout"));
        assert_eq!(ended.status.idle_seconds, Some(60));
        // Or pause, remembering the request it paused under.
        let paused = plan(&p.status, &Observed { idle: idle(false, IdleAction::Pause), ..ready(70, 1) });
        assert_eq!(paused.status.phase, Some(Phase::Pausing));
        assert_eq!(paused.status.idle_paused_request.as_deref(), Some("1/"));
        // Paused for idle: the same request stays paused, a new one resumes.
        let stay = SandboxStatus { phase: Some(Phase::Paused), ..paused.status.clone() };
        let o = Observed { instance: Some(InstanceState::Stopped), ..obs(80) };
        assert!(plan(&stay, &o).actions.is_empty());
        let again = plan(&stay, &Observed { resume_request: "1/r".into(), ..o });
        assert_eq!(again.actions, vec![Action::StartInstance]);
        assert_eq!(again.status.idle_paused_request, None);
    }

    #[test]
    fn pause_stops_anyway_after_the_grace_and_records_it() {
        let s = SandboxStatus {
            attempt: Some(1),
            pause: Some(PauseProgress { requested_at: Some(Time(at(0))), ..Default::default() }),
            ..status(Phase::Pausing)
        };
        let p = plan(&s, &Observed { desired: Desired::Pause, ..ready(90, 1) });
        assert_eq!(p.actions, vec![Action::StopInstance]);
        assert!(p.status.pause.unwrap().forced);
        assert_eq!(p.events[0].0, "PauseForced");
    }

    #[test]
    fn stopped_instance_ends_the_attempt_paused_with_its_compute() {
        let mut s = running_attempt_1();
        s.phase = Some(Phase::Pausing);
        s.pause = Some(PauseProgress { stop_requested_at: Some(Time(at(120))), ..Default::default() });
        let o = Observed { desired: Desired::Pause, instance: Some(InstanceState::Stopped), ..obs(125) };
        let p = plan(&s, &o);
        assert_eq!(p.status.phase, Some(Phase::Paused));
        assert_eq!(p.status.attempts[0].end, Some(AttemptEnd::Paused));
        assert_eq!(p.status.attempts[0].compute_seconds, 125);
        assert_eq!(p.status.compute_seconds, Some(125));
    }

    #[test]
    fn resume_starts_the_same_instance_as_attempt_2() {
        let s = SandboxStatus { attempt: Some(1), ..status(Phase::Paused) };
        let p = plan(&s, &Observed { instance: Some(InstanceState::Stopped), ..obs(0) });
        assert_eq!(p.actions, vec![Action::StartInstance]);
        assert_eq!(p.status.phase, Some(Phase::Resuming));
        assert_eq!(p.status.attempt, Some(2));
        assert_eq!(p.status.attempts.last().unwrap().cause, AttemptCause::Resume);
        let p2 = plan(&p.status, &ready(5, 2));
        assert_eq!(p2.status.phase, Some(Phase::Running));
    }

    #[test]
    fn a_failed_start_returns_to_paused_with_start_failed() {
        let s = SandboxStatus { attempt: Some(1), ..status(Phase::Paused) };
        let mut p = plan(&s, &Observed { instance: Some(InstanceState::Stopped), ..obs(0) });
        start_failed(&mut p.status, at(1), "4/", "InsufficientInstanceCapacity");
        assert_eq!(p.status.phase, Some(Phase::Paused));
        assert_eq!(p.status.attempts.last().unwrap().end, Some(AttemptEnd::StartFailed));
        // The same request again: no new attempt, no StartInstances.
        let same = Observed { instance: Some(InstanceState::Stopped), resume_request: "4/".into(), ..obs(2) };
        let again = plan(&p.status, &same);
        assert!(again.actions.is_empty(), "{:?}", again.actions);
        assert_eq!(again.status.attempts.len(), p.status.attempts.len(), "no attempt per reconcile");
        // A new request (the retry annotation, or a new generation) tries again.
        let retry = Observed { resume_request: "4/1".into(), ..same };
        let next = plan(&again.status, &retry);
        assert_eq!(next.actions, vec![Action::StartInstance]);
        assert_eq!(next.status.attempts.len(), p.status.attempts.len() + 1);
    }

    #[test]
    fn agent_mode_never_pauses() {
        let s = SandboxStatus { attempt: Some(1), ..status(Phase::Running) };
        let p = plan(&s, &Observed { mode: Mode::Agent, desired: Desired::Pause, ..ready(0, 1) });
        assert_eq!(p.status.phase, Some(Phase::Running));
    }

    #[test]
    fn agent_exit_ends_the_session_with_its_code() {
        let s = SandboxStatus { attempt: Some(1), instance_id: Some("i-1".into()), ..status(Phase::Running) };
        let p = plan(&s, &Observed { mode: Mode::Agent, agent: AgentState::Exited(3), ..ready(0, 1) });
        assert_eq!(p.status.phase, Some(Phase::Stopping));
        assert_eq!(p.status.exit_code, Some(3));
        assert_eq!(p.status.stop_reason.as_deref(), Some("agent_exited"));
    }

    #[test]
    fn reset_runs_its_steps_in_order_each_confirmed_by_observation() {
        let s = SandboxStatus { attempt: Some(1), instance_id: Some("i-1".into()), ..status(Phase::Running) };
        let mut o = Observed {
            desired: Desired::End(StopReason::Cancelled),
            unfinished_commands: 2,
            tokens_to_revoke: 3,
            ..ready(0, 1)
        };
        let p = plan(&s, &o);
        assert_eq!(p.status.phase, Some(Phase::Stopping));
        assert_eq!(p.actions, vec![Action::RevokeTokens]);
        assert_eq!(p.status.reset_pending.as_ref().map(|r| r.step.as_str()), Some("revoke_tokens"));

        o.tokens_to_revoke = 0;
        let p = plan(&p.status, &o);
        assert_eq!(p.actions, vec![Action::CancelQueuedCommands]);

        o.unfinished_commands = 0;
        let p = plan(&p.status, &o);
        assert_eq!(p.actions, vec![Action::TerminateInstance]);
        assert_eq!(p.status.reset.len(), 2);

        o.instance = Some(InstanceState::Terminated);
        let p = plan(&p.status, &o);
        assert_eq!(p.actions, vec![Action::DeleteVolume]);
        assert_eq!(p.status.attempts.len(), 0, "no attempt recorded in this synthetic status");

        o.volume = VolumeState::Absent;
        let p = plan(&p.status, &o);
        assert_eq!(p.actions, vec![Action::DestroyKey]);

        o.key_present = false;
        let p = plan(&p.status, &o);
        assert_eq!(p.actions, vec![Action::SignCertificate], "signed last, once all else is confirmed");
        assert_eq!(p.status.phase, Some(Phase::Stopping));
        let since = p.status.reset_pending.clone().unwrap().since;

        // Not signed yet (a failed store, a crash): still pending, since
        // the same time.
        let later = Observed { now: at(9), ..o.clone() };
        let p = plan(&p.status, &later);
        assert_eq!(p.actions, vec![Action::SignCertificate]);
        assert_eq!(p.status.reset_pending.clone().unwrap().since, since);

        let p = plan(&signed(p.status), &later);
        assert!(p.actions.is_empty());
        assert_eq!(p.status.reset_pending, None);
        assert_eq!(p.status.phase, Some(Phase::Ended));
        let steps: Vec<&str> = p.status.reset.iter().map(|s| s.step.as_str()).collect();
        assert_eq!(steps, ResetStep::ORDER.map(ResetStep::as_str));
    }

    /// A pass that skips the volume describe decides exactly as one that
    /// made it, whatever the describe would have shown; and the passes that
    /// can use it do describe.
    #[test]
    fn the_volume_is_described_only_for_a_pass_that_can_use_it() {
        use InstanceState::*;
        let step = |s: ResetStep| ResetStepStatus { step: s.as_str().to_owned(), confirmed_at: Time(at(0)) };
        let mut statuses = vec![];
        // None known, known, attached (a status records the volume before
        // it records it attached).
        for (volume_id, volume_attached) in [(None, None), (Some("vol-1"), None), (Some("vol-1"), Some(true))] {
            statuses.push(SandboxStatus {
                attempt: Some(1),
                instance_id: Some("i-1".into()),
                volume_id: volume_id.map(str::to_owned),
                volume_attached,
                ..status(Phase::Launching)
            });
        }
        let order = ResetStep::ORDER;
        for confirmed in 0..=order.len() {
            for phase in [Phase::Stopping, Phase::ResetIncomplete] {
                statuses.push(SandboxStatus {
                    attempt: Some(1),
                    instance_id: Some("i-1".into()),
                    volume_id: Some("vol-1".into()),
                    reset: order[..confirmed].iter().copied().map(step).collect(),
                    ..status(phase)
                });
            }
        }
        let instances =
            [None, Some(Pending), Some(Running), Some(Stopping), Some(Stopped), Some(ShuttingDown), Some(Terminated)];
        let mut described = 0;
        for s in &statuses {
            let phase = s.phase.unwrap();
            let desired = if phase == Phase::Launching { Desired::Run } else { Desired::End(StopReason::Cancelled) };
            for instance in instances {
                if needs_workspace_volume(phase, s, instance) {
                    described += 1;
                    continue;
                }
                let pass = |volume| {
                    let p = plan(s, &Observed { desired: desired.clone(), instance, volume, ..ready(10, 1) });
                    (p.actions, p.status, p.requeue_after)
                };
                let skipped = pass(VolumeState::Unknown);
                // What EC2 could show: a volume is attached only once the
                // instance has run.
                let mut shown = vec![VolumeState::Absent, VolumeState::Present { attached: false }];
                if !matches!(instance, None | Some(Pending)) {
                    shown.push(VolumeState::Present { attached: true });
                }
                // Launching, a volume the status knows but EC2 no longer
                // shows (deleted by hand) is made again once the instance
                // runs, when the pass describes it (below): the skip only
                // defers that. And once the status records it attached, that
                // record stands (a detach by hand is not looked for).
                if phase == Phase::Launching && s.volume_id.is_some() {
                    shown.retain(|v| *v != VolumeState::Absent);
                }
                if phase == Phase::Launching && s.volume_attached == Some(true) {
                    shown.retain(|v| *v == VolumeState::Present { attached: true });
                }
                for volume in shown {
                    assert_eq!(pass(volume), skipped, "{phase:?} {:?} instance {instance:?}: {volume:?}", s.reset);
                }
            }
        }
        assert!(described > 0);
        let launching = |volume_id: Option<&str>| SandboxStatus {
            volume_id: volume_id.map(str::to_owned),
            ..status(Phase::Launching)
        };
        assert!(
            needs_workspace_volume(Phase::Launching, &launching(None), Some(Pending)),
            "found by tag before it is made"
        );
        assert!(needs_workspace_volume(Phase::Launching, &launching(Some("vol-1")), Some(Running)), "to attach it");
        assert!(!needs_workspace_volume(Phase::Launching, &launching(Some("vol-1")), Some(Pending)));
        let gone = plan(
            &SandboxStatus { attempt: Some(1), instance_id: Some("i-1".into()), ..launching(Some("vol-1")) },
            &Observed { instance: Some(Running), volume: VolumeState::Absent, ..ready(10, 1) },
        );
        assert_eq!(gone.actions.first(), Some(&Action::EnsureVolume), "a lost volume is made again");
        let terminated =
            SandboxStatus { reset: order[..3].iter().copied().map(step).collect(), ..status(Phase::Stopping) };
        assert!(needs_workspace_volume(Phase::Stopping, &terminated, Some(Terminated)), "to delete it");
        assert!(!needs_workspace_volume(Phase::Running, &status(Phase::Running), Some(Running)));
    }

    #[test]
    fn a_terminating_instance_is_waited_for_not_terminated_again() {
        let s = SandboxStatus {
            instance_id: Some("i-1".into()),
            reset: vec![ResetStepStatus { step: "cancel_queued_commands".into(), confirmed_at: Time(at(0)) }],
            ..status(Phase::Stopping)
        };
        let o = Observed {
            desired: Desired::End(StopReason::Cancelled),
            instance: Some(InstanceState::ShuttingDown),
            ..obs(1)
        };
        let p = plan(&s, &o);
        assert!(p.actions.is_empty());
        assert_eq!(p.status.phase, Some(Phase::Stopping));
    }

    #[test]
    fn ending_before_any_instance_is_failed() {
        let reason = StopReason::LaunchFailed("InvalidAMIID.NotFound: no such AMI".into());
        let o = Observed { desired: Desired::End(reason), volume: VolumeState::Absent, key_present: false, ..obs(0) };
        let p = plan(&SandboxStatus::default(), &o);
        assert_eq!(p.actions, vec![Action::SignCertificate]);
        let p = plan(&signed(p.status), &o);
        assert_eq!(p.status.phase, Some(Phase::Failed));
        assert_eq!(p.status.stop_reason.as_deref(), Some("launch_failed: InvalidAMIID.NotFound: no such AMI"));
    }

    fn signed(mut s: SandboxStatus) -> SandboxStatus {
        s.certificate = Some(hangar_crds::Certificate { signed_at: Some(Time(at(5))), ..Default::default() });
        s
    }

    #[test]
    fn ended_is_terminal() {
        let p = plan(&status(Phase::Ended), &Observed { desired: Desired::Run, ..obs(0) });
        assert_eq!(p.status.phase, Some(Phase::Ended));
        assert!(p.actions.is_empty());
    }

    /// Attempt 1 running since t=0, the worker's last heartbeat at t=100,
    /// one command running.
    fn running_attempt_1() -> SandboxStatus {
        let mut s = SandboxStatus { attempt: Some(1), ..status(Phase::Running) };
        s.attempts.push(Attempt {
            number: 1,
            cause: AttemptCause::Launch,
            started_at: Some(Time(at(0))),
            ended_at: None,
            end: None,
            compute_seconds: 0,
        });
        s
    }

    fn silent_since_100(now: i64) -> Observed {
        Observed {
            worker: None,
            last_heartbeat: Some(at(100)),
            worker_lost_after: Some(Duration::from_secs(60)),
            running_commands: 1,
            ..ready(now, 1)
        }
    }

    #[test]
    fn a_reclaimed_instance_interrupts_then_recovers_as_a_new_attempt() {
        let s = running_attempt_1();
        let o = Observed { instance: Some(InstanceState::Stopped), ..silent_since_100(130) };
        let p = plan(&s, &o);
        assert_eq!(p.status.phase, Some(Phase::Interrupted));
        assert_eq!(p.status.attempts[0].end, Some(AttemptEnd::Interrupted));
        assert_eq!(p.status.attempts[0].compute_seconds, 100, "compute counts to the last heartbeat");
        assert_eq!(p.actions, vec![Action::SettleInterruptedCommands, Action::RecoverInstance]);
        let int = p.status.interruptions.last().unwrap();
        assert_eq!((int.attempt, int.cause), (1, InterruptionCause::Reclaimed));
        // Asked again only after the retry interval.
        let o2 = Observed { running_commands: 0, ..o.clone() };
        assert!(plan(&p.status, &Observed { now: at(140), ..o2.clone() }).actions.is_empty());
        assert_eq!(plan(&p.status, &Observed { now: at(160), ..o2 }).actions, vec![Action::RecoverInstance]);
        // Running again, worker of attempt 2 reporting: recovered.
        let back = plan(&p.status, &Observed { running_commands: 0, ..ready(200, 2) });
        assert_eq!(back.status.phase, Some(Phase::Running));
        assert_eq!(back.status.attempt, Some(2));
        assert_eq!(back.status.attempts[1].cause, AttemptCause::Recovery);
        assert!(back.status.interruptions[0].recovered_at.is_some());
        assert_eq!(back.events.last().unwrap().0, "Recovered");
    }

    #[test]
    fn a_silent_worker_on_a_running_instance_means_stop_then_start() {
        let s = running_attempt_1();
        // Silent 59 s: not yet; the requeue is when it would be lost.
        let early = plan(&s, &silent_since_100(159));
        assert_eq!(early.status.phase, Some(Phase::Running));
        assert_eq!(early.requeue_after, Some(Duration::from_millis(1100)));
        let p = plan(&s, &silent_since_100(160));
        assert_eq!(p.status.phase, Some(Phase::Interrupted));
        assert_eq!(p.status.attempts[0].end, Some(AttemptEnd::WorkerLost));
        assert_eq!(p.actions, vec![Action::SettleInterruptedCommands, Action::StopInstance]);
        // Stopping, then stopped: started again.
        let o = Observed { running_commands: 0, ..silent_since_100(165) };
        assert!(plan(&p.status, &Observed { instance: Some(InstanceState::Stopping), ..o.clone() }).actions.is_empty());
        let p2 = plan(&p.status, &Observed { instance: Some(InstanceState::Stopped), ..o });
        assert_eq!(p2.actions, vec![Action::RecoverInstance]);
        let back = plan(&p2.status, &ready(200, 2));
        assert_eq!(back.status.phase, Some(Phase::Running));
        assert_eq!(back.status.attempts[1].cause, AttemptCause::Recovery);
    }

    #[test]
    fn no_worker_is_judged_lost_while_the_heartbeats_are_unknown() {
        let o = Observed { worker_lost_after: None, ..silent_since_100(1000) };
        assert_eq!(plan(&running_attempt_1(), &o).status.phase, Some(Phase::Running));
    }

    #[test]
    fn a_terminated_instance_ends_the_session_outcome_unknown() {
        let o = Observed { instance: Some(InstanceState::Terminated), ..silent_since_100(120) };
        let p = plan(&running_attempt_1(), &o);
        assert_eq!(p.status.phase, Some(Phase::Stopping));
        assert_eq!(p.status.outcome.as_deref(), Some("outcome_unknown"));
        assert_eq!(p.status.stop_reason.as_deref(), Some("instance_lost"));
        assert_eq!(p.status.attempts[0].end, Some(AttemptEnd::HostLost));
        assert_eq!(p.actions[0], Action::SettleInterruptedCommands);
    }

    #[test]
    fn not_running_again_within_the_window_ends_the_session() {
        let o = Observed { instance: Some(InstanceState::Stopped), ..silent_since_100(130) };
        let p = plan(&running_attempt_1(), &o);
        let late = Observed { now: at(130 + 1800), running_commands: 0, ..o };
        let end = plan(&p.status, &late);
        assert_eq!(end.status.phase, Some(Phase::Stopping));
        assert_eq!(end.status.stop_reason.as_deref(), Some("interruption_lost"));
        assert_eq!(end.status.outcome.as_deref(), Some("outcome_unknown"));
        assert_eq!(end.status.attempts.len(), 1, "no attempt opened for a start that never ran");
    }

    #[test]
    fn an_agent_that_could_not_start_ends_with_its_reason_and_no_outcome() {
        let why = "cannot start the agent x: No such file or directory\n".to_owned() + &"y".repeat(500);
        let o =
            Observed { mode: Mode::Agent, agent: AgentState::Exited(127), agent_message: Some(why), ..ready(10, 1) };
        let p = plan(&running_attempt_1(), &o);
        let reason = p.status.stop_reason.unwrap();
        assert!(reason.starts_with("agent_start_failed: cannot start the agent x: No such file or directory"));
        assert!(reason.len() < 240 && !reason.contains('\n'), "capped, one line: {reason}");
        assert_eq!((p.status.exit_code, p.status.outcome), (Some(127), None));
        // Without the supervisor's message, 127 is the agent's own exit code.
        let o = Observed { mode: Mode::Agent, agent: AgentState::Exited(127), ..ready(10, 1) };
        assert_eq!(plan(&running_attempt_1(), &o).status.stop_reason.as_deref(), Some("agent_exited"));
    }

    #[test]
    fn mode_agent_is_never_recovered() {
        for instance in [InstanceState::Stopped, InstanceState::Running] {
            let o = Observed { mode: Mode::Agent, instance: Some(instance), ..silent_since_100(170) };
            let p = plan(&running_attempt_1(), &o);
            assert_eq!(p.status.phase, Some(Phase::Stopping), "{instance:?}");
            assert_eq!(p.status.stop_reason.as_deref(), Some("interruption_lost"));
            assert_eq!(p.status.outcome.as_deref(), Some("outcome_unknown"));
        }
    }

    #[test]
    fn a_reclamation_while_pausing_is_an_interruption_not_a_pause() {
        let mut s = running_attempt_1();
        s.phase = Some(Phase::Pausing);
        s.pause = Some(PauseProgress { requested_at: Some(Time(at(90))), ..Default::default() });
        let o = Observed { desired: Desired::Pause, instance: Some(InstanceState::Stopped), ..silent_since_100(110) };
        let p = plan(&s, &o);
        assert_eq!(p.status.attempts[0].end, Some(AttemptEnd::Interrupted));
        // The pause asked for is where it lands: paused, workspace kept.
        assert_eq!(p.status.phase, Some(Phase::Paused));
        assert_eq!(p.status.interruptions.len(), 1);
        // Our own stop is the pause...
        let mut ours = s.clone();
        ours.pause.as_mut().unwrap().stop_requested_at = Some(Time(at(100)));
        let p = plan(&ours, &o);
        assert_eq!(p.status.attempts[0].end, Some(AttemptEnd::Paused));
        assert!(p.status.interruptions.is_empty());
        // ...unless EC2 warned of a reclamation first.
        let warned =
            plan(&ours, &Observed { reclaim_warned: true, instance: Some(InstanceState::Running), ..o.clone() });
        assert!(warned.status.reclaim_warned_at.is_some(), "the warning is recorded");
        assert_eq!(warned.status.phase, Some(Phase::Pausing));
        let after = plan(&warned.status, &o);
        assert_eq!(after.status.attempts[0].end, Some(AttemptEnd::Interrupted));
        assert_eq!(after.status.reclaim_warned_at, None, "spent with the run it was about");
    }
}

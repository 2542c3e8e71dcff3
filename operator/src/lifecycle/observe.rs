//! Dereference: gather what the phase machine needs about one session from
//! the caches (instances, nodes, heartbeat Leases) and, only in the phases
//! that need them, from EC2 and the apiserver.

use std::time::Duration;

use hangar_crds::{CommandPhase, DesiredState, Phase, Sandbox, Scope, SessionToken, TokenPhase, heartbeat};
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::runtime::reflector::ObjectRef;

use crate::context::Context;
use crate::ec2::instances::InstanceView;
use crate::error::Result;
use crate::keys;
use crate::node::agent_pod;
use crate::node::labels::{SESSION_LABEL, SESSION_TAINT, instance_of_provider_id};
use hangar_core::session::ending::StopReason;
use hangar_core::session::instance::InstanceState;
use hangar_core::session::node_choice::{self, NodeChoice};
use hangar_core::session::phase_machine::{self, AgentState, Desired, ImageCheck, Observed, VolumeState, WorkerReport};
use hangar_crds::PreflightState;

pub struct Observation {
    pub observed: Observed,
    pub instance: Option<InstanceView>,
    pub volume: Option<crate::ec2::volumes::VolumeView>,
    pub node: Option<Node>,
    /// When the worker reported the workspace closed (from its Lease).
    pub workspace_closed_at: Option<Timestamp>,
    /// Every image the session runs (read only while the preflight is
    /// still to pass).
    pub images: Vec<String>,
    /// The tokens the reset's `revoke_tokens` acts on (listed only while
    /// the session ends; `observed.tokens_to_revoke` is their count).
    pub tokens_to_revoke: Vec<SessionToken>,
}

/// The session's tokens the reset still has to revoke: active (or not yet
/// issued) and with more than `read` scope. Read from the apiserver, not a
/// cache, so the step is confirmed by what is stored.
async fn tokens_to_revoke(ctx: &Context, sandbox: &Sandbox) -> Result<Vec<SessionToken>> {
    let ns = sandbox.metadata.namespace.clone().unwrap_or_default();
    let tokens: Api<SessionToken> = Api::namespaced(ctx.client.clone(), &ns);
    Ok(tokens
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|t| {
            let st = t.status.clone().unwrap_or_default();
            Some(&t.spec.sandbox) == sandbox.metadata.name.as_ref()
                && (st.session_id.is_none() || st.session_id == sandbox.metadata.uid)
                && t.spec.scopes.iter().any(|s| *s != Scope::Read)
                && !matches!(st.phase, Some(TokenPhase::Revoked | TokenPhase::Expired))
        })
        .collect())
}

pub fn desired(sandbox: &Sandbox) -> Desired {
    if sandbox.metadata.deletion_timestamp.is_some() {
        return Desired::End(StopReason::Deleted);
    }
    if sandbox.spec.revoke_all {
        return Desired::End(StopReason::RevokeAll);
    }
    match sandbox.spec.state {
        DesiredState::Ended => Desired::End(StopReason::Cancelled),
        DesiredState::Paused => Desired::Pause,
        DesiredState::Running => Desired::Run,
    }
}

/// The session's Node: the one whose providerID names its instance
/// (`hangar_core::session::node_choice`: never one of several claims, and
/// only the recorded one once there is one).
pub fn find_node(ctx: &Context, instance_id: &str, recorded: Option<&str>) -> Option<Node> {
    let nodes = ctx.nodes.state();
    let claims: Vec<&str> = nodes
        .iter()
        .filter(|n| {
            n.spec.as_ref().and_then(|s| s.provider_id.as_deref()).and_then(instance_of_provider_id)
                == Some(instance_id)
        })
        .filter_map(|n| n.metadata.name.as_deref())
        .collect();
    match node_choice::choose(&claims, recorded) {
        NodeChoice::Chosen(name) => {
            nodes.iter().find(|n| n.metadata.name.as_deref() == Some(name)).map(|n| (**n).clone())
        }
        NodeChoice::None => None,
        NodeChoice::Ambiguous(names) => {
            tracing::warn!(instance = instance_id, nodes = ?names, "several Nodes claim the session's instance; trusting none");
            None
        }
        NodeChoice::NotTheRecorded => {
            tracing::warn!(instance = instance_id, recorded, nodes = ?claims, "a Node other than the session's claims its instance; ignored");
            None
        }
    }
}

pub(crate) fn ready_condition(node: &Node) -> Option<bool> {
    let c = node.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "Ready")?;
    Some(c.status == "True")
}

pub fn node_prepared(node: &Node, sandbox_name: &str, session_id: &str) -> bool {
    let labelled =
        node.metadata.labels.as_ref().and_then(|l| l.get(SESSION_LABEL)).map(String::as_str) == Some(sandbox_name);
    let tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == SESSION_TAINT && t.value.as_deref() == Some(session_id)));
    let annotated = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(crate::node::labels::DO_NOT_DISRUPT))
        .is_some_and(|v| v == "true");
    labelled && tainted && annotated
}

pub async fn observe(ctx: &Context, sandbox: &Sandbox, session_id: &str) -> Result<Observation> {
    let now = Timestamp::now();
    let status = sandbox.status.clone().unwrap_or_default();
    let phase = status.phase.unwrap_or(Phase::Launching);
    let ns = sandbox.metadata.namespace.clone().unwrap_or_default();
    let name = sandbox.metadata.name.clone().unwrap_or_default();

    let instance = ctx.instances.get(session_id);
    let node = instance.as_ref().and_then(|i| find_node(ctx, &i.id, status.node_name.as_deref()));
    let ready = node.as_ref().and_then(ready_condition);
    // A Ready Node means its instance has booted: a view that still says
    // pending is behind, so it looks again now, not at its next poll.
    if ready == Some(true) && instance.as_ref().is_some_and(|i| i.state == InstanceState::Pending) {
        ctx.instances.request_refresh();
    }

    // The worker's Lease on the session's node: fresh, for this session,
    // and which attempt it serves.
    let node_name = node.as_ref().and_then(|n| n.metadata.name.clone()).or_else(|| status.node_name.clone());
    let lease = node_name
        .as_deref()
        .and_then(|n| ctx.leases.get(&ObjectRef::new(&heartbeat::lease_name(n)).within(&ctx.settings.system_namespace)))
        .filter(|l| {
            l.metadata.annotations.as_ref().and_then(|a| a.get(heartbeat::SESSION_ID)).map(String::as_str)
                == Some(session_id)
        });
    let stale = Duration::from_secs(ctx.settings.heartbeat_stale_seconds);
    let mut workspace_closed_at = None;
    let last_heartbeat = lease.as_ref().and_then(|l| Some(l.spec.as_ref()?.renew_time.as_ref()?.0));
    // Judged only once the Lease cache has listed: before that, a missing
    // heartbeat says nothing about the worker.
    let leases_known = hangar_runtime::kube_ext::has_listed(&ctx.leases);
    let worker = lease.as_ref().and_then(|l| {
        let renewed = l.spec.as_ref()?.renew_time.as_ref()?.0;
        let age = now.as_second() - renewed.as_second();
        if age > stale.as_secs() as i64 {
            return None;
        }
        let ann = l.metadata.annotations.as_ref()?;
        let attempt = ann.get(heartbeat::ATTEMPT)?.parse().ok()?;
        let closed = ann.get(heartbeat::WORKSPACE_CLOSED).and_then(|v| v.parse::<i64>().ok()) == Some(attempt);
        if closed {
            workspace_closed_at = ann.get(heartbeat::WORKSPACE_CLOSED_AT).and_then(|t| t.parse().ok());
        }
        Some(WorkerReport { attempt, workspace_closed: closed })
    });

    // No instance, no node, no agent Pod yet: skip the lookup on the launch
    // path. From the watch cache: a Pod's change wakes this session after
    // the cache has it, and a Pod created but not cached yet is created
    // again harmlessly (already exists).
    let mut agent_message = None;
    let agent = if instance.is_none() {
        AgentState::Absent
    } else {
        match ctx.pods.get(&ObjectRef::new(&agent_pod::pod_name(&name)).within(&ns)) {
            None => AgentState::Absent,
            Some(p) if agent_pod::is_ours(&p, session_id) => {
                agent_message = termination_message(&p);
                agent_state(&p)
            }
            Some(_) => {
                // Never adopted: the session waits until the name is free.
                agent_pod::warn_foreign(&agent_pod::pod_name(&name));
                AgentState::Absent
            }
        }
    };

    // The preflight, until it has passed and only before the first launch.
    let preflight_passed = status.image_preflight.as_ref().is_some_and(|p| p.state == PreflightState::Passed);
    let never_launched = instance.is_none() && status.instance_id.is_none() && !preflight_passed;
    let (images, image_check) = if !preflight_passed && phase == Phase::Launching {
        match crate::images::session_images(ctx, sandbox).await? {
            Err(reason) => (vec![], ImageCheck::Refused(reason)),
            Ok(images) => {
                let since = status.image_preflight.as_ref().and_then(|p| p.started_at.as_ref()).map(|t| t.0);
                let timeout = Duration::from_secs(ctx.settings.preflight_timeout_seconds);
                let who = ObjectRef::from_obj(sandbox);
                let check = ctx.preflights.judge(&images, &who, since, now, timeout);
                (images, check)
            }
        }
    } else {
        (vec![], ImageCheck::Passed(vec![]))
    };

    let needs_volume = phase_machine::needs_workspace_volume(phase, &status, instance.as_ref().map(|i| i.state));
    let (volume_state, volume) = match (needs_volume, &instance) {
        // Never launched (its images never passed the preflight): no
        // volume can exist, and the reset makes no EC2 call to confirm it.
        (true, None) if never_launched => (VolumeState::Absent, None),
        // Launching without an instance: the volume comes after it, so no
        // describe is needed (it would only slow the path to RunInstances).
        (true, None) if phase == Phase::Launching => (VolumeState::Unknown, None),
        (false, _) => (VolumeState::Unknown, None),
        (true, _) => match ctx.ec2.find_workspace_volume(session_id).await? {
            None => (VolumeState::Absent, None),
            Some(v) => {
                let attached = instance.as_ref().is_some_and(|i| v.attached_to.as_deref() == Some(i.id.as_str()));
                (VolumeState::Present { attached }, Some(v))
            }
        },
    };

    // The key is made (create, tolerating "exists") before RunInstances in
    // the same pass, so while launching it is known without a read: absent
    // until there is an instance. The reset confirms its destruction by a read.
    let key_present = match phase {
        Phase::Stopping | Phase::ResetIncomplete => {
            let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ctx.settings.system_namespace);
            secrets.get_opt(&keys::secret_name(session_id)).await?.is_some()
        }
        Phase::Launching => instance.is_some(),
        _ => true,
    };

    let running_commands = running_commands(ctx, sandbox);
    let ending =
        matches!(phase, Phase::Stopping | Phase::ResetIncomplete) || matches!(desired(sandbox), Desired::End(_));
    let unfinished_commands = if ending {
        let commands: Api<hangar_crds::Command> = Api::namespaced(ctx.client.clone(), &ns);
        commands
            .list(&ListParams::default().fields(&format!("spec.sandbox={name}")))
            .await?
            .items
            .iter()
            .filter(|c| c.belongs_to(sandbox))
            .filter(|c| !c.status.as_ref().and_then(|s| s.phase).is_some_and(CommandPhase::is_final))
            .count()
    } else {
        0
    };

    let revocable = if ending { tokens_to_revoke(ctx, sandbox).await? } else { Vec::new() };

    Ok(Observation {
        observed: Observed {
            now,
            mode: sandbox.spec.mode,
            desired: desired(sandbox),
            instance: instance.as_ref().map(|i| i.state),
            volume: volume_state,
            node_ready: ready,
            node_prepared: node.as_ref().is_some_and(|n| node_prepared(n, &name, session_id)),
            worker,
            agent,
            key_present,
            unfinished_commands,
            tokens_to_revoke: revocable.len(),
            pause_grace: ctx.settings.pause_grace(),
            resume_request: hangar_core::session::requests::resume_request(sandbox),
            idle: idle(ctx, sandbox, now, running_commands > 0),
            stop_after: sandbox
                .spec
                .stop_after_seconds
                .map(|s| ctx.settings.stop_after_second() * s.clamp(0, u32::MAX as i64) as u32),
            max_pause: Duration::from_secs(ctx.settings.max_pause_seconds),
            last_heartbeat,
            worker_lost_after: leases_known.then(|| Duration::from_secs(ctx.settings.worker_lost_seconds)),
            recovery_window: Duration::from_secs(ctx.settings.recovery_window_seconds),
            recovery_retry: Duration::from_secs(ctx.settings.recovery_retry_seconds.max(1)),
            running_commands,
            reclaim_warned: instance.as_ref().is_some_and(|i| ctx.instances.reclaim_warned(&i.id)),
            agent_message,
            images: image_check,
        },
        instance,
        volume,
        node,
        workspace_closed_at,
        images,
        tokens_to_revoke: revocable,
    })
}

/// Commands of the session marked running or cancelling (watch cache).
fn running_commands(ctx: &Context, sandbox: &Sandbox) -> usize {
    ctx.commands
        .state()
        .iter()
        .filter(|c| c.belongs_to(sandbox))
        .filter(|c| {
            matches!(c.status.as_ref().and_then(|s| s.phase), Some(CommandPhase::Running | CommandPhase::Cancelling))
        })
        .count()
}

/// Mode commands: whether the session is active (a command running, or a
/// client attached within the last 30 idle-clock seconds) and its policy.
fn idle(
    ctx: &Context,
    sandbox: &Sandbox,
    now: Timestamp,
    running: bool,
) -> Option<hangar_core::session::phase_machine::Idle> {
    let policy = sandbox.spec.idle_policy()?;
    let second = ctx.settings.idle_second();
    let attached = kube::ResourceExt::annotations(sandbox)
        .get(hangar_core::idle::ATTACHED_AT_ANNOTATION)
        .and_then(|t| t.parse::<Timestamp>().ok())
        .is_some_and(|at| {
            let window = second * hangar_core::idle::ATTACHED_FOR_SECONDS as u32;
            now.duration_since(at).unsigned_abs() < window
        });
    Some(hangar_core::session::phase_machine::Idle {
        active: running || attached,
        timeout: second * policy.timeout_seconds.clamp(0, u32::MAX as i64) as u32,
        action: policy.action,
    })
}

/// The agent container's termination message, when it ended with one.
pub(crate) fn termination_message(pod: &Pod) -> Option<String> {
    let agent = pod.status.as_ref()?.container_statuses.as_ref()?.iter().find(|c| c.name == "agent")?;
    agent.state.as_ref()?.terminated.as_ref()?.message.clone().filter(|m| !m.trim().is_empty())
}

pub fn agent_state(pod: &Pod) -> AgentState {
    let Some(status) = pod.status.as_ref() else { return AgentState::Pending };
    // The agent container's own end counts, whatever the Pod's phase: with
    // companions running on, a kubelet keeps the Pod Running.
    let agent = status.container_statuses.iter().flatten().find(|c| c.name == "agent");
    if let Some(t) = agent.and_then(|c| c.state.as_ref()?.terminated.as_ref()) {
        return AgentState::Exited(t.exit_code);
    }
    match status.phase.as_deref() {
        Some("Running") => AgentState::Running,
        Some("Succeeded") | Some("Failed") => {
            let code = status
                .container_statuses
                .iter()
                .flatten()
                .find(|c| c.name == "agent")
                .and_then(|c| c.state.as_ref()?.terminated.as_ref())
                .map(|t| t.exit_code)
                .unwrap_or(if status.phase.as_deref() == Some("Succeeded") { 0 } else { 1 });
            AgentState::Exited(code)
        }
        _ => AgentState::Pending,
    }
}

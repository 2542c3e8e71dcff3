//! Apply: the side effects the phase machine asked for, each idempotent
//! (found before it is made again), each folding what it learned into the
//! status being written.

use std::collections::BTreeMap;

use hangar_crds::{CommandPhase, Sandbox, SandboxStatus, output_keys};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Node, Pod, Secret, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use serde_json::json;

use super::observe::Observation;
use hangar_runtime::kube_ext::{is_already_exists, is_conflict, is_not_found};

use crate::context::Context;
use crate::ec2::instances::{InstanceView, LaunchRequest};
use crate::ec2::tags::SessionTags;
use crate::ec2::{Ec2Error, Ec2ErrorKind, user_data};
use crate::error::{Error, Result};
use crate::keys;
use crate::node::agent_pod;
use crate::node::labels::{self, NodeFacts, SESSION_TAINT};
use crate::settings::shape_of;
use hangar_core::session::ending::StopReason;
use hangar_core::session::phase_machine::{self as phase, Action};

pub struct Session<'a> {
    pub sandbox: &'a Sandbox,
    pub session_id: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
}

/// Runs one action. `Err` leaves the rest of the plan for the next reconcile.
pub async fn execute(
    ctx: &Context,
    s: &Session<'_>,
    obs: &Observation,
    action: &Action,
    status: &mut SandboxStatus,
) -> Result<()> {
    let tags = SessionTags {
        cluster: &ctx.settings.cluster_name,
        session_id: s.session_id,
        namespace: s.namespace,
        name: s.name,
    };
    match action {
        Action::PreflightImages => {
            ctx.preflights.start(&obs.images, kube::runtime::reflector::ObjectRef::from_obj(s.sandbox));
            Ok(())
        }
        Action::EnsureKey => ensure_key(ctx, s).await,
        Action::Launch => launch(ctx, s, &tags, status).await,
        Action::EnsureVolume => {
            let zone = obs.instance.as_ref().map(|i| i.zone.clone()).ok_or(Error::MissingField("instance zone"))?;
            // Planned only when this pass's observation found no volume
            // by tag (a describe moments ago): not looked for again.
            let v = ctx.ec2.create_workspace_volume(&tags, &zone).await?;
            status.volume_id = Some(v.id);
            Ok(())
        }
        Action::AttachVolume => {
            let (Some(v), Some(i)) = (&obs.volume, &obs.instance) else { return Ok(()) };
            match ctx.ec2.attach(&v.id, &i.id).await {
                Ok(()) => {}
                // Attached meanwhile (a crash between call and status write).
                Err(e) if e.is(Ec2ErrorKind::IncorrectState) => {}
                Err(e) => return Err(e.into()),
            }
            status.volume_id = Some(v.id.clone());
            status.volume_attached = Some(true);
            Ok(())
        }
        Action::PrepareNode => prepare_node(ctx, s, obs, status).await,
        Action::CreateAgentPod => {
            let Some(node) = obs.node.as_ref().and_then(|n| n.metadata.name.clone()) else { return Ok(()) };
            // Refused meanwhile (its key no longer trusted): the launch
            // path decided already; no Pod from an unverified template.
            let Ok(image) = crate::images::agent_image(ctx, s.sandbox).await? else { return Ok(()) };
            let settings = &ctx.settings;
            let supervisor = settings.supervisor_image.as_deref();
            let pod = agent_pod::build(s.sandbox, s.session_id, &node, &image, supervisor, &settings.node_root);
            let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), s.namespace);
            match pods.create(&PostParams::default(), &pod).await {
                // The watch cache holds only Pods labelled as hangar's: the
                // name is taken by ours from a pass the cache has not caught
                // up with, or by a Pod someone else made (never adopted).
                Err(e) if is_already_exists(&e) => {
                    let name = agent_pod::pod_name(s.name);
                    if pods.get_opt(&name).await?.is_some_and(|p| !agent_pod::is_ours(&p, s.session_id)) {
                        agent_pod::warn_foreign(&name);
                    }
                    Ok(())
                }
                Err(e) => Err(e.into()),
                Ok(_) => Ok(()),
            }
        }
        Action::StopInstance => {
            let id = status.instance_id.clone().ok_or(Error::MissingField("status.instanceId"))?;
            // Measured when the call leaves: the operator's part of the pause.
            if let Some(closed) = obs.workspace_closed_at {
                let ms = (Timestamp::now().as_millisecond() - closed.as_millisecond()).max(0) as u64;
                ctx.metrics.workspace_closed_to_stop(ms);
            }
            match ctx.ec2.stop(&id).await {
                Ok(state) => {
                    ctx.instances.set_state(&id, state);
                    ctx.instances.request_refresh();
                    Ok(())
                }
                Err(e) => {
                    // Not asked after all: the next pass asks again.
                    if let Some(p) = status.pause.as_mut() {
                        p.stop_requested_at = None;
                    }
                    if let Some(i) = open_interruption(status) {
                        i.stop_requested_at = None;
                    }
                    Err(e.into())
                }
            }
        }
        Action::RecoverInstance => match start_instance(ctx, status).await {
            // No capacity now (or still stopping): asked again after the
            // retry interval, until the recovery window closes.
            Ok(Some(e)) => {
                tracing::info!(error = %e, "the interrupted instance did not start yet; waiting");
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(e) => {
                if let Some(i) = open_interruption(status) {
                    i.start_requested_at = None;
                }
                Err(e)
            }
        },
        Action::SettleInterruptedCommands => settle_commands(ctx, s, status, Settle::RunningOnly).await,
        Action::StartInstance => {
            if let Some(e) = start_instance(ctx, status).await? {
                tracing::warn!(error = %e, "the instance did not start; back to paused");
                let request = hangar_core::session::requests::resume_request(s.sandbox);
                phase::start_failed(status, Timestamp::now(), &request, &e.to_string());
            }
            Ok(())
        }
        Action::RevokeTokens => revoke_tokens(ctx, s, &obs.tokens_to_revoke).await,
        Action::CancelQueuedCommands => settle_commands(ctx, s, status, Settle::All).await,
        Action::TerminateInstance => {
            // Only the agent Pod this session made: one someone else put
            // under its name is not ours to delete (the uid precondition
            // holds even if the name changes hands meanwhile).
            let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), s.namespace);
            if let Some(pod) = pods.get_opt(&agent_pod::pod_name(s.name)).await?
                && agent_pod::is_ours(&pod, s.session_id)
            {
                // At once: its instance is terminated next, so nothing
                // could stop it gracefully, and a later session of the same
                // name must not find it there.
                let dp = DeleteParams {
                    grace_period_seconds: Some(0),
                    preconditions: Some(Preconditions { uid: pod.uid(), resource_version: None }),
                    ..Default::default()
                };
                match pods.delete(&agent_pod::pod_name(s.name), &dp).await {
                    Err(e) if !is_not_found(&e) && !is_conflict(&e) => return Err(e.into()),
                    _ => {}
                }
            }
            crate::node::worker_account::revoke(ctx, s.session_id, s.namespace).await?;
            // By status, and by tag: an instance launched just before a
            // crash may not be in the status yet.
            let mut ids: Vec<String> = status.instance_id.iter().cloned().collect();
            for i in ctx.ec2.find_session_instances(s.session_id).await? {
                if !ids.contains(&i.id) {
                    ids.push(i.id);
                }
            }
            for id in ids {
                let state = ctx.ec2.terminate(&id).await?;
                ctx.instances.set_state(&id, state);
            }
            ctx.instances.request_refresh();
            Ok(())
        }
        Action::DeleteVolume => {
            let Some(v) = &obs.volume else { return Ok(()) };
            if v.attached_to.is_some() && !v.available {
                ctx.ec2.detach(&v.id).await?;
                return Ok(()); // deleted on a later pass, once available
            }
            ctx.ec2.delete_volume(&v.id).await?;
            Ok(())
        }
        Action::DestroyKey => {
            let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ctx.settings.system_namespace);
            match secrets.delete(&keys::secret_name(s.session_id), &DeleteParams::default()).await {
                Err(e) if !is_not_found(&e) => Err(e.into()),
                _ => Ok(()),
            }
        }
        Action::SignCertificate => crate::certificates::sign(ctx, s, status).await,
    }
}

/// Every token of the session beyond `read` scope: revoked in its status
/// (by compare-and-swap; a lost race is looked at again on the next pass).
/// The token controller then deletes an undelivered plaintext and cancels
/// the queued commands the token sent.
async fn revoke_tokens(ctx: &Context, s: &Session<'_>, tokens: &[hangar_crds::SessionToken]) -> Result<()> {
    let api: Api<hangar_crds::SessionToken> = Api::namespaced(ctx.client.clone(), s.namespace);
    for token in tokens {
        let patch = json!({"phase": "revoked", "reason": "session_ended", "revokedAt": Time(Timestamp::now())});
        hangar_runtime::kube_ext::try_swap_status(&api, token, patch).await?;
    }
    Ok(())
}

/// Makes the session's sealed key. One already there is used only if
/// hangar made it (`keys::is_own_session_key`); anyone else's (a plaintext
/// key, another session's sealed key copied over) is refused with a
/// Warning Event and counted, and the session waits.
async fn ensure_key(ctx: &Context, s: &Session<'_>) -> Result<()> {
    let session_id = s.session_id;
    let name = keys::secret_name(session_id);
    let sealed = ctx.org_key.seal(keys::new_session_key()?.as_slice(), session_id)?;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(ctx.settings.system_namespace.clone()),
            labels: Some(BTreeMap::from([(output_keys::SESSION_ID_LABEL.to_owned(), session_id.to_owned())])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("sealed-key".to_owned(), ByteString(sealed))])),
        type_: Some(keys::SECRET_TYPE.into()),
        immutable: Some(true),
        ..Default::default()
    };
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ctx.settings.system_namespace);
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(_) => Ok(()),
        Err(e) if is_already_exists(&e) => {
            let existing = secrets.get(&name).await?;
            if keys::is_own_session_key(&existing, &ctx.org_key, session_id) {
                return Ok(());
            }
            ctx.metrics.foreign_key_secrets.inc();
            let note = format!("Secret {name} was not made by hangar for this session: refused; delete it to go on");
            super::publish(ctx, s.sandbox, "ForeignKeySecret", &note, kube::runtime::events::EventType::Warning);
            Err(Error::ForeignKeySecret(name))
        }
        Err(e) => Err(e.into()),
    }
}

async fn launch(ctx: &Context, s: &Session<'_>, tags: &SessionTags<'_>, status: &mut SandboxStatus) -> Result<()> {
    let settings = &ctx.settings;
    let size = s.sandbox.spec.size;
    let render = |instance_type: &str, zone: &str| {
        let labels = labels::labels(&NodeFacts {
            session_name: s.name,
            session_namespace: s.namespace,
            session_id: s.session_id,
            instance_type,
            zone,
            region: &settings.aws_region,
        });
        user_data::render(&user_data::JoinConfig {
            cluster_name: &settings.cluster_name,
            api_server_endpoint: &settings.cluster_endpoint,
            certificate_authority: &settings.cluster_ca,
            cidr: &settings.cluster_cidr,
            session_id: s.session_id,
            labels: &labels,
        })
    };
    let req = LaunchRequest {
        tags: SessionTags { ..*tags },
        attempt: status.attempt.unwrap_or(1),
        instance_types: settings.instance_types_for(size),
        user_data: &render,
    };
    ctx.metrics.run_instances_called(format!("{}/{}", s.namespace, s.name), Timestamp::now().as_millisecond());
    match ctx.ec2.launch(&req).await {
        Ok(view) => {
            record_instance(status, &view);
            ctx.instances.observe(view);
            // Pending now; the watcher polls faster until it runs.
            ctx.instances.request_refresh();
            Ok(())
        }
        Err(e) if e.is(Ec2ErrorKind::InvalidConfiguration) || e.is(Ec2ErrorKind::InsufficientCapacity) => {
            // Permanent for this configuration: the session fails, the reset
            // cleans up whatever was made.
            fail_launch(status, &e);
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// The instance's id, type, zone and memory, as the status shows them.
pub fn record_instance(status: &mut SandboxStatus, view: &InstanceView) {
    status.instance_id = Some(view.id.clone());
    status.instance_type = Some(view.instance_type.clone());
    status.zone = Some(view.zone.clone());
    status.memory_gib = shape_of(&view.instance_type).map(|(_, m)| m as i64);
}

fn fail_launch(status: &mut SandboxStatus, e: &Ec2Error) {
    let detail = format!("{}: {}", e.code, e.message);
    let reason = if e.is(Ec2ErrorKind::InsufficientCapacity) {
        StopReason::InsufficientCapacity(detail)
    } else {
        StopReason::LaunchFailed(detail)
    };
    status.stop_reason = Some(reason.text());
    status.phase = Some(hangar_crds::Phase::Stopping);
}

async fn prepare_node(ctx: &Context, s: &Session<'_>, obs: &Observation, status: &mut SandboxStatus) -> Result<()> {
    let (Some(node), Some(instance)) = (&obs.node, &obs.instance) else { return Ok(()) };
    let name = node.metadata.name.clone().unwrap_or_default();
    // Before the labels: the worker waits for them, then mints its token.
    crate::node::worker_account::grant(ctx, &name, s.namespace, s.session_id).await?;
    let facts = NodeFacts {
        session_name: s.name,
        session_namespace: s.namespace,
        session_id: s.session_id,
        instance_type: &instance.instance_type,
        zone: &instance.zone,
        region: &ctx.settings.aws_region,
    };
    let mut node_labels = labels::labels(&facts);
    node_labels.extend(labels::binding_labels(&facts));
    let mut taints: Vec<Taint> = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
    taints.retain(|t| t.key != SESSION_TAINT);
    taints.push(Taint {
        key: SESSION_TAINT.into(),
        value: Some(s.session_id.to_owned()),
        effect: "NoSchedule".into(),
        time_added: None,
    });
    let patch = json!({
        "metadata": {"labels": node_labels, "annotations": labels::annotations()},
        "spec": {"taints": taints},
    });
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    nodes.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    status.node_name = Some(name);
    Ok(())
}

/// StartInstances of the session's instance. `Ok(Some(e))`: EC2 says it
/// cannot start now (no capacity, or not stopped yet).
async fn start_instance(ctx: &Context, status: &SandboxStatus) -> Result<Option<Ec2Error>> {
    let id = status.instance_id.clone().ok_or(Error::MissingField("status.instanceId"))?;
    match ctx.ec2.start(&id).await {
        Ok(state) => {
            ctx.instances.set_state(&id, state);
            ctx.instances.request_refresh();
            Ok(None)
        }
        Err(e) if e.is(Ec2ErrorKind::InsufficientCapacity) || e.is(Ec2ErrorKind::IncorrectState) => Ok(Some(e)),
        Err(e) => Err(e.into()),
    }
}

/// The interruption in progress (not recovered), if any.
fn open_interruption(status: &mut SandboxStatus) -> Option<&mut hangar_crds::Interruption> {
    status.interruptions.last_mut().filter(|i| i.recovered_at.is_none())
}

enum Settle {
    /// At an interruption: the commands marked running.
    RunningOnly,
    /// The reset step: every command not yet finished.
    All,
}

/// Ends the session's unfinished commands, by compare-and-swap so a final
/// status the worker wrote first stands:
/// - one marked running on an attempt that was interrupted (its end is
///   `interrupted`, `worker_lost` or `host_lost`) ends `outcome_unknown`:
///   nobody can know what it did; it never runs again;
/// - at the reset, every other unfinished one (queued, or running on an
///   instance being terminated) ends `cancelled`; a queued one never runs.
async fn settle_commands(ctx: &Context, s: &Session<'_>, status: &SandboxStatus, which: Settle) -> Result<()> {
    use hangar_crds::AttemptEnd;
    let lost = |attempt: Option<i64>| {
        status.attempts.iter().any(|a| {
            Some(a.number) == attempt
                && matches!(a.end, Some(AttemptEnd::Interrupted | AttemptEnd::WorkerLost | AttemptEnd::HostLost))
        })
    };
    let commands: Api<hangar_crds::Command> = Api::namespaced(ctx.client.clone(), s.namespace);
    let list = commands.list(&ListParams::default().fields(&format!("spec.sandbox={}", s.name))).await?;
    for c in list.items {
        let st = c.status.clone().unwrap_or_default();
        let finished = st.phase.is_some_and(CommandPhase::is_final);
        let bound = st.sandbox_uid.as_deref();
        if finished || bound.is_some_and(|uid| uid != s.session_id) {
            continue;
        }
        let running = matches!(st.phase, Some(CommandPhase::Running | CommandPhase::Cancelling));
        let now = Time(Timestamp::now());
        // Bound to this session: no later Sandbox of the name can take it.
        let patch = if running && lost(st.attempt) {
            let reason = format!("running when attempt {} was interrupted", st.attempt.unwrap_or(0));
            json!({"phase": "outcome_unknown", "reason": reason, "finishedAt": now, "sandboxUid": s.session_id})
        } else if matches!(which, Settle::All) {
            json!({"phase": "cancelled", "reason": "session_ended", "finishedAt": now, "sandboxUid": s.session_id})
        } else {
            continue;
        };
        hangar_runtime::kube_ext::try_swap_status(&commands, &c, patch).await?;
    }
    Ok(())
}

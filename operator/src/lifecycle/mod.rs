//! The Sandbox lifecycle controller. Each reconcile (here) is one pass of
//! a pipeline: dereference (`observe`) → decide
//! (`hangar_core::session::phase_machine::plan`, pure) → apply (`actions`)
//! → update status (server-side apply, `crate::sandbox_status`) → events.
//! Around it: the watch wiring (`watches`), the finalizer (`finalizer`) and
//! the benchmark's timing (`tracking`).

pub mod actions;
pub mod billing;
pub mod cached_fields;
pub mod conditions;
pub mod finalizer;
pub mod heartbeat_wakes;
pub mod observe;
mod tracking;
pub mod watches;

pub use finalizer::FINALIZER;
pub use watches::{CacheWriters, run};

use std::sync::Arc;
use std::time::Duration;

use hangar_crds::{CommandCounts, CommandPhase, Phase, Sandbox, SandboxStatus};
use kube::api::Api;
use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use tracing::{Instrument, info_span, warn};

use crate::context::Context;
use crate::error::{Error, Result};
use crate::output_keys::Lookup;
use crate::own_writes::CacheView;
use crate::sandbox_status::write_status;
use actions::Session;
use hangar_core::session::phase_machine as phase;

pub(crate) async fn reconcile(sandbox: Arc<Sandbox>, ctx: Arc<Context>) -> Result<Requeue> {
    let ns = sandbox.namespace().unwrap_or_default();
    let name = sandbox.name_any();
    let span = info_span!(
        "reconcile",
        namespace = %ns,
        sandbox = %name,
        phase = tracing::field::Empty,
        observe_ms = tracing::field::Empty,
        actions_ms = tracing::field::Empty,
    );
    let started = std::time::Instant::now();
    let started_ms = k8s_openapi::jiff::Timestamp::now().as_millisecond();
    let result = async {
        let result = reconcile_inner(sandbox, ctx.clone(), ns, name, started_ms).await;
        // A slow pass holds up every event of its session that arrives
        // meanwhile (one pass per object at a time): say where it went.
        let took = started.elapsed();
        if took >= SLOW_PASS {
            warn!(took_ms = took.as_millis() as u64, "slow reconcile");
        }
        result
    }
    .instrument(span)
    .await;
    ctx.metrics.reconciled(started.elapsed());
    result
}

/// A pass at least this long is logged with its stages' times (and a
/// `running` that waited this long for its pass, with the wait).
const SLOW_PASS: Duration = Duration::from_millis(250);

async fn reconcile_inner(
    sandbox: Arc<Sandbox>,
    ctx: Arc<Context>,
    ns: String,
    name: String,
    started_ms: i64,
) -> Result<Requeue> {
    ctx.metrics.reconciles.inc();
    ctx.metrics.watched_instances.set(ctx.instances.len() as i64);
    let session_id = sandbox.uid().ok_or(Error::MissingField("metadata.uid"))?;
    let api: Api<Sandbox> = Api::namespaced(ctx.client.clone(), &ns);
    let key = format!("{ns}/{name}");
    let mut sandbox = match ctx.own_writes.view(&key, sandbox.metadata.resource_version.as_deref()) {
        CacheView::Current => sandbox,
        CacheView::Written(stored) => {
            tracing::debug!("the cached Sandbox predates our own last status write; acting on the written copy");
            ctx.metrics.acted_on_written_copy.inc();
            stored
        }
        // The cache may still be old: act on the apiserver's copy, so no
        // side effect is repeated from an old one.
        CacheView::ReadThrough => match api.get_opt(&name).await? {
            Some(fresh) => {
                tracing::debug!("the cache may be old; reconciling the apiserver's copy");
                Arc::new(fresh)
            }
            None => return Ok(Requeue::await_change()),
        },
    };
    let current = sandbox.status.clone().unwrap_or_default();
    let terminal = matches!(current.phase, Some(Phase::Ended | Phase::Failed));
    if terminal {
        return after_the_end(&ctx, &api, &sandbox, &current, &session_id).await;
    }
    // Go on from the patched copy: the status write below is made over its
    // resourceVersion, which the finalizer patch moved.
    if let Some(patched) = finalizer::ensure_finalizer(&api, &sandbox).await? {
        sandbox = Arc::new(patched);
    }

    let stage = std::time::Instant::now();
    let obs = observe::observe(&ctx, &sandbox, &session_id).await?;
    tracing::Span::current().record("observe_ms", stage.elapsed().as_millis() as u64);
    // What EC2 shows is the truth about this session's resources, even when
    // a crash kept the status from recording them.
    let mut known = current.clone();
    adopt(&mut known, &obs);
    let plan = phase::plan(&known, &obs.observed);
    tracing::Span::current().record("phase", tracing::field::debug(plan.status.phase));

    let session = Session { sandbox: &sandbox, session_id: &session_id, namespace: &ns, name: &name };
    let mut status = plan.status.clone();
    status.session_id = Some(session_id.clone());
    // Counted from the watch cache, and only once it has listed (else it
    // would say 0 for a moment). Never awaited here: the cache is fed by the
    // same controller that runs this reconcile.
    if hangar_runtime::kube_ext::has_listed(&ctx.commands) {
        status.commands = Some(command_counts(&ctx, &sandbox));
    }
    let mut failure = None;
    let stage = std::time::Instant::now();
    for action in &plan.actions {
        tracing::debug!(?action, "apply");
        if let Err(e) = actions::execute(&ctx, &session, &obs, action, &mut status).await {
            failure = Some(e);
            break;
        }
        if let Some(step) = action.reset_step() {
            // Crash tests: right after the step's side effect, before the
            // status records anything of it.
            crate::failpoint::hit(&format!("reset:{}", step.as_str()));
        }
    }
    tracing::Span::current().record("actions_ms", stage.elapsed().as_millis() as u64);
    // The reset: `reset_incomplete` while a step's last try failed (the
    // pending step says why), back to `stopping` once a pass goes through.
    if matches!(status.phase, Some(Phase::Stopping | Phase::ResetIncomplete)) {
        match &failure {
            Some(e) => {
                status.phase = Some(Phase::ResetIncomplete);
                if let Some(pending) = status.reset_pending.as_mut() {
                    pending.message = format!("failed: {e}; retrying");
                }
            }
            None => status.phase = Some(Phase::Stopping),
        }
    }
    if let Some(node) = status.node_name.as_deref()
        && !matches!(status.phase, Some(Phase::Ended | Phase::Failed))
        && let Err(e) = crate::commands::stamp_node(&ctx, &sandbox, node).await
    {
        warn!(error = %e, "could not stamp the commands with their node yet");
    }
    status.billing =
        Some(billing::record(&ctx.settings, &sandbox, &status, k8s_openapi::jiff::Timestamp::now().as_second()));
    status.observed_generation = sandbox.metadata.generation;
    status.conditions = conditions::ready(&current.conditions, &status, sandbox.metadata.generation);
    // The pass that lets go of the node (the reset is complete, the
    // instance is gone, so no worker can hand in another key): every
    // hand-off from that node is sealed before the status says so, or the
    // pass fails and is retried. Later passes know no node to look on.
    if let (Some(attempt), None, Some(node)) = (status.attempt, &status.node_name, current.node_name.as_deref()) {
        crate::output_keys::seal_handoffs(&ctx, &session_id, node, attempt, Lookup::Read).await?;
    }
    if status != current {
        match write_status(&api, &sandbox, &status).await.map(|stored| ctx.wrote(&key, stored)) {
            // Decided from a copy older than the Sandbox now is (someone
            // wrote after the copy this pass acted on, ours or the cache's):
            // decide again on the newer one. Every action above is idempotent.
            Err(Error::Kube(e)) if hangar_runtime::kube_ext::is_conflict(&e) => {
                tracing::debug!("status decided from a stale copy; reconciling again on the apiserver's copy");
                ctx.own_writes.refused(&key);
                ctx.metrics.status_conflicts.inc();
                return Ok(Requeue::requeue(Duration::from_millis(100)));
            }
            other => other?,
        }
        if status.phase == Some(Phase::Ended)
            && let Some(record) = &status.billing
        {
            ctx.metrics.billed(&ns, sandbox.spec.tenant.as_deref(), record);
        }
    }
    // After the write: the figure is "running written", and a write refused
    // as stale is no running at all (the next pass decides again).
    tracking::track_prerequisites(&ctx, (&ns, &name, &session_id), started_ms, &current, &status, &obs.observed);
    let mut seal_again = false;
    if let (Some(attempt), Some(node)) = (status.attempt, status.node_name.as_deref()) {
        // After the status is written (nothing in it waits on this), so
        // its reads are not on the path to `running`. Looked up in the
        // cache: a hand-off's arrival wakes us. Best effort: a failure is
        // tried again shortly (the gateway waits for the sealed key).
        if let Err(e) = crate::output_keys::seal_handoffs(&ctx, &session_id, node, attempt, Lookup::Cached).await {
            warn!(error = %e, "could not seal an output key yet");
            seal_again = true;
        }
    }
    for (reason, note) in &plan.events {
        publish(&ctx, &sandbox, reason, note, EventType::Normal);
    }
    if let Some(f) = status.resume_failed.as_ref().filter(|f| current.resume_failed.as_ref() != Some(*f)) {
        let note = format!(
            "the instance did not start ({}); the session stays paused. To try again: \
             kubectl annotate sbx {name} {}=<new value> --overwrite",
            f.reason,
            hangar_core::session::requests::RETRY_RESUME_ANNOTATION
        );
        publish(&ctx, &sandbox, "ResumeFailed", &note, EventType::Warning);
    }
    if let Some(e) = failure {
        publish(&ctx, &sandbox, "ActionFailed", &e.to_string(), EventType::Warning);
        return Err(e);
    }
    ctx.succeeded(&format!("{ns}/{name}"));
    if matches!(status.phase, Some(Phase::Ended | Phase::Failed)) {
        return after_the_end(&ctx, &api, &sandbox, &status, &session_id).await;
    }
    // Watches wake us as soon as anything changes; the requeue is the
    // level-triggered safety net, tighter while a transition is under way.
    let transitional =
        matches!(status.phase, Some(Phase::Launching | Phase::Pausing | Phase::Resuming | Phase::Stopping));
    let after = match plan.requeue_after {
        Some(d) => d,
        None if transitional => Duration::from_secs(10),
        None => Duration::from_secs(60),
    };
    Ok(Requeue::requeue(if seal_again { after.min(SEAL_AGAIN) } else { after }))
}

/// How soon a hand-off that could not be sealed is tried again.
const SEAL_AGAIN: Duration = Duration::from_secs(2);

/// An ended session: the output's erase deadline goes on its sealed keys
/// before the finalizer goes (so even a deleted Sandbox's output is
/// erased), and the command ledger goes with the finalizer.
async fn after_the_end(
    ctx: &Context,
    api: &Api<Sandbox>,
    sandbox: &Sandbox,
    status: &SandboxStatus,
    session_id: &str,
) -> Result<Requeue> {
    let left = crate::output_retention::enforce(ctx, sandbox, status).await?;
    crate::command_ledger::forget(ctx, session_id).await?;
    // (No Sandbox of this name can follow before the finalizer goes.)
    ctx.numbering.forget(&format!("{}/{}", sandbox.namespace().unwrap_or_default(), sandbox.name_any()));
    finalizer::remove_finalizer(api, sandbox).await?;
    Ok(left.map(|d| Requeue::requeue(d + Duration::from_millis(100))).unwrap_or_else(Requeue::await_change))
}

/// The session's commands: all, not finished, running (or being cancelled).
fn command_counts(ctx: &Context, sandbox: &Sandbox) -> CommandCounts {
    let mut counts = CommandCounts { total: 0, unfinished: 0, running: 0 };
    for c in ctx.commands.state().iter().filter(|c| c.belongs_to(sandbox)) {
        let phase = c.status.as_ref().and_then(|s| s.phase);
        counts.total += 1;
        if !phase.is_some_and(CommandPhase::is_final) {
            counts.unfinished += 1;
        }
        if matches!(phase, Some(CommandPhase::Running | CommandPhase::Cancelling)) {
            counts.running += 1;
        }
    }
    counts
}

/// Records the instance and volume found by tag in the status.
fn adopt(status: &mut SandboxStatus, obs: &observe::Observation) {
    if let Some(i) = obs.instance.as_ref().filter(|i| !i.state.is_gone())
        && status.instance_id.as_deref() != Some(i.id.as_str())
    {
        actions::record_instance(status, i);
    }
    if let Some(v) = &obs.volume {
        status.volume_id = Some(v.id.clone());
    }
    // The node prepared for this session is its node, whether or not the
    // pass that prepared it got to record that (its status write can lose a
    // race and be decided again).
    if obs.observed.node_prepared
        && let Some(node) = obs.node.as_ref().and_then(|n| n.metadata.name.clone())
    {
        status.node_name = Some(node);
    }
}

/// Queues an Event about `sandbox` (written off the pass: `hangar_runtime::events`).
pub(crate) fn publish(ctx: &Context, sandbox: &Sandbox, reason: &str, note: &str, type_: EventType) {
    let ev = Event { type_, reason: reason.into(), note: Some(note.into()), action: reason.into(), secondary: None };
    ctx.events.publish(ev, sandbox.object_ref(&()));
}

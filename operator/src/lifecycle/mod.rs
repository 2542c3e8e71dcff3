//! The Sandbox lifecycle controller. Each reconcile is one pass of a
//! pipeline: dereference (`observe`) → decide (`hangar_core::session::phase_machine::plan`, pure) → apply
//! (`actions`) → update status (server-side apply) → events.

pub mod actions;
pub mod conditions;
pub mod observe;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use hangar_crds::{Command, CommandCounts, CommandPhase, Phase, Sandbox, SandboxStatus, heartbeat};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action as Requeue, Controller};
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Resource, ResourceExt};
use serde_json::json;
use tokio::sync::mpsc;
use tracing::{Instrument, info_span, warn};

use crate::context::Context;
use crate::error::{Error, Result};
use crate::node::labels::{SESSION_LABEL, SESSION_NAMESPACE_LABEL, instance_of_provider_id};
use crate::sandbox_status::write_status;
use actions::Session;
use hangar_core::session::phase_machine as phase;

pub const FINALIZER: &str = "hangar.dev/session";

/// Runs the controller until the process is asked to stop.
pub async fn run(
    ctx: Arc<Context>,
    node_writer: reflector::store::Writer<Node>,
    lease_writer: reflector::store::Writer<Lease>,
    command_writer: reflector::store::Writer<Command>,
    instance_changes: mpsc::Receiver<ObjectRef<Sandbox>>,
) {
    let client = ctx.client.clone();
    let sandboxes: Api<Sandbox> = match ctx.settings.watch_namespaces.as_slice() {
        [one] => Api::namespaced(client.clone(), one),
        _ => Api::all(client.clone()),
    };
    let nodes = reflector(node_writer, watcher(Api::<Node>::all(client.clone()), watcher::Config::default()))
        .default_backoff()
        .applied_objects();
    let leases = reflector(
        lease_writer,
        watcher(Api::<Lease>::namespaced(client.clone(), &ctx.settings.system_namespace), watcher::Config::default()),
    )
    .default_backoff()
    .applied_objects();
    let commands = reflector(command_writer, watcher(Api::<Command>::all(client.clone()), watcher::Config::default()))
        .default_backoff()
        .applied_objects();
    let pods = watcher(
        Api::<Pod>::all(client.clone()),
        watcher::Config::default().labels("app.kubernetes.io/managed-by=hangar"),
    )
    .default_backoff()
    .applied_objects();
    let watched: Vec<String> = ctx.settings.watch_namespaces.clone();
    let serves = move |ns: &str| watched.is_empty() || watched.iter().any(|w| w == ns);
    let (serves2, serves3, serves4) = (serves.clone(), serves.clone(), serves.clone());
    let instances = ctx.instances.clone();
    // Each mapper notes when its event arrived, for the benchmark's
    // "last watch event → running" figure.
    let (m1, m2, m3) = (ctx.clone(), ctx.clone(), ctx.clone());

    Controller::new(sandboxes, watcher::Config::default().any_semantic())
        .watches_stream(pods, move |pod: Pod| {
            let ns = pod.namespace()?;
            let name = pod.labels().get(SESSION_LABEL)?.clone();
            serves3(&ns).then(|| m3.metrics.triggered(&ns, &name)).map(|_| ObjectRef::new(&name).within(&ns))
        })
        .watches_stream(nodes, move |node: Node| {
            let labels = node.labels();
            let target =
                if let (Some(name), Some(ns)) = (labels.get(SESSION_LABEL), labels.get(SESSION_NAMESPACE_LABEL)) {
                    ObjectRef::new(name).within(ns)
                } else {
                    // A node that just registered carries no session labels yet:
                    // map it by its providerID to the instance's Sandbox.
                    let provider_id = node.spec.as_ref()?.provider_id.as_deref()?;
                    instances.sandbox_of_instance(instance_of_provider_id(provider_id)?)?
                };
            let ns = target.namespace.clone()?;
            serves(&ns).then(|| m1.metrics.triggered(&ns, &target.name)).map(|_| target)
        })
        .watches_stream(leases, move |lease: Lease| {
            let (ns, name) = lease.annotations().get(heartbeat::SANDBOX)?.split_once('/')?;
            serves2(ns).then(|| m2.metrics.triggered(ns, name)).map(|_| ObjectRef::new(name).within(ns))
        })
        // A command's status moves its session's counts.
        .watches_stream(commands, move |c: Command| {
            let ns = c.namespace()?;
            serves4(&ns).then(|| ObjectRef::new(&c.spec.sandbox).within(&ns))
        })
        .reconcile_on(receiver_stream(instance_changes))
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|_| futures::future::ready(()))
        .await;
}

/// The instance watcher's change notifications as a stream of Sandboxes.
fn receiver_stream<T: Send + 'static>(rx: mpsc::Receiver<T>) -> impl futures::Stream<Item = T> + Send {
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|v| (v, rx)) })
}

/// A failed reconcile (e.g. a reset step EC2 refused) is retried with
/// exponential backoff per session.
fn error_policy(sandbox: Arc<Sandbox>, error: &Error, ctx: Arc<Context>) -> Requeue {
    ctx.metrics.reconcile_errors.inc();
    let key = format!("{}/{}", sandbox.namespace().unwrap_or_default(), sandbox.name_any());
    let delay = ctx.backoff(&key);
    warn!(sandbox = %sandbox.name_any(), %error, ?delay, "reconcile failed; retrying");
    Requeue::requeue(delay)
}

async fn reconcile(sandbox: Arc<Sandbox>, ctx: Arc<Context>) -> Result<Requeue> {
    let ns = sandbox.namespace().unwrap_or_default();
    let name = sandbox.name_any();
    let span = info_span!("reconcile", namespace = %ns, sandbox = %name, phase = tracing::field::Empty);
    reconcile_inner(sandbox, ctx, ns, name).instrument(span).await
}

async fn reconcile_inner(sandbox: Arc<Sandbox>, ctx: Arc<Context>, ns: String, name: String) -> Result<Requeue> {
    ctx.metrics.reconciles.inc();
    ctx.metrics.watched_instances.set(ctx.instances.len() as i64);
    let session_id = sandbox.uid().ok_or(Error::MissingField("metadata.uid"))?;
    let api: Api<Sandbox> = Api::namespaced(ctx.client.clone(), &ns);
    let current = sandbox.status.clone().unwrap_or_default();
    let terminal = matches!(current.phase, Some(Phase::Ended | Phase::Failed));
    if terminal {
        let left = crate::output_retention::enforce(&ctx, &sandbox, &current).await?;
        remove_finalizer(&api, &sandbox).await?;
        return Ok(left
            .map(|d| Requeue::requeue(d + Duration::from_millis(100)))
            .unwrap_or_else(Requeue::await_change));
    }
    ensure_finalizer(&api, &sandbox).await?;

    let obs = observe::observe(&ctx, &sandbox, &session_id).await?;
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
    if matches!(futures::FutureExt::now_or_never(ctx.commands.wait_until_ready()), Some(Ok(()))) {
        status.commands = Some(command_counts(&ctx, &ns, &name));
    }
    let mut failure = None;
    for action in &plan.actions {
        tracing::debug!(?action, "apply");
        if let Err(e) = actions::execute(&ctx, &session, &obs, action, &mut status).await {
            failure = Some(e);
            break;
        }
    }
    if failure.is_some() && matches!(status.phase, Some(Phase::Stopping)) {
        status.phase = Some(Phase::ResetIncomplete);
    }
    if let Some(attempt) = status.attempt {
        // Best effort here; the next reconcile (heartbeats bring one every
        // few seconds) tries again.
        if let Err(e) = crate::output_keys::seal_handoffs(&ctx, &session_id, attempt).await {
            warn!(error = %e, "could not seal an output key yet");
        }
    }
    track_prerequisites(&ctx, (&ns, &name, &session_id), &current, &status, &obs.observed);
    status.observed_generation = sandbox.metadata.generation;
    status.conditions = conditions::ready(&current.conditions, &status, sandbox.metadata.generation);
    if status != current {
        write_status(&api, &name, &status).await?;
    }
    for (reason, note) in &plan.events {
        publish(&ctx, &sandbox, reason, note, EventType::Normal).await;
    }
    if let Some(e) = failure {
        publish(&ctx, &sandbox, "ActionFailed", &e.to_string(), EventType::Warning).await;
        return Err(e);
    }
    ctx.succeeded(&format!("{ns}/{name}"));
    if matches!(status.phase, Some(Phase::Ended | Phase::Failed)) {
        // The output's erase deadline goes on its key Secret before the
        // finalizer does, so even a deleted Sandbox's output is erased.
        let left = crate::output_retention::enforce(&ctx, &sandbox, &status).await?;
        remove_finalizer(&api, &sandbox).await?;
        return Ok(left
            .map(|d| Requeue::requeue(d + Duration::from_millis(100)))
            .unwrap_or_else(Requeue::await_change));
    }
    // Watches wake us as soon as anything changes; the requeue is the
    // level-triggered safety net, tighter while a transition is under way.
    let transitional =
        matches!(status.phase, Some(Phase::Launching | Phase::Pausing | Phase::Resuming | Phase::Stopping));
    Ok(match plan.requeue_after {
        Some(d) => Requeue::requeue(d),
        None if transitional => Requeue::requeue(Duration::from_secs(10)),
        None => Requeue::requeue(Duration::from_secs(60)),
    })
}

/// For the benchmark: node Ready first seen (this attempt) → running, and
/// the last related watch event → running.
fn track_prerequisites(
    ctx: &Context,
    (namespace, name, session): (&str, &str, &str),
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
            ctx.metrics.event_to_running((now - t).max(0) as u64);
        }
    }
    if matches!(after.phase, Some(Phase::Ended | Phase::Failed)) {
        seen.remove(session);
    }
}

/// The session's commands: all, not finished, running (or being cancelled).
fn command_counts(ctx: &Context, ns: &str, name: &str) -> CommandCounts {
    let mut counts = CommandCounts { total: 0, unfinished: 0, running: 0 };
    for c in ctx.commands.state().iter().filter(|c| c.namespace().as_deref() == Some(ns) && c.spec.sandbox == name) {
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
}

async fn publish(ctx: &Context, sandbox: &Sandbox, reason: &str, note: &str, type_: EventType) {
    let ev = Event { type_, reason: reason.into(), note: Some(note.into()), action: reason.into(), secondary: None };
    if let Err(e) = ctx.recorder.publish(&ev, &sandbox.object_ref(&())).await {
        warn!(error = %e, "could not record event");
    }
}

async fn ensure_finalizer(api: &Api<Sandbox>, sandbox: &Sandbox) -> Result<()> {
    if sandbox.finalizers().iter().any(|f| f == FINALIZER) || sandbox.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let mut finalizers = sandbox.finalizers().to_vec();
    finalizers.push(FINALIZER.to_owned());
    patch_finalizers(api, sandbox, finalizers).await
}

/// Once the reset is complete nothing is left to clean up, so the
/// finalizer goes (and a pending delete completes).
async fn remove_finalizer(api: &Api<Sandbox>, sandbox: &Sandbox) -> Result<()> {
    if !sandbox.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(());
    }
    let finalizers = sandbox.finalizers().iter().filter(|f| *f != FINALIZER).cloned().collect();
    match patch_finalizers(api, sandbox, finalizers).await {
        Err(Error::Kube(kube::Error::Api(e))) if e.code == 404 => Ok(()),
        other => other,
    }
}

/// A JSON patch that tests the finalizers it read before replacing them:
/// safe against another controller's concurrent finalizer edit, and not
/// refused merely because our own status write moved the resourceVersion.
/// When the test fails (our copy was stale), it reads the object again once.
async fn patch_finalizers(api: &Api<Sandbox>, sandbox: &Sandbox, next: Vec<String>) -> Result<()> {
    match try_patch_finalizers(api, sandbox, &next).await {
        Err(kube::Error::Api(e)) if e.code == 422 => {
            let fresh = api.get(&sandbox.name_any()).await?;
            let wanted = next.iter().any(|f| f == FINALIZER);
            let mut list: Vec<String> = fresh.finalizers().iter().filter(|f| *f != FINALIZER).cloned().collect();
            if wanted {
                list.push(FINALIZER.to_owned());
            }
            if list.as_slice() == fresh.finalizers() {
                return Ok(());
            }
            try_patch_finalizers(api, &fresh, &list).await?;
            Ok(())
        }
        other => other.map(|_| ()).map_err(Into::into),
    }
}

async fn try_patch_finalizers(api: &Api<Sandbox>, sandbox: &Sandbox, next: &[String]) -> Result<(), kube::Error> {
    let ops = if sandbox.metadata.finalizers.is_none() {
        json!([{"op": "add", "path": "/metadata/finalizers", "value": next}])
    } else {
        json!([
            {"op": "test", "path": "/metadata/finalizers", "value": sandbox.finalizers()},
            {"op": "replace", "path": "/metadata/finalizers", "value": next},
        ])
    };
    let patch: json_patch::Patch = serde_json::from_value(ops).expect("valid JSON patch");
    api.patch(&sandbox.name_any(), &PatchParams::default(), &Patch::<()>::Json(patch)).await?;
    Ok(())
}

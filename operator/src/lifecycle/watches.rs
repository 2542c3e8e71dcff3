//! The controller's wiring: which watches wake which Sandbox (its agent
//! Pod, its Node, its worker's heartbeat Lease, its Commands, and the EC2
//! instance watcher's changes), and how a failed reconcile is retried.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use hangar_crds::{Command, Sandbox, heartbeat, output_keys};
use hangar_runtime::controllers::{self, lean};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::ResourceExt;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action as Requeue;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use tokio::sync::mpsc;
use tracing::warn;

use super::cached_fields;
use super::heartbeat_wakes::HeartbeatWakes;
use super::reconcile;
use crate::context::Context;
use crate::error::Error;
use crate::node::labels::{BINDING_NAMESPACE_LABEL, BINDING_SESSION_LABEL, SESSION_LABEL, instance_of_provider_id};

/// The writers of the watch caches the Context reads (`ctx.nodes`,
/// `ctx.leases`, `ctx.commands`, `ctx.pods`, `ctx.handoffs`); the
/// controller's watches fill them.
pub struct CacheWriters {
    pub nodes: reflector::store::Writer<Node>,
    pub leases: reflector::store::Writer<Lease>,
    pub commands: reflector::store::Writer<Command>,
    pub pods: reflector::store::Writer<Pod>,
    pub handoffs: reflector::store::Writer<PartialObjectMeta<Secret>>,
}

/// Runs the controller until the process is asked to stop.
pub async fn run(ctx: Arc<Context>, writers: CacheWriters, instance_changes: mpsc::Receiver<ObjectRef<Sandbox>>) {
    let CacheWriters {
        nodes: node_writer,
        leases: lease_writer,
        commands: command_writer,
        pods: pod_writer,
        handoffs: handoff_writer,
    } = writers;
    let client = ctx.client.clone();
    let sandboxes: Api<Sandbox> = match ctx.settings.watch_namespaces.as_slice() {
        [one] => Api::namespaced(client.clone(), one),
        _ => Api::all(client.clone()),
    };
    let nodes = reflector(
        node_writer,
        watcher(Api::<Node>::all(client.clone()), watcher::Config::default()).modify(cached_fields::node),
    )
    .default_backoff()
    .applied_objects();
    // Every renewal reaches the cache; only the ones that can change a
    // decision wake their session (`heartbeat_wakes`).
    let mut wakes = HeartbeatWakes::new(Duration::from_secs(ctx.settings.heartbeat_stale_seconds));
    let lease_cache = ctx.leases.clone();
    let leases = reflector(
        lease_writer,
        watcher(Api::<Lease>::namespaced(client.clone(), &ctx.settings.system_namespace), watcher::Config::default())
            .modify(lean),
    )
    .default_backoff()
    .applied_objects()
    .filter(move |lease| {
        let wake = lease.as_ref().map_or(true, |l| wakes.wakes(l));
        if wakes.len() > 2 * lease_cache.len() + 64 {
            wakes.forget_gone(|ns, name| lease_cache.get(&ObjectRef::new(name).within(ns)).is_some());
        }
        futures::future::ready(wake)
    });
    let feed = ctx.clone();
    let commands = reflector(
        command_writer,
        watcher(Api::<Command>::all(client.clone()), watcher::Config::default()).modify(lean),
    )
    // After the cache has the change: the nodes waiting on their
    // session's commands read it at once.
    .inspect(move |ev| match ev {
        Ok(watcher::Event::Apply(c) | watcher::Event::Delete(c)) => {
            feed.commands_feed.changed(c.metadata.namespace.as_deref().unwrap_or_default(), &c.spec.sandbox);
        }
        // A relist replaces the whole cache at its end.
        Ok(watcher::Event::InitDone) => feed.commands_feed.changed_all(),
        _ => {}
    })
    .default_backoff()
    .applied_objects();
    // Cached: the pass that writes `running` reads the agent Pod from
    // here, not from the apiserver (the Pod's own event woke it, and the
    // reflector stores an event before passing it on).
    let pods = reflector(
        pod_writer,
        watcher(
            Api::<Pod>::all(client.clone()),
            watcher::Config::default().labels("app.kubernetes.io/managed-by=hangar"),
        )
        .modify(cached_fields::agent_pod),
    )
    .default_backoff()
    .applied_objects();
    // Names only (metadata): the hand-offs hold raw output keys, which stay
    // out of the operator's memory until it seals one.
    let handoffs = reflector(
        handoff_writer,
        watcher(
            Api::<PartialObjectMeta<Secret>>::namespaced(client.clone(), &ctx.settings.system_namespace),
            watcher::Config::default().labels(output_keys::ATTEMPT_LABEL),
        )
        .modify(lean),
    )
    .default_backoff()
    .applied_objects();
    let watched: Vec<String> = ctx.settings.watch_namespaces.clone();
    let serves = move |ns: &str| watched.is_empty() || watched.iter().any(|w| w == ns);
    let (serves2, serves3, serves4) = (serves.clone(), serves.clone(), serves.clone());
    let instances = ctx.instances.clone();
    // Each mapper notes when its event arrived, for the benchmark's
    // "last watch event → running" figure (the instance watcher's too).
    let (m1, m2, m3, m4, m5) = (ctx.clone(), ctx.clone(), ctx.clone(), ctx.clone(), ctx.clone());

    let controller = controllers::controller(sandboxes, watcher::Config::default().any_semantic());
    // Command admission reads the Sandboxes from the same cache.
    let _ = ctx.sandboxes.set(controller.store());
    controller
        .watches_stream(pods, move |pod: Pod| {
            let ns = pod.namespace()?;
            let name = pod.labels().get(SESSION_LABEL)?.clone();
            serves3(&ns).then(|| m3.metrics.triggered(&ns, &name)).map(|_| ObjectRef::new(&name).within(&ns))
        })
        .watches_stream(nodes, move |node: Node| {
            let labels = node.labels();
            let target =
                // The binding a kubelet cannot edit, not `hangar.dev/session`.
                if let (Some(name), Some(ns)) = (labels.get(BINDING_SESSION_LABEL), labels.get(BINDING_NAMESPACE_LABEL)) {
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
        // A worker handed in its attempt's output key: seal it now (the
        // gateway waits for the sealed key to read that attempt's output).
        .watches_stream(handoffs, move |handoff: PartialObjectMeta<Secret>| {
            let session_id = handoff.labels().get(output_keys::SESSION_ID_LABEL)?;
            let sandboxes = m4.sandboxes.get()?;
            let sandbox = sandboxes.find(|s| s.metadata.uid.as_ref() == Some(session_id))?;
            Some(ObjectRef::from_obj(&*sandbox))
        })
        // A command's status moves its session's counts.
        .watches_stream(commands, move |c: Command| {
            let ns = c.namespace()?;
            serves4(&ns).then(|| ObjectRef::new(&c.spec.sandbox).within(&ns))
        })
        // The instance watcher's news (EC2 says running, stopped…) is an
        // event like the others: often the last one a launch waits for.
        .reconcile_on(receiver_stream(instance_changes).inspect(move |sandbox: &ObjectRef<Sandbox>| {
            if let Some(ns) = sandbox.namespace.as_deref() {
                m5.metrics.triggered(ns, &sandbox.name);
            }
        }))
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
pub(super) fn error_policy(sandbox: Arc<Sandbox>, error: &Error, ctx: Arc<Context>) -> Requeue {
    ctx.metrics.reconcile_errors.inc();
    let key = format!("{}/{}", sandbox.namespace().unwrap_or_default(), sandbox.name_any());
    let delay = ctx.backoff(&key);
    warn!(sandbox = %sandbox.name_any(), %error, ?delay, "reconcile failed; retrying");
    Requeue::requeue(delay)
}

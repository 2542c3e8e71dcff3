//! Light session nodes for the scale benchmark: for each instance the EC2
//! stub runs, only what the operator observes of a session node, with no
//! worker or supervisor process: a kwok Node carrying the instance's
//! providerID (kwok keeps it Ready and runs the agent Pod bound to it) and
//! the worker's heartbeat Lease (the session's id and attempt, and on a
//! pause the workspace-closed annotations). At 5,000 sessions a process
//! pair per node would measure the machine, not the operator.
//!
//! Like the worker, each attempt's output key is handed in once (a Secret
//! create per attempt); the operator seals it. What this leaves out of the
//! operator's load, next to real workers: the commands feed's long-polls
//! and the workspace-key requests at each boot.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use hangar_crds::{Phase, Sandbox, heartbeat, output_keys};
use k8s_openapi::ByteString;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeSpec, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::{Mutex, mpsc};

use crate::ec2_stub::{Change, InstanceState};

/// The instance's session, from its tags.
#[derive(Clone, Debug)]
struct Session {
    namespace: String,
    sandbox: String,
    session_id: String,
}

impl Session {
    fn of(c: &Change) -> Option<Self> {
        Some(Self {
            namespace: c.tags.get("hangar.dev/namespace")?.clone(),
            sandbox: c.tags.get("hangar.dev/sandbox")?.clone(),
            session_id: c.tags.get("hangar.dev/session-id")?.clone(),
        })
    }
}

/// (namespace, Sandbox) → the node (running instance) writing its
/// heartbeat, and the session.
type Beating = Arc<Mutex<BTreeMap<(String, String), (String, Session)>>>;

/// What a light node writes with: its heartbeat, and its attempts' output
/// keys (each handed in once, as the worker does).
#[derive(Clone)]
struct Writer {
    leases: Api<Lease>,
    secrets: Api<Secret>,
    sandboxes: Store<Sandbox>,
    handed: Arc<std::sync::Mutex<HashSet<String>>>,
    /// What each node's Lease last said (attempt, workspace closed at): a
    /// Sandbox change that leaves it the same writes nothing, and a
    /// renewal while pausing keeps the time the workspace closed.
    written: Arc<std::sync::Mutex<HashMap<String, LeaseSays>>>,
}

/// A Lease's attempt and the time its workspace closed, if it did.
type LeaseSays = (i64, Option<Timestamp>);

/// How many slices the renewals are spread over within each interval, as
/// independent nodes' renewals are; each slice's are sent concurrently.
const RENEW_SLICES: u32 = 10;
const RENEW_CONCURRENCY: usize = 32;

/// A node's slice, stable for its lifetime.
fn slice_of(node: &str) -> u32 {
    node.bytes().fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(b.into())) % RENEW_SLICES
}

pub struct LightNodes {
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl LightNodes {
    /// Follows the stub's instance changes; renews every running node's
    /// Lease every `renew` and on each change of its Sandbox.
    pub async fn start(
        client: kube::Client,
        system_namespace: &str,
        mut changes: mpsc::UnboundedReceiver<Change>,
        renew: Duration,
    ) -> Self {
        let beating: Beating = Arc::default();
        let (sandboxes, writer) = reflector::store::<Sandbox>();
        let leases: Api<Lease> = Api::namespaced(client.clone(), system_namespace);
        let nodes: Api<Node> = Api::all(client.clone());
        let w = Writer {
            leases: leases.clone(),
            secrets: Api::namespaced(client.clone(), system_namespace),
            sandboxes,
            handed: Arc::default(),
            written: Arc::default(),
        };

        // The Sandboxes, for each session's attempt and phase; a change
        // is written to its node's Lease at once (a pause is answered as
        // soon as the worker would close the workspace).
        let (b, wr) = (beating.clone(), w.clone());
        let watch = tokio::spawn(async move {
            let stream = reflector::reflector(writer, watcher(Api::<Sandbox>::all(client), watcher::Config::default()))
                .default_backoff()
                .applied_objects();
            futures::pin_mut!(stream);
            // A watch error is retried by the stream (its backoff); ending
            // here would freeze the Sandbox cache every beat reads.
            while let Some(event) = stream.next().await {
                let sbx = match event {
                    Ok(sbx) => sbx,
                    Err(e) => {
                        tracing::warn!(error = %e, "light nodes: the Sandbox watch failed; retrying");
                        continue;
                    }
                };
                let (ns, name) = (sbx.namespace().unwrap_or_default(), sbx.name_any());
                let node = b.lock().await.get(&(ns, name)).cloned();
                if let Some((node, session)) = node {
                    beat(&wr, &node, &session, Renewal::OnChange).await;
                }
            }
        });

        let (b, wr) = (beating.clone(), w.clone());
        let follow = tokio::spawn(async move {
            while let Some(c) = changes.recv().await {
                let Some(session) = Session::of(&c) else { continue };
                let node = c.instance_id.clone();
                let key = (session.namespace.clone(), session.sandbox.clone());
                match c.state {
                    // Each boot on its own task (instances boot independently);
                    // it is beating from here on.
                    InstanceState::Running => {
                        b.lock().await.insert(key, (node.clone(), session.clone()));
                        let (nodes, wr, zone) = (nodes.clone(), wr.clone(), c.zone.clone());
                        tokio::spawn(async move {
                            ensure_node(&nodes, &node, &zone).await;
                            beat(&wr, &node, &session, Renewal::Always).await;
                        });
                    }
                    // Stopped: the worker is gone; the Node stays (a kubelet's
                    // Node outlives a stop).
                    InstanceState::Stopping | InstanceState::Stopped => {
                        b.lock().await.remove(&key);
                    }
                    InstanceState::ShuttingDown | InstanceState::Terminated => {
                        b.lock().await.remove(&key);
                        wr.written.lock().expect("written").remove(&node);
                        let _ = nodes.delete(&node, &DeleteParams::default()).await;
                        let _ = leases.delete(&heartbeat::lease_name(&node), &DeleteParams::default()).await;
                    }
                    InstanceState::Pending => {}
                }
            }
        });

        let renewing = tokio::spawn(async move {
            let mut every = tokio::time::interval(renew / RENEW_SLICES);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            for slice in (0..RENEW_SLICES).cycle() {
                every.tick().await;
                let due: Vec<(String, Session)> =
                    beating.lock().await.values().filter(|(node, _)| slice_of(node) == slice).cloned().collect();
                futures::stream::iter(due)
                    .for_each_concurrent(RENEW_CONCURRENCY, |(node, session)| {
                        let w = &w;
                        async move { beat(w, &node, &session, Renewal::Always).await }
                    })
                    .await;
            }
        });
        Self { tasks: vec![watch, follow, renewing] }
    }
}

impl Drop for LightNodes {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// A kwok Node for the instance (kwok marks it Ready and runs its Pods).
async fn ensure_node(nodes: &Api<Node>, name: &str, zone: &str) {
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            annotations: Some(BTreeMap::from([(crate::kwok::NODE_ANNOTATION.to_owned(), "fake".to_owned())])),
            labels: Some(BTreeMap::from([
                ("kubernetes.io/arch".to_owned(), "arm64".to_owned()),
                ("type".to_owned(), "kwok".to_owned()),
            ])),
            ..Default::default()
        },
        spec: Some(NodeSpec { provider_id: Some(format!("aws:///{zone}/{name}")), ..Default::default() }),
        ..Default::default()
    };
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => tracing::warn!(node = name, error = %e, "light node: creating the Node"),
    }
}

/// Whether a beat writes a Lease whose content would not change.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Renewal {
    /// A renewal (or a boot's first beat): always written.
    Always,
    /// A Sandbox change: written only when the attempt or the workspace
    /// closed changes, as the worker writes them.
    OnChange,
}

/// Writes the node's heartbeat as the worker would: its session's id and
/// current attempt, and while the session pauses, the workspace closed for
/// that attempt (a light node has no commands to drain).
async fn beat(w: &Writer, node: &str, session: &Session, renewal: Renewal) {
    let Some(sbx) = w.sandboxes.get(&ObjectRef::new(&session.sandbox).within(&session.namespace)) else { return };
    if sbx.uid().as_deref() != Some(session.session_id.as_str()) {
        return;
    }
    let status = sbx.status.clone().unwrap_or_default();
    if matches!(status.phase, Some(Phase::Ended | Phase::Failed | Phase::Stopping | Phase::ResetIncomplete)) {
        return;
    }
    let attempt = status.attempt.unwrap_or(1);
    let (closed_at, before) = {
        let mut written = w.written.lock().expect("written");
        let closed_before = written.get(node).filter(|(a, _)| *a == attempt).and_then(|(_, at)| *at);
        let closed_at = (status.phase == Some(Phase::Pausing)).then(|| closed_before.unwrap_or_else(Timestamp::now));
        (closed_at, written.insert(node.to_owned(), (attempt, closed_at)))
    };
    let closed = closed_at.map(|at| (attempt, at));
    let says = (attempt, closed_at);
    if renewal == Renewal::OnChange && before == Some(says) {
        if status.phase == Some(Phase::Running) {
            hand_in_key(w, node, &session.session_id, attempt).await;
        }
        return;
    }
    let beat = heartbeat::Beat {
        node,
        session_id: &session.session_id,
        namespace: &session.namespace,
        name: &session.sandbox,
        attempt,
        closed,
    };
    let value = heartbeat::lease_apply(&beat);
    let params = PatchParams::apply("hangar-worker").force();
    if let Err(e) = w.leases.patch(&heartbeat::lease_name(node), &params, &Patch::Apply(&value)).await {
        tracing::warn!(node, error = %e, "light node: writing the heartbeat");
    }
    if status.phase == Some(Phase::Running) {
        hand_in_key(w, node, &session.session_id, attempt).await;
    }
}

/// The attempt's output key, handed in once as the worker does when the
/// attempt starts running.
async fn hand_in_key(w: &Writer, node: &str, session_id: &str, attempt: i64) {
    let name = output_keys::handoff_secret_name(node, session_id, attempt);
    if !w.handed.lock().expect("handed").insert(name.clone()) {
        return;
    }
    let key = hangar_output::random_bytes::<32>().expect("random key");
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name),
            labels: Some(BTreeMap::from([
                (output_keys::SESSION_ID_LABEL.to_owned(), session_id.to_owned()),
                (output_keys::ATTEMPT_LABEL.to_owned(), attempt.to_string()),
            ])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(output_keys::HANDOFF_KEY.to_owned(), ByteString(key.to_vec()))])),
        ..Default::default()
    };
    match w.secrets.create(&PostParams::default(), &secret).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => tracing::warn!(node, error = %e, "light node: handing in the output key"),
    }
}

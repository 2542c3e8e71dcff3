//! hangar-worker: one per session node. Finds its session from the node's
//! labels, opens the workspace, heartbeats its node's Lease (which session
//! and attempt it serves), runs the session's Commands through the
//! supervisor (`commands`), and at a pause, once every running command has
//! ended, closes the workspace and reports it on the Lease so the operator
//! can stop the instance.
//!
//! Two identities: its own (the DaemonSet's account, a token bound to its
//! Pod and so to its node) for the node, the heartbeat and the key
//! hand-off; and its node's account (`hangar_crds::worker_identity`),
//! whose token it mints, for the session's Sandbox and Commands — bound in
//! the session's namespace only.

use hangar_worker::{commands, workspace, workspace_key};

use std::process::ExitCode;
use std::time::Duration;

use futures::StreamExt;
use hangar_crds::{Phase, Sandbox, heartbeat};
use hangar_runtime::admin;
use hangar_worker::metrics::WorkerMetrics;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio::sync::watch;

/// In `HANGAR_WORKSPACE_DEVICE`: the session's volume id, dash removed
/// (`/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_{volume}`).
const VOLUME_PLACEHOLDER: &str = "{volume}";

#[derive(Debug, thiserror::Error)]
enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("workspace: {0}")]
    Workspace(#[from] workspace::WorkspaceError),
    #[error("workspace key: {0}")]
    Key(#[from] workspace_key::KeyFetchError),
    #[error("the session's Sandbox has no uid, or no volume yet")]
    NoSessionId,
    #[error("the Sandbox is not the session the node's taint names (a new session of the same name)")]
    NotTheTaintsSession,
    #[error("the apiserver issued no token for the node's account")]
    NoToken,
    #[error("environment variable {0} is not set")]
    Env(&'static str),
    #[error("the watch of node {0} ended before the operator labelled it")]
    NodeWatchEnded(String),
    #[error("output store: {0}")]
    Store(#[from] object_store::Error),
    #[error("admin server: {0}")]
    Admin(#[source] std::io::Error),
}

struct Config {
    node_name: String,
    system_namespace: String,
    workspace: std::path::PathBuf,
    /// The session's volume device (LUKS2 under the session key), where
    /// `{volume}` stands for the volume id without its dash; unset: the
    /// workspace is a plain directory.
    workspace_device: Option<String>,
    /// Without device-mapper, check the key on the device but keep the
    /// files in the directory (the local simulator only).
    workspace_plaintext_fallback: bool,
    renew: Duration,
    /// Node-local disk for the output spool, attempt keys and journal.
    spool: std::path::PathBuf,
    socket: std::path::PathBuf,
    output_store: String,
    output_region: String,
    output_endpoint: Option<String>,
    /// The admin server (/healthz, /readyz, /metrics; plain HTTP, on the
    /// node's loopback by default).
    admin_listen: String,
}

impl Config {
    fn from_env() -> Result<Self, Error> {
        let var = |k: &'static str| std::env::var(k).map_err(|_| Error::Env(k));
        Ok(Self {
            node_name: var("NODE_NAME")?,
            system_namespace: std::env::var("HANGAR_SYSTEM_NAMESPACE").unwrap_or_else(|_| "hangar-system".into()),
            workspace: std::env::var("HANGAR_WORKSPACE_DIR")
                .unwrap_or_else(|_| "/var/lib/hangar/workspace".into())
                .into(),
            workspace_device: std::env::var("HANGAR_WORKSPACE_DEVICE").ok(),
            workspace_plaintext_fallback: std::env::var("HANGAR_WORKSPACE_PLAINTEXT_FALLBACK").is_ok_and(|v| v == "1"),
            renew: Duration::from_millis(
                std::env::var("HANGAR_HEARTBEAT_MS")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(heartbeat::RENEW_SECONDS * 1000),
            ),
            spool: std::env::var("HANGAR_SPOOL_DIR").unwrap_or_else(|_| "/var/lib/hangar/spool".into()).into(),
            socket: std::env::var("HANGAR_SUPERVISOR_SOCKET")
                .unwrap_or_else(|_| "/var/run/hangar/supervisor.sock".into())
                .into(),
            output_store: std::env::var("HANGAR_OUTPUT_STORE").unwrap_or_else(|_| "/var/lib/hangar/output".into()),
            output_region: std::env::var("HANGAR_OUTPUT_S3_REGION").unwrap_or_else(|_| "us-east-1".into()),
            output_endpoint: std::env::var("HANGAR_OUTPUT_S3_ENDPOINT").ok(),
            admin_listen: std::env::var("HANGAR_WORKER_ADMIN_LISTEN").unwrap_or_else(|_| "127.0.0.1:9091".into()),
        })
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    if std::env::args().nth(1).as_deref() == Some("--version") {
        println!("hangar-worker {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    hangar_runtime::telemetry::init();
    let result = async {
        let config = Config::from_env()?;
        let base = kube::Config::infer().await.map_err(kube::Error::InferConfig)?;
        run(base, config).await
    };
    match result.await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "worker stopped");
            ExitCode::FAILURE
        }
    }
}

/// Waits until the operator has labelled this node for a session.
/// Waits until the operator has labelled this node for a session: the
/// session's namespace and name, and the node's uid.
/// The session the operator bound this node to, from where its kubelet
/// cannot write (`hangar_crds::worker_identity`): the restricted labels
/// give its namespace and name, the taint its id. Returns (namespace,
/// name, session id, the Node's uid).
async fn session_of_node(client: &Client, node_name: &str) -> Result<(String, String, String, String), Error> {
    use hangar_crds::worker_identity::{BINDING_NAMESPACE_LABEL, BINDING_SESSION_LABEL, SESSION_TAINT};
    let nodes: Api<Node> = Api::all(client.clone());
    let cfg = watcher::Config::default().fields(&format!("metadata.name={node_name}"));
    let mut stream = watcher(nodes, cfg).default_backoff().applied_objects().boxed();
    while let Some(node) = stream.next().await {
        let Ok(node) = node else { continue };
        let labels = node.labels();
        let taint = node.spec.as_ref().and_then(|s| s.taints.as_ref()).and_then(|t| {
            t.iter().find(|t| t.key == SESSION_TAINT && t.effect == "NoSchedule").and_then(|t| t.value.clone())
        });
        if let (Some(name), Some(ns), Some(session_id)) =
            (labels.get(BINDING_SESSION_LABEL), labels.get(BINDING_NAMESPACE_LABEL), taint)
        {
            return Ok((ns.clone(), name.clone(), session_id, node.uid().unwrap_or_default()));
        }
    }
    Err(Error::NodeWatchEnded(node_name.to_owned()))
}

/// How long the node's account token lasts: longer than a session can run
/// without a restart of its node (a pause restarts the worker, which mints
/// a fresh one; `stopAfterSeconds` is at most 7 days).
const SESSION_TOKEN_SECONDS: i64 = 8 * 24 * 3600;

/// A client as the node's account, with a token minted for it and bound to
/// the node (so it names the node, and dies with it); and the token, which
/// the operator's node service also takes. The operator makes
/// the account before it labels the node, so it exists by now; an
/// apiserver not answering is tried again.
async fn session_client(
    base: &kube::Config,
    client: &Client,
    config: &Config,
    node_uid: &str,
) -> Result<(Client, String), Error> {
    use k8s_openapi::api::authentication::v1::TokenRequest;
    use k8s_openapi::api::core::v1::ServiceAccount;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &config.system_namespace);
    let account = hangar_crds::worker_identity::account_name(&config.node_name);
    let request: TokenRequest = serde_json::from_value(json!({"spec": {
        "expirationSeconds": SESSION_TOKEN_SECONDS,
        "boundObjectRef": {"apiVersion": "v1", "kind": "Node", "name": config.node_name, "uid": node_uid},
    }}))
    .expect("a TokenRequest");
    let token = hangar_runtime::retry::until_ok("mint the node account's token", || async {
        let issued = accounts.create_token_request(&account, &Default::default(), &request).await?;
        issued.status.and_then(|s| s.token).ok_or(Error::NoToken)
    })
    .await;
    let mut session = base.clone();
    session.auth_info =
        kube::config::AuthInfo { token: Some(token.clone().into_boxed_str().into()), ..Default::default() };
    Ok((Client::try_from(session)?, token))
}

async fn run(base: kube::Config, config: Config) -> Result<(), Error> {
    let client = Client::try_from(base.clone())?;
    let metrics = WorkerMetrics::default();
    let mut registry = Registry::with_prefix("hangar_worker");
    metrics.register(&mut registry);
    let admin_listen = config
        .admin_listen
        .parse()
        .map_err(|_| Error::Admin(std::io::Error::other(format!("not an address: {}", config.admin_listen))))?;
    let readiness = admin::start_on_loopback(admin_listen, registry, Default::default()).await.map_err(Error::Admin)?;
    let (ns, name, bound_id, node_uid) = session_of_node(&client, &config.node_name).await?;
    tracing::info!(node = %config.node_name, %ns, sandbox = %name, session_id = %bound_id, "serving session");
    let (session, session_token) = session_client(&base, &client, &config, &node_uid).await?;
    readiness.set_ready();
    let sandboxes: Api<Sandbox> = Api::namespaced(session.clone(), &ns);
    let leases: Api<Lease> = Api::namespaced(client.clone(), &config.system_namespace);
    // The workspace opens under the session's key, which only this
    // instance, proven by its identity document, is given.
    let device_by_volume = config.workspace_device.as_ref().is_some_and(|d| d.contains(VOLUME_PLACEHOLDER));
    let (session_id, volume_id) = hangar_runtime::retry::until_ok("read the session's Sandbox", || async {
        let s = sandboxes.get(&name).await?;
        let volume = s.status.as_ref().and_then(|st| st.volume_id.clone());
        match (s.metadata.uid, volume) {
            (Some(uid), _) if uid != bound_id => Err(Error::NotTheTaintsSession),
            (Some(uid), volume) if volume.is_some() || !device_by_volume => Ok((uid, volume)),
            _ => Err(Error::NoSessionId),
        }
    })
    .await;
    let keys = workspace_key::KeySource::from_env()?;
    let feed = commands::feed::CommandsFeed::new(keys.node_service(), session_token, &ns, &name);
    let session_ref = workspace_key::SessionRef { namespace: &ns, sandbox: &name, session_id: &session_id };
    let key = keys.fetch_until_granted(&session_ref).await;
    let backing = workspace::Backing {
        device: config.workspace_device.as_deref().map(|d| {
            // An EBS volume's NVMe device is named by its id, dash removed.
            d.replace(VOLUME_PLACEHOLDER, &volume_id.as_deref().unwrap_or_default().replace('-', "")).into()
        }),
        plaintext_fallback: config.workspace_plaintext_fallback,
    };
    let ws = workspace::Workspace::open(&config.workspace, &backing, &key)?;
    drop(key);
    tracing::info!(session_id, "workspace open");
    let store = hangar_output::OutputStore::from_url(
        &config.output_store,
        &config.output_region,
        config.output_endpoint.as_deref(),
    )?;

    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut updates = watcher(sandboxes, cfg).default_backoff().applied_objects().boxed();
    let mut tick = tokio::time::interval(config.renew);
    let mut latest: Option<Sandbox> = None;
    let mut closed: Option<(i64, Timestamp)> = None;
    let (state_tx, state_rx) = watch::channel(commands::SessionState::default());
    let (drained_tx, mut drained_rx) = watch::channel(None);
    let mut runner_started = false;
    let mut handed_deadline: Option<Option<i64>> = None;
    // What the Lease last said (session, attempt, workspace closed), and
    // whether a renewal is due: the Lease is written on each tick and
    // whenever what it says changes, not on every Sandbox event (each of
    // the operator's status writes would come back as a Lease write).
    let mut reported: Option<Reported> = None;
    let mut renewal_due = true;
    loop {
        tokio::select! {
            next = updates.next() => match next {
                Some(Ok(s)) => latest = Some(s),
                Some(Err(e)) => { tracing::warn!(error = %e, "sandbox watch"); continue }
                None => return Ok(()),
            },
            _ = drained_rx.changed() => {}
            _ = tick.tick() => renewal_due = true,
        }
        let Some(sandbox) = latest.as_ref() else { continue };
        let Some(session_id) = sandbox.uid() else { continue };
        let status = sandbox.status.clone().unwrap_or_default();
        let attempt = status.attempt.unwrap_or(1);
        state_tx.send_if_modified(|s| {
            let next = commands::SessionState { phase: status.phase, attempt };
            let changed = *s != next;
            *s = next;
            changed
        });
        if !runner_started {
            let rc = commands::RunnerConfig {
                namespace: ns.clone(),
                sandbox: name.clone(),
                session_id: session_id.clone(),
                node_name: config.node_name.clone(),
                system_namespace: config.system_namespace.clone(),
                spool_root: config.spool.clone(),
                store: store.clone(),
                socket: config.socket.clone(),
                metrics: metrics.clone(),
            };
            let (runner, incoming) =
                commands::Runner::new(session.clone(), feed.clone(), client.clone(), rc, drained_tx.clone());
            tokio::spawn(runner.run(incoming, state_rx.clone()));
            runner_started = true;
        }
        let deadline = status.hard_stop_at.as_ref().map(|t| t.0.as_second());
        if handed_deadline != Some(deadline) {
            match hangar_worker::hard_stop::hand_to_node(&config.spool, deadline) {
                Ok(()) => handed_deadline = Some(deadline),
                Err(e) => tracing::warn!(error = %e, "could not hand the hard-stop deadline to the node; trying again"),
            }
        }
        if matches!(status.phase, Some(Phase::Ended | Phase::Failed | Phase::Stopping | Phase::ResetIncomplete)) {
            continue;
        }
        // A pause: once every running command has ended (killed_at_pause)
        // and its output is stored, close the workspace once and report it.
        let drained = *drained_rx.borrow_and_update() == Some(attempt);
        if status.phase == Some(Phase::Pausing) && drained && closed.map(|c| c.0) != Some(attempt) {
            ws.close()?;
            closed = Some((attempt, Timestamp::now()));
            tracing::info!(attempt, "workspace closed for the pause");
        }
        let report = (session_id.clone(), attempt, closed);
        if !renewal_due && reported.as_ref() == Some(&report) {
            continue;
        }
        // An apiserver that does not answer now is tried again next tick;
        // it is no reason to stop serving the session.
        match renew(&leases, &config.node_name, &session_id, &ns, &name, attempt, closed).await {
            Ok(()) => (reported, renewal_due) = (Some(report), false),
            Err(e) => {
                tracing::warn!(error = %e, "heartbeat not renewed; trying again");
                metrics.heartbeat_failed();
            }
        }
    }
}

/// What a heartbeat says besides its time: the session, the attempt, and
/// the attempt whose workspace closed (and when).
type Reported = (String, i64, Option<(i64, Timestamp)>);

async fn renew(
    leases: &Api<Lease>,
    node: &str,
    session_id: &str,
    ns: &str,
    name: &str,
    attempt: i64,
    closed: Option<(i64, Timestamp)>,
) -> Result<(), Error> {
    let patch = heartbeat::lease_apply(&heartbeat::Beat { node, session_id, namespace: ns, name, attempt, closed });
    leases
        .patch(&heartbeat::lease_name(node), &PatchParams::apply("hangar-worker").force(), &Patch::Apply(&patch))
        .await?;
    Ok(())
}

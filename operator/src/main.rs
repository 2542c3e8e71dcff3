//! hangar-operator: leader-elected; runs the Sandbox lifecycle controller,
//! the batched EC2 instance watcher and the orphan sweep.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use hangar_crds::output_keys;
use hangar_operator::context::Context;
use hangar_operator::ec2::watcher::InstanceWatcher;
use hangar_operator::ec2::{Ec2, Ec2Settings, interruption_queue};
use hangar_operator::keys::OrgKey;
use hangar_operator::lifecycle;
use hangar_operator::metrics::Metrics;
use hangar_operator::settings::Settings;
use hangar_runtime::admin;
use hangar_runtime::leader::{Leadership, LeaseSettings};
use hangar_runtime::retry::until_ok;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector;
use prometheus_client::registry::Registry;

/// Events waiting to be written; past this a burst drops them (they are
/// advisory; the status is the record).
const EVENTS_QUEUED: usize = 4096;

#[tokio::main]
async fn main() -> ExitCode {
    hangar_runtime::memory::cap_allocator_arenas();
    hangar_runtime::memory::trim_free_memory_periodically();
    let settings = Arc::new(Settings::parse());
    if settings.print_settings {
        println!("{settings:#?}");
        return ExitCode::SUCCESS;
    }
    hangar_runtime::telemetry::init();
    match run(settings).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "hangar-operator stopped");
            ExitCode::FAILURE
        }
    }
}

async fn run(settings: Arc<Settings>) -> Result<(), Box<dyn std::error::Error>> {
    let client = kube::Client::try_default().await?;
    let ec2 = Ec2::new(Ec2Settings {
        region: settings.aws_region.clone(),
        endpoint: settings.ec2_endpoint.clone(),
        cluster_name: settings.cluster_name.clone(),
        ami_id: settings.ami_id.clone(),
        security_groups: settings.security_groups.clone(),
        instance_profile: settings.instance_profile.clone(),
        volume_gib: settings.volume_gib,
        placements: settings.placements(),
    })
    .await;
    let metrics = Arc::new(Metrics::default());
    let recorder = Recorder::new(
        client.clone(),
        Reporter { controller: "hangar-operator".into(), instance: Some(settings.pod_name.clone()) },
    );
    let events = hangar_runtime::events::EventQueue::start(recorder, EVENTS_QUEUED);
    let mut registry = Registry::with_prefix("hangar");
    metrics.register(&mut registry, &ec2.calls);
    registry.register("events_dropped", "Events dropped because too many waited to be written", events.dropped());
    let samples = metrics.clone();
    let debug = if settings.debug_samples {
        axum::Router::new().route(
            "/debug/samples",
            axum::routing::get(move || {
                let samples = samples.samples();
                async move { axum::Json(samples) }
            }),
        )
    } else {
        axum::Router::new()
    };
    let readiness = admin::start_health(settings.admin_listen.as_str()).await?;
    admin::start_metrics(&settings.metrics, client.clone(), registry, debug).await?;

    let mut election = None;
    if settings.leader_elect {
        let lease = LeaseSettings {
            namespace: settings.leader_election_namespace.clone(),
            name: "hangar-operator-leader".into(),
            identity: settings.pod_name.clone(),
            duration: Duration::from_secs(settings.lease_duration_seconds),
            renew_before: Duration::from_secs(
                settings.lease_duration_seconds.saturating_sub(settings.renew_deadline_seconds),
            ),
        };
        let mut leadership = until_ok("join the leader election", || Leadership::join(client.clone(), &lease)).await;
        leadership.acquired().await;
        election = Some(leadership);
    }

    // Dependencies that are not answering yet (the apiserver, EC2) are
    // waited for, never a reason to exit: /readyz says 503 meanwhile.
    let org_key = until_ok("load the organisation key", || load_org_key(&client, &settings)).await;
    let output_kek = until_ok("load the output key-encryption key", || {
        load_or_make_key(&client, &settings, output_keys::OUTPUT_KEK_SECRET, "the output key-encryption key")
    })
    .await;
    let output_store = hangar_output::OutputStore::from_url(
        &settings.output_store,
        &settings.output_s3_region,
        settings.output_s3_endpoint.as_deref(),
    )?;
    let instances = InstanceWatcher::default();
    // The first view of EC2 before any reconcile: a session must never be
    // judged "no instance" just because nothing has been described yet.
    for i in until_ok("describe the cluster's instances", || ec2.describe_cluster_instances()).await {
        instances.observe(i);
    }
    let (changes_tx, changes_rx) = tokio::sync::mpsc::channel(1024);
    if let Some(queue_url) = settings.interruption_queue_url.clone() {
        let sqs = interruption_queue::client(&settings.aws_region, settings.sqs_endpoint.as_deref()).await;
        tokio::spawn(interruption_queue::run(sqs, queue_url, instances.clone(), changes_tx.clone()));
    }
    tokio::spawn(instances.clone().run(ec2.clone(), settings.describe_interval(), changes_tx.clone()));

    let registries = hangar_operator::images::registry::Registries::new(&settings.registry_endpoints)?;
    let trusted_keys = hangar_keys::template_signing::TrustedKeys::from_pairs(&settings.template_keys)?;
    let preflights = hangar_operator::images::preflights::Preflights::new(
        registries,
        client.clone(),
        settings.registry_credentials_secret.clone().map(|name| (settings.system_namespace.clone(), name)),
        changes_tx.clone(),
        metrics.image_preflight_checks.clone(),
    );
    let (nodes, node_writer) = reflector::store();
    let (leases, lease_writer) = reflector::store();
    let (commands, command_writer) = reflector::store();
    let (pods, pod_writer) = reflector::store();
    let (handoffs, handoff_writer) = reflector::store();
    let ctx = Arc::new(Context {
        client: client.clone(),
        settings: settings.clone(),
        ec2: ec2.clone(),
        instances,
        nodes,
        leases,
        commands,
        pods,
        handoffs,
        org_key,
        output_kek,
        output_store,
        events,
        metrics,
        failures: Default::default(),
        numbering: Default::default(),
        sealed_output_keys: Default::default(),
        own_writes: Default::default(),
        tokens: Default::default(),
        preflights,
        trusted_keys,
        commands_feed: Default::default(),
        sandboxes: Default::default(),
        leading_since: k8s_openapi::jiff::Timestamp::now().as_second(),
    });
    if let Some(listen) = &settings.workspace_key_listen {
        let missing = |what: &str| format!("--workspace-key-listen needs {what}");
        let cert = settings.workspace_key_tls_cert.as_ref().ok_or_else(|| missing("--workspace-key-tls-cert"))?;
        let key = settings.workspace_key_tls_key.as_ref().ok_or_else(|| missing("--workspace-key-tls-key"))?;
        let regional = settings
            .instance_identity_certificate
            .as_ref()
            .ok_or_else(|| missing("--instance-identity-certificate"))?;
        let regional =
            hangar_keys::instance_identity::RegionalCertificate::from_pem(&std::fs::read_to_string(regional)?)?;
        let tls = hangar_runtime::https::server_config(cert, key)?;
        let listener = tokio::net::TcpListener::bind(listen).await?;
        tracing::info!(addr = %listener.local_addr()?, "workspace key service serving");
        let service = hangar_operator::workspace_keys::KeyService::new(ctx.clone(), regional);
        tokio::spawn(service.serve(listener, tls));
    }
    readiness.set_ready();
    tokio::spawn(sweep_loop(
        ec2,
        client,
        settings.system_namespace.clone(),
        Duration::from_secs(settings.orphan_sweep_seconds),
        // A gone Sandbox's own retention is gone with it: the default.
        Duration::from_secs(
            settings.retention_day_seconds * hangar_crds::sandbox::DEFAULT_OUTPUT_RETENTION_DAYS.unsigned_abs(),
        ),
    ));

    let commands = tokio::spawn(hangar_operator::commands::run(ctx.clone()));
    let session_tokens = tokio::spawn(hangar_operator::tokens::run(ctx.clone()));
    let templates = tokio::spawn(hangar_operator::templates::run(ctx.clone()));
    let writers = lifecycle::CacheWriters {
        nodes: node_writer,
        leases: lease_writer,
        commands: command_writer,
        pods: pod_writer,
        handoffs: handoff_writer,
    };
    let sessions = lifecycle::run(ctx, writers, changes_rx);
    let controller = async move {
        sessions.await;
        commands.abort();
        session_tokens.abort();
        templates.abort();
    };
    match election {
        Some(mut leadership) => {
            tokio::select! {
                _ = controller => leadership.release().await,
                _ = leadership.lost() => return Err("lost leadership".into()),
            }
        }
        None => controller.await,
    }
    Ok(())
}

async fn sweep_loop(
    ec2: Ec2,
    client: kube::Client,
    system_namespace: String,
    every: Duration,
    default_retention: Duration,
) {
    loop {
        tokio::time::sleep(every).await;
        match hangar_operator::output_retention::sweep(&client, &system_namespace).await {
            Ok(erased) if erased.is_empty() => {}
            Ok(erased) => tracing::info!(?erased, "output retention sweep"),
            Err(e) => tracing::warn!(error = %e, "output retention sweep failed"),
        }
        match hangar_operator::orphan_sweep::sweep(&ec2, &client).await {
            Ok(s) if s.instances.is_empty() && s.volumes.is_empty() => {}
            Ok(s) => tracing::info!(instances = ?s.instances, volumes = ?s.volumes, "orphan sweep"),
            Err(e) => tracing::warn!(error = %e, "orphan sweep failed"),
        }
        match hangar_operator::orphan_sweep::sweep_keys(&client, &system_namespace, default_retention).await {
            Ok(keys) if keys.is_empty() => {}
            Ok(keys) => tracing::info!(?keys, "orphan sweep of keys and ledgers"),
            Err(e) => tracing::warn!(error = %e, "orphan sweep of keys failed"),
        }
    }
}

/// The organisation key: from a file when configured, else a Secret in the
/// operator's namespace (created once with a random key).
async fn load_org_key(client: &kube::Client, settings: &Settings) -> Result<OrgKey, Box<dyn std::error::Error>> {
    use base64::Engine;
    if let Some(path) = &settings.org_key_file {
        let text = std::fs::read_to_string(path)?;
        let bytes = base64::engine::general_purpose::STANDARD.decode(text.trim())?;
        return Ok(OrgKey::from_bytes(&bytes)?);
    }
    load_or_make_key(client, settings, output_keys::ORG_KEY_SECRET, "the organisation key").await
}

/// A key-encryption key kept in Secret `name` in the operator's namespace,
/// made once with random bytes (create-if-absent: replicas agree on one).
async fn load_or_make_key(
    client: &kube::Client,
    settings: &Settings,
    name: &str,
    what: &str,
) -> Result<OrgKey, Box<dyn std::error::Error>> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &settings.system_namespace);
    if secrets.get_opt(name).await?.is_none() {
        let key = OrgKey::generate_bytes()?;
        let secret = Secret {
            metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
            data: Some(BTreeMap::from([("key".to_owned(), ByteString(key.to_vec()))])),
            immutable: Some(true),
            ..Default::default()
        };
        if hangar_runtime::kube_ext::ignore_already_exists(secrets.create(&PostParams::default(), &secret).await)?
            .is_some()
        {
            tracing::info!(secret = name, "generated {what} ({} bytes, not logged)", key.len());
        }
    }
    let secret = secrets.get(name).await?;
    let bytes = secret.data.and_then(|d| d.get("key").cloned()).ok_or_else(|| format!("{name} has no key"))?;
    Ok(OrgKey::from_bytes(&bytes.0)?)
}

//! hangar-gateway: the HTTPS session API (ARCHITECTURE §5).

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use hangar_crds::output_keys;
use hangar_gateway::auth::Auth;
use hangar_gateway::index::Index;
use hangar_gateway::output::OutputReader;
use hangar_gateway::replay::{Members, ReplayGuard};
use hangar_gateway::routes::{self, Gateway};
use hangar_output::{OrgKey, OutputStore};
use hangar_runtime::admin;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::Api;

#[derive(Parser, Debug)]
#[command(version, about = "hangar session API gateway")]
struct Settings {
    #[arg(long, env = "HANGAR_GATEWAY_LISTEN", default_value = "0.0.0.0:8443")]
    listen: SocketAddr,
    #[arg(long, env = "HANGAR_GATEWAY_TLS_CERT", default_value = "/etc/hangar/gateway-tls/tls.crt")]
    tls_cert: PathBuf,
    #[arg(long, env = "HANGAR_GATEWAY_TLS_KEY", default_value = "/etc/hangar/gateway-tls/tls.key")]
    tls_key: PathBuf,
    /// Where the operator keeps keys (its own namespace).
    #[arg(long, env = "HANGAR_SYSTEM_NAMESPACE", default_value = "hangar-system")]
    system_namespace: String,
    /// Output store: a directory, `file:///dir` or `s3://bucket`.
    #[arg(long, env = "HANGAR_OUTPUT_STORE", default_value = "/var/lib/hangar/output")]
    output_store: String,
    #[arg(long, env = "HANGAR_OUTPUT_S3_REGION", default_value = "us-east-1")]
    output_s3_region: String,
    #[arg(long, env = "HANGAR_OUTPUT_S3_ENDPOINT")]
    output_s3_endpoint: Option<String>,
    /// How long an output read waits for new bytes.
    #[arg(long, env = "HANGAR_GATEWAY_LONG_POLL_SECONDS", default_value_t = 25)]
    long_poll_seconds: u64,
    /// Output reads waiting at once, in all and per caller.
    #[arg(long, env = "HANGAR_GATEWAY_MAX_LONG_POLLS", default_value_t = 4096)]
    max_long_polls: usize,
    #[arg(long, env = "HANGAR_GATEWAY_MAX_LONG_POLLS_PER_CALLER", default_value_t = 64)]
    max_long_polls_per_caller: usize,
    /// The audience a member's token must be minted for (`kubectl create
    /// token … --audience`); empty: the apiserver's own audiences.
    #[arg(long, env = "HANGAR_GATEWAY_TOKEN_AUDIENCE", default_value = "hangar-gateway")]
    token_audience: String,
    /// Requests per second one caller may make, and its burst.
    #[arg(long, env = "HANGAR_GATEWAY_CALLER_RATE", default_value_t = NonZeroU32::new(50).expect("non-zero"))]
    caller_rate: NonZeroU32,
    #[arg(long, env = "HANGAR_GATEWAY_CALLER_BURST", default_value_t = NonZeroU32::new(100).expect("non-zero"))]
    caller_burst: NonZeroU32,
    /// TokenReviews per second of tokens not seen before, all callers together.
    #[arg(long, env = "HANGAR_GATEWAY_TOKEN_REVIEW_RATE", default_value_t = NonZeroU32::new(100).expect("non-zero"))]
    token_review_rate: NonZeroU32,
    /// Groups of a member the gateway passes on when it acts as them
    /// (comma-separated; others are dropped).
    #[arg(long, env = "HANGAR_GATEWAY_IMPERSONATE_GROUPS", value_delimiter = ',', default_value = "")]
    impersonate_groups: Vec<String>,
    /// The public base URL (https://host[:port]) session-token proofs name
    /// in `htu`; empty: the request's own Host.
    #[arg(long, env = "HANGAR_GATEWAY_PUBLIC_URL", default_value = "")]
    public_url: String,
    /// The peer port (plain HTTP, HMAC-authenticated): where replicas ask
    /// each other whether a proof's jti was seen. Unset: this replica alone.
    #[arg(long, env = "HANGAR_GATEWAY_PEER_LISTEN")]
    peer_listen: Option<SocketAddr>,
    /// This replica's peer address as the members list it (host:port).
    #[arg(long, env = "HANGAR_GATEWAY_PEER_SELF", default_value = "")]
    peer_self: String,
    /// The members, fixed (comma-separated host:port, this one included) ...
    #[arg(long, env = "HANGAR_GATEWAY_PEERS", value_delimiter = ',', default_value = "")]
    peers: Vec<String>,
    /// ... or a DNS name:port resolving to every replica (a headless Service).
    #[arg(long, env = "HANGAR_GATEWAY_PEER_DNS", default_value = "")]
    peer_dns: String,
    /// Address of the health server (/healthz, /readyz; plain HTTP).
    #[arg(long, env = "HANGAR_GATEWAY_ADMIN_LISTEN", default_value = "0.0.0.0:9090")]
    admin_listen: SocketAddr,
    #[command(flatten)]
    metrics: admin::MetricsArgs,
}

#[tokio::main]
async fn main() -> ExitCode {
    hangar_runtime::telemetry::init();
    match run(Settings::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "hangar-gateway stopped");
            ExitCode::FAILURE
        }
    }
}

async fn run(settings: Settings) -> Result<(), Box<dyn std::error::Error>> {
    let client = kube::Client::try_default().await?;
    let http = hangar_runtime::admin::HttpMetrics::default();
    let mut registry = prometheus_client::registry::Registry::with_prefix("hangar_gateway");
    http.register(&mut registry);
    let limits = hangar_gateway::auth::Limits {
        per_caller: settings.caller_rate,
        per_caller_burst: settings.caller_burst,
        token_reviews: settings.token_review_rate,
    };
    let audience = Some(settings.token_audience.clone()).filter(|a| !a.is_empty());
    let auth = Auth::new(client.clone(), audience, limits);
    registry.register("token_reviews", "TokenReviews sent to the apiserver", auth.token_reviews());
    let readiness = admin::start_health(settings.admin_listen).await?;
    admin::start_metrics(&settings.metrics, client.clone(), registry, Default::default()).await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &settings.system_namespace);
    let kek_bytes = output_kek(&secrets).await?;
    let kek = OrgKey::from_bytes(&kek_bytes)?;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &settings.system_namespace);
    let store = OutputStore::from_url(
        &settings.output_store,
        &settings.output_s3_region,
        settings.output_s3_endpoint.as_deref(),
    )?;
    let index = Index::start(client.clone()).await?;
    let replay = match settings.peer_listen {
        None => Arc::new(ReplayGuard::alone()),
        Some(addr) => {
            let members = match settings.peers.iter().filter(|p| !p.is_empty()).cloned().collect::<Vec<_>>() {
                fixed if !fixed.is_empty() => Members::Fixed(fixed),
                _ => Members::Dns(settings.peer_dns.clone()),
            };
            let guard = Arc::new(ReplayGuard::with_peers(settings.peer_self.clone(), members, &kek_bytes));
            let listener = tokio::net::TcpListener::bind(addr).await?;
            tracing::info!(addr = %listener.local_addr()?, "peer port serving");
            let router = hangar_gateway::replay::peer_router(guard.clone());
            tokio::spawn(async move { axum::serve(listener, router).await });
            guard
        }
    };
    let tokens = hangar_gateway::session_tokens::SessionTokens::start(client.clone(), replay).await?;
    let gw = Arc::new(Gateway {
        auth,
        index,
        tokens,
        impersonable_groups: settings.impersonate_groups.iter().filter(|g| !g.is_empty()).cloned().collect(),
        public_url: Some(settings.public_url.clone()).filter(|u| !u.is_empty()),
        output: OutputReader::new(store, maps, kek),
        long_poll: Duration::from_secs(settings.long_poll_seconds),
        client,
        http,
        long_polls: hangar_gateway::output::LongPolls::new(settings.max_long_polls, settings.max_long_polls_per_caller),
    });
    let config = hangar_runtime::https::server_config(&settings.tls_cert, &settings.tls_key)?;
    let listener = tokio::net::TcpListener::bind(settings.listen).await?;
    tracing::info!(addr = %listener.local_addr()?, "gateway serving");
    readiness.set_ready();
    let limits = hangar_runtime::https::Limits::default();
    let shutdown = hangar_runtime::https::shutdown_signal();
    let router = routes::router(gw.clone());
    hangar_runtime::https::serve(listener, config, limits, shutdown, move |req| {
        routes::handle(gw.clone(), router.clone(), req)
    })
    .await;
    Ok(())
}

/// The output key-encryption key, which the operator creates: wait for
/// it. (The only Secret the gateway may read.)
async fn output_kek(secrets: &Api<Secret>) -> Result<zeroize::Zeroizing<Vec<u8>>, Box<dyn std::error::Error>> {
    let name = output_keys::OUTPUT_KEK_SECRET;
    loop {
        match secrets.get_opt(name).await {
            Ok(Some(s)) => {
                let bytes =
                    s.data.and_then(|d| d.get("key").cloned()).ok_or("the output key-encryption key is empty")?;
                return Ok(zeroize::Zeroizing::new(bytes.0));
            }
            Ok(None) => tracing::info!("waiting for the operator to create the output key-encryption key"),
            Err(e) => tracing::warn!(error = %e, "could not read the output key-encryption key yet; not serving"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

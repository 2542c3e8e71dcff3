//! The admin servers every binary runs.
//!
//! - Health, on a plain-HTTP port of its own (nothing on it carries data or
//!   credentials; kubelet probes it): `/healthz` (the process is alive) and
//!   `/readyz` (its dependencies answered and it serves).
//! - Metrics, over HTTPS: `/metrics` (Prometheus text from one
//!   `prometheus-client` registry) and any extra routes a binary adds (the
//!   operator's raw benchmark samples). Series name sessions and tenants,
//!   so a scraper needs a Kubernetes token that RBAC allows `get` on the
//!   path (`nonResourceURLs: ["/metrics"]`, the chart's metrics-reader
//!   ClusterRole), checked by delegated auth; the certificate comes from
//!   files or is made at start-up (scrapers then skip verification, as
//!   with any self-signed metrics endpoint).
//! - A process on a host network whose metrics only the node itself may
//!   read (the worker) serves both on one loopback listener instead.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use std::net::SocketAddr;
use std::path::PathBuf;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use tokio::net::TcpListener;
use tower::ServiceExt;

/// Whether the process serves yet; `/readyz` answers 503 until it does.
#[derive(Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn set_ready(&self) {
        self.0.store(true, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// Requests served by an HTTPS server, by method and status, and how long
/// they took: the same series for every hangar server.
#[derive(Clone)]
pub struct HttpMetrics {
    requests: Family<HttpLabels, Counter>,
    duration: Histogram,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HttpLabels {
    method: String,
    status: u16,
}

impl Default for HttpMetrics {
    fn default() -> Self {
        Self {
            requests: Family::default(),
            // 1 ms … ~33 s (a long-poll waits up to 25 s).
            duration: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
        }
    }
}

impl HttpMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register("http_requests", "HTTPS requests answered", self.requests.clone());
        registry.register_with_unit(
            "http_request_duration",
            "Time to answer an HTTPS request",
            Unit::Seconds,
            self.duration.clone(),
        );
    }

    pub fn observe(&self, method: &str, status: u16, elapsed: std::time::Duration) {
        self.requests.get_or_create(&HttpLabels { method: method.to_owned(), status }).inc();
        self.duration.observe(elapsed.as_secs_f64());
    }
}

/// OpenMetrics text, which Prometheus scrapes natively.
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// `/healthz` and `/readyz`.
fn health(readiness: Readiness) -> Router {
    Router::new().route("/healthz", get(|| async { "ok\n" })).route(
        "/readyz",
        get(move || {
            let ready = readiness.is_ready();
            async move {
                if ready { (StatusCode::OK, "ok\n") } else { (StatusCode::SERVICE_UNAVAILABLE, "starting\n") }
            }
        }),
    )
}

/// `/metrics` over `registry`, with `extra` merged in.
fn metrics_routes(registry: Arc<Registry>, extra: Router) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(move || {
                let registry = registry.clone();
                async move { metrics(&registry) }
            }),
        )
        .merge(extra)
}

/// Health and metrics on one router (the loopback admin server).
pub fn router(registry: Arc<Registry>, readiness: Readiness, extra: Router) -> Router {
    health(readiness).merge(metrics_routes(registry, extra))
}

fn metrics(registry: &Registry) -> axum::response::Response {
    let mut text = String::new();
    match prometheus_client::encoding::text::encode(&mut text, registry) {
        Ok(()) => ([(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)], text).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// Binds `addr` and serves `/healthz` and `/readyz` from now on; `/readyz`
/// answers 503 until the returned [`Readiness`] is set.
pub async fn start_health(addr: impl tokio::net::ToSocketAddrs) -> std::io::Result<Readiness> {
    let listener = TcpListener::bind(addr).await?;
    tracing::info!(addr = %listener.local_addr()?, "health server (healthz, readyz)");
    let readiness = Readiness::default();
    tokio::spawn(serve(listener, health(readiness.clone())));
    Ok(readiness)
}

/// Health and metrics on one plain listener, which must be a loopback
/// address: only the node itself can read what it serves.
pub async fn start_on_loopback(addr: SocketAddr, registry: Registry, extra: Router) -> std::io::Result<Readiness> {
    if !addr.ip().is_loopback() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{addr} is not a loopback address: metrics there would be unauthenticated"),
        ));
    }
    let listener = TcpListener::bind(addr).await?;
    tracing::info!(addr = %listener.local_addr()?, "admin server on loopback (healthz, readyz, metrics)");
    let readiness = Readiness::default();
    tokio::spawn(serve(listener, router(Arc::new(registry), readiness.clone(), extra)));
    Ok(readiness)
}

/// Where the metrics server listens and which certificate it serves.
#[derive(clap::Args, Clone, Debug)]
pub struct MetricsArgs {
    /// Address of the metrics server (HTTPS; a bearer token RBAC allows
    /// `get` on the path /metrics).
    #[arg(long = "metrics-listen", env = "HANGAR_METRICS_LISTEN", default_value = "0.0.0.0:9443")]
    pub metrics_listen: SocketAddr,
    /// PEM certificate chain for the metrics server (reloaded when it
    /// changes). Unset: a self-signed certificate made at start-up.
    #[arg(long = "metrics-tls-cert", env = "HANGAR_METRICS_TLS_CERT", requires = "metrics_tls_key")]
    pub metrics_tls_cert: Option<PathBuf>,
    /// Its PEM private key.
    #[arg(long = "metrics-tls-key", env = "HANGAR_METRICS_TLS_KEY", requires = "metrics_tls_cert")]
    pub metrics_tls_key: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum MetricsServerError {
    #[error("binding the metrics server: {0}")]
    Bind(#[from] std::io::Error),
    #[error("the metrics server's certificate: {0}")]
    Certificate(#[from] crate::serving_cert::CertError),
    #[error("the metrics server's TLS: {0}")]
    Tls(#[from] crate::https::TlsError),
}

/// TokenReviews of new scraper tokens per second, all scrapers together.
const SCRAPER_TOKEN_REVIEWS_PER_SECOND: u32 = 10;

/// Binds the metrics server and serves `/metrics` (plus `extra`) over HTTPS
/// to callers RBAC allows `get` on the path they ask for.
pub async fn start_metrics(
    args: &MetricsArgs,
    client: kube::Client,
    registry: Registry,
    extra: Router,
) -> Result<SocketAddr, MetricsServerError> {
    use crate::serving_cert;
    let resolver = match (&args.metrics_tls_cert, &args.metrics_tls_key) {
        (Some(cert), Some(key)) => {
            serving_cert::start_from_files(cert.clone(), key.clone(), std::time::Duration::from_secs(60))?
        }
        _ => {
            let mut names = vec!["localhost".to_owned()];
            if !args.metrics_listen.ip().is_unspecified() {
                names.push(args.metrics_listen.ip().to_string());
            }
            serving_cert::self_signed(&names)?
        }
    };
    let tls = crate::https::server_config_with_resolver(resolver, None)?;
    let per_second = std::num::NonZeroU32::new(SCRAPER_TOKEN_REVIEWS_PER_SECOND).expect("non-zero");
    let auth = Arc::new(crate::delegated_auth::DelegatedAuth::new(client, None, per_second));
    let app = metrics_routes(Arc::new(registry), extra).layer(axum::middleware::from_fn_with_state(auth, scraper));
    let listener = TcpListener::bind(args.metrics_listen).await?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, "metrics server (HTTPS, delegated auth)");
    let limits = crate::https::Limits { max_connections: 64, max_body_bytes: 0, ..Default::default() };
    tokio::spawn(crate::https::serve(listener, tls, limits, std::future::pending(), move |req| {
        let app = app.clone();
        async move { app.oneshot(req).await.unwrap_or_else(|never| match never {}) }
    }));
    Ok(addr)
}

/// Lets a request through only with a token RBAC allows `get` on its path:
/// 401 without a valid token, 403 without the right, 503 if the apiserver
/// could not answer. The answer names no identity.
async fn scraper(
    State(auth): State<Arc<crate::delegated_auth::DelegatedAuth>>,
    req: Request,
    next: Next,
) -> axum::response::Response {
    use crate::delegated_auth::{Action, AuthError, bearer};
    let header = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    let action = Action::NonResource { path: req.uri().path().to_owned(), verb: "get".into() };
    let decided = match bearer(header) {
        Ok(token) => match auth.authenticate(token).await {
            Ok(caller) => auth.allowed(&caller, &action).await,
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    };
    match decided {
        Ok(true) => next.run(req).await,
        Ok(false) => (StatusCode::FORBIDDEN, "forbidden: this token may not get this path\n").into_response(),
        Err(AuthError::Missing | AuthError::Invalid) => {
            (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "Bearer")], "unauthorized\n").into_response()
        }
        Err(AuthError::RateLimited) => (StatusCode::TOO_MANY_REQUESTS, "too many new tokens\n").into_response(),
        Err(AuthError::Api(e)) => {
            tracing::warn!(error = %e, "could not check a metrics scraper's token");
            (StatusCode::SERVICE_UNAVAILABLE, "authorisation unavailable\n").into_response()
        }
    }
}

/// Serves the admin routes until the process ends. An accept error is
/// logged by axum and does not stop the server.
pub async fn serve(listener: TcpListener, router: Router) {
    if let Err(e) = axum::serve(listener, router).await {
        tracing::error!(error = %e, "admin server stopped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn readiness_and_metrics_answer_over_http() {
        // reqwest needs a process-wide provider even for plain HTTP; not
        // left to whichever test of this binary happens to run first.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut registry = Registry::with_prefix("hangar");
        let calls = Counter::<u64>::default();
        registry.register("test_calls", "Calls made", calls.clone());
        calls.inc();
        let readiness = Readiness::default();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, router(Arc::new(registry), readiness.clone(), Router::new())));
        let get = |path: &'static str| async move {
            let r = reqwest::get(format!("http://{addr}{path}")).await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        };
        assert_eq!(get("/healthz").await.0, 200);
        assert_eq!(get("/readyz").await.0, 503, "not ready until told");
        readiness.set_ready();
        assert_eq!(get("/readyz").await.0, 200);
        let (status, text) = get("/metrics").await;
        assert_eq!(status, 200);
        let lines: Vec<String> = text.lines().map(str::to_owned).collect();
        let scrape = prometheus_parse::Scrape::parse(lines.into_iter().map(Ok)).unwrap();
        let sample = scrape.samples.iter().find(|s| s.metric == "hangar_test_calls_total").expect("the counter");
        assert!(
            matches!(sample.value, prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Untyped(v) if v == 1.0),
            "{text}"
        );
    }
}

//! The admin server every binary runs on a plain-HTTP port of its own
//! (nothing on it carries credentials): `/healthz` (the process is alive),
//! `/readyz` (its dependencies answered and it serves), `/metrics`
//! (Prometheus text from one `prometheus-client` registry), plus any extra
//! routes a binary adds (e.g. the operator's raw benchmark samples).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use tokio::net::TcpListener;

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

/// The admin routes over `registry`, with `extra` merged in.
pub fn router(registry: Arc<Registry>, readiness: Readiness, extra: Router) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || {
                let ready = readiness.is_ready();
                async move {
                    if ready { (StatusCode::OK, "ok\n") } else { (StatusCode::SERVICE_UNAVAILABLE, "starting\n") }
                }
            }),
        )
        .route(
            "/metrics",
            get(move || {
                let registry = registry.clone();
                async move { metrics(&registry) }
            }),
        )
        .merge(extra)
}

fn metrics(registry: &Registry) -> axum::response::Response {
    let mut text = String::new();
    match prometheus_client::encoding::text::encode(&mut text, registry) {
        Ok(()) => ([(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)], text).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// Binds `addr` and serves the admin routes over `registry` (plus `extra`)
/// from now on; `/readyz` answers 503 until the returned [`Readiness`] is
/// set.
pub async fn start(
    addr: impl tokio::net::ToSocketAddrs,
    registry: Registry,
    extra: Router,
) -> std::io::Result<Readiness> {
    let listener = TcpListener::bind(addr).await?;
    tracing::info!(addr = %listener.local_addr()?, "admin server (healthz, readyz, metrics)");
    let readiness = Readiness::default();
    tokio::spawn(serve(listener, router(Arc::new(registry), readiness.clone(), extra)));
    Ok(readiness)
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

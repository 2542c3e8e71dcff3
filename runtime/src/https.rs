//! The HTTPS server: every hangar listener that carries credentials or
//! admission requests is TLS. HTTP/1.1 and HTTP/2, one task per
//! connection, with the limits an exposed listener needs: a handshake must
//! finish in time, connections are capped, request bodies are bounded, an
//! accept error never stops the server, and shutdown lets requests in
//! flight finish.

use std::convert::Infallible;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{Full, Limited};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::graceful::GracefulShutdown;
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("certificate {path}: {source}")]
    Pem {
        path: String,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
    #[error("client CA: {0}")]
    ClientCa(String),
    #[error("HTTP client: {0}")]
    Client(#[source] reqwest::Error),
}

/// A server configuration from PEM files (certificate chain, private key).
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, TlsError> {
    server_config_with_clients(cert, key, None)
}

/// As [`server_config`]; with `client_ca`, only clients presenting a
/// certificate that CA issued complete the handshake (the admission
/// webhook: only the apiserver may send it reviews).
pub fn server_config_with_clients(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let certs = pem_certs(cert)?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(pem(key))?;
    let mut config = builder(client_ca)?.with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// As [`server_config_with_clients`], serving whatever certificate
/// `resolver` holds at each handshake (one rotated in place).
pub fn server_config_with_resolver(
    resolver: Arc<dyn rustls::server::ResolvesServerCert>,
    client_ca: Option<&Path>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let mut config = builder(client_ca)?.with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn builder(
    client_ca: Option<&Path>,
) -> Result<rustls::ConfigBuilder<ServerConfig, rustls::server::WantsServerCert>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions()?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in pem_certs(ca)? {
                roots.add(c)?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsError::ClientCa(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    Ok(builder)
}

/// A client configuration that trusts only the CAs in PEM `ca` (a
/// component calling another's TLS listener: the worker and the webhook
/// calling the operator's node service).
pub fn client_config_trusting(ca: &[u8]) -> Result<rustls::ClientConfig, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca) {
        roots.add(cert.map_err(|source| TlsError::Pem { path: "(CA)".into(), source })?)?;
    }
    if roots.is_empty() {
        return Err(TlsError::ClientCa("no certificate in the CA file".into()));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// A client for plain-HTTP peers (the gateway replicas' peer port, the
/// instance metadata service). It trusts no CA at all: it needs no system
/// certificate store (hangar's images are built from scratch and have
/// none, where reqwest's default would fail to build) and can reach no
/// HTTPS endpoint by mistake.
pub fn plain_http_client(timeout: Duration) -> Result<reqwest::Client, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let no_roots = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    reqwest::Client::builder().tls_backend_preconfigured(no_roots).timeout(timeout).build().map_err(TlsError::Client)
}

fn pem(p: &Path) -> impl Fn(rustls::pki_types::pem::Error) -> TlsError + '_ {
    move |source| TlsError::Pem { path: p.display().to_string(), source }
}

fn pem_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    CertificateDer::pem_file_iter(path).map_err(pem(path))?.collect::<Result<Vec<_>, _>>().map_err(pem(path))
}

/// A response body.
pub type Body = Full<Bytes>;

/// A request body, already bounded by [`Limits::max_body_bytes`]: reading
/// past the limit is an error the handler answers (413 or 400).
pub type RequestBody = Limited<Incoming>;

/// The limits of one listener.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// A client that has not finished the TLS handshake by then is dropped.
    pub handshake_timeout: Duration,
    /// Connections served at once; more wait in the listen backlog.
    pub max_connections: usize,
    /// The largest request body a handler can read.
    pub max_body_bytes: usize,
    /// Requests in flight get this long to finish at shutdown.
    pub shutdown_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            handshake_timeout: Duration::from_secs(10),
            max_connections: 1024,
            max_body_bytes: 1 << 20,
            shutdown_grace: Duration::from_secs(20),
        }
    }
}

/// Serves `handler` on every connection until `shutdown` completes, then
/// waits (up to the grace) for the connections in flight.
pub async fn serve<H, F, B>(
    listener: TcpListener,
    tls: Arc<ServerConfig>,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
    handler: H,
) where
    H: Fn(Request<RequestBody>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let acceptor = TlsAcceptor::from(tls);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else { break };
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors, a reset before accept: wait a
                    // moment and go on; the listener itself is fine.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        // Requests and answers are small and each waits for the other: with
        // Nagle's algorithm a second small write waits for the peer's
        // delayed ACK (40 ms on Linux).
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(%peer, error = %e, "could not set TCP_NODELAY");
        }
        let acceptor = acceptor.clone();
        let handler = handler.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let _slot = slot;
            let stream = match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let h = handler.clone();
                let req = req.map(|b| Limited::new(b, limits.max_body_bytes));
                async move { Ok::<_, Infallible>(h(req).await) }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            if let Err(e) = watcher.watch(conn.into_owned()).await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    if tokio::time::timeout(limits.shutdown_grace, graceful.shutdown()).await.is_err() {
        tracing::warn!("connections still open after the shutdown grace");
    }
}

/// Resolves on SIGTERM or Ctrl-C: the usual end of a served process.
pub async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(t) => t,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

//! The HTTPS listener: every hangar listener that carries credentials or
//! admission requests is TLS. HTTP/1.1 and HTTP/2, one task per connection.

use std::convert::Infallible;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
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
}

/// A server configuration from PEM files (certificate chain, private key).
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, TlsError> {
    fn pem(p: &Path) -> impl Fn(rustls::pki_types::pem::Error) -> TlsError + '_ {
        move |source| TlsError::Pem { path: p.display().to_string(), source }
    }
    let certs = CertificateDer::pem_file_iter(cert)
        .map_err(pem(cert))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem(cert))?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(pem(key))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

pub type Body = Full<Bytes>;

/// Serves `handler` on every connection until the listener fails.
pub async fn serve<H, F>(listener: TcpListener, tls: Arc<ServerConfig>, handler: H) -> std::io::Result<()>
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let acceptor = TlsAcceptor::from(tls);
    loop {
        let (tcp, peer) = listener.accept().await?;
        let acceptor = acceptor.clone();
        let handler = handler.clone();
        tokio::spawn(async move {
            let stream = match acceptor.accept(tcp).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
            };
            let service = hyper::service::service_fn(move |req| {
                let h = handler.clone();
                async move { Ok::<_, Infallible>(h(req).await) }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            if let Err(e) = builder.serve_connection(TokioIo::new(stream), service).await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
}

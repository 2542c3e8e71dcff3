//! The cert-manager path of a serving certificate (`start_from_files`):
//! the server presents what the mounted Secret's files hold and, when
//! cert-manager renews them in place, the new certificate from then on,
//! without a restart; a half-written file keeps the old one serving.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hangar_runtime::https::{self, Limits, RequestBody};
use hangar_runtime::serving_cert;
use http_body_util::Full;
use hyper::{Request, Response};
use tokio::net::TcpListener;

async fn ok(_req: Request<RequestBody>) -> Response<Full<Bytes>> {
    Response::new(Full::new(Bytes::from_static(b"ok")))
}

/// A client that trusts only `ca_pem`, for `localhost` at `addr`.
fn client_trusting(ca_pem: &str, addr: std::net::SocketAddr) -> reqwest::Client {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    reqwest::Client::builder().tls_backend_preconfigured(tls).resolve("localhost", addr).build().unwrap()
}

/// Whether a new connection trusting only `ca_pem` is served (a fresh
/// client each time: a kept-alive connection would skip the handshake).
async fn answers(ca_pem: &str, addr: std::net::SocketAddr) -> bool {
    let client = client_trusting(ca_pem, addr);
    client.get(format!("https://localhost:{}/", addr.port())).send().await.is_ok_and(|r| r.status().is_success())
}

#[tokio::test]
async fn a_renewed_certificate_in_the_files_is_served_without_a_restart() {
    hangar_runtime::telemetry::init();
    let dir = tempfile::tempdir().unwrap();
    let (cert_path, key_path) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    let names = vec!["localhost".to_owned()];
    let (cert, key, first_ca) = serving_cert::issue(&names, Duration::from_secs(3600)).unwrap();
    std::fs::write(&cert_path, &cert).unwrap();
    std::fs::write(&key_path, &key).unwrap();
    let resolver =
        serving_cert::start_from_files(cert_path.clone(), key_path.clone(), Duration::from_millis(50)).unwrap();
    let config = https::server_config_with_resolver(resolver, None).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(https::serve(listener, config, Limits::default(), std::future::pending(), ok));
    assert!(answers(&first_ca, addr).await, "the mounted certificate is served");

    // cert-manager renews: a new key and a certificate from another CA.
    let (cert2, key2, second_ca) = serving_cert::issue(&names, Duration::from_secs(3600)).unwrap();
    // Half-written first (the certificate before its key): the old one
    // keeps serving meanwhile.
    std::fs::write(&cert_path, &cert2).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await; // several checks of the files
    assert!(answers(&first_ca, addr).await, "a half-written pair does not stop the old certificate");
    std::fs::write(&key_path, &key2).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !answers(&second_ca, addr).await {
        assert!(Instant::now() < deadline, "the renewed certificate was never served");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // New connections no longer get the old certificate.
    assert!(!answers(&first_ca, addr).await, "the old certificate is no longer served");
}

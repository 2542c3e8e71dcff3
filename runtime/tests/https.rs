//! The shared HTTPS server under the abuse an exposed listener gets: a
//! client that never finishes its TLS handshake is dropped after the
//! timeout, a body over the limit is refused without being read whole, a
//! failed handshake does not stop the server, and connections beyond the
//! cap wait instead of being served at once.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hangar_runtime::https::{self, Limits, RequestBody};
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, StatusCode};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

struct Server {
    addr: std::net::SocketAddr,
    client: reqwest::Client,
    _dir: tempfile::TempDir,
}

/// Answers the length of the body it read, or 413 past the limit.
async fn handler(req: Request<RequestBody>) -> Response<Full<Bytes>> {
    let (status, text) = match req.into_body().collect().await {
        Ok(b) => (StatusCode::OK, b.to_bytes().len().to_string()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => (StatusCode::PAYLOAD_TOO_LARGE, "too large".into()),
        Err(e) => (StatusCode::BAD_REQUEST, e.to_string()),
    };
    let mut r = Response::new(Full::new(Bytes::from(text)));
    *r.status_mut() = status;
    r
}

async fn start(limits: Limits) -> Server {
    hangar_runtime::telemetry::init();
    let key = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (cert_path, key_path) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::File::create(&cert_path).unwrap().write_all(key.cert.pem().as_bytes()).unwrap();
    std::fs::File::create(&key_path).unwrap().write_all(key.signing_key.serialize_pem().as_bytes()).unwrap();
    let config = https::server_config(&cert_path, &key_path).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(https::serve(listener, config, limits, std::future::pending(), handler));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(key.cert.der().clone()).unwrap();
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let client = reqwest::Client::builder().tls_backend_preconfigured(tls).resolve("localhost", addr).build().unwrap();
    Server { addr, client, _dir: dir }
}

fn url(s: &Server) -> String {
    format!("https://localhost:{}/", s.addr.port())
}

#[tokio::test]
async fn a_client_that_never_handshakes_is_dropped_after_the_timeout() {
    let s = start(Limits { handshake_timeout: Duration::from_millis(300), ..Limits::default() }).await;
    let mut silent = TcpStream::connect(s.addr).await.unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut buf)).await.expect("dropped in time");
    assert_eq!(n.unwrap_or(0), 0, "closed, nothing sent");
    assert!(started.elapsed() >= Duration::from_millis(250), "not before the timeout");
    // The server still serves.
    let r = s.client.post(url(&s)).body("hello").send().await.unwrap();
    assert_eq!(r.text().await.unwrap(), "5");
}

#[tokio::test]
async fn a_body_over_the_limit_is_refused_and_a_bad_handshake_stops_nothing() {
    let s = start(Limits { max_body_bytes: 1024, ..Limits::default() }).await;
    let r = s.client.post(url(&s)).body(vec![b'x'; 1024]).send().await.unwrap();
    assert_eq!((r.status().as_u16(), r.text().await.unwrap()), (200, "1024".to_owned()));
    let r = s.client.post(url(&s)).body(vec![b'x'; 64 * 1024]).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 413);
    // Plain HTTP on the TLS port: the handshake fails, the server goes on.
    let mut plain = std::net::TcpStream::connect(s.addr).unwrap();
    plain.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let r = s.client.post(url(&s)).body("ok").send().await.unwrap();
    assert_eq!(r.text().await.unwrap(), "2");
}

#[tokio::test]
async fn connections_beyond_the_cap_wait_for_a_free_slot() {
    let s = start(Limits { max_connections: 1, handshake_timeout: Duration::from_secs(1), ..Limits::default() }).await;
    // One silent connection holds the only slot until its handshake times
    // out; it is first in the listen queue, so it is accepted first.
    let started = Instant::now();
    let _silent = TcpStream::connect(s.addr).await.unwrap();
    let r = s.client.post(url(&s)).body("abc").send().await.unwrap();
    assert_eq!(r.text().await.unwrap(), "3");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "served only once the slot was free: {:?}",
        started.elapsed()
    );
}

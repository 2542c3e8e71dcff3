//! Reading a component's metrics the way Prometheus does in a cluster:
//! HTTPS to its metrics port with the token of a ServiceAccount that the
//! chart's metrics-reader ClusterRole is bound to. The local stack serves
//! metrics with the apiserver's serving certificate (127.0.0.1), so the
//! scraper verifies it under the local CA.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::control_plane::ControlPlane;
use crate::error::{HarnessError, Result};
use crate::operator::SYSTEM_NAMESPACE;

/// The ServiceAccount the harness scrapes as, and the ClusterRole the
/// chart grants scrapers.
pub const SCRAPER: &str = "hangar-metrics-scraper";
pub const METRICS_READER_ROLE: &str = "hangar-metrics-reader";

/// The environment that makes a component serve metrics on `port` with
/// the local stack's certificate.
pub fn metrics_env(cp: &ControlPlane, port: u16) -> Vec<(&'static str, String)> {
    vec![
        ("HANGAR_METRICS_LISTEN", format!("127.0.0.1:{port}")),
        ("HANGAR_METRICS_TLS_CERT", cp.pki.serving_cert.display().to_string()),
        ("HANGAR_METRICS_TLS_KEY", cp.pki.serving_key.display().to_string()),
    ]
}

/// A client that trusts the local CA only.
pub fn tls_client(ca_pem: &str) -> Arc<rustls::ClientConfig> {
    Arc::new(crate::gateway::tls_client_config(ca_pem, None))
}

/// `GET path` over HTTPS on loopback, with `token` as the bearer if given:
/// `(status, body)`.
pub fn https_get(
    tls: &Arc<rustls::ClientConfig>,
    port: u16,
    path: &str,
    token: Option<&str>,
) -> std::io::Result<(u16, String)> {
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("an IP address");
    let conn = rustls::ClientConnection::new(tls.clone(), name).map_err(std::io::Error::other)?;
    let tcp = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(2))?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut stream = rustls::StreamOwned::new(conn, tcp);
    let mut req = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n");
    if let Some(t) = token {
        req.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    req.push_str("\r\n");
    stream.write_all(req.as_bytes())?;
    let mut resp = Vec::new();
    match stream.read_to_end(&mut resp) {
        Ok(_) => {}
        // A server that closes without close_notify still sent its answer.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !resp.is_empty() => {}
        Err(e) => return Err(e),
    }
    let resp = String::from_utf8_lossy(&resp);
    let status = resp.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = resp.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    Ok((status, body))
}

/// Reads metrics as the scraper ServiceAccount of one control plane.
pub struct Scraper {
    tls: Arc<rustls::ClientConfig>,
    token: String,
}

impl Scraper {
    /// The scraper of `cp`: its ServiceAccount and binding are made once
    /// per control plane (the ClusterRole comes from the chart).
    pub fn of(cp: &ControlPlane) -> Result<Arc<Scraper>> {
        type ByKubeconfig = Vec<(std::path::PathBuf, Arc<Scraper>)>;
        static SCRAPERS: OnceLock<Mutex<ByKubeconfig>> = OnceLock::new();
        let scrapers = SCRAPERS.get_or_init(Mutex::default);
        let mut known = scrapers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, s)) = known.iter().find(|(k, _)| *k == cp.kubeconfig) {
            return Ok(s.clone());
        }
        crate::stack::apply_chart_parts(cp, &["templates/rbac-metrics.yaml"])?;
        let sa = format!("--serviceaccount={SYSTEM_NAMESPACE}:{SCRAPER}");
        let role = format!("--clusterrole={METRICS_READER_ROLE}");
        let steps: [&[&str]; 2] = [
            &["create", "serviceaccount", SCRAPER, "-n", SYSTEM_NAMESPACE],
            &["create", "clusterrolebinding", SCRAPER, &role, &sa],
        ];
        for args in steps {
            let out = cp.kubectl().args(args).output().map_err(crate::error::io("kubectl"))?;
            let err = String::from_utf8_lossy(&out.stderr);
            if !out.status.success() && !err.contains("already exists") {
                return Err(HarnessError::NotReady {
                    what: format!("kubectl {args:?}"),
                    seconds: 0,
                    log_tail: err.into(),
                });
            }
        }
        let out = cp
            .kubectl()
            .args(["create", "token", SCRAPER, "-n", SYSTEM_NAMESPACE, "--duration=24h"])
            .output()
            .map_err(crate::error::io("kubectl create token"))?;
        if !out.status.success() {
            let log_tail = String::from_utf8_lossy(&out.stderr).into_owned();
            return Err(HarnessError::NotReady { what: "a scraper token".into(), seconds: 0, log_tail });
        }
        let token = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let scraper = Arc::new(Scraper { tls: tls_client(&cp.pki.ca_pem), token });
        known.push((cp.kubeconfig.clone(), scraper.clone()));
        Ok(scraper)
    }

    /// `GET path` on the metrics port as the scraper.
    pub fn get(&self, port: u16, path: &str) -> std::io::Result<(u16, String)> {
        https_get(&self.tls, port, path, Some(&self.token))
    }

    /// The Prometheus text on `port`; empty if it could not be read.
    pub fn metrics(&self, port: u16) -> String {
        self.get(port, "/metrics").ok().filter(|(s, _)| *s == 200).map(|(_, b)| b).unwrap_or_default()
    }

    pub fn tls(&self) -> Arc<rustls::ClientConfig> {
        self.tls.clone()
    }
}

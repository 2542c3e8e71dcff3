//! The gateway as a real process on loopback (HTTPS with the local CA's
//! loopback certificate), a client for it, and member credentials: a
//! ServiceAccount token (which the gateway checks by TokenReview) bound to
//! a Role in one namespace.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::control_plane::ControlPlane;
use crate::error::Result;
use crate::operator::{SYSTEM_NAMESPACE, workspace_binary};
use crate::process::{ChildProcess, free_port, port_open, wait_until};

pub struct GatewayProcess {
    process: ChildProcess,
    pub port: u16,
    /// Its peer port (replicas that know each other), plain HTTP.
    pub peer_port: Option<u16>,
    /// Its health server (/healthz, /readyz) and metrics server (HTTPS).
    pub admin_port: u16,
    pub metrics_port: u16,
    scraper: std::sync::Arc<crate::scrape::Scraper>,
}

impl GatewayProcess {
    pub fn pid(&self) -> u32 {
        self.process.id()
    }

    /// Its `/metrics` text.
    pub fn metrics(&self) -> String {
        self.scraper.metrics(self.metrics_port)
    }

    /// `Err` with its log tail when the process has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        self.process.check_alive()
    }

    /// Killed and started again on the same ports.
    pub fn restart(&mut self) -> Result<()> {
        self.process.respawn()?;
        let (port, admin) = (self.port, self.admin_port);
        wait_until("hangar-gateway /readyz", &mut self.process, Duration::from_secs(60), || {
            port_open(port) && crate::process::http_get(admin, "/readyz").is_ok_and(|(s, _)| s == 200)
        })
    }

    pub fn start(cp: &ControlPlane, output_dir: &std::path::Path) -> Result<Self> {
        Self::start_with(cp, output_dir, &[])
    }

    /// `n` replicas that know each other (a proof's jti is claimed once
    /// across them, over their peer ports); the first logs to
    /// `gateway.log`, the others to `gateway-<i>.log`.
    pub fn start_replicas(cp: &ControlPlane, output_dir: &std::path::Path, n: usize) -> Result<Vec<Self>> {
        let peer_ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
        let api_ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
        let peers = peer_ports.iter().map(|p| format!("127.0.0.1:{p}")).collect::<Vec<_>>().join(",");
        // Their public URL (what proofs name) is the first one's, as if a
        // load balancer stood there.
        let public = format!("https://127.0.0.1:{}", api_ports[0]);
        let mut replicas = Vec::new();
        for (i, (peer, api)) in peer_ports.iter().zip(&api_ports).enumerate() {
            let me = format!("127.0.0.1:{peer}");
            let env = [
                ("HANGAR_GATEWAY_PEER_LISTEN", me.as_str()),
                ("HANGAR_GATEWAY_PEER_SELF", me.as_str()),
                ("HANGAR_GATEWAY_PEERS", peers.as_str()),
                ("HANGAR_GATEWAY_PUBLIC_URL", public.as_str()),
            ];
            let log = if i == 0 { "gateway.log".to_owned() } else { format!("gateway-{i}.log") };
            replicas.push(Self::start_logged(cp, output_dir, &env, &log, *api)?);
        }
        Ok(replicas)
    }

    /// With more environment (a benchmark lifts the per-caller rate).
    pub fn start_with(cp: &ControlPlane, output_dir: &std::path::Path, env: &[(&str, &str)]) -> Result<Self> {
        Self::start_logged(cp, output_dir, env, "gateway.log", free_port())
    }

    fn start_logged(
        cp: &ControlPlane,
        output_dir: &std::path::Path,
        env: &[(&str, &str)],
        log: &str,
        port: u16,
    ) -> Result<Self> {
        let (admin_port, metrics_port) = (free_port(), free_port());
        let scraper = crate::scrape::Scraper::of(cp)?;
        let mut cmd = Command::new(workspace_binary("hangar-gateway"));
        cmd.envs(crate::scrape::metrics_env(cp, metrics_port));
        cmd.env("KUBECONFIG", &cp.kubeconfig)
            .env("HANGAR_GATEWAY_ADMIN_LISTEN", format!("127.0.0.1:{admin_port}"))
            .env("HANGAR_GATEWAY_LISTEN", format!("127.0.0.1:{port}"))
            .env("HANGAR_GATEWAY_TLS_CERT", &cp.pki.serving_cert)
            .env("HANGAR_GATEWAY_TLS_KEY", &cp.pki.serving_key)
            .env("HANGAR_SYSTEM_NAMESPACE", SYSTEM_NAMESPACE)
            .env("HANGAR_OUTPUT_STORE", output_dir)
            .env("RUST_LOG", "info");
        cmd.envs(env.iter().copied());
        let mut process = ChildProcess::spawn("hangar-gateway", cmd, &cp.dir().join(log))?;
        // It waits for the operator's output key-encryption key before it
        // listens.
        wait_until("hangar-gateway /readyz", &mut process, Duration::from_secs(60), || {
            port_open(port) && crate::process::http_get(admin_port, "/readyz").is_ok_and(|(s, _)| s == 200)
        })?;
        let peer_port = env
            .iter()
            .find(|(k, _)| *k == "HANGAR_GATEWAY_PEER_LISTEN")
            .and_then(|(_, v)| v.rsplit(':').next()?.parse().ok());
        Ok(Self { process, port, peer_port, admin_port, metrics_port, scraper })
    }
}

/// An HTTPS client that trusts only the local CA.
pub struct GatewayClient {
    http: reqwest::Client,
    base: String,
    /// The public URL proofs name (the first replica's).
    proof_base: String,
}

impl GatewayClient {
    pub fn new(cp: &ControlPlane, port: u16) -> Self {
        let base = format!("https://127.0.0.1:{port}");
        Self { http: https_client(cp, None), proof_base: base.clone(), base }
    }

    /// A client of replica `port` whose proofs name `public_port` (the
    /// replicas' shared public URL).
    pub fn of_replica(cp: &ControlPlane, port: u16, public_port: u16) -> Self {
        Self {
            http: https_client(cp, None),
            base: format!("https://127.0.0.1:{port}"),
            proof_base: format!("https://127.0.0.1:{public_port}"),
        }
    }

    pub async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
        headers: &[(&str, &str)],
    ) -> (u16, Value) {
        self.try_call(method, path, token, body, headers).await.expect("gateway request")
    }

    /// The same; `Err` when the connection ends without an answer (a
    /// server may close one whose body it refused before reading it all).
    pub async fn try_call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
        headers: &[(&str, &str)],
    ) -> Result<(u16, Value), reqwest::Error> {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await?;
        let status = resp.status().as_u16();
        let text = resp.text().await?;
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::String(text))))
    }

    /// The base URL proofs name in `htu`.
    pub fn proof_base(&self) -> &str {
        &self.proof_base
    }

    /// A request with session token `creds` and a fresh proof for it.
    pub async fn as_token(&self, creds: &TokenCreds, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let proof = creds.proof(method, &format!("{}{path}", self.proof_base));
        self.call(method, path, Some(&creds.token), body, &[("Hangar-Proof", &proof)]).await
    }

    pub async fn get(&self, path: &str, token: &str) -> (u16, Value) {
        self.call("GET", path, Some(token), None, &[]).await
    }

    /// Waits (with a deadline) until the gateway knows session `id`: it
    /// learns sessions from a watch, so one just created can take a moment
    /// to appear there after the apiserver shows it.
    pub async fn wait_known(&self, id: &str, token: &str) {
        let deadline = std::time::Instant::now() + crate::sessions::DEADLINE;
        loop {
            let (status, body) = self.get(&format!("/v1/sandboxes/{id}"), token).await;
            if status != 404 {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "the gateway never learned session {id}: {body}");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}

/// A session token as a client holds it: the plaintext, and the P-256 key
/// its proofs are signed with.
pub struct TokenCreds {
    pub name: String,
    pub token: String,
    pub signer: Arc<hangar_keys::proof::Signer>,
}

impl TokenCreds {
    /// A proof for `method` `url`, made now, with a new `jti`.
    pub fn proof(&self, method: &str, url: &str) -> String {
        let now = k8s_openapi::jiff::Timestamp::now().as_second();
        let jti = format!("{:032x}", rand_u128());
        self.signer.proof(method, url, &self.token, now, &jti)
    }
}

fn rand_u128() -> u128 {
    u128::from_le_bytes(hangar_keys::random_bytes::<16>().expect("random"))
}

/// The JWK of `signer`'s public key.
pub fn jwk(signer: &hangar_keys::proof::Signer) -> Value {
    let (x, y) = signer.jwk_xy();
    serde_json::json!({"kty": "EC", "crv": "P-256", "x": x, "y": y})
}

/// Mints a token for session `sid` through the gateway as `member`.
pub async fn mint_token(
    gw: &GatewayClient,
    member: &str,
    sid: &str,
    name: &str,
    scopes: &[&str],
    ttl: i64,
) -> TokenCreds {
    let signer = Arc::new(hangar_keys::proof::Signer::generate());
    let body = serde_json::json!({"name": name, "scopes": scopes, "ttlSeconds": ttl, "publicKey": jwk(&signer)});
    let (status, v) = gw.call("POST", &format!("/v1/sandboxes/{sid}/tokens"), Some(member), Some(&body), &[]).await;
    assert_eq!(status, 201, "mint {name}: {v}");
    TokenCreds { name: name.to_owned(), token: v["token"].as_str().expect("plaintext").to_owned(), signer }
}

/// An HTTPS client that trusts only the local CA and presents `identity`
/// (certificate and key, PEM) when given.
pub fn https_client(cp: &ControlPlane, identity: Option<(&[u8], &[u8])>) -> reqwest::Client {
    https_client_trusting(&cp.pki.ca_pem, identity)
}

/// An HTTPS client that trusts only the CAs in `ca_pem`.
pub fn https_client_trusting(ca_pem: &str, identity: Option<(&[u8], &[u8])>) -> reqwest::Client {
    let tls = tls_client_config(ca_pem, identity);
    reqwest::Client::builder().tls_backend_preconfigured(tls).build().expect("client")
}

/// A TLS client configuration that trusts only the CAs in `ca_pem` and
/// presents `identity` (certificate and key, PEM) when given.
pub fn tls_client_config(ca_pem: &str, identity: Option<(&[u8], &[u8])>) -> rustls::ClientConfig {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    crate::install_crypto_provider();
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.expect("CA pem")).expect("CA cert");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots);
    match identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let certs = CertificateDer::pem_slice_iter(cert).collect::<Result<Vec<_>, _>>().expect("cert pem");
            builder
                .with_client_auth_cert(certs, PrivateKeyDer::from_pem_slice(key).expect("key pem"))
                .expect("identity")
        }
    }
}

/// The audience the gateway asks TokenReviews for (its default).
pub const GATEWAY_AUDIENCE: &str = "hangar-gateway";
/// The local apiserver's own audience (its service account issuer).
pub const API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

/// A ServiceAccount in `namespace` allowed `verbs` on sandboxes, commands
/// and session tokens there, and a token for it.
pub fn member_token(cp: &ControlPlane, namespace: &str, name: &str, verbs: &str) -> String {
    let run = |args: &[&str]| {
        let out = cp.kubectl().args(args).output().expect("kubectl");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() || err.to_lowercase().contains("already exists"), "kubectl {args:?}: {err}");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    run(&["create", "serviceaccount", name, "-n", namespace]);
    if !verbs.is_empty() {
        let verb_arg = format!("--verb={verbs}");
        run(&[
            "create",
            "role",
            name,
            "-n",
            namespace,
            &verb_arg,
            "--resource=sandboxes.hangar.dev,commands.hangar.dev,sessiontokens.hangar.dev",
        ]);
        let sa = format!("--serviceaccount={namespace}:{name}");
        run(&["create", "rolebinding", name, "-n", namespace, &format!("--role={name}"), &sa]);
    }
    // For the gateway (its audience) and for the apiserver (tests also
    // act with it directly).
    run(&[
        "create",
        "token",
        name,
        "-n",
        namespace,
        "--duration=1h",
        "--audience",
        GATEWAY_AUDIENCE,
        "--audience",
        API_AUDIENCE,
    ])
}

//! The gateway as the CLI talks to it: HTTPS trusting the given CA, a
//! bearer token for the gateway's audience (a member). Transport failures
//! (a dropped connection, a gateway restarting) and 429/502/503 answers are
//! tried again with backoff — for a write only when it is idempotent (an
//! `Idempotency-Key`) or never reached the gateway, so a retry never does a
//! thing twice.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use crate::CliError;

#[derive(clap::Args, Clone)]
pub struct GatewayArgs {
    /// The gateway's base URL, e.g. https://hangar.example.com.
    #[arg(long, env = "HANGAR_GATEWAY")]
    pub gateway: String,
    /// CA bundle (PEM) to trust for the gateway (only it is trusted).
    #[arg(long, env = "HANGAR_GATEWAY_CA")]
    pub gateway_ca: PathBuf,
    /// A Kubernetes token for the gateway's audience (kubectl create token
    /// … --audience hangar-gateway). Never printed.
    #[arg(long, env = "HANGAR_GATEWAY_TOKEN", hide_env_values = true)]
    pub gateway_token: String,
}

pub struct Gateway {
    http: reqwest::Client,
    base: String,
    token: String,
}

/// How long a dropped connection is tried again before the CLI gives up.
const RETRY_FOR: Duration = Duration::from_secs(120);

impl Gateway {
    pub fn new(args: &GatewayArgs) -> Result<Self, CliError> {
        let p = &args.gateway_ca;
        let ca = std::fs::read(p).map_err(|e| CliError::File(p.display().to_string(), e))?;
        let tls = hangar_runtime::https::client_config_trusting(&ca).map_err(|e| CliError::Gateway(e.to_string()))?;
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| CliError::Gateway(e.to_string()))?;
        Ok(Self { http, base: args.gateway.trim_end_matches('/').to_owned(), token: args.gateway_token.clone() })
    }

    /// The body of a successful GET; the gateway's error otherwise.
    pub async fn get(&self, path: &str) -> Result<Vec<u8>, CliError> {
        self.send(reqwest::Method::GET, path, None, None).await
    }

    pub async fn get_json(&self, path: &str) -> Result<Value, CliError> {
        json(&self.get(path).await?)
    }

    /// A POST of `body`, with `idempotency_key` when the route takes one.
    pub async fn post_json(&self, path: &str, body: &Value, idempotency_key: Option<&str>) -> Result<Value, CliError> {
        json(&self.send(reqwest::Method::POST, path, Some(body), idempotency_key).await?)
    }

    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
        idempotency_key: Option<&str>,
    ) -> Result<Vec<u8>, CliError> {
        let started = std::time::Instant::now();
        let mut wait = Duration::from_millis(100);
        loop {
            let mut req = self.http.request(method.clone(), format!("{}{path}", self.base)).bearer_auth(&self.token);
            if let Some(b) = body {
                req = req.header("content-type", "application/json").body(b.to_string());
            }
            if let Some(k) = idempotency_key {
                req = req.header("idempotency-key", k);
            }
            // A GET, or a write with a key, can be made again whatever
            // happened; another write only if it never reached the gateway
            // or was turned away before anything was done (429).
            let repeatable = method == reqwest::Method::GET || idempotency_key.is_some();
            let (outcome, again) = match req.send().await {
                Ok(resp) => {
                    let status = resp.status();
                    match resp.bytes().await {
                        Ok(bytes) if status.is_success() => return Ok(bytes.to_vec()),
                        Ok(bytes) => {
                            let again = status.as_u16() == 429 || (repeatable && matches!(status.as_u16(), 502 | 503));
                            (format!("{status}: {}", String::from_utf8_lossy(&bytes)), again)
                        }
                        Err(e) => (e.to_string(), repeatable),
                    }
                }
                Err(e) => (e.to_string(), repeatable || e.is_connect()),
            };
            if !again || started.elapsed() > RETRY_FOR {
                return Err(CliError::Gateway(outcome));
            }
            // Quiet for the first quick tries (a dropped connection is
            // made again at once); said once the wait grows.
            if wait >= Duration::from_secs(1) {
                eprintln!("hangar: the gateway did not answer ({outcome}); trying again");
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(5));
        }
    }
}

fn json(bytes: &[u8]) -> Result<Value, CliError> {
    serde_json::from_slice(bytes).map_err(|e| CliError::Gateway(format!("not JSON: {e}")))
}

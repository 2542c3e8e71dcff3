//! The gateway as the CLI talks to it: HTTPS trusting the given CA, a
//! bearer token for the gateway's audience.

use std::path::PathBuf;

use crate::CliError;

#[derive(clap::Args)]
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

impl Gateway {
    pub fn new(args: &GatewayArgs) -> Result<Self, CliError> {
        let p = &args.gateway_ca;
        let ca = std::fs::read(p).map_err(|e| CliError::File(p.display().to_string(), e))?;
        let tls = hangar_runtime::https::client_config_trusting(&ca).map_err(|e| CliError::Gateway(e.to_string()))?;
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .build()
            .map_err(|e| CliError::Gateway(e.to_string()))?;
        Ok(Self { http, base: args.gateway.trim_end_matches('/').to_owned(), token: args.gateway_token.clone() })
    }

    /// The body of a successful GET; the gateway's error body otherwise.
    pub async fn get(&self, path: &str) -> Result<Vec<u8>, CliError> {
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|e| CliError::Gateway(e.to_string()))?;
        let status = resp.status();
        let body = resp.bytes().await.map_err(|e| CliError::Gateway(e.to_string()))?;
        if !status.is_success() {
            return Err(CliError::Gateway(format!("{status}: {}", String::from_utf8_lossy(&body))));
        }
        Ok(body.to_vec())
    }
}

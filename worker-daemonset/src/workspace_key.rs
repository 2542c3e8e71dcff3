//! Getting the session's workspace key: the worker proves which instance
//! it runs on with the EC2 identity document and its `rsa2048` signature
//! from the instance metadata service (IMDSv2), plus a nonce the
//! operator's key service issued, and receives the key over TLS. The key
//! stays in this process's memory (zeroized when dropped): it is never
//! written to the node's disk.

use std::time::Duration;

use base64::Engine;
use hangar_crds::workspace_key::{KEY_PATH, KeyRequest, KeyResponse, NONCE_PATH, NonceResponse};
use zeroize::Zeroizing;

/// The workspace key's length (`hangar_keys::session::SESSION_KEY_LEN`).
pub const KEY_LEN: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum KeyFetchError {
    #[error("environment variable {0} is not set")]
    Env(&'static str),
    #[error("the key service CA {path}: {reason}")]
    Ca { path: String, reason: String },
    #[error("instance metadata: {0}")]
    Imds(#[source] reqwest::Error),
    #[error("the instance metadata client: {0}")]
    ImdsClient(#[from] hangar_runtime::https::TlsError),
    #[error("key service: {0}")]
    Service(#[source] reqwest::Error),
    #[error("the key service refused the key (HTTP {0})")]
    Refused(u16),
    #[error("the key service answered a key that is not {KEY_LEN} base64 bytes")]
    BadKey,
}

/// Which session's key to ask for.
pub struct SessionRef<'a> {
    pub namespace: &'a str,
    pub sandbox: &'a str,
    pub session_id: &'a str,
}

pub struct KeySource {
    imds: String,
    service: String,
    imds_client: reqwest::Client,
    service_client: reqwest::Client,
}

impl KeySource {
    /// From `HANGAR_WORKSPACE_KEY_URL` (the operator's key service),
    /// `HANGAR_WORKSPACE_KEY_CA` (the CA its certificate is checked
    /// against: nothing else is trusted) and `HANGAR_IMDS_ENDPOINT`
    /// (default the link-local metadata address).
    pub fn from_env() -> Result<Self, KeyFetchError> {
        let service =
            std::env::var("HANGAR_WORKSPACE_KEY_URL").map_err(|_| KeyFetchError::Env("HANGAR_WORKSPACE_KEY_URL"))?;
        let ca_path =
            std::env::var("HANGAR_WORKSPACE_KEY_CA").map_err(|_| KeyFetchError::Env("HANGAR_WORKSPACE_KEY_CA"))?;
        let imds = std::env::var("HANGAR_IMDS_ENDPOINT").unwrap_or_else(|_| "http://169.254.169.254".into());
        let ca_err = |reason: String| KeyFetchError::Ca { path: ca_path.clone(), reason };
        let pem = std::fs::read(&ca_path).map_err(|e| ca_err(e.to_string()))?;
        Ok(Self {
            imds: imds.trim_end_matches('/').to_owned(),
            service: service.trim_end_matches('/').to_owned(),
            imds_client: hangar_runtime::https::plain_http_client(Duration::from_secs(5))?,
            service_client: tls_client(&pem).map_err(ca_err)?,
        })
    }

    /// The document and its signature, as IMDSv2 serves them (a session
    /// token first; the hop limit keeps containers from getting one).
    async fn identity(&self) -> Result<(String, String), KeyFetchError> {
        let token = self
            .imds_client
            .put(format!("{}/latest/api/token", self.imds))
            .header("X-aws-ec2-metadata-token-ttl-seconds", "60")
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .map_err(KeyFetchError::Imds)?
            .text()
            .await
            .map_err(KeyFetchError::Imds)?;
        let get = |path: &'static str| {
            let url = format!("{}/latest/dynamic/instance-identity/{path}", self.imds);
            let req = self.imds_client.get(url).header("X-aws-ec2-metadata-token", token.as_str());
            async move { req.send().await.and_then(|r| r.error_for_status())?.text().await }
        };
        let document = get("document").await.map_err(KeyFetchError::Imds)?;
        let signature = get("rsa2048").await.map_err(KeyFetchError::Imds)?;
        Ok((document, signature))
    }

    /// One try: a nonce, then the key.
    pub async fn fetch(&self, session: &SessionRef<'_>) -> Result<Zeroizing<Vec<u8>>, KeyFetchError> {
        let (document, signature) = self.identity().await?;
        let nonce: NonceResponse = self
            .service_client
            .post(format!("{}{NONCE_PATH}", self.service))
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .map_err(KeyFetchError::Service)?
            .json()
            .await
            .map_err(KeyFetchError::Service)?;
        let request = KeyRequest {
            namespace: session.namespace.to_owned(),
            sandbox: session.sandbox.to_owned(),
            session_id: session.session_id.to_owned(),
            document,
            signature,
            nonce: nonce.nonce,
        };
        let answer = self
            .service_client
            .post(format!("{}{KEY_PATH}", self.service))
            .json(&request)
            .send()
            .await
            .map_err(KeyFetchError::Service)?;
        if !answer.status().is_success() {
            return Err(KeyFetchError::Refused(answer.status().as_u16()));
        }
        let body: KeyResponse = answer.json().await.map_err(KeyFetchError::Service)?;
        let key = Zeroizing::new(body.key);
        let bytes = Zeroizing::new(
            base64::engine::general_purpose::STANDARD.decode(key.as_bytes()).map_err(|_| KeyFetchError::BadKey)?,
        );
        if bytes.len() != KEY_LEN {
            return Err(KeyFetchError::BadKey);
        }
        Ok(bytes)
    }

    /// The operator's node service (its URL and a client that trusts only
    /// its CA), where the worker also reads its session's commands.
    pub fn node_service(&self) -> (String, reqwest::Client) {
        (self.service.clone(), self.service_client.clone())
    }

    /// Asks until the key comes: the operator may not yet see this boot
    /// (its describe, the Sandbox's instance), or may be changing leader.
    pub async fn fetch_until_granted(&self, session: &SessionRef<'_>) -> Zeroizing<Vec<u8>> {
        let mut wait = Duration::from_millis(100);
        loop {
            match self.fetch(session).await {
                Ok(key) => return key,
                Err(e) => tracing::warn!(error = %e, retry_in_ms = wait.as_millis() as u64, "no workspace key yet"),
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(5));
        }
    }
}

/// A client that trusts only the CAs in `pem`.
fn tls_client(pem: &[u8]) -> Result<reqwest::Client, String> {
    let tls = hangar_runtime::https::client_config_trusting(pem).map_err(|e| e.to_string())?;
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| e.to_string())
}

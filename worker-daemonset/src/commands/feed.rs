//! The session's commands, read from the operator's node service
//! (`hangar_crds::node_commands`) as this node's account: the worker holds
//! no read right on Commands in the apiserver, where RBAC could not keep
//! it to its own session's. A long-poll: each answer is the whole set of
//! the session's numbered commands, sent when it differs from the version
//! the worker holds.

use std::time::Duration;

use hangar_crds::node_commands::{NodeCommands, NodeCommandsQuery, PATH, WAIT_SECONDS};
use tokio::sync::mpsc;

#[derive(Debug, thiserror::Error)]
pub enum FeedError {
    #[error("node service: {0}")]
    Http(#[from] reqwest::Error),
    #[error("the node service refused the session's commands (HTTP {0})")]
    Refused(u16),
}

#[derive(Clone)]
pub struct CommandsFeed {
    http: reqwest::Client,
    url: String,
    /// The node account's token (never logged).
    token: String,
    namespace: String,
    sandbox: String,
}

impl CommandsFeed {
    pub fn new(service: (String, reqwest::Client), token: String, namespace: &str, sandbox: &str) -> Self {
        let (base, http) = service;
        Self { http, url: format!("{base}{PATH}"), token, namespace: namespace.to_owned(), sandbox: sandbox.to_owned() }
    }

    /// The commands once they differ from version `after` (at once when
    /// `after` is `None`); waits at most `wait`.
    pub async fn fetch(&self, after: Option<&str>, wait: Duration) -> Result<NodeCommands, FeedError> {
        let query = NodeCommandsQuery {
            namespace: self.namespace.clone(),
            sandbox: self.sandbox.clone(),
            after: after.map(str::to_owned),
        };
        let query = serde_urlencoded::to_string(&query).expect("a query of strings encodes");
        let response = self
            .http
            .get(format!("{}?{query}", self.url))
            .bearer_auth(&self.token)
            // The server answers by its own deadline; ours is past it.
            .timeout(wait + Duration::from_secs(5))
            .send()
            .await?;
        if !response.status().is_success() {
            return Err(FeedError::Refused(response.status().as_u16()));
        }
        Ok(response.json().await?)
    }

    /// Sends every new version of the commands to `tx` until it closes.
    pub async fn follow(self, tx: mpsc::Sender<NodeCommands>) {
        let mut version: Option<String> = None;
        let mut backoff = Duration::from_millis(100);
        loop {
            match self.fetch(version.as_deref(), Duration::from_secs(WAIT_SECONDS)).await {
                Ok(now) => {
                    backoff = Duration::from_millis(100);
                    if version.as_deref() == Some(now.version.as_str()) {
                        continue;
                    }
                    version = Some(now.version.clone());
                    if tx.send(now).await.is_err() {
                        return;
                    }
                }
                Err(e) => {
                    // The operator may be restarting or changing leader.
                    tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "session commands");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }
}

//! The watch caches every admission reads from: Sandboxes, Commands,
//! SessionTokens and SandboxTemplates, filled before the webhook says it
//! is ready.

use futures::StreamExt;
use hangar_crds::{Command, Sandbox, SandboxTemplate, SessionToken};
use hangar_runtime::kube_ext::log_watch_errors;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};

use super::AdmissionError;

#[derive(Clone)]
pub struct Caches {
    pub sandboxes: Store<Sandbox>,
    pub commands: Store<Command>,
    pub tokens: Store<SessionToken>,
    pub templates: Store<SandboxTemplate>,
}

impl Caches {
    /// Starts the watches and waits for their first lists.
    pub async fn start(client: &kube::Client) -> Result<Self, AdmissionError> {
        let (sandboxes, sw) = reflector::store();
        let (commands, cw) = reflector::store();
        let (tokens, tw) = reflector::store();
        let (templates, pw) = reflector::store();
        let s = reflector::reflector(sw, watcher(Api::<Sandbox>::all(client.clone()), watcher::Config::default()));
        let c = reflector::reflector(cw, watcher(Api::<Command>::all(client.clone()), watcher::Config::default()));
        let t = reflector::reflector(tw, watcher(Api::<SessionToken>::all(client.clone()), watcher::Config::default()));
        tokio::spawn(s.default_backoff().for_each(log_watch_errors("Sandbox")));
        tokio::spawn(c.default_backoff().for_each(log_watch_errors("Command")));
        tokio::spawn(t.default_backoff().for_each(log_watch_errors("SessionToken")));
        let p =
            reflector::reflector(pw, watcher(Api::<SandboxTemplate>::all(client.clone()), watcher::Config::default()));
        tokio::spawn(p.default_backoff().for_each(log_watch_errors("SandboxTemplate")));
        for ready in [
            sandboxes.wait_until_ready().await,
            commands.wait_until_ready().await,
            tokens.wait_until_ready().await,
            templates.wait_until_ready().await,
        ] {
            ready.map_err(|_| AdmissionError::CacheNotReady)?;
        }
        Ok(Self { sandboxes, commands, tokens, templates })
    }
}

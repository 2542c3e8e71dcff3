//! What the gateway knows without asking: every Sandbox (found by session
//! id) and every Command, kept current by watches. A Command just created
//! may not be here yet; routes that need it read it from the API then.

use std::sync::Arc;

use futures::StreamExt;
use hangar_crds::{Command, Sandbox};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};

#[derive(Clone)]
pub struct Index {
    pub sandboxes: Store<Sandbox>,
    pub commands: Store<Command>,
}

impl Index {
    /// Starts the watches and waits for their first lists.
    pub async fn start(client: kube::Client) -> Result<Self, reflector::store::WriterDropped> {
        let (sandboxes, sw) = reflector::store();
        let (commands, cw) = reflector::store();
        let s = reflector::reflector(sw, watcher(Api::<Sandbox>::all(client.clone()), watcher::Config::default()));
        let c = reflector::reflector(cw, watcher(Api::<Command>::all(client), watcher::Config::default()));
        tokio::spawn(s.default_backoff().for_each(|r| log_watch_error("Sandbox", r)));
        tokio::spawn(c.default_backoff().for_each(|r| log_watch_error("Command", r)));
        sandboxes.wait_until_ready().await?;
        commands.wait_until_ready().await?;
        Ok(Self { sandboxes, commands })
    }

    /// The session with id (uid) `id`, if the watch has seen it.
    pub fn session(&self, id: &str) -> Option<Arc<Sandbox>> {
        self.sandboxes.state().into_iter().find(|s| s.metadata.uid.as_deref() == Some(id))
    }

    /// The session's commands, by number (unnumbered last, by name).
    pub fn commands_of(&self, sandbox: &Sandbox) -> Vec<Arc<Command>> {
        let mut list: Vec<Arc<Command>> = self.commands.state().into_iter().filter(|c| c.belongs_to(sandbox)).collect();
        list.sort_by_key(|c| (c.status.as_ref().and_then(|s| s.number).unwrap_or(i64::MAX), c.name_any()));
        list
    }
}

/// A watch that fails is retried with backoff; meanwhile the index may lag,
/// so say so.
fn log_watch_error<T>(kind: &'static str, r: Result<T, watcher::Error>) -> futures::future::Ready<()> {
    if let Err(e) = r {
        tracing::warn!(kind, error = %e, "watch failed; the index may lag until it is back");
    }
    futures::future::ready(())
}

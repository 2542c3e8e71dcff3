//! What the gateway knows without asking: every Sandbox (found by session
//! id) and every Command, kept current by watches. A Command just created
//! may not be here yet; routes that need it read it from the API then.

use std::sync::Arc;

use futures::StreamExt;
use hangar_crds::{Command, Sandbox};
use hangar_runtime::controllers::lean;
use hangar_runtime::kube_ext::log_watch_errors;
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
        // Cached without managedFields (`lean`): nothing here reads them,
        // and they are a large part of each object; the cache holds every
        // Command of the cluster.
        let sandboxes_watch = watcher(Api::<Sandbox>::all(client.clone()), watcher::Config::default()).modify(lean);
        let commands_watch = watcher(Api::<Command>::all(client), watcher::Config::default()).modify(lean);
        let s = reflector::reflector(sw, sandboxes_watch);
        let c = reflector::reflector(cw, commands_watch);
        tokio::spawn(s.default_backoff().for_each(log_watch_errors("Sandbox")));
        tokio::spawn(c.default_backoff().for_each(log_watch_errors("Command")));
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

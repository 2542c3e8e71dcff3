//! Everything a reconcile needs, built once at start-up.

use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::Client;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::Store;

use crate::ec2::Ec2;
use crate::ec2::watcher::InstanceWatcher;
use crate::keys::OrgKey;
use crate::metrics::Metrics;
use crate::settings::Settings;

pub struct Context {
    pub client: Client,
    pub settings: Arc<Settings>,
    pub ec2: Ec2,
    pub instances: InstanceWatcher,
    /// Trimmed to the fields a pass reads (`lifecycle::cached_fields`).
    pub nodes: Store<Node>,
    pub leases: Store<Lease>,
    /// Every Command, for the per-session counts in the Sandbox status.
    pub commands: Store<hangar_crds::Command>,
    /// The Pods hangar manages (agent Pods, by label), trimmed to the
    /// fields a pass reads (`lifecycle::cached_fields`).
    pub pods: Store<Pod>,
    /// The workers' output-key hand-offs, names only (no key material is
    /// held here): whether one is there to seal, without a read.
    pub handoffs: Store<PartialObjectMeta<Secret>>,
    /// Where the signed session certificates are kept.
    pub output_store: hangar_output::OutputStore,
    /// Seals the workspace keys (the operator's alone).
    pub org_key: OrgKey,
    /// Seals the output keys (shared with the gateway, which reads output).
    pub output_kek: OrgKey,
    /// Events, written off the reconcile path.
    pub events: hangar_runtime::events::EventQueue,
    pub metrics: Arc<Metrics>,
    /// Consecutive failed reconciles per `namespace/name`, for backoff.
    pub failures: std::sync::Mutex<std::collections::HashMap<String, u32>>,
    pub numbering: crate::numbering_state::NumberingState,
    /// (session, attempt) whose output key is settled (sealed, or an ended
    /// attempt that never made one): no need to look again.
    pub sealed_output_keys: std::sync::Mutex<std::collections::HashSet<(String, i64)>>,
    /// This operator's own status writes not yet seen by its watch, and
    /// refused ones: whether a cached Sandbox can be acted on.
    pub own_writes: crate::own_writes::OwnWrites<hangar_crds::Sandbox>,
    /// The SessionToken controller's cache, once it runs: the command
    /// controller asks it whether a sender's token has ended.
    pub tokens: std::sync::OnceLock<Store<hangar_crds::SessionToken>>,
    /// The image preflights: cached by image, run in the background.
    pub preflights: Arc<crate::images::preflights::Preflights>,
    /// The public keys template releases are signed with.
    pub trusted_keys: hangar_keys::template_signing::TrustedKeys,
    /// The Sandbox controller's cache, once it runs.
    pub sandboxes: std::sync::OnceLock<Store<hangar_crds::Sandbox>>,
    /// Unix seconds when this process began to lead: a command stored
    /// before then without a written place was admitted by a leader before.
    pub leading_since: i64,
    /// Wakes the session nodes waiting on their session's commands.
    pub commands_feed: crate::node::commands_feed::Changes,
}

impl Context {
    /// Exponential backoff for a failing session: 1 s, 2 s, 4 s … 60 s.
    pub fn backoff(&self, key: &str) -> std::time::Duration {
        let mut f = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let n = f.entry(key.to_owned()).or_insert(0);
        *n = n.saturating_add(1);
        std::time::Duration::from_secs(1u64 << (*n - 1).min(6)).min(std::time::Duration::from_secs(60))
    }

    pub fn is_sealed(&self, session_id: &str, attempt: i64) -> bool {
        self.sealed_output_keys.lock().unwrap_or_else(|p| p.into_inner()).contains(&(session_id.to_owned(), attempt))
    }

    pub fn mark_sealed(&self, session_id: &str, attempt: i64) {
        self.sealed_output_keys.lock().unwrap_or_else(|p| p.into_inner()).insert((session_id.to_owned(), attempt));
    }

    /// Records the Sandbox as this operator's status write to `key` stored
    /// it: passes act on it until the watch shows it.
    pub fn wrote(&self, key: &str, mut stored: hangar_crds::Sandbox) {
        hangar_runtime::controllers::lean(&mut stored);
        let resource_version = stored.metadata.resource_version.clone();
        self.own_writes.wrote(key, resource_version, std::sync::Arc::new(stored));
    }

    pub fn succeeded(&self, key: &str) {
        self.failures.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
    }
}

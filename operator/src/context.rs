//! Everything a reconcile needs, built once at start-up.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::Store;

use crate::ec2::Ec2;
use crate::ec2::watcher::InstanceWatcher;
use crate::keys::OrgKey;
use crate::settings::Settings;

pub struct Context {
    pub client: Client,
    pub settings: Arc<Settings>,
    pub ec2: Ec2,
    pub instances: InstanceWatcher,
    pub nodes: Store<Node>,
    pub leases: Store<Lease>,
    /// Every Command, for the per-session counts in the Sandbox status.
    pub commands: Store<hangar_crds::Command>,
    pub org_key: OrgKey,
    pub recorder: Recorder,
    pub metrics: Metrics,
    /// Consecutive failed reconciles per `namespace/name`, for backoff.
    pub failures: std::sync::Mutex<std::collections::HashMap<String, u32>>,
    pub numbering: crate::commands::NumberingState,
    /// (session, attempt) whose output key is settled (sealed, or an ended
    /// attempt that never made one): no need to look again.
    pub sealed_output_keys: std::sync::Mutex<std::collections::HashSet<(String, i64)>>,
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

    pub fn succeeded(&self, key: &str) {
        self.failures.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
    }
}

/// Latency samples (milliseconds) of the operator's own steps, exported on
/// /metrics for the benchmark.
#[derive(Default)]
pub struct Metrics {
    pub reconciles: AtomicU64,
    pub reconcile_errors: AtomicU64,
    pub samples: std::sync::Mutex<Samples>,
    /// Per session: when its node was first seen Ready in this attempt.
    pub first_seen: std::sync::Mutex<std::collections::HashMap<String, FirstSeen>>,
    /// Per `namespace/name`: when the last related watch event arrived.
    pub trigger_at: std::sync::Mutex<std::collections::HashMap<String, i64>>,
}

#[derive(Default, Clone, Copy, Debug)]
pub struct FirstSeen {
    pub attempt: i64,
    pub node_ready: Option<i64>,
}

#[derive(Default, Clone, Debug)]
pub struct Samples {
    /// When RunInstances was called, per `namespace/name` (epoch ms): the
    /// benchmark subtracts the time its create call returned.
    pub run_instances_at_ms: std::collections::BTreeMap<String, i64>,
    /// Node Ready first observed → phase running written.
    pub node_ready_to_running_ms: Vec<u64>,
    /// The watch event (node, heartbeat Lease, agent Pod) that completed the
    /// prerequisites arrived → phase running written: the operator's own
    /// overhead.
    pub event_to_running_ms: Vec<u64>,
    /// Worker reported workspace closed → StopInstances called.
    pub workspace_closed_to_stop_ms: Vec<u64>,
}

impl Metrics {
    pub fn triggered(&self, namespace: &str, name: &str) {
        let now = k8s_openapi::jiff::Timestamp::now().as_millisecond();
        if let Ok(mut m) = self.trigger_at.lock() {
            m.insert(format!("{namespace}/{name}"), now);
        }
    }

    pub fn last_trigger(&self, namespace: &str, name: &str) -> Option<i64> {
        self.trigger_at.lock().ok()?.get(&format!("{namespace}/{name}")).copied()
    }

    pub fn record(&self, f: impl FnOnce(&mut Samples)) {
        if let Ok(mut s) = self.samples.lock() {
            f(&mut s);
        }
    }
}

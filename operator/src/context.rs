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
    pub org_key: OrgKey,
    pub recorder: Recorder,
    pub metrics: Metrics,
}

/// Latency samples (milliseconds) of the operator's own steps, exported on
/// /metrics for the benchmark.
#[derive(Default)]
pub struct Metrics {
    pub reconciles: AtomicU64,
    pub reconcile_errors: AtomicU64,
    pub samples: std::sync::Mutex<Samples>,
}

#[derive(Default, Clone, Debug)]
pub struct Samples {
    /// Sandbox created → RunInstances called.
    pub apply_to_run_instances_ms: Vec<u64>,
    /// Node Ready → phase running written.
    pub node_ready_to_running_ms: Vec<u64>,
    /// Worker reported workspace closed → StopInstances called.
    pub workspace_closed_to_stop_ms: Vec<u64>,
}

impl Metrics {
    pub fn record(&self, f: impl FnOnce(&mut Samples)) {
        if let Ok(mut s) = self.samples.lock() {
            f(&mut s);
        }
    }
}

//! The operator's metrics, in one prometheus-client registry served on
//! `/metrics`: reconciles, EC2 calls by kind, throttling, instances
//! watched, and the latencies of its own steps as histograms.
//!
//! The benchmark needs exact quantiles, so the latency samples are also
//! kept raw (bounded) and served as JSON on `/debug/samples`, apart from
//! the exposition format.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use serde::Serialize;

use crate::ec2::CallCounts;

/// Raw samples kept per series; older ones are dropped first.
const MAX_SAMPLES: usize = 100_000;
/// Namespace and tenant pairs the billing series name; any more are
/// counted under `other`, so a cluster of many tenants cannot grow the
/// exposition without bound.
const MAX_BILLED_PAIRS: usize = 500;

pub struct Metrics {
    pub reconciles: Counter,
    pub reconcile_errors: Counter,
    /// Passes that acted on the operator's own written copy (the cached
    /// Sandbox predated that write), and status writes refused as decided
    /// from a stale copy.
    pub acted_on_written_copy: Counter,
    pub status_conflicts: Counter,
    pub watched_instances: Gauge,
    /// Image preflights run (a cached result runs none).
    pub image_preflight_checks: Counter,
    /// Key Secrets found under a session's name that hangar did not make
    /// (they do not open under the organisation key for that session).
    pub foreign_key_secrets: Counter,
    /// Session nodes' requests for commands refused (another session's,
    /// or not a node account).
    pub node_commands_refused: Counter,
    /// Cents billed by ended sessions, by namespace, tenant and part
    /// (`minimum`, `compute`, `idle`, `storage`; idle is within compute).
    billed_cents: Family<Vec<(String, String)>, Counter>,
    billed_pairs: Mutex<std::collections::HashSet<(String, String)>>,
    /// Workspace key requests by result: `granted` or the refusal's reason.
    workspace_key_requests: Family<Vec<(String, String)>, Counter>,
    /// Key request received → key sent, for granted ones.
    workspace_key_handover: Histogram,
    node_ready_to_running: Histogram,
    event_to_running: Histogram,
    reconcile_duration: Histogram,
    workspace_closed_to_stop: Histogram,
    samples: Mutex<Samples>,
    /// Per session: when its node was first seen Ready in this attempt.
    pub first_seen: Mutex<HashMap<String, FirstSeen>>,
    /// Per `namespace/name`: when the last related watch event arrived.
    trigger_at: Mutex<HashMap<String, i64>>,
}

#[derive(Default, Clone, Copy, Debug)]
pub struct FirstSeen {
    pub attempt: i64,
    pub node_ready: Option<i64>,
}

/// What `/debug/samples` serves (milliseconds).
#[derive(Default, Clone, Debug, Serialize)]
pub struct Samples {
    /// When RunInstances was called, per `namespace/name` (epoch ms): the
    /// benchmark subtracts the time its create call returned.
    pub run_instances_at_ms: BTreeMap<String, i64>,
    /// Node Ready first observed → phase running written.
    pub node_ready_to_running_ms: VecDeque<u64>,
    /// The watch event (node, heartbeat Lease, agent Pod) that completed the
    /// prerequisites arrived → phase running written: the operator's own
    /// overhead.
    pub event_to_running_ms: VecDeque<u64>,
    /// The same, split: that event → the start of the pass that wrote
    /// running (waiting behind a pass of the same session, or a requeue)…
    pub event_to_pass_ms: VecDeque<u64>,
    /// … and that pass's start (or the event, if later) → running decided.
    pub pass_to_running_ms: VecDeque<u64>,
    /// One Sandbox reconcile, start to end (microseconds: most take less
    /// than a millisecond).
    pub reconcile_us: VecDeque<u64>,
    /// Worker reported workspace closed → StopInstances called.
    pub workspace_closed_to_stop_ms: VecDeque<u64>,
}

fn latency_buckets() -> impl Iterator<Item = f64> {
    // 1 ms … ~65 s.
    prometheus_client::metrics::histogram::exponential_buckets(0.001, 2.0, 17)
}

fn push(v: &mut VecDeque<u64>, ms: u64) {
    if v.len() >= MAX_SAMPLES {
        v.pop_front();
    }
    v.push_back(ms);
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            reconciles: Counter::default(),
            reconcile_errors: Counter::default(),
            acted_on_written_copy: Counter::default(),
            status_conflicts: Counter::default(),
            watched_instances: Gauge::default(),
            image_preflight_checks: Counter::default(),
            foreign_key_secrets: Counter::default(),
            node_commands_refused: Counter::default(),
            billed_cents: Family::default(),
            billed_pairs: Mutex::default(),
            workspace_key_requests: Family::default(),
            workspace_key_handover: Histogram::new(latency_buckets()),
            node_ready_to_running: Histogram::new(latency_buckets()),
            event_to_running: Histogram::new(latency_buckets()),
            reconcile_duration: Histogram::new(latency_buckets()),
            workspace_closed_to_stop: Histogram::new(latency_buckets()),
            samples: Mutex::default(),
            first_seen: Mutex::default(),
            trigger_at: Mutex::default(),
        }
    }
}

impl Metrics {
    /// Registers every series under the `hangar` prefix.
    pub fn register(&self, registry: &mut Registry, ec2: &CallCounts) {
        registry.register("reconciles", "Sandbox reconciles run", self.reconciles.clone());
        registry.register("reconcile_errors", "Sandbox reconciles that failed", self.reconcile_errors.clone());
        registry.register(
            "acted_on_written_copy",
            "Passes that acted on the operator's own last status write, the watch not having shown it yet",
            self.acted_on_written_copy.clone(),
        );
        registry.register(
            "status_conflicts",
            "Status writes refused as decided from a stale copy (the pass runs again)",
            self.status_conflicts.clone(),
        );
        registry.register("watched_instances", "EC2 instances the watcher knows", self.watched_instances.clone());
        registry.register(
            "image_preflight_checks",
            "Image preflights run against a registry (cached results run none)",
            self.image_preflight_checks.clone(),
        );
        registry.register(
            "foreign_key_secrets",
            "Session key Secrets hangar did not make, found and refused",
            self.foreign_key_secrets.clone(),
        );
        registry.register(
            "node_commands_refused",
            "Requests for a session's commands refused (not that session's node)",
            self.node_commands_refused.clone(),
        );
        registry.register(
            "billed_cents",
            "Cents billed by ended sessions, by namespace, tenant and part (idle is within compute)",
            self.billed_cents.clone(),
        );
        registry.register(
            "workspace_key_requests",
            "Workspace key requests, by result (granted, or why refused)",
            self.workspace_key_requests.clone(),
        );
        registry.register_with_unit(
            "workspace_key_handover",
            "Workspace key request received to key sent (granted requests)",
            Unit::Seconds,
            self.workspace_key_handover.clone(),
        );
        registry.register("ec2_mutating_calls", "EC2 calls that change something", ec2.mutating.clone());
        registry.register(
            "ec2_describe_instances_calls",
            "EC2 DescribeInstances calls",
            ec2.describe_instances.clone(),
        );
        registry.register("ec2_describe_other_calls", "Other EC2 Describe calls", ec2.describe_other.clone());
        registry.register("ec2_throttled", "EC2 calls answered with throttling", ec2.throttled.clone());
        registry.register_with_unit(
            "node_ready_to_running",
            "Node Ready first seen to phase running written",
            Unit::Seconds,
            self.node_ready_to_running.clone(),
        );
        registry.register_with_unit(
            "event_to_running",
            "Last prerequisite watch event to phase running written",
            Unit::Seconds,
            self.event_to_running.clone(),
        );
        registry.register_with_unit(
            "reconcile_duration",
            "One Sandbox reconcile, start to end",
            Unit::Seconds,
            self.reconcile_duration.clone(),
        );
        registry.register_with_unit(
            "workspace_closed_to_stop",
            "Workspace closed reported to StopInstances called",
            Unit::Seconds,
            self.workspace_closed_to_stop.clone(),
        );
    }

    pub fn workspace_key_granted(&self, took: std::time::Duration) {
        self.workspace_key_requests.get_or_create(&vec![("result".into(), "granted".into())]).inc();
        self.workspace_key_handover.observe(took.as_secs_f64());
    }

    /// Counts an ended session's trued-up record, once, when its end is
    /// written.
    pub fn billed(&self, namespace: &str, tenant: Option<&str>, record: &hangar_crds::sandbox::Billing) {
        let tenant = tenant.unwrap_or("").to_owned();
        let (namespace, tenant) = {
            let mut pairs = self.billed_pairs.lock().unwrap_or_else(|p| p.into_inner());
            let pair = (namespace.to_owned(), tenant);
            if pairs.contains(&pair) || pairs.len() < MAX_BILLED_PAIRS {
                pairs.insert(pair.clone());
                pair
            } else {
                ("other".to_owned(), "other".to_owned())
            }
        };
        // The minimum is in the total only once the instance has run.
        let (compute, storage) = (record.compute_cents.unwrap_or(0), record.storage_cents.unwrap_or(0));
        let minimum = record.total_cents.map(|total| total - compute - storage);
        for (part, cents) in [
            ("minimum", minimum),
            ("compute", record.compute_cents),
            ("idle", record.idle_cents),
            ("storage", record.storage_cents),
        ] {
            let labels = vec![
                ("namespace".into(), namespace.clone()),
                ("tenant".into(), tenant.clone()),
                ("part".into(), part.into()),
            ];
            self.billed_cents.get_or_create(&labels).inc_by(cents.unwrap_or(0).max(0) as u64);
        }
    }

    pub fn workspace_key_refused(&self, reason: &str) {
        self.workspace_key_requests.get_or_create(&vec![("result".into(), reason.into())]).inc();
    }

    pub fn triggered(&self, namespace: &str, name: &str) {
        let now = k8s_openapi::jiff::Timestamp::now().as_millisecond();
        self.trigger_at.lock().unwrap_or_else(|p| p.into_inner()).insert(format!("{namespace}/{name}"), now);
    }

    pub fn last_trigger(&self, namespace: &str, name: &str) -> Option<i64> {
        self.trigger_at.lock().unwrap_or_else(|p| p.into_inner()).get(&format!("{namespace}/{name}")).copied()
    }

    pub fn run_instances_called(&self, key: String, at_ms: i64) {
        self.samples.lock().unwrap_or_else(|p| p.into_inner()).run_instances_at_ms.insert(key, at_ms);
    }

    pub fn node_ready_to_running(&self, ms: u64) {
        self.node_ready_to_running.observe(ms as f64 / 1000.0);
        push(&mut self.samples.lock().unwrap_or_else(|p| p.into_inner()).node_ready_to_running_ms, ms);
    }

    /// Last watch event → running, with the part spent waiting for the
    /// pass that wrote it (`queued`, at most `total`).
    pub fn event_to_running(&self, total: u64, queued: u64) {
        self.event_to_running.observe(total as f64 / 1000.0);
        let mut samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        push(&mut samples.event_to_running_ms, total);
        push(&mut samples.event_to_pass_ms, queued);
        push(&mut samples.pass_to_running_ms, total - queued);
    }

    pub fn reconciled(&self, took: std::time::Duration) {
        self.reconcile_duration.observe(took.as_secs_f64());
        push(&mut self.samples.lock().unwrap_or_else(|p| p.into_inner()).reconcile_us, took.as_micros() as u64);
    }

    pub fn workspace_closed_to_stop(&self, ms: u64) {
        self.workspace_closed_to_stop.observe(ms as f64 / 1000.0);
        push(&mut self.samples.lock().unwrap_or_else(|p| p.into_inner()).workspace_closed_to_stop_ms, ms);
    }

    pub fn samples(&self) -> Samples {
        self.samples.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

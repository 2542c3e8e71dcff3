//! The worker's series, on its admin server's `/metrics`: commands it
//! settled by final phase, output bytes it stored, heartbeats that failed.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Clone, Default)]
pub struct WorkerMetrics {
    finished: Family<PhaseLabel, Counter>,
    output_bytes: Counter,
    heartbeat_failures: Counter,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabel {
    phase: &'static str,
}

impl WorkerMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register("commands_finished", "Commands this worker settled, by final phase", self.finished.clone());
        registry.register("output_bytes_stored", "Command output bytes stored", self.output_bytes.clone());
        registry.register("heartbeat_failures", "Heartbeat renewals that failed", self.heartbeat_failures.clone());
    }

    pub fn finished(&self, phase: &'static str, output_bytes: u64) {
        self.finished.get_or_create(&PhaseLabel { phase }).inc();
        self.output_bytes.inc_by(output_bytes);
    }

    pub fn heartbeat_failed(&self) {
        self.heartbeat_failures.inc();
    }
}

//! The webhook's own series: admissions by kind and decision (allowed, or
//! the refusal's contract code).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Clone, Default)]
pub struct AdmissionMetrics {
    admissions: Family<AdmissionLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AdmissionLabels {
    kind: &'static str,
    /// `allowed`, or the refusal's error code.
    decision: &'static str,
}

impl AdmissionMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register("admissions", "Admission reviews decided", self.admissions.clone());
    }

    pub fn decided(&self, kind: &'static str, refused_with: Option<&'static str>) {
        self.admissions.get_or_create(&AdmissionLabels { kind, decision: refused_with.unwrap_or("allowed") }).inc();
    }
}

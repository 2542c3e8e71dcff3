//! hangar-webhook: the admission rules a CRD schema cannot express, served
//! to the apiserver over TLS.
//!
//! - `admission/`: AdmissionReview in and out (`review`), and one module per
//!   kind with its rules (`commands`): each splits into a pure decision,
//!   unit-tested in `hangar-core`, and the reads it needs.
//!
//! - `metrics`: admissions by kind and decision.
//!
//! The HTTPS listener and the admin server are `hangar_runtime`'s.

pub mod admission;
pub mod metrics;

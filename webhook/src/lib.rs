//! hangar-webhook: the admission rules a CRD schema cannot express, served
//! to the apiserver over TLS.
//!
//! - `admission/`: AdmissionReview in and out (`review`), and one module per
//!   kind with its rules (`commands`): each splits into a pure decision,
//!   unit-tested, and the reads it needs;
//! - `tls`: the HTTPS listener (shared with the gateway).

pub mod admission;
pub mod tls;

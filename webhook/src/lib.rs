//! hangar-webhook: the admission rules a CRD schema cannot express, served
//! to the apiserver over TLS.
//!
//! - `admission/`: AdmissionReview in and out (`review`), and one module per
//!   kind with its rules (`commands`): each splits into a pure decision,
//!   unit-tested in `hangar-core`, and the reads it needs.
//!
//! The HTTPS listener is `hangar_runtime::https`.

pub mod admission;

//! hangar-webhook: the admission rules a CRD schema cannot express, served
//! to the apiserver over TLS.
//!
//! - `admission/`: AdmissionReview in and out (`review`), and one module per
//!   kind with its rules (`commands`): each splits into a pure decision,
//!   unit-tested, and the reads it needs;
//! - `tls`: the HTTPS listener (shared with the gateway).

pub mod admission;
pub mod tls;

/// What every hangar HTTPS server does first: structured logs filtered by
/// `RUST_LOG` (default info), and ring as the one TLS crypto provider (the
/// workspace also links aws-lc-rs, so rustls cannot pick by itself).
pub fn init_process() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt().with_env_filter(filter).with_target(false).init();
    let _ = rustls::crypto::ring::default_provider().install_default();
}

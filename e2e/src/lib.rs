//! The local stack for end-to-end tests and `make up`: a real etcd and
//! kube-apiserver (built from their Go modules), moto for EC2 and S3, and
//! helpers to drive them with kubectl and helm.
//!
//! Everything binds to 127.0.0.1 on free ports, and every process is killed
//! when its owner drops it or when the test process dies.

pub mod agent_sandbox;
pub mod bench;
pub mod build;
pub mod chart;
pub mod commands;
pub mod control_plane;
pub mod cut_proxy;
pub mod ec2;
pub mod ec2_faults;
pub mod ec2_stub;
pub mod error;
pub mod eventbridge;
pub mod gateway;
pub mod images;
pub mod imds;
pub mod kwok;
pub mod light_nodes;
pub mod metrics_text;
pub mod moto;
pub mod node_sim;
pub mod operator;
pub mod paths;
pub mod pki;
pub mod process;
pub mod real_node;
pub mod real_stack;
pub mod registry;
pub mod release;
pub mod scrape;
pub mod session_nodes;
pub mod sessions;
pub mod stack;
pub mod templates;
pub mod webhook;
pub mod workspace_keys;

use std::sync::OnceLock;

pub use control_plane::ControlPlane;
pub use error::{HarnessError, Result};
pub use moto::Moto;
pub use stack::{LocalStack, StackOptions, shared_stack};

/// One control plane per test binary, started on first use and killed when
/// the binary exits. Tests isolate themselves by namespace.
pub fn shared_control_plane() -> &'static ControlPlane {
    static CP: OnceLock<ControlPlane> = OnceLock::new();
    CP.get_or_init(|| ControlPlane::start().unwrap_or_else(|e| panic!("start the local control plane: {e}")))
}

/// Logs to stderr at `RUST_LOG` (default `info`), once per process.
pub fn init_tracing() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        // The readiness poll expects 500s from a starting apiserver; kube
        // logs each one as an error, which is noise here.
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| "info,kube_client::client::builder=off".into());
        let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
    });
}

/// kube uses rustls with ring, the AWS SDK brings aws-lc-rs: with both in
/// the build, rustls needs to be told which one is the process default.
pub fn install_crypto_provider() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

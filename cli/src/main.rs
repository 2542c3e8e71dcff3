//! `hangar` (also installed as `kubectl-hangar`, so `kubectl hangar …`).
//!
//! - `hangar cert verify FILE --key PUB`: checks a session certificate
//!   offline against the platform's public key (base64, or `@file`); exit
//!   status 0 only when it verifies, and prints what it certifies.
//! - `hangar cert get SANDBOX [-n NS] [-o FILE]`: fetches a session's
//!   certificate from the gateway (`--gateway`, `--gateway-ca`, a bearer
//!   token for the gateway's audience in `HANGAR_GATEWAY_TOKEN`), resolving
//!   the Sandbox's name through the kubeconfig's cluster.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod certificate;
mod gateway;

#[derive(Parser)]
#[command(name = "hangar", version, about = "Agent sandbox sessions on Kubernetes")]
struct Cli {
    #[command(subcommand)]
    command: Verb,
}

#[derive(Subcommand)]
enum Verb {
    /// Session certificates.
    #[command(subcommand)]
    Cert(CertVerb),
}

#[derive(Subcommand)]
enum CertVerb {
    /// Checks a certificate file offline; exit status 1 when it does not verify.
    Verify {
        file: PathBuf,
        /// The signing key's public key: base64 of its 32 bytes, or @FILE.
        #[arg(long)]
        key: String,
    },
    /// Fetches a session's signed certificate from the gateway.
    Get {
        sandbox: String,
        #[arg(short, long, env = "HANGAR_NAMESPACE", default_value = "default")]
        namespace: String,
        /// Write it here instead of stdout.
        #[arg(short, long)]
        output: Option<PathBuf>,
        #[command(flatten)]
        gateway: gateway::GatewayArgs,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}: {1}")]
    File(String, std::io::Error),
    #[error("the certificate does not verify: {0}")]
    Refused(#[from] hangar_keys::session_certificate::CertificateRejection),
    #[error("Kubernetes: {0}")]
    Kube(#[from] kube::Error),
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
    #[error("sandbox {0} not found in namespace {1}")]
    NoSandbox(String, String),
    #[error("gateway: {0}")]
    Gateway(String),
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // One TLS provider for the kube client and the gateway's.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let result = match cli.command {
        Verb::Cert(CertVerb::Verify { file, key }) => certificate::verify(&file, &key),
        Verb::Cert(CertVerb::Get { sandbox, namespace, output, gateway }) => {
            certificate::get(&sandbox, &namespace, output.as_deref(), &gateway).await
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hangar: {e}");
            ExitCode::FAILURE
        }
    }
}

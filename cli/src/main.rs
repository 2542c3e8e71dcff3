//! `hangar` (also installed as `kubectl-hangar`, so `kubectl hangar …`).
//!
//! Sessions through the Kubernetes API (the kubeconfig's user; RBAC
//! decides): `create`, `pause`, `resume`, `stop`, each waiting for the
//! phase with progress on stderr. Commands and tokens through the gateway
//! (`--gateway`, `--gateway-ca`, a member token for the gateway's audience
//! in `HANGAR_GATEWAY_TOKEN`): `exec -- argv…` streams the output by
//! offset and survives a dropped connection, `logs`, `token create`.
//! Session certificates: `cert get`, and `cert verify` offline.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

mod certificate;
mod gateway;
mod output;
mod session;
mod token;

use gateway::{Gateway, GatewayArgs};

#[derive(Parser)]
#[command(name = "hangar", version, about = "Agent sandbox sessions on Kubernetes")]
struct Cli {
    #[arg(short, long, global = true, env = "HANGAR_NAMESPACE", default_value = "default")]
    namespace: String,
    /// How long a verb that waits for a phase waits, in seconds.
    #[arg(long, global = true, default_value_t = 600)]
    wait_seconds: u64,
    #[command(subcommand)]
    verb: Verb,
}

#[derive(Subcommand)]
enum Verb {
    /// Creates a session and waits until it runs.
    Create(session::CreateArgs),
    /// Pauses a session (mode commands) and waits until it is paused.
    Pause { sandbox: String },
    /// Resumes a paused session on its instance and waits until it runs.
    Resume { sandbox: String },
    /// Ends a session and waits until its reset is complete.
    Stop { sandbox: String },
    /// Sends a command and prints its output as it comes (stdout, stderr);
    /// exits with its exit code.
    Exec {
        sandbox: String,
        #[arg(long)]
        timeout_seconds: Option<i64>,
        #[command(flatten)]
        gateway: GatewayArgs,
        #[arg(last = true, required = true)]
        argv: Vec<String>,
    },
    /// Prints a command's output past a byte offset, until it ends.
    Logs {
        command: String,
        #[arg(long, default_value_t = 0)]
        after: u64,
        #[command(flatten)]
        gateway: GatewayArgs,
    },
    /// Session tokens.
    #[command(subcommand)]
    Token(TokenVerb),
    /// Session certificates.
    #[command(subcommand)]
    Cert(CertVerb),
}

#[derive(Subcommand)]
enum TokenVerb {
    /// Mints a token; prints it once.
    Create {
        #[command(flatten)]
        token: token::TokenArgs,
        #[command(flatten)]
        gateway: GatewayArgs,
    },
}

#[derive(Subcommand)]
enum CertVerb {
    /// Checks a certificate file offline; exit status 1 when it does not verify.
    Verify {
        file: PathBuf,
        /// The signing key's public key (base64 of its 32 bytes), or @FILE
        /// with it or with a key set from `hangar cert keys`.
        #[arg(long)]
        key: String,
    },
    /// Prints every key that has signed a certificate, by id (a key set
    /// for `verify --key @FILE`).
    Keys {
        #[command(flatten)]
        gateway: GatewayArgs,
    },
    /// Fetches a session's signed certificate from the gateway.
    Get {
        sandbox: String,
        /// Write it here instead of stdout.
        #[arg(short, long)]
        output: Option<PathBuf>,
        #[command(flatten)]
        gateway: GatewayArgs,
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
    #[error("watching: {0}")]
    Watch(String),
    #[error("sandbox {0} not found in namespace {1}")]
    NoSandbox(String, String),
    #[error("command {0} not found in namespace {1}")]
    NoCommand(String, String),
    #[error("{0} did not get there within {1:?}")]
    Timeout(String, Duration),
    #[error("{0} ended instead ({1})")]
    Ended(String, String),
    #[error("invalid: {0}")]
    Invalid(String),
    #[error("gateway: {0}")]
    Gateway(String),
}

async fn run(cli: Cli) -> Result<u8, CliError> {
    let ns = cli.namespace.as_str();
    let wait = Duration::from_secs(cli.wait_seconds);
    match cli.verb {
        Verb::Create(args) => session::create(&session::sandboxes(ns).await?, &args, wait).await?,
        Verb::Pause { sandbox } => session::set_state(&session::sandboxes(ns).await?, &sandbox, "Paused", wait).await?,
        Verb::Resume { sandbox } => {
            session::set_state(&session::sandboxes(ns).await?, &sandbox, "Running", wait).await?
        }
        Verb::Stop { sandbox } => session::set_state(&session::sandboxes(ns).await?, &sandbox, "Ended", wait).await?,
        Verb::Exec { sandbox, timeout_seconds, gateway, argv } => {
            let sid = session::session_id(&session::sandboxes(ns).await?, &sandbox, ns).await?;
            let gateway = Gateway::new(&gateway)?;
            let mut body = serde_json::json!({"argv": argv});
            if let Some(t) = timeout_seconds {
                body["timeoutSeconds"] = t.into();
            }
            // One key for every try: a send whose answer was lost is
            // answered, not sent again.
            let key = format!("{:032x}", u128::from_le_bytes(random()?));
            let sent = gateway.post_json(&format!("/v1/sandboxes/{sid}/commands"), &body, Some(&key)).await?;
            let cid = sent["id"].as_str().ok_or_else(|| CliError::Gateway(format!("no command id in {sent}")))?;
            eprintln!("hangar: command {cid} sent");
            return output::stream(&gateway, &sid, cid, 0).await;
        }
        Verb::Logs { command, after, gateway } => {
            let client = kube::Client::try_default().await?;
            let commands: kube::Api<hangar_crds::Command> = kube::Api::namespaced(client, ns);
            let c = commands.get_opt(&command).await?.ok_or_else(|| CliError::NoCommand(command.clone(), ns.into()))?;
            let sid = session::session_id(&session::sandboxes(ns).await?, &c.spec.sandbox, ns).await?;
            return output::stream(&Gateway::new(&gateway)?, &sid, &command, after).await;
        }
        Verb::Token(TokenVerb::Create { token, gateway }) => {
            let sid = session::session_id(&session::sandboxes(ns).await?, &token.sandbox, ns).await?;
            token::create(&Gateway::new(&gateway)?, &sid, &token).await?
        }
        Verb::Cert(CertVerb::Verify { file, key }) => certificate::verify(&file, &key)?,
        Verb::Cert(CertVerb::Keys { gateway }) => certificate::keys(&gateway).await?,
        Verb::Cert(CertVerb::Get { sandbox, output, gateway }) => {
            let sid = session::session_id(&session::sandboxes(ns).await?, &sandbox, ns).await?;
            certificate::get(&sid, output.as_deref(), &gateway).await?
        }
    }
    Ok(0)
}

fn random() -> Result<[u8; 16], CliError> {
    hangar_keys::random_bytes::<16>().map_err(|e| CliError::Invalid(e.to_string()))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // One TLS provider for the kube client and the gateway's.
    let _ = rustls::crypto::ring::default_provider().install_default();
    match run(cli).await {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("hangar: {e}");
            ExitCode::FAILURE
        }
    }
}

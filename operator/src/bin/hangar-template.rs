//! hangar-template: makes a template release signing key and signs
//! SandboxTemplate manifests with it (the examples are signed this way).
//!
//!   hangar-template keygen --out release.key      # prints the public key
//!   hangar-template public-key --key release.key
//!   hangar-template sign --key release.key --key-name hangar-release template.yaml > signed.yaml
//!
//! The platform trusts the public key under its name (chart value
//! `templates.trustedKeys`); the signing key stays with the release
//! pipeline. `sign` fills `spec.signature` and `spec.signedBy`.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use hangar_crds::SandboxTemplate;
use hangar_keys::template_signing;

#[derive(Parser)]
#[command(version, about = "Sign hangar SandboxTemplate releases")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Make a signing key (written to --out, mode 0600); print its public key.
    Keygen {
        #[arg(long)]
        out: PathBuf,
    },
    /// Print the public key of a signing key.
    PublicKey {
        #[arg(long)]
        key: PathBuf,
    },
    /// Sign a SandboxTemplate manifest (YAML); print it signed.
    Sign {
        #[arg(long)]
        key: PathBuf,
        /// The name the platform trusts the key under.
        #[arg(long)]
        key_name: String,
        template: PathBuf,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hangar-template: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
    match cli.command {
        Cmd::Keygen { out } => {
            let (secret, public) = template_signing::generate()?;
            let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&out)?;
            f.write_all(secret.as_bytes())?;
            println!("{public}");
        }
        Cmd::PublicKey { key } => {
            let secret = zeroize::Zeroizing::new(std::fs::read_to_string(key)?);
            println!("{}", template_signing::public_key(&secret)?);
        }
        Cmd::Sign { key, key_name, template } => {
            let secret = zeroize::Zeroizing::new(std::fs::read_to_string(key)?);
            let mut t: SandboxTemplate = serde_yaml::from_str(&std::fs::read_to_string(template)?)?;
            t.spec.signed_by = key_name;
            let payload = hangar_core::templates::signing_payload(&t.spec).map_err(|r| r.message())?;
            t.spec.signature = template_signing::sign(&secret, &payload)?;
            print!("{}", serde_yaml::to_string(&t)?);
        }
    }
    Ok(())
}

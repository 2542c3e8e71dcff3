//! `hangar token create`: a session token minted through the gateway,
//! bound to a P-256 key made here. The plaintext is printed once (stdout)
//! and never stored; the key's PKCS#8 document goes to `--key-out` (mode
//! 0600), for signing each request's `Hangar-Proof`.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use base64::Engine;
use serde_json::json;

use crate::CliError;
use crate::gateway::Gateway;

#[derive(clap::Args)]
pub struct TokenArgs {
    pub sandbox: String,
    /// Comma-separated: read, exec, control.
    #[arg(long, value_delimiter = ',', default_value = "read")]
    pub scopes: Vec<String>,
    #[arg(long, default_value_t = 3600)]
    pub ttl: i64,
    /// The token's name (a new one by default).
    #[arg(long)]
    pub name: Option<String>,
    /// Where to write the proof key (created, never overwritten).
    #[arg(long)]
    pub key_out: PathBuf,
}

pub async fn create(gateway: &Gateway, sid: &str, args: &TokenArgs) -> Result<(), CliError> {
    let (signer, pkcs8) = hangar_keys::proof::Signer::generate_keeping();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&args.key_out)
        .map_err(|e| CliError::File(args.key_out.display().to_string(), e))?;
    let text = base64::engine::general_purpose::STANDARD.encode(pkcs8.as_slice());
    file.write_all(text.as_bytes()).map_err(|e| CliError::File(args.key_out.display().to_string(), e))?;
    let (x, y) = signer.jwk_xy();
    let suffix = u32::from_le_bytes(hangar_keys::random_bytes::<4>().map_err(|e| CliError::Invalid(e.to_string()))?);
    let name = args.name.clone().unwrap_or_else(|| format!("cli-{suffix:08x}"));
    let body = json!({
        "name": name, "scopes": args.scopes, "ttlSeconds": args.ttl,
        "publicKey": {"kty": "EC", "crv": "P-256", "x": x, "y": y},
    });
    // Shown once: a mint whose answer was lost cannot be asked again (it is
    // tried again only when it never reached the gateway).
    let minted = gateway.post_json(&format!("/v1/sandboxes/{sid}/tokens"), &body, None).await?;
    let token = minted["token"].as_str().ok_or_else(|| CliError::Gateway(format!("no token in {minted}")))?;
    eprintln!("hangar: token {name} ({}), expires {}; shown once:", args.scopes.join(","), minted["expiresAt"]);
    println!("{token}");
    Ok(())
}

//! `hangar cert verify` and `hangar cert get`.

use std::io::Write;
use std::path::Path;

use crate::CliError;
use crate::gateway::{Gateway, GatewayArgs};

fn read(path: &Path) -> Result<Vec<u8>, CliError> {
    std::fs::read(path).map_err(|e| CliError::File(path.display().to_string(), e))
}

/// The public key as given: base64 text, or `@FILE` holding it or a key
/// set (`{"keyId": "base64", …}`, as `hangar cert keys` prints), from which
/// the certificate's own key id picks one.
fn public_key(arg: &str, key_id: &str) -> Result<String, CliError> {
    let text = match arg.strip_prefix('@') {
        Some(path) => String::from_utf8_lossy(&read(Path::new(path))?).trim().to_owned(),
        None => arg.trim().to_owned(),
    };
    match serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&text) {
        Ok(set) => set
            .get(key_id)
            .and_then(|k| k.as_str())
            .map(str::to_owned)
            .ok_or_else(|| CliError::Invalid(format!("the key set has no key {key_id}"))),
        Err(_) => Ok(text),
    }
}

pub fn verify(file: &Path, key: &str) -> Result<(), CliError> {
    let bytes = read(file)?;
    let key_id = hangar_keys::session_certificate::key_id(&bytes).unwrap_or_default();
    let certificate = hangar_keys::session_certificate::verify(&bytes, &public_key(key, &key_id)?)?;
    let field = |p: &str| certificate.pointer(p).and_then(|v| v.as_str()).unwrap_or("-").to_owned();
    let jobs = certificate.get("jobs").and_then(|j| j.as_array()).map_or(0, Vec::len);
    println!(
        "verified: session {} (tenant {}), signed {} by key {key_id}; {jobs} job(s), outcome {}",
        field("/sessionId"),
        field("/start/tenant"),
        field("/signedAt"),
        field("/end/outcome"),
    );
    Ok(())
}

pub async fn get(session_id: &str, output: Option<&Path>, args: &GatewayArgs) -> Result<(), CliError> {
    let gateway = Gateway::new(args)?;
    let bytes = gateway.get(&format!("/v1/sandboxes/{session_id}/certificate")).await?;
    match output {
        Some(path) => std::fs::write(path, &bytes).map_err(|e| CliError::File(path.display().to_string(), e))?,
        None => std::io::stdout().write_all(&bytes).map_err(|e| CliError::File("stdout".into(), e))?,
    }
    Ok(())
}

/// Every published certificate key, `{"keyId": "base64"}` (stdout).
pub async fn keys(args: &GatewayArgs) -> Result<(), CliError> {
    let listed = Gateway::new(args)?.get_json("/v1/certificate-keys").await?;
    println!("{}", listed["keys"]);
    Ok(())
}

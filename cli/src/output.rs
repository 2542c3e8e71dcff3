//! `hangar exec` and `hangar logs`: a command's output streamed from the
//! gateway by byte offset. Each answer says where the next read starts; a
//! read that fails (a killed connection) is made again from the last byte
//! printed, so every byte is printed once, in order, however often the
//! connection drops.

use std::io::Write;

use base64::Engine;
use serde_json::{Value, json};

use crate::CliError;
use crate::gateway::Gateway;

/// Prints the output of command `cid` of session `sid` past `after` until
/// the command is final and everything is read; its exit status for the
/// CLI (the command's exit code when it exited, else 1).
pub async fn stream(gateway: &Gateway, sid: &str, cid: &str, mut after: u64) -> Result<u8, CliError> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let (mut out, mut err) = (std::io::stdout().lock(), std::io::stderr());
    loop {
        let body = gateway.get_json(&format!("/v1/sandboxes/{sid}/commands/{cid}/output?after={after}")).await?;
        let chunks = body["chunks"].as_array().cloned().unwrap_or_default();
        for chunk in &chunks {
            let offset = chunk["offset"].as_u64().unwrap_or(0);
            let data =
                b64.decode(chunk["data"].as_str().unwrap_or_default()).map_err(|e| CliError::Gateway(e.to_string()))?;
            let end = offset + data.len() as u64;
            if end <= after {
                continue; // printed already
            }
            let fresh = &data[after.saturating_sub(offset) as usize..];
            let sink: &mut dyn Write = if chunk["stream"] == "stderr" { &mut err } else { &mut out };
            sink.write_all(fresh).and_then(|()| sink.flush()).map_err(|e| CliError::File("output".into(), e))?;
            after = end;
        }
        if body["final"] == json!(true) && chunks.is_empty() {
            return Ok(exit_status(&body));
        }
    }
}

fn exit_status(body: &Value) -> u8 {
    let status = body["status"].as_str().unwrap_or("unknown");
    match (status, body["exitCode"].as_i64()) {
        ("exited", Some(code)) => u8::try_from(code).unwrap_or(1),
        ("exited", None) => 0,
        (other, _) => {
            eprintln!("hangar: the command ended {other}");
            1
        }
    }
}

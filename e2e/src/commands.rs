//! Helpers for tests and benchmarks that send Commands and read their
//! output: manifests, waiting for a status with a deadline, and reading the
//! stored output the way a reader holding the organisation key does.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use hangar_crds::output_keys;
use hangar_crds::{Command, CommandPhase};
use hangar_output::{AttemptKey, Chunk, OrgKey, Stream};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::operator::SYSTEM_NAMESPACE;
use crate::sessions::DEADLINE;
use crate::stack::LocalStack;

/// A Command for `sandbox` running `argv`; `spec` is merged over it.
pub fn command(name: &str, sandbox: &str, argv: &[&str], spec: Value) -> Command {
    let mut base = json!({"sandbox": sandbox, "argv": argv});
    if let (Some(b), Some(extra)) = (base.as_object_mut(), spec.as_object()) {
        b.extend(extra.clone());
    }
    serde_json::from_value(json!({
        "apiVersion": "hangar.dev/v1alpha1", "kind": "Command",
        "metadata": {"name": name}, "spec": base,
    }))
    .expect("command manifest")
}

/// `sh -c script`, the usual test command.
pub fn sh(name: &str, sandbox: &str, script: &str) -> Command {
    command(name, sandbox, &["sh", "-c", script], json!({}))
}

pub async fn create(api: &Api<Command>, c: &Command) -> Command {
    api.create(&PostParams::default(), c).await.unwrap_or_else(|e| panic!("create command: {e}"))
}

pub fn phase(c: &Command) -> Option<CommandPhase> {
    c.status.as_ref().and_then(|s| s.phase)
}

pub async fn cancel(api: &Api<Command>, name: &str) {
    let patch = json!({"spec": {"cancel": true}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("cancel");
}

/// Polls until `pred` holds; on the deadline, fails with the status and
/// the tails of the worker and supervisor logs.
pub async fn wait_command(
    stack: &LocalStack,
    api: &Api<Command>,
    name: &str,
    what: &str,
    pred: impl Fn(&Command) -> bool,
) -> Command {
    crate::sessions::wait_object(api, name, what, pred, |c| {
        format!(
            "status: {}\n{}",
            c.map(|c| serde_json::to_string_pretty(&c.status).unwrap_or_default()).unwrap_or("(gone)".into()),
            node_logs(stack)
        )
    })
    .await
}

pub async fn wait_command_phase(stack: &LocalStack, api: &Api<Command>, name: &str, want: CommandPhase) -> Command {
    wait_command(stack, api, name, want.as_str(), |c| phase(c) == Some(want)).await
}

/// The last lines of every worker and supervisor log of the stack.
pub fn node_logs(stack: &LocalStack) -> String {
    let mut out = String::new();
    if let Ok(entries) = std::fs::read_dir(stack.cp.dir()) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if (name.starts_with("worker-") || name.starts_with("supervisor-")) && name.ends_with(".log") {
                out.push_str(&format!("--- {name}\n{}\n", crate::process::tail(&e.path(), 15)));
            }
        }
    }
    out
}

/// The output keys of a session's attempts, opened with the output
/// key-encryption key from the operator's Secret; waits until `attempt`'s
/// is sealed.
pub async fn output_keys(client: &kube::Client, session_id: &str, attempt: i64) -> HashMap<u32, [u8; 32]> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let kek = secrets.get(output_keys::OUTPUT_KEK_SECRET).await.expect("output key-encryption key");
    let kek = OrgKey::from_bytes(&kek.data.expect("data")["key"].0).expect("output key-encryption key");
    let start = Instant::now();
    loop {
        let sealed = maps.get_opt(&output_keys::sealed_keys_name(session_id)).await.expect("get sealed keys");
        let data = sealed.and_then(|s| s.binary_data).unwrap_or_default();
        if data.contains_key(&output_keys::sealed_entry(attempt)) {
            return data
                .iter()
                .filter_map(|(k, v)| {
                    let a: i64 = k.strip_prefix("attempt-")?.parse().ok()?;
                    let key = kek.unseal(&v.0, &output_keys::seal_context(session_id, a)).expect("unseal");
                    Some((a as u32, key.as_slice().try_into().expect("32 bytes")))
                })
                .collect();
        }
        assert!(start.elapsed() < DEADLINE, "attempt {attempt}'s output key was never sealed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every chunk of command `number` past `after`.
pub async fn read_output(
    stack: &LocalStack,
    keys: &HashMap<u32, [u8; 32]>,
    session_id: &str,
    number: u32,
    after: u64,
) -> Vec<Chunk> {
    let key = |a: u32| keys.get(&a).map(|k| AttemptKey::from_bytes(k).expect("key"));
    stack.output_store().read_after(session_id, number, after, &key).await.expect("read output")
}

pub fn concat(chunks: &[Chunk]) -> Vec<u8> {
    chunks.iter().flat_map(|c| c.data.iter().copied()).collect()
}

/// The bytes of one stream, in order.
pub fn stream(chunks: &[Chunk], which: Stream) -> Vec<u8> {
    chunks.iter().filter(|c| c.stream == which).flat_map(|c| c.data.iter().copied()).collect()
}

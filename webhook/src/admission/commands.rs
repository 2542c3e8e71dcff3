//! Admission of a new Command: its session must exist and not have ended,
//! and the session's limits hold — at most 247 commands in all and 64 not
//! yet finished.
//!
//! Exact under concurrent creates, with any number of webhook replicas:
//! each admission reserves its place by a compare-and-swap on a counter
//! kept on the Sandbox (`hangar.dev/commands-admitted`, a JSON patch that
//! tests the value it read). The counter only grows, so it can over-count
//! (a create refused later by the apiserver) and refuse early, never
//! under-count and admit a 248th. Unfinished = admitted − finished, where
//! finished comes from a fresh list: a stale list only makes it stricter.
//! Numbers are not given here but by the operator, after the create, so a
//! create that fails later leaves no gap.

use std::time::Duration;

use hangar_crds::command::{MAX_PER_SESSION, MAX_UNFINISHED};
use hangar_crds::{Command, CommandPhase, ErrorCode, Sandbox};
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

use super::{AdmissionError, Refusal};

pub const ADMITTED_ANNOTATION: &str = "hangar.dev/commands-admitted";

/// The rules, given what was read.
pub fn decide(namespace: &str, name: &str, sandbox: Option<&Sandbox>, admitted: i64, finished: i64) -> Result<(), Refusal> {
    let Some(sandbox) = sandbox else {
        return Err(Refusal::new(ErrorCode::SandboxNotFound, format!("no Sandbox {name} in namespace {namespace}")));
    };
    if sandbox.has_ended() {
        return Err(Refusal::new(ErrorCode::SandboxEnded, format!("session {name} has ended; it takes no more commands")));
    }
    if admitted >= MAX_PER_SESSION {
        return Err(Refusal::new(
            ErrorCode::SandboxCommandLimit,
            format!("a session takes at most {MAX_PER_SESSION} commands; {name} has had {admitted}"),
        ));
    }
    if admitted - finished >= MAX_UNFINISHED {
        return Err(Refusal::new(
            ErrorCode::SandboxCommandLimit,
            format!("at most {MAX_UNFINISHED} commands of a session may be unfinished; {name} has {}", admitted - finished),
        ));
    }
    Ok(())
}

/// One admission at a time per session within this replica: concurrent
/// creates then cost one round each instead of racing on the counter (the
/// compare-and-swap still guards against other replicas).
#[derive(Default)]
pub struct SessionLocks(std::sync::Mutex<std::collections::HashMap<String, std::sync::Arc<tokio::sync::Mutex<()>>>>);

impl SessionLocks {
    fn get(&self, key: String) -> std::sync::Arc<tokio::sync::Mutex<()>> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        // Drop locks nobody holds, so the map does not grow with sessions.
        if map.len() > 1024 {
            map.retain(|_, l| std::sync::Arc::strong_count(l) > 1);
        }
        map.entry(key).or_default().clone()
    }
}

/// Reads, decides and (unless a dry run) reserves the command's place.
pub async fn admit(
    client: &kube::Client,
    locks: &SessionLocks,
    namespace: &str,
    command: &Command,
    dry_run: bool,
) -> Result<Result<(), Refusal>, AdmissionError> {
    let lock = locks.get(format!("{namespace}/{}", command.spec.sandbox));
    let _serial = lock.lock().await;
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), namespace);
    let commands: Api<Command> = Api::namespaced(client.clone(), namespace);
    let name = &command.spec.sandbox;
    for attempt in 0..64u32 {
        let sandbox = sandboxes.get_opt(name).await?;
        let (admitted, finished, counter) = match &sandbox {
            None => (0, 0, None),
            Some(s) => {
                let list = commands.list(&ListParams::default().fields(&format!("spec.sandbox={name}"))).await?.items;
                let finished = list
                    .iter()
                    .filter(|c| c.status.as_ref().and_then(|st| st.phase).is_some_and(CommandPhase::is_final))
                    .count() as i64;
                let counter = s.annotations().get(ADMITTED_ANNOTATION).and_then(|v| v.parse::<i64>().ok());
                (counter.unwrap_or(0).max(list.len() as i64), finished, counter)
            }
        };
        if let Err(refusal) = decide(namespace, name, sandbox.as_ref(), admitted, finished) {
            return Ok(Err(refusal));
        }
        if dry_run {
            return Ok(Ok(()));
        }
        let sandbox = sandbox.expect("decided it exists");
        match reserve(&sandboxes, &sandbox, counter, admitted + 1).await {
            Ok(()) => return Ok(Ok(())),
            Err(kube::Error::Api(e)) if e.code == 409 || e.code == 422 => {
                // Another admission moved the counter first: read again.
                let jitter = u64::from(attempt % 7) * 3;
                tokio::time::sleep(Duration::from_millis(2 + jitter)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(AdmissionError::Contended)
}

/// Moves the counter from what was read (`seen`) to `next`, or fails.
async fn reserve(api: &Api<Sandbox>, sandbox: &Sandbox, seen: Option<i64>, next: i64) -> Result<(), kube::Error> {
    let path = format!("/metadata/annotations/{}", ADMITTED_ANNOTATION.replace('~', "~0").replace('/', "~1"));
    let ops = match seen {
        Some(v) => json!([
            {"op": "test", "path": path, "value": v.to_string()},
            {"op": "replace", "path": path, "value": next.to_string()},
        ]),
        // No counter yet: only if nothing changed since the read.
        None if sandbox.metadata.annotations.is_some() => json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": sandbox.resource_version()},
            {"op": "add", "path": path, "value": next.to_string()},
        ]),
        None => json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": sandbox.resource_version()},
            {"op": "add", "path": "/metadata/annotations", "value": {ADMITTED_ANNOTATION: next.to_string()}},
        ]),
    };
    let patch: json_patch::Patch = serde_json::from_value(ops).expect("valid JSON patch");
    api.patch(&sandbox.name_any(), &PatchParams::default(), &Patch::<()>::Json(patch)).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(yaml: &str) -> Sandbox {
        serde_yaml::from_str(yaml).unwrap()
    }

    const RUNNING: &str = "metadata: {name: box, namespace: ns}\nspec: {mode: commands, image: i}\nstatus: {phase: running}\n";

    #[test]
    fn a_missing_or_ended_session_takes_no_command() {
        assert_eq!(decide("ns", "box", None, 0, 0).unwrap_err().code, ErrorCode::SandboxNotFound);
        for s in [
            "metadata: {name: box}\nspec: {mode: commands, image: i, state: Ended}\n",
            "metadata: {name: box}\nspec: {mode: commands, image: i}\nstatus: {phase: stopping}\n",
            "metadata: {name: box}\nspec: {mode: commands, image: i}\nstatus: {phase: ended}\n",
            "metadata: {name: box}\nspec: {mode: commands, image: i}\nstatus: {phase: failed}\n",
            "metadata: {name: box, deletionTimestamp: '2026-11-30T10:00:00Z'}\nspec: {mode: commands, image: i}\n",
        ] {
            assert_eq!(decide("ns", "box", Some(&sandbox(s)), 0, 0).unwrap_err().code, ErrorCode::SandboxEnded, "{s}");
        }
        let paused = sandbox("metadata: {name: box}\nspec: {mode: commands, image: i, state: Paused}\nstatus: {phase: paused}\n");
        assert!(decide("ns", "box", Some(&paused), 0, 0).is_ok(), "a paused session queues commands");
    }

    #[test]
    fn the_248th_and_the_65th_unfinished_are_refused() {
        let s = sandbox(RUNNING);
        assert!(decide("ns", "box", Some(&s), 246, 200).is_ok(), "the 247th");
        let r = decide("ns", "box", Some(&s), 247, 247).unwrap_err();
        assert_eq!(r.code, ErrorCode::SandboxCommandLimit);
        assert!(r.message().starts_with("sandbox_command_limit: a session takes at most 247"));
        assert!(decide("ns", "box", Some(&s), 63, 0).is_ok(), "the 64th unfinished");
        let r = decide("ns", "box", Some(&s), 64, 0).unwrap_err();
        assert!(r.message().starts_with("sandbox_command_limit: at most 64"), "{}", r.message());
        assert!(decide("ns", "box", Some(&s), 100, 40).is_ok(), "finished ones free a place");
    }
}

//! Helpers the end-to-end tests and the benchmark share for driving
//! Sandboxes: manifests, namespaces, and waiting for a phase with a
//! deadline (never a fixed sleep).

use std::time::{Duration, Instant};

use hangar_crds::{Phase, Sandbox};
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};

use crate::stack::LocalStack;

/// `registry::test_agent_image()`, which every stack pushes to its loopback
/// registry (linux/arm64, one layer; reproducible, so its digest is fixed).
pub const TEST_IMAGE: &str =
    "registry.hangar.test/hangar/agent@sha256:242b72cb94d3c68f6f53e738df55303ccd656614dc3d7a4de3b893025938814f";
pub const DEADLINE: Duration = Duration::from_secs(90);

/// The reset's steps in the contract's order, as `status.reset` names them
/// (written out here, not taken from the operator's code).
pub const RESET_STEPS: [&str; 6] = [
    "revoke_tokens",
    "cancel_queued_commands",
    "terminate_instance",
    "delete_volume",
    "destroy_key",
    "sign_certificate",
];

pub async fn ensure_namespace(client: &kube::Client, name: &str) {
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let ns = serde_json::from_value(json!({"metadata": {"name": name}})).expect("namespace");
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("create namespace {name}: {e}"),
    }
}

/// A Sandbox in `mode` running the test image; `spec` is merged over it
/// (`null` removes a field).
pub fn sandbox(name: &str, mode: &str, spec: Value) -> Sandbox {
    let mut base = json!({"mode": mode, "image": TEST_IMAGE});
    if mode == "agent" {
        // An agent that runs until the session ends it (its exit would end
        // the session).
        base["command"] = json!(["sleep", "86400"]);
    }
    if let (Some(b), Some(extra)) = (base.as_object_mut(), spec.as_object()) {
        for (k, v) in extra {
            if v.is_null() {
                b.remove(k);
            } else {
                b.insert(k.clone(), v.clone());
            }
        }
    }
    serde_json::from_value(json!({
        "apiVersion": "hangar.dev/v1alpha1", "kind": "Sandbox",
        "metadata": {"name": name}, "spec": base,
    }))
    .expect("sandbox manifest")
}

/// Sets `spec.state` (Running, Paused, Ended) by merge patch.
pub async fn set_state(api: &Api<Sandbox>, name: &str, state: &str) -> Result<Sandbox, kube::Error> {
    let patch = json!({"spec": {"state": state}});
    api.patch(name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch)).await
}

pub fn phase(s: &Sandbox) -> Option<Phase> {
    s.status.as_ref().and_then(|st| st.phase)
}

/// Polls object `name` until `pred` holds; on the deadline, fails with
/// `describe` of the last copy seen (`None`: it does not exist).
pub async fn wait_object<K>(
    api: &Api<K>,
    name: &str,
    what: &str,
    pred: impl Fn(&K) -> bool,
    describe: impl Fn(Option<&K>) -> String,
) -> K
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let start = Instant::now();
    loop {
        let current = api.get_opt(name).await.unwrap_or_else(|e| panic!("get {name}: {e}"));
        if let Some(o) = &current
            && pred(o)
        {
            return o.clone();
        }
        if start.elapsed() > DEADLINE {
            panic!("{name}: not {what} within {DEADLINE:?}; {}", describe(current.as_ref()));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls the Events about object `name` until one satisfies `pred`: a
/// controller records its Event after the status it explains, so a reader
/// that saw the status may not see the Event yet.
pub async fn wait_event(events: &Api<Event>, name: &str, what: &str, pred: impl Fn(&Event) -> bool) -> Event {
    let start = Instant::now();
    let about = ListParams::default().fields(&format!("involvedObject.name={name}"));
    loop {
        let seen = events.list(&about).await.unwrap_or_else(|e| panic!("list events of {name}: {e}"));
        if let Some(e) = seen.items.into_iter().find(|e| pred(e)) {
            return e;
        }
        if start.elapsed() > DEADLINE {
            panic!("{name}: no {what} event within {DEADLINE:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls until `pred` holds; on the deadline, fails with the last status
/// and the operator's log.
pub async fn wait_for(
    stack: &LocalStack,
    api: &Api<Sandbox>,
    name: &str,
    what: &str,
    pred: impl Fn(&Sandbox) -> bool,
) -> Sandbox {
    wait_object(api, name, what, pred, |s| {
        format!(
            "status: {}\noperator log:\n{}",
            s.map(|s| serde_json::to_string_pretty(&s.status).unwrap_or_default()).unwrap_or("(gone)".into()),
            stack.operator().log_tail(30)
        )
    })
    .await
}

pub async fn wait_phase(stack: &LocalStack, api: &Api<Sandbox>, name: &str, want: Phase) -> Sandbox {
    wait_for(stack, api, name, &format!("{want:?}"), |s| phase(s) == Some(want)).await
}

/// A running session `box` in mode commands in namespace `ns` (created if
/// needed); returns its Sandbox and Command APIs and the Sandbox.
pub async fn running_box(stack: &LocalStack, ns: &str) -> (Api<Sandbox>, Api<hangar_crds::Command>, Sandbox) {
    let client = stack.cp.client().await.expect("client");
    ensure_namespace(&client, ns).await;
    let boxes: Api<Sandbox> = Api::namespaced(client.clone(), ns);
    boxes.create(&PostParams::default(), &sandbox("box", "commands", json!({}))).await.expect("create box");
    let s = wait_phase(stack, &boxes, "box", Phase::Running).await;
    (boxes, Api::namespaced(client, ns), s)
}

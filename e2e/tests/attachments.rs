//! Tenants and attachments, end to end: a session attaches only Secrets of
//! its own tenant (refused at admission otherwise, an absent Secret
//! answered the same); the values reach the agent container (and only the
//! companions that ask), at their destination and nowhere else, never in
//! status, Events or any component's log; a pause drops them, a resume
//! reads them again (a changed value is the new one, a deleted Secret is
//! absent).

use hangar_crds::{CommandPhase, Phase, Sandbox};
use hangar_e2e::commands::{self as cmds, sh, wait_command_phase};
use hangar_e2e::node_sim::attachments_dir;
use hangar_e2e::sessions::{self, ensure_namespace, phase, set_state, wait_for};
use hangar_e2e::shared_stack;
use k8s_openapi::api::core::v1::{Event, Pod, Secret};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use sha2::{Digest, Sha256};

const NS: &str = "attach";

fn secret(name: &str, tenant: Option<&str>, value: &str) -> Secret {
    let labels = tenant.map(|t| json!({"hangar.dev/tenant": t})).unwrap_or(json!({}));
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "stringData": {"token": value},
    }))
    .unwrap()
}

fn hex_sha256(value: &str) -> String {
    format!("{:x}", Sha256::digest(value.as_bytes()))
}

/// Waits until the simulated node has seen its instance stop: its memory
/// (the attached Secrets) is gone.
async fn powered_off(node: &str) {
    let deadline = std::time::Instant::now() + sessions::DEADLINE;
    while attachments_dir(node).exists() {
        assert!(std::time::Instant::now() < deadline, "a stopped node holds no attachment");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_attaches_only_its_tenants_secrets_and_only_where_asked() {
    let stack = shared_stack();
    let client = stack.cp.client().await.unwrap();
    ensure_namespace(&client, NS).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    // Values no component may ever print; random per run.
    let nonce = format!(
        "{:x}",
        Sha256::digest(std::process::id().to_string() + &format!("{:?}", std::time::SystemTime::now()))
    );
    let first = format!("acme-first-{}", &nonce[..24]);
    let second = format!("acme-second-{}", &nonce[24..48]);
    for s in [
        secret("acme-api", Some("acme"), &first),
        secret("globex-db", Some("globex"), "globex-value"),
        secret("unlabelled", None, "unlabelled-value"),
    ] {
        secrets.create(&PostParams::default(), &s).await.unwrap();
    }
    let dest_root = format!("/tmp/hangar-attach-{}", std::process::id());
    let dest = format!("{dest_root}/api");
    let boxes: Api<Sandbox> = Api::namespaced(client.clone(), NS);

    // Refused at admission, nothing created; an absent Secret looks like
    // another tenant's.
    let attach = |name: &str, tenant: Option<&str>, secret: &str| {
        let mut spec = json!({"attachments": [{"secretName": secret, "destination": dest}]});
        if let Some(t) = tenant {
            spec["tenant"] = json!(t);
        }
        sessions::sandbox(name, "commands", spec)
    };
    let mut answers = Vec::new();
    for (name, tenant, secret) in [
        ("other-tenant", Some("acme"), "globex-db"),
        ("unlabelled", Some("acme"), "unlabelled"),
        ("absent", Some("acme"), "no-such-secret"),
        ("no-tenant", None, "acme-api"),
    ] {
        let err = boxes.create(&PostParams::default(), &attach(name, tenant, secret)).await.unwrap_err();
        let kube::Error::Api(e) = err else { panic!("{name}: {err}") };
        assert!(e.message.contains("sandbox_attachment_forbidden"), "{name}: {}", e.message);
        assert!(boxes.get_opt(name).await.unwrap().is_none(), "{name} was not created");
        answers.push(e.message.replace(secret, "<secret>"));
    }
    assert_eq!(answers[0], answers[2], "absent and another tenant's get the same answer");
    assert_eq!(answers[1], answers[2]);

    // Its own tenant's Secret, for the agent; the companion did not ask.
    let mut spec = json!({
        "tenant": "acme",
        "companions": [{"name": "db", "image": sessions::TEST_IMAGE}],
        "attachments": [{"secretName": "acme-api", "destination": dest}],
    });
    spec["attachments"][0]["companions"] = json!([]);
    boxes.create(&PostParams::default(), &sessions::sandbox("box", "commands", spec)).await.unwrap();
    let running = wait_for(stack, &boxes, "box", "running", |s| phase(s) == Some(Phase::Running)).await;
    let pod = Api::<Pod>::namespaced(client.clone(), NS).get("hangar-agent-box").await.unwrap();
    let mounted = |c: &str| {
        pod.spec
            .as_ref()
            .unwrap()
            .containers
            .iter()
            .find(|k| k.name == c)
            .unwrap()
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.mount_path == dest && m.read_only == Some(true))
    };
    assert!(mounted("agent") && !mounted("db"), "only the agent container mounts it");

    let commands: Api<hangar_crds::Command> = Api::namespaced(client.clone(), NS);
    let mut n = 0;
    let mut check = |script: String| {
        n += 1;
        let (commands, name) = (commands.clone(), format!("check-{n}"));
        async move {
            cmds::create(&commands, &sh(&name, "box", &script)).await;
            let c = wait_command_phase(stack, &commands, &name, CommandPhase::Exited).await;
            c.status.unwrap().exit_code
        }
    };
    // The agent reads the value at its destination (compared by digest, so
    // the value is in no command).
    let reads = |value: &str| format!("sha256sum {dest}/token | grep -q {}", hex_sha256(value));
    assert_eq!(check(reads(&first)).await, Some(0), "the agent reads the attached value");
    // Nowhere else: the host sees an empty directory (the mount is the
    // container's own).
    assert!(!std::path::Path::new(&dest).join("token").exists(), "the value is not on the host's path");

    // Pause: dropped with the node's memory. Change it while paused.
    set_state(&boxes, "box", "Paused").await.unwrap();
    let paused = wait_for(stack, &boxes, "box", "paused", |s| phase(s) == Some(Phase::Paused)).await;
    let node = paused.status.as_ref().and_then(|s| s.instance_id.clone()).unwrap();
    powered_off(&node).await;
    let patch = json!({"stringData": {"token": second}});
    secrets.patch("acme-api", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    set_state(&boxes, "box", "Running").await.unwrap();
    wait_for(stack, &boxes, "box", "running again", |s| {
        phase(s) == Some(Phase::Running) && s.status.as_ref().and_then(|st| st.attempt) == Some(2)
    })
    .await;
    assert_eq!(check(reads(&second)).await, Some(0), "read again at resume: the new value");

    // Deleted while paused: not attached at resume.
    set_state(&boxes, "box", "Paused").await.unwrap();
    wait_for(stack, &boxes, "box", "paused", |s| phase(s) == Some(Phase::Paused)).await;
    powered_off(&node).await;
    secrets.delete("acme-api", &DeleteParams::default()).await.unwrap();
    set_state(&boxes, "box", "Running").await.unwrap();
    wait_for(stack, &boxes, "box", "running a third time", |s| {
        phase(s) == Some(Phase::Running) && s.status.as_ref().and_then(|st| st.attempt) == Some(3)
    })
    .await;
    assert_eq!(check(format!("test ! -e {dest}/token")).await, Some(0), "a deleted Secret is not attached");

    // Never in status, Events or any component's log.
    let status = serde_json::to_string(&boxes.get("box").await.unwrap()).unwrap();
    let events = Api::<Event>::namespaced(client.clone(), NS).list(&ListParams::default()).await.unwrap();
    let events = serde_json::to_string(&events.items).unwrap();
    for value in [&first, &second] {
        assert!(!status.contains(value.as_str()), "a value in the Sandbox");
        assert!(!events.contains(value.as_str()), "a value in an Event");
        for log in std::fs::read_dir(stack.cp.dir()).unwrap().flatten() {
            let path = log.path();
            if path.extension().is_some_and(|e| e == "log") {
                let text = String::from_utf8_lossy(&std::fs::read(&path).unwrap()).into_owned();
                assert!(!text.contains(value.as_str()), "a value in {}", path.display());
            }
        }
    }
    let _ = running.uid();
    let _ = std::fs::remove_dir_all(&dest_root);
}

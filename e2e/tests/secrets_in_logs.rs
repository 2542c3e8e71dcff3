//! No key or token reaches a log. After a session has run commands (so the
//! organisation key, a session key and an attempt key exist) and a member
//! has used the gateway with a bearer token, every log the local stack
//! wrote — operator, webhook, gateway, worker, supervisor, moto, the
//! apiserver and etcd — is searched for each secret in every encoding a
//! careless log line would use (raw, base64, base64url, hex).

use base64::Engine;
use hangar_crds::CommandPhase;
use hangar_e2e::commands::{self as cmds, sh, wait_command_phase};
use hangar_e2e::gateway::member_token;
use hangar_e2e::operator::SYSTEM_NAMESPACE;
use hangar_e2e::sessions::{self};
use hangar_e2e::shared_stack;
use hangar_output::OrgKey;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::Api;
use serde_json::json;

fn encodings(secret: &[u8]) -> Vec<String> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let url = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    // A log line may hold a prefix only (truncated), so the first 24
    // characters of each encoding are enough to count as a leak.
    [b64.encode(secret), url.encode(secret), hex].into_iter().map(|e| e.chars().take(24).collect()).collect()
}

fn logs_under(dir: &std::path::Path, out: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            logs_under(&path, out);
        } else if path.extension().is_some_and(|e| e == "log") {
            let text = String::from_utf8_lossy(&std::fs::read(&path).unwrap()).into_owned();
            out.push((path.display().to_string(), text));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_key_or_token_reaches_any_log() {
    let stack = shared_stack();
    let client = stack.cp.client().await.unwrap();
    let ns = "secret-logs";
    let (_, commands, s) = sessions::running_box(stack, ns).await;
    let sid = s.uid().unwrap();
    cmds::create(&commands, &sh("hello", "box", "echo hello")).await;
    wait_command_phase(stack, &commands, "hello", CommandPhase::Exited).await;
    let member = member_token(&stack.cp, ns, "dev", "get,list,create,patch");
    let gw = stack.gateway_client();
    gw.wait_known(&sid, &member).await;
    let (status, _) = gw
        .call("POST", &format!("/v1/sandboxes/{sid}/commands"), Some(&member), Some(&json!({"argv": ["true"]})), &[])
        .await;
    assert_eq!(status, 201);

    let secrets: Api<Secret> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let org_bytes = secrets.get("hangar-org-key").await.unwrap().data.unwrap()["key"].0.clone();
    let org = OrgKey::from_bytes(&org_bytes).unwrap();
    let sealed = secrets.get(&format!("hangar-session-key-{sid}")).await.unwrap().data.unwrap()["sealed-key"].0.clone();
    let session_key = org.unseal(&sealed, &sid).expect("the session key opens with the org key");
    let attempt_keys = cmds::output_keys(&client, &sid, 1).await;
    assert!(!attempt_keys.is_empty(), "the command's attempt key was handed in");

    // A session token, minted by the operator: its plaintext is in its
    // delivery Secret and nowhere else.
    let tokens: Api<hangar_crds::session_token::SessionToken> = Api::namespaced(client.clone(), ns);
    let manifest = serde_json::from_value(json!({
        "apiVersion": "hangar.dev/v1alpha1", "kind": "SessionToken", "metadata": {"name": "t"},
        "spec": {"sandbox": "box", "scopes": ["read"], "publicKey": {"kty": "EC", "crv": "P-256",
                 "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU", "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}},
    }))
    .unwrap();
    tokens.create(&kube::api::PostParams::default(), &manifest).await.unwrap();
    let minted =
        |t: &hangar_crds::session_token::SessionToken| t.status.as_ref().is_some_and(|s| s.secret_name.is_some());
    let t = sessions::wait_object(&tokens, "t", "minted", minted, |t| format!("{:?}", t.map(|t| &t.status))).await;
    let secret_name = t.status.and_then(|s| s.secret_name).expect("minted");
    let delivered: Api<Secret> = Api::namespaced(client.clone(), ns);
    let plaintext =
        String::from_utf8(delivered.get(&secret_name).await.unwrap().data.unwrap()["token"].0.clone()).unwrap();

    let mut needles: Vec<(String, String)> = vec![("member token".into(), member.chars().take(40).collect())];
    needles.push(("session token".into(), plaintext[4..].to_owned()));
    needles.extend(encodings(&org_bytes).into_iter().map(|e| ("organisation key".into(), e)));
    let kek = secrets.get(hangar_crds::output_keys::OUTPUT_KEK_SECRET).await.unwrap().data.unwrap()["key"].0.clone();
    needles.extend(encodings(&kek).into_iter().map(|e| ("output key-encryption key".into(), e)));
    needles.extend(encodings(&session_key).into_iter().map(|e| ("session key".into(), e)));
    for key in attempt_keys.values() {
        needles.extend(encodings(key).into_iter().map(|e| ("attempt key".into(), e)));
    }
    let mut logs = Vec::new();
    logs_under(stack.cp.dir(), &mut logs);
    let names: Vec<&str> = logs.iter().map(|(p, _)| p.rsplit('/').next().unwrap_or_default()).collect();
    for part in ["operator.log", "webhook.log", "gateway.log", "gateway-1.log", "moto.log", "kube-apiserver.log"] {
        assert!(names.contains(&part), "{part} searched: {names:?}");
    }
    assert!(names.iter().any(|n| n.starts_with("worker-")) && names.iter().any(|n| n.starts_with("supervisor-")));
    for (path, text) in &logs {
        for (what, needle) in &needles {
            assert!(!text.contains(needle.as_str()), "the {what} is in {path}");
        }
    }
}

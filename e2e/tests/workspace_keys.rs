//! The workspace key goes only to the worker on the session's own
//! instance, in its current boot, and the volume it encrypts cannot be
//! opened once the session has ended.
//!
//! The first test acts as an attacker against the operator's key service
//! with the documents it can get or make: another session's genuine
//! document, documents re-signed with edits (region, account, boot time),
//! one signed by a key that is not the region's, replayed nonces and
//! requests, a document of the instance's previous boot after a resume,
//! a paused session's and a terminated instance's. Each refusal is a bare
//! 403; the operator's `hangar_workspace_key_requests{result}` says which
//! check refused it, and the test asserts that reason.

use base64::Engine;
use hangar_crds::{Phase, Sandbox};
use hangar_e2e::imds::{IdentityAuthority, InstanceIdentity};
use hangar_e2e::operator::SYSTEM_NAMESPACE;
use hangar_e2e::sessions::{ensure_namespace, sandbox, set_state, wait_phase};
use hangar_e2e::workspace_keys::{KeyClient, request};
use hangar_e2e::{LocalStack, shared_stack};
use hangar_output::OrgKey;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};
use zeroize::Zeroizing;

/// Requests of the operator's key service refused for `reason` (or
/// granted: `"granted"`) so far.
fn count(stack: &LocalStack, result: &str) -> u64 {
    let series = format!("hangar_workspace_key_requests_total{{result=\"{result}\"}}");
    hangar_e2e::metrics_text::value(&stack.operator().metrics(), &series).unwrap_or(0.0) as u64
}

async fn refused_for(stack: &LocalStack, kc: &KeyClient, body: &Value, reasons: &[&str]) {
    let before: Vec<u64> = reasons.iter().map(|r| count(stack, r)).collect();
    let granted = count(stack, "granted");
    let (status, key) = kc.ask(body).await;
    assert_eq!(status, 403, "refused ({reasons:?})");
    assert!(key.is_none(), "no key in a refusal");
    let after: Vec<u64> = reasons.iter().map(|r| count(stack, r)).collect();
    let moved: u64 = after.iter().zip(&before).map(|(a, b)| a - b).sum();
    assert_eq!(moved, 1, "refused for one of {reasons:?}; metrics:\n{}", stack.operator().metrics());
    assert_eq!(count(stack, "granted"), granted, "nothing granted");
}

fn instance_of(s: &Sandbox) -> String {
    s.status.as_ref().and_then(|st| st.instance_id.clone()).expect("an instance")
}

async fn session_key(stack: &LocalStack, sid: &str) -> Zeroizing<Vec<u8>> {
    let client = stack.cp.client().await.expect("client");
    let secrets: Api<Secret> = Api::namespaced(client, SYSTEM_NAMESPACE);
    let org = secrets.get("hangar-org-key").await.expect("org key").data.expect("data")["key"].0.clone();
    let org = OrgKey::from_bytes(&org).expect("org key");
    let sealed =
        secrets.get(&format!("hangar-session-key-{sid}")).await.expect("session key").data.expect("data")["sealed-key"]
            .0
            .clone();
    org.unseal(&sealed, sid).expect("the session key opens")
}

fn files_under(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            files_under(&p, out);
        } else if p.is_file() {
            out.push(p);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workspace_key_goes_only_to_the_sessions_own_instance_in_this_boot() {
    let stack = shared_stack();
    let client = stack.cp.client().await.expect("client");
    let ns = "workspace-keys";
    ensure_namespace(&client, ns).await;
    let boxes: Api<Sandbox> = Api::namespaced(client.clone(), ns);
    for name in ["a", "b"] {
        boxes.create(&PostParams::default(), &sandbox(name, "commands", json!({}))).await.expect("create");
    }
    let a = wait_phase(stack, &boxes, "a", Phase::Running).await;
    let b = wait_phase(stack, &boxes, "b", Phase::Running).await;
    let (a_instance, b_instance) = (instance_of(&a), instance_of(&b));
    let endpoint = stack.ec2_endpoint();
    let a_id = InstanceIdentity::describe(&endpoint, &a_instance).await;
    let b_id = InstanceIdentity::describe(&endpoint, &b_instance).await;
    let regional = &stack.identity_authority;
    let kc = KeyClient::new(stack);

    // Each session's worker got its key at start.
    assert!(count(stack, "granted") >= 2, "both workers were handed their key");

    // The genuine request for A's own instance gets exactly A's key ...
    let genuine = request(&kc, &a, &a_id, regional).await;
    let (status, key) = kc.ask(&genuine).await;
    assert_eq!(status, 200);
    let a_key = session_key(stack, &a.uid().unwrap()).await;
    assert_eq!(key.as_deref(), Some(&*a_key), "the session's own workspace key");
    assert_eq!(a_key.len(), 64);
    // ... once: the same request again is a replayed nonce.
    refused_for(stack, &kc, &genuine, &["nonce"]).await;

    // A nonce never issued.
    let mut forged = request(&kc, &a, &a_id, regional).await;
    forged["nonce"] = json!("bm90LWlzc3VlZC1ieS10aGUtb3BlcmF0b3I");
    refused_for(stack, &kc, &forged, &["nonce"]).await;

    // A document signed by a key that is not the region's certificate.
    let rogue = IdentityAuthority::generate(&stack.cp.dir().join("pki"), "rogue-authority").expect("rogue");
    refused_for(stack, &kc, &request(&kc, &a, &a_id, &rogue).await, &["signature"]).await;
    // B's genuine signature under a document edited to name A's instance.
    let mut swapped = request(&kc, &a, &b_id, regional).await;
    swapped["document"] = json!(b_id.document().replace(&b_instance, &a_instance));
    refused_for(stack, &kc, &swapped, &["signature"]).await;
    // Not a signature at all.
    let mut garbage = request(&kc, &a, &a_id, regional).await;
    garbage["signature"] = json!("MIIB");
    refused_for(stack, &kc, &garbage, &["signature"]).await;

    // Another session's genuine document, asking for A's key.
    refused_for(stack, &kc, &request(&kc, &a, &b_id, regional).await, &["other_instance"]).await;
    // Documents of A's instance, validly signed, of another region, another
    // account, an earlier boot.
    let other_region = InstanceIdentity { region: "us-east-1".into(), ..a_id.clone() };
    refused_for(stack, &kc, &request(&kc, &a, &other_region, regional).await, &["other_region"]).await;
    let other_account = InstanceIdentity { account_id: "999999999999".into(), ..a_id.clone() };
    refused_for(stack, &kc, &request(&kc, &a, &other_account, regional).await, &["other_account"]).await;
    let earlier: k8s_openapi::jiff::Timestamp = a_id.pending_time.parse().expect("pending time");
    let earlier_boot = InstanceIdentity {
        pending_time: (earlier - k8s_openapi::jiff::SignedDuration::from_secs(3600)).to_string(),
        ..a_id.clone()
    };
    refused_for(stack, &kc, &request(&kc, &a, &earlier_boot, regional).await, &["earlier_boot"]).await;
    // A's genuine document for a session id that is not A's.
    let mut other_session = request(&kc, &a, &a_id, regional).await;
    other_session["sessionId"] = json!("00000000-0000-0000-0000-000000000000");
    refused_for(stack, &kc, &other_session, &["session_not_serving"]).await;
    // Not a key request; and a body past the limit.
    let mut unknown_field = request(&kc, &a, &a_id, regional).await;
    unknown_field["attempt"] = json!(1);
    refused_for(stack, &kc, &unknown_field, &["malformed"]).await;
    let (status, key) = kc.ask_raw(vec![b' '; 64 * 1024]).await;
    assert!(status == 413 || status == 400, "an oversized body is refused: {status}");
    assert!(key.is_none());
    // Plain HTTP to the service: no TLS, no answer.
    let plain = reqwest::Client::new().post(kc.url.replace("https://", "http://") + "/v1/workspace-keys/nonces");
    assert!(plain.send().await.map(|r| r.status().is_success()).unwrap_or(false).eq(&false));

    // Paused: the instance is stopped, and no worker runs; A's document of
    // the boot before is refused, and still after the resume (a new boot).
    set_state(&boxes, "a", "Paused").await.expect("pause");
    wait_phase(stack, &boxes, "a", Phase::Paused).await;
    refused_for(stack, &kc, &request(&kc, &a, &a_id, regional).await, &["session_not_serving"]).await;
    set_state(&boxes, "a", "Running").await.expect("resume");
    let a = wait_phase(stack, &boxes, "a", Phase::Running).await;
    assert_eq!(instance_of(&a), a_instance, "resumed on the same instance");
    refused_for(stack, &kc, &request(&kc, &a, &a_id, regional).await, &["earlier_boot"]).await;
    let a_id_now = InstanceIdentity::describe(&endpoint, &a_instance).await;
    assert_ne!(a_id_now.pending_time, a_id.pending_time, "a resume is a new boot");
    let (status, key) = kc.ask(&request(&kc, &a, &a_id_now, regional).await).await;
    assert_eq!(status, 200, "this boot's document is granted");
    assert_eq!(key.as_deref(), Some(&*a_key), "the same key across the resume");

    // B's instance terminated behind the operator's back: its genuine
    // document opens nothing (refused as not running, or, once the
    // operator has noticed, as a session no longer served).
    let ec2 = hangar_e2e::ec2::client(&endpoint).await;
    ec2.terminate_instances().instance_ids(&b_instance).send().await.expect("terminate");
    refused_for(stack, &kc, &request(&kc, &b, &b_id, regional).await, &["instance_not_running", "session_not_serving"])
        .await;

    // The key was never written to a node's disk (spool, journal, worker
    // files).
    let encodings = [a_key.to_vec(), base64::engine::general_purpose::STANDARD.encode(&*a_key).into_bytes()];
    let mut files = Vec::new();
    files_under(&stack.sim.nodes_dir, &mut files);
    for f in files {
        let bytes = std::fs::read(&f).unwrap_or_default();
        for e in &encodings {
            assert!(!bytes.windows(e.len()).any(|w| w == e.as_slice()), "the workspace key is in {}", f.display());
        }
    }
}

fn opens(image: &std::path::Path, key: &[u8]) -> bool {
    use std::io::Write;
    let mut child = std::process::Command::new("cryptsetup")
        .args(["open", "--test-passphrase", "--key-file", "-"])
        .arg(image)
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("cryptsetup");
    child.stdin.take().expect("stdin").write_all(key).expect("key");
    child.wait().expect("cryptsetup").success()
}

fn is_luks(image: &std::path::Path) -> bool {
    std::process::Command::new("cryptsetup").arg("isLuks").arg(image).status().is_ok_and(|s| s.success())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_end_the_volume_opens_with_no_key_the_system_still_has() {
    let root = nix::unistd::geteuid().is_root();
    let cryptsetup =
        std::process::Command::new("cryptsetup").arg("--version").output().is_ok_and(|o| o.status.success());
    let loops = std::path::Path::new("/dev/loop-control").exists();
    if !root || !cryptsetup || !loops {
        eprintln!(
            "skipped: needs root, loop devices and cryptsetup; root={root} loop-control={loops} cryptsetup={cryptsetup}"
        );
        return;
    }
    let stack = shared_stack();
    let client = stack.cp.client().await.expect("client");
    let ns = "workspace-volume";
    ensure_namespace(&client, ns).await;
    let boxes: Api<Sandbox> = Api::namespaced(client.clone(), ns);
    boxes.create(&PostParams::default(), &sandbox("box", "commands", json!({}))).await.expect("create");
    let s = wait_phase(stack, &boxes, "box", Phase::Running).await;
    let sid = s.uid().unwrap();
    let volume = s.status.as_ref().and_then(|st| st.volume_id.clone()).expect("a volume");
    let image = stack.sim.volumes_dir.join(format!("{volume}.luks"));
    assert!(is_luks(&image), "the worker formatted the volume LUKS2 before the session ran");
    let key = session_key(stack, &sid).await;
    assert!(opens(&image, &key), "the session key opens the volume while the session runs");
    assert!(!opens(&image, &[0u8; 64]), "another key does not");

    set_state(&boxes, "box", "Ended").await.expect("end");
    wait_phase(stack, &boxes, "box", Phase::Ended).await;
    let secrets: Api<Secret> = Api::all(client.clone());
    let key_secret = format!("hangar-session-key-{sid}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while secrets.list(&ListParams::default()).await.expect("secrets").items.iter().any(|s| s.name_any() == key_secret)
    {
        assert!(std::time::Instant::now() < deadline, "the session key was not destroyed at the end");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }

    // Every key the system still has: each value of every Secret, and
    // each session key still sealed under the organisation key.
    let system: Api<Secret> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let org = system.get("hangar-org-key").await.expect("org key").data.expect("data")["key"].0.clone();
    let org = OrgKey::from_bytes(&org).expect("org key");
    let mut candidates: Vec<Zeroizing<Vec<u8>>> = Vec::new();
    for secret in secrets.list(&ListParams::default()).await.expect("secrets").items {
        for (_, v) in secret.data.clone().unwrap_or_default() {
            candidates.push(Zeroizing::new(v.0.clone()));
            if let Some(other) = secret.name_any().strip_prefix("hangar-session-key-")
                && let Ok(k) = org.unseal(&v.0, other)
            {
                candidates.push(k);
            }
        }
    }
    assert!(candidates.len() > 3, "the cluster's Secrets were read");
    assert!(is_luks(&image), "the volume's header is still there to try");
    for k in &candidates {
        assert!(!opens(&image, k), "a key the system still has opens the ended session's volume");
    }
}

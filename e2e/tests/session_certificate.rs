//! The end of a session (issue 14): the reset revokes the session's
//! tokens beyond `read`, cancels what is still queued, and signs a session
//! certificate last. The certificate, fetched with the `hangar` CLI,
//! verifies offline under the platform's public key, refuses a changed
//! byte, and lists one job per command with the document's outcome.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use hangar_crds::{CommandPhase, Phase, SessionToken, TokenPhase};
use hangar_e2e::commands::{self, cancel, command, create, sh, wait_command_phase};
use hangar_e2e::gateway::{member_token, mint_token};
use hangar_e2e::operator::SYSTEM_NAMESPACE;
use hangar_e2e::sessions;
use hangar_e2e::sessions::{running_box, set_state, wait_phase};
use hangar_e2e::shared_stack;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const NS: &str = "cert";

fn run(cmd: &mut std::process::Command) -> (bool, String, String) {
    let out = cmd.output().expect("run hangar");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// `hangar cert get NAME -o DIR/NAME.cert.json` as `member`; the file.
fn cert_get(member: &str, name: &str, dir: &std::path::Path) -> std::path::PathBuf {
    let file = dir.join(format!("{name}.cert.json"));
    let mut cli = shared_stack().hangar_cli();
    cli.env("HANGAR_GATEWAY_TOKEN", member).args(["cert", "get", name, "-n", NS, "-o", file.to_str().unwrap()]);
    let (ok, _, err) = run(&mut cli);
    assert!(ok, "hangar cert get {name}: {err}");
    file
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_certificate_verifies_refuses_a_changed_byte_and_has_one_job_per_command() {
    let stack = shared_stack();
    let (boxes, cmds, s) = running_box(stack, NS).await;
    let sid = s.uid().unwrap();
    let member = member_token(&stack.cp, NS, "cert-member", "get,list,watch,create,patch");
    let gw = stack.gateway_client();
    gw.wait_known(&sid, &member).await;
    let exec = mint_token(&gw, &member, &sid, "cert-exec", &["read", "exec"], 3600).await;
    let read = mint_token(&gw, &member, &sid, "cert-read", &["read"], 3600).await;
    let path = format!("/v1/sandboxes/{sid}/certificate");
    let (status, body) = gw.get(&path, &member).await;
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("sandbox_certificate_pending")), "{body}");

    // One command per outcome of the document's table.
    create(&cmds, &sh("exits-3", "box", "echo out; exit 3")).await;
    create(&cmds, &sh("exits-0", "box", "true")).await;
    create(&cmds, &command("times-out", "box", &["sleep", "30"], json!({"timeoutSeconds": 1}))).await;
    create(&cmds, &sh("cancelled", "box", "sleep 30")).await;
    create(&cmds, &sh("paused", "box", "sleep 30")).await;
    wait_command_phase(stack, &cmds, "exits-3", CommandPhase::Exited).await;
    wait_command_phase(stack, &cmds, "exits-0", CommandPhase::Exited).await;
    wait_command_phase(stack, &cmds, "times-out", CommandPhase::TimedOut).await;
    wait_command_phase(stack, &cmds, "cancelled", CommandPhase::Running).await;
    cancel(&cmds, "cancelled").await;
    wait_command_phase(stack, &cmds, "cancelled", CommandPhase::Cancelled).await;
    wait_command_phase(stack, &cmds, "paused", CommandPhase::Running).await;
    set_state(&boxes, "box", "Paused").await.unwrap();
    wait_phase(stack, &boxes, "box", Phase::Paused).await;
    wait_command_phase(stack, &cmds, "paused", CommandPhase::KilledAtPause).await;
    // Sent while paused: still queued when the session ends.
    create(&cmds, &sh("queued", "box", "true")).await;
    commands::wait_command(stack, &cmds, "queued", "numbered", |c| {
        c.status.as_ref().is_some_and(|s| s.number.is_some() && s.phase == Some(CommandPhase::Queued))
    })
    .await;

    set_state(&boxes, "box", "Ended").await.unwrap();
    let ended = wait_phase(stack, &boxes, "box", Phase::Ended).await;
    let st = ended.status.unwrap();
    let steps: Vec<&str> = st.reset.iter().map(|r| r.step.as_str()).collect();
    assert_eq!(steps, hangar_e2e::sessions::RESET_STEPS, "every step once, in order");
    assert_eq!(st.reset_pending, None);
    let recorded = st.certificate.clone().expect("status.certificate");
    assert!(recorded.signed_at.is_some());

    // The reset revoked the exec token; the read token still reads.
    let tokens: Api<SessionToken> = Api::namespaced(stack.cp.client().await.unwrap(), NS);
    let t = tokens.get("cert-exec").await.unwrap().status.unwrap();
    assert_eq!((t.phase, t.reason.as_deref()), (Some(TokenPhase::Revoked), Some("session_ended")));
    assert_eq!(tokens.get("cert-read").await.unwrap().status.unwrap().phase, Some(TokenPhase::Active));
    let (status, _) = gw.as_token(&exec, "GET", &path, None).await;
    assert_eq!(status, 401, "a revoked token reads nothing");
    let (status, by_read_token) = gw.as_token(&read, "GET", &path, None).await;
    assert_eq!(status, 200, "{by_read_token}");

    // Fetched with the CLI as the member; the same bytes the status names.
    let dir = tempfile::tempdir().unwrap();
    let file = cert_get(&member, "box", dir.path());
    let bytes = std::fs::read(&file).unwrap();
    assert_eq!(Some(hangar_keys::session_certificate::digest(&bytes)), recorded.digest);
    assert_eq!(serde_json::from_slice::<Value>(&bytes).unwrap(), by_read_token, "the same record for a read token");

    // The platform's public key, from the signing Secret.
    let secrets: Api<Secret> = Api::namespaced(stack.cp.client().await.unwrap(), SYSTEM_NAMESPACE);
    let secret = secrets.get("hangar-certificate-signing").await.unwrap();
    let data = secret.data.unwrap();
    let public = String::from_utf8(data["public-key"].0.clone()).unwrap();
    assert_eq!(recorded.key_id.as_deref(), Some(String::from_utf8(data["key-id"].0.clone()).unwrap().as_str()));
    let key_file = dir.path().join("hangar.pub");
    std::fs::write(&key_file, &public).unwrap();
    let key_arg = format!("@{}", key_file.display());

    let (ok, out, err) = run(stack.hangar_cli().args(["cert", "verify", file.to_str().unwrap(), "--key", &key_arg]));
    assert!(ok, "hangar cert verify: {err}");
    assert!(out.starts_with(&format!("verified: session {sid}")), "{out}");

    // One changed byte (inside the first job's id) and it no longer verifies.
    let at = bytes.windows(6).position(|w| w == b"/cmd/1").expect("a job id");
    let mut changed = bytes.clone();
    changed[at + 5] = b'7';
    let changed_file = dir.path().join("changed.json");
    std::fs::write(&changed_file, &changed).unwrap();
    let (ok, _, err) =
        run(stack.hangar_cli().args(["cert", "verify", changed_file.to_str().unwrap(), "--key", &key_arg]));
    assert!(!ok, "a changed byte must not verify");
    assert!(err.contains("does not verify"), "{err}");

    // Its jobs, one for one with the commands' final statuses.
    let cert = hangar_keys::session_certificate::verify(&bytes, &public).unwrap();
    let jobs: BTreeMap<String, Value> =
        cert["jobs"].as_array().unwrap().iter().map(|j| (j["jobId"].as_str().unwrap().to_owned(), j.clone())).collect();
    let want = [
        ("exits-3", json!({"outcome": "completed", "exitCode": 3})),
        ("exits-0", json!({"outcome": "completed", "exitCode": 0})),
        ("times-out", json!({"outcome": "ended_abnormally", "reason": "timed_out"})),
        ("cancelled", json!({"outcome": "cancelled"})),
        ("paused", json!({"outcome": "cancelled", "reason": "paused"})),
        ("queued", json!({"outcome": "not_started"})),
    ];
    assert_eq!(jobs.len(), want.len(), "one job per command: {jobs:?}");
    for (name, expected) in want {
        let c = cmds.get(name).await.unwrap().status.unwrap();
        let job = &jobs[c.job_id.as_deref().expect("job id")];
        assert_eq!(job["number"].as_i64(), c.number, "{name}");
        for key in ["outcome", "exitCode", "reason"] {
            assert_eq!(job.get(key), expected.get(key), "{name}: {key} in {job}");
        }
    }
    assert_eq!(cert["start"]["tenant"], s.spec.tenant.as_deref().map_or(Value::Null, |t| json!(t)));
    assert_eq!(cert["sessionId"], json!(sid));
    let attempts = cert["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "ended while paused: no attempt after the pause: {attempts:?}");
    assert_eq!((&attempts[0]["cause"], &attempts[0]["end"]), (&json!("launch"), &json!("paused")));
    assert_eq!(cert["end"]["reset"].as_array().unwrap().len(), 5, "every step before signing");

    // Rotation by key id: the platform replaces the key; the next session
    // is signed with the new one; both keys stay published, so both
    // certificates verify from the key set the gateway lists.
    let (new_key, new_public) = hangar_keys::template_signing::generate().unwrap();
    let rotated = json!({"data": {
        "key-id": B64.encode("rotated-2"), "signing-key": B64.encode(new_key.as_bytes()), "public-key": B64.encode(&new_public),
    }});
    secrets.patch("hangar-certificate-signing", &PatchParams::default(), &Patch::Merge(&rotated)).await.unwrap();
    boxes.create(&PostParams::default(), &sessions::sandbox("second", "commands", json!({}))).await.unwrap();
    wait_phase(stack, &boxes, "second", Phase::Running).await;
    set_state(&boxes, "second", "Ended").await.unwrap();
    let second = wait_phase(stack, &boxes, "second", Phase::Ended).await;
    assert_eq!(second.status.unwrap().certificate.unwrap().key_id.as_deref(), Some("rotated-2"));
    let second_file = cert_get(&member, "second", dir.path());
    let keys_file = dir.path().join("keys.json");
    let (ok, listed, err) = run(stack.hangar_cli().env("HANGAR_GATEWAY_TOKEN", &member).args(["cert", "keys"]));
    assert!(ok, "{err}");
    let set: BTreeMap<String, String> = serde_json::from_str(&listed).unwrap();
    assert_eq!(set.get("rotated-2"), Some(&new_public));
    assert_eq!(set.get(recorded.key_id.as_deref().unwrap()), Some(&public), "the old key stays published");
    std::fs::write(&keys_file, &listed).unwrap();
    let keys_arg = format!("@{}", keys_file.display());
    for f in [&file, &second_file] {
        let (ok, _, err) = run(stack.hangar_cli().args(["cert", "verify", f.to_str().unwrap(), "--key", &keys_arg]));
        assert!(ok, "{}: {err}", f.display());
    }
    let (ok, _, _) = run(stack.hangar_cli().args(["cert", "verify", file.to_str().unwrap(), "--key", &new_public]));
    assert!(!ok, "the first certificate does not verify under the new key");
}

//! The `hangar` CLI against the local stack: its everyday verbs drive a
//! session from create to stop, and `hangar exec` survives connections
//! killed mid-stream, printing every byte of the output once.

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use hangar_crds::{Phase, Sandbox};
use hangar_e2e::cut_proxy::CutProxy;
use hangar_e2e::gateway::{TokenCreds, member_token};
use hangar_e2e::sessions::{DEADLINE, TEST_IMAGE, ensure_namespace, running_box};
use hangar_e2e::shared_stack;
use kube::ResourceExt;
use kube::api::Api;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs the CLI as `member` (its gateway token) to the end.
async fn hangar(member: &str, args: &[&str]) -> Ran {
    let mut cmd = tokio::process::Command::from(shared_stack().hangar_cli());
    cmd.env("HANGAR_GATEWAY_TOKEN", member).args(args).kill_on_drop(true);
    let out = tokio::time::timeout(DEADLINE, cmd.output()).await.expect("hangar finished in time").expect("run hangar");
    Ran {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into(),
        stderr: String::from_utf8_lossy(&out.stderr).into(),
    }
}

fn numbered(prefix: &str, n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("{prefix}-{i}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_survives_killed_connections_and_prints_every_byte_once() {
    let stack = shared_stack();
    let ns = "cli-exec";
    let (_, _, s) = running_box(stack, ns).await;
    let member = member_token(&stack.cp, ns, "cli-member", "get,list,watch,create,patch");
    stack.gateway_client().wait_known(&s.uid().unwrap(), &member).await;
    let proxy = CutProxy::start(stack.gateway.port).await;

    let script = "for i in $(seq 1 30); do echo out-$i; echo err-$i >&2; sleep 0.1; done; exit 7";
    let mut cmd = tokio::process::Command::from(stack.hangar_cli());
    cmd.env("HANGAR_GATEWAY", format!("https://127.0.0.1:{}", proxy.port))
        .env("HANGAR_GATEWAY_TOKEN", &member)
        .args(["exec", "box", "-n", ns, "--", "sh", "-c", script])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().expect("hangar exec");
    let mut stderr = child.stderr.take().unwrap();
    let errors = tokio::spawn(async move {
        let mut text = String::new();
        stderr.read_to_string(&mut text).await.map(|_| text)
    });
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut out = vec![];
    while let Some(line) = tokio::time::timeout(DEADLINE, lines.next_line()).await.expect("output in time").unwrap() {
        // Mid-stream, twice: the long-poll open at that moment is dropped.
        if line == "out-8" || line == "out-20" {
            proxy.cut();
        }
        out.push(line);
    }
    let status = tokio::time::timeout(DEADLINE, child.wait()).await.unwrap().unwrap();
    let errors = errors.await.unwrap().unwrap();
    assert_eq!(status.code(), Some(7), "the command's exit code; stderr:\n{errors}");
    assert_eq!(out, numbered("out", 30), "every stdout byte once, in order");
    let err_lines: Vec<&str> = errors.lines().filter(|l| l.starts_with("err-")).collect();
    assert_eq!(err_lines, numbered("err", 30), "every stderr byte once, in order:\n{errors}");
    assert!(proxy.cut_open() >= 2, "each cut dropped an open connection ({} dropped)", proxy.cut_open());
    assert!(proxy.accepted() >= 3, "the CLI connected again after each cut ({} connections)", proxy.accepted());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_everyday_verbs_drive_a_session_from_create_to_stop() {
    let stack = shared_stack();
    let ns = "cli-verbs";
    let client = stack.cp.client().await.unwrap();
    ensure_namespace(&client, ns).await;
    let boxes: Api<Sandbox> = Api::namespaced(client, ns);
    let member = member_token(&stack.cp, ns, "cli-member", "get,list,watch,create,patch");

    let r = hangar(&member, &["create", "work", "-n", ns, "--image", TEST_IMAGE]).await;
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stderr.contains("work: running"), "progress on stderr: {}", r.stderr);
    let running = boxes.get("work").await.unwrap();
    assert_eq!(running.status.as_ref().and_then(|s| s.phase), Some(Phase::Running));
    let instance = running.status.unwrap().instance_id;
    stack.gateway_client().wait_known(&running.metadata.uid.clone().unwrap(), &member).await;

    let r = hangar(&member, &["exec", "work", "-n", ns, "--", "sh", "-c", "echo hello; echo world >&2"]).await;
    assert_eq!((r.code, r.stdout.as_str()), (Some(0), "hello\n"), "{}", r.stderr);
    assert!(r.stderr.contains("world\n"), "{}", r.stderr);
    let cid = r
        .stderr
        .lines()
        .find_map(|l| l.strip_prefix("hangar: command ").and_then(|l| l.strip_suffix(" sent")))
        .expect("the command's id on stderr")
        .to_owned();
    let r = hangar(&member, &["exec", "work", "-n", ns, "--", "sh", "-c", "exit 3"]).await;
    assert_eq!(r.code, Some(3), "exec exits with the command's code: {}", r.stderr);

    // "hello\n" is bytes 0-5 of the command's output.
    let r = hangar(&member, &["logs", &cid, "-n", ns, "--after", "2"]).await;
    assert_eq!((r.code, r.stdout.as_str()), (Some(0), "llo\n"), "{}", r.stderr);

    let r = hangar(&member, &["pause", "work", "-n", ns]).await;
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert_eq!(boxes.get("work").await.unwrap().status.unwrap().phase, Some(Phase::Paused));
    let r = hangar(&member, &["resume", "work", "-n", ns]).await;
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let resumed = boxes.get("work").await.unwrap().status.unwrap();
    assert_eq!((resumed.phase, resumed.instance_id), (Some(Phase::Running), instance), "the same instance");

    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("proof.key");
    let key_arg = key.to_str().unwrap();
    let r = hangar(&member, &["token", "create", "work", "-n", ns, "--scopes", "read", "--key-out", key_arg]).await;
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let token = r.stdout.trim().to_owned();
    assert!(token.starts_with("hgt_") && !token.contains('\n'), "the token, once: {}", r.stdout);
    assert_eq!(std::fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600, "the proof key is private");
    use base64::Engine;
    let pkcs8 = base64::engine::general_purpose::STANDARD.decode(std::fs::read(&key).unwrap()).unwrap();
    let signer = Arc::new(hangar_keys::proof::Signer::from_pkcs8(&pkcs8).expect("a P-256 key"));
    let creds = TokenCreds { name: "cli".into(), token, signer };
    let sid = boxes.get("work").await.unwrap().uid().unwrap();
    let (status, view) = stack.gateway_client().as_token(&creds, "GET", &format!("/v1/sandboxes/{sid}"), None).await;
    assert_eq!(status, 200, "the minted token and its key read the session: {view}");
    let r = hangar(&member, &["token", "create", "work", "-n", ns, "--key-out", key_arg]).await;
    assert_ne!(r.code, Some(0), "an existing key file is never overwritten");

    let r = hangar(&member, &["stop", "work", "-n", ns]).await;
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert_eq!(boxes.get("work").await.unwrap().status.unwrap().phase, Some(Phase::Ended));
    let r = hangar(&member, &["pause", "work", "-n", ns]).await;
    assert_ne!(r.code, Some(0), "an ended session does not pause: {}", r.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_binary_is_kubectl_hangar() {
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(hangar_e2e::operator::workspace_binary("hangar"), dir.path().join("kubectl-hangar"))
        .unwrap();
    let path = format!("{}:{}", dir.path().display(), std::env::var("PATH").unwrap_or_default());
    let out =
        shared_stack().cp.kubectl().env("PATH", path).args(["hangar", "cert", "verify", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(help.contains("--key"), "kubectl ran the plugin: {help}");
}

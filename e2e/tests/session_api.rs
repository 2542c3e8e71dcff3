//! The session API with session tokens, end to end on the local stack: a
//! member mints tokens through the gateway; each request carries a
//! `Hangar-Proof`; the gateway acts as the token's identity, so admission
//! holds every write to the token's session and scopes — through the
//! gateway and through `kubectl --as` alike. Hostile cases are refused with
//! the contract's code and change nothing.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine;
use hangar_crds::session_token::{SessionToken, TokenPhase};
use hangar_crds::{Command, CommandPhase, Phase, Sandbox};
use hangar_e2e::gateway::{GatewayClient, TokenCreds, jwk, member_token, mint_token};
use hangar_e2e::sessions;
use hangar_e2e::shared_stack;
use hangar_keys::proof::Signer;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

fn code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("(no error code)")
}

/// What an attacker would change in a namespace: every object's spec,
/// labels and annotations, and which objects exist.
async fn snapshot(client: &kube::Client, ns: &str) -> BTreeMap<String, Value> {
    let mut all = BTreeMap::new();
    let lp = ListParams::default();
    for s in Api::<Sandbox>::namespaced(client.clone(), ns).list(&lp).await.unwrap() {
        let mut annotations = s.annotations().clone();
        // The gateway's own bookkeeping when a client attaches.
        annotations.remove("hangar.dev/attached-at");
        all.insert(format!("sandbox/{}", s.name_any()), json!([s.spec, s.labels(), annotations]));
    }
    for c in Api::<Command>::namespaced(client.clone(), ns).list(&lp).await.unwrap() {
        all.insert(format!("command/{}", c.name_any()), json!([c.spec, c.labels(), c.annotations()]));
    }
    for t in Api::<SessionToken>::namespaced(client.clone(), ns).list(&lp).await.unwrap() {
        all.insert(format!("token/{}", t.name_any()), json!([t.spec, t.labels(), t.annotations()]));
    }
    all
}

async fn wait_command(api: &Api<Command>, name: &str, what: &str, pred: impl Fn(&Command) -> bool) -> Command {
    sessions::wait_object(api, name, what, pred, |c| format!("{:?}", c.and_then(|c| c.status.as_ref()))).await
}

fn command_phase(c: &Command) -> Option<CommandPhase> {
    c.status.as_ref().and_then(|s| s.phase)
}

/// `kubectl` as a session token's identity.
fn kubectl_as_token(stack: &hangar_e2e::LocalStack, ns: &str, token: &str, args: &[&str]) -> (bool, String) {
    let out = stack
        .cp
        .kubectl()
        .args(["--as", &format!("hangar:token:{ns}:{token}"), "--as-group", "hangar:session-tokens", "-n", ns])
        .args(args)
        .output()
        .unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn kubectl_apply_as_token(stack: &hangar_e2e::LocalStack, ns: &str, token: &str, manifest: &Value) -> (bool, String) {
    let path = stack.cp.dir().join(format!("as-token-{}.json", hangar_e2e::process::free_port()));
    std::fs::write(&path, manifest.to_string()).unwrap();
    kubectl_as_token(stack, ns, token, &["create", "-f", path.to_str().unwrap()])
}

/// A merge patch of `kind` `name` in `namespace` through the API as token
/// `token`'s identity (of namespace `tok-api`).
async fn patch_as_token(
    stack: &hangar_e2e::LocalStack,
    namespace: &str,
    token: &str,
    kind: &str,
    name: &str,
    patch: Value,
) -> (bool, String) {
    let user = format!("hangar:token:tok-api:{token}");
    let client = stack.cp.client_impersonating(&user, &["hangar:session-tokens"]).await.unwrap();
    let pp = PatchParams::default();
    let result = match kind {
        "sandbox" => {
            Api::<Sandbox>::namespaced(client, namespace).patch(name, &pp, &Patch::Merge(&patch)).await.map(|_| ())
        }
        _ => Api::<Command>::namespaced(client, namespace).patch(name, &pp, &Patch::Merge(&patch)).await.map(|_| ()),
    };
    (result.is_ok(), result.err().map(|e| e.to_string()).unwrap_or_default())
}

/// One hostile request and the answer it must get.
struct Case {
    what: &'static str,
    status: u16,
    code: &'static str,
    answer: (u16, Value),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_tokens_act_within_their_scope_and_session_and_every_hostile_use_is_refused() {
    let stack = shared_stack();
    let (ns, other_ns) = ("tok-api", "tok-api-other");
    let (boxes, commands, s) = sessions::running_box(stack, ns).await;
    let client = stack.cp.client().await.unwrap();
    let sid = s.uid().unwrap();
    // Another session in the namespace, for another tenant; and one in
    // another namespace.
    boxes
        .create(&PostParams::default(), &sessions::sandbox("box-b", "commands", json!({"tenant": "tenant-b"})))
        .await
        .unwrap();
    let b = sessions::wait_phase(stack, &boxes, "box-b", Phase::Running).await;
    let (_, _, o) = sessions::running_box(stack, other_ns).await;
    let (sid_b, sid_o) = (b.uid().unwrap(), o.uid().unwrap());
    let gw = stack.gateway_client();
    let owner = member_token(&stack.cp, ns, "owner", "get,list,create,patch");
    let other_owner = member_token(&stack.cp, other_ns, "owner", "get,list,create,patch");
    gw.wait_known(&sid, &owner).await;
    gw.wait_known(&sid_b, &owner).await;
    gw.wait_known(&sid_o, &other_owner).await;

    // Tokens, minted through the gateway; the plaintext is in the answer only.
    let short = mint_token(&gw, &owner, &sid, "short", &["read"], 60).await;
    let exec = mint_token(&gw, &owner, &sid, "runner", &["read", "exec"], 600).await;
    let reader = mint_token(&gw, &owner, &sid, "reader", &["read"], 600).await;
    let control = mint_token(&gw, &owner, &sid, "pilot", &["control"], 600).await;
    let doomed = mint_token(&gw, &owner, &sid, "doomed", &["exec"], 600).await;
    let exec_b = mint_token(&gw, &owner, &sid_b, "runner-b", &["exec", "read"], 600).await;
    let exec_o = mint_token(&gw, &other_owner, &sid_o, "runner-o", &["exec", "read"], 600).await;
    let tokens: Api<SessionToken> = Api::namespaced(client.clone(), ns);
    let stored = tokens.get("runner").await.unwrap();
    let st = stored.status.clone().unwrap();
    assert_eq!(st.digest.as_deref(), Some(hangar_keys::token::digest(&exec.token).as_str()));
    assert_eq!(st.session_id.as_deref(), Some(sid.as_str()));
    assert!(st.secret_name.is_none(), "no Secret: the plaintext was in the answer only");
    assert!(!serde_json::to_string(&stored).unwrap().contains(&exec.token[4..]));

    // What each scope may do.
    let base = format!("/v1/sandboxes/{sid}");
    let (status, state) = gw.as_token(&reader, "GET", &base, None).await;
    assert_eq!((status, state["id"].as_str()), (200, Some(sid.as_str())), "{state}");
    let (status, _) = gw.as_token(&reader, "GET", &format!("{base}/attach"), None).await;
    assert_eq!(status, 200);
    let echo = json!({"argv": ["sh", "-c", "echo from-token"]});
    let (status, sent) = gw.as_token(&exec, "POST", &format!("{base}/commands"), Some(&echo)).await;
    assert_eq!(status, 201, "{sent}");
    let sent_name = sent["id"].as_str().unwrap().to_owned();
    let c = wait_command(&commands, &sent_name, "exited", |c| command_phase(c) == Some(CommandPhase::Exited)).await;
    let cs = c.status.unwrap();
    assert_eq!(cs.sent_by.as_deref(), Some("runner"), "sentBy is the token");
    assert_eq!(cs.sender.as_deref(), Some("hangar:token:tok-api:runner"));
    // A member's command names the member.
    let (status, by_member) = gw.call("POST", &format!("{base}/commands"), Some(&owner), Some(&echo), &[]).await;
    assert_eq!(status, 201, "{by_member}");
    let member_cmd = by_member["id"].as_str().unwrap().to_owned();
    let mc =
        wait_command(&commands, &member_cmd, "numbered", |c| c.status.as_ref().is_some_and(|s| s.sent_by.is_some()))
            .await;
    assert_eq!(mc.status.unwrap().sent_by.as_deref(), Some("system:serviceaccount:tok-api:owner"));
    // `kubectl get sbxcmd` shows who sent each.
    let out = stack.cp.kubectl().args(["get", "commands.hangar.dev", "-n", ns]).output().unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("SENT BY") && table.contains("runner"), "{table}");
    assert!(table.contains("system:serviceaccount:tok-api:owner"), "{table}");

    // The hostile cases. Proofs are made by hand where the case needs it.
    let url = |path: &str| format!("{}{path}", gw.proof_base());
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let cmd_path = format!("{base}/commands");
    let send = |creds: &TokenCreds, proof: String| {
        let (gw, path, token, body) = (&gw, cmd_path.clone(), creds.token.clone(), echo.clone());
        async move { gw.call("POST", &path, Some(&token), Some(&body), &[("Hangar-Proof", &proof)]).await }
    };
    let before = snapshot(&client, ns).await;
    let before_other = snapshot(&client, other_ns).await;
    let stranger = Signer::generate();
    let unknown = TokenCreds {
        name: "x".into(),
        token: format!("hgt_{}", "A".repeat(43)),
        signer: std::sync::Arc::new(Signer::generate()),
    };
    let replayed = exec.proof("POST", &url(&cmd_path));
    let first = send(&exec, replayed.clone()).await;
    assert_eq!(first.0, 201, "the proof's first use: {}", first.1);
    // A proof used at one replica is refused at the other.
    let replica = stack.gateway_replica_client();
    let across = exec.proof("POST", &url(&cmd_path));
    let headers = [("Hangar-Proof", across.as_str())];
    let at_replica = replica.call("POST", &cmd_path, Some(&exec.token), Some(&echo), &headers).await;
    assert_eq!(at_replica.0, 201, "the proof's first use, at the second replica: {}", at_replica.1);
    // An attacker on the peer port (any pod may reach it) cannot burn a
    // jti a token is going to use: a claim without the replicas' MAC is
    // refused at each replica, and the proof with that jti still works.
    let http = reqwest::Client::new();
    for port in [stack.gateway.peer_port, stack.gateway_replica.peer_port] {
        let port = port.expect("replicas with a peer port");
        let forged = json!({"jti": "future-1", "at": now, "nonce": "00", "mac": "00".repeat(32)});
        let answer = http
            .post(format!("http://127.0.0.1:{port}/v1/internal/jti-claims"))
            .header("content-type", "application/json")
            .body(forged.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status().as_u16(), 403, "a forged claim at the peer port {port}");
    }
    let later = exec.signer.proof("POST", &url(&cmd_path), &exec.token, now, "future-1");
    let used = send(&exec, later).await;
    assert_eq!(used.0, 201, "the jti an attacker tried to burn is still the token's: {}", used.1);
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let enc = |v: Value| b64.encode(serde_json::to_vec(&v).unwrap());
    let claims = json!({"htm": "POST", "htu": url(&cmd_path), "iat": now, "jti": "n1", "ath": hangar_keys::proof::token_hash(&exec.token)});
    let mut cases = vec![
        Case {
            what: "unknown token",
            status: 401,
            code: "token_invalid",
            answer: gw.as_token(&unknown, "POST", &cmd_path, Some(&echo)).await,
        },
        Case {
            what: "proof by the wrong key",
            status: 401,
            code: "token_invalid",
            answer: send(&exec, stranger.proof("POST", &url(&cmd_path), &exec.token, now, "w1")).await,
        },
        Case { what: "replayed jti", status: 401, code: "token_invalid", answer: send(&exec, replayed).await },
        Case {
            what: "replayed jti, at another replica",
            status: 401,
            code: "token_invalid",
            answer: send(&exec, across.clone()).await,
        },
        Case {
            what: "iat stale",
            status: 401,
            code: "token_invalid",
            answer: send(&exec, exec.signer.proof("POST", &url(&cmd_path), &exec.token, now - 120, "s1")).await,
        },
        Case {
            what: "iat in the future",
            status: 401,
            code: "token_invalid",
            answer: send(&exec, exec.signer.proof("POST", &url(&cmd_path), &exec.token, now + 120, "f1")).await,
        },
        Case {
            what: "htm of another method",
            status: 401,
            code: "token_invalid",
            answer: send(&exec, exec.proof("GET", &url(&cmd_path))).await,
        },
        Case {
            what: "htu of another route",
            status: 401,
            code: "token_invalid",
            answer: send(&exec, exec.proof("POST", &url(&format!("{base}/pause")))).await,
        },
        Case {
            what: "htu of another host",
            status: 401,
            code: "token_invalid",
            answer: send(&exec, exec.proof("POST", &format!("https://evil.example{cmd_path}"))).await,
        },
        Case {
            what: "ath of another token",
            status: 401,
            code: "token_invalid",
            answer: send(&exec, exec.signer.proof("POST", &url(&cmd_path), &reader.token, now, "a1")).await,
        },
        Case {
            what: "malformed JWS",
            status: 401,
            code: "token_invalid",
            answer: send(&exec, "not.a-jws".into()).await,
        },
        Case {
            what: "alg none",
            status: 401,
            code: "token_invalid",
            answer: send(&exec, format!("{}.{}.", enc(json!({"alg": "none"})), enc(claims.clone()))).await,
        },
        Case {
            what: "HS256",
            status: 401,
            code: "token_invalid",
            answer: send(
                &exec,
                format!("{}.{}.{}", enc(json!({"alg": "HS256"})), enc(claims.clone()), b64.encode([1u8; 32])),
            )
            .await,
        },
        Case {
            what: "no proof",
            status: 401,
            code: "token_invalid",
            answer: gw.call("POST", &cmd_path, Some(&exec.token), Some(&echo), &[]).await,
        },
        Case {
            what: "token of another session",
            status: 403,
            code: "token_scope_forbidden",
            answer: gw.as_token(&exec_b, "POST", &cmd_path, Some(&echo)).await,
        },
        Case {
            what: "token of another tenant's session, reading",
            status: 403,
            code: "token_scope_forbidden",
            answer: gw.as_token(&exec_b, "GET", &base, None).await,
        },
        Case {
            what: "token of another session, reading its certificate",
            status: 403,
            code: "token_scope_forbidden",
            answer: gw.as_token(&exec_b, "GET", &format!("{base}/certificate"), None).await,
        },
        Case {
            what: "session token listing the certificate keys (members only)",
            status: 403,
            code: "token_scope_forbidden",
            answer: gw.as_token(&exec, "GET", "/v1/certificate-keys", None).await,
        },
        Case {
            what: "token of another namespace",
            status: 403,
            code: "token_scope_forbidden",
            answer: gw.as_token(&exec_o, "POST", &cmd_path, Some(&echo)).await,
        },
        Case {
            what: "token on a session that does not exist",
            status: 403,
            code: "token_scope_forbidden",
            answer: gw.as_token(&exec, "GET", "/v1/sandboxes/00000000-0000-0000-0000-000000000000", None).await,
        },
        Case {
            what: "read sending a command",
            status: 403,
            code: "token_scope_forbidden",
            answer: gw.as_token(&reader, "POST", &cmd_path, Some(&echo)).await,
        },
        Case {
            what: "exec pausing",
            status: 403,
            code: "token_scope_forbidden",
            answer: gw.as_token(&exec, "POST", &format!("{base}/pause"), None).await,
        },
        Case {
            what: "exec pausing through sandbox-session",
            status: 403,
            code: "token_scope_forbidden",
            answer: gw.as_token(&exec, "POST", "/v1/sandbox-session/pause", None).await,
        },
        Case {
            what: "control sending a command",
            status: 403,
            code: "token_scope_forbidden",
            answer: gw.as_token(&control, "POST", &cmd_path, Some(&echo)).await,
        },
        Case {
            what: "control cancelling another's command",
            status: 403,
            code: "token_scope_forbidden",
            answer: gw.as_token(&control, "POST", &format!("{cmd_path}/{member_cmd}/cancel"), None).await,
        },
        Case {
            what: "a token minting a token",
            status: 403,
            code: "token_scope_forbidden",
            answer: gw
                .as_token(
                    &exec,
                    "POST",
                    &format!("{base}/tokens"),
                    Some(&json!({"scopes": ["exec"], "publicKey": jwk(&stranger)})),
                )
                .await,
        },
        Case {
            what: "a token revoking a token",
            status: 403,
            code: "token_scope_forbidden",
            answer: gw.as_token(&exec, "DELETE", &format!("{base}/tokens/reader"), None).await,
        },
        Case {
            what: "a token starting a session",
            status: 403,
            code: "token_scope_forbidden",
            answer: gw.as_token(&exec, "POST", "/v1/sandboxes", Some(&json!({"namespace": ns}))).await,
        },
        Case {
            what: "a member token on sandbox-session",
            status: 401,
            code: "token_invalid",
            answer: gw.call("POST", "/v1/sandbox-session/stop", Some(&owner), None, &[]).await,
        },
        Case {
            what: "malformed body",
            status: 400,
            code: "bad_request",
            answer: gw.as_token(&exec, "POST", &cmd_path, Some(&json!({"argv": "not a list"}))).await,
        },
        Case {
            what: "interactive body",
            status: 400,
            code: "bad_request",
            answer: gw.as_token(&exec, "POST", &cmd_path, Some(&json!({"argv": ["sh"], "tty": true}))).await,
        },
    ];
    // A body over the 1 MiB limit: refused (400), or the connection closed
    // before it is all read; either way nothing is made.
    let proof = exec.proof("POST", &url(&cmd_path));
    let oversize = json!({"argv": ["x".repeat((1 << 20) + 1024)]});
    let answer = gw.try_call("POST", &cmd_path, Some(&exec.token), Some(&oversize), &[("Hangar-Proof", &proof)]).await;
    match &answer {
        Ok((status, body)) => assert_eq!((*status, code(body)), (400, "bad_request"), "oversize body"),
        Err(e) => assert!(e.is_request(), "oversize body: {e}"),
    }
    // Revoked: refused at once (before the operator records it).
    let (status, revoked) = gw.call("DELETE", &format!("{base}/tokens/doomed"), Some(&owner), None, &[]).await;
    assert_eq!((status, revoked["phase"].as_str()), (200, Some("revoked")), "{revoked}");
    cases.push(Case {
        what: "revoked token",
        status: 401,
        code: "token_invalid",
        answer: gw.as_token(&doomed, "POST", &cmd_path, Some(&echo)).await,
    });
    // The 33rd active token of a session.
    let active = tokens
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|t| t.spec.sandbox == "box" && !t.spec.revoked)
        .count();
    for i in active..32 {
        mint_token(&gw, &owner, &sid, &format!("filler-{i}"), &["read"], 600).await;
    }
    let body = json!({"name": "one-too-many", "scopes": ["read"], "publicKey": jwk(&stranger)});
    cases.push(Case {
        what: "33rd token",
        status: 409,
        code: "sandbox_token_limit",
        answer: gw.call("POST", &format!("{base}/tokens"), Some(&owner), Some(&body), &[]).await,
    });
    let mut failed = Vec::new();
    for c in &cases {
        let (status, body) = &c.answer;
        if (*status, code(body)) != (c.status, c.code) {
            failed.push(format!("{}: got {status} {body}, want {} {}", c.what, c.status, c.code));
        }
    }
    assert!(failed.is_empty(), "refused wrongly:\n{}", failed.join("\n"));

    // Through kubectl as the token's identity, admission refuses the same.
    let cmd = |name: &str, sandbox: &str| {
        json!({"apiVersion": "hangar.dev/v1alpha1", "kind": "Command", "metadata": {"name": name, "namespace": ns},
               "spec": {"sandbox": sandbox, "argv": ["true"]}})
    };
    let mut kubectl_cases = vec![
        (
            "read creating a command",
            kubectl_apply_as_token(stack, ns, "reader", &cmd("k-read", "box")),
            "token_scope_forbidden",
        ),
        (
            "exec creating in another session",
            kubectl_apply_as_token(stack, ns, "runner", &cmd("k-other", "box-b")),
            "token_scope_forbidden",
        ),
        (
            "revoked token creating",
            kubectl_apply_as_token(stack, ns, "doomed", &cmd("k-doomed", "box")),
            "token_invalid",
        ),
        ("no such token", kubectl_apply_as_token(stack, ns, "nobody", &cmd("k-nobody", "box")), "token_invalid"),
        (
            "exec pausing",
            patch_as_token(stack, ns, "runner", "sandbox", "box", json!({"spec": {"state": "Paused"}})).await,
            "token_scope_forbidden",
        ),
        (
            "control changing stopAfterSeconds",
            patch_as_token(stack, ns, "pilot", "sandbox", "box", json!({"spec": {"stopAfterSeconds": 604800}})).await,
            "token_scope_forbidden",
        ),
        (
            "exec labelling a command",
            patch_as_token(stack, ns, "runner", "command", &member_cmd, json!({"metadata": {"labels": {"x": "y"}}}))
                .await,
            "token_scope_forbidden",
        ),
        (
            "exec cancelling another session's command",
            patch_as_token(stack, ns, "runner-b", "command", &member_cmd, json!({"spec": {"cancel": true}})).await,
            "token_scope_forbidden",
        ),
        (
            "a token's identity in another namespace",
            patch_as_token(stack, other_ns, "runner", "sandbox", "box", json!({"spec": {"state": "Ended"}})).await,
            "token_scope_forbidden",
        ),
        (
            "a token's identity deleting a session",
            {
                let c = stack
                    .cp
                    .client_impersonating("hangar:token:tok-api:pilot", &["hangar:session-tokens"])
                    .await
                    .unwrap();
                let r = Api::<Sandbox>::namespaced(c, ns).delete("box", &Default::default()).await;
                (r.is_ok(), r.err().map(|e| e.to_string()).unwrap_or_default())
            },
            "forbidden",
        ),
    ];
    // Un-revoking by re-applying the old manifest: the schema refuses.
    let out = stack
        .cp
        .kubectl()
        .args(["patch", "sessiontoken", "doomed", "-n", ns, "--type=merge", "-p", r#"{"spec":{"revoked":false}}"#])
        .output()
        .unwrap();
    kubectl_cases.push((
        "un-revoking",
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned()),
        "sandbox_request_invalid",
    ));
    // Forging sentBy, even as an administrator: written once, by the operator.
    let forged = Api::<Command>::namespaced(client.clone(), ns)
        .patch_status(&sent_name, &PatchParams::default(), &Patch::Merge(json!({"status": {"sentBy": "owner"}})))
        .await;
    kubectl_cases.push((
        "forging sentBy",
        (forged.is_ok(), forged.err().map(|e| e.to_string()).unwrap_or_default()),
        "written once",
    ));
    // And as the token's own identity: it may not write any status at all.
    let as_token =
        stack.cp.client_impersonating("hangar:token:tok-api:runner", &["hangar:session-tokens"]).await.unwrap();
    let forged = Api::<Command>::namespaced(as_token, ns)
        .patch_status(&sent_name, &PatchParams::default(), &Patch::Merge(json!({"status": {"sentBy": "pilot"}})))
        .await;
    kubectl_cases.push((
        "forging sentBy as the token",
        (forged.is_ok(), forged.err().map(|e| e.to_string()).unwrap_or_default()),
        "forbidden",
    ));
    let mut failed = Vec::new();
    for (what, (succeeded, err), want) in &kubectl_cases {
        if *succeeded || !err.contains(want) {
            failed.push(format!("{what}: succeeded={succeeded} {err}"));
        }
    }
    assert!(failed.is_empty(), "kubectl as a token, refused wrongly:\n{}", failed.join("\n"));
    let total = cases.len() + kubectl_cases.len();
    assert!(total >= 30, "at least 30 hostile cases, {total}");

    // Nothing changed, but the commands sent with good proofs, the
    // revocation and the fillers.
    let after = snapshot(&client, ns).await;
    let changed: Vec<&String> = after
        .keys()
        .chain(before.keys())
        .filter(|k| before.get(*k) != after.get(*k))
        .filter(|k| !k.starts_with("token/filler-") && *k != "token/doomed")
        .filter(|k| *k != &format!("command/{}", first.1["id"].as_str().unwrap()))
        .filter(|k| *k != &format!("command/{}", at_replica.1["id"].as_str().unwrap()))
        .filter(|k| *k != &format!("command/{}", used.1["id"].as_str().unwrap()))
        .collect();
    assert!(changed.is_empty(), "hostile requests changed {changed:?}");
    assert_eq!(snapshot(&client, other_ns).await, before_other, "the other namespace is untouched");

    // A control token pauses and resumes through sandbox-session.
    let (status, paused) = gw.as_token(&control, "POST", "/v1/sandbox-session/pause", None).await;
    assert_eq!(status, 202, "{paused}");
    sessions::wait_phase(stack, &boxes, "box", Phase::Paused).await;
    let (status, again) = gw.as_token(&control, "POST", "/v1/sandbox-session/pause", None).await;
    assert_eq!((status, code(&again)), (409, "sandbox_not_running"));
    let (status, resumed) = gw.as_token(&control, "POST", "/v1/sandbox-session/resume", None).await;
    assert_eq!(status, 202, "{resumed}");
    sessions::wait_phase(stack, &boxes, "box", Phase::Running).await;

    // The short token expires: refused, and recorded expired.
    let expires = tokens.get("short").await.unwrap().status.unwrap().expires_at.unwrap().0;
    let wait = expires.duration_since(k8s_openapi::jiff::Timestamp::now()).as_secs().max(0) as u64 + 1;
    assert!(wait <= 61, "a 60 s token");
    tokio::time::sleep(Duration::from_secs(wait)).await;
    let (status, expired) = gw.as_token(&short, "GET", &base, None).await;
    assert_eq!((status, code(&expired)), (401, "token_invalid"), "expired");
    let t = sessions::wait_object(
        &tokens,
        "short",
        "expired",
        |t| t.status.as_ref().and_then(|s| s.phase) == Some(TokenPhase::Expired),
        |t| format!("{t:?}"),
    )
    .await;
    assert_eq!(t.status.unwrap().reason.as_deref(), Some("ttl_elapsed"));

    // The session ends: exec is over, a read token still reads and attaches.
    let (status, _) = gw.as_token(&control, "POST", "/v1/sandbox-session/stop", None).await;
    assert_eq!(status, 202);
    sessions::wait_phase(stack, &boxes, "box", Phase::Ended).await;
    let (status, after_end) = gw.as_token(&exec, "POST", &cmd_path, Some(&echo)).await;
    assert_eq!((status, code(&after_end)), (401, "token_invalid"), "exec after the end: {after_end}");
    let (status, final_state) = gw.as_token(&reader, "GET", &base, None).await;
    assert_eq!((status, final_state["phase"].as_str()), (200, Some("ended")), "{final_state}");
    let (status, _) = gw.as_token(&reader, "GET", &format!("{base}/attach"), None).await;
    assert_eq!(status, 200);
    let (status, out) = gw.as_token(&reader, "GET", &format!("{cmd_path}/{sent_name}/output?after=0"), None).await;
    assert_eq!(status, 200, "{out}");
    let (status, refused) = gw.as_token(&reader, "POST", &cmd_path, Some(&echo)).await;
    assert_eq!((status, code(&refused)), (403, "token_scope_forbidden"), "read after the end sends nothing");
    let (status, refused) = gw.as_token(&control, "POST", "/v1/sandbox-session/resume", None).await;
    assert_eq!((status, code(&refused)), (401, "token_invalid"), "control after the end");
    // Anything else the reader tries after the end is refused, through the
    // gateway and as its own identity through the API, and changes nothing.
    let before_end = snapshot(&client, ns).await;
    let (status, listed) = gw.as_token(&reader, "GET", &cmd_path, None).await;
    assert_eq!(status, 200, "the reader lists commands after the end: {listed}");
    let reader_acts = [
        ("POST", format!("{cmd_path}/{sent_name}/cancel")),
        ("POST", format!("{base}/pause")),
        ("POST", format!("{base}/resume")),
        ("POST", format!("{base}/stop")),
        ("POST", format!("{base}/revoke-all")),
        ("POST", "/v1/sandbox-session/pause".to_owned()),
        ("POST", "/v1/sandbox-session/resume".to_owned()),
        ("POST", "/v1/sandbox-session/stop".to_owned()),
        ("POST", "/v1/sandbox-session/revoke-all".to_owned()),
        ("POST", format!("{base}/tokens")),
        ("DELETE", format!("{base}/tokens/runner")),
    ];
    for (method, path) in &reader_acts {
        let (status, v) = gw.as_token(&reader, method, path, Some(&json!({}))).await;
        assert_eq!((status, code(&v)), (403, "token_scope_forbidden"), "reader after the end: {method} {path}: {v}");
    }
    let (ok, why) = patch_as_token(stack, ns, "reader", "sandbox", "box", json!({"spec": {"state": "Running"}})).await;
    assert!(!ok, "the reader's identity revives the session through the API: {why}");
    let (ok, why) = kubectl_apply_as_token(
        stack,
        ns,
        "reader",
        &json!({"apiVersion": "hangar.dev/v1alpha1", "kind": "Command",
            "metadata": {"name": "late"}, "spec": {"sandbox": "box", "argv": ["true"]}}),
    );
    assert!(!ok, "the reader's identity sends a command through the API: {why}");
    assert_eq!(snapshot(&client, ns).await, before_end, "nothing the reader tried changed anything");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tokens_end_cancels_the_commands_it_queued_and_its_running_one_finishes() {
    let stack = shared_stack();
    let ns = "tok-cancel";
    let (boxes, commands, s) = sessions::running_box(stack, ns).await;
    let sid = s.uid().unwrap();
    let gw = stack.gateway_client();
    let owner = member_token(&stack.cp, ns, "owner", "get,list,create,patch");
    gw.wait_known(&sid, &owner).await;
    let exec = mint_token(&gw, &owner, &sid, "runner", &["exec", "read"], 600).await;
    // Lives the shortest a token may (60 s): its end is its expiry.
    let brief = mint_token(&gw, &owner, &sid, "brief", &["exec"], 60).await;
    let base = format!("/v1/sandboxes/{sid}");

    // Running when the token ends: runs on to its end.
    let long = json!({"argv": ["sh", "-c", "sleep 2; echo finished"]});
    let (status, running) = gw.as_token(&exec, "POST", &format!("{base}/commands"), Some(&long)).await;
    assert_eq!(status, 201, "{running}");
    let running = running["id"].as_str().unwrap().to_owned();
    wait_command(&commands, &running, "running", |c| command_phase(c) == Some(CommandPhase::Running)).await;

    // Queued while paused.
    let (status, _) = gw.call("POST", &format!("{base}/pause"), Some(&owner), None, &[]).await;
    assert_eq!(status, 202);
    let killed = wait_command(&commands, &running, "ended by the pause", |c| {
        command_phase(c).is_some_and(CommandPhase::is_final)
    })
    .await;
    assert_eq!(command_phase(&killed), Some(CommandPhase::KilledAtPause), "a pause ends running commands");
    sessions::wait_phase(stack, &boxes, "box", Phase::Paused).await;
    let mut queued = Vec::new();
    for i in 0..3 {
        let body = json!({"argv": ["sh", "-c", format!("echo queued-{i}")]});
        let (status, c) = gw.as_token(&exec, "POST", &format!("{base}/commands"), Some(&body)).await;
        assert_eq!(status, 201, "{c}");
        queued.push(c["id"].as_str().unwrap().to_owned());
    }
    let (status, c) = gw.as_token(&brief, "POST", &format!("{base}/commands"), Some(&json!({"argv": ["true"]}))).await;
    assert_eq!(status, 201, "{c}");
    let by_brief = c["id"].as_str().unwrap().to_owned();
    for q in queued.iter().chain([&by_brief]) {
        wait_command(&commands, q, "queued", |c| command_phase(c) == Some(CommandPhase::Queued)).await;
    }
    // A member's queued command is not the token's: it runs after resume.
    let (status, mine) =
        gw.call("POST", &format!("{base}/commands"), Some(&owner), Some(&json!({"argv": ["true"]})), &[]).await;
    assert_eq!(status, 201);
    let mine = mine["id"].as_str().unwrap().to_owned();

    // The token cancels one of its own through the gateway (exec), and lists
    // the session's commands (read).
    let (status, cancelled) = gw.as_token(&exec, "POST", &format!("{base}/commands/{}/cancel", queued[0]), None).await;
    assert_eq!(status, 200, "{cancelled}");
    let c =
        wait_command(&commands, &queued[0], "cancelled", |c| command_phase(c) == Some(CommandPhase::Cancelled)).await;
    assert_eq!(c.status.unwrap().reason.as_deref(), Some("cancelled before it ran"));
    let (status, list) = gw.as_token(&exec, "GET", &format!("{base}/commands"), None).await;
    assert_eq!(status, 200);
    assert!(list["commands"].as_array().unwrap().len() >= 5, "{list}");
    let queued: Vec<String> = queued[1..].to_vec();

    let (status, _) = gw.call("DELETE", &format!("{base}/tokens/runner"), Some(&owner), None, &[]).await;
    assert_eq!(status, 200);
    for q in &queued {
        let c = wait_command(&commands, q, "cancelled", |c| command_phase(c) == Some(CommandPhase::Cancelled)).await;
        assert_eq!(c.status.unwrap().reason.as_deref(), Some("the session token that sent it ended before it ran"));
    }
    // The brief token expires while the session is paused: its queued
    // command is cancelled as a revoked token's is.
    let c = wait_command(&commands, &by_brief, "cancelled at its token's expiry", |c| {
        command_phase(c) == Some(CommandPhase::Cancelled)
    })
    .await;
    assert_eq!(c.status.unwrap().reason.as_deref(), Some("the session token that sent it ended before it ran"));
    let tokens: Api<SessionToken> = Api::namespaced(stack.cp.client().await.unwrap(), ns);
    let brief_now = tokens.get("brief").await.unwrap().status.unwrap();
    assert_eq!(brief_now.phase, Some(TokenPhase::Expired), "it ended by expiry, not revocation");
    let queued: Vec<String> = queued.into_iter().chain([by_brief]).collect();
    // A control token resumes through the session's own route.
    let pilot = mint_token(&gw, &owner, &sid, "pilot", &["control"], 600).await;
    let (status, resumed) = gw.as_token(&pilot, "POST", &format!("{base}/resume"), None).await;
    assert_eq!(status, 202, "{resumed}");
    sessions::wait_phase(stack, &boxes, "box", Phase::Running).await;
    let ran = wait_command(&commands, &mine, "exited", |c| command_phase(c) == Some(CommandPhase::Exited)).await;
    assert_eq!(ran.status.unwrap().exit_code, Some(0));
    for q in &queued {
        let c = commands.get(q).await.unwrap();
        assert_eq!(command_phase(&c), Some(CommandPhase::Cancelled), "never run after resume");
        assert!(c.status.unwrap().started_at.is_none(), "{q} never started");
    }

    // A running command outlives its token's end.
    let exec2 = mint_token(&gw, &owner, &sid, "runner-2", &["exec"], 600).await;
    let (status, r) = gw.as_token(&exec2, "POST", &format!("{base}/commands"), Some(&long)).await;
    assert_eq!(status, 201);
    let r = r["id"].as_str().unwrap().to_owned();
    wait_command(&commands, &r, "running", |c| command_phase(c) == Some(CommandPhase::Running)).await;
    let (status, _) = gw.call("DELETE", &format!("{base}/tokens/runner-2"), Some(&owner), None, &[]).await;
    assert_eq!(status, 200);
    let done = wait_command(&commands, &r, "exited", |c| command_phase(c).is_some_and(CommandPhase::is_final)).await;
    assert_eq!((command_phase(&done), done.status.unwrap().exit_code), (Some(CommandPhase::Exited), Some(0)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_answers_with_the_contracts_codes() {
    let stack = shared_stack();
    let ns = "routes";
    let client = stack.cp.client().await.unwrap();
    sessions::ensure_namespace(&client, ns).await;
    let gw: GatewayClient = stack.gateway_client();
    let owner = member_token(&stack.cp, ns, "owner", "get,list,create,patch");
    let boxes: Api<Sandbox> = Api::namespaced(client.clone(), ns);

    // Start a session; the same key and body: the same session.
    let start = json!({"namespace": ns, "mode": "commands", "image": sessions::TEST_IMAGE, "tenant": "acme"});
    let key = [("Idempotency-Key", "start-1")];
    let (status, made) = gw.call("POST", "/v1/sandboxes", Some(&owner), Some(&start), &key).await;
    assert_eq!(status, 201, "{made}");
    let sid = made["id"].as_str().unwrap().to_owned();
    let (status, again) = gw.call("POST", "/v1/sandboxes", Some(&owner), Some(&start), &key).await;
    assert_eq!((status, again["id"].as_str()), (200, Some(sid.as_str())), "{again}");
    let other = json!({"namespace": ns, "mode": "commands", "image": sessions::TEST_IMAGE, "tenant": "other"});
    let (status, v) = gw.call("POST", "/v1/sandboxes", Some(&owner), Some(&other), &key).await;
    assert_eq!((status, code(&v)), (400, "sandbox_request_invalid"), "{v}");
    let (status, v) =
        gw.call("POST", "/v1/sandboxes", Some(&owner), Some(&json!({"namespace": ns, "colour": "red"})), &[]).await;
    assert_eq!((status, code(&v)), (400, "bad_request"), "{v}");
    let (status, v) = gw
        .call(
            "POST",
            "/v1/sandboxes",
            Some(&owner),
            Some(&json!({"namespace": ns, "mode": "agent", "image": "not-pinned"})),
            &[],
        )
        .await;
    assert_eq!((status, code(&v)), (400, "sandbox_request_invalid"), "{v}");
    let stranger = member_token(&stack.cp, ns, "stranger", "");
    let (status, v) = gw.call("POST", "/v1/sandboxes", Some(&stranger), Some(&start), &[]).await;
    assert_eq!((status, code(&v)), (403, "forbidden"), "{v}");
    let made = boxes.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(made.len(), 1, "one session from three starts");
    let name = made[0].name_any();
    gw.wait_known(&sid, &owner).await;
    let base = format!("/v1/sandboxes/{sid}");

    // Pause before it runs: not running. Snapshot: 501.
    let (status, v) =
        gw.call("POST", &format!("{base}/snapshots"), Some(&owner), Some(&json!({"kind": "live_state"})), &[]).await;
    assert_eq!((status, code(&v)), (501, "sandbox_live_snapshot_unsupported"));
    sessions::wait_phase(stack, &boxes, &name, Phase::Running).await;
    let (status, v) = gw.call("POST", &format!("{base}/pause"), Some(&owner), None, &[]).await;
    assert_eq!(status, 202, "{v}");
    let (status, v) = gw.call("POST", &format!("{base}/pause"), Some(&owner), None, &[]).await;
    assert_eq!((status, code(&v)), (409, "sandbox_not_running"));
    sessions::wait_phase(stack, &boxes, &name, Phase::Paused).await;
    let (status, _) = gw.call("POST", &format!("{base}/resume"), Some(&owner), None, &[]).await;
    assert_eq!(status, 202);
    sessions::wait_phase(stack, &boxes, &name, Phase::Running).await;
    let (status, v) = gw.call("POST", &format!("{base}/revoke-all"), Some(&owner), None, &[]).await;
    assert_eq!(status, 202, "{v}");
    let ended = sessions::wait_phase(stack, &boxes, &name, Phase::Ended).await;
    assert_eq!(ended.status.unwrap().stop_reason.as_deref().map(|r| r.starts_with("revoke_all")), Some(true));
    for route in ["stop", "pause", "resume", "revoke-all"] {
        let (status, v) = gw.call("POST", &format!("{base}/{route}"), Some(&owner), None, &[]).await;
        assert_eq!((status, code(&v)), (409, "sandbox_ended"), "{route} after the end");
    }

    // Mode agent cannot pause.
    boxes.create(&PostParams::default(), &sessions::sandbox("agent", "agent", json!({}))).await.unwrap();
    let agent = sessions::wait_for(stack, &boxes, "agent", "with an id", |s| s.uid().is_some()).await;
    let aid = agent.uid().unwrap();
    gw.wait_known(&aid, &owner).await;
    let (status, v) = gw.call("POST", &format!("/v1/sandboxes/{aid}/pause"), Some(&owner), None, &[]).await;
    assert_eq!((status, code(&v)), (409, "sandbox_pause_unavailable"));

    // Templates, the document, and routes that do not exist.
    let (status, v) = gw.get("/v1/sandbox-templates", &owner).await;
    assert_eq!(status, 200, "{v}");
    assert!(v["templates"].is_array());
    let (status, doc) = gw.call("GET", "/v1/openapi.json", None, None, &[]).await;
    assert_eq!((status, doc["openapi"].as_str()), (200, Some("3.1.0")));
    let paths = doc["paths"].as_object().unwrap();
    assert!(paths.len() >= 19, "{}", paths.len());
    let mut routes = 0;
    for (path, ops) in paths {
        let concrete = path.replace("{id}", &sid).replace("{cid}", "c").replace("{name}", "n");
        for method in ops.as_object().unwrap().keys() {
            let (status, v) = gw.call(&method.to_uppercase(), &concrete, None, None, &[]).await;
            let want = if path == "/v1/openapi.json" { 200 } else { 401 };
            assert_eq!(status, want, "{method} {path} is documented and answers: {v}");
            routes += 1;
        }
        // The other way round: no method the document leaves out is served
        // on a documented path.
        for method in ["get", "post", "put", "patch", "delete"] {
            if !ops.as_object().unwrap().contains_key(method) {
                let (status, v) = gw.call(&method.to_uppercase(), &concrete, None, None, &[]).await;
                assert_eq!(status, 405, "{method} {path} is not documented, so not served: {v}");
            }
        }
    }
    assert!(routes >= 20, "{routes} routes documented");
    for (method, path) in [("GET", "/v1/nothing"), ("POST", "/v1/sandboxes/x/teleport"), ("GET", "/")] {
        let (status, v) = gw.call(method, path, Some(&owner), None, &[]).await;
        assert_eq!(status, 404, "{method} {path}: {v}");
        assert!(v["error"]["code"].is_string(), "{v}");
    }
    let (status, _) = gw.call("DELETE", &base, Some(&owner), None, &[]).await;
    assert_eq!(status, 405, "a route with another method");
}

/// The lifecycle routes and the member-only ones through both kinds of
/// caller: what each kind may do succeeds with the contract's code, and
/// the other kind is refused with its own (a session token on a member
/// route: 403 `token_scope_forbidden`; a member on a `sandbox-session`
/// route: 401 `token_invalid`), the session unchanged by the refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_and_member_routes_answer_each_kind_of_caller() {
    let stack = shared_stack();
    let ns = "routes-both";
    let client = stack.cp.client().await.unwrap();
    sessions::ensure_namespace(&client, ns).await;
    let boxes: Api<Sandbox> = Api::namespaced(client.clone(), ns);
    let gw = stack.gateway_client();
    let owner = member_token(&stack.cp, ns, "owner", "get,list,create,patch");
    for name in ["a", "b", "c", "d"] {
        boxes.create(&PostParams::default(), &sessions::sandbox(name, "commands", json!({}))).await.unwrap();
    }
    let mut ids = BTreeMap::new();
    for name in ["a", "b", "c", "d"] {
        let s = sessions::wait_phase(stack, &boxes, name, Phase::Running).await;
        let sid = s.uid().unwrap();
        gw.wait_known(&sid, &owner).await;
        ids.insert(name, sid);
    }
    let (a, b, c, d) = (&ids["a"], &ids["b"], &ids["c"], &ids["d"]);
    let pilot_a = mint_token(&gw, &owner, a, "pilot-a", &["control", "read"], 600).await;
    let pilot_b = mint_token(&gw, &owner, b, "pilot-b", &["control"], 600).await;
    let pilot_c = mint_token(&gw, &owner, c, "pilot-c", &["control"], 600).await;
    let spec_of = |s: &Sandbox| serde_json::to_value(&s.spec).unwrap();

    // Member-only routes refuse a session token, even one of scope control.
    let before = spec_of(&boxes.get("a").await.unwrap());
    let (status, v) = gw.as_token(&pilot_a, "GET", "/v1/sandbox-templates", None).await;
    assert_eq!((status, code(&v)), (403, "token_scope_forbidden"), "templates as a token: {v}");
    let live = json!({"kind": "live_state"});
    let (status, v) = gw.as_token(&pilot_a, "POST", &format!("/v1/sandboxes/{a}/snapshots"), Some(&live)).await;
    assert_eq!((status, code(&v)), (403, "token_scope_forbidden"), "snapshot as a token: {v}");
    // A member on the session-token routes: they name no session, so
    // only a session token says which.
    for route in ["pause", "resume", "stop", "revoke-all"] {
        let (status, v) = gw.call("POST", &format!("/v1/sandbox-session/{route}"), Some(&owner), None, &[]).await;
        assert_eq!((status, code(&v)), (401, "token_invalid"), "sandbox-session/{route} as a member: {v}");
    }
    assert_eq!(spec_of(&boxes.get("a").await.unwrap()), before, "no refusal changed session a");

    // Pause by a control token on the member route, resume by the member.
    let (status, v) = gw.as_token(&pilot_a, "POST", &format!("/v1/sandboxes/{a}/pause"), None).await;
    assert_eq!(status, 202, "pause with a control token: {v}");
    sessions::wait_phase(stack, &boxes, "a", Phase::Paused).await;
    let (status, v) = gw.as_token(&pilot_a, "POST", "/v1/sandbox-session/pause", None).await;
    assert_eq!((status, code(&v)), (409, "sandbox_not_running"), "paused already: {v}");
    let (status, v) = gw.call("POST", &format!("/v1/sandboxes/{a}/resume"), Some(&owner), None, &[]).await;
    assert_eq!(status, 202, "resume by the member: {v}");
    sessions::wait_phase(stack, &boxes, "a", Phase::Running).await;

    // A control token of another session, while that session is live (the
    // reset revokes it once its own session ends).
    let (status, v) = gw.as_token(&pilot_b, "POST", &format!("/v1/sandboxes/{d}/stop"), None).await;
    assert_eq!(status, 403, "a control token of another session: {v}");

    // Each way to end a session: stop by the member, revoke-all by a
    // control token on either route.
    let (status, v) = gw.call("POST", &format!("/v1/sandboxes/{a}/stop"), Some(&owner), None, &[]).await;
    assert_eq!(status, 202, "stop by the member: {v}");
    let (status, v) = gw.as_token(&pilot_b, "POST", &format!("/v1/sandboxes/{b}/revoke-all"), None).await;
    assert_eq!(status, 202, "revoke-all with a control token: {v}");
    let (status, v) = gw.as_token(&pilot_c, "POST", "/v1/sandbox-session/revoke-all", None).await;
    assert_eq!(status, 202, "sandbox-session/revoke-all: {v}");
    for (name, reason) in [("a", "cancelled"), ("b", "revoke_all"), ("c", "revoke_all")] {
        let ended = sessions::wait_phase(stack, &boxes, name, Phase::Ended).await;
        let got = ended.status.and_then(|s| s.stop_reason).unwrap_or_default();
        assert!(got.starts_with(reason), "{name} ended by {reason}, not {got}");
    }
    let d_now = boxes.get("d").await.unwrap();
    assert_eq!(sessions::phase(&d_now), Some(Phase::Running), "session d untouched");
    // After the end every token is revoked, pilot-a too: its own routes
    // answer 401, the member's 409.
    let (status, v) = gw.as_token(&pilot_a, "POST", "/v1/sandbox-session/stop", None).await;
    assert_eq!((status, code(&v)), (401, "token_invalid"), "a token after its session ended: {v}");
    let (status, v) = gw.call("POST", &format!("/v1/sandboxes/{a}/stop"), Some(&owner), None, &[]).await;
    assert_eq!((status, code(&v)), (409, "sandbox_ended"), "{v}");
}

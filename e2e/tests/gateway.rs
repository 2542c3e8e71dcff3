//! The gateway's member routes over HTTPS on the local stack: auth by
//! TokenReview + SubjectAccessReview, session state, attach, commands with
//! Idempotency-Key, output by byte offset with long-poll, cancel, and the
//! contract's error shape and codes.

use std::time::{Duration, Instant};

use base64::Engine;
use hangar_e2e::gateway::member_token;
use hangar_e2e::sessions::{self};
use hangar_e2e::shared_stack;
use kube::ResourceExt;
use serde_json::{Value, json};

fn code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("(no error code)")
}

/// Reads output from `after` until `want` bytes arrived or the command ended.
fn decode(v: &Value) -> Vec<(String, u64, Vec<u8>)> {
    v["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let data = base64::engine::general_purpose::STANDARD.decode(c["data"].as_str().unwrap()).unwrap();
            (c["stream"].as_str().unwrap().to_owned(), c["offset"].as_u64().unwrap(), data)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_drive_commands_and_read_output_through_the_gateway() {
    let stack = shared_stack();
    let ns = "gw-members";
    let (boxes, _, s) = sessions::running_box(stack, ns).await;
    let sid = s.uid().unwrap();
    let gw = stack.gateway_client();
    let member = member_token(&stack.cp, ns, "dev", "get,list,create,patch");
    let stranger = member_token(&stack.cp, ns, "stranger", "");
    let base = format!("/v1/sandboxes/{sid}");
    gw.wait_known(&sid, &member).await;

    // Auth.
    let (st, body) = gw.call("GET", &base, None, None, &[]).await;
    assert_eq!((st, code(&body)), (401, "token_invalid"));
    let (st, body) = gw.get(&base, "not-a-token").await;
    assert_eq!((st, code(&body)), (401, "token_invalid"));
    // A caller who may not read the session gets exactly what a session
    // that does not exist gets: probing ids reveals nothing.
    let (st, hidden) = gw.get(&base, &stranger).await;
    assert_eq!((st, code(&hidden)), (404, "sandbox_not_found"), "{hidden}");
    let absent_id = "00000000-0000-0000-0000-000000000000";
    let (st, absent) = gw.get(&format!("/v1/sandboxes/{absent_id}"), &member).await;
    assert_eq!((st, code(&absent)), (404, "sandbox_not_found"));
    assert_eq!(hidden.to_string().replace(&sid, absent_id), absent.to_string(), "the same answer");
    assert!(!hidden.to_string().contains(ns), "no namespace named: {hidden}");
    // One who can see it but not send to it is forbidden, and told no more.
    let reader = member_token(&stack.cp, ns, "reader", "get");
    let (st, body) =
        gw.call("POST", &format!("{base}/commands"), Some(&reader), Some(&json!({"argv": ["true"]})), &[]).await;
    assert_eq!((st, code(&body)), (403, "forbidden"), "{body}");
    assert!(!body.to_string().contains(ns), "no namespace named: {body}");

    // State.
    let (st, body) = gw.get(&base, &member).await;
    assert_eq!(st, 200, "{body}");
    assert_eq!(body["id"], sid.as_str());
    assert_eq!(body["phase"], "running");
    assert_eq!(body["attempts"][0]["cause"], "launch");

    // Send with an Idempotency-Key; the same key gives the same command.
    let cmd = json!({"argv": ["sh", "-c", "echo first; read _ < /dev/null; sleep 1; echo second >&2"]});
    let key = [("Idempotency-Key", "k-1")];
    let (st, sent) = gw.call("POST", &format!("{base}/commands"), Some(&member), Some(&cmd), &key).await;
    assert_eq!(st, 201, "{sent}");
    let cid = sent["id"].as_str().unwrap().to_owned();
    let (st, again) = gw.call("POST", &format!("{base}/commands"), Some(&member), Some(&cmd), &key).await;
    assert_eq!((st, again["id"].as_str()), (200, Some(cid.as_str())), "replay: {again}");
    let other = json!({"argv": ["true"]});
    let (st, body) = gw.call("POST", &format!("{base}/commands"), Some(&member), Some(&other), &key).await;
    assert_eq!((st, code(&body)), (400, "sandbox_request_invalid"));
    // A key is its caller's own: another member with the same key sends a
    // command of its own, neither replaying nor revealing the first.
    let colleague = member_token(&stack.cp, ns, "colleague", "get,list,create,patch");
    let (st, theirs) = gw.call("POST", &format!("{base}/commands"), Some(&colleague), Some(&other), &key).await;
    assert_eq!(st, 201, "{theirs}");
    assert_ne!(theirs["id"].as_str(), Some(cid.as_str()));
    for bad in [
        json!({"argv": ["sh"], "stdin": "ls\n"}),
        json!({"argv": ["bash"], "tty": true}),
        json!({"argv": ["bash"], "interactive": true}),
    ] {
        let (st, body) = gw.call("POST", &format!("{base}/commands"), Some(&member), Some(&bad), &[]).await;
        assert_eq!((st, code(&body)), (400, "bad_request"), "{bad}");
    }

    // Output from 0: the first line comes as soon as it is stored.
    for bad in ["after=abc", "after=%zz"] {
        let (st, body) = gw.get(&format!("{base}/commands/{cid}/output?{bad}"), &member).await;
        assert_eq!((st, code(&body)), (400, "bad_request"), "{bad}: {body}");
    }
    let (st, out) = gw.get(&format!("{base}/commands/{cid}/output?after=0"), &member).await;
    assert_eq!(st, 200, "{out}");
    let chunks = decode(&out);
    assert_eq!(chunks, vec![("stdout".to_owned(), 0, b"first\n".to_vec())]);
    // Past it, the read waits for the next bytes (about a second later).
    let started = Instant::now();
    let (_, out) = gw.get(&format!("{base}/commands/{cid}/output?after=6"), &member).await;
    assert!(started.elapsed() < Duration::from_secs(20), "woke on new bytes, not at the 25 s limit");
    let mut got = decode(&out);
    let mut next = out["next"].as_u64().unwrap();
    while !out["final"].as_bool().unwrap() && got.is_empty() {
        let (_, o) = gw.get(&format!("{base}/commands/{cid}/output?after={next}"), &member).await;
        got.extend(decode(&o));
        next = o["next"].as_u64().unwrap();
    }
    assert_eq!(got, vec![("stderr".to_owned(), 6, b"second\n".to_vec())]);
    // At the end: no bytes past 13, final, status exited — at once.
    let deadline = Instant::now() + sessions::DEADLINE;
    let done = loop {
        let (_, o) = gw.get(&format!("{base}/commands/{cid}/output?after=13"), &member).await;
        if o["final"] == true {
            break o;
        }
        assert!(Instant::now() < deadline, "never final: {o}");
    };
    assert_eq!((done["status"].as_str(), done["exitCode"].as_i64()), (Some("exited"), Some(0)));
    assert!(decode(&done).is_empty());
    // Replay from an arbitrary offset.
    let (_, o) = gw.get(&format!("{base}/commands/{cid}/output?after=3"), &member).await;
    let bytes: Vec<u8> = decode(&o).into_iter().flat_map(|c| c.2).collect();
    assert_eq!(bytes, b"st\nsecond\n");
    let (st, body) = gw.get(&format!("{base}/commands/{cid}/output?after=x"), &member).await;
    assert_eq!((st, code(&body)), (400, "bad_request"));

    // Attach: state and each command's stored offset.
    let (st, att) = gw.get(&format!("{base}/attach"), &member).await;
    assert_eq!(st, 200, "{att}");
    assert_eq!(att["session"]["phase"], "running");
    let c = att["commands"].as_array().unwrap().iter().find(|c| c["id"] == cid.as_str()).unwrap();
    assert_eq!((c["status"].as_str(), c["storedOffset"].as_u64()), (Some("exited"), Some(13)));
    let s = boxes.get("box").await.unwrap();
    assert!(s.annotations().contains_key("hangar.dev/attached-at"), "attach counts as attached");

    // Cancel a running command; its key then answers sandbox_command_cancelled.
    let long = json!({"argv": ["sleep", "300"]});
    let key2 = [("Idempotency-Key", "k-2")];
    let (_, sent) = gw.call("POST", &format!("{base}/commands"), Some(&member), Some(&long), &key2).await;
    let cid2 = sent["id"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + sessions::DEADLINE;
    loop {
        let (_, list) = gw.get(&format!("{base}/commands"), &member).await;
        let c = list["commands"].as_array().unwrap().iter().find(|c| c["id"] == cid2.as_str()).cloned().unwrap();
        if c["status"] == "running" {
            break;
        }
        assert!(Instant::now() < deadline, "never running: {c}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (st, body) = gw.call("POST", &format!("{base}/commands/{cid2}/cancel"), Some(&member), None, &[]).await;
    assert_eq!(st, 200, "{body}");
    let (_, o) = gw.get(&format!("{base}/commands/{cid2}/output?after=0"), &member).await;
    assert_eq!((o["final"].as_bool(), o["status"].as_str()), (Some(true), Some("cancelled")), "{o}");
    let (st, body) = gw.call("POST", &format!("{base}/commands"), Some(&member), Some(&long), &key2).await;
    assert_eq!((st, code(&body)), (409, "sandbox_command_cancelled"));

    // An ended session takes no command.
    boxes
        .patch(
            "box",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&json!({"spec": {"state": "Ended"}})),
        )
        .await
        .unwrap();
    let deadline = Instant::now() + sessions::DEADLINE;
    loop {
        let (st, body) = gw.call("POST", &format!("{base}/commands"), Some(&member), Some(&other), &[]).await;
        if st == 409 {
            assert_eq!(code(&body), "sandbox_ended");
            break;
        }
        assert!(Instant::now() < deadline, "still accepted: {st} {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

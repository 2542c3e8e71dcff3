//! The hostile suite: every case is a real request, made as an attacker's
//! identity against the local stack, and shows the attack refused or
//! harmless, with every victim object unchanged afterwards.
//!
//! Attackers: a second tenant (a ServiceAccount with every right on the
//! hangar kinds in its own namespace), a pod's ServiceAccount with no
//! rights, any client on the network (the webhook's port), a tenant
//! against its own session's limits and numbering (as its own identity), a
//! tenant that may create Pods or bindings, a compromised session node (its
//! worker's token, its kubelet's identity), and code in the sandbox on the
//! supervisor socket.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::time::Duration;

use hangar_core::commands::ledger;
use hangar_crds::Phase;
use hangar_crds::{Command, CommandPhase, Sandbox};
use hangar_e2e::commands::{self as cmds, sh, wait_command_phase};
use hangar_e2e::gateway::{GATEWAY_AUDIENCE, https_client_trusting, member_token};
use hangar_e2e::operator::SYSTEM_NAMESPACE;
use hangar_e2e::sessions::{self, ensure_namespace, wait_phase};
use hangar_e2e::shared_stack;
use hangar_e2e::stack::LocalStack;
use hangar_runtime::delegated_auth::{AuthError, DelegatedAuth};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

fn code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("(no error code)")
}

/// The case's request was refused by the apiserver with `status`.
#[track_caller]
fn refused<T: std::fmt::Debug>(case: &str, r: Result<T, kube::Error>, status: u16) {
    match r {
        Err(kube::Error::Api(e)) if e.code == status => {}
        other => panic!("{case}: expected HTTP {status}, got {other:?}"),
    }
}

/// What must not change: the Sandbox's spec, labels and annotations, each
/// command's spec and status, and the session's ledger.
async fn snapshot(client: &kube::Client, ns: &str, session_id: &str) -> Value {
    let boxes: Api<Sandbox> = Api::namespaced(client.clone(), ns);
    let s = boxes.get("box").await.unwrap();
    let commands: Api<Command> = Api::namespaced(client.clone(), ns);
    let list: BTreeMap<String, Value> = commands
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|c| (c.name_any(), json!({"spec": c.spec, "status": c.status})))
        .collect();
    let ledgers: Api<ConfigMap> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let ledger = ledgers.get_opt(&ledger::document_name(session_id)).await.unwrap().map(|c| c.data);
    json!({"spec": s.spec, "labels": s.metadata.labels, "annotations": s.metadata.annotations,
           "commands": list, "ledger": ledger})
}

/// A victim session in `ns` with one finished command; its id.
async fn victim(stack: &LocalStack, ns: &str) -> (kube::Client, String) {
    let (_, api, s) = sessions::running_box(stack, ns).await;
    cmds::create(&api, &sh("done", "box", "echo victim-output")).await;
    wait_command_phase(stack, &api, "done", CommandPhase::Exited).await;
    (stack.cp.client().await.unwrap(), s.uid().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenant_and_a_pod_reach_nothing_of_a_session() {
    let stack = shared_stack();
    let (admin, sid) = victim(stack, "iso-victim").await;
    let before = snapshot(&admin, "iso-victim", &sid).await;
    ensure_namespace(&admin, "iso-mallory").await;
    let mallory_token = member_token(&stack.cp, "iso-mallory", "mallory", "*");
    let pod_token = member_token(&stack.cp, "iso-mallory", "some-pod", "");
    let mallory = stack.cp.client_as(&mallory_token).await.unwrap();

    // The Kubernetes API, as the other tenant.
    let boxes: Api<Sandbox> = Api::namespaced(mallory.clone(), "iso-victim");
    refused("get the victim's Sandbox", boxes.get("box").await, 403);
    refused(
        "end the victim's session",
        boxes.patch("box", &PatchParams::default(), &Patch::Merge(json!({"spec": {"state": "Ended"}}))).await,
        403,
    );
    let theirs: Api<Command> = Api::namespaced(mallory.clone(), "iso-victim");
    refused("list the victim's commands (argv, env)", theirs.list(&ListParams::default()).await, 403);
    refused("send the victim a command", theirs.create(&PostParams::default(), &sh("x", "box", "id")).await, 403);
    let status = json!({"status": {"phase": "queued"}});
    refused(
        "rewrite a victim command's status",
        theirs.patch_status("done", &PatchParams::default(), &Patch::Merge(&status)).await,
        403,
    );
    // A command in its own namespace naming the victim's Sandbox: sessions
    // are looked up in the command's own namespace only.
    let own: Api<Command> = Api::namespaced(mallory.clone(), "iso-mallory");
    let err = own.create(&PostParams::default(), &sh("reach", "box", "id")).await.unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(e) if e.code == 404 && e.message.contains("sandbox_not_found")),
        "a command for a Sandbox of another namespace: {err}"
    );
    let ledgers: Api<ConfigMap> = Api::namespaced(mallory.clone(), SYSTEM_NAMESPACE);
    refused("read the victim's command ledger", ledgers.get(&ledger::document_name(&sid)).await, 403);
    let reset = ConfigMap {
        metadata: kube::api::ObjectMeta { name: Some(ledger::document_name(&sid)), ..Default::default() },
        ..Default::default()
    };
    refused(
        "reset the victim's command ledger",
        ledgers.replace(&ledger::document_name(&sid), &PostParams::default(), &reset).await,
        403,
    );
    refused(
        "delete the victim's command ledger",
        ledgers.delete(&ledger::document_name(&sid), &DeleteParams::default()).await,
        403,
    );
    let secrets: Api<Secret> = Api::namespaced(mallory.clone(), SYSTEM_NAMESPACE);
    refused("read the organisation key", secrets.get("hangar-org-key").await, 403);
    refused("list the session and output keys", secrets.list(&ListParams::default()).await, 403);
    let pods: Api<Pod> = Api::namespaced(mallory.clone(), "iso-victim");
    refused("read the victim's agent Pod", pods.list(&ListParams::default()).await, 403);

    // The gateway, as the other tenant and as a pod: the session is as
    // absent as one that never existed, on every route.
    let gw = stack.gateway_client();
    gw.wait_known(&sid, &member_token(&stack.cp, "iso-victim", "owner", "get,list")).await;
    let absent = "00000000-0000-0000-0000-000000000000";
    let cid = "done";
    for token in [&mallory_token, &pod_token] {
        for (method, route, body) in [
            ("GET", format!("/v1/sandboxes/{sid}"), None),
            ("GET", format!("/v1/sandboxes/{sid}/attach"), None),
            ("GET", format!("/v1/sandboxes/{sid}/commands"), None),
            ("POST", format!("/v1/sandboxes/{sid}/commands"), Some(json!({"argv": ["id"]}))),
            ("GET", format!("/v1/sandboxes/{sid}/commands/{cid}/output?after=0"), None),
            ("POST", format!("/v1/sandboxes/{sid}/commands/{cid}/cancel"), None),
            ("GET", format!("/v1/sandboxes/{sid}/certificate"), None),
        ] {
            let (st, hidden) = gw.call(method, &route, Some(token), body.as_ref(), &[]).await;
            let (_, never) = gw.call(method, &route.replace(&sid, absent), Some(token), body.as_ref(), &[]).await;
            assert_eq!((st, code(&hidden)), (404, "sandbox_not_found"), "{method} {route}: {hidden}");
            assert_eq!(hidden.to_string().replace(&sid, absent), never.to_string(), "{method} {route}: same as absent");
            assert!(!hidden.to_string().contains("iso-victim"), "{method} {route} names the namespace: {hidden}");
        }
    }
    // The certificate keys are public: a pod's identity may read them, and
    // the answer is exactly the published public keys, no signing key.
    let (st, listed) = gw.get("/v1/certificate-keys", &pod_token).await;
    assert_eq!(st, 200, "{listed}");
    let maps: Api<ConfigMap> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    let published = maps.get_opt(hangar_crds::CERTIFICATE_KEYS_CONFIGMAP).await.unwrap();
    assert_eq!(listed["keys"], json!(published.and_then(|m| m.data).unwrap_or_default()), "only the published keys");
    let signing: Api<Secret> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    if let Some(secret) = signing.get_opt("hangar-certificate-signing").await.unwrap() {
        let private = String::from_utf8(secret.data.unwrap()["signing-key"].0.clone()).unwrap();
        assert!(!listed.to_string().contains(private.trim()), "the signing key is never listed");
    }
    let (st, body) = gw.get(&format!("/v1/sandboxes/{sid}"), "forged.jwt.token").await;
    assert_eq!((st, code(&body)), (401, "token_invalid"), "{body}");
    // A valid token of the victim's own member, minted for the apiserver
    // and not for the gateway, is refused: a token leaked from a pod's
    // mount is no key to the gateway.
    let out = stack.cp.kubectl().args(["create", "token", "owner", "-n", "iso-victim"]).output().unwrap();
    let api_only = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let (st, body) = gw.get(&format!("/v1/sandboxes/{sid}"), &api_only).await;
    assert_eq!((st, code(&body)), (401, "token_invalid"), "a token for another audience: {body}");
    // A refused token is remembered: repeating it costs the apiserver
    // nothing. The gateway here is shared with the other tests of this
    // binary (their new tokens are reviewed too), so through the gateway
    // only "far fewer than one review per try" holds; the exact count is
    // shown on a DelegatedAuth of this test's own, the gateway's checker,
    // against the same apiserver.
    let reviews = || {
        let m = stack.gateway.metrics();
        m.lines()
            .find_map(|l| l.strip_prefix("hangar_gateway_token_reviews_total "))
            .map(|v| v.trim().parse::<f64>().unwrap())
            .unwrap()
    };
    let before_flood = reviews();
    for _ in 0..30 {
        let (st, body) = gw.get(&format!("/v1/sandboxes/{sid}"), "made-up-token-repeated").await;
        assert_eq!((st, code(&body)), (401, "token_invalid"), "{body}");
    }
    let through_gateway = reviews() - before_flood;
    assert!(through_gateway < 15.0, "30 tries of one bad token cost {through_gateway} TokenReviews");
    let checker = DelegatedAuth::new(admin.clone(), Some(GATEWAY_AUDIENCE.into()), NonZeroU32::new(100).unwrap());
    for _ in 0..30 {
        let refused = checker.authenticate("made-up-token-repeated").await;
        assert!(matches!(refused, Err(AuthError::Invalid)), "{refused:?}");
    }
    assert_eq!(checker.token_reviews.get(), 1, "one TokenReview for 30 tries of one bad token");
    // A caller over its request rate is slowed, with the contract's shape.
    let absent_path = format!("/v1/sandboxes/{absent}");
    let flood = futures::future::join_all((0..300).map(|_| gw.get(&absent_path, &mallory_token))).await;
    let limited: Vec<&(u16, Value)> = flood.iter().filter(|(st, _)| *st == 429).collect();
    assert!(!limited.is_empty(), "300 requests at once from one caller: some are refused");
    assert!(limited.iter().all(|(_, b)| code(b) == "rate_limited"), "{:?}", limited.first());

    assert_eq!(snapshot(&admin, "iso-victim", &sid).await, before, "the victim's objects are unchanged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_takes_reviews_only_from_the_apiserver() {
    let stack = shared_stack();
    let (admin, sid) = victim(stack, "iso-webhook").await;
    let before = snapshot(&admin, "iso-webhook", &sid).await;
    let url = format!("https://127.0.0.1:{}/validate/commands", stack.webhook.port);
    // A forged review of a create for the victim's session: if it were
    // decided, a place would be reserved in the victim's ledger.
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "forged", "operation": "CREATE", "userInfo": {"username": "mallory"},
            "name": "forged", "namespace": "iso-webhook",
            "kind": {"group": "hangar.dev", "version": "v1alpha1", "kind": "Command"},
            "resource": {"group": "hangar.dev", "version": "v1alpha1", "resource": "commands"},
            "object": {"apiVersion": "hangar.dev/v1alpha1", "kind": "Command",
                       "metadata": {"name": "forged", "namespace": "iso-webhook", "uid": "forged-uid"},
                       "spec": {"sandbox": "box", "argv": ["true"]}},
        }
    });
    // Clients that trust the webhook's own certificate (made by it, its CA
    // in the configuration), so only the client certificate decides.
    let trusted = stack.webhook.ca_bundle(&stack.cp).await;
    let https_client = |_: &hangar_e2e::ControlPlane, identity| https_client_trusting(&trusted, identity);
    // Any pod on the network: no client certificate.
    let anyone = https_client(&stack.cp, None);
    let r = anyone.post(&url).json(&review).send().await;
    assert!(r.is_err(), "a review without the apiserver's certificate is refused at the handshake: {r:?}");
    // A certificate from another CA (self-made).
    let ca = hangar_e2e::pki::LocalCa::new("mallory-ca").unwrap();
    let fake = ca.client("kube-apiserver-admission", &[]).unwrap();
    let impostor = https_client(&stack.cp, Some((fake.cert.as_bytes(), fake.key.as_bytes())));
    let r = impostor.post(&url).json(&review).send().await;
    assert!(r.is_err(), "a certificate the admission CA did not issue is refused: {r:?}");
    // Even the apiserver's own client cannot send an unbounded body.
    let pki = &stack.cp.pki;
    let (cert, key) =
        (std::fs::read(&pki.admission_client_cert).unwrap(), std::fs::read(&pki.admission_client_key).unwrap());
    let apiserver = https_client(&stack.cp, Some((&cert, &key)));
    let huge = vec![b' '; 8 << 20];
    let r = apiserver.post(&url).header("content-type", "application/json").body(huge).send().await;
    assert!(r.map(|r| r.status().as_u16()).unwrap_or(413) == 413, "an 8 MiB body is refused");
    assert_eq!(snapshot(&admin, "iso-webhook", &sid).await, before, "the victim's ledger is unchanged");
}

/// Commands that wait for a file in the workspace, so the test decides
/// when they end.
fn gated(name: &str) -> Command {
    sh(name, "box", "while [ ! -e gate ]; do sleep 0.05; done")
}

fn number(c: &Command) -> i64 {
    c.status.as_ref().and_then(|s| s.number).unwrap_or_else(|| panic!("{} has no number", c.name_any()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_can_neither_stretch_nor_lock_its_sessions_limits() {
    let stack = shared_stack();
    let ns = "iso-limits";
    let (_, _, s) = sessions::running_box(stack, ns).await;
    let sid = s.uid().unwrap();
    // Everything below is the tenant's own doing: a member with every
    // right on the hangar kinds in its namespace, deletes included.
    let member = member_token(&stack.cp, ns, "dev", "get,list,create,patch,delete");
    let api: Api<Command> = Api::namespaced(stack.cp.client_as(&member).await.unwrap(), ns);
    let workspace = stack.sim.volume_dir(s.status.as_ref().unwrap().volume_id.as_ref().unwrap());
    let limit = |r: Result<Command, kube::Error>, case: &str| match r {
        Err(kube::Error::Api(e)) if e.code == 409 && e.message.contains("sandbox_command_limit") => {}
        other => panic!("{case}: expected sandbox_command_limit, got {other:?}"),
    };

    // 62 unfinished: a create of an existing name, five times, and five
    // replays of one Idempotency-Key take no place.
    let first: Vec<Command> = (1..=62).map(|i| gated(&format!("g{i:02}"))).collect();
    futures::future::join_all(first.iter().map(|c| cmds::create(&api, c))).await;
    for _ in 0..5 {
        refused("create of an existing name", api.create(&PostParams::default(), &gated("g01")).await, 409);
    }
    let gw = stack.gateway_client();
    gw.wait_known(&sid, &member).await;
    let path = format!("/v1/sandboxes/{sid}/commands");
    let body = json!({"argv": ["sh", "-c", "while [ ! -e gate ]; do sleep 0.05; done"]});
    let key = [("Idempotency-Key", "once")];
    let (st, sent) = gw.call("POST", &path, Some(&member), Some(&body), &key).await;
    assert_eq!(st, 201, "{sent}");
    for _ in 0..5 {
        let (st, again) = gw.call("POST", &path, Some(&member), Some(&body), &key).await;
        assert_eq!((st, &again["id"]), (200, &sent["id"]), "replay");
    }
    // So the 64th unfinished is admitted, and the 65th is not.
    cmds::create(&api, &gated("g64")).await;
    limit(api.create(&PostParams::default(), &gated("g65")).await, "the 65th unfinished");

    // Deleting unfinished commands frees their places (they can no longer
    // run) and never locks the session.
    for i in 1..=4 {
        api.delete(&format!("g{i:02}"), &DeleteParams::default()).await.unwrap();
    }
    cmds::create(&api, &gated("after-delete")).await;
    std::fs::write(workspace.join("gate"), b"").unwrap();
    let after = wait_command_phase(stack, &api, "after-delete", CommandPhase::Exited).await;
    // Numbers never repeat: the deleted commands' numbers stay given.
    let highest = api.list(&ListParams::default()).await.unwrap().items.iter().map(number).max().unwrap();
    assert_eq!(number(&after), highest, "numbered after every earlier one");
    assert_eq!(number(&after), 65, "63 commands, a replayed one and this: the deleted numbers are not reused");
    // Delete every finished command, the highest included: the next one
    // still gets a fresh number.
    for c in api.list(&ListParams::default()).await.unwrap().items {
        api.delete(&c.name_any(), &DeleteParams::default()).await.unwrap();
    }
    cmds::create(&api, &sh("fresh", "box", "true")).await;
    let fresh = wait_command_phase(stack, &api, "fresh", CommandPhase::Exited).await;
    assert_eq!(number(&fresh), 66, "a deleted command's number is never given again");

    // A tenant that may write command status (a namespace admin, say)
    // still cannot run a finished command again or move it to another
    // session: the CRD's rules hold for everyone.
    let grant = ["create", "role", "status", "-n", ns, "--verb=patch", "--resource=commands.hangar.dev/status"];
    stack.cp.kubectl().args(grant).output().unwrap();
    let bind = ["create", "rolebinding", "status", "-n", ns, "--role=status", "--serviceaccount=iso-limits:dev"];
    stack.cp.kubectl().args(bind).output().unwrap();
    let tenant = stack.cp.client_as(&member).await.unwrap();
    let theirs: Api<Command> = Api::namespaced(tenant, ns);
    let rerun = json!({"status": {"phase": "queued"}});
    let err = theirs.patch_status("fresh", &PatchParams::default(), &Patch::Merge(&rerun)).await.unwrap_err();
    assert!(err.to_string().contains("never leaves a final status"), "run a finished command again: {err}");
    let moved = json!({"status": {"sandboxUid": "another-session"}});
    let err = theirs.patch_status("fresh", &PatchParams::default(), &Patch::Merge(&moved)).await.unwrap_err();
    assert!(err.to_string().contains("sandboxUid is written once"), "move it to another session: {err}");
    let renumber = json!({"status": {"number": 1}});
    let err = theirs.patch_status("fresh", &PatchParams::default(), &Patch::Merge(&renumber)).await.unwrap_err();
    assert!(err.to_string().contains("number never changes"), "give it a used number: {err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_sandbox_never_sees_the_old_sessions_commands() {
    let stack = shared_stack();
    let ns = "iso-recreate";
    let (_, _, old) = sessions::running_box(stack, ns).await;
    // The tenant's own identity does the rest (the member below reads).
    let owner = member_token(&stack.cp, ns, "owner", "get,list,create,patch,delete");
    let tenant = stack.cp.client_as(&owner).await.unwrap();
    let (boxes, api): (Api<Sandbox>, Api<Command>) = (Api::namespaced(tenant.clone(), ns), Api::namespaced(tenant, ns));
    cmds::create(&api, &sh("old", "box", "echo old-session")).await;
    let old_cmd = wait_command_phase(stack, &api, "old", CommandPhase::Exited).await;
    assert_eq!(old_cmd.status.as_ref().unwrap().sandbox_uid, old.uid());
    boxes.delete("box", &DeleteParams::default()).await.unwrap();
    let deadline = std::time::Instant::now() + sessions::DEADLINE;
    while boxes.get_opt("box").await.unwrap().is_some() {
        assert!(std::time::Instant::now() < deadline, "the old Sandbox was not deleted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    boxes.create(&PostParams::default(), &sessions::sandbox("box", "commands", json!({}))).await.unwrap();
    let new = wait_phase(stack, &boxes, "box", Phase::Running).await;
    assert_ne!(new.uid(), old.uid());
    let sid = new.uid().unwrap();
    // The gateway lists none of the old session's commands, and does not
    // give one by name.
    let gw = stack.gateway_client();
    let member = member_token(&stack.cp, ns, "dev", "get,list,create,patch");
    gw.wait_known(&sid, &member).await;
    let (st, list) = gw.get(&format!("/v1/sandboxes/{sid}/commands"), &member).await;
    assert_eq!(st, 200, "{list}");
    assert_eq!(list["commands"].as_array().map(Vec::len), Some(0), "the old command is not this session's: {list}");
    let (st, body) = gw.get(&format!("/v1/sandboxes/{sid}/commands/old/output?after=0"), &member).await;
    assert_eq!((st, code(&body)), (404, "sandbox_not_found"), "{body}");
    // The new session numbers from 1, and the old command is untouched.
    cmds::create(&api, &sh("new", "box", "true")).await;
    let first = wait_command_phase(stack, &api, "new", CommandPhase::Exited).await;
    assert_eq!(number(&first), 1);
    assert_eq!(first.status.as_ref().unwrap().sandbox_uid.as_deref(), Some(sid.as_str()));
    assert_eq!(api.get("old").await.unwrap().status, old_cmd.status);
}

/// Lets ServiceAccount `account` of `ns` create `resources` (core API
/// group) there, as a namespace admin would grant a tenant.
async fn may_create(admin: &kube::Client, ns: &str, account: &str, resources: &[&str]) {
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": format!("{account}-creates")},
        "rules": [{"apiGroups": [""], "resources": resources, "verbs": ["create"]}],
    }))
    .unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": format!("{account}-creates")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": format!("{account}-creates")},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ns}],
    }))
    .unwrap();
    Api::<Role>::namespaced(admin.clone(), ns).create(&PostParams::default(), &role).await.unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), ns).create(&PostParams::default(), &binding).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_under_the_agent_pods_name_is_neither_adopted_nor_deleted() {
    let stack = shared_stack();
    let ns = "iso-agent-pod";
    let client = stack.cp.client().await.unwrap();
    ensure_namespace(&client, ns).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    // A tenant of the namespace that may create Pods plants the decoy
    // before the session starts.
    let planter = member_token(&stack.cp, ns, "planter", "");
    may_create(&client, ns, "planter", &["pods"]).await;
    let decoy: Pod = serde_json::from_value(json!({
        "metadata": {"name": "hangar-agent-box"},
        "spec": {"containers": [{"name": "c", "image": "registry.example/decoy@sha256:00"}]},
    }))
    .unwrap();
    let as_planter: Api<Pod> = Api::namespaced(stack.cp.client_as(&planter).await.unwrap(), ns);
    let decoy = as_planter.create(&PostParams::default(), &decoy).await.unwrap();
    let boxes: Api<Sandbox> = Api::namespaced(client.clone(), ns);
    boxes.create(&PostParams::default(), &sessions::sandbox("box", "commands", json!({}))).await.unwrap();
    // The operator says why the session waits...
    let deadline = std::time::Instant::now() + sessions::DEADLINE;
    while !stack.operator().log_tail(5000).contains("a Pod hangar did not create holds the agent Pod's name") {
        assert!(std::time::Instant::now() < deadline, "no word of the foreign Pod");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // ...never takes the Pod for its own, and never runs the session on it.
    let s = boxes.get("box").await.unwrap();
    assert_ne!(sessions::phase(&s), Some(Phase::Running));
    let now = pods.get("hangar-agent-box").await.unwrap();
    assert_eq!((now.uid(), now.metadata.owner_references.clone()), (decoy.uid(), None));
    // Ending the session does not delete it either.
    sessions::set_state(&boxes, "box", "Ended").await.unwrap();
    sessions::wait_for(stack, &boxes, "box", "ended", |s| {
        matches!(sessions::phase(s), Some(Phase::Ended | Phase::Failed))
    })
    .await;
    assert_eq!(pods.get("hangar-agent-box").await.unwrap().uid(), decoy.uid(), "not ours to delete");
}

/// The case's write was refused: by the worker node restriction policy
/// (named `RBAC:` cases by RBAC, which grants the worker no such verb).
#[track_caller]
fn policy<T: std::fmt::Debug>(case: &str, r: Result<T, kube::Error>) {
    match r {
        Err(kube::Error::Api(e)) if e.code == 403 || e.code == 422 => {
            let by_rbac = e.message.contains("is forbidden: User");
            assert_eq!(by_rbac, case.starts_with("RBAC:"), "{case}: refused by the wrong control: {}", e.message);
            assert!(by_rbac || e.message.contains("forbidden: "), "{case}: no contract code: {}", e.message);
        }
        other => panic!("{case}: expected a refusal, got {other:?}"),
    }
}

/// The worker of session B's node, as a compromised node would hold it:
/// the kubeconfig the node simulator gave it (the chart's worker
/// ServiceAccount, a token bound to its Pod on that node).
async fn worker_of(stack: &LocalStack, session: &Sandbox) -> (kube::Client, String) {
    let node = session.status.as_ref().and_then(|s| s.node_name.clone()).expect("a running session has a node");
    let kubeconfig = stack.sim.nodes_dir.join(&node).join("worker-kubeconfig.yaml");
    (hangar_e2e::control_plane::client_from(&kubeconfig).await.unwrap(), node)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compromised_worker_writes_nothing_of_another_session() {
    use hangar_crds::{heartbeat, output_keys};
    use k8s_openapi::api::coordination::v1::Lease;
    let stack = shared_stack();
    let (admin, sid) = victim(stack, "iso-node-a").await;
    let victim_box: Sandbox = Api::namespaced(admin.clone(), "iso-node-a").get("box").await.unwrap();
    let victim_node = victim_box.status.as_ref().unwrap().node_name.clone().unwrap();
    // A running command of the victim's, for the worker to try to end.
    let victim_cmds: Api<Command> = Api::namespaced(admin.clone(), "iso-node-a");
    cmds::create(&victim_cmds, &sh("long", "box", "exec sleep 300")).await;
    wait_command_phase(stack, &victim_cmds, "long", CommandPhase::Running).await;
    let before = snapshot(&admin, "iso-node-a", &sid).await;
    let leases: Api<Lease> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    let victim_lease = leases.get(&heartbeat::lease_name(&victim_node)).await.unwrap();

    let (_, own_cmds, attacker_box) = sessions::running_box(stack, "iso-node-b").await;
    let (worker, own_node) = worker_of(stack, &attacker_box).await;

    // Heartbeats: another node's Lease, renewed, closed, deleted; the
    // operator's leader Lease.
    let w_leases: Api<Lease> = Api::namespaced(worker.clone(), SYSTEM_NAMESPACE);
    let renew = json!({"spec": {"renewTime": "2030-01-01T00:00:00.000000Z"}});
    policy(
        "renew the victim's heartbeat",
        w_leases.patch(&victim_lease.name_any(), &PatchParams::default(), &Patch::Merge(&renew)).await,
    );
    let close = json!({"metadata": {"annotations": {heartbeat::WORKSPACE_CLOSED: "1"}}});
    policy(
        "report the victim's workspace closed",
        w_leases.patch(&victim_lease.name_any(), &PatchParams::default(), &Patch::Merge(&close)).await,
    );
    let fake: Lease = serde_json::from_value(json!({"metadata": {"name": "hangar-operator-leader"},
        "spec": {"holderIdentity": "mallory", "leaseDurationSeconds": 3600}}))
    .unwrap();
    policy("take the operator's leader Lease", w_leases.create(&PostParams::default(), &fake).await);
    // (This stack runs one operator without election; one elected would
    // hold this Lease.)
    let _ = leases.create(&PostParams::default(), &fake).await;
    let take = json!({"spec": {"holderIdentity": "mallory"}});
    policy(
        "rewrite the operator's leader Lease",
        w_leases.patch("hangar-operator-leader", &PatchParams::default(), &Patch::Merge(&take)).await,
    );
    policy(
        "RBAC: delete the victim's heartbeat",
        w_leases.delete(&victim_lease.name_any(), &DeleteParams::default()).await,
    );

    // Keys: no Secret the operator trusts can be made ahead of it.
    let w_secrets: Api<Secret> = Api::namespaced(worker.clone(), SYSTEM_NAMESPACE);
    let secret = |name: String| -> Secret {
        serde_json::from_value(json!({"metadata": {"name": name}, "data": {"key": "AAAA"}})).unwrap()
    };
    let later = "11111111-2222-3333-4444-555555555555";
    policy(
        "pre-create a session key",
        w_secrets.create(&PostParams::default(), &secret(format!("hangar-session-key-{later}"))).await,
    );
    policy(
        "replace the output key-encryption key",
        w_secrets.create(&PostParams::default(), &secret(output_keys::OUTPUT_KEK_SECRET.to_owned())).await,
    );
    let w_maps: Api<ConfigMap> = Api::namespaced(worker.clone(), SYSTEM_NAMESPACE);
    let sealed: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": output_keys::sealed_keys_name(later)}})).unwrap();
    policy("RBAC: pre-create a session's sealed output keys", w_maps.create(&PostParams::default(), &sealed).await);
    policy(
        "hand in a key for the victim's node",
        w_secrets
            .create(&PostParams::default(), &secret(output_keys::handoff_secret_name(&victim_node, &sid, 2)))
            .await,
    );
    policy(
        "hand in a key under its own prefix with a forged suffix",
        w_secrets
            .create(
                &PostParams::default(),
                &secret(format!("{}x.{victim_node}", output_keys::handoff_prefix(&own_node))),
            )
            .await,
    );
    policy("RBAC: read the organisation key", w_secrets.get("hangar-org-key").await);
    policy("RBAC: read a hand-off back", w_secrets.list(&ListParams::default()).await);

    let w_victim_cmds: Api<Command> = Api::namespaced(worker.clone(), "iso-node-a");
    policy("RBAC: create a command", w_victim_cmds.create(&PostParams::default(), &sh("x", "box", "id")).await);
    let boxes: Api<Sandbox> = Api::namespaced(worker.clone(), "iso-node-a");
    let ended = json!({"status": {"phase": "ended"}});
    policy(
        "RBAC: end the victim's session",
        boxes.patch_status("box", &PatchParams::default(), &Patch::Merge(&ended)).await,
    );
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(worker.clone());
    let relabel = json!({"metadata": {"labels": {"hangar.dev/session": "box"}}});
    policy(
        "RBAC: relabel its node for another session",
        nodes.patch(&own_node, &PatchParams::default(), &Patch::Merge(&relabel)).await,
    );

    // Reads: as itself, nothing of any tenant; its node's account is bound
    // in its own session's namespace only, and it may mint a token for
    // that account and no other.
    let w_victim_list: Api<Command> = Api::namespaced(worker.clone(), "iso-node-a");
    policy("RBAC: list the victim's commands (argv, env)", w_victim_list.list(&ListParams::default()).await);
    let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(worker.clone(), SYSTEM_NAMESPACE);
    let bound_to = |node: &k8s_openapi::api::core::v1::Node| -> k8s_openapi::api::authentication::v1::TokenRequest {
        serde_json::from_value(json!({"spec": {"boundObjectRef": {"apiVersion": "v1", "kind": "Node",
            "name": node.metadata.name, "uid": node.metadata.uid}}}))
        .unwrap()
    };
    let admin_nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(admin.clone());
    let own = admin_nodes.get(&own_node).await.unwrap();
    let victims = admin_nodes.get(&victim_node).await.unwrap();
    let victim_account = hangar_crds::worker_identity::account_name(&victim_node);
    policy(
        "mint a token for the victim node's account",
        accounts.create_token_request(&victim_account, &PostParams::default(), &bound_to(&own)).await,
    );
    let own_account = hangar_crds::worker_identity::account_name(&own_node);
    policy(
        "mint its own node's account token bound to the victim's node",
        accounts.create_token_request(&own_account, &PostParams::default(), &bound_to(&victims)).await,
    );
    let minted = accounts.create_token_request(&own_account, &PostParams::default(), &bound_to(&own)).await;
    let token = minted.expect("its own node's account").status.and_then(|s| s.token).unwrap();
    let as_node = stack.cp.client_as(&token).await.unwrap();
    let n_victim: Api<Command> = Api::namespaced(as_node.clone(), "iso-node-a");
    policy("RBAC: list the victim's commands as its node's account", n_victim.list(&ListParams::default()).await);
    let n_own: Api<Command> = Api::namespaced(as_node, "iso-node-b");
    // Nor its own namespace's: other sessions may share it (see
    // `a_session_node_reads_only_its_own_sessions_commands`).
    policy("RBAC: list its own namespace's commands", n_own.list(&ListParams::default()).await);

    // Command status: the victim's (as itself and as its node's account),
    // and moving its own command to the victim's node.
    let end = json!({"status": {"phase": "exited", "exitCode": 0}});
    policy(
        "RBAC: end the victim's running command",
        w_victim_cmds.patch_status("long", &PatchParams::default(), &Patch::Merge(&end)).await,
    );
    policy(
        "RBAC: end the victim's running command as its node's account",
        n_victim.patch_status("long", &PatchParams::default(), &Patch::Merge(&end)).await,
    );
    cmds::create(&own_cmds, &sh("mine", "box", "exec sleep 300")).await;
    wait_command_phase(stack, &own_cmds, "mine", CommandPhase::Running).await;
    let restamp = json!({"status": {"nodeName": victim_node}});
    policy(
        "move its own command to the victim's node",
        n_own.patch_status("mine", &PatchParams::default(), &Patch::Merge(&restamp)).await,
    );

    // A worker token not bound to a Pod names no node: it writes nothing,
    // not even what a worker may.
    let unbound = member_token(&stack.cp, SYSTEM_NAMESPACE, hangar_e2e::node_sim::WORKER_SERVICE_ACCOUNT, "");
    let unbound = stack.cp.client_as(&unbound).await.unwrap();
    let u_leases: Api<Lease> = Api::namespaced(unbound, SYSTEM_NAMESPACE);
    policy(
        "an unbound worker token renews its own node's Lease",
        u_leases.patch(&heartbeat::lease_name(&own_node), &PatchParams::default(), &Patch::Merge(&renew)).await,
    );

    // The worker's own writes still pass, and the victim is as it was.
    let mine = json!({"spec": {"renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(k8s_openapi::jiff::Timestamp::now())}});
    w_leases
        .patch(&heartbeat::lease_name(&own_node), &PatchParams::default(), &Patch::Merge(&mine))
        .await
        .expect("its own heartbeat");
    assert_eq!(snapshot(&admin, "iso-node-a", &sid).await, before, "the victim's objects are unchanged");
    let lease_now = leases.get(&heartbeat::lease_name(&victim_node)).await.unwrap();
    assert_eq!(
        lease_now.metadata.annotations, victim_lease.metadata.annotations,
        "the victim's heartbeat says what its worker said"
    );
    assert_eq!(cmds::phase(&victim_cmds.get("long").await.unwrap()), Some(CommandPhase::Running));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stripped_finalizer_leaves_no_key_behind() {
    use hangar_crds::output_keys;
    let stack = shared_stack();
    let ns = "iso-finalizer";
    let (boxes, api, s) = sessions::running_box(stack, ns).await;
    let sid = s.uid().unwrap();
    cmds::create(&api, &sh("c", "box", "echo sealed")).await;
    wait_command_phase(stack, &api, "c", CommandPhase::Exited).await;
    let admin = stack.cp.client().await.unwrap();
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    let maps: Api<ConfigMap> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    let key = format!("hangar-session-key-{sid}");
    assert!(secrets.get_opt(&key).await.unwrap().is_some(), "the workspace key exists while the session runs");
    let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    let account = hangar_crds::worker_identity::account_name(s.status.as_ref().unwrap().node_name.as_ref().unwrap());
    assert!(accounts.get_opt(&account).await.unwrap().is_some(), "the worker's node account exists while it runs");
    cmds::output_keys(&admin, &sid, 1).await;

    // The tenant deletes the Sandbox without letting the operator reset it.
    let tenant = stack.cp.client_as(&member_token(&stack.cp, ns, "owner", "*")).await.unwrap();
    let theirs: Api<Sandbox> = Api::namespaced(tenant, ns);
    theirs
        .patch("box", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}})))
        .await
        .unwrap();
    theirs.delete("box", &DeleteParams::default()).await.unwrap();
    let deadline = std::time::Instant::now() + sessions::DEADLINE;
    loop {
        let key_left = secrets.get_opt(&key).await.unwrap().is_some();
        let ledger_left = maps.get_opt(&ledger::document_name(&sid)).await.unwrap().is_some();
        let sealed = maps.get_opt(&output_keys::sealed_keys_name(&sid)).await.unwrap();
        let deadline_set = sealed.as_ref().is_some_and(|m| m.annotations().contains_key("hangar.dev/erase-after"));
        let account_left = accounts.get_opt(&account).await.unwrap().is_some();
        if !key_left && !ledger_left && deadline_set && !account_left {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "left behind: workspace key {key_left}, ledger {ledger_left}, node account {account_left}, \
             output keys without a deadline {}",
            !deadline_set
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(boxes.get_opt("box").await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_foreign_pod_and_no_impostor_node_reaches_a_session() {
    use k8s_openapi::api::core::v1::Node;
    let stack = shared_stack();
    let (admin, sid) = victim(stack, "iso-nodes").await;
    let boxes: Api<Sandbox> = Api::namespaced(admin.clone(), "iso-nodes");
    let victim_box = boxes.get("box").await.unwrap();
    let node = victim_box.status.as_ref().unwrap().node_name.clone().unwrap();
    ensure_namespace(&admin, "iso-pinner").await;
    let tenant = stack.cp.client_as(&member_token(&stack.cp, "iso-pinner", "pinner", "")).await.unwrap();
    // The tenant may create Pods in its namespace, and bind them…
    may_create(&admin, "iso-pinner", "pinner", &["pods", "pods/binding"]).await;
    let pods: Api<Pod> = Api::namespaced(tenant, "iso-pinner");
    let pod = |spec: Value| -> Pod {
        let mut base = json!({"containers": [{"name": "c", "image": "registry.example/x@sha256:00"}]});
        base.as_object_mut().unwrap().extend(spec.as_object().unwrap().clone());
        serde_json::from_value(json!({"metadata": {"generateName": "pinned-"}, "spec": base})).unwrap()
    };
    // …but none pinned to the session's node, and none tolerating its taint.
    let pinned = pods.create(&PostParams::default(), &pod(json!({"nodeName": node}))).await;
    policy("a Pod pinned to a session node by spec.nodeName", pinned);
    let tolerating = json!({"tolerations": [{"key": "hangar.dev/session", "operator": "Exists"}]});
    policy("a Pod tolerating the session taint", pods.create(&PostParams::default(), &pod(tolerating)).await);
    let everything = json!({"tolerations": [{"operator": "Exists"}]});
    policy("a Pod tolerating every taint", pods.create(&PostParams::default(), &pod(everything)).await);
    let ordinary =
        pods.create(&PostParams::default(), &pod(json!({}))).await.expect("an ordinary Pod is still created");
    // A binding sets the node after creation, skipping the taint as
    // spec.nodeName would: only the scheduler may bind here.
    let binding = json!({
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": ordinary.name_any()},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    });
    let bound: Result<Value, _> =
        pods.create_subresource("binding", &ordinary.name_any(), &PostParams::default(), &binding).await;
    policy("an ordinary Pod bound to a session node (pods/binding)", bound);
    let admin_pods: Api<Pod> = Api::namespaced(admin.clone(), "iso-pinner");
    let after = admin_pods.get(&ordinary.name_any()).await.unwrap();
    assert_eq!(after.spec.and_then(|s| s.node_name), None, "the Pod is on no node");

    // A Node (as a compromised kubelet could register) claiming the
    // session's instance does not become the session's node.
    let nodes: Api<Node> = Api::all(admin.clone());
    let provider = nodes.get(&node).await.unwrap().spec.unwrap().provider_id.unwrap();
    let impostor: Node = serde_json::from_value(json!({
        "metadata": {"name": "impostor-node"}, "spec": {"providerID": provider},
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &impostor).await.unwrap();
    let api: Api<Command> = Api::namespaced(admin.clone(), "iso-nodes");
    cmds::create(&api, &sh("after-impostor", "box", "echo still-mine")).await;
    let c = wait_command_phase(stack, &api, "after-impostor", CommandPhase::Exited).await;
    assert_eq!(c.status.as_ref().unwrap().node_name.as_deref(), Some(node.as_str()), "stamped with the session's node");
    let now = boxes.get("box").await.unwrap();
    assert_eq!(now.status.as_ref().unwrap().node_name.as_deref(), Some(node.as_str()), "the session kept its node");
    assert_eq!(sessions::phase(&now), Some(Phase::Running));
    let labels = nodes.get("impostor-node").await.unwrap().metadata.labels.unwrap_or_default();
    assert!(!labels.contains_key("hangar.dev/session"), "the impostor was not prepared for the session");
    nodes.delete("impostor-node", &DeleteParams::default()).await.unwrap();
    let _ = sid;
}

/// Code in the sandbox (a command) reaches its supervisor's socket, which
/// the agent container mounts: it tries to be served as the worker, to
/// throw away unacknowledged output and to run a command of its own. The
/// supervisor refuses it at once (it is inside the container's PID
/// namespace), while another command's output streams on untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_in_the_sandbox_cannot_speak_for_the_worker() {
    let stack = shared_stack();
    let ns = "iso-socket";
    let (_, api, s) = sessions::running_box(stack, ns).await;
    let sid = s.uid().unwrap();
    let node = s.status.as_ref().and_then(|st| st.node_name.clone()).expect("node");
    let node_dir = stack.sim.nodes_dir.join(&node);
    let socket = node_dir.join("run/supervisor.sock");
    let pwned = node_dir.join("pwned");
    cmds::create(&api, &sh("witness", "box", "for i in $(seq 1 30); do echo line-$i; sleep 0.1; done")).await;
    wait_command_phase(stack, &api, "witness", CommandPhase::Running).await;
    let intruder = include_str!("../../supervisor/tests/fixtures/socket_intruder.py");
    let argv = [
        "python3",
        "-c",
        intruder,
        &socket.display().to_string(),
        &node_dir.join("intruder-connected").display().to_string(),
        &pwned.display().to_string(),
    ];
    cmds::create(&api, &cmds::command("intruder", "box", &argv, json!({}))).await;
    let done = wait_command_phase(stack, &api, "intruder", CommandPhase::Exited).await;
    let witness = wait_command_phase(stack, &api, "witness", CommandPhase::Exited).await;
    let client = stack.cp.client().await.unwrap();
    let keys = cmds::output_keys(&client, &sid, 1).await;
    let intruder_out = cmds::concat(&cmds::read_output(stack, &keys, &sid, number(&done) as u32, 0).await);
    assert_eq!(String::from_utf8_lossy(&intruder_out), "refused\n", "refused at once, though the worker was connected");
    let expected: String = (1..=30).map(|i| format!("line-{i}\n")).collect();
    let witness_out = cmds::concat(&cmds::read_output(stack, &keys, &sid, number(&witness) as u32, 0).await);
    assert_eq!(String::from_utf8_lossy(&witness_out), expected, "no output thrown away");
    assert!(!pwned.exists(), "the intruder's own command never ran");
    let log = std::fs::read_to_string(stack.cp.dir().join(format!("supervisor-{node}.log"))).unwrap_or_default();
    assert!(log.contains("refused a connection from pid"), "the supervisor says whom it refused");
}

/// A compromised node holds its kubelet's credentials, which may edit its
/// own Node: it points `hangar.dev/session` at another session and
/// restarts its worker, hoping to be handed that session. The binding the
/// worker trusts is where a kubelet cannot write (NodeRestriction refuses
/// it the `node-restriction.kubernetes.io` labels and its taints), so the
/// restarted worker serves its own session still, and the other session
/// runs on untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_cannot_rebind_its_node_to_another_session() {
    use hangar_crds::worker_identity::{BINDING_NAMESPACE_LABEL, BINDING_SESSION_LABEL, SESSION_TAINT};
    use k8s_openapi::api::core::v1::Node;
    let stack = shared_stack();
    let (ns_a, ns_b) = ("iso-kubelet-a", "iso-kubelet-b");
    let (_, api_a, a) = sessions::running_box(stack, ns_a).await;
    let (boxes_b, api_b, b) = sessions::running_box(stack, ns_b).await;
    let node = a.status.as_ref().and_then(|s| s.node_name.clone()).expect("node");
    let kubelet = stack.cp.client_impersonating(&format!("system:node:{node}"), &["system:nodes"]).await.unwrap();
    let nodes: Api<Node> = Api::all(kubelet);
    let admin_nodes: Api<Node> = Api::all(stack.cp.client().await.unwrap());
    let before = admin_nodes.get(&node).await.unwrap();
    let b_before = boxes_b.get("box").await.unwrap();

    // What NodeRestriction refuses the kubelet: the binding and the taint.
    let kubelet_refused = |case: &str, r: Result<Node, kube::Error>, says: &str| match r {
        Err(kube::Error::Api(e)) if e.code == 403 && e.message.contains(says) => {}
        other => panic!("{case}: expected NodeRestriction's refusal ({says}), got {other:?}"),
    };
    // (Both sessions are named `box`: the namespace is what would move it.)
    for (label, value) in [(BINDING_NAMESPACE_LABEL, ns_b), (BINDING_SESSION_LABEL, "another-box")] {
        let patch = json!({"metadata": {"labels": {label: value}}});
        let r = nodes.patch(&node, &PatchParams::default(), &Patch::Merge(&patch)).await;
        kubelet_refused(&format!("rebind {label}"), r, "is not allowed to modify labels");
    }
    let b_id = b.uid().unwrap();
    let retaint = json!({"spec": {"taints": [{"key": SESSION_TAINT, "value": b_id, "effect": "NoSchedule"}]}});
    let r = nodes.patch(&node, &PatchParams::default(), &Patch::Merge(&retaint)).await;
    kubelet_refused("retaint for session b", r, "is not allowed to modify taints");
    let untaint = json!({"spec": {"taints": []}});
    let r = nodes.patch(&node, &PatchParams::default(), &Patch::Merge(&untaint)).await;
    kubelet_refused("drop the session taint", r, "is not allowed to modify taints");
    // Another node's object is not the kubelet's to touch at all.
    let b_node = b.status.as_ref().and_then(|s| s.node_name.clone()).expect("node b");
    let other = json!({"metadata": {"labels": {"x": "y"}}});
    let r = nodes.patch(&b_node, &PatchParams::default(), &Patch::Merge(&other)).await;
    refused("the kubelet patches another node", r, 403);
    let now = admin_nodes.get(&node).await.unwrap();
    assert_eq!(now.labels(), before.labels(), "nothing refused changed the node");
    assert_eq!(now.spec.as_ref().map(|s| &s.taints), before.spec.as_ref().map(|s| &s.taints));

    // What it may do: edit the selector labels. Then its worker restarts.
    let relabel = json!({"metadata": {"labels": {"hangar.dev/session": "box", "hangar.dev/session-namespace": ns_b}}});
    nodes.patch(&node, &PatchParams::default(), &Patch::Merge(&relabel)).await.expect("a kubelet may edit these");
    let pid = stack.sim.pid(&node, "worker").expect("worker pid");
    // SAFETY: the simulated node's worker, started by this test's stack.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).unwrap();
    // The new worker serves session a: it runs a's next command.
    cmds::create(&api_a, &sh("after-restart", "box", "echo still-a")).await;
    wait_command_phase(stack, &api_a, "after-restart", CommandPhase::Exited).await;
    assert_ne!(stack.sim.pid(&node, "worker"), Some(pid), "a new worker ran it");
    let log = std::fs::read_to_string(stack.cp.dir().join(format!("worker-{node}.log"))).unwrap_or_default();
    let served: Vec<&str> = log.lines().filter(|l| l.contains("serving session")).collect();
    assert!(served.len() >= 2, "the worker started twice: {served:?}");
    assert!(served.iter().all(|l| l.contains(ns_a) && !l.contains(ns_b)), "only session a, ever: {served:?}");
    // Session b is as it was, and runs its own commands on its own node.
    cmds::create(&api_b, &sh("b-runs", "box", "true")).await;
    let c = wait_command_phase(stack, &api_b, "b-runs", CommandPhase::Exited).await;
    assert_eq!(c.status.as_ref().and_then(|s| s.node_name.clone()), Some(b_node), "b's command ran on b's node");
    let b_after = boxes_b.get("box").await.unwrap();
    assert_eq!(b_after.spec, b_before.spec);
    assert_eq!(b_after.status.as_ref().and_then(|s| s.node_name.clone()), b_before.status.and_then(|s| s.node_name));
}

/// Metrics name sessions and tenants: they are served over TLS only, and
/// only to a token RBAC allows `get` on the path. Another tenant, any pod
/// and a session node's worker are refused; the health port has none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_read_only_with_a_token_rbac_allows() {
    use hangar_e2e::process::http_get;
    use hangar_e2e::scrape::{https_get, tls_client};
    let stack = shared_stack();
    let (_, _, session) = sessions::running_box(stack, "iso-metrics").await;
    let admin = stack.cp.client().await.unwrap();
    ensure_namespace(&admin, "iso-scrape").await;
    let tenant = member_token(&stack.cp, "iso-scrape", "mallory", "*");
    let pod = member_token(&stack.cp, "iso-scrape", "some-pod", "");
    let node = session.status.as_ref().and_then(|s| s.node_name.clone()).expect("a node");
    let kubeconfig = std::fs::read_to_string(stack.sim.nodes_dir.join(&node).join("worker-kubeconfig.yaml")).unwrap();
    let kubeconfig: Value = serde_yaml::from_str(&kubeconfig).unwrap();
    let worker = kubeconfig["users"][0]["user"]["token"].as_str().expect("the worker's token").to_owned();

    let tls = tls_client(&stack.cp.pki.ca_pem);
    let servers = {
        let op = stack.operator();
        [
            ("operator", op.metrics_port, op.admin_port),
            ("webhook", stack.webhook.metrics_port, stack.webhook.admin_port),
            ("gateway", stack.gateway.metrics_port, stack.gateway.admin_port),
        ]
    };
    for (component, metrics, health) in servers {
        let get = |path: &str, token: Option<&str>| {
            https_get(&tls, metrics, path, token).unwrap_or_else(|e| panic!("{component} {path}: {e}"))
        };
        let (status, body) = get("/metrics", None);
        assert_eq!(status, 401, "{component}: no token: {body}");
        let (status, _) = get("/metrics", Some("made-up-token"));
        assert_eq!(status, 401, "{component}: a made-up token");
        for (who, token) in [("another tenant", &tenant), ("a pod's ServiceAccount", &pod), ("a worker", &worker)] {
            let (status, body) = get("/metrics", Some(token));
            assert_eq!(status, 403, "{component}, as {who}: {body}");
            assert!(!body.contains("hangar_"), "{component}, as {who}: no series in a refusal");
        }
        // The operator's raw samples name every session: refused alike.
        let (status, _) = get("/debug/samples", Some(&tenant));
        assert!(status == 403, "{component}: samples as another tenant: {status}");
        // In clear, the metrics port answers nothing; the health port has
        // no metrics.
        let plain = http_get(metrics, "/metrics");
        assert!(!plain.as_ref().is_ok_and(|(s, b)| *s == 200 || b.contains("hangar_")), "{component}: {plain:?}");
        let (status, _) = http_get(health, "/metrics").unwrap();
        assert_eq!(status, 404, "{component}: metrics on the health port");
        assert_eq!(http_get(health, "/healthz").unwrap().0, 200, "{component}: health stays open to probes");
    }
    // The harness's scraper holds the chart's metrics-reader role: it reads.
    assert!(stack.operator().metrics().contains("hangar_reconciles_total"), "the scraper reads the operator");
    assert!(stack.webhook.metrics().contains("hangar_webhook_"), "the scraper reads the webhook");
    assert!(stack.gateway.metrics().contains("hangar_gateway_"), "the scraper reads the gateway");
}

/// Two sessions of one namespace: the node of one holds no right to read
/// any Command in the apiserver (RBAC cannot narrow a list to one
/// session's), and the operator's node service serves it its own
/// session's commands and nothing of the other's, whatever it names; no
/// other identity is served at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_node_reads_only_its_own_sessions_commands() {
    use hangar_e2e::workspace_keys::KeyClient;
    let stack = shared_stack();
    let ns = "iso-shared-ns";
    let (admin, victim_id) = victim(stack, ns).await;
    let victim_cmds: Api<Command> = Api::namespaced(admin.clone(), ns);
    let mut secret = sh("secret", "box", "echo $TOKEN");
    secret.spec.env = vec![hangar_crds::command::EnvVar { name: "TOKEN".into(), value: "victim-argv-secret".into() }];
    cmds::create(&victim_cmds, &secret).await;
    wait_command_phase(stack, &victim_cmds, "secret", CommandPhase::Exited).await;

    // The attacker: a second session in the same namespace, its node taken.
    let boxes: Api<Sandbox> = Api::namespaced(admin.clone(), ns);
    boxes.create(&PostParams::default(), &sessions::sandbox("other", "commands", json!({}))).await.unwrap();
    let attacker_box = wait_phase(stack, &boxes, "other", Phase::Running).await;
    cmds::create(&victim_cmds, &sh("mine", "other", "echo attacker")).await;
    // Its worker still runs its commands, read through the node service.
    wait_command_phase(stack, &victim_cmds, "mine", CommandPhase::Exited).await;
    let before = snapshot(&admin, ns, &victim_id).await;
    let (worker, own_node) = worker_of(stack, &attacker_box).await;
    let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(worker, SYSTEM_NAMESPACE);
    let admin_nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(admin.clone());
    let own = admin_nodes.get(&own_node).await.unwrap();
    let bound: k8s_openapi::api::authentication::v1::TokenRequest = serde_json::from_value(
        json!({"spec": {"boundObjectRef": {"apiVersion": "v1", "kind": "Node", "name": own_node, "uid": own.uid()}}}),
    )
    .unwrap();
    let account = hangar_crds::worker_identity::account_name(&own_node);
    let minted = accounts.create_token_request(&account, &PostParams::default(), &bound).await;
    let token = minted.expect("its own node's account").status.and_then(|s| s.token).unwrap();
    let as_node: Api<Command> = Api::namespaced(stack.cp.client_as(&token).await.unwrap(), ns);

    // The apiserver: no read of any Command, its session's neighbour's by
    // name and through the status subresource included.
    policy("RBAC: list the namespace's commands", as_node.list(&ListParams::default()).await);
    policy("RBAC: watch the namespace's commands", as_node.watch(&Default::default(), "0").await.map(|_| ()));
    policy("RBAC: get the neighbour's command", as_node.get("secret").await);
    policy("RBAC: get the neighbour's command by its status", as_node.get_status("secret").await);
    policy("RBAC: get its own command", as_node.get("mine").await);

    // The node service: its own session's commands, nothing else.
    let node_service = KeyClient::new(stack);
    let (status, own_cmds) = node_service.node_commands(Some(&token), ns, "other").await;
    assert_eq!(status, 200, "its own session's commands");
    let names: Vec<String> = own_cmds.unwrap().commands.iter().map(|c| c.name_any()).collect();
    assert_eq!(names, ["mine"], "only its own session's, none of the neighbour's");
    let (status, body) = node_service.node_commands(Some(&token), ns, "box").await;
    assert_eq!((status, body.is_some()), (403, false), "the neighbour's commands, named");
    let (status, _) = node_service.node_commands(Some(&token), "iso-node-a", "box").await;
    assert_eq!(status, 403, "another namespace's session, named");
    let (status, _) = node_service.node_commands(None, ns, "box").await;
    assert_eq!(status, 401, "no token");
    let (status, _) = node_service.node_commands(Some("made-up"), ns, "box").await;
    assert_eq!(status, 401, "a made-up token");
    let tenant = member_token(&stack.cp, ns, "tenant-admin", "get,list,watch,create,update,patch,delete");
    let (status, _) = node_service.node_commands(Some(&tenant), ns, "box").await;
    assert_eq!(status, 403, "the tenant's own token is no node's");
    let pod = member_token(&stack.cp, ns, "some-pod", "");
    let (status, _) = node_service.node_commands(Some(&pod), ns, "other").await;
    assert_eq!(status, 403, "a pod's ServiceAccount");

    assert_eq!(snapshot(&admin, ns, &victim_id).await, before, "the victim's objects are unchanged");
}

/// Who sent a command is the apiserver's to write: a tenant that writes
/// `hangar.dev/sender` itself at create finds its own name there, and
/// `status.sentBy` with it; changing it afterwards is refused by the
/// policy, and the command is unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nobody_writes_who_sent_a_command() {
    use hangar_crds::command::SENDER_ANNOTATION;
    let stack = shared_stack();
    let ns = "iso-sender";
    let (admin, _) = victim(stack, ns).await;
    let token = member_token(&stack.cp, ns, "tenant", "get,list,watch,create,update,patch,delete");
    let tenant: Api<Command> = Api::namespaced(stack.cp.client_as(&token).await.unwrap(), ns);
    let mut forged = sh("forged", "box", "true");
    let someone_else = format!("hangar:token:{ns}:someone-else");
    forged.metadata.annotations = Some(BTreeMap::from([(SENDER_ANNOTATION.to_owned(), someone_else.clone())]));
    let created = tenant.create(&PostParams::default(), &forged).await.expect("the tenant's create");
    let me = format!("system:serviceaccount:{ns}:tenant");
    assert_eq!(created.sender(), Some(me.as_str()), "the apiserver wrote the creator's name");
    let admin_cmds: Api<Command> = Api::namespaced(admin, ns);
    let done = wait_command_phase(stack, &admin_cmds, "forged", CommandPhase::Exited).await;
    assert_eq!(done.status.as_ref().and_then(|s| s.sent_by.as_deref()), Some(me.as_str()), "sentBy is the creator");
    let before = admin_cmds.get("forged").await.unwrap();
    let rewrite = json!({"metadata": {"annotations": {SENDER_ANNOTATION: someone_else}}});
    policy("rewrite who sent it", tenant.patch("forged", &PatchParams::default(), &Patch::Merge(&rewrite)).await);
    let drop_it = json!({"metadata": {"annotations": {SENDER_ANNOTATION: null}}});
    policy("remove who sent it", tenant.patch("forged", &PatchParams::default(), &Patch::Merge(&drop_it)).await);
    let after = admin_cmds.get("forged").await.unwrap();
    assert_eq!((after.metadata.annotations, after.status), (before.metadata.annotations, before.status));
}

/// The command decider answers the webhook's identity only: anyone else
/// who reaches the operator's node service (a tenant, a pod, a session's
/// node) can neither take a place in a session's limits nor announce its
/// end, so the session's ledger is unchanged and its next command runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_webhook_asks_the_command_decider() {
    use hangar_crds::command_admission::{CommandAdmissionRequest, ENDING_PATH, EndingNotice, PATH};
    use hangar_e2e::workspace_keys::KeyClient;
    let stack = shared_stack();
    let ns = "iso-decider";
    let (admin, victim_id) = victim(stack, ns).await;
    let boxes: Api<Sandbox> = Api::namespaced(admin.clone(), ns);
    let session = boxes.get("box").await.unwrap();
    let before = snapshot(&admin, ns, &victim_id).await;

    let tenant = member_token(&stack.cp, ns, "tenant-admin", "get,list,watch,create,update,patch,delete");
    ensure_namespace(&admin, "iso-decider-b").await;
    let other_tenant =
        member_token(&stack.cp, "iso-decider-b", "intruder", "get,list,watch,create,update,patch,delete");
    let pod = member_token(&stack.cp, ns, "some-pod", "");
    let node = session.status.as_ref().and_then(|s| s.node_name.clone()).expect("a node");
    let kubeconfig = std::fs::read_to_string(stack.sim.nodes_dir.join(&node).join("worker-kubeconfig.yaml")).unwrap();
    let kubeconfig: Value = serde_yaml::from_str(&kubeconfig).expect("the node's kubeconfig");
    let node_token = kubeconfig["users"][0]["user"]["token"].as_str().expect("its token").to_owned();

    let decider = KeyClient::new(stack);
    // Each would take a place (64 of them would lock the session) or end it.
    let take = serde_json::to_value(CommandAdmissionRequest {
        namespace: ns.into(),
        sandbox: "box".into(),
        uid: "forged-uid".into(),
        name: "forged".into(),
        sender: None,
        dry_run: false,
    })
    .unwrap();
    let end =
        serde_json::to_value(EndingNotice { namespace: ns.into(), sandbox: "box".into(), uid: victim_id.clone() })
            .unwrap();
    for (who, token, status) in [
        ("no token", None, 401),
        ("a made-up token", Some("made-up"), 401),
        ("the session's tenant", Some(tenant.as_str()), 403),
        ("another tenant", Some(other_tenant.as_str()), 403),
        ("a pod's ServiceAccount", Some(pod.as_str()), 403),
        ("the session's own node", Some(node_token.as_str()), 403),
    ] {
        for _ in 0..3 {
            assert_eq!(decider.admission(token, PATH, &take).await, status, "{who}: take a place");
        }
        assert_eq!(decider.admission(token, ENDING_PATH, &end).await, status, "{who}: announce its end");
    }
    assert_eq!(snapshot(&admin, ns, &victim_id).await, before, "the victim's objects and ledger are unchanged");
    // Not ended, not full: the session's next command is admitted and runs.
    let api: Api<Command> = Api::namespaced(admin, ns);
    cmds::create(&api, &sh("after", "box", "echo still-mine")).await;
    wait_command_phase(stack, &api, "after", CommandPhase::Exited).await;
}

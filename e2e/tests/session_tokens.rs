//! Session tokens on the local stack: the operator mints each new token's
//! plaintext, keeps only its digest, delivers it once in a Secret beside
//! the token, and keeps its phase; a revoked token never comes back, and
//! at the session's end only a read-only token stays active.

use hangar_crds::Phase;
use hangar_crds::session_token::{SessionToken, TokenPhase};
use hangar_e2e::sessions;
use hangar_e2e::shared_stack;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

fn token(name: &str, sandbox: &str, scopes: &[&str]) -> SessionToken {
    serde_json::from_value(json!({
        "apiVersion": "hangar.dev/v1alpha1", "kind": "SessionToken",
        "metadata": {"name": name},
        "spec": {"sandbox": sandbox, "scopes": scopes, "ttlSeconds": 600,
                 "publicKey": {"kty": "EC", "crv": "P-256",
                               "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU",
                               "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}},
    }))
    .unwrap()
}

async fn wait_token(
    api: &Api<SessionToken>,
    name: &str,
    what: &str,
    pred: impl Fn(&SessionToken) -> bool,
) -> SessionToken {
    sessions::wait_object(api, name, what, pred, |t| format!("status {:?}", t.and_then(|t| t.status.as_ref()))).await
}

fn phase(t: &SessionToken) -> Option<TokenPhase> {
    t.status.as_ref().and_then(|s| s.phase)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_is_minted_once_kept_as_a_digest_and_revoked_for_good() {
    let stack = shared_stack();
    let ns = "tokens";
    let (boxes, _, _) = sessions::running_box(stack, ns).await;
    let client = stack.cp.client().await.unwrap();
    let api: Api<SessionToken> = Api::namespaced(client.clone(), ns);
    api.create(&PostParams::default(), &token("agent", "box", &["read", "exec"])).await.unwrap();
    let minted = wait_token(&api, "agent", "active", |t| phase(t) == Some(TokenPhase::Active)).await;
    let status = minted.status.clone().unwrap();

    // Only the digest is kept; the plaintext waits once in its Secret.
    let digest = status.digest.clone().unwrap();
    assert!(digest.starts_with("sha384:") && digest.len() == 7 + 96, "{digest}");
    let created = minted.metadata.creation_timestamp.clone().unwrap().0;
    let expires = status.expires_at.clone().unwrap().0;
    assert_eq!(expires.duration_since(created).as_secs(), 600, "creation + ttlSeconds");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let secret_name = status.secret_name.clone().expect("the delivery Secret");
    let secret = secrets.get(&secret_name).await.unwrap();
    let plaintext = String::from_utf8(secret.data.unwrap()["token"].0.clone()).unwrap();
    assert!(plaintext.starts_with("hgt_") && plaintext.len() >= 4 + 43, "hgt_ and 32 random bytes");
    assert_eq!(hangar_keys::token::digest(&plaintext), digest, "the digest is of the delivered plaintext");
    let owner = secret.metadata.owner_references.unwrap_or_default();
    assert!(owner.iter().any(|o| o.kind == "SessionToken" && Some(&o.uid) == minted.uid().as_ref()), "owned by it");
    let stored = serde_json::to_string(&api.get("agent").await.unwrap()).unwrap();
    assert!(!stored.contains(&plaintext[4..]), "the token object holds no plaintext");

    // Revoked: final, and the plaintext goes at once.
    api.patch("agent", &PatchParams::default(), &Patch::Merge(json!({"spec": {"revoked": true}}))).await.unwrap();
    let revoked = wait_token(&api, "agent", "revoked", |t| phase(t) == Some(TokenPhase::Revoked)).await;
    let rs = revoked.status.clone().unwrap();
    assert!(rs.revoked_at.is_some());
    assert_eq!(rs.digest.as_deref(), Some(digest.as_str()), "never minted again");
    wait_token(&api, "agent", "without its Secret", |t| t.status.as_ref().is_some_and(|s| s.secret_name.is_none()))
        .await;
    assert!(secrets.get_opt(&secret_name).await.unwrap().is_none(), "the plaintext is gone");
    let back = api.patch("agent", &PatchParams::default(), &Patch::Merge(json!({"spec": {"revoked": false}}))).await;
    assert!(back.is_err(), "revoked: true is final");
    // An operator restart (a new leader's first reconcile of every token)
    // mints nothing again: still revoked, the same digest, no plaintext.
    stack.operator().restart().unwrap();
    stack.operator().wait_ready(sessions::DEADLINE).unwrap();
    api.create(&PostParams::default(), &token("after-restart", "box", &["read"])).await.unwrap();
    wait_token(&api, "after-restart", "active", |t| phase(t) == Some(TokenPhase::Active)).await;
    let again = api.get("agent").await.unwrap().status.unwrap();
    assert_eq!((again.phase, again.digest.as_deref()), (Some(TokenPhase::Revoked), Some(digest.as_str())));
    assert!(
        again.secret_name.is_none() && secrets.get_opt(&secret_name).await.unwrap().is_none(),
        "no plaintext again"
    );
    // Nor can a status write bring it back, or give it another digest.
    let revive = json!({"status": {"phase": "active"}});
    let err = api.patch_status("agent", &PatchParams::default(), &Patch::Merge(&revive)).await.unwrap_err();
    assert!(err.to_string().contains("never becomes active again"), "{err}");
    let swap = json!({"status": {"digest": format!("sha384:{}", "0".repeat(96))}});
    let err = api.patch_status("agent", &PatchParams::default(), &Patch::Merge(&swap)).await.unwrap_err();
    assert!(err.to_string().contains("digest is written once"), "{err}");

    // A token for a session that does not exist is refused at admission.
    let err = api.create(&PostParams::default(), &token("orphan", "nope", &["read"])).await.unwrap_err();
    assert!(err.to_string().contains("sandbox_not_found: no Sandbox nope"), "{err}");
    // So is a key that is not a P-256 point.
    let mut bad_key = token("bad-key", "box", &["read"]);
    bad_key.spec.public_key.y = bad_key.spec.public_key.x.clone();
    let err = api.create(&PostParams::default(), &bad_key).await.unwrap_err();
    assert!(err.to_string().contains("sandbox_request_invalid: publicKey must be a P-256"), "{err}");

    // At the session's end every token is revoked but a read-only one.
    api.create(&PostParams::default(), &token("reader", "box", &["read"])).await.unwrap();
    api.create(&PostParams::default(), &token("runner", "box", &["exec"])).await.unwrap();
    wait_token(&api, "reader", "active", |t| phase(t) == Some(TokenPhase::Active)).await;
    wait_token(&api, "runner", "active", |t| phase(t) == Some(TokenPhase::Active)).await;
    sessions::set_state(&boxes, "box", "Ended").await.unwrap();
    sessions::wait_phase(stack, &boxes, "box", Phase::Ended).await;
    let runner = wait_token(&api, "runner", "revoked", |t| phase(t) == Some(TokenPhase::Revoked)).await;
    assert_eq!(runner.status.unwrap().reason.as_deref(), Some("session_ended"));
    assert_eq!(phase(&api.get("reader").await.unwrap()), Some(TokenPhase::Active), "a read token reads on");
}

/// `kubectl` with `args` against the stack: (succeeded, stderr).
fn kubectl(stack: &hangar_e2e::LocalStack, args: &[&str]) -> (bool, String) {
    let out = stack.cp.kubectl().args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The GitOps path: a token applied from a manifest, revoked, then the old
/// manifest applied again (as Argo CD or Flux would on a resync): it stays
/// revoked with its digest; `revoked: false` in a manifest is refused;
/// deleting it and applying the manifest makes a new token, never the old
/// one. And the 33rd active token of a session is refused at `apply`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reapplied_manifest_never_brings_a_revoked_token_back() {
    let stack = shared_stack();
    let ns = "tokens-apply";
    sessions::running_box(stack, ns).await;
    let api: Api<SessionToken> = Api::namespaced(stack.cp.client().await.unwrap(), ns);
    let dir = stack.cp.dir().join("tokens-apply");
    std::fs::create_dir_all(&dir).unwrap();
    let manifest = |name: &str, revoked: Option<bool>| {
        let mut t = serde_json::to_value(token(name, "box", &["read"])).unwrap();
        match revoked {
            Some(r) => t["spec"]["revoked"] = json!(r),
            None => drop(t["spec"].as_object_mut().unwrap().remove("revoked")),
        }
        let path = dir.join(format!("{name}-{revoked:?}.json"));
        std::fs::write(&path, t.to_string()).unwrap();
        path.display().to_string()
    };
    let original = manifest("gitops", None);
    let (ok, err) = kubectl(stack, &["apply", "-n", ns, "-f", &original]);
    assert!(ok, "{err}");
    let active = wait_token(&api, "gitops", "active", |t| phase(t) == Some(TokenPhase::Active)).await;
    let digest = active.status.unwrap().digest.unwrap();
    // Revoked out of band (`kubectl patch`, or the gateway): the old
    // manifest applies as a no-op, since it says nothing of `revoked`.
    let (ok, err) = kubectl(
        stack,
        &[
            "patch",
            "sessiontokens.hangar.dev",
            "gitops",
            "-n",
            ns,
            "--type=merge",
            "-p",
            r#"{"spec":{"revoked":true}}"#,
        ],
    );
    assert!(ok, "{err}");
    wait_token(&api, "gitops", "revoked", |t| phase(t) == Some(TokenPhase::Revoked)).await;
    let (ok, err) = kubectl(stack, &["apply", "-n", ns, "-f", &original]);
    assert!(ok, "the old manifest applies: {err}");
    // Revoked by apply: the old manifest would now drop the field (kubectl
    // removes what the last apply set), which is refused; so is `false`.
    let (ok, err) = kubectl(stack, &["apply", "-n", ns, "-f", &manifest("gitops", Some(true))]);
    assert!(ok, "revoking by apply: {err}");
    for back in [original.clone(), manifest("gitops", Some(false))] {
        let (ok, err) = kubectl(stack, &["apply", "-n", ns, "-f", &back]);
        assert!(!ok && err.contains("revoked is final"), "un-revoking by apply is refused: {err}");
    }
    let now = api.get("gitops").await.unwrap();
    assert!(now.spec.revoked, "still revoked in spec");
    let st = now.status.unwrap();
    assert_eq!((st.phase, st.digest.as_deref()), (Some(TokenPhase::Revoked), Some(digest.as_str())));

    // Deleted and applied again: a new token, a new plaintext.
    let (ok, err) = kubectl(stack, &["delete", "sessiontokens.hangar.dev", "gitops", "-n", ns, "--wait"]);
    assert!(ok, "{err}");
    let (ok, err) = kubectl(stack, &["apply", "-n", ns, "-f", &original]);
    assert!(ok, "{err}");
    let again = wait_token(&api, "gitops", "active", |t| phase(t) == Some(TokenPhase::Active)).await;
    assert_ne!(again.status.unwrap().digest.unwrap(), digest, "the old plaintext is not the new token's");

    // The session's 32 active tokens: gitops and 31 more; the 33rd is refused.
    for i in 1..32 {
        api.create(&PostParams::default(), &token(&format!("t{i}"), "box", &["read"])).await.unwrap();
    }
    let (ok, err) = kubectl(stack, &["apply", "-n", ns, "-f", &manifest("one-too-many", None)]);
    assert!(!ok && err.contains("sandbox_token_limit"), "the 33rd: {err}");
    assert!(api.get_opt("one-too-many").await.unwrap().is_none(), "not created");
}

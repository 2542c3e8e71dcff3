//! Signed templates, end to end: a SandboxTemplate is Registered only when
//! its release payload is signed by a key the platform trusts (else
//! Rejected, with why); a Sandbox may name only a template registered for
//! its namespace (refused at admission otherwise, another owner's template
//! answered like an absent one); `hangar-template sign` signs a manifest;
//! `GET /v1/sandbox-templates` lists what a namespace can start from.

use hangar_crds::{Phase, Sandbox, SandboxTemplate};
use hangar_e2e::gateway::member_token;
use hangar_e2e::operator::workspace_binary;
use hangar_e2e::registry::{Image, Manifest};
use hangar_e2e::sessions::{self, ensure_namespace, phase, wait_event, wait_for, wait_object};
use hangar_e2e::shared_stack;
use hangar_e2e::templates::{sign, template};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, PostParams};
use serde_json::json;

fn phase_of(t: &SandboxTemplate) -> (String, String) {
    let st = t.status.clone().unwrap_or_default();
    (st.phase.unwrap_or_default(), st.reason.unwrap_or_default())
}

async fn settle(api: &Api<SandboxTemplate>, name: &str) -> (String, String) {
    let t = wait_object(api, name, "registered or rejected", |t| !phase_of(t).0.is_empty(), |t| format!("{t:?}")).await;
    phase_of(&t)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_signed_templates_register_and_sessions_use_only_theirs() {
    let stack = shared_stack();
    let client = stack.cp.client().await.unwrap();
    let (owner_ns, other_ns) = ("tpl-owner", "tpl-other");
    ensure_namespace(&client, owner_ns).await;
    ensure_namespace(&client, other_ns).await;
    let templates: Api<SandboxTemplate> = Api::all(client.clone());
    let image = stack
        .registry
        .push(&Image::single("templates/tools", Manifest::of("linux", "arm64", &[("etc/tools", b"tools 1.0\n")])));
    let create = |t: SandboxTemplate| {
        let templates = templates.clone();
        async move { templates.create(&PostParams::default(), &t).await.unwrap() }
    };

    // Signed with a trusted key: Registered.
    create(sign(template("tools", "1.0", &image, None))).await;
    assert_eq!(settle(&templates, "tools-1-0").await.0, "Registered");
    // Owned by one namespace.
    create(sign(template("tools", "2.0", &image, Some(owner_ns)))).await;
    assert_eq!(settle(&templates, "tools-2-0").await.0, "Registered");
    // Not signed at all; signed by a key nobody trusts; a signature copied
    // from another release (its manifest changed after signing).
    create(template("tools", "3.0", &image, None)).await;
    let mut unknown_key = sign(template("tools", "4.0", &image, None));
    unknown_key.spec.signed_by = "someone-else".into();
    create(unknown_key).await;
    let signed = sign(template("tools", "5.0", &image, None));
    let mut tampered = template("tools", "5.0", &image, None);
    tampered.metadata.name = Some("tools-5-0-tampered".into());
    tampered.spec.version = "5.1".into();
    tampered.spec.signature = signed.spec.signature.clone();
    create(tampered).await;
    for (name, why) in [
        ("tools-3-0", "does not verify under key hangar-test-release"),
        ("tools-4-0", "names key someone-else, which the platform does not trust"),
        ("tools-5-0-tampered", "does not verify"),
    ] {
        let (phase, reason) = settle(&templates, name).await;
        assert_eq!(phase, "Rejected", "{name}");
        assert!(reason.contains(why), "{name}: {reason}");
    }
    let events: Api<Event> = Api::all(client.clone());
    wait_event(&events, "tools-4-0", "Rejected", |e| {
        e.reason.as_deref() == Some("Rejected") && e.type_.as_deref() == Some("Warning")
    })
    .await;

    // A session from the registered template runs its image.
    let boxes: Api<Sandbox> = Api::namespaced(client.clone(), other_ns);
    let from = |name: &str, t: &str| sessions::sandbox(name, "commands", json!({"image": null, "template": t}));
    boxes.create(&PostParams::default(), &from("shared-ok", "tools@1.0")).await.unwrap();
    wait_for(stack, &boxes, "shared-ok", "running", |s| phase(s) == Some(Phase::Running)).await;
    let pod = Api::<Pod>::namespaced(client.clone(), other_ns).get("hangar-agent-shared-ok").await.unwrap();
    assert_eq!(pod.spec.unwrap().containers[0].image.as_deref(), Some(image.as_str()));

    // Refused at admission, nothing created: unregistered, rejected,
    // another owner's (answered like an absent one).
    let refused = |name: &'static str, t: &'static str| {
        let boxes = boxes.clone();
        async move {
            let err = boxes.create(&PostParams::default(), &from(name, t)).await.unwrap_err();
            assert!(boxes.get_opt(name).await.unwrap().is_none(), "{name} was not created");
            match err {
                kube::Error::Api(e) => e.message,
                other => panic!("{name}: {other}"),
            }
        }
    };
    let absent = refused("absent", "tools@9.9").await;
    assert!(absent.contains("template_not_registered: tools@9.9 is not a registered template here"), "{absent}");
    let others = refused("others", "tools@2.0").await;
    assert!(others.contains("template_not_registered: tools@2.0 is not a registered template here"), "{others}");
    for (name, t) in [("unsigned", "tools@3.0"), ("untrusted", "tools@4.0"), ("tampered", "tools@5.1")] {
        let message = refused(name, t).await;
        assert!(message.contains("template_rejected"), "{name}: {message}");
    }
    // Its owner's sessions may use it.
    let owned: Api<Sandbox> = Api::namespaced(client.clone(), owner_ns);
    owned.create(&PostParams::default(), &from("owned-ok", "tools@2.0")).await.unwrap();
    wait_for(stack, &owned, "owned-ok", "running", |s| phase(s) == Some(Phase::Running)).await;

    // The gateway lists what a namespace can start from.
    let gw = stack.gateway_client();
    let owner = member_token(&stack.cp, owner_ns, "tpl-lister", "get,list,create");
    let names = |v: &serde_json::Value| -> Vec<String> {
        let mut n: Vec<String> =
            v["templates"].as_array().unwrap().iter().map(|t| t["template"].as_str().unwrap().to_owned()).collect();
        n.sort();
        n
    };
    let (status, shared) = gw.get("/v1/sandbox-templates", &owner).await;
    assert_eq!(status, 200, "{shared}");
    assert!(names(&shared).contains(&"tools@1.0".to_owned()), "{shared}");
    assert!(!names(&shared).iter().any(|n| ["tools@2.0", "tools@3.0", "tools@4.0", "tools@5.1"].contains(&n.as_str())));
    let (status, mine) = gw.get(&format!("/v1/sandbox-templates?namespace={owner_ns}"), &owner).await;
    assert_eq!(status, 200, "{mine}");
    assert!(names(&mine).contains(&"tools@2.0".to_owned()), "{mine}");
    // Another namespace's list needs the right to start sessions there.
    let (status, body) = gw.get(&format!("/v1/sandbox-templates?namespace={other_ns}"), &owner).await;
    assert_eq!((status, body["error"]["code"].as_str()), (403, Some("forbidden")), "{body}");

    // The project's command signs a manifest; the result registers.
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("release.key");
    std::fs::write(&key, hangar_e2e::templates::test_signing_key()).unwrap();
    let unsigned = dir.path().join("template.yaml");
    std::fs::write(&unsigned, serde_yaml::to_string(&template("cli", "1.0", &image, None)).unwrap()).unwrap();
    let out = std::process::Command::new(workspace_binary("hangar-template"))
        .args(["sign", "--key"])
        .arg(&key)
        .args(["--key-name", hangar_e2e::templates::TEST_KEY_NAME])
        .arg(&unsigned)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let signed: SandboxTemplate = serde_yaml::from_slice(&out.stdout).unwrap();
    create(signed).await;
    assert_eq!(settle(&templates, "cli-1-0").await.0, "Registered");
}

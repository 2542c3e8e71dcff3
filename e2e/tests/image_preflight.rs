//! The image preflight, end to end: images the test makes and pushes to a
//! real OCI registry on loopback (go-containerregistry's, built from its Go
//! module), read by the operator before any instance starts.
//!
//! One stack of its own, and one test in order, so the operator's EC2 call
//! counters are this test's alone: every refused session fails with its
//! code and the operator made no EC2 call for it (the batched
//! DescribeInstances of the instance watcher runs for the whole cluster
//! whatever the sessions do, so it is not counted; the orphan sweep, which
//! does the same for volumes, is slowed to once an hour here).

use hangar_crds::{Phase, PreflightState, Sandbox};
use hangar_e2e::gateway::member_token;
use hangar_e2e::process::free_port;
use hangar_e2e::registry::{Blob, Image, Manifest, Registry, config, sha256};
use hangar_e2e::sessions::{self, ensure_namespace, phase, wait_event, wait_for};
use hangar_e2e::{ControlPlane, LocalStack, StackOptions};
use k8s_openapi::api::core::v1::{Event, Secret};
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use serde_json::json;

const GIB: u64 = 1 << 30;
const NS: &str = "preflight";

/// The operator's counter `metric` (summed over its labels).
fn counter(stack: &LocalStack, metric: &str) -> f64 {
    hangar_e2e::metrics_text::sum(&stack.operator().metrics(), metric)
        .unwrap_or_else(|| panic!("{metric} is not exposed"))
}

fn image_with_layers(repository: &str, arch: &str, layers: Vec<Blob>) -> Image {
    let diff_ids: Vec<String> = layers.iter().map(|l| sha256(&l.bytes)).collect();
    Image::single(repository, Manifest { config: config("linux", arch, &diff_ids), layers })
}

fn layer(bytes: Vec<u8>, declared: u64) -> Blob {
    Blob { declared_size: declared, ..Blob::new("application/vnd.oci.image.layer.v1.tar+gzip", bytes) }
}

fn preflight_of(s: &Sandbox) -> (Option<PreflightState>, String, String) {
    let p = s.status.as_ref().and_then(|st| st.image_preflight.clone()).unwrap_or_default();
    let state = s.status.as_ref().and_then(|st| st.image_preflight.as_ref()).map(|p| p.state);
    (state, p.code.unwrap_or_default(), p.message.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_are_checked_before_any_instance_starts() {
    let cp = ControlPlane::start().expect("control plane");
    // A registry that asks for credentials, and a host where nothing listens.
    let private = Registry::start(cp.dir(), Some(("robot", "pull-secret-value"))).expect("private registry");
    let down_port = free_port();
    let opts = StackOptions {
        registry_endpoints: vec![
            ("private.hangar.test".into(), private.endpoint()),
            ("down.hangar.test".into(), format!("http://127.0.0.1:{down_port}")),
        ],
        operator_env: vec![
            ("HANGAR_REGISTRY_CREDENTIALS_SECRET".into(), "registry-credentials".into()),
            ("HANGAR_PREFLIGHT_TIMEOUT_SECONDS".into(), "15".into()),
            // The orphan sweep describes the cluster's volumes on its own
            // clock; off here, so every other Describe is a session's.
            ("HANGAR_ORPHAN_SWEEP_SECONDS".into(), "3600".into()),
        ],
        ..Default::default()
    };
    let stack = LocalStack::start(cp, opts).expect("stack");
    let client = stack.cp.client().await.unwrap();
    ensure_namespace(&client, NS).await;
    let api: Api<Sandbox> = Api::namespaced(client.clone(), NS);
    let reg = &stack.registry;

    // The images, made here and pushed.
    let arm64 = reg.push(&Image::single("p/arm64", Manifest::of("linux", "arm64", &[("a", b"arm64\n")])));
    let amd64 = reg.push(&Image::single("p/amd64", Manifest::of("linux", "amd64", &[("a", b"amd64\n")])));
    let multi = Image::index("p/multi", &[("linux", "amd64"), ("linux", "arm64"), ("linux", "s390x")]);
    let multi_ref = reg.push(&multi);
    let no_arm = reg.push(&Image::index("p/no-arm", &[("linux", "amd64"), ("windows", "arm64")]));
    // Declared 9 GiB in its manifest (the blob itself is small).
    let declared_big = reg.push(&image_with_layers("p/big", "arm64", vec![layer(vec![1; 1024], 9 * GIB)]));
    // Declared just under 8 GiB in all, but one layer holds 64 KiB while its
    // manifest says 1 byte: counted at the larger, it is over.
    let under_declared = reg.push(&image_with_layers(
        "p/under-declared",
        "arm64",
        vec![layer(vec![2; 1024], 8 * GIB - 32 * 1024), layer(vec![3; 64 * 1024], 1)],
    ));
    // Exactly 8 GiB as declared: at the allowance, not over it.
    let at_limit = reg.push(&image_with_layers("p/at-limit", "arm64", vec![layer(vec![4; 1024], 8 * GIB)]));
    let missing = format!("registry.hangar.test/p/missing@{}", sha256(b"never pushed"));
    let private_image = Image::single("p/private", Manifest::of("linux", "arm64", &[("a", b"private\n")]));
    private.push(&private_image);
    let private_ref = private_image.reference().replace("registry.hangar.test", "private.hangar.test");
    let down_ref = format!("down.hangar.test/p/any@{}", sha256(b"unreachable"));

    let mutating = counter(&stack, "hangar_ec2_mutating_calls_total");
    let describe_other = counter(&stack, "hangar_ec2_describe_other_calls_total");
    let checks_before = counter(&stack, "hangar_image_preflight_checks_total");

    // Refused, each with its code (422 class), before any instance.
    let refused = [
        ("amd64-only", json!({"image": amd64}), "preflight_architecture", "a linux/amd64 image"),
        ("index-no-arm64", json!({"image": no_arm}), "preflight_architecture", "linux/amd64, windows/arm64"),
        (
            "companion-amd64",
            json!({"image": arm64, "companions": [{"name": "db", "image": amd64}]}),
            "preflight_architecture",
            "linux/amd64",
        ),
        ("declared-big", json!({"image": declared_big}), "preflight_too_large", "9.00 GiB"),
        ("under-declared", json!({"image": under_declared}), "preflight_too_large", "larger in the registry"),
        ("missing", json!({"image": missing}), "preflight_image_not_found", "not in its registry"),
        ("private-no-credentials", json!({"image": private_ref}), "preflight_registry_denied", "credentials"),
        ("registry-down", json!({"image": down_ref}), "preflight_registry_unreachable", "gave up after 15 s"),
    ];
    for (name, spec, _, _) in &refused {
        api.create(&PostParams::default(), &sessions::sandbox(name, "commands", spec.clone())).await.unwrap();
    }

    // While a registry does not answer, the session says so, and a route
    // that needs it running answers 409 image_preflight_pending.
    let pending = wait_for(&stack, &api, "registry-down", "pending with the registry's error", |s| {
        let (state, code, message) = preflight_of(s);
        state == Some(PreflightState::Pending) && code == "image_preflight_pending" && message.contains("cannot read")
    })
    .await;
    assert_eq!(phase(&pending), Some(Phase::Launching));
    let member = member_token(&stack.cp, NS, "owner", "get,list,create,patch");
    let gw = stack.gateway_client();
    let sid = pending.uid().unwrap();
    gw.wait_known(&sid, &member).await;
    let (status, body) = gw.call("POST", &format!("/v1/sandboxes/{sid}/pause"), Some(&member), None, &[]).await;
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("image_preflight_pending")), "{body}");

    let events: Api<Event> = Api::namespaced(client.clone(), NS);
    for (name, _, code, detail) in &refused {
        let s = wait_for(&stack, &api, name, "failed", |s| phase(s) == Some(Phase::Failed)).await;
        let st = s.status.clone().unwrap();
        let reason = st.stop_reason.clone().unwrap_or_default();
        assert!(reason.starts_with(&format!("{code}: ")), "{name}: stop reason {reason}");
        let (state, got, message) = preflight_of(&s);
        assert_eq!((state, got.as_str()), (Some(PreflightState::Refused), *code), "{name}");
        assert!(message.contains(detail), "{name}: {message}");
        assert!(st.instance_id.is_none() && st.attempts.is_empty(), "{name}: no instance, no attempt: {st:?}");
        let ready = st.conditions.iter().find(|c| c.type_ == "Ready").expect("Ready condition");
        assert!(ready.status == "False" && ready.message.contains(code), "{name}: {ready:?}");
        wait_event(&events, name, "PreflightFailed (with the code)", |e| {
            e.reason.as_deref() == Some("PreflightFailed") && e.message.as_deref().is_some_and(|m| m.starts_with(code))
        })
        .await;
    }
    // The failed session answers its code (422) where it would need to run,
    // and shows the reason in its state.
    let failed = api.get("amd64-only").await.unwrap().uid().unwrap();
    gw.wait_known(&failed, &member).await;
    let (status, body) = gw.call("POST", &format!("/v1/sandboxes/{failed}/pause"), Some(&member), None, &[]).await;
    assert_eq!((status, body["error"]["code"].as_str()), (422, Some("preflight_architecture")), "{body}");
    let (_, view) = gw.get(&format!("/v1/sandboxes/{failed}"), &member).await;
    assert_eq!(view["imagePreflight"]["code"], "preflight_architecture", "{view}");

    // No EC2 call for any of them: nothing launched, described or deleted.
    assert_eq!(counter(&stack, "hangar_ec2_mutating_calls_total"), mutating, "mutating EC2 calls");
    assert_eq!(
        counter(&stack, "hangar_ec2_describe_other_calls_total"),
        describe_other,
        "EC2 Describe* besides instances"
    );
    let checks_refused = counter(&stack, "hangar_image_preflight_checks_total");
    assert!(checks_refused >= checks_before + 8.0, "each image read: {checks_before} → {checks_refused}");

    // Passed: a single arm64 image; an index, run on its arm64 entry; an
    // image exactly at the allowance; the private one once the operator
    // has the registry's credentials.
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "registry-credentials"},
        "type": "kubernetes.io/dockerconfigjson",
        "stringData": {".dockerconfigjson": json!({"auths": {"private.hangar.test": {
            "username": "robot", "password": "pull-secret-value"}}}).to_string()},
    }))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), hangar_e2e::operator::SYSTEM_NAMESPACE)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let Image::Index { entries, .. } = &multi else { unreachable!() };
    let arm64_entry = entries.iter().find(|(_, a, _)| a == "arm64").unwrap().2.digest();
    let passing = [
        ("arm64", arm64.clone(), None),
        ("multi", multi_ref.clone(), Some(arm64_entry)),
        ("at-limit", at_limit.clone(), None),
        ("private", private_ref.clone(), None),
    ];
    for (name, image, _) in &passing {
        api.create(&PostParams::default(), &sessions::sandbox(name, "commands", json!({"image": image})))
            .await
            .unwrap();
    }
    for (name, image, runs) in &passing {
        let s = wait_for(&stack, &api, name, "running", |s| phase(s) == Some(Phase::Running)).await;
        let p = s
            .status
            .clone()
            .unwrap()
            .image_preflight
            .unwrap_or_else(|| panic!("{name}: no preflight in {:?}", s.status));
        assert_eq!(p.state, PreflightState::Passed, "{name}");
        assert_eq!(p.images[0].image, *image, "{name}");
        if let Some(digest) = runs {
            assert_eq!(&p.images[0].manifest_digest, digest, "{name}: judged on its linux/arm64 entry");
        }
    }
    let at = api.get("at-limit").await.unwrap().status.unwrap().image_preflight.unwrap();
    assert_eq!(at.images[0].compressed_bytes as u64, 8 * GIB);

    // Cached by digest: another session of a checked image reads nothing.
    let checks = counter(&stack, "hangar_image_preflight_checks_total");
    api.create(&PostParams::default(), &sessions::sandbox("arm64-again", "commands", json!({"image": arm64})))
        .await
        .unwrap();
    wait_for(&stack, &api, "arm64-again", "running", |s| phase(s) == Some(Phase::Running)).await;
    assert_eq!(counter(&stack, "hangar_image_preflight_checks_total"), checks, "a cached result runs no check");
    drop(private);
}

//! Output retention on a scaled clock (one "day" = one second): after
//! `outputRetentionDays` past the end the output keys are destroyed, the
//! erasure is recorded, the gateway answers 410 `sandbox_output_erased`,
//! and the sealed chunks still in the store open with no key left.

use std::time::{Duration, Instant};

use hangar_crds::{CommandPhase, Phase, Sandbox, output_keys};
use hangar_e2e::commands::{self as cmds, sh, wait_command_phase};
use hangar_e2e::gateway::member_token;
use hangar_e2e::operator::SYSTEM_NAMESPACE;
use hangar_e2e::sessions::{self, ensure_namespace, wait_for, wait_phase};
use hangar_e2e::{ControlPlane, LocalStack, StackOptions};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_is_erased_after_the_retention_and_reads_answer_410() {
    let cp = ControlPlane::start().unwrap();
    let opts =
        StackOptions { operator_env: vec![("HANGAR_RETENTION_DAY_SECONDS".into(), "1".into())], ..Default::default() };
    let stack = LocalStack::start(cp, opts).unwrap();
    let client = stack.cp.client().await.unwrap();
    let ns = "retention";
    ensure_namespace(&client, ns).await;
    let boxes: Api<Sandbox> = Api::namespaced(client.clone(), ns);
    // Two "days" of retention: two seconds on this clock.
    let spec = json!({"outputRetentionDays": 2});
    boxes.create(&PostParams::default(), &sessions::sandbox("box", "commands", spec)).await.unwrap();
    let s = wait_phase(&stack, &boxes, "box", Phase::Running).await;
    let sid = s.uid().unwrap();
    let commands = Api::namespaced(client.clone(), ns);
    cmds::create(&commands, &sh("c", "box", "echo kept-until-retention")).await;
    wait_command_phase(&stack, &commands, "c", CommandPhase::Exited).await;

    let gw = stack.gateway_client();
    let member = member_token(&stack.cp, ns, "dev", "get,list");
    let cid = "c";
    let url = format!("/v1/sandboxes/{sid}/commands/{cid}/output?after=0");
    gw.wait_known(&sid, &member).await;
    let (st, body) = gw.get(&url, &member).await;
    assert_eq!(st, 200, "{body}");
    assert_eq!(body["chunks"][0]["offset"], 0);

    boxes.patch("box", &PatchParams::default(), &Patch::Merge(&json!({"spec": {"state": "Ended"}}))).await.unwrap();
    let ended = wait_phase(&stack, &boxes, "box", Phase::Ended).await;
    // Within the retention the output still reads back.
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let deadline = Instant::now() + Duration::from_secs(30);
    let erase_after = loop {
        let keys = maps.get(&output_keys::sealed_keys_name(&sid)).await.expect("keys kept within the retention");
        if let Some(at) = keys.annotations().get("hangar.dev/erase-after") {
            break at.clone();
        }
        assert!(Instant::now() < deadline, "the deadline never went on the key Secret");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let erased = wait_for(&stack, &boxes, "box", "output erased", |s| {
        s.status.as_ref().is_some_and(|st| st.output_erased_at.is_some())
    })
    .await;
    // The session ended when its resources were gone: the certificate,
    // signed after that and recording that time, does not move the end.
    let end = ended
        .status
        .as_ref()
        .unwrap()
        .reset
        .iter()
        .filter(|r| r.step != "sign_certificate")
        .map(|r| r.confirmed_at.0)
        .max()
        .unwrap();
    let at = erased.status.as_ref().unwrap().output_erased_at.as_ref().unwrap().0;
    assert!(at.duration_since(end).as_secs() >= 2, "not before the retention: ended {end}, erased {at}");
    // Status times have one-second resolution.
    let due: k8s_openapi::jiff::Timestamp = erase_after.parse().unwrap();
    assert!(at.as_second() >= due.as_second(), "erased at {at}, deadline {erase_after}");
    assert!(maps.get_opt(&output_keys::sealed_keys_name(&sid)).await.unwrap().is_none(), "keys destroyed");

    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (st, body) = gw.get(&url, &member).await;
        if st == 410 {
            assert_eq!(body["error"]["code"], "sandbox_output_erased");
            break;
        }
        assert!(Instant::now() < deadline, "still readable: {st} {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The sealed chunks are still in the store, and nothing opens them.
    let raw = stack.output_store().raw_objects(&sid, 1).await.unwrap();
    assert!(!raw.is_empty());
    assert!(raw.iter().all(|o| !o.windows(4).any(|w| w == b"kept")), "sealed at rest");
    let none = |_: u32| None;
    assert!(matches!(
        stack.output_store().read_after(&sid, 1, 0, &none).await,
        Err(hangar_output::ReadError::Erased(1))
    ));
}

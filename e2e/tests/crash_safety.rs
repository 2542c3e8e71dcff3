//! Crash safety: the operator is killed at the worst moments (right after
//! RunInstances, right after CreateVolume, mid-pause: right after
//! StopInstances) before it records what it did. After a restart each
//! session converges with exactly one instance and one volume, counted by
//! tag in EC2 (moto ignores ClientToken, so only the look-up by tag
//! prevents a second launch).

use std::time::{Duration, Instant};

use aws_sdk_ec2::types::InstanceStateName;
use hangar_crds::{CommandPhase, Phase, Sandbox, SessionToken, TokenPhase};
use hangar_e2e::commands;
use hangar_e2e::ec2::{client as ec2_client, session_instances, session_volumes};
use hangar_e2e::sessions::{self, DEADLINE, RESET_STEPS, ensure_namespace};
use hangar_e2e::shared_stack;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

/// The tests restart the one shared operator: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn setup(ns: &str) -> (Api<Sandbox>, aws_sdk_ec2::Client) {
    let stack = shared_stack();
    let client = stack.cp.client().await.unwrap();
    ensure_namespace(&client, ns).await;
    (Api::namespaced(client, ns), ec2_client(&stack.moto.endpoint()).await)
}

async fn create(api: &Api<Sandbox>, name: &str) -> Sandbox {
    api.create(&PostParams::default(), &sessions::sandbox(name, "commands", json!({}))).await.unwrap()
}

async fn wait_phase(api: &Api<Sandbox>, name: &str, want: Phase) -> Sandbox {
    sessions::wait_phase(shared_stack(), api, name, want).await
}

async fn wait_operator_exit() {
    let start = Instant::now();
    while !shared_stack().operator().has_exited() {
        assert!(start.elapsed() < DEADLINE, "the operator did not reach its failpoint");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn live(instances: &[(String, InstanceStateName)]) -> usize {
    instances
        .iter()
        .filter(|(_, s)| !matches!(s, InstanceStateName::Terminated | InstanceStateName::ShuttingDown))
        .count()
}

async fn crash_during_launch(failpoint: &str, ns: &str) {
    let _serial = SERIAL.lock().await;
    let (api, ec2) = setup(ns).await;
    shared_stack().operator().restart_with(&[("HANGAR_FAILPOINTS", failpoint)]).unwrap();
    let sandbox = create(&api, "crashy").await;
    let session = sandbox.uid().unwrap();
    wait_operator_exit().await;

    // The crash came before the status recorded the side effect.
    let status = api.get("crashy").await.unwrap().status.unwrap_or_default();
    let instances = session_instances(&ec2, &session).await;
    assert_eq!(live(&instances), 1, "RunInstances happened before the crash");
    match failpoint {
        "after:RunInstances" => assert_eq!(status.instance_id, None, "crashed before recording the instance"),
        _ => {
            assert_eq!(session_volumes(&ec2, &session).await.len(), 1, "CreateVolume happened before the crash");
            assert_eq!(status.volume_id, None, "crashed before recording the volume");
        }
    }

    shared_stack().operator().restart_with(&[]).unwrap();
    let s = wait_phase(&api, "crashy", Phase::Running).await;
    let instances = session_instances(&ec2, &session).await;
    assert_eq!(live(&instances), 1, "exactly one instance after the restart: {instances:?}");
    assert_eq!(instances.len(), 1, "nothing launched and thrown away either: {instances:?}");
    assert_eq!(s.status.as_ref().unwrap().instance_id.as_deref(), Some(instances[0].0.as_str()));
    assert_eq!(session_volumes(&ec2, &session).await.len(), 1, "exactly one volume");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_right_after_run_instances_launches_once() {
    crash_during_launch("after:RunInstances", "crash-run").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_right_after_create_volume_creates_one_volume() {
    crash_during_launch("after:CreateVolume", "crash-volume").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_mid_pause_converges_to_paused_then_resumes() {
    let _serial = SERIAL.lock().await;
    let (api, ec2) = setup("crash-pause").await;
    shared_stack().operator().restart_with(&[]).unwrap();
    let sandbox = create(&api, "pausy").await;
    let session = sandbox.uid().unwrap();
    let running = wait_phase(&api, "pausy", Phase::Running).await;
    let instance = running.status.unwrap().instance_id.unwrap();

    shared_stack().operator().restart_with(&[("HANGAR_FAILPOINTS", "after:StopInstances")]).unwrap();
    api.patch("pausy", &PatchParams::default(), &Patch::Merge(&json!({"spec": {"state": "Paused"}}))).await.unwrap();
    wait_operator_exit().await;
    let status = api.get("pausy").await.unwrap().status.unwrap();
    assert_eq!(status.phase, Some(Phase::Pausing), "crashed mid-pause");
    assert!(status.pause.unwrap().stop_requested_at.is_none(), "before recording the StopInstances call");

    shared_stack().operator().restart_with(&[]).unwrap();
    let paused = wait_phase(&api, "pausy", Phase::Paused).await;
    assert_eq!(paused.status.unwrap().instance_id.as_deref(), Some(instance.as_str()));
    assert_eq!(session_instances(&ec2, &session).await, vec![(instance.clone(), InstanceStateName::Stopped)]);
    assert_eq!(session_volumes(&ec2, &session).await.len(), 1);

    api.patch("pausy", &PatchParams::default(), &Patch::Merge(&json!({"spec": {"state": "Running"}}))).await.unwrap();
    let resumed = wait_phase(&api, "pausy", Phase::Running).await;
    assert_eq!(resumed.status.unwrap().instance_id.as_deref(), Some(instance.as_str()));
    assert_eq!(session_instances(&ec2, &session).await.len(), 1);
}

/// A paused session with work for every reset step: an exec token to
/// revoke, a queued command to cancel, a stopped instance, its volume and
/// key.
async fn paused_with_work(api: &Api<Sandbox>, name: &str) -> String {
    let sandbox = create(api, name).await;
    wait_phase(api, name, Phase::Running).await;
    let ns = api.namespace().unwrap().to_owned();
    let client = shared_stack().cp.client().await.unwrap();
    sessions::set_state(api, name, "Paused").await.unwrap();
    wait_phase(api, name, Phase::Paused).await;
    let cmds: Api<hangar_crds::Command> = Api::namespaced(client.clone(), &ns);
    commands::create(&cmds, &commands::sh(&format!("{name}-queued"), name, "true")).await;
    let signer = hangar_keys::proof::Signer::generate();
    let token: SessionToken = serde_json::from_value(json!({
        "apiVersion": "hangar.dev/v1alpha1", "kind": "SessionToken",
        "metadata": {"name": format!("{name}-exec")},
        "spec": {"sandbox": name, "scopes": ["exec"], "ttlSeconds": 3600, "publicKey": hangar_e2e::gateway::jwk(&signer)},
    }))
    .unwrap();
    let tokens: Api<SessionToken> = Api::namespaced(client, &ns);
    tokens.create(&PostParams::default(), &token).await.unwrap();
    sessions::wait_object(
        &tokens,
        &format!("{name}-exec"),
        "active",
        |t| t.status.as_ref().and_then(|s| s.phase) == Some(TokenPhase::Active),
        |t| format!("{:?}", t.map(|t| &t.status)),
    )
    .await;
    commands::wait_command(shared_stack(), &cmds, &format!("{name}-queued"), "queued", |c| {
        commands::phase(c) == Some(CommandPhase::Queued)
    })
    .await;
    sandbox.uid().unwrap()
}

/// What a complete reset leaves: every step confirmed once, in order; the
/// token revoked, the queued command cancelled, the instance terminated,
/// the volume and key gone, the certificate stored where the status says.
async fn assert_reset_complete(api: &Api<Sandbox>, ec2: &aws_sdk_ec2::Client, name: &str, session: &str) {
    let ended = wait_phase(api, name, Phase::Ended).await;
    let st = ended.status.unwrap();
    let steps: Vec<&str> = st.reset.iter().map(|r| r.step.as_str()).collect();
    assert_eq!(steps, RESET_STEPS, "{name}: each step once, in order");
    assert_eq!(st.reset_pending, None);
    let client = shared_stack().cp.client().await.unwrap();
    let ns = api.namespace().unwrap().to_owned();
    let tokens: Api<SessionToken> = Api::namespaced(client.clone(), &ns);
    let t = tokens.get(&format!("{name}-exec")).await.unwrap().status.unwrap();
    assert_eq!(t.phase, Some(TokenPhase::Revoked), "{name}");
    let cmds: Api<hangar_crds::Command> = Api::namespaced(client.clone(), &ns);
    let c = cmds.get(&format!("{name}-queued")).await.unwrap().status.unwrap();
    assert_eq!((c.phase, c.reason.as_deref()), (Some(CommandPhase::Cancelled), Some("session_ended")), "{name}");
    let instances = session_instances(ec2, session).await;
    assert_eq!(instances.len(), 1, "{name}: one instance, never a second: {instances:?}");
    assert_eq!(live(&instances), 0, "{name}: terminated");
    assert!(session_volumes(ec2, session).await.is_empty(), "{name}: volume deleted");
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client, hangar_e2e::operator::SYSTEM_NAMESPACE);
    assert!(
        secrets.get_opt(&format!("hangar-session-key-{session}")).await.unwrap().is_none(),
        "{name}: key destroyed"
    );
    let stored = shared_stack().output_store().certificate(session).await.unwrap().expect("certificate stored");
    assert_eq!(st.certificate.unwrap().digest, Some(hangar_keys::session_certificate::digest(&stored)), "{name}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_at_each_reset_step_ends_with_every_step_done_once() {
    let _serial = SERIAL.lock().await;
    let (api, ec2) = setup("crash-reset").await;
    shared_stack().operator().restart_with(&[]).unwrap();
    let mut sessions = vec![];
    for (i, _) in RESET_STEPS.iter().enumerate() {
        let name = format!("reset-{i}");
        let session = paused_with_work(&api, &name).await;
        sessions.push((name, session));
    }
    for (step, (name, session)) in RESET_STEPS.iter().zip(&sessions) {
        let failpoint = format!("reset:{step}");
        shared_stack().operator().restart_with(&[("HANGAR_FAILPOINTS", failpoint.as_str())]).unwrap();
        sessions::set_state(&api, name, "Ended").await.unwrap();
        wait_operator_exit().await;
        // Crashed right after the step's side effect, before the status
        // recorded it: the step is not confirmed yet.
        let st = api.get(name).await.unwrap().status.unwrap_or_default();
        assert!(!st.reset.iter().any(|r| r.step == *step), "{failpoint}: crashed before confirming it: {:?}", st.reset);
        shared_stack().operator().restart_with(&[]).unwrap();
        assert_reset_complete(&api, &ec2, name, session).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_reset_step_shows_reset_incomplete_with_the_step_and_why() {
    let _serial = SERIAL.lock().await;
    let (api, ec2) = setup("reset-incomplete").await;
    shared_stack().operator().restart_with(&[]).unwrap();
    let session = paused_with_work(&api, "stuck").await;
    let instance = api.get("stuck").await.unwrap().status.unwrap().instance_id.unwrap();
    // EC2 refuses the termination three times (not retried by the SDK).
    shared_stack().ec2_proxy().inject(hangar_e2e::ec2_faults::Fault {
        action: "TerminateInstances",
        body_contains: vec![instance.clone()],
        code: "UnauthorizedOperation",
        status: 403,
        times: 3,
    });
    sessions::set_state(&api, "stuck", "Ended").await.unwrap();
    let waiting = sessions::wait_for(shared_stack(), &api, "stuck", "reset_incomplete", |s| {
        sessions::phase(s) == Some(Phase::ResetIncomplete)
    })
    .await;
    let st = waiting.status.unwrap();
    let pending = st.reset_pending.expect("the pending step");
    assert_eq!(pending.step, "terminate_instance");
    assert!(pending.message.contains("UnauthorizedOperation"), "says why: {}", pending.message);
    let steps: Vec<&str> = st.reset.iter().map(|r| r.step.as_str()).collect();
    assert_eq!(steps, ["revoke_tokens", "cancel_queued_commands"], "the steps before it are confirmed");
    let ready = st.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert!(ready.message.contains("terminate_instance"), "{}", ready.message);
    assert_reset_complete(&api, &ec2, "stuck", &session).await;
}

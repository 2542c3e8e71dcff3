//! Crash safety: the operator is killed at the worst moments (right after
//! RunInstances, right after CreateVolume, mid-pause: right after
//! StopInstances) before it records what it did. After a restart each
//! session converges with exactly one instance and one volume, counted by
//! tag in EC2 (moto ignores ClientToken, so only the look-up by tag
//! prevents a second launch).

use std::time::{Duration, Instant};

use aws_sdk_ec2::types::InstanceStateName;
use hangar_crds::{Phase, Sandbox};
use hangar_e2e::ec2::{client as ec2_client, session_instances, session_volumes};
use hangar_e2e::sessions::{self, DEADLINE, ensure_namespace};
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

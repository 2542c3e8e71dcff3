//! Interruptions, as the Hangar document's Interruption section has them,
//! each caused the way it happens in EC2 (the instance stopped or
//! terminated in the EC2 API under the session, or its worker hung) and
//! noticed through the batched DescribeInstances and the heartbeats:
//!
//! - reclaimed (stopped, nobody asked): `interrupted`, started again, a new
//!   attempt of cause `recovery`; the command running at the interruption
//!   ends `outcome_unknown` and never runs again; one queued meanwhile runs
//!   after the recovery;
//! - worker lost on a running instance: one normal StopInstances, one
//!   StartInstances, recovered;
//! - terminated: ended `outcome_unknown`, reset complete;
//! - not running again within the recovery window (no capacity): ended;
//! - mode agent: ended `outcome_unknown` at once, never recovered;
//! - a reclamation while pausing: an interruption, not a pause.
//!
//! The clocks are short here: a worker is lost after 3 s of silence, the
//! recovery window is 15 s, StartInstances is asked again every 2 s; EC2's
//! in-between states (pending, stopping, shutting-down) last 1.5 s each,
//! played by the fault proxy in front of moto.

use std::sync::OnceLock;

use hangar_crds::{AttemptCause, AttemptEnd, Command, CommandPhase, InterruptionCause, Phase, Sandbox, SandboxStatus};
use hangar_e2e::commands::{self, wait_command_phase};
use hangar_e2e::ec2::{client as ec2_client, session_instances, session_volumes};
use hangar_e2e::ec2_faults::Fault;
use hangar_e2e::sessions::{self, ensure_namespace, wait_for};
use hangar_e2e::{ControlPlane, LocalStack, StackOptions};
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use serde_json::json;

/// The stack, with the fault proxy in front of moto playing EC2's
/// in-between states (`ec2_proxy()`).
fn stack() -> &'static LocalStack {
    static S: OnceLock<LocalStack> = OnceLock::new();
    S.get_or_init(|| {
        let cp = ControlPlane::start().expect("control plane");
        let opts = StackOptions {
            operator_env: vec![
                ("HANGAR_WORKER_LOST_SECONDS".into(), "3".into()),
                ("HANGAR_RECOVERY_WINDOW_SECONDS".into(), "15".into()),
                ("HANGAR_RECOVERY_RETRY_SECONDS".into(), "2".into()),
                // Long enough that a reclamation lands inside a pause.
                ("HANGAR_PAUSE_GRACE_SECONDS".into(), "30".into()),
            ],
            // Stopping, pending and shutting-down last 1.5 s, as they take
            // a while in EC2.
            ec2_transitions: Some(std::time::Duration::from_millis(1500)),
            ..Default::default()
        };
        LocalStack::start(cp, opts).expect("stack")
    })
}

/// A running session in mode `mode` with one command running `sleep 300`.
async fn running_with_a_command(ns: &str, mode: &str, spec: serde_json::Value) -> (Api<Sandbox>, Api<Command>, String) {
    let stack = stack();
    let client = stack.cp.client().await.unwrap();
    ensure_namespace(&client, ns).await;
    let boxes: Api<Sandbox> = Api::namespaced(client.clone(), ns);
    boxes.create(&PostParams::default(), &sessions::sandbox("box", mode, spec)).await.unwrap();
    let s = sessions::wait_phase(stack, &boxes, "box", Phase::Running).await;
    let commands_api: Api<Command> = Api::namespaced(client, ns);
    if mode == "commands" {
        commands::create(&commands_api, &commands::sh("long", "box", "sleep 300")).await;
        wait_command_phase(stack, &commands_api, "long", CommandPhase::Running).await;
    }
    (boxes, commands_api, s.status.unwrap().instance_id.unwrap())
}

async fn ec2() -> aws_sdk_ec2::Client {
    ec2_client(&stack().ec2_endpoint()).await
}

fn status(s: &Sandbox) -> SandboxStatus {
    s.status.clone().unwrap_or_default()
}

fn ends(s: &SandboxStatus) -> Vec<(AttemptCause, Option<AttemptEnd>)> {
    s.attempts.iter().map(|a| (a.cause, a.end)).collect()
}

/// Waits until the session recovered: running again on attempt 2.
async fn recovered(boxes: &Api<Sandbox>) -> SandboxStatus {
    let s = wait_for(stack(), boxes, "box", "recovered on attempt 2", |s| {
        let st = status(s);
        st.phase == Some(Phase::Running) && st.attempt == Some(2)
    })
    .await;
    status(&s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaimed_instance_is_recovered_as_a_new_attempt_and_queued_commands_run_after() {
    let stack = stack();
    let (boxes, cmds, instance) = running_with_a_command("reclaimed", "commands", json!({})).await;
    // The reclamation: EC2 stops the instance; nobody asked for a pause.
    ec2().await.stop_instances().instance_ids(&instance).send().await.unwrap();
    wait_for(stack, &boxes, "box", "interrupted", |s| !status(s).interruptions.is_empty()).await;
    // Sent while interrupted: queued, it runs after the recovery.
    commands::create(&cmds, &commands::sh("after", "box", "echo after")).await;

    let st = recovered(&boxes).await;
    assert_eq!(
        ends(&st),
        vec![(AttemptCause::Launch, Some(AttemptEnd::Interrupted)), (AttemptCause::Recovery, None)],
        "attempt 1 interrupted, attempt 2 its recovery"
    );
    assert_eq!(st.instance_id.as_deref(), Some(instance.as_str()), "the same instance, started again");
    let int = &st.interruptions[0];
    assert_eq!((int.attempt, int.cause), (1, InterruptionCause::Reclaimed));
    assert!(int.recovered_at.is_some());
    // Compute of attempt 1 runs to its last heartbeat, not to the detection.
    let a1 = &st.attempts[0];
    assert_eq!(a1.ended_at, int.last_heartbeat_at, "attempt 1 metered to the last heartbeat");

    let long = wait_command_phase(stack, &cmds, "long", CommandPhase::OutcomeUnknown).await;
    assert_eq!(long.status.unwrap().attempt, Some(1));
    let after = wait_command_phase(stack, &cmds, "after", CommandPhase::Exited).await;
    assert_eq!(after.status.unwrap().attempt, Some(2), "the queued command ran on the recovery attempt");
    // And never again: the running one stays outcome_unknown.
    assert_eq!(commands::phase(&cmds.get("long").await.unwrap()), Some(CommandPhase::OutcomeUnknown));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_lost_on_a_running_instance_is_stopped_and_started_once() {
    let stack = stack();
    let (boxes, cmds, instance) = running_with_a_command("worker-lost", "commands", json!({})).await;
    let node = status(&boxes.get("box").await.unwrap()).node_name.unwrap();
    stack.sim.hold_worker(&node);

    let st = recovered(&boxes).await;
    assert_eq!(ends(&st), vec![(AttemptCause::Launch, Some(AttemptEnd::WorkerLost)), (AttemptCause::Recovery, None)]);
    assert_eq!(st.interruptions[0].cause, InterruptionCause::WorkerLost);
    wait_command_phase(stack, &cmds, "long", CommandPhase::OutcomeUnknown).await;
    // EC2 calls of the recovery: one StopInstances (normal, not forced),
    // one StartInstances.
    let calls = stack.ec2_proxy().seen(&instance);
    let stops: Vec<_> = calls.iter().filter(|c| c.action == "StopInstances").collect();
    let starts = calls.iter().filter(|c| c.action == "StartInstances").count();
    assert_eq!(
        (stops.len(), starts),
        (1, 1),
        "one stop and one start: {:?}",
        calls.iter().map(|c| &c.action).collect::<Vec<_>>()
    );
    assert!(!stops[0].body.contains("Force=true"), "a normal stop: {}", stops[0].body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_instance_ends_the_session_outcome_unknown_and_resets_it() {
    let stack = stack();
    let (boxes, cmds, instance) = running_with_a_command("terminated", "commands", json!({})).await;
    let session_id = boxes.get("box").await.unwrap().uid().unwrap();
    ec2().await.terminate_instances().instance_ids(&instance).send().await.unwrap();

    let st = status(&sessions::wait_phase(stack, &boxes, "box", Phase::Ended).await);
    assert_eq!(st.outcome.as_deref(), Some("outcome_unknown"));
    assert_eq!(st.stop_reason.as_deref(), Some("instance_lost"));
    assert_eq!(ends(&st), vec![(AttemptCause::Launch, Some(AttemptEnd::HostLost))]);
    assert_eq!(st.interruptions[0].cause, InterruptionCause::HostLost);
    wait_command_phase(stack, &cmds, "long", CommandPhase::OutcomeUnknown).await;
    assert!(session_volumes(&ec2().await, &session_id).await.is_empty(), "the reset deleted the volume");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_not_running_again_within_the_window_ends() {
    let stack = stack();
    let (boxes, cmds, instance) = running_with_a_command("not-back", "commands", json!({})).await;
    // No capacity to start it again, for longer than the 15 s window.
    stack.ec2_proxy().inject(Fault {
        action: "StartInstances",
        body_contains: vec![instance.clone()],
        code: "InsufficientInstanceCapacity",
        status: 500,
        times: 1000,
    });
    ec2().await.stop_instances().instance_ids(&instance).send().await.unwrap();

    let st = status(&sessions::wait_phase(stack, &boxes, "box", Phase::Ended).await);
    assert_eq!(st.stop_reason.as_deref(), Some("interruption_lost"));
    assert_eq!(st.outcome.as_deref(), Some("outcome_unknown"));
    assert_eq!(
        ends(&st),
        vec![(AttemptCause::Launch, Some(AttemptEnd::Interrupted))],
        "no attempt for starts that never ran"
    );
    let detected = st.interruptions[0].detected_at.0;
    let ended_at = st.reset.first().map(|r| r.confirmed_at.0).unwrap();
    assert!(ended_at.duration_since(detected).as_secs() >= 15, "waited the window out");
    // Asked again every 2 s meanwhile, not in a hot loop.
    let starts = stack.ec2_proxy().seen(&instance).iter().filter(|c| c.action == "StartInstances").count();
    assert!((5..=12).contains(&starts), "StartInstances asked {starts} times over a 15 s window at a 2 s interval");
    wait_command_phase(stack, &cmds, "long", CommandPhase::OutcomeUnknown).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mode_agent_is_never_recovered() {
    let stack = stack();
    let spec = json!({"command": ["sh", "-c", "sleep 300"]});
    let (boxes, _, instance) = running_with_a_command("agent-interrupted", "agent", spec).await;
    ec2().await.stop_instances().instance_ids(&instance).send().await.unwrap();

    let st = status(&sessions::wait_phase(stack, &boxes, "box", Phase::Ended).await);
    assert_eq!(st.outcome.as_deref(), Some("outcome_unknown"));
    assert_eq!(st.stop_reason.as_deref(), Some("interruption_lost"));
    assert_eq!(ends(&st), vec![(AttemptCause::Launch, Some(AttemptEnd::Interrupted))], "never a recovery attempt");
    let session_id = boxes.get("box").await.unwrap().uid().unwrap();
    let left: Vec<_> = session_instances(&ec2().await, &session_id).await;
    assert!(left.iter().all(|(_, s)| s.as_str() == "terminated"), "instance terminated by the reset: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclamation_while_pausing_is_an_interruption_not_a_pause() {
    let stack = stack();
    let (boxes, cmds, instance) = running_with_a_command("pause-reclaimed", "commands", json!({})).await;
    let node = status(&boxes.get("box").await.unwrap()).node_name.unwrap();
    // A hung worker never reports the workspace closed, so the pause waits
    // its grace (30 s here) — and EC2 reclaims the instance meanwhile.
    stack.sim.hold_worker(&node);
    sessions::set_state(&boxes, "box", "Paused").await.unwrap();
    sessions::wait_phase(stack, &boxes, "box", Phase::Pausing).await;
    ec2().await.stop_instances().instance_ids(&instance).send().await.unwrap();

    let st = status(&sessions::wait_phase(stack, &boxes, "box", Phase::Paused).await);
    assert_eq!(ends(&st), vec![(AttemptCause::Launch, Some(AttemptEnd::Interrupted))], "an interruption, not a pause");
    assert_eq!(st.interruptions[0].cause, InterruptionCause::Reclaimed);
    let long = wait_command_phase(stack, &cmds, "long", CommandPhase::OutcomeUnknown).await;
    assert_ne!(long.status.unwrap().phase, Some(CommandPhase::KilledAtPause));
    // Paused as asked: a resume brings it back as a normal resume.
    sessions::set_state(&boxes, "box", "Running").await.unwrap();
    let st = recovered(&boxes).await;
    assert_eq!(st.attempts[1].cause, AttemptCause::Resume);
}

//! The session's clocks, on a stack that runs them fast:
//!
//! - idle (mode commands), one second = 50 ms, so `idleTimeoutSeconds: 60`
//!   is 3 s and the 30 s attach window 1.5 s: a running command and an
//!   attached client keep a session active; idle for the timeout it ends
//!   (`idle_timeout`) or pauses, and a session paused for idle stays paused
//!   until a new resume request;
//! - the hard stop, one second of `stopAfterSeconds` = 2 ms, so 3600 is
//!   7.2 s of metered compute, counted across attempts, not while paused
//!   (the deadline the node is given counts from the attempt's start in
//!   whole seconds, so it may come up to 1 s early, never late);
//! - the longest pause (7 days) as 6 s: then the session ends;
//! - billing, one hour = 1 s, at round prices (1 cent per vCPU-second, 1
//!   cent per GiB of paused volume per started second, 2 s free): a
//!   scripted session's record equals the figures worked out by hand from
//!   the durations its status records.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use hangar_crds::{Command, CommandPhase, Phase, Sandbox};
use hangar_e2e::gateway::member_token;
use hangar_e2e::sessions::{self, ensure_namespace};
use hangar_e2e::{ControlPlane, LocalStack, StackOptions};
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use serde_json::json;

fn stack() -> &'static LocalStack {
    static S: OnceLock<LocalStack> = OnceLock::new();
    S.get_or_init(|| {
        let cp = ControlPlane::start().expect("control plane");
        let opts = StackOptions {
            operator_env: vec![
                ("HANGAR_IDLE_SECOND_MILLIS".into(), "50".into()),
                ("HANGAR_STOP_AFTER_SECOND_MILLIS".into(), "2".into()),
                // The 7-day limit on a pause, as 6 s (the other tests here
                // pause for less).
                ("HANGAR_MAX_PAUSE_SECONDS".into(), "6".into()),
                ("HANGAR_BILLING_HOUR_SECONDS".into(), "1".into()),
                ("HANGAR_FREE_COMPUTE_SECONDS".into(), "2".into()),
                ("HANGAR_PRICE_VCPU_HOUR_MILLICENTS".into(), "1000".into()),
                ("HANGAR_PRICE_STORAGE_GIB_HOUR_MILLICENTS".into(), "1000".into()),
            ],
            ..Default::default()
        };
        LocalStack::start(cp, opts).expect("stack")
    })
}

async fn session(ns: &str, name: &str, action: &str) -> (Api<Sandbox>, Api<Command>, Sandbox) {
    let stack = stack();
    let client = stack.cp.client().await.unwrap();
    ensure_namespace(&client, ns).await;
    let boxes: Api<Sandbox> = Api::namespaced(client.clone(), ns);
    let spec = json!({"idleTimeoutSeconds": 60, "idleAction": action});
    boxes.create(&PostParams::default(), &sessions::sandbox(name, "commands", spec)).await.unwrap();
    let s = sessions::wait_phase(stack, &boxes, name, Phase::Running).await;
    (boxes, Api::namespaced(client, ns), s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_command_keeps_a_session_alive_then_idle_ends_it() {
    let stack = stack();
    let (boxes, commands, _) = session("idle-end", "box", "end").await;
    // Runs 5 s, longer than the 3 s timeout: the session must not end under it.
    commands.create(&PostParams::default(), &hangar_e2e::commands::sh("long", "box", "sleep 5")).await.unwrap();
    let started = Instant::now();
    let s = sessions::wait_phase(stack, &boxes, "box", Phase::Ended).await;
    let status = s.status.unwrap();
    assert_eq!(status.stop_reason.as_deref(), Some("idle_timeout"));
    assert!(started.elapsed() >= Duration::from_secs(5), "ended while its command ran");
    // The 3 s idle before the end is flagged apart (whole seconds).
    let idle = status.idle_seconds.unwrap_or(0);
    assert!((2..=5).contains(&idle), "idle compute recorded: {idle} s");
    let long = commands.get("long").await.unwrap();
    assert_eq!(long.status.unwrap().phase, Some(CommandPhase::Exited), "the command ran to its end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attached_client_keeps_a_session_alive_then_idle_pauses_it_until_a_new_resume() {
    let stack = stack();
    let ns = "idle-pause";
    let (boxes, _, s) = session(ns, "box", "pause").await;
    let sid = s.uid().unwrap();
    let gw = stack.gateway_client();
    let member = member_token(&stack.cp, ns, "dev", "get,list,create,patch");
    gw.wait_known(&sid, &member).await;
    // Attached every 0.5 s for 5 s (past the 3 s timeout): still running.
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        let (status, _) = gw.get(&format!("/v1/sandboxes/{sid}/attach"), &member).await;
        assert_eq!(status, 200);
        let now = boxes.get("box").await.unwrap();
        assert_eq!(sessions::phase(&now), Some(Phase::Running), "idle while a client was attached");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Left alone: it pauses (the instance stops), though the spec says Running.
    let s = sessions::wait_phase(stack, &boxes, "box", Phase::Paused).await;
    assert_eq!(s.spec.state, hangar_crds::sandbox::DesiredState::Running);
    let status = s.status.clone().unwrap();
    assert!(status.idle_paused_request.is_some());
    let attempts = status.attempts.len();
    // It stays paused: no resume without a new request.
    let hold = Instant::now() + Duration::from_secs(2);
    while Instant::now() < hold {
        let now = boxes.get("box").await.unwrap();
        assert_eq!(sessions::phase(&now), Some(Phase::Paused), "resumed by itself");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // The gateway's resume is a new request: the same instance runs again.
    let (status, body) = gw.call("POST", &format!("/v1/sandboxes/{sid}/resume"), Some(&member), None, &[]).await;
    assert_eq!(status, 202, "{body}");
    let s = sessions::wait_phase(stack, &boxes, "box", Phase::Running).await;
    let resumed = s.status.unwrap();
    assert_eq!(resumed.attempts.len(), attempts + 1);
    assert!(resumed.idle_paused_request.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hard_stop_counts_compute_across_a_pause_and_ends_the_session() {
    use hangar_crds::sandbox::DesiredState;
    let stack = stack();
    let client = stack.cp.client().await.unwrap();
    ensure_namespace(&client, "hard-stop").await;
    let boxes: Api<Sandbox> = Api::namespaced(client, "hard-stop");
    // 7.2 s of compute; never idle on this clock.
    let spec = json!({"stopAfterSeconds": 3600, "idleTimeoutSeconds": 86400});
    boxes.create(&PostParams::default(), &sessions::sandbox("capped", "commands", spec)).await.unwrap();
    sessions::wait_phase(stack, &boxes, "capped", Phase::Running).await;
    let started = Instant::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    sessions::set_state(&boxes, "capped", "Paused").await.unwrap();
    sessions::wait_phase(stack, &boxes, "capped", Phase::Paused).await;
    // Paused time is not compute: 4 s paused, past the limit in wall time.
    let hold = Instant::now() + Duration::from_secs(4);
    while Instant::now() < hold {
        let now = boxes.get("capped").await.unwrap();
        assert_eq!(sessions::phase(&now), Some(Phase::Paused), "a pause used the hard stop's time");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    sessions::set_state(&boxes, "capped", "Running").await.unwrap();
    sessions::wait_phase(stack, &boxes, "capped", Phase::Running).await;
    let s = sessions::wait_phase(stack, &boxes, "capped", Phase::Ended).await;
    let wall = started.elapsed();
    assert_eq!(s.spec.state, DesiredState::Running);
    let status = s.status.unwrap();
    assert_eq!(status.stop_reason.as_deref(), Some("stop_after"));
    let compute: i64 = status.attempts.iter().map(|a| a.compute_seconds).sum();
    assert!((6..=10).contains(&compute), "about 7.2 s of compute over two attempts: {compute} s");
    // Had the pause counted, it would have ended about 7.2 s in.
    assert!(wall >= Duration::from_millis(7200 + 4000 - 1500), "the 4 s pause was not counted: {wall:?}");
    assert_eq!(status.attempts.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_paused_for_the_longest_pause_ends_and_is_reset() {
    let stack = stack();
    let client = stack.cp.client().await.unwrap();
    ensure_namespace(&client, "long-pause").await;
    let boxes: Api<Sandbox> = Api::namespaced(client, "long-pause");
    let spec = json!({"idleTimeoutSeconds": 86400});
    boxes.create(&PostParams::default(), &sessions::sandbox("sleepy", "commands", spec)).await.unwrap();
    let s = sessions::wait_phase(stack, &boxes, "sleepy", Phase::Running).await;
    let session = s.uid().unwrap();
    sessions::set_state(&boxes, "sleepy", "Paused").await.unwrap();
    sessions::wait_phase(stack, &boxes, "sleepy", Phase::Paused).await;
    let paused_at = Instant::now();
    let s = sessions::wait_phase(stack, &boxes, "sleepy", Phase::Ended).await;
    assert!(paused_at.elapsed() >= Duration::from_secs(5), "ended before the longest pause: {:?}", paused_at.elapsed());
    let status = s.status.unwrap();
    assert_eq!(status.stop_reason.as_deref(), Some("paused_too_long"));
    let steps: Vec<&str> = status.reset.iter().map(|r| r.step.as_str()).collect();
    assert_eq!(steps, hangar_e2e::sessions::RESET_STEPS);
    let ec2 = hangar_e2e::ec2::client(&stack.moto.endpoint()).await;
    let instances = hangar_e2e::ec2::session_instances(&ec2, &session).await;
    assert!(instances.iter().all(|(_, st)| *st == aws_sdk_ec2::types::InstanceStateName::Terminated));
}

/// Launch, idle until the idle clock pauses it, paused for at least 3
/// storage hours (3 s), resumed, busy until the hard stop ends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scripted_sessions_bill_matches_the_hand_computed_figures() {
    let stack = stack();
    let ns = "billing";
    let client = stack.cp.client().await.unwrap();
    ensure_namespace(&client, ns).await;
    let boxes: Api<Sandbox> = Api::namespaced(client.clone(), ns);
    // Idle 60 s = 3 s here, then pause; 3600 s of compute = 7.2 s.
    let spec = json!({"stopAfterSeconds": 3600, "idleTimeoutSeconds": 60, "idleAction": "pause", "tenant": "acme"});
    let s = boxes.create(&PostParams::default(), &sessions::sandbox("metered", "commands", spec)).await.unwrap();
    let sid = s.uid().unwrap();
    let running = sessions::wait_phase(stack, &boxes, "metered", Phase::Running).await.status.unwrap();
    assert_eq!(running.instance_type.as_deref(), Some("m7g.large"), "2 vCPUs");
    let live = running.billing.expect("a record while it runs");
    assert_eq!((live.minimum_charge_cents, live.trued_up), (Some(500), None));
    assert!(live.total_cents >= Some(500), "the minimum is charged once the instance runs: {live:?}");
    // Nothing runs: the idle clock pauses it.
    let paused = sessions::wait_phase(stack, &boxes, "metered", Phase::Paused).await;
    assert!(paused.status.unwrap().idle_paused_request.is_some(), "paused by the idle clock");
    let hold = Instant::now() + Duration::from_millis(3_500);
    while Instant::now() < hold {
        assert_eq!(sessions::phase(&boxes.get("metered").await.unwrap()), Some(Phase::Paused));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let resume = json!({"metadata": {"annotations": {hangar_core::session::requests::RETRY_RESUME_ANNOTATION: "1"}}});
    boxes.patch("metered", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&resume)).await.unwrap();
    sessions::wait_phase(stack, &boxes, "metered", Phase::Running).await;
    // Busy to the hard stop, so idle does not pause it again.
    let commands: Api<Command> = Api::namespaced(client, ns);
    commands.create(&PostParams::default(), &hangar_e2e::commands::sh("busy", "metered", "sleep 60")).await.unwrap();
    let ended = sessions::wait_phase(stack, &boxes, "metered", Phase::Ended).await;
    let status = ended.status.clone().unwrap();
    assert_eq!(status.stop_reason.as_deref(), Some("stop_after"));
    let bill = status.billing.clone().expect("the final record");

    // By hand, from the recorded durations.
    let (vcpus, volume_gib, free) = (2, 20, 2);
    let compute = status.compute_seconds.unwrap();
    let idle = status.idle_seconds.unwrap();
    assert!(idle >= 2, "the idle stretch before the pause is recorded: {idle} s");
    let at = |t: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>| t.as_ref().unwrap().0.as_second();
    assert_eq!(status.attempts.len(), 2, "{:?}", status.attempts);
    let paused_seconds = at(&status.attempts[1].started_at) - at(&status.attempts[0].ended_at);
    assert!(paused_seconds >= 3, "paused for 3 storage hours at least: {paused_seconds} s");
    let billable = compute - free;
    let busy = compute - idle;
    // The free seconds go to busy time first.
    let idle_billable = (idle - (free - busy).max(0)).clamp(0, billable);
    assert_eq!(bill.compute_cents, Some(billable * vcpus), "compute beyond the free hour, to the second");
    assert_eq!(bill.idle_cents, Some(idle_billable * vcpus), "its idle part");
    assert_eq!(bill.storage_cents, Some(paused_seconds * volume_gib), "each started hour of the pause");
    assert_eq!(bill.minimum_charge_cents, Some(500));
    assert_eq!(bill.total_cents, Some(500 + billable * vcpus + paused_seconds * volume_gib));
    assert_eq!(bill.compute_at_most_cents, Some((3600 - free) * vcpus), "every second up to the stop");
    assert_eq!(bill.trued_up, Some(true));

    // The session API shows the same record.
    let member = member_token(&stack.cp, ns, "dev", "get,list");
    let gw = stack.gateway_client();
    gw.wait_known(&sid, &member).await;
    let (code, view) = gw.get(&format!("/v1/sandboxes/{sid}"), &member).await;
    assert_eq!(code, 200);
    assert_eq!(view["billing"], serde_json::to_value(&bill).unwrap());
    // And the operator's metrics count it once, by namespace and tenant.
    let metrics = stack.operator().metrics();
    for (part, cents) in [("compute", billable * vcpus), ("storage", paused_seconds * volume_gib), ("minimum", 500)] {
        let series = format!("hangar_billed_cents_total{{namespace=\"{ns}\",tenant=\"acme\",part=\"{part}\"}} {cents}");
        assert!(
            metrics.lines().any(|l| l == series),
            "{series} in:\n{}",
            metrics.lines().filter(|l| l.contains("billed")).collect::<Vec<_>>().join("\n")
        );
    }
}

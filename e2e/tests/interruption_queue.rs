//! EC2's events through the SQS queue EventBridge feeds (moto's SQS, the
//! messages in EventBridge's shapes). The batched DescribeInstances runs
//! only once a minute here and a worker is lost only after 60 s, so what
//! the session does within seconds of an event, the queue made it do:
//!
//! - a state-change notification makes the operator describe at once: a
//!   terminated instance ends the session `outcome_unknown`; a reclaimed
//!   (stopped) one is started again and recovers as attempt 2;
//! - a spot interruption warning is recorded, and the stop that follows
//!   while pausing is an interruption, not a pause.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use hangar_crds::{AttemptCause, AttemptEnd, InterruptionCause, Phase, Sandbox, SandboxStatus};
use hangar_e2e::eventbridge;
use hangar_e2e::sessions::{self, ensure_namespace, wait_for};
use hangar_e2e::{ControlPlane, LocalStack, StackOptions};
use kube::api::{Api, PostParams};
use serde_json::json;

struct Queued {
    stack: LocalStack,
    sqs: aws_sdk_sqs::Client,
    queue_url: String,
}

fn env() -> &'static Queued {
    static S: OnceLock<Queued> = OnceLock::new();
    S.get_or_init(|| {
        let cp = ControlPlane::start().expect("control plane");
        let stack = LocalStack::start(cp, StackOptions::default()).expect("stack");
        let endpoint = stack.moto.endpoint();
        let (sqs, queue_url) = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let sqs = eventbridge::client(&endpoint).await;
                let url = eventbridge::create_queue(&sqs, "hangar-interruptions").await;
                (sqs, url)
            })
        })
        .join()
        .unwrap();
        stack
            .operator()
            .restart_with(&[
                ("HANGAR_INTERRUPTION_QUEUE_URL", &queue_url),
                ("HANGAR_SQS_ENDPOINT", &stack.moto.endpoint()),
                ("HANGAR_DESCRIBE_INTERVAL_MS", "60000"),
                ("HANGAR_WORKER_LOST_SECONDS", "60"),
            ])
            .expect("operator with the queue");
        Queued { stack, sqs, queue_url }
    })
}

async fn running(ns: &str) -> (Api<Sandbox>, String) {
    let stack = &env().stack;
    let client = stack.cp.client().await.unwrap();
    ensure_namespace(&client, ns).await;
    let boxes: Api<Sandbox> = Api::namespaced(client, ns);
    boxes.create(&PostParams::default(), &sessions::sandbox("box", "commands", json!({}))).await.unwrap();
    let s = sessions::wait_phase(stack, &boxes, "box", Phase::Running).await;
    (boxes, s.status.unwrap().instance_id.unwrap())
}

fn status(s: &Sandbox) -> SandboxStatus {
    s.status.clone().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_change_message_makes_a_terminated_instance_noticed_at_once() {
    let e = env();
    let (boxes, instance) = running("queue-terminated").await;
    let ec2 = hangar_e2e::ec2::client(&e.stack.moto.endpoint()).await;
    ec2.terminate_instances().instance_ids(&instance).send().await.unwrap();
    let sent = Instant::now();
    eventbridge::send_state_change(&e.sqs, &e.queue_url, &instance, "shutting-down").await;

    let s = wait_for(&e.stack, &boxes, "box", "interrupted", |s| !status(s).interruptions.is_empty()).await;
    let noticed = sent.elapsed();
    let st = status(&s);
    assert_eq!(st.interruptions[0].cause, InterruptionCause::HostLost);
    assert!(
        noticed < Duration::from_secs(30),
        "noticed after {noticed:?}: the next periodic describe (60 s) did it, not the message"
    );
    let st = status(&sessions::wait_phase(&e.stack, &boxes, "box", Phase::Ended).await);
    assert_eq!(st.outcome.as_deref(), Some("outcome_unknown"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaim_warning_makes_the_stop_while_pausing_an_interruption() {
    let e = env();
    let (boxes, instance) = running("queue-warned").await;
    eventbridge::send_reclaim_warning(&e.sqs, &e.queue_url, &instance).await;
    wait_for(&e.stack, &boxes, "box", "warned", |s| status(s).reclaim_warned_at.is_some()).await;

    sessions::set_state(&boxes, "box", "Paused").await.unwrap();
    let st = status(&sessions::wait_phase(&e.stack, &boxes, "box", Phase::Paused).await);
    assert_eq!(st.attempts[0].end, Some(AttemptEnd::Interrupted), "an interruption, not a pause");
    assert_eq!(st.interruptions[0].cause, InterruptionCause::Reclaimed);
    assert_eq!(st.reclaim_warned_at, None, "the warning is spent with the run it was about");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_change_message_gets_a_reclaimed_instance_recovered() {
    let e = env();
    let (boxes, instance) = running("queue-reclaimed").await;
    let ec2 = hangar_e2e::ec2::client(&e.stack.moto.endpoint()).await;
    ec2.stop_instances().instance_ids(&instance).send().await.unwrap();
    let sent = Instant::now();
    eventbridge::send_state_change(&e.sqs, &e.queue_url, &instance, "stopped").await;

    let s = wait_for(&e.stack, &boxes, "box", "recovered", |s| {
        let st = status(s);
        st.phase == Some(Phase::Running) && st.attempt == Some(2)
    })
    .await;
    assert!(
        sent.elapsed() < Duration::from_secs(30),
        "recovered after {:?}: not driven by the message",
        sent.elapsed()
    );
    let st = status(&s);
    assert_eq!(st.interruptions[0].cause, InterruptionCause::Reclaimed);
    assert_eq!(st.attempts[0].end, Some(AttemptEnd::Interrupted));
    assert_eq!(st.attempts[1].cause, AttemptCause::Recovery);
    assert_eq!(st.instance_id.as_deref(), Some(instance.as_str()), "the same instance");
}

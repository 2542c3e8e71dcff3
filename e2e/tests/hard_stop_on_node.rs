//! The hard stop does not depend on the operator: the worker hands the
//! attempt's deadline (`status.hardStopAt`) to the node, whose own timer
//! (a unit from the user data; the node simulator here) powers the
//! instance off at the limit. With the operator dead before the limit, the
//! instance still stops on time; the operator, back, ends the session
//! `stop_after` — not an interruption.
//!
//! One second of `stopAfterSeconds` is 2 ms here: 3600 is 7.2 s.

use std::time::{Duration, Instant};

use aws_sdk_ec2::types::InstanceStateName;
use hangar_crds::{Phase, Sandbox};
use hangar_e2e::sessions::{self, ensure_namespace};
use hangar_e2e::{ControlPlane, LocalStack, StackOptions};
use kube::api::{Api, PostParams};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_stops_itself_at_the_limit_with_the_operator_gone() {
    let cp = ControlPlane::start().expect("control plane");
    let opts = StackOptions {
        operator_env: vec![("HANGAR_STOP_AFTER_SECOND_MILLIS".into(), "2".into())],
        ..Default::default()
    };
    let stack = LocalStack::start(cp, opts).expect("stack");
    let client = stack.cp.client().await.unwrap();
    ensure_namespace(&client, "hard-stop").await;
    let boxes: Api<Sandbox> = Api::namespaced(client, "hard-stop");
    let spec = json!({"stopAfterSeconds": 3600});
    boxes.create(&PostParams::default(), &sessions::sandbox("capped", "commands", spec)).await.unwrap();
    let s = sessions::wait_phase(&stack, &boxes, "capped", Phase::Running).await;
    let status = s.status.unwrap();
    let deadline = status.hard_stop_at.clone().expect("hardStopAt while running under stopAfterSeconds").0;
    let started = status.attempts[0].started_at.clone().unwrap().0;
    let budget = deadline.duration_since(started).as_millis();
    assert!((7000..=8200).contains(&budget), "deadline = start + 7.2 s of compute, got {budget} ms");

    stack.operator().kill();
    let ec2 = hangar_e2e::ec2::client(&stack.moto.endpoint()).await;
    let instance = status.instance_id.unwrap();
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let out = ec2.describe_instances().instance_ids(&instance).send().await.unwrap();
        let state = out.reservations()[0].instances()[0].state().and_then(|s| s.name()).cloned();
        if state == Some(InstanceStateName::Stopped) {
            break;
        }
        assert!(Instant::now() < until, "the node did not stop itself by the deadline (state {state:?})");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stopped_at = k8s_openapi::jiff::Timestamp::now();
    assert!(stopped_at >= deadline, "stopped before its deadline");

    stack.operator().restart().expect("operator back");
    let s = sessions::wait_phase(&stack, &boxes, "capped", Phase::Ended).await;
    let status = s.status.unwrap();
    assert_eq!(status.stop_reason.as_deref(), Some("stop_after"));
    assert!(status.interruptions.is_empty(), "the node's own stop is the hard stop, not an interruption: {status:#?}");
}

//! Interruption benchmark on the local stack (release build; `make bench`):
//! how long after a fault the operator notices it, and what a recovery
//! costs in EC2 calls.
//!
//! 1. Lost worker: N running sessions; every worker is hung at once (the
//!    node simulator kills it and keeps it down). Detection = the fault →
//!    the interruption recorded in the status (`worker_lost`). The worker
//!    is judged lost after `--worker-lost-seconds` (60 in production; here
//!    `W`, default 10), so the figure is W plus the operator's reaction.
//! 2. Terminated instance: N running sessions; every instance is
//!    terminated in the EC2 API at once. Detection = the terminate call →
//!    `host_lost` recorded, (a) with the production describe interval
//!    (2 s) alone and (b) with EventBridge messages on the SQS queue.
//! 3. EC2 calls per recovery, counted at the fault proxy for the lost
//!    worker's recovery: mutating calls per instance, and DescribeInstances
//!    calls (one call serves every session) per recovery.
//!
//! `interruption-bench [N] [W]`: N sessions per scenario (default 10).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use hangar_crds::{InterruptionCause, Phase, Sandbox};
use hangar_e2e::bench::pct;
use hangar_e2e::eventbridge;
use hangar_e2e::sessions::{self, ensure_namespace};
use hangar_e2e::{ControlPlane, LocalStack, StackOptions};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

fn main() {
    hangar_e2e::init_tracing();
    let args: Vec<u64> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let n = args.first().copied().unwrap_or(10) as usize;
    let worker_lost = args.get(1).copied().unwrap_or(10);
    let cp = ControlPlane::start().expect("control plane");
    let opts = StackOptions {
        operator_env: hangar_e2e::bench::production_intervals()
            .into_iter()
            .chain([("HANGAR_WORKER_LOST_SECONDS".into(), worker_lost.to_string())])
            .collect(),
        // EC2's in-between states, 1 s each, through the fault proxy (which
        // also counts the calls).
        ec2_transitions: Some(Duration::from_secs(1)),
        ..Default::default()
    };
    let stack = LocalStack::start(cp, opts).expect("stack");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(run(&stack, n, worker_lost));
}

/// Starts `n` sessions in namespace `ns`; returns (name, instance id, node).
async fn sessions_running(stack: &LocalStack, ns: &str, n: usize) -> (Api<Sandbox>, Vec<(String, String, String)>) {
    let client = stack.cp.client().await.unwrap();
    ensure_namespace(&client, ns).await;
    let boxes: Api<Sandbox> = Api::namespaced(client, ns);
    for i in 0..n {
        boxes
            .create(&PostParams::default(), &sessions::sandbox(&format!("s{i}"), "commands", json!({})))
            .await
            .unwrap();
    }
    let mut out = Vec::new();
    for i in 0..n {
        let s = sessions::wait_phase(stack, &boxes, &format!("s{i}"), Phase::Running).await;
        let st = s.status.unwrap();
        out.push((format!("s{i}"), st.instance_id.unwrap(), st.node_name.unwrap()));
    }
    (boxes, out)
}

/// Polls the namespace until every named session records an interruption
/// of `cause`; returns, per session, the time from `fault_at` to the first
/// poll that saw it.
async fn detections(boxes: &Api<Sandbox>, fault_at: &HashMap<String, Instant>, cause: InterruptionCause) -> Vec<u64> {
    let mut seen: HashMap<String, u64> = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(300);
    while seen.len() < fault_at.len() {
        assert!(Instant::now() < deadline, "not every interruption was noticed within 300 s");
        for s in boxes.list(&ListParams::default()).await.unwrap() {
            let name = s.metadata.name.clone().unwrap_or_default();
            let Some(at) = fault_at.get(&name) else { continue };
            let noticed = s.status.as_ref().is_some_and(|st| st.interruptions.iter().any(|i| i.cause == cause));
            if noticed && !seen.contains_key(&name) {
                seen.insert(name, at.elapsed().as_millis() as u64);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    seen.into_values().collect()
}

/// Prints the figure and its ratio to `floor_ms`, the least it can take
/// by design (the silence the operator waits out, or one describe
/// interval), so the ratio is the operator's own reaction on any machine.
fn report(what: &str, v: Vec<u64>, floor: &str, floor_ms: u64) {
    let n = v.len();
    let (p50, p99) = (pct(v.clone(), 0.50), pct(v.clone(), 0.99));
    println!(
        "{what}: n={n} p50={p50} ms p99={p99} ms max={} ms; ÷ {floor} ({floor_ms} ms): p50 {:.2} p99 {:.2}",
        v.iter().max().copied().unwrap_or(0),
        p50 as f64 / floor_ms.max(1) as f64,
        p99 as f64 / floor_ms.max(1) as f64,
    );
}

async fn run(stack: &LocalStack, n: usize, worker_lost: u64) {
    let proxy = stack.ec2_proxy();

    // 1. Lost workers, and what their recoveries cost.
    let (boxes, running) = sessions_running(stack, "bench-worker-lost", n).await;
    let describes_before = proxy.seen("Action=DescribeInstances").len();
    let mut fault_at = HashMap::new();
    for (name, _, node) in &running {
        stack.sim.hold_worker(node);
        fault_at.insert(name.clone(), Instant::now());
    }
    let lost = detections(&boxes, &fault_at, InterruptionCause::WorkerLost).await;
    for (name, _, _) in &running {
        sessions::wait_for(stack, &boxes, name, "recovered", |s| {
            s.status.as_ref().is_some_and(|st| st.phase == Some(Phase::Running) && st.attempt == Some(2))
        })
        .await;
    }
    // Only the operator's calls: the node simulator's describes go through
    // the proxy too, and carry the cluster tag filter the operator's
    // batched describe also carries, so both are counted as one kind.
    let describes = proxy.seen("Action=DescribeInstances").len() - describes_before;
    let mut mutating = Vec::new();
    for (_, instance, _) in &running {
        let calls = proxy.seen(instance);
        let m = calls.iter().filter(|c| matches!(c.action.as_str(), "StopInstances" | "StartInstances")).count();
        mutating.push(m as u64);
    }

    // 2a. Terminated instances, the describe interval alone.
    let (boxes_t, running_t) = sessions_running(stack, "bench-terminated", n).await;
    let ec2 = hangar_e2e::ec2::client(&stack.moto.endpoint()).await;
    let mut fault_at = HashMap::new();
    for (name, instance, _) in &running_t {
        ec2.terminate_instances().instance_ids(instance).send().await.unwrap();
        fault_at.insert(name.clone(), Instant::now());
    }
    let terminated = detections(&boxes_t, &fault_at, InterruptionCause::HostLost).await;

    // 2b. The same with the EventBridge queue.
    let sqs = eventbridge::client(&stack.moto.endpoint()).await;
    let queue = eventbridge::create_queue(&sqs, "hangar-bench-interruptions").await;
    let moto = stack.moto.endpoint();
    stack
        .operator()
        .restart_with(&[
            ("HANGAR_DESCRIBE_INTERVAL_MS", "2000"),
            ("HANGAR_WORKER_LOST_SECONDS", &worker_lost.to_string()),
            ("HANGAR_INTERRUPTION_QUEUE_URL", &queue),
            ("HANGAR_SQS_ENDPOINT", &moto),
        ])
        .expect("operator with the queue");
    let (boxes_q, running_q) = sessions_running(stack, "bench-terminated-queue", n).await;
    let mut fault_at = HashMap::new();
    for (name, instance, _) in &running_q {
        ec2.terminate_instances().instance_ids(instance).send().await.unwrap();
        fault_at.insert(name.clone(), Instant::now());
        eventbridge::send_state_change(&sqs, &queue, instance, "shutting-down").await;
    }
    let terminated_queue = detections(&boxes_q, &fault_at, InterruptionCause::HostLost).await;

    println!();
    println!("interruption-bench: {n} sessions per scenario, worker lost after {worker_lost} s of silence");
    let threshold_ms = worker_lost * 1000;
    report("lost worker → interrupted (worker_lost)", lost, "the worker-lost threshold", threshold_ms);
    report(
        "terminated instance → interrupted (host_lost), describe every 2 s",
        terminated,
        "the describe interval",
        2000,
    );
    report(
        "terminated instance → interrupted (host_lost), EventBridge on SQS",
        terminated_queue,
        "the describe interval",
        2000,
    );
    println!(
        "EC2 calls per lost-worker recovery: mutating p50={} max={} (StopInstances + StartInstances); \
         DescribeInstances {:.1} per recovery ({describes} in all, shared by every session and the node simulator)",
        pct(mutating.clone(), 0.5),
        mutating.iter().max().copied().unwrap_or(0),
        describes as f64 / n as f64
    );
}

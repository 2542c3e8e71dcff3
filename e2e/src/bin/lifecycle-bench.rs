//! Lifecycle benchmark (not a test): prints figures, asserts nothing.
//!
//! Over N sessions (default 100) on the local stack: operator overhead
//! apply→RunInstances, node Ready→running, worker-closed→StopInstances
//! (p50/p99), EC2 mutating calls per launch→pause→resume→end,
//! DescribeInstances calls per minute with N live sessions, and operator
//! RSS with M paused sessions (default 1000).
//!
//! Sessions are started, paused, resumed and ended at a steady rate (default
//! 4 per second) so the latencies are per-session overheads; `--burst` does
//! each step for all N at once and shows queueing on this 2-core machine.
//!
//! Each latency is printed with its ratio to a baseline sampled beside it
//! in the same run (`hangar_e2e::bench::baseline`, sampled every
//! `PROBE_EVERY`), over `--runs R` repetitions (default `RUNS`, 5) on fresh
//! namespaces; the tables give medians, and the pooled ratios two
//! invocations are compared on. A p99 rests on its few slowest samples:
//! each run's pauses give 100 samples of their figure and about 250 of
//! its baseline, so both sides need several runs to settle.
//!
//! Run: `make bench` (bench profile), or
//! `cargo run --profile bench -p hangar-e2e --bin lifecycle-bench -- [N] [M] [--burst] [--runs R]`.
//! `make bench` sets `HANGAR_MOTO_FORGET_TERMINATED_AFTER_SECONDS=5`: moto
//! then forgets each run's terminated instances before the next run, as
//! EC2 does an hour after; without it, run R describes R × N of them.

use std::time::{Duration, Instant};

use aws_sdk_ec2::types::{InstanceType, ResourceType, Tag, TagSpecification};
use futures::future::join_all;
use hangar_crds::{Phase, Sandbox};
use hangar_e2e::bench::baseline::{PROBE_EVERY, Probe, us_to_ms};
use hangar_e2e::bench::load::MachineLoad;
use hangar_e2e::bench::rss_kib;
use hangar_e2e::bench::table::{LatencyTable, median};
use hangar_e2e::{ControlPlane, LocalStack, StackOptions};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use hangar_e2e::sessions::{TEST_IMAGE as IMAGE, ensure_namespace};

fn main() {
    hangar_e2e::init_tracing();
    let runs = hangar_e2e::bench::runs_arg(hangar_e2e::bench::RUNS);
    let args = hangar_e2e::bench::numbers_arg();
    let n = args.first().copied().unwrap_or(100);
    let m = args.get(1).copied().unwrap_or(1000);
    let burst = std::env::args().any(|a| a == "--burst");
    let cp = ControlPlane::start().expect("control plane");
    let stack = LocalStack::start(
        cp,
        StackOptions {
            operator_env: hangar_e2e::bench::production_intervals(),
            // The workers' own default, as in production.
            worker_heartbeat_ms: Some(hangar_crds::heartbeat::RENEW_SECONDS * 1000),
            ec2_transitions: None,
            registry_endpoints: vec![],
            operator_ec2_endpoint: None,
        },
    )
    .expect("stack");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(run(&stack, n, m, burst, runs));
}

fn counter(metrics: &str, name: &str) -> u64 {
    hangar_e2e::metrics_text::value(metrics, name).unwrap_or(0.0) as u64
}

fn samples(all: &serde_json::Value, name: &str) -> Vec<u64> {
    all[name].as_array().map(|a| a.iter().filter_map(|v| v.as_u64()).collect()).unwrap_or_default()
}

async fn wait_all(api: &Api<Sandbox>, n: usize, want: Phase, what: &str) -> Duration {
    let start = Instant::now();
    loop {
        let list = api.list(&ListParams::default()).await.unwrap();
        let done = list.items.iter().filter(|s| s.status.as_ref().and_then(|st| st.phase) == Some(want)).count();
        if done >= n {
            return start.elapsed();
        }
        assert!(start.elapsed() < Duration::from_secs(600), "{what}: {done}/{n} after 600 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs `step(i)` for every session: all at once (`burst`) or 4 per second.
async fn each<F, Fut, T>(n: usize, burst: bool, step: F) -> Vec<T>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = T>,
{
    if burst {
        return join_all((0..n).map(step)).await;
    }
    // Each step is one API call, far shorter than the 250 ms period.
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let mut out = Vec::new();
    for i in 0..n {
        tick.tick().await;
        out.push(step(i).await);
    }
    out
}

async fn set_all(api: &Api<Sandbox>, n: usize, state: &str, burst: bool) {
    let patch = json!({"spec": {"state": state}});
    each(n, burst, |i| {
        let patch = patch.clone();
        async move { api.patch(&format!("bench-{i}"), &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap() }
    })
    .await;
}

/// The operator's raw samples of `name` taken after the first `from`.
fn samples_since(all: &serde_json::Value, name: &str, from: usize) -> Vec<f64> {
    samples(all, name).into_iter().skip(from).map(|v| v as f64).collect()
}

async fn run(stack: &LocalStack, n: usize, m: usize, burst: bool, runs: usize) {
    let load = MachineLoad::now();
    load.print("before");
    let client = stack.cp.client().await.unwrap();
    for ns in ["bench-baseline", "bench-paused"] {
        ensure_namespace(&client, ns).await;
    }
    let ec2 = hangar_e2e::ec2::client(&stack.moto.endpoint()).await;
    let probe = Probe::start(client.clone(), ec2, "bench-baseline", PROBE_EVERY).await;
    let before = stack.operator().metrics();

    let mut latencies = LatencyTable::default();
    // The launch pass writes twice before RunInstances (the finalizer on
    // the Sandbox, the session key's Secret); the instance itself is found
    // by tag in the instance watcher's view, with no EC2 call.
    let apply_run = latencies.row("apply → RunInstances", "PATCH + status apply", "p99 < 250 ms");
    let ready_running =
        latencies.row("node Ready → running, incl. the simulated worker's start", "apiserver PATCH", "");
    // The pass that writes `running` ends in a status apply: divided by
    // the same kind of write (the ConfigMap PATCH is a cheaper write, whose
    // tail follows the apiserver's worst moments less closely).
    let event_running = latencies.row("last watch event → running (operator overhead)", "status apply", "p99 < 250 ms");
    // Where that overhead goes: waiting for the pass (behind another pass
    // of the same session, or a requeue) versus the pass's own work.
    let event_pass = latencies.row("  of which: event → its pass starts", "apiserver PATCH", "");
    let pass_running = latencies.row("  of which: pass start → running written", "status apply", "");
    // The worker's Lease write reaching the operator's watch, then a pass
    // up to the call: divided by a write reaching a watch.
    let closed_stop = latencies.row("worker closed → StopInstances", "status apply → watched", "p99 < 250 ms");
    let mut walls = Vec::new();
    let mut describes_per_minute = 0;
    for run in 0..runs {
        let ns = format!("bench-r{run}");
        ensure_namespace(&client, &ns).await;
        let api: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
        // Each figure is divided by the round trips sampled while its own
        // samples were taken (the launches, the pauses, the resumes), not
        // over the whole run: the load differs from step to step.
        let launch_from = probe.snapshot();
        let raw_from = stack.operator().samples();
        let from = |name| samples(&raw_from, name).len();
        let (ready_from, event_from, closed_from) =
            (from("node_ready_to_running_ms"), from("event_to_running_ms"), from("workspace_closed_to_stop_ms"));
        let (event_pass_from, pass_running_from) = (from("event_to_pass_ms"), from("pass_to_running_ms"));

        eprintln!("bench: run {}/{runs}: creating {n} sessions", run + 1);
        let created_at: Vec<(String, i64)> = each(n, burst, |i| {
            let s: Sandbox = serde_json::from_value(json!({
                "apiVersion": "hangar.dev/v1alpha1", "kind": "Sandbox",
                "metadata": {"name": format!("bench-{i}")}, "spec": {"mode": "commands", "image": IMAGE},
            }))
            .unwrap();
            let (api, ns) = (api.clone(), ns.clone());
            async move {
                api.create(&PostParams::default(), &s).await.unwrap();
                (format!("{ns}/bench-{i}"), now_ms())
            }
        })
        .await;
        let t_launch = wait_all(&api, n, Phase::Running, "launch").await;
        let launching = probe.snapshot().since(&launch_from);

        if run == 0 {
            eprintln!("bench: {n} running; counting DescribeInstances for 60 s");
            let d0 = counter(&stack.operator().metrics(), "hangar_ec2_describe_instances_calls_total");
            tokio::time::sleep(Duration::from_secs(60)).await;
            describes_per_minute =
                counter(&stack.operator().metrics(), "hangar_ec2_describe_instances_calls_total") - d0;
        }

        eprintln!("bench: run {}/{runs}: pause, resume, end", run + 1);
        let pause_from = probe.snapshot();
        set_all(&api, n, "Paused", burst).await;
        let t_pause = wait_all(&api, n, Phase::Paused, "pause").await;
        let resume_from = probe.snapshot();
        let pausing = resume_from.since(&pause_from);
        set_all(&api, n, "Running", burst).await;
        let t_resume = wait_all(&api, n, Phase::Running, "resume").await;
        let resuming = probe.snapshot().since(&resume_from);
        set_all(&api, n, "Ended", burst).await;
        let t_end = wait_all(&api, n, Phase::Ended, "end").await;
        walls.push([t_launch, t_pause, t_resume, t_end].map(|d| d.as_secs_f64()));

        let raw = stack.operator().samples();
        // `running` is written at the launches and the resumes.
        let to_running = launching.clone().and(&resuming);
        let patch = us_to_ms(&to_running.apiserver_patch_us);
        let apply = us_to_ms(&to_running.status_apply_us);
        // Create call returned (apiserver accepted it) → RunInstances called.
        let applied: Vec<f64> = created_at
            .iter()
            .filter_map(|(name, t)| Some((raw["run_instances_at_ms"][name.as_str()].as_i64()? - t).max(0) as f64))
            .collect();
        latencies.add(apply_run, &applied, &us_to_ms(&launching.patch_then_apply_us()));
        latencies.add(ready_running, &samples_since(&raw, "node_ready_to_running_ms", ready_from), &patch);
        latencies.add(event_running, &samples_since(&raw, "event_to_running_ms", event_from), &apply);
        latencies.add(event_pass, &samples_since(&raw, "event_to_pass_ms", event_pass_from), &patch);
        latencies.add(pass_running, &samples_since(&raw, "pass_to_running_ms", pass_running_from), &apply);
        let watched = us_to_ms(&pausing.write_to_watch_us);
        latencies.add(closed_stop, &samples_since(&raw, "workspace_closed_to_stop_ms", closed_from), &watched);
    }
    let base_all = probe.finish().await;

    let after = stack.operator().metrics();
    let during = |name: &str| counter(&after, name) - counter(&before, name);
    let mutating = during("hangar_ec2_mutating_calls_total");
    let other_describes = during("hangar_ec2_describe_other_calls_total");
    let (stale, conflicts, failed, passes) = (
        during("hangar_acted_on_written_copy_total"),
        during("hangar_status_conflicts_total"),
        during("hangar_reconcile_errors_total"),
        during("hangar_reconciles_total"),
    );

    eprintln!("bench: {m} paused sessions for the memory figure");
    let rss_before = rss_kib(stack.operator().pid().unwrap());
    // Made while the operator is down, then loaded by a fresh start: the
    // figure is the operator holding M paused sessions, as after a restart.
    stack.operator().kill();
    paused_sessions(stack, &client, m).await;
    stack.operator().restart().expect("operator restart");
    let start = Instant::now();
    while counter(&stack.operator().metrics(), "hangar_reconciles_total") < m as u64
        && start.elapsed() < Duration::from_secs(300)
    {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let reconciled = counter(&stack.operator().metrics(), "hangar_reconciles_total");
    let watched = counter(&stack.operator().metrics(), "hangar_watched_instances");
    let rss_paused = rss_kib(stack.operator().pid().unwrap());
    let mutating_paused = counter(&stack.operator().metrics(), "hangar_ec2_mutating_calls_total");

    println!();
    let pacing = if burst { "all at once" } else { "4 per second" };
    println!(
        "hangar lifecycle benchmark: {n} sessions (commands mode, each step {pacing}), {runs} runs, local stack, release build"
    );
    println!(
        "baselines, sampled every {} ms beside the whole benchmark (each figure is divided by those sampled during its own step): {}",
        PROBE_EVERY.as_millis(),
        base_all.summary()
    );
    println!();
    latencies.print();
    println!();
    println!("| figure | value | target |");
    println!("| --- | --- | --- |");
    println!("| EC2 mutating calls per launch→pause→resume→end | {:.2} | ≤ 8 |", mutating as f64 / (n * runs) as f64);
    println!(
        "| EC2 Describe calls other than DescribeInstances (volumes) per launch→pause→resume→end | {:.2} | |",
        other_describes as f64 / (n * runs) as f64
    );
    println!(
        "| passes during the runs: all / on the operator's written copy (the watch not there yet) / status write refused as stale / failed | {passes} / {stale} / {conflicts} / {failed} | |"
    );
    println!("| DescribeInstances calls per minute, {n} live sessions | {describes_per_minute} | independent of N |");
    println!("| operator RSS, idle after the runs (MiB) | {:.1} | |", rss_before as f64 / 1024.0);
    println!(
        "| operator RSS with {m} paused sessions (MiB; {reconciled} reconciles, {watched} instances watched, {mutating_paused} EC2 calls made) | {:.1} | |",
        rss_paused as f64 / 1024.0
    );
    let wall = |k: usize| median(&walls.iter().map(|w| w[k]).collect::<Vec<_>>());
    println!(
        "| wall time: launch / pause / resume / end of all {n} (s, median of runs) | {:.1} / {:.1} / {:.1} / {:.1} | |",
        wall(0),
        wall(1),
        wall(2),
        wall(3)
    );
    println!();
    hangar_e2e::bench::load::print_after(&load);
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

/// `m` sessions that are paused: a stopped, tagged instance in EC2 and a
/// Sandbox whose status says paused, as the operator itself leaves them.
/// (Driving 1,000 sessions through a real launch would need 1,000 worker
/// processes on 2 cores; the operator's memory depends on what it caches,
/// not on how the sessions got there.)
async fn paused_sessions(stack: &LocalStack, client: &kube::Client, m: usize) {
    let ec2 = hangar_e2e::ec2::client(&stack.moto.endpoint()).await;
    let api: Api<Sandbox> = Api::namespaced(client.clone(), "bench-paused");
    for chunk in (0..m).collect::<Vec<_>>().chunks(50) {
        join_all(chunk.iter().map(|i| {
            let (api, ec2) = (api.clone(), ec2.clone());
            async move {
                let name = format!("paused-{i}");
                let s: Sandbox = serde_json::from_value(json!({
                    "apiVersion": "hangar.dev/v1alpha1", "kind": "Sandbox",
                    "metadata": {"name": name, "finalizers": ["hangar.dev/session"]},
                    "spec": {"mode": "commands", "image": IMAGE, "state": "Paused"},
                }))
                .unwrap();
                let created = api.create(&PostParams::default(), &s).await.unwrap();
                let uid = created.metadata.uid.clone().unwrap();
                let tag = |k: &str, v: &str| Tag::builder().key(k).value(v).build();
                let out = ec2
                    .run_instances()
                    .image_id("ami-0a1b2c3d4e5f60718")
                    .instance_type(InstanceType::M7gLarge)
                    .min_count(1)
                    .max_count(1)
                    .tag_specifications(
                        TagSpecification::builder()
                            .resource_type(ResourceType::Instance)
                            .tags(tag("hangar.dev/session-id", &uid))
                            .tags(tag("hangar.dev/cluster", "hangar-local"))
                            .tags(tag("hangar.dev/namespace", "bench-paused"))
                            .tags(tag("hangar.dev/sandbox", &name))
                            .build(),
                    )
                    .send()
                    .await
                    .unwrap();
                let id = out.instances()[0].instance_id().unwrap().to_owned();
                ec2.stop_instances().instance_ids(&id).send().await.unwrap();
                let status = json!({"apiVersion": "hangar.dev/v1alpha1", "kind": "Sandbox", "status": {
                    "sessionId": uid, "phase": "paused", "attempt": 1, "instanceId": id,
                    "instanceType": "m7g.large", "zone": "ap-southeast-2a", "volumeAttached": true,
                    "attempts": [{"number": 1, "cause": "launch", "end": "paused", "computeSeconds": 60}],
                }});
                api.patch_status(&name, &PatchParams::apply("hangar-operator").force(), &Patch::Apply(&status))
                    .await
                    .unwrap();
            }
        }))
        .await;
    }
}

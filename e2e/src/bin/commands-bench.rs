//! Commands benchmark on the local stack (release build; `make bench`):
//!
//! 1. Command create → process start: each command is `date +%s%N`, so its
//!    own output says when its process started; the create call's start is
//!    taken just before it. Paced (10 per second) and in bursts of 16.
//! 2. Output throughput: one command writes 1 GiB (`head -c 1G /dev/zero`);
//!    stored = create → exited with every byte stored; readable = reading
//!    all of it back through the gateway (8 MiB pages, JSON + base64).
//! 3. Long-poll wake latency: a command prints its clock every 100 ms; a
//!    client long-polls past the last offset; latency = arrival − the time
//!    the line says it was written.
//! 4. RSS of the worker, the supervisor and the gateway, sampled every
//!    50 ms while the 1 GiB streams and while it is read back.
//!
//! Each figure is printed with its ratio to a baseline measured in the
//! same run: an apiserver PATCH and a status apply until a watch shows it
//! (sampled beside the run; the paced commands divided by the samples
//! taken while they ran, the bursts by theirs); the gateway's listing
//! interval plus an output store round trip and the gateway's plain
//! output GET (sampled among the wakes); a local disk write and read of
//! 1 GiB. Over `--runs R` (default `hangar_e2e::bench::RUNS`, 5), as
//! medians and pooled over the runs.
//!
//! `commands-bench [N] [--runs R]`: N paced commands for figure 1 (default
//! 240, on a session of their own; the bursts fill another).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use base64::Engine;
use hangar_crds::command::MAX_PER_SESSION;
use hangar_crds::{Command, CommandPhase, Phase, Sandbox};
use hangar_e2e::bench::baseline::{PROBE_EVERY, Probe, disk_write_read_mbps, us_to_ms};
use hangar_e2e::bench::load::MachineLoad;
use hangar_e2e::bench::table::{LatencyTable, ThroughputTable};
use hangar_e2e::bench::{now_ns, rss_kib};
use hangar_e2e::commands::{self as cmds, command, sh, wait_command_phase};
use hangar_e2e::gateway::member_token;
use hangar_e2e::sessions::{self, ensure_namespace, wait_phase};
use hangar_e2e::{ControlPlane, LocalStack, StackOptions};
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use serde_json::json;

const NS: &str = "bench";

fn main() {
    hangar_e2e::init_tracing();
    // As many as one session takes, less a few.
    let n: usize = hangar_e2e::bench::numbers_arg().first().copied().unwrap_or(MAX_PER_SESSION as usize - 7);
    let runs = hangar_e2e::bench::runs_arg(hangar_e2e::bench::RUNS);
    let cp = ControlPlane::start().expect("control plane");
    let opts = StackOptions { operator_env: hangar_e2e::bench::production_intervals(), ..Default::default() };
    let stack = LocalStack::start(cp, opts).expect("stack");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(run(&stack, n, runs));
}

async fn run(stack: &LocalStack, n: usize, runs: usize) {
    let load = MachineLoad::now();
    load.print("before");
    let client = stack.cp.client().await.unwrap();
    ensure_namespace(&client, NS).await;
    let ec2 = hangar_e2e::ec2::client(&stack.moto.endpoint()).await;
    let probe = Probe::start(client.clone(), ec2, NS, PROBE_EVERY).await;
    let boxes: Api<Sandbox> = Api::namespaced(client.clone(), NS);
    let api: Api<Command> = Api::namespaced(client.clone(), NS);
    let gw = stack.gateway_client();
    let member = member_token(&stack.cp, NS, "bench", "get,list,create,patch");
    let names = ["worker", "supervisor", "gateway"];
    let mut peaks = [0u64; 3];

    let mut latencies = LatencyTable::default();
    // A command's way to its process: its create (through the admission
    // webhook), the operator's numbering write reaching the worker (the
    // operator's watch, then its feed), the worker's compare-and-swap to
    // `running`. Divided by the least of that: two writes, the second
    // until a watch shows it.
    const PATH: &str = "PATCH + status apply → watched";
    let paced_row = latencies.row("Command create → process start, paced 10/s", PATH, "p99 < 300 ms");
    let burst_row = latencies.row("Command create → process start, bursts of 16", PATH, "");
    // The gateway's follower lists the store every FOLLOW_EVERY (20 ms):
    // a wake waits for that listing, a constant of the design, then reads.
    // Divided by that wait and the reads (the store's p99 alone is a few
    // milliseconds, and the wake's 20 ms on top of it made the ratio
    // follow that p99's noise).
    let wake_row = latencies.row(
        "long-poll wake after new bytes",
        "follower's listing interval + store PUT + LIST + GET + gateway GET",
        "p99 < 100 ms",
    );
    let mut throughputs = ThroughputTable::default();
    let stored_row =
        throughputs.row("1 GiB output, create → exited with all stored", "disk write + fsync", "≥ 100 MB/s");
    let read_row = throughputs.row("1 GiB output, read back through the gateway", "disk read", "≥ 100 MB/s");
    const GIB: u64 = 1 << 30;
    for run in 0..runs {
        eprintln!("bench: run {}/{runs}", run + 1);
        // Two sessions per run, as one takes a bounded number of commands:
        // the paced commands on one, everything else on the other.
        let (name, paced_name) = (format!("box-{run}"), format!("paced-{run}"));
        for b in [&name, &paced_name] {
            boxes.create(&PostParams::default(), &sessions::sandbox(b, "commands", json!({}))).await.unwrap();
        }
        let paced_sid = wait_phase(stack, &boxes, &paced_name, Phase::Running).await.uid().unwrap();
        let s = wait_phase(stack, &boxes, &name, Phase::Running).await;
        let sid = s.uid().unwrap();
        let node = s.status.as_ref().unwrap().instance_id.clone().unwrap();
        let memory = sample_memory([
            stack.sim.pid(&node, "worker").unwrap() as u32,
            stack.sim.pid(&node, "supervisor").unwrap() as u32,
            stack.gateway.pid(),
        ]);
        // 1. create → process start, each kind divided by the round trips
        // sampled while it ran: the bursts load the machine in a way the
        // paced commands do not.
        let (key, paced_key) =
            (cmds::output_keys(&client, &sid, 1).await, cmds::output_keys(&client, &paced_sid, 1).await);
        let paced_from = probe.snapshot();
        let every = Some(Duration::from_millis(100));
        let paced =
            start_latency(stack, &api, (&paced_sid, &paced_name), &paced_key, &format!("r{run}-p"), n, every).await;
        let bursts_from = probe.snapshot();
        // As many bursts as the session's command limit leaves room for
        // (beside the 1 GiB one and the ticking one): a p99 of bursts
        // rests on few samples otherwise.
        let mut burst = Vec::new();
        let bursts = (MAX_PER_SESSION as usize).saturating_sub(2) / 16;
        for b in 0..bursts.max(1) {
            burst.extend(start_latency(stack, &api, (&sid, &name), &key, &format!("r{run}-b{b}-"), 16, None).await);
        }
        let (during_paced, during_bursts) = (bursts_from.since(&paced_from), probe.snapshot().since(&bursts_from));
        latencies.add(paced_row, &as_f64(&paced), &us_to_ms(&during_paced.patch_then_watched_us()));
        latencies.add(burst_row, &as_f64(&burst), &us_to_ms(&during_bursts.patch_then_watched_us()));

        // 2. 1 GiB through the pipeline, then the disk doing the same.
        let gib = format!("gib-{run}");
        let started = Instant::now();
        cmds::create(&api, &command(&gib, &name, &["head", "-c", "1073741824", "/dev/zero"], json!({}))).await;
        let done = wait_command_phase(stack, &api, &gib, CommandPhase::Exited).await;
        let stored_s = started.elapsed().as_secs_f64();
        let stored_bytes = done.status.as_ref().and_then(|s| s.output_bytes).unwrap_or(0) as u64;
        assert_eq!(stored_bytes, GIB, "every byte stored");
        let started = Instant::now();
        let mut next = 0u64;
        let b64 = base64::engine::general_purpose::STANDARD;
        while next < GIB {
            let (st, page) = gw.get(&format!("/v1/sandboxes/{sid}/commands/{gib}/output?after={next}"), &member).await;
            assert_eq!(st, 200, "{page}");
            for c in page["chunks"].as_array().unwrap() {
                let data = b64.decode(c["data"].as_str().unwrap()).unwrap();
                assert!(data.iter().all(|b| *b == 0), "the bytes written");
                assert_eq!(c["offset"].as_u64().unwrap(), next, "continuous");
                next += data.len() as u64;
            }
        }
        let read_s = started.elapsed().as_secs_f64();
        let (disk_write, disk_read) = disk_write_read_mbps(GIB);
        throughputs.add(stored_row, GIB as f64 / 1e6 / stored_s, disk_write);
        throughputs.add(read_row, GIB as f64 / 1e6 / read_s, disk_read);

        // 3. long-poll wake latency, and the gateway's plain round trip.
        let (store, done, finished) = (stack.output_store(), AtomicBool::new(false), format!("r{run}-p000"));
        let (wake, floor) = futures::join!(
            async {
                let wake = wake_latency(&gw, &member, &api, stack, (&sid, &name), &format!("ticks-{run}")).await;
                done.store(true, Ordering::Relaxed);
                wake
            },
            wake_floor(&gw, &member, &store, (&paced_sid, &finished), &done),
        );
        latencies.add(wake_row, &as_f64(&wake), &floor);
        for (peak, run_peak) in peaks.iter_mut().zip(memory.finish().await) {
            *peak = (*peak).max(run_peak);
        }
    }
    let base_all = probe.finish().await;

    let mib = |kib: u64| kib as f64 / 1024.0;
    println!();
    println!("hangar commands benchmark: one session, {runs} runs, local stack, release build");
    println!(
        "baselines, sampled every {} ms beside the whole benchmark: {}",
        PROBE_EVERY.as_millis(),
        base_all.summary()
    );
    println!();
    latencies.print();
    println!();
    throughputs.print();
    println!();
    println!("| figure | value | target |");
    println!("| --- | --- | --- |");
    for (name, peak) in names.iter().zip(peaks) {
        let target = match *name {
            "worker" => "< 64",
            "gateway" => "< 128",
            _ => "",
        };
        println!("| {name} peak RSS over the runs, streaming and reading 1 GiB (MiB) | {:.1} | {target} |", mib(peak));
    }
    println!();
    hangar_e2e::bench::load::print_after(&load);
}

/// Peak RSS (KiB) of some processes, sampled every 50 ms until `finish`.
struct MemorySampler {
    sampling: Arc<AtomicBool>,
    peaks: Arc<Vec<AtomicU64>>,
    task: tokio::task::JoinHandle<()>,
}

fn sample_memory(pids: [u32; 3]) -> MemorySampler {
    let sampling = Arc::new(AtomicBool::new(true));
    let peaks: Arc<Vec<AtomicU64>> = Arc::new(pids.iter().map(|_| AtomicU64::new(0)).collect());
    let task = tokio::spawn({
        let (sampling, peaks) = (sampling.clone(), peaks.clone());
        async move {
            while sampling.load(Ordering::Relaxed) {
                for (peak, pid) in peaks.iter().zip(pids) {
                    peak.fetch_max(rss_kib(pid), Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });
    MemorySampler { sampling, peaks, task }
}

impl MemorySampler {
    async fn finish(self) -> [u64; 3] {
        self.sampling.store(false, Ordering::Relaxed);
        let _ = self.task.await;
        [0, 1, 2].map(|i| self.peaks[i].load(Ordering::Relaxed))
    }
}

fn as_f64(v: &[u64]) -> Vec<f64> {
    v.iter().map(|x| *x as f64).collect()
}

/// Long-poll wakes per run (one every 100 ms), and about as many round
/// trips for their baseline. The wake's p99 is the poll's 20 ms plus
/// whatever the machine's slowest moments add; at 200 a run, two
/// invocations' pooled p99 ratios were 31% apart.
const WAKES: usize = 400;

/// What a wake through a polled store takes at its slowest when nothing
/// queues: the follower's full listing interval (`FOLLOW_EVERY`, a
/// constant of the design) plus one pass of the reads, sampled every
/// 100 ms while the wakes are measured (the same moments, the same load:
/// the ticking command streaming, the gateway following it) until `done`.
/// A pass: a small object put in the output store, its prefix listed and
/// the object read (the worker's and the follower's part of a wake), then
/// an authenticated GET of a finished command's output through the
/// gateway (the least any output response takes). In ms. (Sampled back
/// to back after the wakes, the store's round trips took a fraction of a
/// second, so their p99 was whatever that instant held.)
async fn wake_floor(
    gw: &hangar_e2e::gateway::GatewayClient,
    member: &str,
    store: &hangar_output::OutputStore,
    (sid, cid): (&str, &str),
    done: &AtomicBool,
) -> Vec<f64> {
    let mut out = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !done.load(Ordering::Relaxed) {
        tick.tick().await;
        let session = format!("bench-baseline-{cid}-{}", out.len());
        let t = Instant::now();
        store.put_certificate(&session, vec![0u8; 64]).await.expect("put");
        store.stored_end(&session, 1).await.expect("list");
        assert!(store.certificate(&session).await.expect("get").is_some(), "read back");
        // Long-polls and these GETs together stay under the gateway's
        // per-caller limit (50 a second).
        let (st, page) = gw.get(&format!("/v1/sandboxes/{sid}/commands/{cid}/output?after=0"), member).await;
        out.push((t.elapsed() + hangar_gateway::output::FOLLOW_EVERY).as_secs_f64() * 1000.0);
        assert_eq!(st, 200, "{page}");
        assert_eq!(page["final"], true, "a finished command's page answers at once");
    }
    out
}

/// Creates `n` `date +%s%N` commands (paced by `every`, or all at once) and
/// returns create-call → process-start in ms.
async fn start_latency(
    stack: &LocalStack,
    api: &Api<Command>,
    (sid, sandbox): (&str, &str),
    keys: &std::collections::HashMap<u32, [u8; 32]>,
    prefix: &str,
    n: usize,
    every: Option<Duration>,
) -> Vec<u64> {
    let mut sent = Vec::new();
    let mut creates = Vec::new();
    for i in 0..n {
        let name = format!("{prefix}{i:03}");
        let c = command(&name, sandbox, &["date", "+%s%N"], json!({}));
        let api = api.clone();
        creates.push(tokio::spawn(async move {
            let t0 = now_ns();
            cmds::create(&api, &c).await;
            (name, t0)
        }));
        if let Some(d) = every {
            tokio::time::sleep(d).await;
        }
    }
    for c in creates {
        sent.push(c.await.unwrap());
    }
    let mut out = Vec::new();
    for (name, t0) in sent {
        let c = wait_command_phase(stack, api, &name, CommandPhase::Exited).await;
        let number = c.status.as_ref().and_then(|s| s.number).unwrap() as u32;
        let text = cmds::concat(&cmds::read_output(stack, keys, sid, number, 0).await);
        let started: i128 = String::from_utf8_lossy(&text).trim().parse().expect("date +%s%N");
        out.push(((started - t0) / 1_000_000).max(0) as u64);
    }
    out
}

/// A command printing its clock every 100 ms; long-poll past each line.
async fn wake_latency(
    gw: &hangar_e2e::gateway::GatewayClient,
    member: &str,
    api: &Api<Command>,
    stack: &LocalStack,
    (sid, sandbox): (&str, &str),
    name: &str,
) -> Vec<u64> {
    let script = format!("i=0; while [ $i -lt {WAKES} ]; do date +%s%N; sleep 0.1; i=$((i+1)); done");
    cmds::create(api, &sh(name, sandbox, &script)).await;
    wait_command_phase(stack, api, name, CommandPhase::Running).await;
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut next = 0u64;
    let mut out = Vec::new();
    loop {
        let (_, page) = gw.get(&format!("/v1/sandboxes/{sid}/commands/{name}/output?after={next}"), member).await;
        let arrived = now_ns();
        let mut first = true;
        for c in page["chunks"].as_array().unwrap() {
            let data = b64.decode(c["data"].as_str().unwrap()).unwrap();
            next = c["offset"].as_u64().unwrap() + data.len() as u64;
            // The first line in a response is the one that woke it.
            if let Some(line) = String::from_utf8_lossy(&data).lines().next().filter(|_| first) {
                if let Ok(written) = line.trim().parse::<i128>() {
                    out.push(((arrived - written) / 1_000_000).max(0) as u64);
                }
                first = false;
            }
        }
        if page["final"] == true {
            return out;
        }
    }
}

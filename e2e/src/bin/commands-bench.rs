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
//! same run: the apiserver PATCH round trip (sampled beside the run), the
//! gateway's plain output GET, a local disk write and read of 1 GiB; over
//! `--runs R` (default 3), as medians.
//!
//! `commands-bench [N] [--runs R]`: N commands for figure 1 (default 100).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use base64::Engine;
use hangar_crds::command::MAX_PER_SESSION;
use hangar_crds::{Command, CommandPhase, Phase, Sandbox};
use hangar_e2e::bench::baseline::{Probe, disk_write_read_mbps, us_to_ms};
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
    let n: usize = hangar_e2e::bench::numbers_arg().first().copied().unwrap_or(100);
    let runs = hangar_e2e::bench::runs_arg(3);
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
    let probe = Probe::start(client.clone(), ec2, NS, Duration::from_millis(200)).await;
    let boxes: Api<Sandbox> = Api::namespaced(client.clone(), NS);
    let api: Api<Command> = Api::namespaced(client.clone(), NS);
    let gw = stack.gateway_client();
    let member = member_token(&stack.cp, NS, "bench", "get,list,create,patch");
    let names = ["worker", "supervisor", "gateway"];
    let mut peaks = [0u64; 3];

    let mut latencies = LatencyTable::default();
    let paced_row = latencies.row("Command create → process start, paced 10/s", "apiserver PATCH", "p99 < 300 ms");
    let burst_row = latencies.row("Command create → process start, bursts of 16", "apiserver PATCH", "");
    let wake_row =
        latencies.row("long-poll wake after new bytes", "store PUT + LIST + GET, then gateway GET", "p99 < 100 ms");
    let mut throughputs = ThroughputTable::default();
    let stored_row =
        throughputs.row("1 GiB output, create → exited with all stored", "disk write + fsync", "≥ 100 MB/s");
    let read_row = throughputs.row("1 GiB output, read back through the gateway", "disk read", "≥ 100 MB/s");
    const GIB: u64 = 1 << 30;
    for run in 0..runs {
        eprintln!("bench: run {}/{runs}", run + 1);
        // A session per run: one takes a bounded number of commands.
        let name = format!("box-{run}");
        boxes.create(&PostParams::default(), &sessions::sandbox(&name, "commands", json!({}))).await.unwrap();
        let s = wait_phase(stack, &boxes, &name, Phase::Running).await;
        let sid = s.uid().unwrap();
        let node = s.status.as_ref().unwrap().instance_id.clone().unwrap();
        let memory = sample_memory([
            stack.sim.pid(&node, "worker").unwrap() as u32,
            stack.sim.pid(&node, "supervisor").unwrap() as u32,
            stack.gateway.pid(),
        ]);
        let base_from = probe.snapshot();
        // 1. create → process start.
        let key = cmds::output_keys(&client, &sid, 1).await;
        let paced =
            start_latency(stack, &api, (&sid, &name), &key, &format!("r{run}-p"), n, Some(Duration::from_millis(100)))
                .await;
        // As many bursts as the session's command limit leaves room for
        // (beside the paced ones, the 1 GiB one and the ticking one): a
        // p99 of bursts rests on few samples otherwise.
        let mut burst = Vec::new();
        let bursts = (MAX_PER_SESSION as usize).saturating_sub(n + 2) / 16;
        for b in 0..bursts.max(1) {
            burst.extend(start_latency(stack, &api, (&sid, &name), &key, &format!("r{run}-b{b}-"), 16, None).await);
        }
        let patch = us_to_ms(&probe.snapshot().since(&base_from).apiserver_patch_us);
        latencies.add(paced_row, &as_f64(&paced), &patch);
        latencies.add(burst_row, &as_f64(&burst), &patch);

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
        let wake = wake_latency(&gw, &member, &api, stack, (&sid, &name), &format!("ticks-{run}")).await;
        let get = gateway_round_trips(&gw, &member, &sid, &format!("r{run}-p000")).await;
        let store = store_round_trips(&stack.output_store()).await;
        let floor: Vec<f64> = store.iter().zip(&get).map(|(s, g)| s + g).collect();
        latencies.add(wake_row, &as_f64(&wake), &floor);
        for (peak, run_peak) in peaks.iter_mut().zip(memory.finish().await) {
            *peak = (*peak).max(run_peak);
        }
    }
    let base_all = probe.finish().await;

    let mib = |kib: u64| kib as f64 / 1024.0;
    println!();
    println!("hangar commands benchmark: one session, {runs} runs, local stack, release build");
    println!("baselines, sampled every 200 ms beside the whole benchmark: {}", base_all.summary());
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

/// Long-poll wakes per run, and as many round trips for their floor: the
/// p99 of each then rests on two samples a run, not one.
const WAKES: usize = 200;

/// Authenticated GETs of a finished command's output through the
/// gateway (ms): the least any output response takes, long-poll or not.
async fn gateway_round_trips(gw: &hangar_e2e::gateway::GatewayClient, member: &str, sid: &str, cid: &str) -> Vec<f64> {
    let mut out = Vec::new();
    for _ in 0..WAKES {
        // Under the gateway's per-caller limit (50 a second).
        tokio::time::sleep(Duration::from_millis(25)).await;
        let t = Instant::now();
        let (st, page) = gw.get(&format!("/v1/sandboxes/{sid}/commands/{cid}/output?after=0"), member).await;
        out.push(t.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(st, 200, "{page}");
        assert_eq!(page["final"], true, "a finished command's page answers at once");
    }
    out
}

/// Round trips through the output store the worker and the gateway
/// use (ms): a small object put, the prefix listed, the object read. The
/// least any wake through the store takes, before the gateway's part.
async fn store_round_trips(store: &hangar_output::OutputStore) -> Vec<f64> {
    let mut out = Vec::new();
    for i in 0..WAKES {
        let session = format!("bench-baseline-{i}");
        let t = Instant::now();
        store.put_certificate(&session, vec![0u8; 64]).await.expect("put");
        store.stored_end(&session, 1).await.expect("list");
        assert!(store.certificate(&session).await.expect("get").is_some(), "read back");
        out.push(t.elapsed().as_secs_f64() * 1000.0);
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

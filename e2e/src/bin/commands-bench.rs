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
//! `commands-bench [N]`: N commands for figure 1 (default 100).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use base64::Engine;
use hangar_crds::{Command, CommandPhase, Phase, Sandbox};
use hangar_e2e::bench::{now_ns, pct, rss_kib};
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
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(100);
    let cp = ControlPlane::start().expect("control plane");
    let opts = StackOptions { operator_env: hangar_e2e::bench::production_intervals(), ..Default::default() };
    let stack = LocalStack::start(cp, opts).expect("stack");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(run(&stack, n));
}

async fn run(stack: &LocalStack, n: usize) {
    let client = stack.cp.client().await.unwrap();
    ensure_namespace(&client, NS).await;
    let boxes: Api<Sandbox> = Api::namespaced(client.clone(), NS);
    boxes.create(&PostParams::default(), &sessions::sandbox("box", "commands", json!({}))).await.unwrap();
    let s = wait_phase(stack, &boxes, "box", Phase::Running).await;
    let sid = s.uid().unwrap();
    let node = s.status.as_ref().unwrap().instance_id.clone().unwrap();
    let api: Api<Command> = Api::namespaced(client.clone(), NS);
    let keys = |attempt| cmds::output_keys(&client, &sid, attempt);

    // 1. create → process start.
    let paced = start_latency(stack, &api, &sid, &keys(1).await, "p", n, Some(Duration::from_millis(100))).await;
    let mut burst = Vec::new();
    for b in 0..(n / 16).max(1) {
        burst.extend(start_latency(stack, &api, &sid, &keys(1).await, &format!("b{b}-"), 16, None).await);
    }

    // 2 + 4. 1 GiB through the pipeline, memory sampled meanwhile.
    let gw = stack.gateway_client();
    let member = member_token(&stack.cp, NS, "bench", "get,list,create,patch");
    let pids = [
        ("worker", stack.sim.pid(&node, "worker").unwrap() as u32),
        ("supervisor", stack.sim.pid(&node, "supervisor").unwrap() as u32),
        ("gateway", stack.gateway.pid()),
    ];
    let sampling = Arc::new(AtomicBool::new(true));
    let peaks: Arc<Vec<AtomicU64>> = Arc::new(pids.iter().map(|_| AtomicU64::new(0)).collect());
    let sampler = {
        let (sampling, peaks) = (sampling.clone(), peaks.clone());
        tokio::spawn(async move {
            while sampling.load(Ordering::Relaxed) {
                for (i, (_, pid)) in pids.iter().enumerate() {
                    peaks[i].fetch_max(rss_kib(*pid), Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    const GIB: u64 = 1 << 30;
    let started = Instant::now();
    cmds::create(&api, &command("gib", "box", &["head", "-c", "1073741824", "/dev/zero"], json!({}))).await;
    let done = wait_command_phase(stack, &api, "gib", CommandPhase::Exited).await;
    let stored_s = started.elapsed().as_secs_f64();
    let stored_bytes = done.status.as_ref().and_then(|s| s.output_bytes).unwrap_or(0) as u64;
    assert_eq!(stored_bytes, GIB, "every byte stored");
    let started = Instant::now();
    let mut next = 0u64;
    let mut pages = 0;
    let b64 = base64::engine::general_purpose::STANDARD;
    while next < GIB {
        let (st, page) = gw.get(&format!("/v1/sandboxes/{sid}/commands/gib/output?after={next}"), &member).await;
        assert_eq!(st, 200, "{page}");
        for c in page["chunks"].as_array().unwrap() {
            let data = b64.decode(c["data"].as_str().unwrap()).unwrap();
            assert!(data.iter().all(|b| *b == 0), "the bytes written");
            assert_eq!(c["offset"].as_u64().unwrap(), next, "continuous");
            next += data.len() as u64;
        }
        pages += 1;
    }
    let read_s = started.elapsed().as_secs_f64();
    sampling.store(false, Ordering::Relaxed);
    let _ = sampler.await;

    // 3. long-poll wake latency.
    let wake = wake_latency(&gw, &member, &api, stack, &sid).await;

    let mib = |kib: u64| kib as f64 / 1024.0;
    println!();
    println!("hangar commands benchmark: one session, local stack, 2 cores, release build");
    println!();
    println!("| figure | p50 | p99 | samples | target |");
    println!("| --- | --- | --- | --- | --- |");
    println!(
        "| Command create → process start, paced 10/s (ms) | {} | {} | {} | p99 < 300 |",
        pct(paced.clone(), 0.5),
        pct(paced.clone(), 0.99),
        paced.len()
    );
    println!(
        "| Command create → process start, bursts of 16 (ms) | {} | {} | {} | |",
        pct(burst.clone(), 0.5),
        pct(burst.clone(), 0.99),
        burst.len()
    );
    println!(
        "| long-poll wake after new bytes (ms) | {} | {} | {} | p99 < 100 |",
        pct(wake.clone(), 0.5),
        pct(wake.clone(), 0.99),
        wake.len()
    );
    println!();
    println!("| figure | value | target |");
    println!("| --- | --- | --- |");
    println!(
        "| 1 GiB output, create → exited with all stored (MB/s) | {:.0} ({stored_s:.1} s) | ≥ 100 |",
        GIB as f64 / 1e6 / stored_s
    );
    println!(
        "| 1 GiB output, read back through the gateway (MB/s) | {:.0} ({read_s:.1} s, {pages} pages) | ≥ 100 |",
        GIB as f64 / 1e6 / read_s
    );
    for (i, (name, _)) in pids.iter().enumerate() {
        let target = if *name == "worker" { "< 64" } else { "" };
        println!(
            "| {name} peak RSS while streaming and reading (MiB) | {:.1} | {target} |",
            mib(peaks[i].load(Ordering::Relaxed))
        );
    }
}

/// Creates `n` `date +%s%N` commands (paced by `every`, or all at once) and
/// returns create-call → process-start in ms.
async fn start_latency(
    stack: &LocalStack,
    api: &Api<Command>,
    sid: &str,
    keys: &std::collections::HashMap<u32, [u8; 32]>,
    prefix: &str,
    n: usize,
    every: Option<Duration>,
) -> Vec<u64> {
    let mut sent = Vec::new();
    let mut creates = Vec::new();
    for i in 0..n {
        let name = format!("{prefix}{i:03}");
        let c = command(&name, "box", &["date", "+%s%N"], json!({}));
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
    sid: &str,
) -> Vec<u64> {
    let script = "i=0; while [ $i -lt 100 ]; do date +%s%N; sleep 0.1; i=$((i+1)); done";
    cmds::create(api, &sh("ticks", "box", script)).await;
    wait_command_phase(stack, api, "ticks", CommandPhase::Running).await;
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut next = 0u64;
    let mut out = Vec::new();
    loop {
        let (_, page) = gw.get(&format!("/v1/sandboxes/{sid}/commands/ticks/output?after={next}"), member).await;
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

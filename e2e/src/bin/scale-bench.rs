//! hangar at scale: N concurrent sessions (default 5,000) on one operator
//! replica. Session nodes are light (`e2e/src/light_nodes.rs`: per running
//! instance a kwok Node and the worker's heartbeat Lease, no processes)
//! and EC2 is the in-memory stub (`e2e/src/ec2_stub.rs`), so the figures
//! are the operator's and the apiserver's, not moto's or the simulator's.
//!
//! Prints: created → running (p50, p99, sessions per second), then over a
//! steady minute with all N running: the operator's RSS and CPU, its
//! reconciles (count and p50/p99 duration, from its own samples), EC2
//! calls, and apiserver requests per session per minute (all clients, and
//! less the light nodes' own heartbeat writes).
//!
//! `scale-bench [N]` (default 5,000).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::future::join_all;
use hangar_crds::{Phase, Sandbox};
use hangar_e2e::bench::load::{MachineLoad, print_after};
use hangar_e2e::bench::{cpu_seconds, pct, production_intervals, rss_kib};
use hangar_e2e::control_plane::ControlPlane;
use hangar_e2e::ec2_stub::Ec2Stub;
use hangar_e2e::kwok::Kwok;
use hangar_e2e::light_nodes::LightNodes;
use hangar_e2e::operator::SYSTEM_NAMESPACE;
use hangar_e2e::sessions::{self, ensure_namespace};
use hangar_e2e::{LocalStack, StackOptions};
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

const NS: &str = "scale";
/// How often the light nodes renew each heartbeat (the worker's default).
const RENEW: Duration = Duration::from_secs(10);
const STEADY: Duration = Duration::from_secs(60);

fn main() {
    hangar_e2e::init_tracing();
    let n = hangar_e2e::bench::numbers_arg().first().copied().unwrap_or(5000) as usize;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let (stub, changes) = rt.block_on(Ec2Stub::start(Duration::from_millis(200))).expect("EC2 stub");
    let cp = ControlPlane::start().expect("control plane");
    // Node status written once, as a kubelet with nothing changing does
    // (kwok's 20–45 s heartbeat Stage is off; see `Kwok::start_with`).
    let kwok = Kwok::start_with(&cp, false).expect("kwok");
    let opts = StackOptions {
        operator_env: production_intervals(),
        operator_ec2_endpoint: Some(stub.endpoint().to_owned()),
        ..Default::default()
    };
    let stack = LocalStack::start(cp, opts).expect("stack");
    rt.block_on(run(&stack, &kwok, &stub, changes, n));
}

/// The apiserver's requests served so far, by "VERB resource[/subresource]".
async fn apiserver_requests(client: &kube::Client) -> BTreeMap<String, f64> {
    let req = http::Request::get("/metrics").body(Vec::new()).expect("request");
    let text = client.request_text(req).await.expect("apiserver /metrics");
    let mut by_kind = BTreeMap::new();
    for (series, v) in hangar_e2e::metrics_text::samples(&text) {
        let Some(labels) = series.strip_prefix("apiserver_request_total{") else { continue };
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix("=\"")?.split('"').next())
                .unwrap_or_default()
                .to_owned()
        };
        let sub = label("subresource");
        let kind =
            format!("{} {}{}", label("verb"), label("resource"), if sub.is_empty() { sub } else { format!("/{sub}") });
        *by_kind.entry(kind).or_insert(0.0) += v;
    }
    by_kind
}

/// Requests per `per` (e.g. per session) between two readings, by kind,
/// most first.
fn delta_by_kind(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>, per: f64) -> Vec<(String, f64)> {
    let mut d: Vec<(String, f64)> = after
        .iter()
        .map(|(k, v)| (k.clone(), (v - before.get(k).copied().unwrap_or(0.0)) / per))
        .filter(|(_, v)| *v > 0.0)
        .collect();
    d.sort_by(|a, b| b.1.total_cmp(&a.1));
    d
}

fn top(by_kind: &[(String, f64)], n: usize) -> String {
    by_kind.iter().take(n).map(|(k, v)| format!("{k} {v:.2}")).collect::<Vec<_>>().join("; ")
}

fn reconciles(stack: &LocalStack) -> f64 {
    hangar_e2e::metrics_text::value(&stack.operator().metrics(), "hangar_reconciles_total").unwrap_or(0.0)
}

async fn run(
    stack: &LocalStack,
    kwok: &Kwok,
    stub: &Ec2Stub,
    changes: tokio::sync::mpsc::UnboundedReceiver<hangar_e2e::ec2_stub::Change>,
    n: usize,
) {
    let client = stack.cp.client().await.expect("client");
    let _light = LightNodes::start(client.clone(), SYSTEM_NAMESPACE, changes, RENEW).await;
    ensure_namespace(&client, NS).await;
    let api: Api<Sandbox> = Api::namespaced(client.clone(), NS);
    let load = MachineLoad::now();
    load.print("before");

    // First seen running, by the client's watch.
    let running_at: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let seen = running_at.clone();
    let watch = tokio::spawn(
        watcher(api.clone(), watcher::Config::default()).default_backoff().applied_objects().for_each(move |s| {
            if let Ok(s) = s
                && sessions::phase(&s) == Some(Phase::Running)
            {
                seen.lock().expect("running").entry(s.name_any()).or_insert_with(Instant::now);
            }
            futures::future::ready(())
        }),
    );

    // Who is busy while the sessions come up: what bounds the ramp.
    let (apiserver, etcd) = stack.cp.pids();
    let operator = stack.operator().pid().expect("operator pid");
    let busy: [(&str, u32); 5] = [
        ("operator", operator),
        ("kube-apiserver", apiserver),
        ("etcd", etcd),
        ("kwok", kwok.pid()),
        ("this harness", std::process::id()),
    ];
    let ramp_cpu0: Vec<f64> = busy.iter().map(|(_, pid)| cpu_seconds(*pid)).collect();
    let ramp_api0 = apiserver_requests(&client).await;
    eprintln!("scale-bench: creating {n} sessions, 32 at a time");
    let started = Instant::now();
    let mut created_at = HashMap::new();
    let names: Vec<String> = (0..n).map(|i| format!("s{i:05}")).collect();
    for batch in names.chunks(32) {
        let sent = join_all(batch.iter().map(|name| {
            let api = api.clone();
            async move {
                let sbx = sessions::sandbox(name, "commands", json!({"idleTimeoutSeconds": 86400}));
                let at = Instant::now();
                api.create(&PostParams::default(), &sbx).await.expect("create");
                (name.clone(), at)
            }
        }))
        .await;
        created_at.extend(sent);
    }
    let created = started.elapsed();
    eprintln!("scale-bench: {n} created in {created:?}; waiting for running");
    let deadline = started + Duration::from_secs(3600);
    let mut said = Instant::now();
    loop {
        let done = running_at.lock().expect("running").len();
        if done >= n {
            break;
        }
        assert!(Instant::now() < deadline, "{done}/{n} running after an hour");
        if said.elapsed() > Duration::from_secs(30) {
            eprintln!("scale-bench: {done}/{n} running after {:?}", started.elapsed());
            said = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let all_running = started.elapsed();
    let ramp_api = delta_by_kind(&ramp_api0, &apiserver_requests(&client).await, n as f64);
    let ramp_cores: Vec<String> = busy
        .iter()
        .zip(&ramp_cpu0)
        .map(|((what, pid), c0)| format!("{what} {:.2}", (cpu_seconds(*pid) - c0) / all_running.as_secs_f64()))
        .collect();
    let latencies: Vec<u64> = {
        let at = running_at.lock().expect("running");
        created_at.iter().map(|(name, c)| at[name].duration_since(*c).as_millis() as u64).collect()
    };

    // The light nodes hand in each attempt's output key on a renewal
    // after `running`, and the operator seals it: let that pass first.
    eprintln!("scale-bench: all running; settling for two renewals, then a steady minute");
    tokio::time::sleep(2 * RENEW).await;
    let pid = stack.operator().pid().expect("operator pid");
    let samples_before = stack.operator().samples()["reconcile_us"].as_array().map(Vec::len).unwrap_or(0);
    let (cpu0, api0, rec0, ec2_0, t0) = (
        cpu_seconds(pid),
        apiserver_requests(&client).await,
        reconciles(stack),
        stub.calls().values().sum::<u64>(),
        Instant::now(),
    );
    tokio::time::sleep(STEADY).await;
    let minutes = t0.elapsed().as_secs_f64() / 60.0;
    let cpu = (cpu_seconds(pid) - cpu0) / t0.elapsed().as_secs_f64();
    let api1 = apiserver_requests(&client).await;
    let per_kind = delta_by_kind(&api0, &api1, n as f64 * minutes);
    let api_per: f64 = per_kind.iter().map(|(_, v)| v).sum();
    let heartbeats_per = 60.0 / RENEW.as_secs_f64();
    let rec_per = (reconciles(stack) - rec0) / n as f64 / minutes;
    let ec2_per_min = (stub.calls().values().sum::<u64>() - ec2_0) as f64 / minutes;
    let rss = rss_kib(pid) as f64 / 1024.0;
    let samples = stack.operator().samples();
    let all: Vec<u64> =
        samples["reconcile_us"].as_array().map(|a| a.iter().filter_map(|v| v.as_u64()).collect()).unwrap_or_default();
    let steady: Vec<u64> = all.iter().skip(samples_before.min(all.len())).copied().collect();
    let kwok_rss = rss_kib(kwok.pid()) as f64 / 1024.0;
    watch.abort();

    println!();
    println!(
        "hangar at scale: {n} sessions (commands mode) on one operator replica, kwok nodes (no status heartbeat), \
         light workers (a heartbeat Lease every {}s), EC2 stub",
        RENEW.as_secs()
    );
    println!();
    println!("| figure | value | target |");
    println!("| --- | --- | --- |");
    println!("| created (s) / all running (s) | {:.1} / {:.1} | |", created.as_secs_f64(), all_running.as_secs_f64());
    println!("| sessions running per second | {:.1} | |", n as f64 / all_running.as_secs_f64());
    println!("| cores busy while they came up, by process | {} | |", ramp_cores.join("; "));
    let ramp_total: f64 = ramp_api.iter().map(|(_, v)| v).sum();
    println!(
        "| apiserver requests per session to come up: all / by kind (top 10) | {ramp_total:.1} / {} | |",
        top(&ramp_api, 10)
    );
    println!("| created → running p50 / p99 (ms) | {} / {} | |", pct(latencies.clone(), 0.5), pct(latencies, 0.99));
    println!("| operator RSS, {n} running (MiB) | {rss:.1} | < 512 |");
    println!("| operator CPU, steady (cores) | {cpu:.3} | < 0.5 |");
    println!(
        "| reconcile p50 / p99, steady minute (ms; {} reconciles) | {:.2} / {:.2} | |",
        steady.len(),
        pct(steady.clone(), 0.5) as f64 / 1000.0,
        pct(steady, 0.99) as f64 / 1000.0
    );
    println!("| reconciles per session per minute | {rec_per:.2} | |");
    println!(
        "| apiserver requests per session per minute: all / less the light nodes' heartbeats | {api_per:.2} / {:.2} | |",
        api_per - heartbeats_per
    );
    println!("| EC2 calls per minute (all sessions) | {ec2_per_min:.1} | |");
    println!("| kwok RSS (MiB) | {kwok_rss:.1} | |");
    println!("| instances by state | {:?} | |", stub.instances_by_state());
    println!("| apiserver requests per session per minute, by kind (top 8) | {} | |", top(&per_kind, 8));
    print_after(&load);
}

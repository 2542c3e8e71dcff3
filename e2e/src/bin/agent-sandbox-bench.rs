//! kubernetes-sigs/agent-sandbox's controller on the local apiserver with
//! kwok nodes (both built from their Go modules): how fast its Sandboxes go
//! from created to Ready, and its memory per 1,000 of them, the figures the
//! scale benchmark prints for hangar.
//!
//! Each Sandbox is one Pod (no Service, no volume claim), bound by its
//! template to a kwok node round robin (there is no scheduler; kwok makes a
//! bound Pod Running and Ready with an IP, which is what the controller's
//! Ready condition waits for). Creates go out 32 at a time; created →
//! Ready is timed by the client, from the create call to the watch event
//! that first shows `Ready=True`.
//!
//! `agent-sandbox-bench [N] [NODES]` (default 1,000 Sandboxes, 10 nodes).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use hangar_e2e::agent_sandbox::{AgentSandboxController, sandbox_resource};
use hangar_e2e::bench::load::{MachineLoad, print_after};
use hangar_e2e::bench::{cpu_seconds, pct, rss_kib};
use hangar_e2e::control_plane::ControlPlane;
use hangar_e2e::kwok::{Kwok, create_ready_nodes};
use hangar_e2e::sessions::ensure_namespace;
use kube::api::{Api, DynamicObject, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

fn main() {
    hangar_e2e::init_tracing();
    let args = hangar_e2e::bench::numbers_arg();
    let n = args.first().copied().unwrap_or(1000);
    let nodes = args.get(1).copied().unwrap_or(10);
    let cp = ControlPlane::start_without_crds().expect("control plane");
    let kwok = Kwok::start(&cp).expect("kwok");
    let controller = AgentSandboxController::start(&cp).expect("agent-sandbox controller");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(run(&cp, &kwok, &controller, n, nodes));
}

fn sandbox(name: &str, node: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"podTemplate": {"spec": {
            "nodeName": node,
            "containers": [{"name": "agent", "image": "registry.invalid/agent:bench"}],
        }}},
    }))
    .expect("sandbox")
}

fn is_ready(o: &DynamicObject) -> bool {
    o.data["status"]["conditions"]
        .as_array()
        .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
}

/// Creates `names` (bound round robin to `nodes`), 32 at a time; returns
/// when each create was sent, and when each was first seen Ready.
async fn create_until_ready(
    client: &kube::Client,
    ns: &str,
    names: &[String],
    nodes: &[String],
) -> (HashMap<String, Instant>, HashMap<String, Instant>) {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &sandbox_resource());
    let watch = {
        let api = api.clone();
        let want = names.len();
        tokio::spawn(async move {
            let mut ready = HashMap::new();
            let mut events =
                std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff().applied_objects());
            while ready.len() < want {
                let Some(o) = events.try_next().await.expect("watch") else { break };
                if is_ready(&o) {
                    ready.entry(o.metadata.name.clone().unwrap_or_default()).or_insert_with(Instant::now);
                }
            }
            ready
        })
    };
    // The watch is listening before the first create (its list may be
    // empty; events follow).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let sent: HashMap<String, Instant> = futures::stream::iter(names.iter().enumerate())
        .map(|(i, name)| {
            let api = api.clone();
            let node = nodes[i % nodes.len()].clone();
            async move {
                let at = Instant::now();
                api.create(&PostParams::default(), &sandbox(name, &node)).await.expect("create sandbox");
                (name.clone(), at)
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let ready = tokio::time::timeout(Duration::from_secs(900), watch)
        .await
        .expect("every Sandbox Ready within 900 s")
        .expect("watch task");
    (sent, ready)
}

async fn run(cp: &ControlPlane, kwok: &Kwok, controller: &AgentSandboxController, n: usize, node_count: usize) {
    let load = MachineLoad::now();
    load.print("before");
    let client = cp.client().await.expect("client");
    let nodes = create_ready_nodes(&client, "kwok-node", node_count, Duration::from_secs(120)).await;
    // Warm-up: one Sandbox through the whole path (caches synced, kwok
    // making Pods ready).
    ensure_namespace(&client, "warmup").await;
    create_until_ready(&client, "warmup", &["warmup".to_owned()], &nodes).await;

    let (api_pid, etcd_pid) = cp.pids();
    let pids = [
        ("agent-sandbox controller", controller.pid()),
        ("kwok", kwok.pid()),
        ("kube-apiserver", api_pid),
        ("etcd", etcd_pid),
    ];
    let rss_before: Vec<u64> = pids.iter().map(|(_, p)| rss_kib(*p)).collect();
    let cpu_before: Vec<f64> = pids.iter().map(|(_, p)| cpu_seconds(*p)).collect();
    ensure_namespace(&client, "bench").await;
    let names: Vec<String> = (0..n).map(|i| format!("sb-{i:05}")).collect();
    let started = Instant::now();
    let (sent, ready) = create_until_ready(&client, "bench", &names, &nodes).await;
    let wall = started.elapsed().as_secs_f64();
    let latencies: Vec<u64> =
        names.iter().filter_map(|k| Some(ready.get(k)?.duration_since(*sent.get(k)?).as_millis() as u64)).collect();
    let first_sent = sent.values().min().copied().expect("sent");
    let last_ready = ready.values().max().copied().expect("ready");
    let span = last_ready.duration_since(first_sent).as_secs_f64();
    let rss_after: Vec<u64> = pids.iter().map(|(_, p)| rss_kib(*p)).collect();
    let cpu_after: Vec<f64> = pids.iter().map(|(_, p)| cpu_seconds(*p)).collect();

    println!();
    println!(
        "agent-sandbox {} controller: {n} Sandboxes (one Pod each) on {node_count} kwok nodes, local apiserver, 2 cores",
        hangar_e2e::paths::version("AGENT_SANDBOX_VERSION")
    );
    println!();
    println!("| figure | value |");
    println!("| --- | --- |");
    println!("| created → Ready, all {n} (Sandboxes per second) | {:.1} ({span:.1} s) |", n as f64 / span);
    println!(
        "| created → Ready per Sandbox (ms) | p50 {} p99 {} max {} |",
        pct(latencies.clone(), 0.5),
        pct(latencies.clone(), 0.99),
        pct(latencies.clone(), 1.0)
    );
    for (i, (name, _)) in pids.iter().enumerate() {
        let grew = rss_after[i].saturating_sub(rss_before[i]) as f64 / 1024.0;
        println!(
            "| {name}: RSS after (MiB), growth per 1,000 Sandboxes (MiB), CPU during the run (s) | {:.1}, {:.1}, {:.1} |",
            rss_after[i] as f64 / 1024.0,
            grew * 1000.0 / n as f64,
            cpu_after[i] - cpu_before[i]
        );
    }
    println!("| wall time of the run (s) | {wall:.1} |");
    println!();
    print_after(&load);
}

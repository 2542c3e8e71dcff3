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
//! less the light nodes' own heartbeat writes). Last, leader failover: the
//! operator runs leader-elected (the chart's Lease timings); a standby
//! replica joins, the leader is killed just after renewing its Lease, and
//! the bench times the standby leading, ready, caught up with every
//! session, and a session created at the kill to `running`.
//!
//! `scale-bench [N] [RENEW]` (default 5,000 sessions, heartbeats every 10
//! s, the worker's default). With RENEW the operator's staleness and
//! worker-lost limits keep their default ratios to it (3× and 6×): the
//! heartbeats are the workers' writes, and at 5,000 every 10 s they are
//! 500 writes a second, more than this machine's apiserver sustains beside
//! the rest.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::future::join_all;
use hangar_crds::{Phase, Sandbox};
use hangar_e2e::bench::load::{MachineLoad, print_after};
use hangar_e2e::bench::{cpu_seconds, pct, peak_rss_kib, production_intervals, rss_kib};
use hangar_e2e::control_plane::ControlPlane;
use hangar_e2e::ec2_stub::Ec2Stub;
use hangar_e2e::kwok::Kwok;
use hangar_e2e::light_nodes::LightNodes;
use hangar_e2e::operator::SYSTEM_NAMESPACE;
use hangar_e2e::sessions::{self, ensure_namespace};
use hangar_e2e::{LocalStack, StackOptions};
use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

const NS: &str = "scale";
/// How often the light nodes renew each heartbeat by default (the worker's
/// default).
const RENEW_DEFAULT: u64 = 10;
const STEADY: Duration = Duration::from_secs(60);

fn main() {
    hangar_e2e::init_tracing();
    let args = hangar_e2e::bench::numbers_arg();
    let n = args.first().copied().unwrap_or(5000) as usize;
    let renew = Duration::from_secs(args.get(1).map_or(RENEW_DEFAULT, |&r| r as u64));
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let (stub, changes) = rt.block_on(Ec2Stub::start(Duration::from_millis(200))).expect("EC2 stub");
    let cp = ControlPlane::start().expect("control plane");
    // Node status written once, as a kubelet with nothing changing does
    // (kwok's 20–45 s heartbeat Stage is off; see `Kwok::start_with`).
    let kwok = Kwok::start_with(&cp, false).expect("kwok");
    let mut operator_env = production_intervals();
    operator_env.extend([("HANGAR_LEADER_ELECT", "true"), ("POD_NAME", LEADER)].map(|(k, v)| (k.into(), v.into())));
    if renew.as_secs() != RENEW_DEFAULT {
        operator_env.push(("HANGAR_HEARTBEAT_STALE_SECONDS".into(), (3 * renew.as_secs()).to_string()));
        operator_env.push(("HANGAR_WORKER_LOST_SECONDS".into(), (6 * renew.as_secs()).to_string()));
    }
    let opts =
        StackOptions { operator_env, operator_ec2_endpoint: Some(stub.endpoint().to_owned()), ..Default::default() };
    let stack = LocalStack::start(cp, opts).expect("stack");
    rt.block_on(run(&stack, &kwok, &stub, changes, n, renew));
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

/// kwok lists a Node's Pods (`spec.nodeName=`, one LIST each, one worker
/// for all Nodes) when it first sees the Node. After a fast ramp that
/// backlog drains for minutes, and a steady minute taken meanwhile counts
/// kwok catching up as the operator's requests. Waits until no LIST of
/// Pods was served for 6 s (at most 10 minutes); returns how long that took
/// and how many were served since `since`.
async fn kwok_settled(client: &kube::Client, since: &BTreeMap<String, f64>) -> (Duration, f64) {
    const QUIET: Duration = Duration::from_secs(6);
    let lists = |by_kind: &BTreeMap<String, f64>| by_kind.get("LIST pods").copied().unwrap_or(0.0);
    let started = Instant::now();
    let mut last = lists(&apiserver_requests(client).await);
    let mut quiet_since = Instant::now();
    while quiet_since.elapsed() < QUIET && started.elapsed() < Duration::from_secs(600) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = lists(&apiserver_requests(client).await);
        if now != last {
            (last, quiet_since) = (now, Instant::now());
        }
    }
    (started.elapsed().saturating_sub(QUIET), last - lists(since))
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
    renew: Duration,
) {
    let client = stack.cp.client().await.expect("client");
    let _light = LightNodes::start(client.clone(), SYSTEM_NAMESPACE, changes, renew).await;
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
    let rss0 = rss_kib(operator) as f64 / 1024.0;
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
    eprintln!("scale-bench: all running; settling for two renewals and kwok's pod lists, then a steady minute");
    tokio::time::sleep(2 * renew).await;
    let kwok_lists = kwok_settled(&client, &ramp_api0).await;
    let pid = stack.operator().pid().expect("operator pid");
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
    let heartbeats_per = 60.0 / renew.as_secs_f64();
    let steady_reconciles = reconciles(stack) - rec0;
    let rec_per = steady_reconciles / n as f64 / minutes;
    let ec2_per_min = (stub.calls().values().sum::<u64>() - ec2_0) as f64 / minutes;
    let rss = rss_kib(pid) as f64 / 1024.0;
    let peak_rss = peak_rss_kib(pid) as f64 / 1024.0;
    let samples = stack.operator().samples();
    let all: Vec<u64> =
        samples["reconcile_us"].as_array().map(|a| a.iter().filter_map(|v| v.as_u64()).collect()).unwrap_or_default();
    // The operator keeps its latest samples (a bounded window, which the
    // ramp may have filled): the steady minute's are the last ones.
    let steady: Vec<u64> = all[all.len().saturating_sub(steady_reconciles as usize)..].to_vec();
    let kwok_rss = rss_kib(kwok.pid()) as f64 / 1024.0;
    eprintln!("scale-bench: leader failover (a standby joins, the leader is killed after its next renewal)");
    let f = failover(stack, &client, &api, &running_at, n).await;
    watch.abort();

    println!();
    println!(
        "hangar at scale: {n} sessions (commands mode) on one operator replica, kwok nodes (no status heartbeat), \
         light workers (a heartbeat Lease every {}s), EC2 stub",
        renew.as_secs()
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
    println!("| operator peak RSS, ramp included (MiB) | {peak_rss:.1} | |");
    println!(
        "| operator RSS before the sessions (MiB) / growth per 1,000 sessions (MiB) | {rss0:.1} / {:.1} | |",
        (rss - rss0) * 1000.0 / n as f64
    );
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
    println!(
        "| kwok's per-Node Pod lists (one per Node it is given) since the ramp began / done after (s, from all running + two renewals; before the steady minute) | {:.0} / {:.1} | |",
        kwok_lists.1,
        kwok_lists.0.as_secs_f64()
    );
    println!("| instances by state | {:?} | |", stub.instances_by_state());
    println!("| apiserver requests per session per minute, by kind (top 8) | {} | |", top(&per_kind, 8));
    println!(
        "| leader failover, two replicas (s from the leader's SIGKILL, just after it renewed): its Lease still held / \
         the standby leads / ready / has reconciled {n} times | {:.1} / {:.1} / {:.1} / {:.1} | |",
        f.lease_left, f.leads, f.ready, f.caught_up
    );
    println!(
        "| a session created at the kill runs after (s); one created after the failover (s) | {:.1}; {:.1} | |",
        f.canary, f.canary_after
    );
    println!("| standby RSS following / leading (MiB) | {:.1} / {:.1} | |", f.standby_rss, f.leader_rss);
    print_after(&load);
}

/// The leader's and the standby's identities (`POD_NAME`).
const LEADER: &str = "hangar-operator-0";
const STANDBY: &str = "hangar-operator-1";
/// The operator's leader-election Lease (in the system namespace).
const LEADER_LEASE: &str = "hangar-operator-leader";

/// Leader failover with two replicas, seconds from the leader's death.
struct Failover {
    /// How long the dead leader's Lease still held when it died.
    lease_left: f64,
    leads: f64,
    ready: f64,
    /// The new leader has made as many reconciles as there are sessions.
    caught_up: f64,
    /// A session created as the leader died, to `running`.
    canary: f64,
    /// A session created once the new leader has caught up, to `running`.
    canary_after: f64,
    standby_rss: f64,
    leader_rss: f64,
}

async fn failover(
    stack: &LocalStack,
    client: &kube::Client,
    api: &Api<Sandbox>,
    running_at: &Arc<Mutex<HashMap<String, Instant>>>,
    n: usize,
) -> Failover {
    let standby = stack.operator().replica(STANDBY).expect("a standby replica");
    let leases: Api<Lease> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let renewed = |l: &Lease| l.spec.as_ref().and_then(|s| s.renew_time.clone()).map(|t| t.0);
    // Killed just after a renewal: the Lease holds for nearly its whole
    // duration, the worst case (a leader dies at any point of it).
    let first = renewed(&leases.get(LEADER_LEASE).await.expect("leader Lease"));
    let deadline = Instant::now() + Duration::from_secs(60);
    let lease = loop {
        let l = leases.get(LEADER_LEASE).await.expect("leader Lease");
        if renewed(&l) != first {
            break l;
        }
        assert!(Instant::now() < deadline, "the leader did not renew its Lease within 60 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let standby_rss = standby.pid().map(rss_kib).unwrap_or(0) as f64 / 1024.0;
    let spec = lease.spec.clone().unwrap_or_default();
    assert_eq!(spec.holder_identity.as_deref(), Some(LEADER));
    let expires = renewed(&lease).expect("renewTime")
        + Duration::from_secs(spec.lease_duration_seconds.unwrap_or(0).unsigned_abs().into());
    stack.operator().kill();
    let died = Instant::now();
    let lease_left = (expires.as_millisecond() - k8s_openapi::jiff::Timestamp::now().as_millisecond()) as f64 / 1000.0;
    let canary = sessions::sandbox("failover-canary", "commands", json!({"idleTimeoutSeconds": 86400}));
    api.create(&PostParams::default(), &canary).await.expect("create the canary");

    let since = |t: Option<Instant>| t.map(|t| t.duration_since(died).as_secs_f64()).unwrap_or(f64::NAN);
    let (mut leads, mut ready, mut caught_up, mut canary_at) = (None, None, None, None);
    let deadline = died + Duration::from_secs(300);
    while leads.is_none() || ready.is_none() || caught_up.is_none() || canary_at.is_none() {
        assert!(Instant::now() < deadline, "failover not done within 300 s");
        let now = Instant::now();
        if leads.is_none()
            && let Ok(l) = leases.get(LEADER_LEASE).await
            && l.spec.and_then(|s| s.holder_identity).as_deref() == Some(STANDBY)
        {
            leads = Some(now);
        }
        if leads.is_some() && ready.is_none() && standby.is_ready() {
            ready = Some(now);
        }
        if ready.is_some() && caught_up.is_none() {
            let done = hangar_e2e::metrics_text::value(&standby.metrics(), "hangar_reconciles_total").unwrap_or(0.0);
            if done >= n as f64 {
                caught_up = Some(now);
            }
        }
        if canary_at.is_none() {
            canary_at = running_at.lock().expect("running").get("failover-canary").copied();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let leader_rss = standby.pid().map(rss_kib).unwrap_or(0) as f64 / 1024.0;

    let after = sessions::sandbox("after-failover", "commands", json!({"idleTimeoutSeconds": 86400}));
    let sent = Instant::now();
    api.create(&PostParams::default(), &after).await.expect("create the second canary");
    let deadline = sent + Duration::from_secs(120);
    let canary_after = loop {
        if let Some(at) = running_at.lock().expect("running").get("after-failover") {
            break at.duration_since(sent).as_secs_f64();
        }
        assert!(Instant::now() < deadline, "a session created after the failover did not run within 120 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    Failover {
        lease_left,
        leads: since(leads),
        ready: since(ready),
        caught_up: since(caught_up),
        canary: since(canary_at),
        canary_after,
        standby_rss,
        leader_rss,
    }
}

//! Chaos without loss: a seeded run drives sessions through randomized
//! lifecycles — launch, commands with output, pause, resume, reclamation
//! (an interruption), end — while killing a random component at random
//! points: the operator, the webhook, a gateway replica, a worker, a
//! supervisor, the apiserver. Afterwards:
//!
//! - every command is in exactly one final status (or queued/running in a
//!   live session — none are left: every session is resumed and drained);
//! - each ran at most once (each appends its name to a file in the
//!   workspace; none appears twice, an exited one exactly once);
//! - no output byte is lost or duplicated: read back through the gateway,
//!   an exited command's output is exactly what it printed, any other's a
//!   prefix of it;
//! - no duplicate or leaked instance or volume (counted by tag), and every
//!   ended session fully reset (four steps confirmed, key destroyed).
//!
//! `HANGAR_CHAOS_SEED` re-runs a seed (printed at the start and the end);
//! `HANGAR_CHAOS_KILLS` (50) and `HANGAR_CHAOS_SESSIONS` (2) size it; a
//! longer run: `HANGAR_CHAOS_KILLS=300 HANGAR_CHAOS_SESSIONS=4 cargo test
//! -p hangar-e2e --test chaos -- --nocapture`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use base64::Engine;
use hangar_crds::{Command, CommandPhase, Phase, Sandbox};
use hangar_e2e::commands;
use hangar_e2e::ec2::{client as ec2_client, session_instances, session_volumes};
use hangar_e2e::gateway::member_token;
use hangar_e2e::operator::SYSTEM_NAMESPACE;
use hangar_e2e::sessions::{self, ensure_namespace, wait_for};
use hangar_e2e::{ControlPlane, LocalStack, StackOptions};
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

const NS: &str = "chaos";

/// splitmix64: small, seedable, the same sequence on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn pick<'a, T>(&mut self, v: &'a [T]) -> Option<&'a T> {
        (!v.is_empty()).then(|| &v[self.below(v.len() as u64) as usize])
    }
}

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[derive(Default)]
struct Counts {
    sessions: usize,
    commands: usize,
    bytes_checked: usize,
    kills: BTreeMap<&'static str, usize>,
    pauses: usize,
    resumes: usize,
    reclaims: usize,
    ends: usize,
}

/// What command `name` prints: lines 1..=n.
fn expected_output(n: u64) -> Vec<u8> {
    (1..=n).map(|i| format!("{i}\n")).collect::<String>().into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_without_loss() {
    let seed = env_num("HANGAR_CHAOS_SEED", k8s_openapi::jiff::Timestamp::now().as_millisecond() as u64);
    let kills_wanted = env_num("HANGAR_CHAOS_KILLS", 50) as usize;
    let live_sessions = env_num("HANGAR_CHAOS_SESSIONS", 2) as usize;
    println!(
        "chaos: seed {seed} (HANGAR_CHAOS_SEED={seed} re-runs it), {kills_wanted} kills, {live_sessions} sessions"
    );
    let mut rng = Rng(seed);

    let cp = ControlPlane::start().expect("control plane");
    let opts = StackOptions {
        operator_env: vec![
            ("HANGAR_WORKER_LOST_SECONDS".into(), "4".into()),
            ("HANGAR_RECOVERY_WINDOW_SECONDS".into(), "120".into()),
            ("HANGAR_RECOVERY_RETRY_SECONDS".into(), "1".into()),
            ("HANGAR_PAUSE_GRACE_SECONDS".into(), "10".into()),
        ],
        ec2_transitions: Some(Duration::from_millis(500)),
        ..Default::default()
    };
    let mut stack = LocalStack::start(cp, opts).expect("stack");
    let client = stack.cp.client().await.unwrap();
    ensure_namespace(&client, NS).await;
    let boxes: Api<Sandbox> = Api::namespaced(client.clone(), NS);
    let cmds: Api<Command> = Api::namespaced(client.clone(), NS);
    let member = member_token(&stack.cp, NS, "chaos", "get,list,create,patch");
    let ec2 = ec2_client(&stack.ec2_endpoint()).await;

    let mut counts = Counts::default();
    // Session name → its commands (name, lines printed).
    let mut all_sessions: Vec<String> = Vec::new();
    let mut expected: BTreeMap<String, (String, u64)> = BTreeMap::new();
    let mut next_session = 0;
    let mut next_command = 0;
    let launch = |n: usize| format!("s{n}");
    for _ in 0..live_sessions {
        let name = launch(next_session);
        next_session += 1;
        create_with_retry(&boxes, &sessions::sandbox(&name, "commands", json!({}))).await;
        all_sessions.push(name);
        counts.sessions += 1;
    }
    let mut ended: Vec<String> = Vec::new();

    let started = Instant::now();
    let mut kills = 0;
    while kills < kills_wanted {
        let live: Vec<String> = all_sessions.iter().filter(|s| !ended.contains(s)).cloned().collect();
        let mut by_phase: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
        for name in &live {
            let Ok(Some(s)) = boxes.get_opt(name).await else { continue };
            let key = match sessions::phase(&s) {
                Some(Phase::Running) => "running",
                Some(Phase::Paused) => "paused",
                _ => "other",
            };
            by_phase.entry(key).or_default().push(name.clone());
        }
        let running = by_phase.get("running").cloned().unwrap_or_default();
        let paused = by_phase.get("paused").cloned().unwrap_or_default();
        match rng.below(100) {
            // A command with output; some still run when the next fault comes.
            0..=34 => {
                if let Some(session) = rng.pick(&running).cloned() {
                    let name = format!("c{next_command}");
                    next_command += 1;
                    let lines = 1 + rng.below(3000);
                    let sleep = rng.below(3);
                    let script = format!("echo {name} >> runs.log; seq 1 {lines}; sleep {sleep}");
                    create_with_retry(&cmds, &commands::sh(&name, &session, &script)).await;
                    expected.insert(name, (session, lines));
                    counts.commands += 1;
                }
            }
            35..=44 => {
                if let Some(s) = rng.pick(&running) {
                    sessions::set_state(&boxes, s, "Paused").await.ok();
                    counts.pauses += 1;
                }
            }
            45..=54 => {
                if let Some(s) = rng.pick(&paused) {
                    sessions::set_state(&boxes, s, "Running").await.ok();
                    counts.resumes += 1;
                }
            }
            // A reclamation: EC2 stops the instance under the session.
            55..=59 => {
                if let Some(s) = rng.pick(&running)
                    && let Some(instance) = boxes.get(s).await.ok().and_then(|b| b.status?.instance_id)
                {
                    ec2.stop_instances().instance_ids(&instance).send().await.ok();
                    counts.reclaims += 1;
                }
            }
            // End one, launch another.
            60..=62 if live.len() > 1 => {
                if let Some(s) = rng.pick(&live).cloned() {
                    sessions::set_state(&boxes, &s, "Ended").await.ok();
                    ended.push(s);
                    counts.ends += 1;
                    let name = launch(next_session);
                    next_session += 1;
                    create_with_retry(&boxes, &sessions::sandbox(&name, "commands", json!({}))).await;
                    all_sessions.push(name);
                    counts.sessions += 1;
                }
            }
            _ => {
                let target = kill_one(&mut stack, &boxes, &live, &mut rng).await;
                *counts.kills.entry(target).or_default() += 1;
                kills += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.below(300))).await;
    }
    println!("chaos: {kills} kills in {:?}; settling", started.elapsed());

    // Settle: every live session running again (a paused one resumed), so
    // every queued command runs; every command final.
    let live: Vec<String> = all_sessions.iter().filter(|s| !ended.contains(s)).cloned().collect();
    for s in &live {
        sessions::set_state(&boxes, s, "Running").await.unwrap();
    }
    for s in &live {
        sessions::wait_phase(&stack, &boxes, s, Phase::Running).await;
    }
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let list = cmds.list(&ListParams::default()).await.unwrap();
        let unfinished: Vec<String> = list
            .items
            .iter()
            .filter(|c| !commands::phase(c).is_some_and(CommandPhase::is_final))
            .map(|c| format!("{} {:?}", c.name_any(), commands::phase(c)))
            .collect();
        if unfinished.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "seed {seed}: commands never finished: {unfinished:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Each command: one final status, run at most once, its output exact
    // (exited) or a prefix (ended otherwise), read through the gateway.
    let gw = stack.gateway_client();
    let list = cmds.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), expected.len(), "seed {seed}: every command sent exists once");
    let mut runs: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    for s in &live {
        let volume = boxes.get(s).await.unwrap().status.unwrap().volume_id.unwrap();
        let log = std::fs::read_to_string(stack.sim.volume_dir(&volume).join("runs.log")).unwrap_or_default();
        let per = runs.entry(s.clone()).or_default();
        for line in log.lines() {
            *per.entry(line.to_owned()).or_default() += 1;
        }
    }
    for c in &list.items {
        let name = c.name_any();
        let (session, lines) = expected[&name].clone();
        let phase = commands::phase(c).unwrap();
        if !ended.contains(&session) {
            let ran = runs[&session].get(&name).copied().unwrap_or(0);
            assert!(ran <= 1, "seed {seed}: {name} ran {ran} times");
            if phase == CommandPhase::Exited {
                assert_eq!(ran, 1, "seed {seed}: {name} exited without running");
            }
        }
        let sid = boxes.get(&session).await.unwrap().uid().unwrap();
        let out = match read_all(&gw, &member, &sid, &name).await {
            Ok(out) => out,
            Err(last) => panic!("seed {seed}: {}", why_not_final(&stack, &client, &sid, c, &last).await),
        };
        let want = expected_output(lines);
        if phase == CommandPhase::Exited {
            assert_eq!(out.len(), want.len(), "seed {seed}: {name} exited; its output's length");
            assert!(out == want, "seed {seed}: {name} exited; its output differs");
        } else {
            assert!(
                want.starts_with(&out),
                "seed {seed}: {name} ({phase:?}): output is not a prefix of what it printed"
            );
        }
        counts.bytes_checked += out.len();
    }

    // End everything; every session fully reset, one instance each, no
    // volume left.
    for s in &live {
        sessions::set_state(&boxes, s, "Ended").await.unwrap();
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    for s in &all_sessions {
        let b =
            wait_for(&stack, &boxes, s, "ended", |b| matches!(sessions::phase(b), Some(Phase::Ended | Phase::Failed)))
                .await;
        let sid = b.uid().unwrap();
        let st = b.status.unwrap();
        let steps: Vec<&str> = st.reset.iter().map(|r| r.step.as_str()).collect();
        assert_eq!(steps, hangar_e2e::sessions::RESET_STEPS, "seed {seed}: {s}");
        let instances = session_instances(&ec2, &sid).await;
        assert!(instances.len() <= 1, "seed {seed}: {s} has {} instances: {instances:?}", instances.len());
        assert!(instances.iter().all(|(_, st)| st.as_str() == "terminated"), "seed {seed}: {s}: {instances:?}");
        assert!(session_volumes(&ec2, &sid).await.is_empty(), "seed {seed}: {s} left a volume");
        // The operator's name for the sealed session key's Secret.
        let key = format!("hangar-session-key-{sid}");
        assert!(secrets.get_opt(&key).await.unwrap().is_none(), "seed {seed}: the key of {s} was not destroyed");
    }

    println!(
        "chaos: seed {seed}: {} sessions, {} commands, {} output bytes checked, kills {:?} ({kills} in all), \
         {} pauses, {} resumes, {} reclamations, {} ends mid-run, {:?} in all",
        counts.sessions,
        counts.commands,
        counts.bytes_checked,
        counts.kills,
        counts.pauses,
        counts.resumes,
        counts.reclaims,
        counts.ends,
        started.elapsed()
    );
    assert!(kills >= 50.min(kills_wanted));
}

/// Creates `obj`, trying again while a just-restarted part (apiserver,
/// webhook) is not answering yet.
async fn create_with_retry<K>(api: &Api<K>, obj: &K)
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match api.create(&PostParams::default(), obj).await {
            Ok(_) => return,
            Err(kube::Error::Api(e)) if e.code == 409 => return,
            Err(e) if Instant::now() < deadline => {
                tracing::debug!(error = %e, "create failed; trying again");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("create {}: {e}", obj.name_any()),
        }
    }
}

/// Kills one component at random (and starts it again where a kubelet or
/// a Deployment would); returns which.
async fn kill_one(stack: &mut LocalStack, boxes: &Api<Sandbox>, live: &[String], rng: &mut Rng) -> &'static str {
    let nodes: Vec<String> = {
        let mut v = Vec::new();
        for s in live {
            if let Some(node) = boxes.get(s).await.ok().and_then(|b| b.status?.node_name) {
                v.push(node);
            }
        }
        v
    };
    let kill_pid = |pid: i32| {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
    };
    match rng.below(6) {
        0 => {
            stack.operator().restart().expect("operator restart");
            "operator"
        }
        1 => {
            stack.webhook.restart().expect("webhook restart");
            "webhook"
        }
        2 => {
            if rng.below(2) == 0 {
                stack.gateway.restart().expect("gateway restart");
            } else {
                stack.gateway_replica.restart().expect("gateway replica restart");
            }
            "gateway"
        }
        3 => {
            // The simulator restarts it, as its DaemonSet would.
            if let Some(pid) = rng.pick(&nodes).and_then(|n| stack.sim.pid(n, "worker")) {
                kill_pid(pid);
            }
            "worker"
        }
        4 => {
            if let Some(pid) = rng.pick(&nodes).and_then(|n| stack.sim.pid(n, "supervisor")) {
                kill_pid(pid);
            }
            "supervisor"
        }
        _ => {
            stack.cp.restart_apiserver().expect("apiserver restart");
            "apiserver"
        }
    }
}

/// Every byte of a command's output, through the gateway, to its end; or,
/// when it never comes to its end, the last answer (chunks left out).
async fn read_all(
    gw: &hangar_e2e::gateway::GatewayClient,
    token: &str,
    sid: &str,
    cid: &str,
) -> Result<Vec<u8>, serde_json::Value> {
    let mut out = Vec::new();
    let mut after = 0u64;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (st, mut body) = gw.get(&format!("/v1/sandboxes/{sid}/commands/{cid}/output?after={after}"), token).await;
        if st == 429 {
            // The per-caller rate limit: a client backs off and asks again.
            assert!(Instant::now() < deadline, "{cid}: rate-limited until the deadline");
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        assert_eq!(st, 200, "{cid}: {body}");
        for c in body["chunks"].as_array().unwrap() {
            let offset = c["offset"].as_u64().unwrap();
            let data = base64::engine::general_purpose::STANDARD.decode(c["data"].as_str().unwrap()).unwrap();
            assert_eq!(offset, out.len() as u64, "{cid}: a gap or an overlap at {offset}");
            out.extend(data);
        }
        after = body["next"].as_u64().unwrap();
        if body["final"].as_bool().unwrap() {
            return Ok(out);
        }
        if Instant::now() >= deadline {
            body["chunks"] = json!(body["chunks"].as_array().map(Vec::len));
            return Err(body);
        }
    }
}

/// Why a command's output never came to its end: the gateway's last
/// answer, the command's stored status, the chunks in the store (by
/// attempt) and which attempts' output keys are sealed or still handed in.
async fn why_not_final(
    stack: &LocalStack,
    client: &kube::Client,
    sid: &str,
    cmd: &Command,
    last: &serde_json::Value,
) -> String {
    use hangar_crds::output_keys;
    use k8s_openapi::api::core::v1::ConfigMap;
    let number = cmd.status.as_ref().and_then(|s| s.number).unwrap_or_default();
    let dir = stack.cp.dir().join("output").join(sid).join("cmd").join(number.to_string());
    let mut chunks: Vec<String> = std::fs::read_dir(&dir)
        .map(|d| {
            d.flatten()
                .map(|e| {
                    format!("{} ({} B)", e.file_name().to_string_lossy(), e.metadata().map(|m| m.len()).unwrap_or(0))
                })
                .collect()
        })
        .unwrap_or_default();
    chunks.sort();
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let sealed: Vec<String> = maps
        .get_opt(&output_keys::sealed_keys_name(sid))
        .await
        .ok()
        .flatten()
        .and_then(|m| m.binary_data)
        .map(|d| d.into_keys().collect())
        .unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let handed: Vec<String> = secrets
        .list(&ListParams::default())
        .await
        .map(|l| l.items.iter().map(|s| s.name_any()).filter(|n| n.contains(sid)).collect())
        .unwrap_or_default();
    format!(
        "{}: output never final. Last answer: {last}. Status: {}. Chunks of command {number}: {chunks:?}. \
         Sealed output keys: {sealed:?}. Secrets naming the session: {handed:?}",
        cmd.name_any(),
        serde_json::to_string(&cmd.status).unwrap_or_default(),
    )
}

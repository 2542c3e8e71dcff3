//! Admission benchmark (`make bench`): how fast the admission webhook
//! answers a burst of Command creates for one session, with the limits
//! exact. Runs the local stack: the webhook asks the operator's leader,
//! which decides on the session's ledger in its memory.
//!
//! - baseline: one Command create at a time (the apiserver round trip with
//!   one admission), median of 20;
//! - burst: 64 creates for one new session sent at once, time until the
//!   last is answered; the 65th then is refused (`sandbox_command_limit`).
//!   They sleep, so all 64 stay unfinished. These sessions then end.
//!
//! - steady rate: reviews sent straight to the webhook at 200 per second
//!   for 10 s (as the apiserver sends them, with its admission client
//!   certificate), spread over 40 sessions; the time each takes to be
//!   decided (p50, p90, p99, max), target p99 under 5 ms; then the same
//!   sent as session tokens' identities, so each review also runs the
//!   token scope check.
//!
//! Each steady phase starts once the one-minute load average is under 1
//! (at most 90 s after its sessions run), so it measures the decisions and
//! not the launches' tail; its sessions end after it. Prints the load
//! average before and after, medians over the runs, and the burst as a
//! ratio to the baseline.
//! `admission-bench [RUNS] [RATE] [SECONDS]` (defaults 7, 200, 10).

use std::time::Instant;

use futures::future::join_all;
use hangar_crds::{Command, Sandbox};
use hangar_e2e::ControlPlane;
use hangar_e2e::bench::pct;
use hangar_e2e::commands::sh;
use hangar_e2e::sessions::{self, ensure_namespace};
use hangar_e2e::stack::{LocalStack, StackOptions};
use kube::api::{Api, PostParams};
use serde_json::json;

const NS: &str = "admission-bench";
const BURST: usize = 64;

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn main() {
    hangar_e2e::init_tracing();
    let arg = |n: usize, default: u64| std::env::args().nth(n).and_then(|a| a.parse().ok()).unwrap_or(default);
    let (runs, rate, seconds) = (arg(1, 7) as usize, arg(2, 200), arg(3, 10));
    let cp = ControlPlane::start().expect("control plane");
    // The whole stack: the operator's leader decides what the webhook
    // asks. Workers renew their heartbeat every 10 s, as in production.
    let opts = StackOptions {
        worker_heartbeat_ms: Some(10_000),
        operator_env: hangar_e2e::bench::production_intervals(),
        ..Default::default()
    };
    let stack = LocalStack::start(cp, opts).expect("local stack");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(run(&stack, runs));
    rt.block_on(steady(&stack, rate, seconds, false));
    rt.block_on(steady(&stack, rate, seconds, true));
}

/// Waits (up to 90 s) until the one-minute load average is under 1, so a
/// steady phase measures the decisions and not the tail of the launches
/// before it; says how long it waited.
async fn settle() {
    let started = Instant::now();
    let one_minute = || load_average().split_whitespace().next().and_then(|l| l.parse::<f64>().ok()).unwrap_or(0.0);
    while one_minute() >= 1.0 && started.elapsed() < std::time::Duration::from_secs(90) {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
    eprintln!("settled for {:.0} s, load average {}", started.elapsed().as_secs_f64(), load_average());
}

async fn run(stack: &LocalStack, runs: usize) {
    let client = stack.cp.client().await.unwrap();
    ensure_namespace(&client, NS).await;
    let boxes: Api<Sandbox> = Api::namespaced(client.clone(), NS);
    let commands: Api<Command> = Api::namespaced(client.clone(), NS);
    let load_before = load_average();

    boxes.create(&PostParams::default(), &sessions::sandbox("base", "commands", json!({}))).await.unwrap();
    let mut single = Vec::new();
    for i in 0..20 {
        let t = Instant::now();
        commands.create(&PostParams::default(), &sh(&format!("base-{i}"), "base", "true")).await.unwrap();
        single.push(t.elapsed().as_millis() as u64);
    }

    let mut bursts = Vec::new();
    for r in 0..runs {
        let name = format!("burst-{r}");
        boxes.create(&PostParams::default(), &sessions::sandbox(&name, "commands", json!({}))).await.unwrap();
        let started = Instant::now();
        let answers = join_all((0..BURST).map(|i| {
            let (commands, cmd) = (commands.clone(), sh(&format!("{name}-{i}"), &name, "exec sleep 600"));
            async move { commands.create(&PostParams::default(), &cmd).await }
        }))
        .await;
        bursts.push(started.elapsed().as_millis() as u64);
        let admitted = answers.iter().filter(|a| a.is_ok()).count();
        assert_eq!(admitted, BURST, "every create of the burst admitted: {:?}", answers.iter().find(|a| a.is_err()));
        let over = commands.create(&PostParams::default(), &sh(&format!("{name}-over"), &name, "true")).await;
        let refused = matches!(&over, Err(kube::Error::Api(e)) if e.reason == "sandbox_command_limit");
        assert!(refused, "the 65th unfinished is refused: {over:?}");
    }
    let load_after = load_average();
    // The burst sessions end (their nodes and 64 sleeping commands each go),
    // so the steady phase below measures the webhook, not their upkeep.
    let ended: Vec<String> =
        std::iter::once("base".to_owned()).chain((0..runs).map(|r| format!("burst-{r}"))).collect();
    end_all(stack, &boxes, &ended).await;

    let base = pct(single.clone(), 0.5).max(1);
    let burst = pct(bursts.clone(), 0.5);
    println!();
    println!(
        "hangar admission benchmark: the local stack, 2 cores, load average {load_before} before, {load_after} after"
    );
    println!();
    println!("| figure | median | max | runs | ratio to one create | target |");
    println!("| --- | --- | --- | --- | --- | --- |");
    println!(
        "| one Command create, admitted (ms) | {base} | {} | {} | 1 | |",
        single.iter().max().unwrap(),
        single.len()
    );
    println!(
        "| {BURST} creates for one session at once, last answered (ms) | {burst} | {} | {runs} | {:.1} | well under 1000 |",
        bursts.iter().max().unwrap(),
        burst as f64 / base as f64
    );
}

/// An `exec` token for session `s`, issued by the operator (the bench
/// reviews as the token's user name, so it needs no plaintext). It once
/// wrote the issued status itself, which raced the operator's own and is
/// refused since a token's digest and expiry are written once.
async fn issued_token(client: &kube::Client, s: &Sandbox, name: &str) {
    use hangar_crds::session_token::SessionToken;
    use kube::ResourceExt;
    let tokens: Api<SessionToken> = Api::namespaced(client.clone(), NS);
    let token: SessionToken = serde_json::from_value(json!({
        "apiVersion": "hangar.dev/v1alpha1", "kind": "SessionToken", "metadata": {"name": name},
        "spec": {"sandbox": s.name_any(), "scopes": ["exec"], "ttlSeconds": 3600,
                 "publicKey": {"kty": "EC", "crv": "P-256",
                               "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU",
                               "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}},
    }))
    .unwrap();
    tokens.create(&PostParams::default(), &token).await.unwrap();
}

/// Reviews at `rate` per second for `seconds`, straight to the webhook.
async fn steady(stack: &LocalStack, rate: u64, seconds: u64, as_tokens: bool) {
    const SESSIONS: usize = 40;
    let (cp, webhook) = (&stack.cp, &stack.webhook);
    let client = cp.client().await.unwrap();
    let boxes: Api<Sandbox> = Api::namespaced(client.clone(), NS);
    let prefix = if as_tokens { "steady-tok" } else { "steady" };
    for i in 0..SESSIONS {
        let s = boxes
            .create(&PostParams::default(), &sessions::sandbox(&format!("{prefix}-{i}"), "commands", json!({})))
            .await
            .unwrap();
        if as_tokens {
            issued_token(&client, &s, &format!("tok-{i}")).await;
        }
    }
    // Measured once every session runs (its launch is no longer load).
    for i in 0..SESSIONS {
        sessions::wait_phase(stack, &boxes, &format!("{prefix}-{i}"), hangar_crds::Phase::Running).await;
        if as_tokens {
            let tokens: Api<hangar_crds::session_token::SessionToken> = Api::namespaced(client.clone(), NS);
            let issued = |t: &hangar_crds::session_token::SessionToken| {
                t.status.as_ref().is_some_and(|s| s.digest.is_some() && s.expires_at.is_some())
            };
            sessions::wait_object(&tokens, &format!("tok-{i}"), "issued", issued, |t| format!("{t:?}")).await;
        }
    }
    let pki = &cp.pki;
    let (cert, key) =
        (std::fs::read(&pki.admission_client_cert).unwrap(), std::fs::read(&pki.admission_client_key).unwrap());
    // The webhook's own certificate's CA, as the apiserver trusts it.
    let ca = webhook.ca_bundle(cp).await;
    let http = hangar_e2e::gateway::https_client_trusting(&ca, Some((&cert, &key)));
    let url = format!("https://127.0.0.1:{}/validate/commands", webhook.port);
    let review = |i: u64| {
        let session = i as usize % SESSIONS;
        let (name, sandbox) = (format!("{prefix}-cmd-{i}"), format!("{prefix}-{session}"));
        let user = if as_tokens {
            json!({"username": format!("hangar:token:{NS}:tok-{session}"), "groups": ["hangar:session-tokens"]})
        } else {
            json!({"username": "bench"})
        };
        json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": format!("{prefix}-review-{i}"), "operation": "CREATE", "userInfo": user,
                "name": name, "namespace": NS,
                "kind": {"group": "hangar.dev", "version": "v1alpha1", "kind": "Command"},
                "resource": {"group": "hangar.dev", "version": "v1alpha1", "resource": "commands"},
                "object": {"apiVersion": "hangar.dev/v1alpha1", "kind": "Command",
                           "metadata": {"name": name, "namespace": NS, "uid": format!("{prefix}-uid-{i}")},
                           "spec": {"sandbox": sandbox, "argv": ["true"]}},
            }
        })
    };
    // Warm the connection pool.
    for i in 0..20u64 {
        http.post(&url).json(&review(1_000_000 + i)).send().await.unwrap();
    }
    settle().await;
    // The floor on this machine at this moment: the same rate of reviews
    // through the same connection pool and TLS, of an update the webhook
    // answers without deciding anything (a dry run of a Sandbox update).
    let baseline = |i: u64| {
        json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": format!("{prefix}-baseline-{i}"), "operation": "UPDATE", "userInfo": {"username": "bench"},
                "name": format!("{prefix}-0"), "namespace": NS, "dryRun": true,
                "kind": {"group": "hangar.dev", "version": "v1alpha1", "kind": "Sandbox"},
                "resource": {"group": "hangar.dev", "version": "v1alpha1", "resource": "sandboxes"},
                "object": sessions::sandbox(&format!("{prefix}-0"), "commands", json!({})),
                "oldObject": sessions::sandbox(&format!("{prefix}-0"), "commands", json!({})),
            }
        })
    };
    let sandboxes_url = format!("https://127.0.0.1:{}/validate/sandboxes", webhook.port);
    let (floor, _, _) = paced(&http, &sandboxes_url, &baseline, rate, seconds).await;
    let load_before = load_average();
    let (micros, allowed, started) = paced(&http, &url, &review, rate, seconds).await;
    let ec2_calls = stack.ec2_proxy.calls_since(started);
    let total = rate * seconds;
    let elapsed = started.elapsed().as_secs_f64();
    let load_after = load_average();
    // Their nodes go, so the next phase stands on as many sessions.
    end_all(stack, &boxes, &(0..SESSIONS).map(|i| format!("{prefix}-{i}")).collect::<Vec<_>>()).await;
    let ms = |us: u64| us as f64 / 1000.0;
    println!();
    println!(
        "webhook admission at a steady rate: {total} reviews over {SESSIONS} sessions in {elapsed:.1} s \
         ({:.0} per second), {allowed} admitted; load average {load_before} before, {load_after} after",
        total as f64 / elapsed
    );
    println!();
    println!("| figure | p50 | p90 | p99 | max | target |");
    println!("| --- | --- | --- | --- | --- | --- |");
    let row = |figure: String, us: &[u64], target: &str| {
        let p = |q: f64| ms(pct(us.to_vec(), q));
        let max = ms(*us.iter().max().unwrap_or(&0));
        println!("| {figure} | {:.2} | {:.2} | {:.2} | {max:.2} | {target} |", p(0.5), p(0.9), p(0.99));
    };
    row(format!("baseline: a review answered without a decision, {rate}/s (ms)"), &floor, "");
    let scope = if as_tokens { ", as session tokens (scope check)" } else { "" };
    row(format!("one review decided, {rate}/s{scope} (ms)"), &micros, "p99 < 5");
    println!();
    println!("EC2 endpoint calls meanwhile (operator and node simulator): {ec2_calls:?}");
}

/// Ends the sessions `names` and waits until each has ended.
async fn end_all(stack: &LocalStack, boxes: &Api<Sandbox>, names: &[String]) {
    for name in names {
        sessions::set_state(boxes, name, "Ended").await.unwrap();
    }
    for name in names {
        sessions::wait_phase(stack, boxes, name, hangar_crds::Phase::Ended).await;
    }
}

/// Sends `body(i)` to `url` at `rate` per second for `seconds`; each
/// review's time to its answer (µs), how many were allowed, and when the
/// first was sent.
async fn paced(
    http: &reqwest::Client,
    url: &str,
    body: &dyn Fn(u64) -> serde_json::Value,
    rate: u64,
    seconds: u64,
) -> (Vec<u64>, usize, Instant) {
    let mut tick = tokio::time::interval(std::time::Duration::from_micros(1_000_000 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..rate * seconds {
        tick.tick().await;
        let (http, url, body) = (http.clone(), url.to_owned(), body(i));
        tasks.push(tokio::spawn(async move {
            let t = Instant::now();
            let r = http.post(&url).json(&body).send().await.expect("review");
            let v: serde_json::Value = r.json().await.expect("answer");
            (t.elapsed().as_micros() as u64, v["response"]["allowed"].as_bool() == Some(true))
        }));
    }
    let mut micros = Vec::new();
    let mut allowed = 0;
    for t in tasks {
        let (us, ok) = t.await.unwrap();
        micros.push(us);
        allowed += usize::from(ok);
    }
    (micros, allowed, started)
}

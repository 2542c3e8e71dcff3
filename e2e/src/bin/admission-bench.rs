//! Admission benchmark (`make bench`): how fast the admission webhook
//! answers a burst of Command creates for one session, with the limits
//! exact. Runs a control plane and the webhook only (a Sandbox without a
//! status has not ended, so its commands are admitted and stay queued).
//!
//! - baseline: one Command create at a time (the apiserver round trip with
//!   one admission), median of 20;
//! - burst: 64 creates for one new session sent at once, time until the
//!   last is answered; the 65th then is refused (`sandbox_command_limit`).
//!
//! Prints the load average before and after, medians over the runs, and
//! the burst as a ratio to the baseline.
//! `admission-bench [RUNS]` (default 7).

use std::time::Instant;

use futures::future::join_all;
use hangar_crds::{Command, Sandbox};
use hangar_e2e::ControlPlane;
use hangar_e2e::bench::pct;
use hangar_e2e::commands::sh;
use hangar_e2e::sessions::{self, ensure_namespace};
use hangar_e2e::webhook::WebhookProcess;
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
    let runs: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(7);
    let cp = ControlPlane::start().expect("control plane");
    let webhook = WebhookProcess::start(&cp).expect("webhook");
    webhook.register(&cp).expect("register the webhook");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(run(&cp, runs));
}

async fn run(cp: &ControlPlane, runs: usize) {
    let client = cp.client().await.unwrap();
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
            let (commands, cmd) = (commands.clone(), sh(&format!("{name}-{i}"), &name, "true"));
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

    let base = pct(single.clone(), 0.5).max(1);
    let burst = pct(bursts.clone(), 0.5);
    println!();
    println!(
        "hangar admission benchmark: control plane + webhook, 2 cores, load average {load_before} before, {load_after} after"
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

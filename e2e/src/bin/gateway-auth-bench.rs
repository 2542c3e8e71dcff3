//! The gateway's auth overhead per request (`make bench`): a control plane
//! and the gateway only (a Sandbox with no operator is enough for the
//! session route). Sequential requests over one kept-alive connection:
//!
//! - no auth: `GET /healthz`;
//! - a known token: `GET /v1/sandboxes/{id}`, its TokenReview and
//!   SubjectAccessReview answers cached;
//! - a new token: the first request of each of 30 members (a TokenReview
//!   and a SubjectAccessReview on the way);
//! - a session token: `GET /v1/sandboxes/{id}` with `hgt_…` and a fresh
//!   `Hangar-Proof` each time (made before the clock starts);
//! - in process: the token's digest and the proof's verification alone
//!   (`hangar_keys`), what each session-token request pays on top.
//!
//! Prints p50 and p99 of each and the overhead over no auth.
//! `gateway-auth-bench [REQUESTS]` (default 500).

use std::time::Instant;

use hangar_crds::Sandbox;
use hangar_e2e::ControlPlane;
use hangar_e2e::bench::pct;
use hangar_e2e::gateway::{GatewayClient, GatewayProcess, member_token};
use hangar_e2e::operator::SYSTEM_NAMESPACE;
use hangar_e2e::sessions::{self, ensure_namespace};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, ObjectMeta, PostParams};
use serde_json::json;

const NS: &str = "auth-bench";
const NEW_TOKENS: usize = 30;

fn main() {
    hangar_e2e::init_tracing();
    let requests: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(500);
    let cp = ControlPlane::start().expect("control plane");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    // The gateway waits for the output key-encryption key (the operator's).
    rt.block_on(async {
        let client = cp.client().await.unwrap();
        ensure_namespace(&client, SYSTEM_NAMESPACE).await;
        let secrets: Api<Secret> = Api::namespaced(client, SYSTEM_NAMESPACE);
        let kek = Secret {
            metadata: ObjectMeta {
                name: Some(hangar_crds::output_keys::OUTPUT_KEK_SECRET.into()),
                ..Default::default()
            },
            data: Some([("key".to_owned(), ByteString(hangar_output::random_bytes::<32>().unwrap().to_vec()))].into()),
            ..Default::default()
        };
        secrets.create(&PostParams::default(), &kek).await.unwrap();
    });
    let dir = cp.dir().join("output");
    let unlimited = [("HANGAR_GATEWAY_CALLER_RATE", "100000"), ("HANGAR_GATEWAY_CALLER_BURST", "100000")];
    let gateway = GatewayProcess::start_with(&cp, &dir, &unlimited).expect("gateway");
    rt.block_on(run(&cp, &gateway, requests));
}

async fn timed(n: usize, mut call: impl AsyncFnMut() -> u16) -> Vec<u64> {
    let mut micros = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        assert_eq!(call().await, 200);
        micros.push(t.elapsed().as_micros() as u64);
    }
    micros
}

async fn run(cp: &ControlPlane, gateway: &GatewayProcess, requests: usize) {
    let client = cp.client().await.unwrap();
    ensure_namespace(&client, NS).await;
    let boxes: Api<Sandbox> = Api::namespaced(client, NS);
    let s = boxes.create(&PostParams::default(), &sessions::sandbox("box", "commands", json!({}))).await.unwrap();
    let sid = s.uid().unwrap();
    let gw = GatewayClient::new(cp, gateway.port);
    let member = member_token(cp, NS, "dev", "get,list,create");
    gw.wait_known(&sid, &member).await;
    let fresh: Vec<String> = (0..NEW_TOKENS).map(|i| member_token(cp, NS, &format!("m{i}"), "get")).collect();
    let path = format!("/v1/sandboxes/{sid}");

    // Warm the connection.
    for _ in 0..20 {
        gw.call("GET", "/healthz", None, None, &[]).await;
    }
    let none = timed(requests, async || gw.call("GET", "/healthz", None, None, &[]).await.0).await;
    let cached = timed(requests, async || gw.get(&path, &member).await.0).await;
    let creds = hangar_e2e::gateway::mint_token(&gw, &member, &sid, "bench", &["read"], 3600).await;
    let url = format!("{}{path}", gw.proof_base());
    let proofs: Vec<String> = (0..requests).map(|_| creds.proof("GET", &url)).collect();
    let mut next = proofs.iter();
    let session_token = timed(requests, async || {
        let proof = next.next().expect("a proof per request");
        gw.call("GET", &path, Some(&creds.token), None, &[("Hangar-Proof", proof)]).await.0
    })
    .await;
    let in_process = verify_in_process(requests * 4);
    let mut new = Vec::new();
    for token in &fresh {
        let t = Instant::now();
        assert_eq!(gw.get(&path, token).await.0, 200);
        new.push(t.elapsed().as_micros() as u64);
    }

    let ms = |us: u64| us as f64 / 1000.0;
    let base = pct(none.clone(), 0.5);
    println!();
    println!("gateway auth overhead: control plane + gateway, 2 cores, sequential requests on one connection");
    println!();
    println!("| request | p50 (ms) | p99 (ms) | samples | overhead over no auth, p50 (ms) | p50 ÷ no auth p50 |");
    println!("| --- | --- | --- | --- | --- | --- |");
    for (what, v) in [
        ("GET /healthz, no auth", &none),
        ("GET a session, known token (answers cached)", &cached),
        ("GET a session, new token (TokenReview + SubjectAccessReview)", &new),
        ("GET a session, session token + Hangar-Proof", &session_token),
        ("in process: token digest + proof verification (no request)", &in_process),
    ] {
        let p50 = pct(v.clone(), 0.5);
        println!(
            "| {what} | {:.2} | {:.2} | {} | {:.2} | {:.2} |",
            ms(p50),
            ms(pct(v.clone(), 0.99)),
            v.len(),
            ms(p50.saturating_sub(base)),
            p50 as f64 / base.max(1) as f64
        );
    }
}

/// The digest of the token and the verification of a proof, as the
/// gateway does for each session-token request (microseconds each).
fn verify_in_process(n: usize) -> Vec<u64> {
    use hangar_keys::proof::{self, PublicKey, Signer};
    let signer = Signer::generate();
    let (x, y) = signer.jwk_xy();
    let token = "hgt_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    let url = "https://gw.example/v1/sandboxes/s/commands";
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let proofs: Vec<String> = (0..n).map(|i| signer.proof("POST", url, token, now, &format!("j{i}"))).collect();
    let mut window = proof::ReplayWindow::new(n + 1);
    proofs
        .iter()
        .map(|p| {
            let t = Instant::now();
            let _digest = hangar_keys::token::digest(token);
            let key = PublicKey { kty: "EC", crv: "P-256", x: &x, y: &y };
            let v = proof::verify(p, key, proof::Request { method: "POST", url, token, now }).expect("valid");
            window.claim(&v.jti, now).expect("fresh");
            t.elapsed().as_micros() as u64
        })
        .collect()
}

//! Workspace key hand-over benchmark (release build; `make bench`): a
//! worker's two calls to the operator's key service (a nonce, then the key
//! with the instance identity document), timed at the caller over TLS
//! against the local stack, for a running session. Each key request runs
//! the whole check: the nonce, the PKCS#7 signature under the regional
//! certificate, a Sandbox read, a DescribeInstances, the session key's
//! Secret read and unsealing. The nonce call alone is the floor (one TLS
//! request to the same listener), so the ratio is what the checks cost.
//!
//! `key-handover-bench [N]`: N hand-overs (default 200).

use std::time::Instant;

use hangar_crds::{Phase, Sandbox};
use hangar_e2e::bench::{pct, report};
use hangar_e2e::imds::InstanceIdentity;
use hangar_e2e::sessions::{ensure_namespace, sandbox, wait_phase};
use hangar_e2e::workspace_keys::{KeyClient, request};
use hangar_e2e::{ControlPlane, LocalStack, StackOptions};
use kube::api::{Api, PostParams};

fn main() {
    hangar_e2e::install_crypto_provider();
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(200);
    let cp = ControlPlane::start().expect("control plane");
    let stack = LocalStack::start(cp, StackOptions::default()).expect("local stack");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async {
        let client = stack.cp.client().await.expect("client");
        ensure_namespace(&client, "bench").await;
        let boxes: Api<Sandbox> = Api::namespaced(client, "bench");
        boxes.create(&PostParams::default(), &sandbox("box", "commands", serde_json::json!({}))).await.expect("create");
        let s = wait_phase(&stack, &boxes, "box", Phase::Running).await;
        let instance = s.status.as_ref().and_then(|st| st.instance_id.clone()).expect("instance");
        let identity = InstanceIdentity::describe(&stack.ec2_endpoint(), &instance).await;
        let kc = KeyClient::new(&stack);
        // Signed once: a worker reads the signature once per boot.
        let mut body = request(&kc, &s, &identity, &stack.identity_authority).await;
        let (mut nonces, mut handovers, mut totals) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..n {
            let t0 = Instant::now();
            let nonce = kc.nonce().await;
            let t1 = Instant::now();
            body["nonce"] = serde_json::Value::String(nonce);
            let (status, key) = kc.ask(&body).await;
            let t2 = Instant::now();
            assert_eq!(status, 200, "granted");
            assert_eq!(key.map(|k| k.len()), Some(64));
            nonces.push((t1 - t0).as_micros() as u64);
            handovers.push((t2 - t1).as_micros() as u64);
            totals.push((t2 - t0).as_micros() as u64);
        }
        report("nonce request (the floor: one TLS request)", "µs", &nonces);
        report("key request (every check, the key unsealed)", "µs", &handovers);
        report("hand-over (nonce + key)", "µs", &totals);
        let ratio = pct(handovers.clone(), 0.5) as f64 / pct(nonces.clone(), 0.5).max(1) as f64;
        println!("key request / nonce request, medians: {ratio:.1}x");
    });
}

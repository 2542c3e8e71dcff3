//! `/metrics` of every hangar process — operator, webhook, gateway and a
//! session node's worker — is valid exposition text (read back with a
//! Prometheus text parser), has no series twice, and counts what this test
//! made them do.

use std::collections::HashSet;

use hangar_crds::CommandPhase;
use hangar_e2e::commands::{self as cmds, sh, wait_command_phase};
use hangar_e2e::gateway::member_token;
use hangar_e2e::sessions::{self};
use hangar_e2e::shared_stack;
use kube::ResourceExt;

/// Parses `text`, fails on a repeated series, and returns the samples.
fn parse(who: &str, text: &str) -> Vec<prometheus_parse::Sample> {
    assert!(!text.is_empty(), "{who}: empty /metrics");
    let lines = text.lines().map(|l| Ok(l.to_owned()));
    let scrape =
        prometheus_parse::Scrape::parse(lines).unwrap_or_else(|e| panic!("{who}: not exposition text: {e}\n{text}"));
    let mut seen = HashSet::new();
    for s in &scrape.samples {
        let mut labels: Vec<String> = s.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        labels.sort();
        assert!(
            seen.insert((s.metric.clone(), labels.clone())),
            "{who}: series {} {labels:?} twice:\n{text}",
            s.metric
        );
    }
    scrape.samples
}

/// The sum of every sample of `metric` whose labels include `with`.
fn total(samples: &[prometheus_parse::Sample], metric: &str, with: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.metric == metric && with.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => 0.0,
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_process_serves_parseable_metrics_without_duplicate_series() {
    let stack = shared_stack();
    let ns = "metrics";
    let (_, commands, s) = sessions::running_box(stack, ns).await;
    cmds::create(&commands, &sh("hello", "box", "echo hello")).await;
    wait_command_phase(stack, &commands, "hello", CommandPhase::Exited).await;
    let member = member_token(&stack.cp, ns, "dev", "get,list");
    let gw = stack.gateway_client();
    gw.wait_known(&s.uid().unwrap(), &member).await;
    let (status, _) = gw.get(&format!("/v1/sandboxes/{}", s.uid().unwrap()), &member).await;
    assert_eq!(status, 200);

    // Anyone who can reach an admin port reads /metrics: no series names a
    // tenant's session.
    let sid = s.uid().unwrap();
    for (who, text) in [
        ("operator", stack.operator().metrics()),
        ("webhook", stack.webhook.metrics()),
        ("gateway", stack.gateway.metrics()),
    ] {
        assert!(!text.contains(&sid) && !text.contains(&format!("{ns}/")), "{who} /metrics names a session:\n{text}");
    }
    let operator = parse("operator", &stack.operator().metrics());
    assert!(total(&operator, "hangar_reconciles_total", &[]) >= 1.0);
    assert!(total(&operator, "hangar_ec2_mutating_calls_total", &[]) >= 1.0, "the launch called EC2");

    let webhook = parse("webhook", &stack.webhook.metrics());
    assert!(total(&webhook, "hangar_webhook_admissions_total", &[("kind", "Command"), ("decision", "allowed")]) >= 1.0);

    let gateway = parse("gateway", &stack.gateway.metrics());
    assert!(total(&gateway, "hangar_gateway_http_requests_total", &[("method", "GET"), ("status", "200")]) >= 1.0);

    let node = s.status.as_ref().and_then(|st| st.node_name.clone()).expect("a node");
    let worker = parse("worker", &stack.sim.worker_metrics(&node));
    assert!(total(&worker, "hangar_worker_commands_finished_total", &[("phase", "exited")]) >= 1.0);
}

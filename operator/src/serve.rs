//! /healthz, /readyz and /metrics (Prometheus text) on a plain TCP listener:
//! three fixed routes do not need a web framework.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::context::Context;

/// Serves from start-up: /healthz at once (the process is alive), /readyz
/// and /metrics once `ready` holds the context (EC2 described, caches warm).
pub async fn serve(listener: TcpListener, ready: Arc<std::sync::OnceLock<Arc<Context>>>) {
    loop {
        let Ok((mut sock, _)) = listener.accept().await else { continue };
        let ready = ready.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            let n = sock.read(&mut buf).await.unwrap_or(0);
            let req = String::from_utf8_lossy(&buf[..n]);
            let path = req.split_whitespace().nth(1).unwrap_or("/");
            let (code, body) = match (path, ready.get()) {
                ("/healthz", _) => ("200 OK", "ok\n".to_owned()),
                ("/readyz", Some(_)) => ("200 OK", "ok\n".to_owned()),
                ("/metrics", Some(ctx)) => ("200 OK", metrics(ctx)),
                ("/readyz" | "/metrics", None) => ("503 Service Unavailable", "starting\n".to_owned()),
                _ => ("404 Not Found", "not found\n".to_owned()),
            };
            let resp = format!(
                "HTTP/1.1 {code}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = sock.write_all(resp.as_bytes()).await;
        });
    }
}

fn metrics(ctx: &Context) -> String {
    let c = &ctx.ec2.calls;
    let mut out = String::new();
    let mut line = |name: &str, v: u64| out.push_str(&format!("{name} {v}\n"));
    line("hangar_ec2_mutating_calls_total", c.mutating.load(Ordering::Relaxed));
    line("hangar_ec2_describe_instances_calls_total", c.describe_instances.load(Ordering::Relaxed));
    line("hangar_ec2_describe_other_calls_total", c.describe_other.load(Ordering::Relaxed));
    line("hangar_ec2_throttled_total", c.throttled.load(Ordering::Relaxed));
    line("hangar_reconciles_total", ctx.metrics.reconciles.load(Ordering::Relaxed));
    line("hangar_reconcile_errors_total", ctx.metrics.reconcile_errors.load(Ordering::Relaxed));
    line("hangar_watched_instances", ctx.instances.len() as u64);
    if let Ok(s) = ctx.metrics.samples.lock() {
        for (sandbox, at) in &s.run_instances_at_ms {
            out.push_str(&format!("hangar_run_instances_at_ms{{sandbox=\"{sandbox}\"}} {at}\n"));
        }
        for (name, samples) in [
            ("hangar_node_ready_to_running_ms", &s.node_ready_to_running_ms),
            ("hangar_event_to_running_ms", &s.event_to_running_ms),
            ("hangar_workspace_closed_to_stop_ms", &s.workspace_closed_to_stop_ms),
        ] {
            // Raw samples, one per line, for the benchmark to take quantiles.
            for v in samples.iter() {
                out.push_str(&format!("{name}{{sample=\"1\"}} {v}\n"));
            }
        }
    }
    out
}

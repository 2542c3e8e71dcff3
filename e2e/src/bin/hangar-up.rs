//! `make up`: builds what is missing, starts the local stack (etcd,
//! kube-apiserver, moto, the admission webhook, the operator, the gateway
//! and the node simulator), prints how to reach it, and keeps it running
//! until Ctrl-C. `make up NODE=real` (`HANGAR_UP_NODE=real`): hangar
//! installed by Helm onto a real kubelet from its own images, sessions on
//! real session nodes (`docs/real-node.md`).

use std::io::Write;
use std::process::ExitCode;

use hangar_e2e::paths::cache_dir;
use hangar_e2e::process::RunDir;
use hangar_e2e::{ControlPlane, LocalStack, StackOptions};

fn main() -> ExitCode {
    hangar_e2e::init_tracing();
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hangar-up: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> hangar_e2e::Result<()> {
    // HANGAR_UP_DIR lets a test run its own stack beside a developer's.
    let dir = std::env::var_os("HANGAR_UP_DIR").map(Into::into).unwrap_or_else(|| cache_dir().join("up"));
    if std::env::var("HANGAR_UP_NODE").as_deref() == Ok("real") {
        return run_on_real_nodes(dir);
    }
    eprintln!("hangar-up: starting etcd and kube-apiserver (state in {})", dir.display());
    let cp = ControlPlane::start_in(RunDir::fixed(dir.clone())?, true)?;
    eprintln!("hangar-up: control plane ready at {}; CRDs installed", cp.server);
    eprintln!("hangar-up: starting moto (EC2 + S3), the webhook, the operator, the gateway and the node simulator");
    // EC2's in-between states (pending, stopping, shutting-down) last 1 s,
    // so `kubectl get sbx -w` shows launching, pausing and resuming as a
    // real cluster would (moto's own changes are instant).
    let opts = StackOptions { ec2_transitions: Some(std::time::Duration::from_secs(1)), ..Default::default() };
    let mut stack = LocalStack::start(cp, opts)?;
    // The examples run images from the loopback registry (by digest: the
    // images are reproducible); the operator's preflight reads them there.
    for image in hangar_e2e::registry::example_images() {
        eprintln!("hangar-up: pushed {}", stack.registry.push(&image));
    }
    eprintln!("hangar-up: waiting for the operator to be ready (organisation key loaded, EC2 described)");
    stack.operator().wait_ready(std::time::Duration::from_secs(180))?;

    println!();
    println!("hangar local stack is up. In another shell:");
    println!();
    println!("  export KUBECONFIG={}", stack.cp.kubeconfig.display());
    println!("  export AWS_ENDPOINT_URL={}", stack.ec2_endpoint());
    println!("  # images: {} serves {}", stack.registry.endpoint(), hangar_e2e::registry::REGISTRY_HOST);
    println!("  kubectl get crd | grep hangar.dev");
    println!("  kubectl apply -f examples/");
    println!("  kubectl get sbx -w");
    println!("  kubectl get sbxcmd -w");
    println!();
    println!(
        "The session API (gateway) serves https://127.0.0.1:{} with the CA {}:",
        stack.gateway.port,
        stack.cp.pki.ca_cert.display()
    );
    println!(
        "  kubectl create serviceaccount me && kubectl create clusterrolebinding me --clusterrole=cluster-admin --serviceaccount=default:me"
    );
    // The gateway takes only tokens minted for its own audience.
    println!("  TOKEN=$(kubectl create token me --audience hangar-gateway)");
    println!("  ID=$(kubectl get sbx dev-box -o jsonpath='{{.status.sessionId}}')");
    println!(
        "  curl --cacert {} -H \"Authorization: Bearer $TOKEN\" https://127.0.0.1:{}/v1/sandboxes/$ID/attach",
        stack.cp.pki.ca_cert.display(),
        stack.gateway.port
    );
    println!("or with the hangar CLI (docs/cli.md):");
    println!(
        "  export HANGAR_GATEWAY=https://127.0.0.1:{} HANGAR_GATEWAY_CA={} HANGAR_GATEWAY_TOKEN=$TOKEN",
        stack.gateway.port,
        stack.cp.pki.ca_cert.display()
    );
    println!("  {} exec dev-box -- uname -m", hangar_e2e::operator::workspace_binary("hangar").display());
    println!();
    println!("Logs: {}/*.log. Ctrl-C stops everything.", dir.display());
    let _ = std::io::stdout().flush();

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    // Until Ctrl-C or SIGTERM; a part of the stack that dies is reported
    // (with its last log lines) and stops the rest.
    let died = rt.block_on(async {
        let shutdown = hangar_runtime::https::shutdown_signal();
        tokio::pin!(shutdown);
        let mut every = tokio::time::interval(std::time::Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = &mut shutdown => return None,
                _ = every.tick() => {
                    if let Err(e) = stack.check_alive() {
                        return Some(e);
                    }
                }
            }
        }
    });
    eprintln!("hangar-up: stopping");
    drop(stack);
    match died {
        None => Ok(()),
        Some(e) => Err(e),
    }
}

/// `make up NODE=real`: the real-node stack, until Ctrl-C or SIGTERM.
fn run_on_real_nodes(dir: std::path::PathBuf) -> hangar_e2e::Result<()> {
    use hangar_e2e::control_plane::Mode;
    use hangar_e2e::real_stack::RealStack;

    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    rt.block_on(async move {
        eprintln!("hangar-up: starting etcd, kube-apiserver and its controllers (state in {})", dir.display());
        let cp = ControlPlane::start_with(RunDir::fixed(dir.clone())?, false, Mode::Cluster)?;
        eprintln!("hangar-up: starting the registry, moto and a real node; helm install of hangar's images");
        let mut stack = RealStack::start(cp).await?;
        let shell = hangar_e2e::registry::shell_image().map(|i| stack.push(&i));
        let web = hangar_e2e::registry::web_companion_image().map(|i| stack.push(&i));

        println!();
        println!("hangar is up on a real node (every component a Pod; sessions on real session nodes).");
        println!("In another shell:");
        println!();
        println!("  export KUBECONFIG={}", stack.cp.kubeconfig.display());
        println!("  kubectl -n {} get pods -o wide", hangar_e2e::release::NAMESPACE);
        if let (Some(shell), Some(web)) = (&shell, &web) {
            println!("  kubectl create namespace demo");
            println!("  kubectl -n demo apply -f - <<EOF");
            println!("apiVersion: hangar.dev/v1alpha1");
            println!("kind: Sandbox");
            println!("metadata: {{name: box}}");
            println!("spec: {{mode: commands, image: {shell}, companions: [{{name: web, image: {web}}}]}}");
            println!("---");
            println!("apiVersion: hangar.dev/v1alpha1");
            println!("kind: Command");
            println!("metadata: {{name: hello}}");
            // The companion may still be starting: a few tries.
            let fetch =
                "for i in 1 2 3 4 5 6 7 8; do wget -qO- http://127.0.0.1:8080/ && exit 0; sleep 0.5; done; exit 1";
            println!("spec: {{sandbox: box, argv: [sh, -c, 'echo hello from the session; {fetch}']}}");
            println!("EOF");
            println!("  kubectl -n demo get sbx,sbxcmd -w");
        }
        if let Some(ca) = &stack.installed.gateway_ca {
            println!(
                "The session API (the gateway's Pod) serves https://{}:{} with the CA {}.",
                stack.node.ip,
                stack.installed.gateway_port,
                ca.display()
            );
        }
        println!("(The examples/ images are markers for the node simulator: on the real node a");
        println!("session runs the busybox image above.)");
        println!();
        println!("Logs: {}/*.log. Ctrl-C stops everything.", dir.display());
        let _ = std::io::stdout().flush();

        let shutdown = hangar_runtime::https::shutdown_signal();
        tokio::pin!(shutdown);
        let mut every = tokio::time::interval(std::time::Duration::from_millis(500));
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                _ = every.tick() => {
                    // Each running instance boots its node; a stopped one
                    // loses it.
                    if let Err(e) = stack.follow().await {
                        eprintln!("hangar-up: session nodes: {e}");
                    }
                }
            }
        }
        eprintln!("hangar-up: stopping");
        drop(stack);
        Ok(())
    })
}

//! The whole local stack: control plane, moto, the admission webhook, the
//! operator process, the gateway and the node simulator running real
//! workers.

use std::sync::{Mutex, MutexGuard, OnceLock};

use crate::control_plane::ControlPlane;
use crate::ec2_faults::FaultProxy;
use crate::error::Result;
use crate::gateway::{GatewayClient, GatewayProcess};
use crate::moto::Moto;
use crate::node_sim::{NodeSimulator, SimConfig};
use crate::operator::{CLUSTER_NAME, KeyService, OperatorProcess, SYSTEM_NAMESPACE, workspace_binary};
use crate::registry::Registry;
use crate::webhook::WebhookProcess;

pub struct LocalStack {
    // Drop order: simulator (workers) and operator before moto and the
    // control plane they talk to.
    pub sim: NodeSimulator,
    operator: Mutex<OperatorProcess>,
    pub gateway: GatewayProcess,
    /// A second gateway replica, peer of the first.
    pub gateway_replica: GatewayProcess,
    pub webhook: WebhookProcess,
    /// In front of moto: the operator and the node simulator both go
    /// through it. It plays EC2's in-between states when the options ask.
    pub ec2_proxy: FaultProxy,
    pub moto: Moto,
    /// The OCI registry the images are read from (`registry.hangar.test`).
    pub registry: Registry,
    /// Signs the simulated instances' identity documents (the stand-in for
    /// the region's AWS certificate, which the operator trusts).
    pub identity_authority: crate::imds::IdentityAuthority,
    /// The operator's workspace key service.
    pub key_service: KeyService,
    pub cp: ControlPlane,
}

/// Settings a test can change for its own stack.
#[derive(Default, Clone)]
pub struct StackOptions {
    /// Extra environment for the operator, e.g. HANGAR_PAUSE_GRACE_SECONDS.
    pub operator_env: Vec<(String, String)>,
    /// How often simulated workers renew their heartbeat (default 500 ms).
    pub worker_heartbeat_ms: Option<u64>,
    /// Put the fault proxy in front of moto, with instances spending this
    /// long in pending, stopping and shutting-down (moto's own changes are
    /// instant). `Some(Duration::ZERO)`: the proxy alone, for its faults.
    pub ec2_transitions: Option<std::time::Duration>,
    /// More registry hosts for the operator's preflight, `(host, url)`,
    /// beside `registry.hangar.test` (the stack's own registry).
    pub registry_endpoints: Vec<(String, String)>,
    /// The EC2 endpoint the operator calls instead of moto (the scale
    /// benchmark's stub); moto and the node simulator still run, idle.
    pub operator_ec2_endpoint: Option<String>,
}

impl LocalStack {
    pub fn start(cp: ControlPlane, opts: StackOptions) -> Result<Self> {
        let moto = Moto::start(Some(cp.dir()))?;
        let registry = Registry::start(cp.dir(), None)?;
        let pushed = registry.push(&crate::registry::test_agent_image());
        assert_eq!(pushed, crate::sessions::TEST_IMAGE, "the test image is reproducible: update sessions::TEST_IMAGE");
        let status = cp
            .kubectl()
            .args(["create", "namespace", SYSTEM_NAMESPACE])
            .output()
            .map_err(crate::error::io("kubectl"))?;
        if !status.status.success() && !String::from_utf8_lossy(&status.stderr).contains("AlreadyExists") {
            tracing::warn!("create namespace {SYSTEM_NAMESPACE}: {}", String::from_utf8_lossy(&status.stderr));
        }
        apply_chart_parts(&cp, &CHART_IDENTITIES_AND_POLICIES)?;
        let identity_authority = crate::imds::IdentityAuthority::generate(&cp.dir().join("pki"), "regional-identity")?;
        let key_service = KeyService::generate(&cp.dir().join("pki"), identity_authority.cert.clone())?;
        let webhook = WebhookProcess::start(&cp, key_service.decider_for_webhook(&cp, cp.dir())?)?;
        let env: Vec<(&str, &str)> = opts.operator_env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        // Always in front of moto: it plays the launch time EC2 gives each
        // start, which the workspace key hand-over checks.
        let ec2_proxy = FaultProxy::start_with_transitions(moto.port, opts.ec2_transitions.unwrap_or_default());
        let ec2_endpoint = ec2_proxy.endpoint();
        let registries = std::iter::once(format!("{}={}", crate::registry::REGISTRY_HOST, registry.endpoint()))
            .chain(opts.registry_endpoints.iter().map(|(h, u)| format!("{h}={u}")))
            .collect::<Vec<_>>()
            .join(",");
        let operator_ec2 = opts.operator_ec2_endpoint.clone().unwrap_or_else(|| ec2_endpoint.clone());
        let operator = OperatorProcess::start(&cp, &operator_ec2, &registries, &key_service, &env)?;
        let mut replicas = GatewayProcess::start_replicas(&cp, &cp.dir().join("output"), 2)?.into_iter();
        let (gateway, gateway_replica) = (replicas.next().expect("replica 0"), replicas.next().expect("replica 1"));
        let sim = NodeSimulator::start(SimConfig {
            ec2_endpoint: ec2_endpoint.clone(),
            kubeconfig: cp.kubeconfig.clone(),
            worker_bin: workspace_binary("hangar-worker"),
            volumes_dir: cp.dir().join("volumes"),
            log_dir: cp.dir().to_path_buf(),
            nodes_dir: cp.dir().join("nodes"),
            output_dir: cp.dir().join("output"),
            supervisor_bin: workspace_binary("hangar-supervisor"),
            system_namespace: SYSTEM_NAMESPACE.into(),
            cluster_name: CLUSTER_NAME.into(),
            heartbeat_ms: opts.worker_heartbeat_ms.unwrap_or(500),
            identity_authority: identity_authority.clone(),
            workspace_key_url: key_service.url(),
            workspace_key_ca: key_service.ca.clone(),
            ec2_touched: Some(ec2_proxy.touched_instances()),
        });
        Ok(Self {
            sim,
            operator: Mutex::new(operator),
            gateway,
            gateway_replica,
            webhook,
            ec2_proxy,
            moto,
            registry,
            identity_authority,
            key_service,
            cp,
        })
    }

    /// The EC2 endpoint the operator talks to (the proxy).
    pub fn ec2_endpoint(&self) -> String {
        self.ec2_proxy.endpoint()
    }

    /// The fault proxy in front of moto.
    pub fn ec2_proxy(&self) -> &FaultProxy {
        &self.ec2_proxy
    }

    /// The output store the simulated workers write to.
    pub fn output_store(&self) -> hangar_output::OutputStore {
        hangar_output::OutputStore::local(&self.cp.dir().join("output")).expect("output store")
    }

    /// The `hangar` CLI pointed at this stack: its kubeconfig, the
    /// gateway and the CA to trust for it (a gateway token still to give).
    pub fn hangar_cli(&self) -> std::process::Command {
        let mut cmd = std::process::Command::new(crate::operator::workspace_binary("hangar"));
        cmd.env("KUBECONFIG", &self.cp.kubeconfig)
            .env("HANGAR_GATEWAY", format!("https://127.0.0.1:{}", self.gateway.port))
            .env("HANGAR_GATEWAY_CA", &self.cp.pki.ca_cert);
        cmd
    }

    /// An HTTPS client for the gateway.
    pub fn gateway_client(&self) -> GatewayClient {
        GatewayClient::new(&self.cp, self.gateway.port)
    }

    /// An HTTPS client for the second gateway replica.
    pub fn gateway_replica_client(&self) -> GatewayClient {
        GatewayClient::of_replica(&self.cp, self.gateway_replica.port, self.gateway.port)
    }

    /// `Err` naming the first part of the stack whose process has exited,
    /// with its log tail.
    pub fn check_alive(&mut self) -> Result<()> {
        self.moto.check_alive()?;
        self.registry.check_alive()?;
        self.webhook.check_alive()?;
        self.gateway.check_alive()?;
        self.gateway_replica.check_alive()?;
        self.operator.get_mut().unwrap_or_else(|p| p.into_inner()).check_alive()?;
        self.cp.check_alive()
    }

    pub fn operator(&self) -> MutexGuard<'_, OperatorProcess> {
        self.operator.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One stack per test binary, started on first use; tests isolate
/// themselves by namespace.
pub fn shared_stack() -> &'static LocalStack {
    static STACK: OnceLock<LocalStack> = OnceLock::new();
    STACK.get_or_init(|| {
        let cp = ControlPlane::start().unwrap_or_else(|e| panic!("control plane: {e}"));
        LocalStack::start(cp, StackOptions::default()).unwrap_or_else(|e| panic!("local stack: {e}"))
    })
}

/// The chart's templates that give the simulated workers the identity they
/// have in a real cluster (the ServiceAccounts, the worker's RBAC and its
/// node restriction policy) and keep foreign Pods off session nodes.
pub const CHART_IDENTITIES_AND_POLICIES: [&str; 6] = [
    "templates/serviceaccounts.yaml",
    "templates/command-sender.yaml",
    "templates/rbac-worker.yaml",
    "templates/rbac-session-tokens.yaml",
    "templates/worker-node-restriction.yaml",
    "templates/session-node-restriction.yaml",
];

/// Renders `templates` of the chart (release `hangar` in the system
/// namespace) and applies them, so the local stack runs on the chart's
/// own objects rather than a copy.
pub fn apply_chart_parts(cp: &ControlPlane, templates: &[&str]) -> Result<()> {
    let chart = crate::paths::repo_root().join("charts/hangar");
    let mut helm = cp.helm()?;
    helm.args(["template", "hangar"]).arg(&chart).args(["-n", SYSTEM_NAMESPACE]);
    for t in templates {
        helm.args(["--show-only", t]);
    }
    let rendered = helm.output().map_err(crate::error::io("helm template"))?;
    let fail = |what: &str, out: &std::process::Output| crate::error::HarnessError::NotReady {
        what: what.into(),
        seconds: 0,
        log_tail: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    if !rendered.status.success() {
        return Err(fail("helm template of the chart's worker identity", &rendered));
    }
    let path = cp.dir().join("chart-parts.yaml");
    std::fs::write(&path, &rendered.stdout).map_err(crate::error::io("write chart parts"))?;
    let applied = cp.kubectl().args(["apply", "-f"]).arg(&path).output().map_err(crate::error::io("kubectl apply"))?;
    if !applied.status.success() {
        return Err(fail("kubectl apply of the chart's worker identity", &applied));
    }
    Ok(())
}

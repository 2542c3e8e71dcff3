//! kubernetes-sigs/agent-sandbox's controller, built from its Go module,
//! on the local control plane: the side-by-side benchmark runs it beside
//! hangar's figures. Out of the cluster it needs leader election off, and
//! its metrics and probe ports bound to loopback (their defaults bind every
//! interface).

use std::process::Command;
use std::time::Duration;

use kube::api::{ApiResource, GroupVersionKind};

use crate::build::{go_binary, go_share};
use crate::control_plane::ControlPlane;
use crate::error::{HarnessError, Result};
use crate::process::{ChildProcess, RunDir, free_port, http_get, run, wait_until};

pub struct AgentSandboxController {
    process: ChildProcess,
    pub metrics_port: u16,
    _dir: RunDir,
}

/// `sandboxes.agents.x-k8s.io/v1beta1`.
pub fn sandbox_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("agents.x-k8s.io", "v1beta1", "Sandbox"), "sandboxes")
}

impl AgentSandboxController {
    /// Installs its Sandbox CRD (server-side: it is too large for a
    /// client-side apply's annotation), waits until it is Established, then
    /// starts the controller and waits until it is ready.
    pub fn start(cp: &ControlPlane) -> Result<Self> {
        let bin = go_binary("agent-sandbox-controller")?;
        let share = go_share("agent-sandbox-controller", "agent-sandbox", "AGENT_SANDBOX_VERSION")?;
        let kubectl = |args: &[&str]| run(cp.kubectl().args(args));
        let manifest = share.join("sandboxes.yaml").display().to_string();
        kubectl(&["apply", "--server-side", "-f", &manifest])?;
        // Polled rather than `kubectl wait`, which fails outright while the
        // new CRD has no conditions at all yet.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let established = || -> Result<bool> {
            let crd: serde_json::Value =
                serde_json::from_str(&kubectl(&["get", "crd", "sandboxes.agents.x-k8s.io", "-o", "json"])?)
                    .unwrap_or_default();
            Ok(crd["status"]["conditions"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["type"] == "Established" && c["status"] == "True")))
        };
        // A failed read (the apiserver busy) is one more look, until the deadline.
        while !established().unwrap_or(false) {
            if std::time::Instant::now() > deadline {
                return Err(HarnessError::CrdNotEstablished("sandboxes.agents.x-k8s.io".into()));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let dir = RunDir::new("hangar-agent-sandbox")?;
        let (metrics_port, health_port) = (free_port(), free_port());
        let mut cmd = Command::new(bin);
        cmd.args([
            format!("--kubeconfig={}", cp.kubeconfig.display()),
            "--leader-elect=false".into(),
            format!("--metrics-bind-address=127.0.0.1:{metrics_port}"),
            format!("--health-probe-bind-address=127.0.0.1:{health_port}"),
            "--zap-log-level=error".into(),
        ]);
        let mut process = ChildProcess::spawn("agent-sandbox-controller", cmd, &dir.path.join("controller.log"))?;
        wait_until("agent-sandbox-controller /readyz", &mut process, Duration::from_secs(60), || {
            http_get(health_port, "/readyz").is_ok_and(|(s, _)| s == 200)
        })?;
        Ok(Self { process, metrics_port, _dir: dir })
    }

    pub fn pid(&self) -> u32 {
        self.process.id()
    }

    pub fn check_alive(&mut self) -> Result<()> {
        self.process.check_alive()
    }
}

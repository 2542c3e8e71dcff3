//! The operator as a real process (so tests can SIGKILL it mid-flight),
//! pointed at the local apiserver and moto.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::control_plane::ControlPlane;
use crate::error::Result;
use crate::process::{ChildProcess, free_port, http_get, wait_until};

/// A binary of this workspace, next to the running test or hangar-up.
pub fn workspace_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let mut dir = exe.parent().expect("exe dir").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let path = dir.join(name);
    assert!(path.exists(), "{} is missing: run `cargo build --workspace --bins` (make test does)", path.display());
    path
}

pub const SYSTEM_NAMESPACE: &str = "hangar-system";
pub const CLUSTER_NAME: &str = "hangar-local";

/// The operator's workspace key service: where it listens (a fixed port,
/// so workers find it across operator restarts), its TLS files and the
/// regional certificate identity documents are checked against.
#[derive(Clone, Debug)]
pub struct KeyService {
    pub port: u16,
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub regional_certificate: PathBuf,
}

impl KeyService {
    /// A serving certificate for 127.0.0.1 from a CA of its own, in `dir`.
    pub fn generate(dir: &std::path::Path, regional_certificate: PathBuf) -> Result<Self> {
        let ca = crate::pki::LocalCa::new("hangar-workspace-key-ca")?;
        let serving = ca.serving("hangar-workspace-keys", &["127.0.0.1", "localhost"])?;
        let write = |name: &str, body: &str| -> Result<PathBuf> {
            let path = dir.join(name);
            std::fs::write(&path, body).map_err(crate::error::io(format!("write {name}")))?;
            Ok(path)
        };
        Ok(Self {
            port: free_port(),
            ca: write("workspace-key-ca.crt", &ca.cert_pem())?,
            cert: write("workspace-key.crt", &serving.cert)?,
            key: write("workspace-key.key", &serving.key)?,
            regional_certificate,
        })
    }

    /// What a webhook needs to ask this service for command admissions:
    /// its URL, its CA and a token of the chart's webhook ServiceAccount
    /// (minted now, written to `dir`).
    pub fn decider_for_webhook(&self, cp: &ControlPlane, dir: &std::path::Path) -> Result<WebhookDecider> {
        let out = cp
            .kubectl()
            .args(["create", "token", WEBHOOK_SERVICE_ACCOUNT, "-n", SYSTEM_NAMESPACE, "--duration=48h"])
            .output()
            .map_err(crate::error::io("kubectl create token"))?;
        if !out.status.success() {
            return Err(crate::error::HarnessError::NotReady {
                what: "a token of the webhook's ServiceAccount".into(),
                seconds: 0,
                log_tail: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        let token_file = dir.join("webhook-token");
        std::fs::write(&token_file, &out.stdout).map_err(crate::error::io("write the webhook's token"))?;
        Ok(WebhookDecider { url: self.url(), ca: self.ca.clone(), token_file })
    }

    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }
}

/// The chart's webhook ServiceAccount (release `hangar`), whose identity
/// the operator answers command admissions for.
pub const WEBHOOK_SERVICE_ACCOUNT: &str = "hangar-webhook";

/// Where a webhook asks for command admissions (the operator's node
/// service), and as whom.
#[derive(Clone, Debug)]
pub struct WebhookDecider {
    pub url: String,
    pub ca: PathBuf,
    pub token_file: PathBuf,
}

pub struct OperatorProcess {
    process: Option<ChildProcess>,
    key_service: KeyService,
    /// Health (plain HTTP) and metrics (HTTPS, read as the scraper).
    pub admin_port: u16,
    pub metrics_port: u16,
    scraper: std::sync::Arc<crate::scrape::Scraper>,
    metrics_cert: (PathBuf, PathBuf),
    kubeconfig: PathBuf,
    ec2_endpoint: String,
    /// `HANGAR_REGISTRY_ENDPOINTS`: where the image preflight reads each
    /// registry host from (`registry.hangar.test=http://127.0.0.1:<port>`).
    registry_endpoints: String,
    log: PathBuf,
    extra_env: Vec<(String, String)>,
}

impl OperatorProcess {
    pub fn start(
        cp: &ControlPlane,
        ec2_endpoint: &str,
        registry_endpoints: &str,
        key_service: &KeyService,
        extra_env: &[(&str, &str)],
    ) -> Result<Self> {
        let mut op = Self {
            process: None,
            key_service: key_service.clone(),
            admin_port: 0,
            metrics_port: 0,
            scraper: crate::scrape::Scraper::of(cp)?,
            metrics_cert: (cp.pki.serving_cert.clone(), cp.pki.serving_key.clone()),
            kubeconfig: cp.kubeconfig.clone(),
            ec2_endpoint: ec2_endpoint.to_owned(),
            registry_endpoints: registry_endpoints.to_owned(),
            log: cp.dir().join("operator.log"),
            extra_env: extra_env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        };
        op.spawn()?;
        Ok(op)
    }

    fn spawn(&mut self) -> Result<()> {
        self.admin_port = free_port();
        self.metrics_port = free_port();
        let mut cmd = Command::new(workspace_binary("hangar-operator"));
        cmd.env("KUBECONFIG", &self.kubeconfig)
            .env("HANGAR_EC2_ENDPOINT", &self.ec2_endpoint)
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env("AWS_REGION", crate::ec2::REGION)
            .env("HANGAR_CLUSTER_NAME", CLUSTER_NAME)
            .env("POD_NAMESPACE", SYSTEM_NAMESPACE)
            .env("HANGAR_ADMIN_LISTEN", format!("127.0.0.1:{}", self.admin_port))
            .env("HANGAR_METRICS_LISTEN", format!("127.0.0.1:{}", self.metrics_port))
            .env("HANGAR_METRICS_TLS_CERT", &self.metrics_cert.0)
            .env("HANGAR_METRICS_TLS_KEY", &self.metrics_cert.1)
            .env("HANGAR_DESCRIBE_INTERVAL_MS", "300")
            .env("HANGAR_ORPHAN_SWEEP_SECONDS", "2")
            .env("HANGAR_DEBUG_SAMPLES", "true")
            .env("HANGAR_REGISTRY_ENDPOINTS", &self.registry_endpoints)
            .env("HANGAR_TEMPLATE_KEYS", crate::templates::trusted_keys_env())
            // The same store the workers write and the gateway reads: the
            // signed session certificates go there.
            .env("HANGAR_OUTPUT_STORE", self.log.with_file_name("output"))
            .env("HANGAR_WORKSPACE_KEY_LISTEN", format!("127.0.0.1:{}", self.key_service.port))
            .env(
                "HANGAR_ADMISSION_CALLERS",
                format!("system:serviceaccount:{SYSTEM_NAMESPACE}:{WEBHOOK_SERVICE_ACCOUNT}"),
            )
            .env("HANGAR_WORKSPACE_KEY_TLS_CERT", &self.key_service.cert)
            .env("HANGAR_WORKSPACE_KEY_TLS_KEY", &self.key_service.key)
            .env("HANGAR_INSTANCE_IDENTITY_CERTIFICATE", &self.key_service.regional_certificate)
            .env("RUST_LOG", std::env::var("HANGAR_OPERATOR_LOG").unwrap_or_else(|_| "info".into()));
        for (k, v) in &self.extra_env {
            cmd.env(k, v);
        }
        let mut process = ChildProcess::spawn("hangar-operator", cmd, &self.log)?;
        let port = self.admin_port;
        wait_until("hangar-operator /healthz", &mut process, Duration::from_secs(60), || {
            http_get(port, "/healthz").is_ok_and(|(s, _)| s == 200)
        })?;
        self.process = Some(process);
        Ok(())
    }

    /// A second replica beside this one, for leader election (start both
    /// with `HANGAR_LEADER_ELECT=true`): the same settings and key service,
    /// its own ports, log and identity (`POD_NAME`). It serves health and
    /// metrics at once and waits for the Lease for the rest.
    pub fn replica(&self, identity: &str) -> Result<Self> {
        let mut extra_env: Vec<(String, String)> =
            self.extra_env.iter().filter(|(k, _)| k != "POD_NAME").cloned().collect();
        extra_env.push(("POD_NAME".into(), identity.into()));
        let mut op = Self {
            process: None,
            key_service: self.key_service.clone(),
            admin_port: 0,
            metrics_port: 0,
            scraper: self.scraper.clone(),
            metrics_cert: self.metrics_cert.clone(),
            kubeconfig: self.kubeconfig.clone(),
            ec2_endpoint: self.ec2_endpoint.clone(),
            registry_endpoints: self.registry_endpoints.clone(),
            log: self.log.with_file_name(format!("operator-{identity}.log")),
            extra_env,
        };
        op.spawn()?;
        Ok(op)
    }

    /// Whether /readyz answers 200 now (one look, no waiting).
    pub fn is_ready(&self) -> bool {
        http_get(self.admin_port, "/readyz").is_ok_and(|(s, _)| s == 200)
    }

    /// SIGKILL: no chance to finish anything, as in a node crash.
    pub fn kill(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.kill();
        }
    }

    pub fn restart(&mut self) -> Result<()> {
        self.kill();
        self.spawn()
    }

    /// Restarts with a different extra environment (e.g. a failpoint armed).
    pub fn restart_with(&mut self, extra_env: &[(&str, &str)]) -> Result<()> {
        self.extra_env = extra_env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        self.restart()
    }

    /// Restarts talking to another EC2 endpoint (e.g. the fault proxy).
    pub fn restart_with_endpoint(&mut self, endpoint: &str) -> Result<()> {
        self.ec2_endpoint = endpoint.to_owned();
        self.restart()
    }

    /// Waits until /readyz answers 200 (the organisation key loaded and EC2
    /// described), failing early if the process exits.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let port = self.admin_port;
        let process = self.process.as_mut().ok_or(crate::error::HarnessError::NotStarted("hangar-operator"))?;
        wait_until("hangar-operator /readyz", process, timeout, || {
            http_get(port, "/readyz").is_ok_and(|(s, _)| s == 200)
        })
    }

    /// `Err` with its log tail when the process has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        self.process.as_mut().ok_or(crate::error::HarnessError::NotStarted("hangar-operator"))?.check_alive()
    }

    /// True once the process has exited (e.g. at an armed failpoint).
    pub fn has_exited(&mut self) -> bool {
        self.process.as_mut().is_none_or(|p| p.check_alive().is_err())
    }

    pub fn metrics(&self) -> String {
        self.scraper.metrics(self.metrics_port)
    }

    /// The operator's raw latency samples (`/debug/samples`), for the
    /// benchmark's exact quantiles.
    pub fn samples(&self) -> serde_json::Value {
        self.scraper
            .get(self.metrics_port, "/debug/samples")
            .ok()
            .and_then(|(_, b)| serde_json::from_str(&b).ok())
            .unwrap_or_default()
    }

    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(|p| p.id())
    }

    pub fn log_tail(&self, lines: usize) -> String {
        crate::process::tail(&self.log, lines)
    }
}

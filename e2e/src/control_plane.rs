//! A real Kubernetes control plane on loopback: etcd and kube-apiserver built
//! from their Go modules, client-certificate auth, RBAC, and the hangar CRDs
//! installed and Established.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use base64::Engine;
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::wait::{await_condition, conditions};

use crate::build::go_binary;
use crate::error::{HarnessError, Result, io};
use crate::pki::Pki;
use crate::process::{ChildProcess, RunDir, free_port, port_open, wait_until};

const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// What runs beside the apiserver.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    /// etcd and kube-apiserver alone: the node simulator plays the rest.
    ApiOnly,
    /// A cluster for real kubelets: kube-controller-manager (Deployments,
    /// DaemonSets, ServiceAccounts, the `kube-root-ca.crt` ConfigMap) and
    /// kube-scheduler run too, and the ServiceAccount admission plugin
    /// mounts each Pod's projected token.
    Cluster,
}

pub struct ControlPlane {
    // Field order is drop order: the controllers and then the apiserver
    // stop before etcd, and the directory goes last.
    controllers: Vec<ChildProcess>,
    apiserver: ChildProcess,
    etcd: ChildProcess,
    pub kubeconfig: PathBuf,
    pub server: String,
    pub pki: Pki,
    dir: RunDir,
}

impl ControlPlane {
    /// `Err` with its log tail when etcd or the apiserver has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        self.etcd.check_alive()?;
        self.apiserver.check_alive()?;
        self.controllers.iter_mut().try_for_each(ChildProcess::check_alive)
    }

    /// Starts etcd and kube-apiserver in a fresh temporary directory and
    /// installs the CRDs.
    pub fn start() -> Result<Self> {
        Self::start_in(RunDir::new("hangar-e2e")?, true)
    }

    /// A cluster for real nodes (`Mode::Cluster`), without the CRDs (the
    /// Helm chart installs them).
    pub fn start_cluster() -> Result<Self> {
        Self::start_with(RunDir::new("hangar-cluster")?, false, Mode::Cluster)
    }

    /// Without the CRDs (for a test that installs them some other way, e.g.
    /// from the Helm chart).
    pub fn start_without_crds() -> Result<Self> {
        Self::start_in(RunDir::new("hangar-e2e")?, false)
    }

    /// In `dir` (`make up` uses a fixed one so KUBECONFIG has a stable path).
    pub fn start_in(dir: RunDir, with_crds: bool) -> Result<Self> {
        Self::start_with(dir, with_crds, Mode::ApiOnly)
    }

    pub fn start_with(dir: RunDir, with_crds: bool, mode: Mode) -> Result<Self> {
        let etcd_bin = go_binary("etcd")?;
        let apiserver_bin = go_binary("kube-apiserver")?;
        let root = dir.path.clone();
        let pki = Pki::generate(&root.join("pki"))?;

        let (client_port, peer_port) = (free_port(), free_port());
        let mut etcd_cmd = Command::new(&etcd_bin);
        etcd_cmd.args([
            "--name=hangar-local".to_owned(),
            format!("--data-dir={}", root.join("etcd").display()),
            format!("--listen-client-urls=http://127.0.0.1:{client_port}"),
            format!("--advertise-client-urls=http://127.0.0.1:{client_port}"),
            format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
            format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
            format!("--initial-cluster=hangar-local=http://127.0.0.1:{peer_port}"),
            // Test data: durability across a power cut is not needed, speed is.
            "--unsafe-no-fsync=true".to_owned(),
            "--log-level=warn".to_owned(),
        ]);
        let started = std::time::Instant::now();
        let mut etcd = ChildProcess::spawn("etcd", etcd_cmd, &root.join("etcd.log"))?;
        wait_until("etcd", &mut etcd, READY_TIMEOUT, || {
            crate::process::http_get(client_port, "/health").is_ok_and(|(s, b)| s == 200 && b.contains("true"))
        })?;

        tracing::debug!(elapsed = ?started.elapsed(), "etcd healthy");
        let port = free_port();
        let admission_config = write_admission_config(&root, &pki)?;
        let mut api_cmd = Command::new(&apiserver_bin);
        api_cmd.args([
            format!("--etcd-servers=http://127.0.0.1:{client_port}"),
            "--bind-address=127.0.0.1".to_owned(),
            "--advertise-address=127.0.0.1".to_owned(),
            format!("--secure-port={port}"),
            format!("--cert-dir={}", root.join("apiserver-certs").display()),
            format!("--tls-cert-file={}", pki.serving_cert.display()),
            format!("--tls-private-key-file={}", pki.serving_key.display()),
            format!("--client-ca-file={}", pki.ca_cert.display()),
            format!("--service-account-key-file={}", pki.service_account_pub.display()),
            format!("--service-account-signing-key-file={}", pki.service_account_key.display()),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_owned(),
            "--service-cluster-ip-range=10.96.0.0/16".to_owned(),
            // Node + NodeRestriction, as on EKS: a kubelet may edit only its
            // own Node, and never its taints or node-restriction labels
            // (where the operator writes the session binding).
            "--authorization-mode=Node,RBAC".to_owned(),
            "--enable-admission-plugins=NodeRestriction".to_owned(),
            // The apiserver presents a client certificate to the admission
            // webhook, which accepts no other client.
            format!("--admission-control-config-file={}", admission_config.display()),
            "--allow-privileged=true".to_owned(),
            // A loopback advertise address cannot go into the `kubernetes`
            // Endpoints; there is one apiserver, nothing to reconcile.
            "--endpoint-reconciler-type=none".to_owned(),
            "--enable-priority-and-fairness=false".to_owned(),
            "--profiling=false".to_owned(),
            "--v=1".to_owned(),
        ]);
        match mode {
            // No kube-controller-manager runs, so nothing would create the
            // default ServiceAccount that this plugin insists on.
            Mode::ApiOnly => api_cmd.arg("--disable-admission-plugins=ServiceAccount"),
            // The apiserver calls webhooks at their Service's endpoints: no
            // kube-proxy runs here to route a ClusterIP.
            Mode::Cluster => api_cmd.arg("--enable-aggregator-routing=true"),
        };
        let mut apiserver = ChildProcess::spawn("kube-apiserver", api_cmd, &root.join("kube-apiserver.log"))?;
        wait_until("kube-apiserver port", &mut apiserver, READY_TIMEOUT, || port_open(port))?;

        let server = format!("https://127.0.0.1:{port}");
        let kubeconfig = root.join("kubeconfig");
        write_kubeconfig(&kubeconfig, &server, &pki.ca_pem, &pki.admin_cert_pem, &pki.admin_key_pem)?;
        let mut cp = Self { controllers: Vec::new(), apiserver, etcd, kubeconfig, server, pki, dir };
        cp.wait_ready(with_crds)?;
        if mode == Mode::Cluster {
            cp.start_controllers()?;
        }
        tracing::info!(elapsed = ?started.elapsed(), server = %cp.server, "control plane ready, CRDs Established");
        Ok(cp)
    }

    /// kube-controller-manager and kube-scheduler, each with a client
    /// certificate of the user the apiserver's bootstrap RBAC expects.
    fn start_controllers(&mut self) -> Result<()> {
        let root = self.dir.path.clone();
        for (name, user) in
            [("kube-controller-manager", "system:kube-controller-manager"), ("kube-scheduler", "system:kube-scheduler")]
        {
            let client = self.pki.ca.client(user, &[])?;
            let kubeconfig = root.join(format!("{name}.kubeconfig"));
            write_kubeconfig(&kubeconfig, &self.server, &self.pki.ca_pem, &client.cert, &client.key)?;
            let kc = kubeconfig.display().to_string();
            let mut cmd = Command::new(go_binary(name)?);
            cmd.args([
                format!("--kubeconfig={kc}"),
                format!("--authentication-kubeconfig={kc}"),
                format!("--authorization-kubeconfig={kc}"),
                "--leader-elect=false".to_owned(),
                "--bind-address=127.0.0.1".to_owned(),
                format!("--secure-port={}", free_port()),
                "--v=1".to_owned(),
            ]);
            if name == "kube-controller-manager" {
                cmd.args([
                    // Published into every namespace as kube-root-ca.crt,
                    // the CA of each Pod's projected token volume.
                    format!("--root-ca-file={}", self.pki.ca_cert.display()),
                    format!("--service-account-private-key-file={}", self.pki.service_account_key.display()),
                    // One credential per controller, as in a real cluster,
                    // so each acts with its own bootstrap role.
                    "--use-service-account-credentials=true".to_owned(),
                ]);
            }
            self.controllers.push(ChildProcess::spawn(name, cmd, &root.join(format!("{name}.log")))?);
        }
        // Ready for Pods once the controllers made what every Pod's token
        // volume needs: the namespace's ServiceAccount and CA ConfigMap.
        let kubeconfig = self.kubeconfig.clone();
        let made = || {
            crate::real_node::block_on(async {
                let Ok(client) = client_from(&kubeconfig).await else { return false };
                let sa = Api::<ServiceAccount>::namespaced(client.clone(), "default").get_opt("default").await;
                let ca = Api::<ConfigMap>::namespaced(client, "default").get_opt("kube-root-ca.crt").await;
                matches!((sa, ca), (Ok(Some(_)), Ok(Some(_))))
            })
        };
        let manager = &mut self.controllers[0];
        wait_until("kube-controller-manager (default ServiceAccount)", manager, READY_TIMEOUT, made)
    }

    /// kube-apiserver killed and started again (etcd keeps the state);
    /// returns once it is ready.
    pub fn restart_apiserver(&mut self) -> Result<()> {
        self.apiserver.respawn()?;
        let port: u16 = self.server.rsplit(':').next().and_then(|p| p.parse().ok()).expect("server port");
        wait_until("kube-apiserver port", &mut self.apiserver, READY_TIMEOUT, || port_open(port))?;
        self.wait_ready(false)
    }

    /// The kube-apiserver's and etcd's process ids (for the benchmarks'
    /// memory and CPU figures).
    pub fn pids(&self) -> (u32, u32) {
        (self.apiserver.id(), self.etcd.id())
    }

    pub fn dir(&self) -> &std::path::Path {
        &self.dir.path
    }

    /// Waits for /readyz and installs the CRDs, on a runtime of its own so
    /// this works from sync code and from inside a test's runtime alike.
    fn wait_ready(&mut self, with_crds: bool) -> Result<()> {
        let kubeconfig = self.kubeconfig.clone();
        let result = std::thread::scope(|s| {
            s.spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(io("runtime"))?;
                rt.block_on(async {
                    let client = client_from(&kubeconfig).await?;
                    let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
                    loop {
                        let req = http::Request::get("/readyz").body(Vec::new()).expect("request");
                        match client.request_text(req).await {
                            Ok(body) if body.trim() == "ok" => break,
                            _ if tokio::time::Instant::now() > deadline => {
                                return Err(HarnessError::NotReady {
                                    what: "kube-apiserver /readyz".into(),
                                    seconds: READY_TIMEOUT.as_secs(),
                                    log_tail: String::new(),
                                });
                            }
                            _ => tokio::time::sleep(Duration::from_millis(100)).await,
                        }
                    }
                    if with_crds { install_crds(&client).await } else { Ok(()) }
                })
            })
            .join()
            .expect("setup thread")
        });
        if let Err(HarnessError::NotReady { what, seconds, .. }) = result {
            self.apiserver.check_alive()?;
            return Err(HarnessError::NotReady { what, seconds, log_tail: self.apiserver.log_tail(40) });
        }
        result
    }

    /// A client for the admin user (system:masters).
    pub async fn client(&self) -> Result<kube::Client> {
        client_from(&self.kubeconfig).await
    }

    /// An administrator's client impersonating `user` in `groups` (what
    /// `kubectl --as --as-group` does).
    pub async fn client_impersonating(&self, user: &str, groups: &[&str]) -> Result<kube::Client> {
        crate::install_crypto_provider();
        let kc = Kubeconfig::read_from(&self.kubeconfig)?;
        let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
        config.auth_info.impersonate = Some(user.to_owned());
        config.auth_info.impersonate_groups = Some(groups.iter().map(|g| g.to_string()).collect());
        Ok(kube::Client::try_from(config)?)
    }

    /// A client that authenticates with `token` only (a ServiceAccount's,
    /// say): what that identity can do, nothing more.
    pub async fn client_as(&self, token: &str) -> Result<kube::Client> {
        let b64 = base64::engine::general_purpose::STANDARD.encode(self.pki.ca_pem.as_bytes());
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    \
             certificate-authority-data: {b64}\nusers:\n- name: u\n  user:\n    token: {token}\n\
             contexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\n",
            self.server
        );
        let kc = Kubeconfig::from_yaml(&text)?;
        let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
        crate::install_crypto_provider();
        Ok(kube::Client::try_from(config)?)
    }

    /// `kubectl` pointed at this control plane.
    pub fn kubectl(&self) -> Command {
        let mut cmd = Command::new("kubectl");
        cmd.env("KUBECONFIG", &self.kubeconfig);
        cmd
    }

    /// `helm` (built from its module) pointed at this control plane.
    pub fn helm(&self) -> Result<Command> {
        let mut cmd = Command::new(go_binary("helm")?);
        cmd.env("KUBECONFIG", &self.kubeconfig)
            .env("HELM_CACHE_HOME", self.dir.path.join("helm/cache"))
            .env("HELM_CONFIG_HOME", self.dir.path.join("helm/config"))
            .env("HELM_DATA_HOME", self.dir.path.join("helm/data"));
        Ok(cmd)
    }
}

pub async fn client_from(kubeconfig: &std::path::Path) -> Result<kube::Client> {
    crate::install_crypto_provider();
    let kc = Kubeconfig::read_from(kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

/// Server-side applies every hangar CRD and waits until each is Established.
pub async fn install_crds(client: &kube::Client) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply("hangar-e2e").force();
    for m in hangar_crds::manifests::all()? {
        let name = m.crd.metadata.name.clone().expect("CRD name");
        api.patch(&name, &params, &Patch::Apply(&m.crd)).await?;
    }
    for m in hangar_crds::manifests::all()? {
        let name = m.crd.metadata.name.clone().expect("CRD name");
        let established = await_condition(api.clone(), &name, conditions::is_crd_established());
        tokio::time::timeout(Duration::from_secs(30), established)
            .await
            .map_err(|_| HarnessError::CrdNotEstablished(name.clone()))?
            .map_err(|_| HarnessError::CrdNotEstablished(name))?;
    }
    Ok(())
}

/// A kubeconfig for `server` as the client `cert`/`key` (PEM).
pub fn write_kubeconfig(path: &std::path::Path, server: &str, ca_pem: &str, cert: &str, key: &str) -> Result<()> {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
    let body = format!(
        "apiVersion: v1
kind: Config
clusters:
- name: hangar-local
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: hangar-admin
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
contexts:
- name: hangar-local
  context:
    cluster: hangar-local
    user: hangar-admin
current-context: hangar-local
",
        ca = b64(ca_pem),
        cert = b64(cert),
        key = b64(key),
    );
    std::fs::write(path, body).map_err(io(format!("write {}", path.display())))
}

/// The apiserver's admission configuration: every webhook it calls gets the
/// admission client certificate (`*`: the webhook's port is known only
/// after the apiserver starts).
fn write_admission_config(root: &std::path::Path, pki: &Pki) -> Result<std::path::PathBuf> {
    let kubeconfig = root.join("admission-kubeconfig.yaml");
    let text = format!(
        "apiVersion: v1\nkind: Config\nusers:\n- name: '*'\n  user:\n    client-certificate: {}\n    client-key: {}\n",
        pki.admission_client_cert.display(),
        pki.admission_client_key.display()
    );
    std::fs::write(&kubeconfig, text).map_err(crate::error::io("write admission kubeconfig"))?;
    let config = root.join("admission-config.yaml");
    let text = format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n\
         - name: ValidatingAdmissionWebhook\n  configuration:\n    apiVersion: apiserver.config.k8s.io/v1\n    \
         kind: WebhookAdmissionConfiguration\n    kubeConfigFile: {}\n",
        kubeconfig.display()
    );
    std::fs::write(&config, text).map_err(crate::error::io("write admission config"))?;
    Ok(config)
}

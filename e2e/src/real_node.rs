//! A real node: kubelet and containerd (both built from their Go modules,
//! runc from Debian) joined to a `Mode::Cluster` control plane as a Node.
//!
//! What keeps it on this machine and apart from any other node here:
//! - its own bridge `hgr<pid>n<k>` with `10.89.<k>.1/24`, the node's
//!   InternalIP (a kubelet refuses a loopback node address) and the
//!   gateway of its Pods' network (CNI bridge + host-local); nothing routes
//!   it anywhere else;
//! - its own cgroup root `/hangar-node-<pid>-<k>` in every hierarchy, so
//!   two kubelets never see (and clean up) each other's Pods;
//! - containerd's root, state, socket, network namespaces and the kubelet's
//!   root under its run directory; every listener on the bridge address or
//!   127.0.0.1.
//!
//! Images come from the loopback registry only: containerd's hosts.toml
//! sends `registry.hangar.test` and the registry's `127.0.0.1:<port>` name
//! there over plain HTTP, and the sandbox ("pause") image is hangar's own
//! (e2e/scripts/build-binaries.sh pause), pushed on start.
//!
//! This machine runs cgroup v1 without systemd: the kubelet runs with the
//! `cgroupfs` driver and `failCgroupV1: false`. Its root lacks
//! CAP_SYS_RESOURCE, so containerd keeps every container's oom_score_adj
//! at or above its own (`restrict_oom_score_adj`).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::build::go_binary;
use crate::control_plane::{ControlPlane, write_kubeconfig};
use crate::error::{HarnessError, Result, io};
use crate::process::{ChildProcess, RunDir, free_port, processes_with, run, wait_until};
use crate::registry::{REGISTRY_HOST, Registry};

const CGROUP_FS: &str = "/sys/fs/cgroup";
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// What the node registers as.
#[derive(Clone, Debug, Default)]
pub struct NodeSpec {
    pub name: String,
    pub labels: Vec<(String, String)>,
    /// `key=value:Effect`, as `kubectl taint` writes them.
    pub taints: Vec<String>,
    pub provider_id: Option<String>,
}

pub struct RealNode {
    // Drop stops the kubelet first, then the Pods, then containerd.
    kubelet: Option<ChildProcess>,
    containerd: Option<ChildProcess>,
    pub name: String,
    /// The node's InternalIP (on its own bridge).
    pub ip: Ipv4Addr,
    /// The kubelet's healthz port on 127.0.0.1.
    pub healthz_port: u16,
    bridge: String,
    cgroup: String,
    socket: PathBuf,
    dir: RunDir,
}

impl RealNode {
    /// Starts containerd and the kubelet for `spec` and waits until the
    /// Node is Ready. `registry` serves every image the node pulls.
    pub fn start(cp: &ControlPlane, registry: &Registry, spec: &NodeSpec) -> Result<Self> {
        sweep_dead_nodes();
        let dir = RunDir::new("hangar-node")?;
        let started = std::time::Instant::now();
        let (k, bridge, ip) = create_bridge()?;
        let cgroup = format!("hangar-node-{}-{k}", std::process::id());
        // Built before anything is made, so the cleanup below owns it all.
        let mut node = Self {
            kubelet: None,
            containerd: None,
            name: spec.name.clone(),
            ip,
            healthz_port: free_port(),
            bridge,
            cgroup,
            socket: dir.path.join("containerd.sock"),
            dir,
        };
        // A node's root is a shared mount (systemd makes `/` one): volumes
        // with mount propagation (the agent's workspace, HostToContainer)
        // need it. Here `/` is private, so the node's directory becomes a
        // shared mount of its own, which holds its kubelet and hostPaths.
        make_shared_mount(&node.dir.path)?;
        for hierarchy in cgroup_hierarchies() {
            let path = hierarchy.join(&node.cgroup);
            std::fs::create_dir_all(&path).map_err(io(format!("create {}", path.display())))?;
        }
        let pause = push_pause_image(registry, &node.dir.path)?;
        node.start_containerd(registry, &pause)?;
        node.start_kubelet(cp, spec)?;
        node.wait_ready(cp)?;
        tracing::info!(node = %node.name, ip = %node.ip, elapsed = ?started.elapsed(), "real node Ready");
        Ok(node)
    }

    fn start_containerd(&mut self, registry: &Registry, pause: &str) -> Result<()> {
        let d = &self.dir.path;
        // containerd finds its shim on PATH by name.
        let shims = d.join("bin");
        std::fs::create_dir_all(&shims).map_err(io("create shim dir"))?;
        std::os::unix::fs::symlink(go_binary("containerd-shim-runc-v2")?, shims.join("containerd-shim-runc-v2"))
            .map_err(io("link the runc shim"))?;
        let hosts = d.join("certs.d");
        for host in [REGISTRY_HOST.to_owned(), format!("127.0.0.1:{}", registry.port)] {
            let h = hosts.join(&host);
            std::fs::create_dir_all(&h).map_err(io("create hosts dir"))?;
            let text = format!(
                "server = \"{url}\"\n\n[host.\"{url}\"]\n  capabilities = [\"pull\", \"resolve\"]\n",
                url = registry.endpoint()
            );
            std::fs::write(h.join("hosts.toml"), text).map_err(io("write hosts.toml"))?;
        }
        let cni_conf = d.join("cni");
        std::fs::create_dir_all(&cni_conf).map_err(io("create cni conf dir"))?;
        let subnet = Ipv4Addr::from(u32::from(self.ip) & 0xffff_ff00);
        let conflist = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "hangar",
            "plugins": [{
                "type": "bridge",
                "bridge": self.bridge,
                "isGateway": true,
                "ipMasq": false,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": format!("{subnet}/24"), "gateway": self.ip.to_string()}]],
                    "dataDir": d.join("cni-ipam"),
                },
            }],
        });
        std::fs::write(cni_conf.join("10-hangar.conflist"), conflist.to_string()).map_err(io("write cni conf"))?;
        let config = format!(
            r#"version = 3
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.nri.v1.nri"]

[grpc]
  address = "{socket}"

[plugins.'io.containerd.internal.v1.opt']
  path = "{opt}"

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "{pause}"

[plugins.'io.containerd.cri.v1.images'.registry]
  config_path = "{hosts}"

[plugins.'io.containerd.cri.v1.runtime']
  netns_mounts_under_state_dir = true
  # This machine withholds CAP_SYS_RESOURCE: no process may lower its
  # oom_score_adj (the kubelet asks -998 for every Pod's sandbox).
  restrict_oom_score_adj = true

[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ["{cni_bin}"]
  conf_dir = "{cni_conf}"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  BinaryName = "/usr/sbin/runc"
  Root = "{runc_root}"
  SystemdCgroup = false
"#,
            root = d.join("containerd/root").display(),
            state = d.join("containerd/state").display(),
            socket = self.socket.display(),
            opt = d.join("containerd/opt").display(),
            runc_root = d.join("runc").display(),
            hosts = hosts.display(),
            cni_bin = go_binary("cni")?.display(),
            cni_conf = cni_conf.display(),
        );
        let path = d.join("containerd.toml");
        std::fs::write(&path, config).map_err(io("write containerd.toml"))?;
        let mut cmd = Command::new(go_binary("containerd")?);
        cmd.arg("--config").arg(&path).env(
            "PATH",
            format!("{}:{}", shims.display(), std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin".into())),
        );
        let mut containerd = ChildProcess::spawn("containerd", cmd, &d.join("containerd.log"))?;
        let socket = self.socket.clone();
        wait_until("containerd socket", &mut containerd, READY_TIMEOUT, || socket.exists())?;
        self.containerd = Some(containerd);
        Ok(())
    }

    fn start_kubelet(&mut self, cp: &ControlPlane, spec: &NodeSpec) -> Result<()> {
        let d = self.dir.path.clone();
        let client = cp.pki.ca.client(&format!("system:node:{}", spec.name), &["system:nodes"])?;
        let kubeconfig = d.join("kubelet.kubeconfig");
        write_kubeconfig(&kubeconfig, &cp.server, &cp.pki.ca_pem, &client.cert, &client.key)?;
        let taints: Vec<serde_json::Value> = spec
            .taints
            .iter()
            .map(|t| {
                let (kv, effect) = t.split_once(':').expect("taint key=value:Effect");
                let (key, value) = kv.split_once('=').unwrap_or((kv, ""));
                serde_json::json!({"key": key, "value": value, "effect": effect})
            })
            .collect();
        let mut config = serde_json::json!({
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.ip.to_string(),
            "port": free_port(),
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.healthz_port,
            "authentication": {
                "anonymous": {"enabled": false},
                "webhook": {"enabled": true},
                "x509": {"clientCAFile": cp.pki.ca_cert},
            },
            "authorization": {"mode": "Webhook"},
            "containerRuntimeEndpoint": format!("unix://{}", self.socket.display()),
            // cgroup v1 without systemd here (see the module comment).
            "cgroupDriver": "cgroupfs",
            "failCgroupV1": false,
            "cgroupRoot": format!("/{}", self.cgroup),
            "failSwapOn": false,
            // The machine's disk is shared with everything else; a test
            // must not see its Pods evicted for it.
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            "imageGCHighThresholdPercent": 100,
            "serializeImagePulls": false,
            "registerWithTaints": taints,
            "nodeStatusUpdateFrequency": "2s",
            "syncFrequency": "5s",
            "fileCheckFrequency": "5s",
            "resolvConf": "/etc/resolv.conf",
            "podLogsDir": d.join("pod-logs"),
            "enableServer": true,
        });
        if let Some(id) = &spec.provider_id {
            config["providerID"] = serde_json::Value::String(id.clone());
        }
        let config_path = d.join("kubelet.yaml");
        std::fs::write(&config_path, config.to_string()).map_err(io("write kubelet config"))?;
        let labels = spec.labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
        let mut cmd = Command::new(go_binary("kubelet")?);
        cmd.args([
            format!("--config={}", config_path.display()),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--root-dir={}", d.join("kubelet").display()),
            format!("--cert-dir={}", d.join("kubelet-pki").display()),
            format!("--hostname-override={}", spec.name),
            format!("--node-ip={}", self.ip),
            "--v=1".to_owned(),
        ]);
        if !labels.is_empty() {
            cmd.arg(format!("--node-labels={labels}"));
        }
        self.kubelet = Some(ChildProcess::spawn("kubelet", cmd, &d.join("kubelet.log"))?);
        Ok(())
    }

    fn wait_ready(&mut self, cp: &ControlPlane) -> Result<()> {
        let name = self.name.clone();
        let kubeconfig = cp.kubeconfig.clone();
        let kubelet = self.kubelet.as_mut().expect("kubelet started");
        let ready = || {
            block_on(async {
                let client = crate::control_plane::client_from(&kubeconfig).await.ok()?;
                let node = Api::<Node>::all(client).get_opt(&name).await.ok()??;
                let conditions = node.status?.conditions?;
                Some(conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .unwrap_or(false)
        };
        wait_until("kubelet Node Ready", kubelet, READY_TIMEOUT, ready)
    }

    /// The kubelet's log (for a failing test's message).
    pub fn kubelet_log_tail(&self, lines: usize) -> String {
        self.kubelet.as_ref().map(|k| k.log_tail(lines)).unwrap_or_default()
    }

    pub fn containerd_log_tail(&self, lines: usize) -> String {
        self.containerd.as_ref().map(|k| k.log_tail(lines)).unwrap_or_default()
    }

    /// The last `lines` lines each container of Pods whose name starts with
    /// `pod` logged (the kubelet's files), for a failing test's message.
    pub fn container_logs(&self, pod: &str, lines: usize) -> String {
        let mut out = String::new();
        let Ok(pods) = std::fs::read_dir(self.dir.path.join("pod-logs")) else { return out };
        for p in pods.flatten() {
            // <namespace>_<pod>_<uid>
            let name = p.file_name().to_string_lossy().into_owned();
            if !name.split('_').nth(1).is_some_and(|n| n.starts_with(pod)) {
                continue;
            }
            for c in std::fs::read_dir(p.path()).into_iter().flatten().flatten() {
                for f in std::fs::read_dir(c.path()).into_iter().flatten().flatten() {
                    out += &format!("== {name}/{}\n", f.file_name().to_string_lossy());
                    out += &crate::process::tail(&f.path(), lines);
                }
            }
        }
        out
    }

    /// Pids in this node's cgroups: the Pods' processes (pause, containers).
    pub fn pod_processes(&self) -> Vec<i32> {
        cgroup_processes(&self.cgroup)
    }

    /// A Pod process of this node that is PID 1 of its PID namespace (a
    /// container's init) and runs `program`.
    pub fn container_init(&self, program: &str) -> Option<i32> {
        self.container_inits(program).into_iter().next()
    }

    /// Every such process (one per replica on this node).
    pub fn container_inits(&self, program: &str) -> Vec<i32> {
        let mut pids: Vec<i32> = self
            .pod_processes()
            .into_iter()
            .filter(|pid| {
                let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                let in_ns = status.lines().find(|l| l.starts_with("NSpid:")).and_then(|l| l.split_whitespace().last());
                in_ns == Some("1") && cmdline.starts_with(program.as_bytes())
            })
            .collect();
        pids.sort();
        pids.dedup();
        pids
    }

    pub fn dir(&self) -> &Path {
        &self.dir.path
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        if let Some(mut kubelet) = self.kubelet.take() {
            kubelet.stop(Duration::from_secs(5));
        }
        // The Pods: every process in the node's cgroups, then the shims
        // (reparented away from containerd, they name its socket).
        for _ in 0..50 {
            let pids = cgroup_processes(&self.cgroup);
            if pids.is_empty() {
                break;
            }
            for pid in pids {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        for pid in processes_with(&self.socket.display().to_string()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        if let Some(mut containerd) = self.containerd.take() {
            containerd.stop(Duration::from_secs(5));
        }
        remove_cgroups(&self.cgroup);
        unmount_under(&self.dir.path);
        let _ = Command::new("ip").args(["link", "del", &self.bridge]).status();
    }
}

/// Makes `dir` a shared mount of its own (bound onto itself), so mounts
/// made under it propagate to the containers that mount it with
/// HostToContainer or Bidirectional propagation. Undone by
/// `unmount_under(dir)` and its parent's removal.
pub fn make_shared_mount(dir: &Path) -> Result<()> {
    use nix::mount::{MsFlags, mount};
    mount(Some(dir), dir, None::<&str>, MsFlags::MS_BIND | MsFlags::MS_REC, None::<&str>)
        .map_err(|e| io(format!("bind {}", dir.display()))(e.into()))?;
    mount(None::<&str>, dir, None::<&str>, MsFlags::MS_SHARED | MsFlags::MS_REC, None::<&str>)
        .map_err(|e| io(format!("make {} shared", dir.display()))(e.into()))
}

/// A bridge of our own with the first free `10.89.<k>.1/24`.
fn create_bridge() -> Result<(u8, String, Ipv4Addr)> {
    for k in 0..=255u8 {
        let name = format!("hgr{}n{k}", std::process::id());
        let ip = Ipv4Addr::new(10, 89, k, 1);
        if address_in_use(ip) {
            continue;
        }
        // `ip link add` fails if another test made this name first.
        if !run_ip(&["link", "add", &name, "type", "bridge"]) {
            continue;
        }
        if run_ip(&["addr", "add", &format!("{ip}/24"), "dev", &name]) && run_ip(&["link", "set", &name, "up"]) {
            return Ok((k, name, ip));
        }
        run_ip(&["link", "del", &name]);
    }
    Err(HarnessError::NoNodeNetwork)
}

fn address_in_use(ip: Ipv4Addr) -> bool {
    let out = Command::new("ip").args(["-4", "-o", "addr"]).output().map(|o| o.stdout).unwrap_or_default();
    let prefix = format!("{}.{}.{}.", ip.octets()[0], ip.octets()[1], ip.octets()[2]);
    String::from_utf8_lossy(&out).split_whitespace().any(|w| w.starts_with(&prefix))
}

fn run_ip(args: &[&str]) -> bool {
    Command::new("ip").args(args).stderr(std::process::Stdio::null()).status().is_ok_and(|s| s.success())
}

/// What a process has used so far, from `/proc`.
#[derive(Clone, Copy, Debug)]
pub struct ProcessUsage {
    /// Its peak resident memory (`VmHWM`).
    pub peak_rss_kib: u64,
    /// CPU time of its threads alive now, on any core, since each started
    /// (their `schedstat`: exact, where `stat` counts clock ticks).
    pub cpu: Duration,
}

impl ProcessUsage {
    pub fn of(pid: i32) -> Option<Self> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let hwm = status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?;
        let peak_rss_kib = hwm.trim().trim_end_matches("kB").trim().parse().ok()?;
        let mut cpu = Duration::ZERO;
        for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()?.flatten() {
            let schedstat = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
            let on_cpu = schedstat.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(0);
            cpu += Duration::from_nanos(on_cpu);
        }
        Some(Self { peak_rss_kib, cpu })
    }
}

/// Every cgroup v1 hierarchy (one directory per controller set).
fn cgroup_hierarchies() -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(CGROUP_FS) else { return Vec::new() };
    let mut found: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        // Symlinks (cpu -> cpu,cpuacct) are not dirs; the unified tree
        // holds no controllers here.
        .filter(|p| p.file_name().is_some_and(|n| n != "unified"))
        .collect();
    found.sort();
    found
}

fn cgroup_processes(cgroup: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    for h in cgroup_hierarchies() {
        collect_procs(&h.join(cgroup), &mut pids);
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

fn collect_procs(dir: &Path, pids: &mut Vec<i32>) {
    if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                collect_procs(&e.path(), pids);
            }
        }
    }
}

/// Removes the cgroup trees, children first (a cgroup goes only empty).
fn remove_cgroups(cgroup: &str) {
    fn remove(dir: &Path) {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    remove(&e.path());
                }
            }
        }
        let _ = std::fs::remove_dir(dir);
    }
    for h in cgroup_hierarchies() {
        remove(&h.join(cgroup));
    }
}

/// Lazily unmounts everything mounted under `dir`, deepest first (the
/// kubelet's volume tmpfs, containerd's overlays and network namespaces).
pub fn unmount_under(dir: &Path) {
    let prefix = dir.display().to_string();
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<String> = text
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4).map(str::to_owned))
        .filter(|p| p.starts_with(&prefix))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in points {
        let _ = nix::mount::umount2(p.as_str(), nix::mount::MntFlags::MNT_DETACH);
    }
}

/// Cgroups, bridges and shims of nodes whose test process is gone (killed
/// before its drop ran).
fn sweep_dead_nodes() {
    let alive = |pid: &str| pid.parse::<i32>().is_ok_and(|p| kill(Pid::from_raw(p), None).is_ok());
    for h in cgroup_hierarchies() {
        let Ok(entries) = std::fs::read_dir(&h) else { continue };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(pid) = name.strip_prefix("hangar-node-").and_then(|r| r.split('-').next()) else { continue };
            if !alive(pid) {
                for p in cgroup_processes(&name) {
                    let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
                }
                remove_cgroups(&name);
            }
        }
    }
    // Mounts (kubelet volumes, overlays) left under a dead node's directory.
    let base = std::env::temp_dir().join("hangar-node-").display().to_string();
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut dead: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .filter(|p| p.strip_prefix(&base).and_then(|r| r.split('-').next()).is_some_and(|pid| !alive(pid)))
        .collect();
    dead.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in dead {
        let _ = nix::mount::umount2(p, nix::mount::MntFlags::MNT_DETACH);
    }
    let out = Command::new("ip").args(["-o", "link"]).output().map(|o| o.stdout).unwrap_or_default();
    for line in String::from_utf8_lossy(&out).lines() {
        let Some(name) = line.split(": ").nth(1).map(|n| n.split('@').next().unwrap_or(n)) else { continue };
        if let Some(pid) = name.strip_prefix("hgr").and_then(|r| r.split('n').next())
            && !alive(pid)
        {
            run_ip(&["link", "del", name]);
        }
    }
}

/// Pushes hangar's pause image (one static binary, `/pause`) for this
/// machine's platform; returns its reference by digest under the
/// registry's loopback name.
fn push_pause_image(registry: &Registry, work: &Path) -> Result<String> {
    let crane = go_binary("crane")?;
    let tree = work.join("pause-image");
    std::fs::create_dir_all(&tree).map_err(io("create pause tree"))?;
    std::fs::copy(go_binary("pause")?, tree.join("pause")).map_err(io("copy pause"))?;
    let layer = work.join("pause.tar");
    run(Command::new("tar")
        .args(["--sort=name", "--owner=0", "--group=0", "--numeric-owner", "--mtime=@0", "-C"])
        .arg(&tree)
        .arg("-cf")
        .arg(&layer)
        .arg("pause"))?;
    let reference = format!("127.0.0.1:{}/hangar/pause:{}", registry.port, crate::paths::version("PAUSE_VERSION"));
    run(Command::new(&crane)
        .args(["append", "--insecure", "--oci-empty-base", "-t", &reference])
        .arg("-f")
        .arg(&layer))?;
    let arch = if cfg!(target_arch = "aarch64") { "arm64" } else { "amd64" };
    run(Command::new(&crane).args([
        "mutate",
        "--insecure",
        &reference,
        "--set-platform",
        &format!("linux/{arch}"),
        "--entrypoint",
        "/pause",
        "-t",
        &reference,
    ]))?;
    let digest = run(Command::new(&crane).args(["digest", "--insecure", &reference]))?;
    Ok(format!("127.0.0.1:{}/hangar/pause@{}", registry.port, digest.trim()))
}

/// Runs `fut` on a runtime of its own (from sync code or inside a test's
/// runtime alike).
pub fn block_on<T: Send>(fut: impl std::future::Future<Output = T> + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime").block_on(fut))
            .join()
            .expect("runtime thread")
    })
}

//! The node simulator: no kubelet runs here, so this plays the session
//! instances. For each running hangar instance in the EC2 endpoint it
//! registers the Node (providerID, Ready) and runs the real worker binary
//! as that node, with the workspace volume as a directory; it reports the
//! agent Pod as a kubelet would. A stopped instance loses its worker (like
//! a power-off) and its Node goes NotReady; a started one gets a fresh
//! worker on the same directory; a terminated one loses its Node.
//!
//! Playing the kubelet, it also runs the agent Pod's entrypoint, the real
//! in-sandbox supervisor, as a local process rooted at the volume
//! directory (no container), with the Pod's own arguments; a supervisor
//! that dies is restarted like a container, a worker that dies like a
//! DaemonSet pod. Every process of a simulated node carries
//! `HANGAR_SIM_NODE=<node>` in its environment, so a power-off (stop,
//! terminate) kills all of them, commands included; the container's
//! processes also carry `HANGAR_SIM_CONTAINER`, so a supervisor that dies
//! takes its commands with it, as PID 1 of a container does.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::Duration;

use aws_sdk_ec2::types::{Filter, InstanceStateName};
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::ec2_faults::TouchedInstances;
use crate::process::ChildProcess;

#[derive(Clone)]
pub struct SimConfig {
    pub ec2_endpoint: String,
    pub kubeconfig: PathBuf,
    pub worker_bin: PathBuf,
    /// One directory per workspace volume id: the "disk".
    pub volumes_dir: PathBuf,
    pub log_dir: PathBuf,
    /// Per node: the supervisor socket, the worker's spool (the instance's
    /// root disk, which survives a stop).
    pub nodes_dir: PathBuf,
    /// The output store (a local directory) every worker writes to.
    pub output_dir: PathBuf,
    pub supervisor_bin: PathBuf,
    pub system_namespace: String,
    pub cluster_name: String,
    pub heartbeat_ms: u64,
    /// Signs each boot's identity document (the region's certificate).
    pub identity_authority: crate::imds::IdentityAuthority,
    /// The operator's workspace key service, and the CA of its certificate.
    pub workspace_key_url: String,
    pub workspace_key_ca: PathBuf,
    /// The instances the EC2 proxy saw state-changing calls name
    /// (`FaultProxy::touched_instances`): the simulator describes just
    /// those, and those between states, each tick, and every instance of
    /// the cluster every `RESCAN`; without it, every instance on every
    /// tick. EC2 is a simulator too: a describe of all 100 instances costs
    /// moto ~270 ms of CPU, and done each tick it made the simulator (not
    /// the operator) the queue of a launch burst and slowed every other
    /// EC2 call.
    pub ec2_touched: Option<TouchedInstances>,
}

/// How stale the simulator's view of EC2 may get when nothing it knows of
/// changed it (a test that calls the EC2 endpoint directly).
const RESCAN: Duration = Duration::from_secs(1);

/// The simulator's view of EC2: every live instance of the cluster with its
/// owner account. The describe of all of them (every `RESCAN`) runs beside
/// the ticks, so a tick waits only for the few instances it must see now.
#[derive(Default)]
struct Ec2View {
    instances: Vec<Listed>,
    /// When the last describe of every instance started.
    taken: Option<std::time::Instant>,
    all: Option<tokio::task::JoinHandle<Result<Vec<Listed>, aws_sdk_ec2::Error>>>,
    /// Described alone while that describe ran: its older answer must not
    /// undo theirs (a stopped node briefly Ready again).
    described_meanwhile: std::collections::BTreeSet<String>,
}

type Listed = (Option<String>, aws_sdk_ec2::types::Instance);

impl Ec2View {
    async fn refresh(&mut self, ec2: &aws_sdk_ec2::Client, cfg: &SimConfig) -> TickResult {
        let Some(touched) = &cfg.ec2_touched else {
            // No record of what changed: everything, every tick.
            self.instances = describe_all(ec2.clone(), cfg.cluster_name.clone()).await?;
            return Ok(());
        };
        if self.all.as_ref().is_some_and(|h| h.is_finished())
            && let Some(handle) = self.all.take()
        {
            let newer = std::mem::take(&mut self.described_meanwhile);
            match handle.await {
                Ok(Ok(all)) => {
                    // What was described alone since it started is newer.
                    let is_newer = |(_, i): &Listed| i.instance_id().is_some_and(|id| newer.contains(id));
                    let kept: Vec<Listed> = self.instances.drain(..).filter(is_newer).collect();
                    self.instances = all.into_iter().filter(|l| !is_newer(l)).chain(kept).collect();
                }
                Ok(Err(e)) => tracing::debug!(error = %e, "node simulator: describe of every instance"),
                Err(e) => tracing::debug!(error = %e, "node simulator: describe task"),
            }
        }
        if self.all.is_none() && self.taken.is_none_or(|t| t.elapsed() >= RESCAN) {
            self.taken = Some(std::time::Instant::now());
            self.all = Some(tokio::spawn(describe_all(ec2.clone(), cfg.cluster_name.clone())));
        }
        // Taken before the describe: a call answered during it is named
        // again next tick.
        let mut ids = std::mem::take(&mut *touched.lock().expect("touched"));
        ids.extend(
            self.instances
                .iter()
                .filter(|(_, i)| between_states(i))
                .filter_map(|(_, i)| i.instance_id())
                .map(str::to_owned),
        );
        if ids.is_empty() {
            return Ok(());
        }
        let Ok(out) = ec2.describe_instances().set_instance_ids(Some(ids.into_iter().collect())).send().await else {
            // E.g. an id EC2 no longer knows: the next describe of every
            // instance settles it.
            self.taken = None;
            return Ok(());
        };
        let answered = listed(&out);
        // Only what was answered is newer than a describe of every instance
        // in flight: marking an unanswered id would drop it from the view
        // when that describe lands, and its node would be taken for gone.
        if self.all.is_some() {
            self.described_meanwhile.extend(answered.iter().filter_map(|(_, i)| i.instance_id()).map(str::to_owned));
        }
        for (owner, instance) in answered {
            match self.instances.iter_mut().find(|(_, i)| i.instance_id() == instance.instance_id()) {
                Some(known) => *known = (owner, instance),
                None => self.instances.push((owner, instance)),
            }
        }
        Ok(())
    }
}

async fn describe_all(ec2: aws_sdk_ec2::Client, cluster: String) -> Result<Vec<Listed>, aws_sdk_ec2::Error> {
    // Terminated instances stay listed for a while; they are not fetched
    // (a known node missing from the answer is gone).
    let out = ec2
        .describe_instances()
        .filters(Filter::builder().name("tag:hangar.dev/cluster").values(cluster).build())
        .filters(
            Filter::builder()
                .name("instance-state-name")
                .set_values(Some(
                    ["pending", "running", "shutting-down", "stopping", "stopped"].map(str::to_owned).to_vec(),
                ))
                .build(),
        )
        .send()
        .await?;
    Ok(listed(&out))
}

fn between_states(i: &aws_sdk_ec2::types::Instance) -> bool {
    matches!(
        i.state().and_then(|s| s.name()),
        Some(InstanceStateName::Pending | InstanceStateName::Stopping | InstanceStateName::ShuttingDown)
    )
}

fn listed(out: &aws_sdk_ec2::operation::describe_instances::DescribeInstancesOutput) -> Vec<Listed> {
    out.reservations()
        .iter()
        .flat_map(|r| r.instances().iter().map(move |i| (r.owner_id().map(str::to_owned), i.clone())))
        .collect()
}

/// Runs on a thread and runtime of its own, so it outlives any one test's
/// runtime and can serve a whole test binary.
pub struct NodeSimulator {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    pub volumes_dir: PathBuf,
    pub nodes_dir: PathBuf,
}

impl Drop for NodeSimulator {
    fn drop(&mut self) {
        // Stopping drops the loop's state, which kills every worker.
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // The nodes' memory: their attached Secrets.
        for node in std::fs::read_dir(&self.nodes_dir).into_iter().flatten().flatten() {
            let _ = std::fs::remove_dir_all(attachments_dir(&node.file_name().to_string_lossy()));
        }
    }
}

struct SimNode {
    name: String,
    worker: Option<ChildProcess>,
    supervisor: Option<ChildProcess>,
    /// Mode agent (`restartPolicy: Never`): the agent container ended with
    /// this exit code and is not started again.
    agent_ended: Option<i32>,
    /// The workspace volume attached when the worker started.
    volume: Option<String>,
    ready: bool,
    /// When the node's kube-node-lease Lease was last renewed.
    lease_renewed: Option<std::time::Instant>,
    /// The instance metadata service, and the document it serves now.
    imds: Option<crate::imds::Imds>,
    served_document: Option<String>,
    /// The loop device standing for the attached workspace volume.
    loop_device: Option<PathBuf>,
}

impl Drop for SimNode {
    fn drop(&mut self) {
        detach_loop(&mut self.loop_device);
    }
}

impl NodeSimulator {
    pub fn start(cfg: SimConfig) -> Self {
        std::fs::create_dir_all(&cfg.volumes_dir).expect("volumes dir");
        std::fs::create_dir_all(&cfg.nodes_dir).expect("nodes dir");
        detach_stale_loops();
        let volumes_dir = cfg.volumes_dir.clone();
        let nodes_dir = cfg.nodes_dir.clone();
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("node-simulator".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
                rt.block_on(async move {
                    let client = crate::control_plane::client_from(&cfg.kubeconfig).await.expect("simulator client");
                    let ec2 = crate::ec2::client(&cfg.ec2_endpoint).await;
                    let mut nodes: HashMap<String, SimNode> = HashMap::new();
                    let mut view = Ec2View::default();
                    loop {
                        if let Err(e) = tick(&client, &ec2, &cfg, &mut nodes, &mut view).await {
                            tracing::debug!(error = %e, "node simulator tick");
                        }
                        tokio::select! {
                            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                            _ = &mut stopped => return,
                        }
                    }
                });
            })
            .expect("simulator thread");
        Self { stop: Some(stop), thread: Some(thread), volumes_dir, nodes_dir }
    }

    /// The pid of a node's worker or supervisor (`"worker"`/`"supervisor"`),
    /// for tests that kill one.
    pub fn pid(&self, node: &str, which: &str) -> Option<i32> {
        std::fs::read_to_string(self.nodes_dir.join(node).join(format!("{which}.pid"))).ok()?.trim().parse().ok()
    }

    /// The `/metrics` text of a node's worker (empty if none runs).
    pub fn worker_metrics(&self, node: &str) -> String {
        let port = std::fs::read_to_string(self.nodes_dir.join(node).join("worker.admin-port"));
        let Some(port) = port.ok().and_then(|p| p.trim().parse().ok()) else { return String::new() };
        crate::process::http_get(port, "/metrics").map(|(_, b)| b).unwrap_or_default()
    }

    /// Kills a node's worker and keeps it down (a hung worker) until the
    /// instance is powered off: a stop/start brings a fresh one.
    /// Returns once that worker is gone.
    pub fn hold_worker(&self, node: &str) {
        let pid = self.pid(node, "worker");
        let _ = std::fs::write(self.nodes_dir.join(node).join("worker.hold"), b"");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while pid.is_some_and(|p| std::path::Path::new(&format!("/proc/{p}")).exists()) {
            assert!(std::time::Instant::now() < deadline, "the held worker of {node} did not stop");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The directory standing in for a workspace volume.
    pub fn volume_dir(&self, volume_id: &str) -> PathBuf {
        self.volumes_dir.join(volume_id)
    }
}

type TickResult<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

async fn tick(
    client: &kube::Client,
    ec2: &aws_sdk_ec2::Client,
    cfg: &SimConfig,
    nodes: &mut HashMap<String, SimNode>,
    view: &mut Ec2View,
) -> TickResult {
    view.refresh(ec2, cfg).await?;
    let node_api: Api<Node> = Api::all(client.clone());
    // A node whose instance is no longer listed was terminated.
    let gone: Vec<String> = nodes
        .keys()
        .filter(|id| !view.instances.iter().any(|(_, i)| i.instance_id() == Some(id.as_str())))
        .cloned()
        .collect();
    for id in gone {
        if let Some(mut node) = nodes.remove(&id) {
            power_off(&mut node);
            let _ = node_api.delete(&node.name, &DeleteParams::default()).await;
        }
    }
    for (owner, i) in &view.instances {
        let owner = owner.as_deref();
        let Some(id) = i.instance_id() else { continue };
        let zone = i.placement().and_then(|p| p.availability_zone()).unwrap_or("ap-southeast-2a");
        let state = i.state().and_then(|s| s.name()).cloned().unwrap_or(InstanceStateName::Pending);
        match state {
            InstanceStateName::Running => {
                let node = nodes.entry(id.to_owned()).or_insert_with(|| SimNode {
                    name: id.to_owned(),
                    worker: None,
                    supervisor: None,
                    agent_ended: None,
                    volume: None,
                    ready: false,
                    lease_renewed: None,
                    imds: None,
                    served_document: None,
                    loop_device: None,
                });
                if !node.ready {
                    register(&node_api, &node.name, id, zone, true).await?;
                    node.ready = true;
                }
                // The kubelet's own heartbeat, every 10 s.
                if node.lease_renewed.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                    renew_node_lease(client, &node.name).await?;
                    node.lease_renewed = Some(std::time::Instant::now());
                }
                // The user data's hard-stop unit: at the deadline the worker
                // handed it, the instance powers itself off (a stop, by its
                // instance-initiated shutdown behaviour).
                let deadline =
                    cfg.nodes_dir.join(&node.name).join("spool").join(hangar_crds::sandbox::HARD_STOP_FILE_NAME);
                if let Some(t) = std::fs::read_to_string(&deadline).ok().and_then(|t| t.trim().parse::<i64>().ok())
                    && Timestamp::now().as_second() >= t
                {
                    tracing::info!(instance = id, "node simulator: hard-stop deadline reached; powering off");
                    let _ = std::fs::remove_file(&deadline);
                    ec2.stop_instances().instance_ids(id).send().await?;
                    continue;
                }
                // A worker that died is restarted, as its DaemonSet would;
                // one held (hung) stays down.
                let held = cfg.nodes_dir.join(&node.name).join("worker.hold").exists();
                if held && let Some(mut w) = node.worker.take() {
                    w.kill();
                }
                if node.worker.as_mut().is_some_and(|w| w.check_alive().is_err()) {
                    node.worker = None;
                }
                if node.worker.is_none()
                    && !held
                    && let Some(volume) = attached_workspace(i)
                {
                    let kubeconfig = worker_identity(client, cfg, &node.name).await?;
                    let identity = crate::imds::InstanceIdentity::of(owner, i);
                    let imds = match node.imds.take() {
                        Some(imds) => imds,
                        None => crate::imds::Imds::start().await?,
                    };
                    let document = identity.document();
                    if node.served_document.as_ref() != Some(&document) {
                        imds.serve(document.clone(), cfg.identity_authority.sign(&document)?);
                        node.served_document = Some(document);
                    }
                    if node.loop_device.is_none() {
                        node.loop_device = attach_loop(cfg, &volume);
                    }
                    let env = WorkerEnv { imds: imds.endpoint(), device: node.loop_device.clone() };
                    node.imds = Some(imds);
                    node.worker = Some(start_worker(cfg, &node.name, &volume, &kubeconfig, &env)?);
                    node.volume = Some(volume);
                }
            }
            InstanceStateName::Stopping | InstanceStateName::Stopped => {
                if let Some(node) = nodes.get_mut(id) {
                    power_off(node);
                    // What a boot clears: a hung worker, the last deadline.
                    let _ = std::fs::remove_file(cfg.nodes_dir.join(&node.name).join("worker.hold"));
                    let dir = cfg.nodes_dir.join(&node.name).join("spool");
                    let _ = std::fs::remove_file(dir.join(hangar_crds::sandbox::HARD_STOP_FILE_NAME));
                    if node.ready {
                        register(&node_api, &node.name, id, zone, false).await?;
                        node.ready = false;
                    }
                }
            }
            InstanceStateName::ShuttingDown | InstanceStateName::Terminated => {
                if let Some(mut node) = nodes.remove(id) {
                    power_off(&mut node);
                    let _ = node_api.delete(&node.name, &DeleteParams::default()).await;
                }
            }
            _ => {}
        }
    }
    report_pods(client, cfg, nodes).await
}

/// Every process of the node ends at once: worker, supervisor, commands;
/// and what it held in memory (the attached Secrets) is gone.
fn power_off(node: &mut SimNode) {
    if let Some(mut w) = node.worker.take() {
        w.kill();
    }
    if let Some(mut s) = node.supervisor.take() {
        s.kill();
    }
    kill_marked(&format!("HANGAR_SIM_NODE={}", node.name));
    let _ = std::fs::remove_dir_all(attachments_dir(&node.name));
    // The volume is detached from a stopped instance's view; the next boot
    // attaches it again.
    detach_loop(&mut node.loop_device);
}

/// The worker's view of its node beyond the volume directory.
struct WorkerEnv {
    /// The node's instance metadata service.
    imds: String,
    /// The workspace volume as a block device, where loop devices can be
    /// made (root, util-linux).
    device: Option<PathBuf>,
}

/// A loop device over `<volumes_dir>/<volume>.luks`, a sparse file made on
/// first use: the block device the worker formats LUKS2 under the session
/// key. `None` (with the reason logged) where loop devices cannot be made.
fn attach_loop(cfg: &SimConfig, volume: &str) -> Option<PathBuf> {
    if !nix::unistd::geteuid().is_root() {
        tracing::warn!("node simulator: not root, so workspace volumes are plain directories (no LUKS2 volume)");
        return None;
    }
    let image = cfg.volumes_dir.join(format!("{volume}.luks"));
    if !image.exists() {
        let made = std::fs::File::create(&image).and_then(|f| f.set_len(VOLUME_IMAGE_BYTES));
        if let Err(e) = made {
            tracing::warn!(error = %e, "node simulator: no volume image; the workspace is a plain directory");
            return None;
        }
    }
    let out = std::process::Command::new("losetup").args(["--find", "--show"]).arg(&image).output();
    match out {
        Ok(o) if o.status.success() => Some(PathBuf::from(String::from_utf8_lossy(&o.stdout).trim())),
        Ok(o) => {
            tracing::warn!(stderr = %String::from_utf8_lossy(&o.stderr), "node simulator: losetup failed; plain directory");
            None
        }
        Err(e) => {
            tracing::warn!(error = %e, "node simulator: no losetup; the workspace is a plain directory");
            None
        }
    }
}

/// Room for the LUKS2 header (16 MiB by default) and a little data; the
/// file is sparse, so it costs only what is written.
const VOLUME_IMAGE_BYTES: u64 = 32 << 20;

fn detach_loop(device: &mut Option<PathBuf>) {
    if let Some(d) = device.take() {
        let _ = std::process::Command::new("losetup").arg("--detach").arg(&d).output();
    }
}

/// Loop devices a killed test run left over simulated volumes (their
/// backing files deleted with the run's directory).
fn detach_stale_loops() {
    let Ok(out) =
        std::process::Command::new("losetup").args(["--list", "--noheadings", "-O", "NAME,BACK-FILE"]).output()
    else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some((name, back)) = line.trim().split_once(' ') else { continue };
        if back.contains("/volumes/vol-") && back.trim_end().ends_with(".luks (deleted)") {
            let _ = std::process::Command::new("losetup").arg("--detach").arg(name).output();
        }
    }
}

/// Where a node keeps the Secret volumes of its Pods: in memory (tmpfs),
/// as a kubelet does.
pub fn attachments_dir(node: &str) -> PathBuf {
    PathBuf::from("/dev/shm/hangar-sim-attachments").join(node)
}

/// The Secret volumes the agent container mounts, written for the node as
/// a kubelet would: read now (an optional Secret that is gone is an empty
/// directory), one file per key, mode 0400. Returns (source, destination).
async fn secret_volumes(client: &kube::Client, node: &str, pod: &Pod) -> TickResult<Vec<(PathBuf, String)>> {
    use std::os::unix::fs::PermissionsExt;
    let Some(spec) = pod.spec.as_ref() else { return Ok(vec![]) };
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), &ns);
    let agent = spec.containers.iter().find(|c| c.name == "agent");
    let root = attachments_dir(node);
    let _ = std::fs::remove_dir_all(&root);
    let mut out = Vec::new();
    for m in agent.iter().flat_map(|c| c.volume_mounts.iter().flatten()) {
        let Some(source) = spec.volumes.iter().flatten().find(|v| v.name == m.name).and_then(|v| v.secret.as_ref())
        else {
            continue;
        };
        let dir = root.join(&m.name);
        std::fs::create_dir_all(&dir).map_err(crate::error::io("attachment dir"))?;
        let name = source.secret_name.clone().unwrap_or_default();
        if let Some(secret) = secrets.get_opt(&name).await? {
            for (key, value) in secret.data.unwrap_or_default() {
                let file = dir.join(&key);
                std::fs::write(&file, &value.0).map_err(crate::error::io("attachment file"))?;
                std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o400))
                    .map_err(crate::error::io("attachment mode"))?;
            }
        }
        out.push((dir, m.mount_path.clone()));
    }
    Ok(out)
}

/// SIGKILL to every process whose environment holds `marker` (inherited by
/// all descendants, whatever process group they made).
fn kill_marked(marker: &str) {
    let Ok(procs) = std::fs::read_dir("/proc") else { return };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let Ok(env) = std::fs::read(p.path().join("environ")) else { continue };
        if env.split(|b| *b == 0).any(|kv| kv == marker.as_bytes()) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

fn write_pid(cfg: &SimConfig, node: &str, which: &str, pid: u32) {
    let _ = std::fs::write(cfg.nodes_dir.join(node).join(format!("{which}.pid")), pid.to_string());
}

/// Creates the Node if needed and sets its Ready condition.
async fn register(api: &Api<Node>, name: &str, instance_id: &str, zone: &str, ready: bool) -> TickResult {
    if api.get_opt(name).await?.is_none() {
        let node = Node {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                labels: Some(BTreeMap::from([
                    ("kubernetes.io/hostname".to_owned(), name.to_owned()),
                    ("kubernetes.io/arch".to_owned(), "arm64".to_owned()),
                    ("kubernetes.io/os".to_owned(), "linux".to_owned()),
                ])),
                ..Default::default()
            },
            spec: Some(NodeSpec { provider_id: Some(format!("aws:///{zone}/{instance_id}")), ..Default::default() }),
            status: None,
        };
        match api.create(&PostParams::default(), &node).await {
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            other => {
                other?;
            }
        }
    }
    let now = Time(Timestamp::now());
    let condition = NodeCondition {
        type_: "Ready".into(),
        status: if ready { "True" } else { "Unknown" }.into(),
        reason: Some(if ready { "KubeletReady" } else { "NodeStatusUnknown" }.into()),
        message: Some(if ready { "simulated kubelet is posting ready status" } else { "instance stopped" }.into()),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(now),
    };
    let status = NodeStatus { conditions: Some(vec![condition]), ..Default::default() };
    let patch = json!({"status": status});
    api.patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch)).await?;
    Ok(())
}

async fn renew_node_lease(client: &kube::Client, node: &str) -> TickResult {
    use k8s_openapi::api::coordination::v1::Lease;
    let api: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": node},
        "spec": {"holderIdentity": node, "leaseDurationSeconds": 40,
                 "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(Timestamp::now())},
    });
    api.patch(node, &PatchParams::apply("node-simulator").force(), &Patch::Apply(&lease)).await?;
    Ok(())
}

/// The workspace volume attached to an instance, from the instance's own
/// description (EC2 lists attached EBS volumes in its block device
/// mappings): no DescribeVolumes per waiting node per tick, which during a
/// launch burst made the simulator, not the operator, the queue.
fn attached_workspace(instance: &aws_sdk_ec2::types::Instance) -> Option<String> {
    instance
        .block_device_mappings()
        .iter()
        .filter(|m| m.device_name() == Some(hangar_operator::ec2::volumes::DEVICE))
        .filter_map(|m| m.ebs())
        .find(|ebs| ebs.status() == Some(&aws_sdk_ec2::types::AttachmentStatus::Attached))
        .and_then(|ebs| ebs.volume_id())
        .map(str::to_owned)
}

fn start_worker(
    cfg: &SimConfig,
    node: &str,
    volume_id: &str,
    kubeconfig: &std::path::Path,
    env: &WorkerEnv,
) -> crate::Result<ChildProcess> {
    let dir = cfg.volumes_dir.join(volume_id);
    std::fs::create_dir_all(&dir).map_err(crate::error::io("volume dir"))?;
    let node_dir = cfg.nodes_dir.join(node);
    std::fs::create_dir_all(node_dir.join("run")).map_err(crate::error::io("node dir"))?;
    let admin_port = crate::process::free_port();
    let _ = std::fs::write(node_dir.join("worker.admin-port"), admin_port.to_string());
    let mut cmd = std::process::Command::new(&cfg.worker_bin);
    cmd.env("NODE_NAME", node)
        .env("HANGAR_WORKER_ADMIN_LISTEN", format!("127.0.0.1:{admin_port}"))
        .env("HANGAR_SIM_NODE", node)
        .env("HANGAR_SPOOL_DIR", node_dir.join("spool"))
        .env("HANGAR_SUPERVISOR_SOCKET", node_dir.join("run/supervisor.sock"))
        .env("HANGAR_OUTPUT_STORE", &cfg.output_dir)
        .env("KUBECONFIG", kubeconfig)
        .env("HANGAR_SYSTEM_NAMESPACE", &cfg.system_namespace)
        .env("HANGAR_WORKSPACE_DIR", &dir)
        .env("HANGAR_HEARTBEAT_MS", cfg.heartbeat_ms.to_string())
        .env("HANGAR_IMDS_ENDPOINT", &env.imds)
        .env("HANGAR_WORKSPACE_KEY_URL", &cfg.workspace_key_url)
        .env("HANGAR_WORKSPACE_KEY_CA", &cfg.workspace_key_ca)
        .env("RUST_LOG", "info");
    if let Some(device) = &env.device {
        // The same opening as on a real node up to the mapping: the volume
        // formatted LUKS2 under the session key, the key checked on it.
        // The files stay in the directory (this simulator's processes share
        // one mount namespace, and the VM may lack device-mapper).
        cmd.env("HANGAR_WORKSPACE_DEVICE", device).env("HANGAR_WORKSPACE_PLAINTEXT_FALLBACK", "1");
    }
    tracing::info!(%node, %volume_id, "node simulator: starting worker");
    let child = ChildProcess::spawn(&format!("worker {node}"), cmd, &cfg.log_dir.join(format!("worker-{node}.log")))?;
    write_pid(cfg, node, "worker", child.id());
    Ok(child)
}

/// The worker's identity, as its DaemonSet Pod gets it in a real cluster:
/// the chart's worker ServiceAccount, with a token bound to a Pod on this
/// node, so the token names the node
/// (`authentication.kubernetes.io/node-name`) and the chart's node
/// restriction policy holds the worker to its own node's objects. The Pod
/// object stands for the DaemonSet's (no kubelet runs it); the token is
/// valid while it exists. Returns the worker's kubeconfig.
pub async fn worker_identity(client: &kube::Client, cfg: &SimConfig, node: &str) -> TickResult<PathBuf> {
    use k8s_openapi::api::authentication::v1::TokenRequest;
    use k8s_openapi::api::core::v1::ServiceAccount;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &cfg.system_namespace);
    let pod_name = format!("{WORKER_SERVICE_ACCOUNT}-{node}");
    let pod = match pods.get_opt(&pod_name).await? {
        Some(p) => p,
        None => {
            let pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": pod_name, "labels": {"app.kubernetes.io/component": "worker"}},
                "spec": {
                    "nodeName": node,
                    "serviceAccountName": WORKER_SERVICE_ACCOUNT,
                    "automountServiceAccountToken": false,
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "worker", "image": "hangar/worker:simulated"}],
                },
            }))?;
            pods.create(&PostParams::default(), &pod).await?
        }
    };
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), &cfg.system_namespace);
    // As long as a test or `make up` might run; a restarted worker gets a
    // fresh one.
    let request: TokenRequest = serde_json::from_value(json!({
        "spec": {
            "expirationSeconds": 48 * 3600,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod.metadata.name, "uid": pod.metadata.uid},
        },
    }))?;
    let issued = sas.create_token_request(WORKER_SERVICE_ACCOUNT, &PostParams::default(), &request).await?;
    let token: String = issued.status.and_then(|s| s.token).ok_or("no token issued")?;
    let mut kc = kube::config::Kubeconfig::read_from(&cfg.kubeconfig)?;
    for user in &mut kc.auth_infos {
        user.auth_info =
            Some(kube::config::AuthInfo { token: Some(token.clone().into_boxed_str().into()), ..Default::default() });
    }
    let path = cfg.nodes_dir.join(node).join("worker-kubeconfig.yaml");
    std::fs::create_dir_all(cfg.nodes_dir.join(node))?;
    std::fs::write(&path, serde_yaml::to_string(&kc)?)?;
    Ok(path)
}

/// The chart's worker ServiceAccount (release `hangar`).
pub const WORKER_SERVICE_ACCOUNT: &str = "hangar-worker";

/// Starts the agent container's entrypoint as the kubelet would, with the
/// Pod's arguments, the socket and workspace mapped to the node's dirs.
fn start_supervisor(
    cfg: &SimConfig,
    node: &str,
    volume_id: &str,
    pod: &Pod,
    mounts: &[(PathBuf, String)],
) -> crate::Result<ChildProcess> {
    let args = pod
        .spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .find(|c| c.name == "agent")
        .and_then(|c| c.args.clone())
        .unwrap_or_default();
    let socket = cfg.nodes_dir.join(node).join("run/supervisor.sock");
    let mut mapped = Vec::new();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        if a == "--socket" {
            it.next();
            mapped.extend(["--socket".to_owned(), socket.display().to_string()]);
        } else if a == "--" {
            mapped.extend(["--workdir".to_owned(), cfg.volumes_dir.join(volume_id).display().to_string(), a]);
            mapped.extend(it.by_ref());
        } else {
            mapped.push(a);
        }
    }
    if !mapped.iter().any(|a| a == "--workdir") {
        mapped.extend(["--workdir".to_owned(), cfg.volumes_dir.join(volume_id).display().to_string()]);
    }
    let mut cmd = container_command_with_mounts(&cfg.supervisor_bin, mounts);
    let message = termination_message_path(cfg, node);
    let _ = std::fs::remove_file(&message);
    cmd.args(&mapped)
        .env("HANGAR_SIM_NODE", node)
        .env("HANGAR_SIM_CONTAINER", node)
        .env("HANGAR_TERMINATION_MESSAGE_PATH", &message);
    tracing::info!(%node, "node simulator: starting the agent container's supervisor");
    let child =
        ChildProcess::spawn(&format!("supervisor {node}"), cmd, &cfg.log_dir.join(format!("supervisor-{node}.log")))?;
    write_pid(cfg, node, "supervisor", child.id());
    Ok(child)
}

/// The agent container's terminationMessagePath (a kubelet mounts a file
/// there and reports what the container wrote in it when it ends).
fn termination_message_path(cfg: &SimConfig, node: &str) -> PathBuf {
    cfg.nodes_dir.join(node).join("termination-log")
}

/// The container's PID 1 in a PID namespace of its own, as in a real
/// container: when it dies, however it dies, the kernel ends every process
/// in the namespace, commands in their own process groups included
/// (`--kill-child` ties the namespace to the `unshare` process the harness
/// holds, which itself dies with the harness). Needs root; without it the
/// supervisor runs as a plain child and relies on its own clean-up.
pub fn container_command(supervisor: &std::path::Path) -> std::process::Command {
    container_command_with_mounts(supervisor, &[])
}

/// The same, with read-only bind mounts (source, destination) in a mount
/// namespace of the container's own, as its Secret volumes: only processes
/// of this container see them at their destinations. The destination
/// directory is made on the host if missing (the mount itself is private).
pub fn container_command_with_mounts(
    supervisor: &std::path::Path,
    mounts: &[(PathBuf, String)],
) -> std::process::Command {
    if nix::unistd::geteuid().is_root() && !mounts.is_empty() {
        let mut cmd = std::process::Command::new("unshare");
        cmd.args(["--pid", "--mount", "--propagation", "private", "--fork", "--kill-child", "--", "sh", "-c"]);
        cmd.arg(
            r#"set -e; while [ "$1" != "--" ]; do mkdir -p "$2"; mount --bind -o ro "$1" "$2"; shift 2; done; shift; exec "$@""#,
        );
        cmd.arg("container");
        for (source, destination) in mounts {
            cmd.arg(source).arg(destination);
        }
        cmd.arg("--").arg(supervisor);
        return cmd;
    }
    if !mounts.is_empty() {
        tracing::warn!("node simulator: not root, so the agent's Secret volumes are not mounted");
    }
    if nix::unistd::geteuid().is_root() {
        let mut cmd = std::process::Command::new("unshare");
        cmd.args(["--pid", "--fork", "--kill-child", "--"]).arg(supervisor);
        cmd
    } else {
        std::process::Command::new(supervisor)
    }
}

/// Plays the kubelet for agent Pods on running simulated nodes.
async fn report_pods(client: &kube::Client, cfg: &SimConfig, nodes: &mut HashMap<String, SimNode>) -> TickResult {
    // No simulated node, no Pod of ours to report (and no list of every
    // hangar Pod each tick: the scale benchmark's Pods are kwok's).
    if nodes.is_empty() {
        return Ok(());
    }
    let pods: Api<Pod> = Api::all(client.clone());
    let list = pods.list(&ListParams::default().labels("app.kubernetes.io/managed-by=hangar")).await?;
    for pod in list.items {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else { continue };
        let live = nodes.values().any(|n| n.name == node && n.ready && n.worker.is_some());
        let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        if !live {
            // The instance stopped: its containers are gone until it runs again.
            if phase.as_deref() == Some("Running") && nodes.values().any(|n| n.name == node) {
                let patch =
                    json!({"status": {"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}]}});
                api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
            }
            continue;
        }
        // The container runs while its node runs; one that died restarts,
        // unless its restart policy is Never (mode agent): then it stays
        // ended and the Pod reports how, as a kubelet would.
        let never = pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()) == Some("Never");
        if let Some(n) = nodes.values_mut().find(|n| n.name == node) {
            if let Some(status) = n.supervisor.as_mut().and_then(|s| s.exit_status()) {
                // PID 1 of the container died: the container's processes go.
                kill_marked(&format!("HANGAR_SIM_CONTAINER={node}"));
                n.supervisor = None;
                if never {
                    use std::os::unix::process::ExitStatusExt;
                    n.agent_ended = Some(status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0)));
                }
            }
            if let Some(code) = n.agent_ended {
                if !matches!(phase.as_deref(), Some("Succeeded" | "Failed")) {
                    let message = std::fs::read_to_string(termination_message_path(cfg, &node)).unwrap_or_default();
                    report_ended(&api, &name, &pod, code, &message).await?;
                }
                continue;
            }
            if n.supervisor.is_none()
                && let Some(volume) = n.volume.clone()
            {
                let mounts = secret_volumes(client, &node, &pod).await?;
                n.supervisor = Some(start_supervisor(cfg, &node, &volume, &pod, &mounts)?);
            }
        }
        if phase.as_deref() == Some("Running") {
            continue;
        }
        let containers: Vec<_> = pod
            .spec
            .iter()
            .flat_map(|s| s.containers.iter())
            .map(|c| {
                json!({
                    "name": c.name, "image": c.image, "imageID": c.image, "ready": true, "restartCount": 0,
                    "started": true, "state": {"running": {"startedAt": Time(Timestamp::now())}}
                })
            })
            .collect();
        let patch = json!({"status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": containers,
        }});
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    }
    Ok(())
}

/// The agent container ended with `code`: its state is terminated; the
/// Pod has ended too when it has no other container (companions run on).
async fn report_ended(api: &Api<Pod>, name: &str, pod: &Pod, code: i32, message: &str) -> TickResult {
    let now = Time(Timestamp::now());
    let containers: Vec<_> = pod
        .spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .map(|c| {
            let state = if c.name == "agent" {
                json!({"terminated": {"exitCode": code, "reason": if code == 0 { "Completed" } else { "Error" },
                                      "message": message, "finishedAt": now}})
            } else {
                json!({"running": {"startedAt": now}})
            };
            json!({"name": c.name, "image": c.image, "imageID": c.image, "ready": c.name != "agent",
                   "restartCount": 0, "started": c.name != "agent", "state": state})
        })
        .collect();
    let alone = containers.len() == 1;
    let phase = match (alone, code) {
        (false, _) => "Running",
        (true, 0) => "Succeeded",
        (true, _) => "Failed",
    };
    let patch = json!({"status": {
        "phase": phase,
        "conditions": [{"type": "Ready", "status": "False"}],
        "containerStatuses": containers,
    }});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    Ok(())
}

//! kwok, built from its Go module: it keeps simulated Nodes Ready and
//! makes the Pods bound to them Running, with no kubelet, for benchmarks at
//! a scale that a process per node cannot reach on 2 cores. It manages only
//! Nodes annotated `kwok.x-k8s.io/node: fake`, so the node simulator's own
//! Nodes are never taken over.

use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

use crate::build::{go_binary, go_share};
use crate::control_plane::ControlPlane;
use crate::error::Result;
use crate::process::{ChildProcess, RunDir};

pub const NODE_ANNOTATION: &str = "kwok.x-k8s.io/node";
const NODE_LABEL: &str = "hangar.dev/kwok-node";

pub struct Kwok {
    process: ChildProcess,
    _dir: RunDir,
}

impl Kwok {
    /// Starts kwok on `cp` with the fast Stages (node initialise and
    /// heartbeat, pod ready and delete) and no node Leases (nothing reads
    /// them without a controller manager). It opens no port.
    pub fn start(cp: &ControlPlane) -> Result<Self> {
        Self::start_with(cp, true)
    }

    /// As `start`; without `node_heartbeat`, kwok writes a Node's status
    /// once (Ready) and not every 20–45 s after: a kubelet reports an
    /// unchanged status only every 5 minutes (its liveness is a Lease), so
    /// at thousands of nodes the heartbeat Stage would load the apiserver
    /// (and wake every Node watcher) far more than real nodes do.
    pub fn start_with(cp: &ControlPlane, node_heartbeat: bool) -> Result<Self> {
        let bin = go_binary("kwok")?;
        let share = go_share("kwok", "kwok", "KWOK_VERSION")?;
        let dir = RunDir::new("hangar-kwok")?;
        let mut stages = share.join("stages.yaml");
        if !node_heartbeat {
            let all = std::fs::read_to_string(&stages).map_err(crate::error::io("kwok stages"))?;
            let kept: Vec<&str> = all.split("\n---").filter(|doc| !doc.contains("name: node-heartbeat")).collect();
            stages = dir.path.join("stages.yaml");
            std::fs::write(&stages, kept.join("\n---")).map_err(crate::error::io("kwok stages"))?;
        }
        let mut cmd = Command::new(bin);
        // Its work dir, or it reads ~/.kwok/kwok.yaml.
        cmd.env("KWOK_WORKDIR", &dir.path).args([
            format!("--kubeconfig={}", cp.kubeconfig.display()),
            format!("--config={}", stages.display()),
            format!("--manage-nodes-with-annotation-selector={NODE_ANNOTATION}=fake"),
            "--cidr=10.0.0.0/16".into(),
            "--node-ip=10.1.0.1".into(),
            "--node-lease-duration-seconds=0".into(),
            "--v=WARN".into(),
        ]);
        let process = ChildProcess::spawn("kwok", cmd, &dir.path.join("kwok.log"))?;
        Ok(Self { process, _dir: dir })
    }

    pub fn pid(&self) -> u32 {
        self.process.id()
    }

    pub fn check_alive(&mut self) -> Result<()> {
        self.process.check_alive()
    }
}

/// Creates Nodes `{prefix}-0` … `{prefix}-{n-1}` for kwok and waits (up to
/// `within`) until kwok has made every one Ready.
pub async fn create_ready_nodes(client: &kube::Client, prefix: &str, n: usize, within: Duration) -> Vec<String> {
    let nodes: Api<Node> = Api::all(client.clone());
    let names: Vec<String> = (0..n).map(|i| format!("{prefix}-{i}")).collect();
    for name in &names {
        let node: Node = serde_json::from_value(json!({
            "metadata": {
                "name": name,
                "annotations": {NODE_ANNOTATION: "fake"},
                "labels": {NODE_LABEL: prefix, "kubernetes.io/hostname": name},
            },
        }))
        .expect("node");
        match nodes.create(&PostParams::default(), &node).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => panic!("create node {name}: {e}"),
        }
    }
    let deadline = Instant::now() + within;
    loop {
        let list =
            nodes.list(&ListParams::default().labels(&format!("{NODE_LABEL}={prefix}"))).await.expect("list nodes");
        let ready = list.items.iter().filter(|n| is_ready(n)).count();
        if ready == n {
            return names;
        }
        assert!(Instant::now() < deadline, "kwok made {ready} of {n} nodes Ready within {within:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

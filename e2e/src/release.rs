//! hangar installed by Helm onto real nodes: the chart with hangar's own
//! images (pushed to the loopback registry by digest), its Pods in the
//! node's network (`hostNetwork`; no kube-proxy runs here, so the Pods
//! reach the API server at its loopback address through
//! `kubernetesService`), EC2 from moto.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::Api;

use crate::control_plane::ControlPlane;
use crate::error::{HarnessError, Result, io};
use crate::process::free_port;
use crate::real_node::RealNode;
use crate::registry::Registry;

pub const RELEASE: &str = "hangar";
pub const NAMESPACE: &str = "hangar-system";
/// The Deployments of a release (`<release>-<component>`).
pub const DEPLOYMENTS: [&str; 3] = ["hangar-operator", "hangar-webhook", "hangar-gateway"];

/// What `install` did, and how long each part took.
pub struct Installed {
    /// Image name → reference by digest, as pushed.
    pub images: BTreeMap<String, String>,
    pub values: PathBuf,
    /// From `helm install` to every Deployment's replicas Ready.
    pub install_to_ready: Duration,
    /// The gateway's HTTPS port on the node's address.
    pub gateway_port: u16,
}

/// Pushes hangar's images to `registry` and installs the chart onto the
/// cluster's nodes (`node` is where the components land); waits until every
/// component is Ready.
pub fn install(cp: &ControlPlane, registry: &Registry, node: &RealNode, ec2_endpoint: &str) -> Result<Installed> {
    let host = format!("127.0.0.1:{}", registry.port);
    let images = crate::images::push(&host)?;
    let digest = |image: &str| images[image].rsplit_once('@').map(|(_, d)| d.to_owned()).expect("by digest");
    let api_port = cp.server.rsplit(':').next().expect("server port").to_owned();
    let gateway_port = free_port();
    let values = serde_json::json!({
        "image": {
            "repository": format!("{host}/hangar"),
            "digests": crate::images::IMAGES.iter().map(|(i, _)| (i.to_string(), digest(i))).collect::<BTreeMap<_, _>>(),
        },
        "hostNetwork": true,
        "kubernetesService": {"host": "127.0.0.1", "port": api_port},
        // One replica each: in the node's network a second would find its
        // ports taken (the chart's replicas > 1 is the simulator's part).
        "operator": {
            "replicas": 1,
            "ports": {"admin": free_port(), "metrics": free_port()},
            // moto takes any key; without one the SDK would ask the
            // instance metadata address.
            "extraEnv": [
                {"name": "AWS_ACCESS_KEY_ID", "value": "testing"},
                {"name": "AWS_SECRET_ACCESS_KEY", "value": "testing"},
            ],
        },
        "webhook": {"replicas": 1, "ports": {"https": free_port(), "admin": free_port(), "metrics": free_port()}},
        "gateway": {
            "replicas": 1,
            "ports": {"https": gateway_port, "peer": free_port(), "admin": free_port(), "metrics": free_port()},
        },
        "aws": {"region": crate::ec2::REGION, "endpointOverride": ec2_endpoint},
        // No policy engine runs on this node.
        "networkPolicy": {"enabled": false},
    });
    let path = cp.dir().join("real-node-values.json");
    std::fs::write(&path, values.to_string()).map_err(io("write values"))?;
    let _ = node;
    let started = Instant::now();
    let out = cp
        .helm()?
        .args(["install", RELEASE, &crate::chart::chart(), "-n", NAMESPACE, "--create-namespace", "-f"])
        .arg(&path)
        .output()
        .map_err(io("helm install"))?;
    if !out.status.success() {
        return Err(HarnessError::Command { command: "helm install".into(), stderr: crate::chart::text(&out) });
    }
    wait_deployments_ready(cp, Duration::from_secs(180))?;
    Ok(Installed { images, values: path, install_to_ready: started.elapsed(), gateway_port })
}

/// Polls until every Deployment of the release has all its replicas Ready.
pub fn wait_deployments_ready(cp: &ControlPlane, timeout: Duration) -> Result<()> {
    let kubeconfig = cp.kubeconfig.clone();
    let deadline = Instant::now() + timeout;
    loop {
        let pending = crate::real_node::block_on(async {
            let client = crate::control_plane::client_from(&kubeconfig).await?;
            let api = Api::<Deployment>::namespaced(client, NAMESPACE);
            let mut pending = Vec::new();
            for name in DEPLOYMENTS {
                let d = api.get_opt(name).await?;
                let want = d.as_ref().and_then(|d| d.spec.replicas).unwrap_or(1);
                let ready = d.and_then(|d| d.status?.ready_replicas).unwrap_or(0);
                if ready < want {
                    pending.push(format!("{name} {ready}/{want}"));
                }
            }
            Ok::<_, HarnessError>(pending)
        })?;
        if pending.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(HarnessError::NotReady {
                what: format!("hangar's Deployments ({})", pending.join(", ")),
                seconds: timeout.as_secs(),
                log_tail: String::new(),
            });
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

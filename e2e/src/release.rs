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
use crate::registry::{REGISTRY_HOST, Registry};
use crate::session_nodes::RealSessionNodes;

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
    /// With session nodes: the CA file of the gateway's certificate.
    pub gateway_ca: Option<PathBuf>,
}

/// The Secret the operator's workspace key service serves with.
const KEY_SERVICE_TLS_SECRET: &str = "hangar-workspace-keys-tls";
/// The gateway's, with session nodes.
const GATEWAY_TLS_SECRET: &str = "hangar-gateway-tls-local";

/// Pushes hangar's images to `registry` and installs the chart onto the
/// cluster's nodes (`node` is where the components land); waits until every
/// component is Ready. With `sessions`, sessions can run on its real
/// session nodes: the operator's key service is configured (its
/// certificate for the Service's name, which every Pod resolves to `node`
/// through `hostAliases`: no cluster DNS runs here), and the worker asks
/// the session nodes' metadata service.
pub fn install(
    cp: &ControlPlane,
    registry: &Registry,
    node: &RealNode,
    ec2_endpoint: &str,
    sessions: Option<&RealSessionNodes>,
) -> Result<Installed> {
    let host = format!("127.0.0.1:{}", registry.port);
    let images = crate::images::push(&host)?;
    let digest = |image: &str| images[image].rsplit_once('@').map(|(_, d)| d.to_owned()).expect("by digest");
    let api_port = cp.server.rsplit(':').next().expect("server port").to_owned();
    let gateway_port = free_port();
    let gateway_ca_file = cp.dir().join("gateway-ca.pem");
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
            "extraEnv": moto_keys(),
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
    let mut values = values;
    values["operator"]["registries"] = serde_json::json!({"endpoints": {REGISTRY_HOST: registry.endpoint()}});
    if let Some(sessions) = sessions {
        let key_service = format!("{RELEASE}-workspace-keys.{NAMESPACE}.svc");
        let key_ca = crate::pki::LocalCa::new("hangar-workspace-key-ca")?;
        tls_secret(cp, KEY_SERVICE_TLS_SECRET, &key_ca, &key_service, &[&node.ip.to_string()])?;
        // The gateway's certificate from a CA whose file a client (curl,
        // the CLI) can trust; the chart's own is self-signed.
        let gateway_ca = crate::pki::LocalCa::new("hangar-gateway-ca")?;
        let gateway_name = format!("{RELEASE}-gateway.{NAMESPACE}.svc");
        tls_secret(cp, GATEWAY_TLS_SECRET, &gateway_ca, &gateway_name, &[&node.ip.to_string(), "127.0.0.1"])?;
        std::fs::write(&gateway_ca_file, gateway_ca.cert_pem()).map_err(io("write the gateway's CA"))?;
        values["hostAliases"] = serde_json::json!([{"ip": node.ip.to_string(), "hostnames": [key_service]}]);
        values["nodeRoot"] = serde_json::json!(sessions.node_root());
        values["operator"]["workspaceKeys"] = serde_json::json!({
            "port": free_port(),
            "tlsSecret": KEY_SERVICE_TLS_SECRET,
            "identityCertificate": sessions.authority.cert_pem(),
        });
        let mut worker_env = moto_keys();
        worker_env.push(serde_json::json!({"name": "HANGAR_IMDS_ENDPOINT", "value": sessions.imds.endpoint()}));
        values["worker"] = serde_json::json!({
            "ports": {"admin": free_port()},
            // No EBS device here: the workspace is the node's directory.
            "workspaceDevice": "",
            "extraEnv": worker_env,
        });
        // The session node's worker writes output, the gateway reads it:
        // one store both reach, S3 on moto.
        crate::moto::create_bucket(ec2_endpoint, OUTPUT_BUCKET)?;
        values["outputStore"] = serde_json::json!({"url": format!("s3://{OUTPUT_BUCKET}"), "endpoint": ec2_endpoint});
        values["gateway"]["extraEnv"] = serde_json::json!(moto_keys());
        values["gateway"]["tls"] = serde_json::json!({"secretName": GATEWAY_TLS_SECRET});
    }
    let path = cp.dir().join("real-node-values.json");
    let gateway_ca = sessions.map(|_| gateway_ca_file);
    std::fs::write(&path, values.to_string()).map_err(io("write values"))?;
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
    Ok(Installed { images, values: path, install_to_ready: started.elapsed(), gateway_port, gateway_ca })
}

/// The output store's bucket in moto when sessions run on real nodes.
pub const OUTPUT_BUCKET: &str = "hangar-output";

/// moto takes any key; without one the SDKs would ask the instance
/// metadata address for credentials.
fn moto_keys() -> Vec<serde_json::Value> {
    vec![
        serde_json::json!({"name": "AWS_ACCESS_KEY_ID", "value": "testing"}),
        serde_json::json!({"name": "AWS_SECRET_ACCESS_KEY", "value": "testing"}),
    ]
}

/// The release's output store (S3 on moto at `endpoint`), as the gateway
/// reads it.
pub fn output_store(endpoint: &str) -> hangar_output::OutputStore {
    let s3 = object_store::aws::AmazonS3Builder::new()
        .with_bucket_name(OUTPUT_BUCKET)
        .with_region(crate::ec2::REGION)
        .with_endpoint(endpoint)
        .with_allow_http(true)
        .with_virtual_hosted_style_request(false)
        .with_access_key_id("testing")
        .with_secret_access_key("testing")
        .build()
        .expect("an S3 store");
    hangar_output::OutputStore::new(std::sync::Arc::new(s3))
}

/// A serving certificate for `name` (and `more` names) from `ca`, as the
/// `kubernetes.io/tls` Secret `secret` the chart mounts (with `ca.crt`,
/// which the workers and the webhook trust for the key service).
fn tls_secret(cp: &ControlPlane, secret: &str, ca: &crate::pki::LocalCa, name: &str, more: &[&str]) -> Result<()> {
    use k8s_openapi::api::core::v1::{Namespace, Secret};
    use kube::api::PostParams;
    let mut names = vec![name];
    names.extend_from_slice(more);
    let serving = ca.serving(name, &names)?;
    let (secret, ca_pem) = (secret.to_owned(), ca.cert_pem());
    let kubeconfig = cp.kubeconfig.clone();
    crate::real_node::block_on(async move {
        let client = crate::control_plane::client_from(&kubeconfig).await?;
        let namespace: Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": NAMESPACE}})).expect("a Namespace");
        match Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &namespace).await {
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            other => {
                other?;
            }
        }
        let secret: Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": secret},
            "type": "kubernetes.io/tls",
            "stringData": {"tls.crt": serving.cert, "tls.key": serving.key, "ca.crt": ca_pem},
        }))
        .expect("a Secret");
        Api::<Secret>::namespaced(client, NAMESPACE).create(&PostParams::default(), &secret).await?;
        Ok(())
    })
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

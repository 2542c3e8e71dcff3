//! hangar on a real node: kubelet and containerd joined to a local
//! cluster (kube-controller-manager and kube-scheduler run too), images
//! from the loopback registry only.

use std::time::Duration;

use hangar_e2e::control_plane::ControlPlane;
use hangar_e2e::real_node::{NodeSpec, RealNode};
use hangar_e2e::registry::Registry;
use hangar_e2e::release;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kube::runtime::wait::{await_condition, conditions};

/// A Pod on the Pods' network (CNI bridge) runs a container from the
/// loopback registry, its processes confined to the node's cgroups; once
/// the Pod is deleted they are gone, and once the node is dropped nothing
/// of it is left on the machine.
#[tokio::test(flavor = "multi_thread")]
async fn a_pod_runs_on_the_real_node_and_leaves_nothing_behind() {
    let cp = ControlPlane::start_cluster().expect("cluster");
    let registry = Registry::start(cp.dir(), None).expect("registry");
    let spec = NodeSpec { name: "real-node-a".into(), ..Default::default() };
    let node = RealNode::start(&cp, &registry, &spec).unwrap_or_else(|e| panic!("real node: {e}"));
    let client = cp.client().await.expect("client");
    let pods: Api<Pod> = Api::namespaced(client, "default");
    // The pause program itself as the container: it runs until stopped.
    let image = format!("127.0.0.1:{}/hangar/pause:{}", registry.port, hangar_e2e::paths::version("PAUSE_VERSION"));
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "sleeper"},
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": image}],
        }
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.expect("create pod");
    let running = tokio::time::timeout(
        Duration::from_secs(120),
        await_condition(pods.clone(), "sleeper", conditions::is_pod_running()),
    )
    .await;
    assert!(
        matches!(running, Ok(Ok(Some(_)))),
        "the Pod did not run: {:?}\nkubelet:\n{}\ncontainerd:\n{}",
        pods.get("sleeper").await.ok().and_then(|p| p.status),
        node.kubelet_log_tail(40),
        node.containerd_log_tail(40)
    );
    let ip = pods.get("sleeper").await.unwrap().status.unwrap().pod_ip.expect("pod ip");
    let subnet = node.ip.to_string().rsplit_once('.').unwrap().0.to_owned();
    assert!(ip.starts_with(&format!("{subnet}.")) && ip != node.ip.to_string(), "pod ip {ip} on the node's bridge");
    // Two processes at least: the sandbox's pause and the container's.
    assert!(node.pod_processes().len() >= 2, "the Pod runs in the node's cgroups: {:?}", node.pod_processes());

    pods.delete("sleeper", &Default::default()).await.expect("delete pod");
    let gone = tokio::time::timeout(
        Duration::from_secs(60),
        await_condition(pods.clone(), "sleeper", conditions::is_deleted("")),
    )
    .await;
    assert!(gone.is_ok(), "the Pod is deleted");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !node.pod_processes().is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(node.pod_processes().is_empty(), "the Pod's processes end with it");

    let socket = node.dir().join("containerd.sock").display().to_string();
    drop(node);
    assert!(hangar_e2e::process::processes_with(&socket).is_empty(), "no shim outlives the node");
}

/// `helm install` of the chart runs the operator, webhook and gateway as
/// real Pods from hangar's own images (by digest), each with its own
/// projected token, and each becomes Ready by its real probes.
#[tokio::test(flavor = "multi_thread")]
async fn helm_install_runs_every_component_as_a_ready_pod() {
    let cp = ControlPlane::start_cluster().expect("cluster");
    let registry = Registry::start(cp.dir(), None).expect("registry");
    let moto = hangar_e2e::moto::Moto::start(Some(cp.dir())).expect("moto");
    let spec = NodeSpec { name: "hangar-system-0".into(), ..Default::default() };
    let node = RealNode::start(&cp, &registry, &spec).unwrap_or_else(|e| panic!("real node: {e}"));
    let installed = tokio::task::block_in_place(|| release::install(&cp, &registry, &node, &moto.endpoint()))
        .unwrap_or_else(|e| {
            panic!("helm install: {e}\nkubelet:\n{}\n{}", node.kubelet_log_tail(20), node.container_logs("hangar-", 20))
        });
    println!(
        "BENCH helm install → operator, webhook and gateway Ready: {:.1} s",
        installed.install_to_ready.as_secs_f64()
    );

    let client = cp.client().await.expect("client");
    let pods: Api<Pod> = Api::namespaced(client, release::NAMESPACE);
    for component in ["operator", "webhook", "gateway"] {
        let list = pods
            .list(&kube::api::ListParams::default().labels(&format!("app.kubernetes.io/component={component}")))
            .await
            .unwrap();
        assert_eq!(list.items.len(), 1, "{component}: one Pod");
        let pod = &list.items[0];
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("hangar-system-0"), "{component} runs on the real node");
        assert_eq!(spec.service_account_name.as_deref(), Some(format!("hangar-{component}").as_str()));
        let projected = spec.volumes.iter().flatten().any(|v| {
            v.projected.as_ref().is_some_and(|p| p.sources.iter().flatten().any(|s| s.service_account_token.is_some()))
        });
        assert!(projected, "{component} mounts its own projected token");
        let status = pod.status.as_ref().unwrap();
        let container = &status.container_statuses.as_ref().unwrap()[0];
        assert!(container.ready, "{component} Ready");
        let want = installed.images[component].rsplit_once('@').unwrap().1;
        assert!(
            container.image_id.contains(want),
            "{component} runs the image by the pushed digest: {} vs {want}",
            container.image_id
        );
    }

    // The apiserver reaches the webhook Pod through its Service. Without
    // the operator's key service (not configured here) the webhook cannot
    // ask the leader, so it refuses, in its own words, and nothing is made.
    let client = cp.client().await.expect("client");
    let ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": "tenant-a"}})).unwrap();
    ns.create(&PostParams::default(), &namespace).await.expect("namespace");
    let commands: Api<hangar_crds::Command> = Api::namespaced(client, "tenant-a");
    let orphan = hangar_e2e::commands::command("orphan", "nope", &["true"], serde_json::json!({}));
    let err = commands.create(&PostParams::default(), &orphan).await.unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(e) if e.message.contains("failed calling webhook \"commands.hangar.dev\"")
            && e.message.contains("the command decider (the operator's leader): none is configured")),
        "the webhook Pod answers: {err}\n{}",
        node.container_logs("hangar-webhook", 20)
    );
    assert!(commands.get_opt("orphan").await.unwrap().is_none(), "nothing is created");
    drop(node);
}

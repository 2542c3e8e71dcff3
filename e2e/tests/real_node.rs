//! hangar on a real node: kubelet and containerd joined to a local
//! cluster (kube-controller-manager and kube-scheduler run too), images
//! from the loopback registry only.

use std::time::Duration;

use hangar_crds::Sandbox;
use hangar_e2e::control_plane::ControlPlane;
use hangar_e2e::real_node::{NodeSpec, ProcessUsage, RealNode};
use hangar_e2e::real_stack::RealStack;
use hangar_e2e::registry::Registry;
use hangar_e2e::release;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
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
    let installed = tokio::task::block_in_place(|| release::install(&cp, &registry, &node, &moto.endpoint(), None))
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

/// The operator's agent Pod on a real kubelet: the init container installs
/// the supervisor from hangar's supervisor image, and the supervisor is
/// PID 1 of the agent container (a tenant's image that carries nothing of
/// hangar's), listening on its socket in the node's socket directory.
/// The test plays the operator and the worker: the Pod is the operator's
/// (`agent_pod::build`), its two hostPaths under the node's own directory
/// (`--node-root`: this machine hosts several nodes).
#[tokio::test(flavor = "multi_thread")]
async fn the_agent_pods_supervisor_is_pid_1_on_a_real_kubelet() {
    use hangar_operator::node::agent_pod;
    let cp = ControlPlane::start_cluster().expect("cluster");
    let registry = Registry::start(cp.dir(), None).expect("registry");
    let spec = NodeSpec { name: "session-node-a".into(), ..Default::default() };
    let node = RealNode::start(&cp, &registry, &spec).unwrap_or_else(|e| panic!("real node: {e}"));
    let images = tokio::task::block_in_place(|| hangar_e2e::images::push(&format!("127.0.0.1:{}", registry.port)))
        .expect("push hangar's images");
    // A tenant's image: an index with linux/amd64 (this node) and
    // linux/arm64, one file, no supervisor in it.
    let tenant_image = hangar_e2e::registry::example_images().remove(0);
    let agent_image = tokio::task::block_in_place(|| registry.push(&tenant_image));

    let client = cp.client().await.expect("client");
    let ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": "tenant-a"}})).unwrap();
    ns.create(&PostParams::default(), &namespace).await.expect("namespace");
    let mut sandbox = hangar_e2e::sessions::sandbox("box", "commands", serde_json::json!({}));
    sandbox.metadata.namespace = Some("tenant-a".into());
    let host = node.dir().join("host");
    let supervisor = Some(images["supervisor"].as_str());
    let pod = agent_pod::build(&sandbox, "sess-1", &spec.name, &agent_image, supervisor, &host.display().to_string());
    let socket = host.join(agent_pod::HOST_SOCKET_DIR.trim_start_matches('/')).join("supervisor.sock");
    let workspace = host.join(agent_pod::HOST_WORKSPACE.trim_start_matches('/'));
    let pods: Api<Pod> = Api::namespaced(client, "tenant-a");
    let pod_name = agent_pod::pod_name("box");
    let created = std::time::Instant::now();
    pods.create(&PostParams::default(), &pod).await.expect("create the agent Pod");

    // PID 1 of its PID namespace, running the installed copy.
    let supervisor_pid1 = || node.container_init(agent_pod::SUPERVISOR);
    let deadline = created + Duration::from_secs(120);
    while supervisor_pid1().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the supervisor never ran as PID 1: {:?}\n{}",
            pods.get(&pod_name).await.ok().and_then(|p| p.status),
            node.container_logs(&pod_name, 20)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let running = created.elapsed();
    // Nothing runs on the bare mount point: the supervisor waits for the
    // worker's open workspace.
    assert!(std::os::unix::net::UnixStream::connect(&socket).is_err(), "no socket before the workspace is open");

    // Play the worker: mount the workspace on the node after the container
    // started and mark it open. The agent sees it only through the
    // volume's HostToContainer propagation.
    nix::mount::mount(Some("tmpfs"), &workspace, Some("tmpfs"), nix::mount::MsFlags::empty(), Some("size=4m"))
        .expect("mount the workspace");
    let marker = workspace.join(hangar_supervisor_protocol::WORKSPACE_OPEN_MARKER);
    std::fs::create_dir_all(marker.parent().unwrap()).unwrap();
    let opened = std::time::Instant::now();
    std::fs::write(&marker, b"").unwrap();
    let deadline = opened + Duration::from_secs(30);
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the supervisor never listened on {} after the workspace opened\n{}",
            socket.display(),
            node.container_logs(&pod_name, 20)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!(
        "BENCH agent Pod create → supervisor PID 1 on a real kubelet: {:.2} s; workspace open → supervisor listening: {} ms",
        running.as_secs_f64(),
        opened.elapsed().as_millis()
    );
    drop(node);
}

/// A whole session on real nodes, every hangar component a Pod installed
/// by Helm: the session's instance (moto) joins as a node with its
/// providerID, and the operator binds it to the session. The worker
/// DaemonSet's Pod runs there with its own projected token and becomes
/// Ready by its probe, earns the workspace key with the instance's identity
/// document, opens the workspace and heartbeats its node's Lease (a write
/// the node restriction policy checks against the token's node); the
/// agent Pod runs on the session node, its supervisor PID 1 serving on the
/// socket the worker shares, a companion container serving beside it.
/// Commands run in the tenant's image and their
/// output reaches the store (S3), read back directly and through the
/// gateway's Pod; pause stops the
/// instance (its node and every Pod process on it end), resume starts the
/// same instance, and what a command wrote to the workspace before the
/// pause is there after it; the end stops the session.
#[tokio::test(flavor = "multi_thread")]
async fn a_whole_session_runs_on_a_real_session_node() {
    use hangar_crds::Phase;
    use hangar_operator::node::agent_pod;
    use k8s_openapi::api::coordination::v1::Lease;

    let cp = ControlPlane::start_cluster().expect("cluster");
    let mut stack = RealStack::start(cp).await.unwrap_or_else(|e| panic!("hangar on a real node: {e}"));
    let tenant_image = hangar_e2e::registry::shell_image().expect("busybox-static (system-packages.sh installs it)");
    let image = stack.push(&tenant_image);
    let companion = stack.push(&hangar_e2e::registry::web_companion_image().expect("busybox-static"));
    let client = stack.cp.client().await.expect("client");
    let ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": "tenant-a"}})).unwrap();
    ns.create(&PostParams::default(), &namespace).await.expect("namespace");
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), "tenant-a");
    let sandbox = hangar_e2e::sessions::sandbox(
        "box",
        "commands",
        serde_json::json!({"image": image, "companions": [{"name": "web", "image": companion}]}),
    );
    let created = std::time::Instant::now();
    let session_id =
        sandboxes.create(&PostParams::default(), &sandbox).await.expect("create the Sandbox").uid().unwrap();
    let mut follow = Follow { stack: &mut stack, api: &sandboxes };

    let running = follow.until(Phase::Running).await;
    println!("BENCH Sandbox create → running on a real session node: {:.1} s", created.elapsed().as_secs_f64());
    // What hangar's own Pods use through the session, for the chart's
    // resources (docs/benchmarks.md).
    let system_components = ["hangar-operator", "hangar-webhook", "hangar-gateway"];
    let usage = |n: &RealNode, program: &str| -> Vec<ProcessUsage> {
        n.container_inits(program).into_iter().filter_map(ProcessUsage::of).collect()
    };
    let binary = |b: &str| format!("/usr/local/bin/{b}");
    let at_start = system_components.map(|b| usage(&follow.stack.node, &binary(b)));
    let window = std::time::Instant::now();
    let instance = running.status.unwrap().instance_id.expect("a running session names its instance");
    let session_node = follow.stack.sessions.node(&instance).expect("the instance's node");

    // The worker: the DaemonSet's Pod on the session node, Ready, its own
    // projected token.
    let pods: Api<Pod> = Api::namespaced(client.clone(), release::NAMESPACE);
    let workers =
        pods.list(&kube::api::ListParams::default().labels("app.kubernetes.io/component=worker")).await.unwrap();
    assert_eq!(workers.items.len(), 1, "one worker: the session node's");
    let worker = &workers.items[0];
    let spec = worker.spec.as_ref().unwrap();
    assert_eq!(spec.node_name.as_deref(), Some(instance.as_str()), "the worker runs on the session's node");
    assert!(
        worker.metadata.owner_references.iter().flatten().any(|o| o.kind == "DaemonSet"),
        "the DaemonSet's Pod, not one the test made"
    );
    assert!(spec.volumes.iter().flatten().any(|v| v.projected.is_some()), "its own projected token");
    // Ready by its probe: the kubelet's next probe after the worker's
    // start, which may come a moment after the session's first heartbeat.
    let ready = |p: Option<&Pod>| {
        p.and_then(|p| p.status.as_ref()?.container_statuses.as_ref()).is_some_and(|c| c.iter().all(|c| c.ready))
    };
    let worker_name = worker.metadata.name.clone().unwrap();
    tokio::time::timeout(Duration::from_secs(60), await_condition(pods.clone(), &worker_name, ready))
        .await
        .expect("the worker is Ready by its probe within 60 s")
        .expect("watch the worker");

    // Its heartbeat names this session.
    let leases: Api<Lease> = Api::namespaced(client.clone(), release::NAMESPACE);
    let lease = leases.get(&hangar_crds::heartbeat::lease_name(&instance)).await.expect("the node's heartbeat Lease");
    let annotations = lease.metadata.annotations.unwrap_or_default();
    assert_eq!(annotations.get(hangar_crds::heartbeat::SESSION_ID), Some(&session_id), "the heartbeat's session");

    // The agent Pod on the session node, its supervisor PID 1 and serving.
    let agents: Api<Pod> = Api::namespaced(client.clone(), "tenant-a");
    let agent = agents.get(&agent_pod::pod_name("box")).await.expect("the agent Pod");
    assert_eq!(agent.spec.as_ref().unwrap().node_name.as_deref(), Some(instance.as_str()));
    assert!(
        session_node.container_init(agent_pod::SUPERVISOR).is_some(),
        "the supervisor is PID 1 of the agent container"
    );
    let socket = follow
        .stack
        .sessions
        .node_root()
        .join(agent_pod::HOST_SOCKET_DIR.trim_start_matches('/'))
        .join("supervisor.sock");
    assert!(std::os::unix::net::UnixStream::connect(&socket).is_ok(), "the supervisor serves the worker's socket");

    // A command in the tenant's image, its output in the shared store; the
    // companion serves beside it on the Pod's loopback (it may still be
    // starting: a few tries).
    let commands: Api<hangar_crds::Command> = Api::namespaced(client.clone(), "tenant-a");
    let store = release::output_store(&follow.stack.moto.endpoint());
    let sent = std::time::Instant::now();
    let script = "echo hello from $(echo the session); echo kept > /workspace/kept";
    let out = run(&commands, &store, &client, &session_id, "c1", script, &follow).await;
    println!("BENCH Command create → exited on a real session node: {} ms", sent.elapsed().as_millis());
    assert_eq!(out, "hello from the session\n");
    // The same output through the gateway's Pod, as a member reads it.
    let member = tokio::task::block_in_place(|| {
        hangar_e2e::gateway::member_token(&follow.stack.cp, "tenant-a", "dev", "get,list")
    });
    let ca = std::fs::read_to_string(follow.stack.installed.gateway_ca.as_ref().expect("the gateway's CA")).unwrap();
    let url = format!(
        "https://{}:{}/v1/sandboxes/{session_id}/commands/c1/output?after=0",
        follow.stack.node.ip, follow.stack.installed.gateway_port
    );
    let read = hangar_e2e::gateway::https_client_trusting(&ca, None).get(&url).bearer_auth(&member).send().await;
    let read: serde_json::Value = read.expect("the gateway answers").json().await.expect("JSON");
    let stdout: Vec<u8> = read["chunks"]
        .as_array()
        .unwrap_or_else(|| panic!("{read}"))
        .iter()
        .filter(|c| c["stream"] == "stdout")
        .flat_map(|c| {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.decode(c["data"].as_str().unwrap()).unwrap()
        })
        .collect();
    assert_eq!(stdout, b"hello from the session\n", "through the gateway: {read}");
    let port = hangar_e2e::registry::COMPANION_PORT;
    let fetch =
        format!("for i in $(seq 40); do wget -qO- http://127.0.0.1:{port}/ && exit 0; sleep 0.25; done; exit 1");
    let page = run(&commands, &store, &client, &session_id, "c-web", &fetch, &follow).await;
    assert_eq!(page.as_bytes(), hangar_e2e::registry::COMPANION_PAGE, "the companion answers beside the agent");

    // Pause: the instance stops, and its node with it.
    hangar_e2e::sessions::set_state(&sandboxes, "box", "Paused").await.expect("pause");
    let paused = follow.until(Phase::Paused).await;
    assert_eq!(paused.status.unwrap().instance_id.as_deref(), Some(instance.as_str()), "the same instance, kept");
    assert!(follow.stack.sessions.node(&instance).is_none(), "a stopped instance has no node");

    // Resume on the same instance: the workspace kept what c1 wrote.
    hangar_e2e::sessions::set_state(&sandboxes, "box", "Running").await.expect("resume");
    let resumed = follow.until(Phase::Running).await.status.unwrap();
    assert_eq!(resumed.instance_id.as_deref(), Some(instance.as_str()), "resumed on the same instance");
    let out =
        run(&commands, &store, &client, &session_id, "c2", "read line < /workspace/kept; echo $line", &follow).await;
    assert_eq!(out, "kept\n", "the workspace survived the pause");
    let window = window.elapsed();
    for (b, before) in system_components.iter().zip(&at_start) {
        let now = usage(&follow.stack.node, &binary(b));
        assert!(!now.is_empty() && !before.is_empty(), "{b} runs on the system node");
        let peak = now.iter().map(|u| u.peak_rss_kib).max().unwrap();
        let cpu = now.iter().map(|u| u.cpu).sum::<Duration>().saturating_sub(before.iter().map(|u| u.cpu).sum());
        println!(
            "BENCH {b}: peak RSS {:.1} MiB (largest of {} replicas); CPU {:.0} ms in the session's {:.1} s ({:.3} cores)",
            peak as f64 / 1024.0,
            now.len(),
            cpu.as_secs_f64() * 1e3,
            window.as_secs_f64(),
            cpu.as_secs_f64() / window.as_secs_f64()
        );
    }
    let session_node = follow.stack.sessions.node(&instance).expect("the resumed instance's node");
    for (b, program) in
        [("hangar-worker", binary("hangar-worker")), ("hangar-supervisor", agent_pod::SUPERVISOR.into())]
    {
        let now = usage(session_node, &program);
        assert!(!now.is_empty(), "{b} runs on the session node");
        let peak = now.iter().map(|u| u.peak_rss_kib).max().unwrap();
        println!("BENCH {b}: peak RSS {:.1} MiB since the resume", peak as f64 / 1024.0);
    }

    // The end.
    hangar_e2e::sessions::set_state(&sandboxes, "box", "Ended").await.expect("end");
    follow.until(Phase::Ended).await;
}

/// Follows EC2 (each running instance boots its node, a stopped one loses
/// it) until the Sandbox reaches a phase.
struct Follow<'a> {
    stack: &'a mut RealStack,
    api: &'a Api<Sandbox>,
}

impl Follow<'_> {
    async fn until(&mut self, want: hangar_crds::Phase) -> Sandbox {
        let deadline = std::time::Instant::now() + Duration::from_secs(300);
        loop {
            self.stack.follow().await.unwrap_or_else(|e| panic!("session node: {e}"));
            let s = self.api.get("box").await.expect("the Sandbox");
            if s.status.as_ref().and_then(|st| st.phase) == Some(want) {
                return s;
            }
            assert!(std::time::Instant::now() < deadline, "never {want:?}: {:?}\n{}", s.status, self.logs());
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The operator's and the session node's worker's last lines.
    fn logs(&self) -> String {
        let workers: String = self.stack.sessions.nodes().map(|n| n.container_logs("hangar-worker", 30)).collect();
        format!("operator:\n{}\nworker:\n{workers}", self.stack.node.container_logs("hangar-operator", 30))
    }
}

/// Runs `sh -c script` as Command `name` until it exits 0; its stdout, read
/// from the output store under the attempt's key.
async fn run(
    commands: &Api<hangar_crds::Command>,
    store: &hangar_output::OutputStore,
    client: &kube::Client,
    session_id: &str,
    name: &str,
    script: &str,
    follow: &Follow<'_>,
) -> String {
    use hangar_e2e::commands as cmds;
    cmds::create(commands, &cmds::sh(name, "box", script)).await;
    let exited = |c: &hangar_crds::Command| cmds::phase(c) == Some(hangar_crds::CommandPhase::Exited);
    let describe = |c: Option<&hangar_crds::Command>| format!("{:?}\n{}", c.map(|c| &c.status), follow.logs());
    let done = hangar_e2e::sessions::wait_object(commands, name, "exited", exited, describe).await;
    let status = done.status.unwrap();
    assert_eq!(status.exit_code, Some(0), "{name}");
    let keys = cmds::output_keys(client, session_id, status.attempt.unwrap()).await;
    let key = |a: u32| keys.get(&a).map(|k| hangar_output::AttemptKey::from_bytes(k).expect("key"));
    let number = status.number.unwrap() as u32;
    let chunks = store.read_after(session_id, number, 0, &key).await.expect("read the output");
    String::from_utf8_lossy(&cmds::stream(&chunks, hangar_output::Stream::Stdout)).into_owned()
}

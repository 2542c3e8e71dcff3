//! The Helm charts: lint clean, the values schema refuses bad values, every
//! RBAC rule says why it exists, the chart installs into a real apiserver
//! (CRDs Established) granting each component only what it needs, and the
//! hangar-crds chart upgrades the CRDs keeping every session.

use hangar_e2e::ControlPlane;
use hangar_e2e::chart::{chart, find, helm, render, text};
use hangar_e2e::paths::repo_root;

fn grants(role: &serde_yaml::Value, resource: &str) -> bool {
    role["rules"]
        .as_sequence()
        .into_iter()
        .flatten()
        .any(|r| r["resources"].as_sequence().into_iter().flatten().any(|x| x.as_str() == Some(resource)))
}

#[test]
fn lint_is_clean() {
    let crds_chart = repo_root().join("charts/hangar-crds").display().to_string();
    for chart in [chart(), crds_chart] {
        let out = helm(&["lint", "--strict", &chart]);
        assert!(out.status.success(), "{chart}: {}", text(&out));
        assert!(text(&out).contains("0 chart(s) failed"), "{chart}: {}", text(&out));
    }
}

/// The two charts are released together: the CRDs a hangar version
/// expects are the hangar-crds chart of the same version.
#[test]
fn the_crds_chart_has_the_hangar_charts_version() {
    let meta = |chart: &str| -> serde_yaml::Value {
        serde_yaml::from_str(&std::fs::read_to_string(repo_root().join(chart).join("Chart.yaml")).unwrap()).unwrap()
    };
    let (hangar, crds) = (meta("charts/hangar"), meta("charts/hangar-crds"));
    for key in ["version", "appVersion", "kubeVersion"] {
        assert_eq!(hangar[key], crds[key], "{key}");
    }
}

#[test]
fn every_rbac_rule_has_a_comment() {
    let dir = repo_root().join("charts/hangar/templates");
    let mut rules = 0;
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let body = std::fs::read_to_string(entry.path()).unwrap();
        let lines: Vec<&str> = body.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if line.trim_start().starts_with("- apiGroups:") {
                rules += 1;
                let prev = lines[..i].iter().rev().find(|l| !l.trim().is_empty()).unwrap_or(&"");
                assert!(
                    prev.trim_start().starts_with('#'),
                    "{}:{}: RBAC rule without a comment saying why",
                    entry.path().display(),
                    i + 1
                );
            }
        }
    }
    assert!(rules >= 10, "found only {rules} rules");
}

#[test]
fn values_schema_refuses_bad_values() {
    for (set, expect) in [
        ("operator.replicas=0", "minimum"),
        ("typo=1", "additional properties 'typo' not allowed"),
        ("aws.region=Sydney", "aws/region"),
        ("image.digests.operator=latest", "image/digests/operator"),
        ("image.digests.other=sha256:00", "image/digests"),
        ("watchNamespaces[0]=Team_A", "watchNamespaces/0"),
        ("aws.instanceProfile=arn:aws:iam::123:role/not-a-profile", "aws/instanceProfile"),
        ("nodeRoot=srv/node", "nodeRoot"),
        ("worker.ports.admin=0", "minimum"),
        ("hostAliases[0].ip=10.0.0.9", "hostnames"),
        ("outputStore.endpoint=s3.example.com", "outputStore/endpoint"),
    ] {
        let out = helm(&["template", "hangar", &chart(), "--set", set]);
        assert!(!out.status.success(), "--set {set} was accepted");
        assert!(text(&out).contains(expect), "--set {set}: {}", text(&out));
    }
}

#[test]
fn operator_runs_leader_elected() {
    let docs = render(&[]);
    let deploy = find(&docs, "Deployment", "hangar-operator", Some("hangar-system")).expect("operator Deployment");
    let container = &deploy["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<&str> = container["args"].as_sequence().unwrap().iter().filter_map(|a| a.as_str()).collect();
    assert!(args.contains(&"--leader-elect=true"), "{args:?}");
    assert!(args.contains(&"--leader-election-namespace=hangar-system"), "{args:?}");
    assert_eq!(deploy["spec"]["replicas"].as_u64(), Some(2));
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"].as_bool(), Some(true));
    let leases = find(&docs, "Role", "hangar-operator-system", Some("hangar-system")).expect("system Role");
    assert!(grants(leases, "leases"));
}

#[test]
fn each_deployment_keeps_a_replica_through_a_drain() {
    let docs = render(&[]);
    let deployments: Vec<&serde_yaml::Value> = docs.iter().filter(|d| d["kind"] == "Deployment").collect();
    assert_eq!(deployments.len(), 3, "operator, webhook, gateway");
    for d in deployments {
        let name = d["metadata"]["name"].as_str().unwrap();
        let pdb =
            find(&docs, "PodDisruptionBudget", name, Some("hangar-system")).unwrap_or_else(|| panic!("{name}: no PDB"));
        assert_eq!(pdb["spec"]["minAvailable"].as_u64(), Some(1), "{name}");
        let pod_labels = d["spec"]["template"]["metadata"]["labels"].as_mapping().unwrap();
        let selector = pdb["spec"]["selector"]["matchLabels"].as_mapping().unwrap();
        for (k, v) in selector {
            assert_eq!(pod_labels.get(k), Some(v), "{name}: the PDB selects this Deployment's Pods ({k:?})");
        }
        assert_eq!(selector.get("app.kubernetes.io/component"), pod_labels.get("app.kubernetes.io/component"));
    }
    // One replica: no budget (it would forbid every eviction, and so every drain).
    let single = render(&["--set", "gateway.replicas=1"]);
    assert!(find(&single, "PodDisruptionBudget", "hangar-gateway", None).is_none());
    assert!(find(&single, "PodDisruptionBudget", "hangar-operator", None).is_some());
}

#[test]
fn every_workload_runs_hardened() {
    let docs = render(&[]);
    let mut checked = 0;
    for d in docs.iter().filter(|d| d["kind"] == "Deployment" || d["kind"] == "DaemonSet") {
        let name = d["metadata"]["name"].as_str().unwrap();
        let pod = &d["spec"]["template"]["spec"];
        for c in pod["containers"].as_sequence().unwrap() {
            let sc = &c["securityContext"];
            let who = format!("{name}/{}", c["name"].as_str().unwrap());
            assert_eq!(sc["readOnlyRootFilesystem"].as_bool(), Some(true), "{who}");
            assert!(c["resources"]["requests"].is_mapping(), "{who}: requests set");
            assert!(c["resources"]["limits"]["memory"].is_string(), "{who}: a memory limit");
            if d["kind"] == "DaemonSet" {
                // The worker opens LUKS volumes and mounts them for the
                // session's agent: the one privileged container, alone on
                // its session's node.
                assert_eq!(who, "hangar-worker/worker", "the only DaemonSet container");
                assert_eq!(sc["privileged"].as_bool(), Some(true));
                continue;
            }
            assert_eq!(sc["allowPrivilegeEscalation"].as_bool(), Some(false), "{who}");
            assert!(sc["privileged"].is_null() || sc["privileged"].as_bool() == Some(false), "{who}");
            let drops: Vec<&str> =
                sc["capabilities"]["drop"].as_sequence().unwrap().iter().filter_map(|v| v.as_str()).collect();
            assert_eq!(drops, ["ALL"], "{who}");
            assert!(sc["capabilities"]["add"].is_null(), "{who}: no capability added");
            checked += 1;
        }
        if d["kind"] == "Deployment" {
            assert_eq!(pod["securityContext"]["runAsNonRoot"].as_bool(), Some(true), "{name}");
            assert_eq!(pod["securityContext"]["seccompProfile"]["type"].as_str(), Some("RuntimeDefault"), "{name}");
            assert!(pod["hostNetwork"].is_null() && pod["hostPID"].is_null(), "{name}: no host namespaces");
        }
    }
    assert_eq!(checked, 3, "the three Deployments' containers were checked");
}

/// In the node's network (`hostNetwork`) a component listens on the node's
/// own address (`$(POD_IP)`, defined before it) and on the ports the
/// values give, never on every node interface; by default it listens on
/// its Pod's addresses and asks no host namespace.
#[test]
fn host_network_binds_the_nodes_address_on_the_given_ports() {
    let listeners = |docs: &[serde_yaml::Value]| -> Vec<(String, String)> {
        let mut found = Vec::new();
        for d in docs.iter().filter(|d| d["kind"] == "Deployment") {
            let pod = &d["spec"]["template"]["spec"];
            for c in pod["containers"].as_sequence().unwrap() {
                let env = c["env"].as_sequence().unwrap();
                let pod_ip = env.iter().position(|e| e["name"] == "POD_IP");
                for (i, e) in env.iter().enumerate() {
                    let name = e["name"].as_str().unwrap();
                    if name.ends_with("_LISTEN") {
                        let value = e["value"].as_str().unwrap().to_owned();
                        if value.starts_with("$(POD_IP)") {
                            assert!(pod_ip.is_some_and(|p| p < i), "{name}: POD_IP is defined before it");
                        }
                        found.push((name.to_owned(), value));
                    }
                }
            }
        }
        found
    };
    let default = render(&[]);
    assert!(listeners(&default).iter().all(|(_, v)| v.starts_with("0.0.0.0:")), "{:?}", listeners(&default));
    let ports = [
        "operator.ports.admin=18080",
        "operator.ports.metrics=18443",
        "webhook.ports.https=28443",
        "webhook.ports.admin=29090",
        "webhook.ports.metrics=29443",
        "gateway.ports.https=38443",
        "gateway.ports.peer=38444",
        "gateway.ports.admin=39090",
        "gateway.ports.metrics=39443",
    ];
    let mut args = vec!["--set", "hostNetwork=true"];
    for p in &ports {
        args.extend(["--set", p]);
    }
    let docs = render(&args);
    let found = listeners(&docs);
    // operator: admin, metrics; webhook: https, metrics, admin; gateway:
    // https, admin, metrics, peer.
    assert_eq!(found.len(), 9, "{found:?}");
    for (name, value) in &found {
        assert!(value.starts_with("$(POD_IP):"), "{name}={value}: only the node's address");
        let port = value.rsplit(':').next().unwrap();
        assert!(ports.iter().any(|p| p.ends_with(&format!("={port}"))), "{name}={value}: a port from the values");
    }
    for d in docs.iter().filter(|d| d["kind"] == "Deployment") {
        let pod = &d["spec"]["template"]["spec"];
        assert_eq!(pod["hostNetwork"].as_bool(), Some(true));
        assert_eq!(pod["dnsPolicy"].as_str(), Some("ClusterFirstWithHostNet"));
    }
}

/// The session node's settings: the worker's host paths and the agent
/// Pod's (the operator's `--node-root`) under one `nodeRoot`, the worker's
/// probes on its loopback admin port, and `hostAliases` in every Pod.
#[test]
fn session_node_values_reach_the_worker_and_the_operator() {
    let default = render(&[]);
    let host_paths = |ds: &serde_yaml::Value| -> Vec<String> {
        let volumes = ds["spec"]["template"]["spec"]["volumes"].as_sequence().unwrap();
        let paths = volumes.iter().filter_map(|v| v["hostPath"]["path"].as_str()).filter(|p| p.contains("hangar"));
        paths.map(str::to_owned).collect()
    };
    let worker = find(&default, "DaemonSet", "hangar-worker", None).unwrap();
    assert_eq!(host_paths(worker), ["/var/lib/hangar", "/var/run/hangar"], "a real node's own paths by default");
    let args = [
        "--set",
        "nodeRoot=/srv/node-a",
        "--set",
        "worker.ports.admin=19091",
        "--set-json",
        r#"hostAliases=[{"ip":"10.0.0.9","hostnames":["hangar-workspace-keys.hangar-system.svc"]}]"#,
    ];
    let docs = render(&args);
    let worker = find(&docs, "DaemonSet", "hangar-worker", None).unwrap();
    assert_eq!(host_paths(worker), ["/srv/node-a/var/lib/hangar", "/srv/node-a/var/run/hangar"]);
    let operator = find(&docs, "Deployment", "hangar-operator", None).unwrap();
    let op_args = operator["spec"]["template"]["spec"]["containers"][0]["args"].as_sequence().unwrap();
    assert!(op_args.iter().any(|a| a == "--node-root=/srv/node-a"), "the agent Pod's host paths match: {op_args:?}");
    let c = &worker["spec"]["template"]["spec"]["containers"][0];
    let env = c["env"].as_sequence().unwrap();
    let admin = env.iter().find(|e| e["name"] == "HANGAR_WORKER_ADMIN_LISTEN").unwrap();
    assert_eq!(admin["value"].as_str(), Some("127.0.0.1:19091"), "loopback only");
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["host"].as_str(), Some("127.0.0.1"), "{probe}: the node's loopback");
        assert_eq!(get["port"].as_u64(), Some(19091), "{probe}");
        assert_eq!(get["path"].as_str(), Some(path), "{probe}");
    }
    assert_eq!(c["securityContext"]["runAsUser"].as_u64(), Some(0), "the worker mounts: root");
    for d in docs.iter().filter(|d| d["kind"] == "Deployment" || d["kind"] == "DaemonSet") {
        let aliases = &d["spec"]["template"]["spec"]["hostAliases"];
        assert_eq!(aliases[0]["ip"].as_str(), Some("10.0.0.9"), "{}", d["metadata"]["name"].as_str().unwrap());
    }
    assert!(default.iter().all(|d| d["spec"]["template"]["spec"]["hostAliases"].is_null()), "no aliases unless asked");
}

/// The operator writes certificates and the gateway reads output in the
/// output store: without an S3 URL a directory, which a read-only root
/// filesystem must get as a volume.
#[test]
fn the_local_output_store_is_a_writable_volume() {
    for (values, want) in [(&[][..], true), (&["--set", "outputStore.url=s3://hangar-output"][..], false)] {
        let docs = render(values);
        for name in ["hangar-operator", "hangar-gateway"] {
            let pod = &find(&docs, "Deployment", name, None).unwrap()["spec"]["template"]["spec"];
            let mounted = pod["containers"][0]["volumeMounts"]
                .as_sequence()
                .into_iter()
                .flatten()
                .any(|m| m["mountPath"] == "/var/lib/hangar/output" && m["readOnly"].as_bool() != Some(true));
            let volume = pod["volumes"].as_sequence().into_iter().flatten().any(|v| v["emptyDir"].is_mapping());
            assert_eq!((mounted, volume), (want, want), "{name} with {values:?}");
        }
    }
}

/// An S3-compatible endpoint (a VPC endpoint, MinIO) reaches everyone
/// who writes or reads the output store, and only with an S3 URL.
#[test]
fn the_output_store_endpoint_reaches_its_writers_and_readers() {
    let endpoint = "https://s3.vpce-0a1b.example";
    let set =
        ["--set", "outputStore.url=s3://hangar-output", "--set", "outputStore.endpoint=https://s3.vpce-0a1b.example"];
    let env_of = |docs: &[serde_yaml::Value], kind: &str, name: &str| -> Option<String> {
        let c = &find(docs, kind, name, None).unwrap()["spec"]["template"]["spec"]["containers"][0];
        let env = c["env"].as_sequence().unwrap();
        env.iter()
            .find(|e| e["name"] == "HANGAR_OUTPUT_S3_ENDPOINT")
            .and_then(|e| e["value"].as_str())
            .map(str::to_owned)
    };
    let docs = render(&set);
    assert_eq!(env_of(&docs, "DaemonSet", "hangar-worker").as_deref(), Some(endpoint), "the worker writes output");
    assert_eq!(env_of(&docs, "Deployment", "hangar-gateway").as_deref(), Some(endpoint), "the gateway reads it");
    let operator = find(&docs, "Deployment", "hangar-operator", None).unwrap();
    let args = operator["spec"]["template"]["spec"]["containers"][0]["args"].as_sequence().unwrap();
    assert!(args.iter().any(|a| a.as_str() == Some(&format!("--output-s3-endpoint={endpoint}"))), "{args:?}");
    let local = render(&["--set", "outputStore.endpoint=https://s3.vpce-0a1b.example"]);
    assert_eq!(env_of(&local, "Deployment", "hangar-gateway"), None, "no S3 URL: the local directory, no endpoint");
}

/// Every component that talks to the apiserver mounts its own token (the
/// ServiceAccounts mount none by default): without it the webhook, gateway
/// and worker could not reach the API in a real cluster.
#[test]
fn every_component_that_calls_the_api_mounts_its_own_token() {
    let docs = render(&[]);
    for (kind, name) in [
        ("Deployment", "hangar-operator"),
        ("Deployment", "hangar-webhook"),
        ("Deployment", "hangar-gateway"),
        ("DaemonSet", "hangar-worker"),
    ] {
        let workload = find(&docs, kind, name, Some("hangar-system")).unwrap_or_else(|| panic!("{kind} {name}"));
        let spec = &workload["spec"]["template"]["spec"];
        assert_eq!(spec["automountServiceAccountToken"].as_bool(), Some(true), "{kind} {name}");
        let sa = spec["serviceAccountName"].as_str().unwrap();
        let account = find(&docs, "ServiceAccount", sa, Some("hangar-system")).expect("its ServiceAccount");
        assert_eq!(account["automountServiceAccountToken"].as_bool(), Some(false), "{sa}: nothing else gets one");
    }
}

/// The flags and environment the chart gives the operator are ones the
/// binary accepts (clap refuses unknown flags and bad values).
#[test]
fn operator_accepts_the_charts_flags_and_environment() {
    let docs = render(&[
        "--set",
        "aws.subnets.ap-southeast-2a=subnet-0a1b",
        "--set",
        "aws.securityGroups[0]=sg-0c1d",
        "--set",
        "aws.amiId=ami-0e1f",
        "--set",
        "aws.instanceProfile=hangar-session-node",
        "--set",
        "outputStore.url=s3://hangar-output",
        "--set",
        "outputStore.endpoint=https://s3.vpce-0a1b.example",
        "--set",
        "watchNamespaces={team-a}",
        "--set",
        "operator.workspaceKeys.tlsSecret=workspace-keys-tls",
        "--set",
        "operator.workspaceKeys.identityCertificate=PEM",
    ]);
    let deploy = find(&docs, "Deployment", "hangar-operator", Some("hangar-system")).unwrap();
    let container = &deploy["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<String> =
        container["args"].as_sequence().unwrap().iter().map(|a| a.as_str().unwrap().to_owned()).collect();
    let mut cmd = std::process::Command::new(hangar_e2e::operator::workspace_binary("hangar-operator"));
    cmd.args(&args).arg("--print-settings");
    for e in container["env"].as_sequence().unwrap() {
        if let Some(v) = e["value"].as_str() {
            cmd.env(e["name"].as_str().unwrap(), v);
        }
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", text(&out));
    let printed = text(&out);
    for want in [
        "subnet-0a1b",
        "sg-0c1d",
        "ami-0e1f",
        "hangar-session-node",
        "s3://hangar-output",
        "https://s3.vpce-0a1b.example",
        "team-a",
        "m7g.large",
        "leader_elect: true",
        "\"0.0.0.0:8443\"",
        "/etc/hangar/instance-identity/certificate.pem",
        "ghcr.io/hangar-dev/hangar/supervisor:",
    ] {
        assert!(printed.contains(want), "{want} not in the parsed settings: {printed}");
    }
}

#[test]
fn namespaced_install_keeps_namespaced_rights_in_those_namespaces() {
    let cluster_wide = render(&[]);
    let role = find(&cluster_wide, "ClusterRole", "hangar-operator-cluster", None).unwrap();
    assert!(grants(role, "sandboxes") && grants(role, "pods"), "cluster-wide install serves every namespace");

    let docs = render(&["--set", "watchNamespaces={team-a,team-b}"]);
    let role = find(&docs, "ClusterRole", "hangar-operator-cluster", None).unwrap();
    assert!(grants(role, "nodes") && grants(role, "sandboxtemplates"), "cluster-scoped kinds stay cluster-wide");
    for r in ["sandboxes", "pods", "secrets"] {
        assert!(!grants(role, r), "namespaced install must not grant {r} cluster-wide");
    }
    // The webhook reads attachments' Secrets only where it serves.
    assert!(find(&docs, "ClusterRole", "hangar-webhook", None).is_none());
    let wh = find(&docs, "Role", "hangar-webhook", Some("team-a")).expect("webhook Role in team-a");
    assert!(grants(wh, "secrets"));
    assert!(find(&docs, "Role", "hangar-webhook", Some("hangar-system")).is_none_or(|r| !grants(r, "secrets")));
    for ns in ["team-a", "team-b"] {
        let role = find(&docs, "Role", "hangar-operator", Some(ns)).unwrap_or_else(|| panic!("Role in {ns}"));
        assert!(grants(role, "sandboxes") && grants(role, "pods"));
        assert!(find(&docs, "RoleBinding", "hangar-operator", Some(ns)).is_some());
    }
}

#[test]
fn network_policies_close_the_webhook_and_the_admin_ports() {
    let docs = render(&["--set", "networkPolicy.webhookFrom[0].ipBlock.cidr=10.0.0.0/28"]);
    let webhook = find(&docs, "NetworkPolicy", "hangar-webhook", Some("hangar-system")).expect("webhook policy");
    let rules = webhook["spec"]["ingress"].as_sequence().unwrap();
    let port = |r: &serde_yaml::Value| r["ports"][0]["port"].as_u64();
    let https = rules.iter().find(|r| port(r) == Some(8443)).unwrap();
    assert_eq!(
        https["from"][0]["ipBlock"]["cidr"].as_str(),
        Some("10.0.0.0/28"),
        "reviews from the control plane only"
    );
    let admin = rules.iter().find(|r| port(r) == Some(9090)).unwrap();
    assert_eq!(admin["from"].as_sequence().map(Vec::len), Some(1), "admin port: hangar's namespace only");
    assert_eq!(admin["ports"][1]["port"].as_u64(), Some(9443), "the metrics port: the same sources");
    for component in ["operator", "gateway"] {
        let p = find(&docs, "NetworkPolicy", &format!("hangar-{component}"), Some("hangar-system")).unwrap();
        let text = serde_yaml::to_string(&p["spec"]["ingress"]).unwrap();
        assert!(text.contains("port: 9443"), "{component}: the metrics port is listed: {text}");
    }
    let operator = find(&docs, "NetworkPolicy", "hangar-operator", Some("hangar-system")).expect("operator policy");
    assert_eq!(port(&operator["spec"]["ingress"][0]), Some(8080));
    assert!(operator["spec"]["ingress"][0]["from"][0]["podSelector"].is_mapping());
    let gateway = find(&docs, "NetworkPolicy", "hangar-gateway", Some("hangar-system")).expect("gateway policy");
    assert!(gateway["spec"]["ingress"][0]["from"].is_null(), "the gateway's API is public");
    assert!(
        find(&render(&["--set", "networkPolicy.enabled=false"]), "NetworkPolicy", "hangar-webhook", None).is_none()
    );
}

#[test]
fn metrics_readers_are_bound_only_as_configured() {
    let docs = render(&[]);
    let reader = find(&docs, "ClusterRole", "hangar-metrics-reader", None).expect("the reader role");
    let rules = serde_yaml::to_string(&reader["rules"]).unwrap();
    assert!(rules.contains("/metrics") && !rules.contains("resources"), "non-resource URLs only: {rules}");
    assert!(find(&docs, "ClusterRoleBinding", "hangar-metrics-reader", None).is_none(), "no reader by default");
    let docs = render(&[
        "--set",
        "metrics.readers[0].kind=ServiceAccount",
        "--set",
        "metrics.readers[0].name=prometheus",
        "--set",
        "metrics.readers[0].namespace=monitoring",
    ]);
    let binding = find(&docs, "ClusterRoleBinding", "hangar-metrics-reader", None).expect("the readers' binding");
    assert_eq!(binding["subjects"][0]["name"].as_str(), Some("prometheus"));
    assert_eq!(binding["roleRef"]["name"].as_str(), Some("hangar-metrics-reader"));
    for component in ["operator", "webhook", "gateway"] {
        let d = find(&docs, "Deployment", &format!("hangar-{component}"), Some("hangar-system")).unwrap();
        let ports = serde_yaml::to_string(&d["spec"]["template"]["spec"]["containers"][0]["ports"]).unwrap();
        assert!(ports.contains("containerPort: 9443"), "{component} declares its metrics port: {ports}");
    }
}

#[test]
fn the_webhook_demands_the_apiservers_certificate_when_given_its_ca() {
    let env = |docs: &[serde_yaml::Value]| {
        let d = find(docs, "Deployment", "hangar-webhook", Some("hangar-system")).expect("webhook");
        serde_yaml::to_string(&d["spec"]["template"]["spec"]["containers"][0]["env"]).unwrap()
    };
    assert!(!env(&render(&[])).contains("HANGAR_WEBHOOK_CLIENT_CA"));
    let docs = render(&["--set", "webhook.clientCA.secretName=apiserver-admission-ca"]);
    assert!(env(&docs).contains("HANGAR_WEBHOOK_CLIENT_CA"));
    let d = find(&docs, "Deployment", "hangar-webhook", Some("hangar-system")).unwrap();
    let spec = &d["spec"]["template"]["spec"];
    assert!(serde_yaml::to_string(&spec["volumes"]).unwrap().contains("apiserver-admission-ca"));
    // Probes go to the admin port: the kubelet has no client certificate.
    assert_eq!(spec["containers"][0]["readinessProbe"]["httpGet"]["port"].as_str(), Some("admin"));
}

fn can_i(cp: &ControlPlane, sa: &str, args: &[&str]) -> bool {
    let out = cp
        .kubectl()
        .args(["auth", "can-i", "--as", &format!("system:serviceaccount:hangar-system:{sa}")])
        .args(args)
        .output()
        .unwrap();
    let answer = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(answer == "yes" || answer == "no", "can-i {args:?}: {}", text(&out));
    answer == "yes"
}

#[test]
fn chart_installs_and_grants_least_privilege() {
    let cp = ControlPlane::start_without_crds().expect("control plane");
    let out = cp
        .helm()
        .unwrap()
        .args(["install", "hangar", &chart(), "-n", "hangar-system", "--create-namespace"])
        .output()
        .unwrap();
    assert!(out.status.success(), "helm install: {}", text(&out));

    // The chart's crds/ installed the four CRDs.
    let names = ["sandboxes", "commands", "sessiontokens", "sandboxtemplates"].map(|n| format!("crd/{n}.hangar.dev"));
    let out =
        cp.kubectl().args(["wait", "--for=condition=Established", "--timeout=60s"]).args(&names).output().unwrap();
    assert!(out.status.success(), "CRDs Established: {}", text(&out));
    let out = cp.kubectl().args(["get", "deploy,sa", "-n", "hangar-system", "-o", "name"]).output().unwrap();
    for obj in ["deployment.apps/hangar-operator", "serviceaccount/hangar-operator", "serviceaccount/hangar-gateway"] {
        assert!(text(&out).contains(obj), "{obj} missing: {}", text(&out));
    }

    let yes = |sa: &str, args: &[&str]| assert!(can_i(&cp, sa, args), "{sa} should be allowed {args:?}");
    let no = |sa: &str, args: &[&str]| assert!(!can_i(&cp, sa, args), "{sa} must not be allowed {args:?}");
    let op = "hangar-operator";
    yes(op, &["patch", "sandboxes.hangar.dev", "--subresource=status", "-n", "team-a"]);
    yes(op, &["watch", "commands.hangar.dev", "-n", "team-a"]);
    yes(op, &["patch", "commands.hangar.dev", "--subresource=status", "-n", "team-a"]);
    yes(op, &["patch", "secrets", "-n", "hangar-system"]);
    yes(op, &["create", "pods", "-n", "team-a"]);
    // Secrets in its own namespace only: no tenant Secret is readable.
    no(op, &["get", "secrets", "-n", "team-a"]);
    // It delivers a token's plaintext once: create and delete, never read.
    yes(op, &["create", "secrets", "-n", "team-a"]);
    yes(op, &["patch", "nodes"]);
    yes(op, &["update", "leases.coordination.k8s.io", "-n", "hangar-system"]);
    yes(op, &["update", "configmaps", "-n", "hangar-system"]);
    yes(op, &["create", "serviceaccounts", "-n", "hangar-system"]);
    no(op, &["create", "serviceaccounts", "-n", "team-a"]);
    yes(op, &["create", "rolebindings", "-n", "team-a"]);
    yes(op, &["bind", "clusterroles/hangar-session-worker"]);
    no(op, &["bind", "clusterroles/cluster-admin"]);
    no(op, &["update", "configmaps", "-n", "team-a"]);
    no(op, &["list", "secrets", "-n", "team-a"]);
    // It watches the hand-offs' names in its own namespace, no tenant's.
    yes(op, &["watch", "secrets", "-n", "hangar-system"]);
    no(op, &["watch", "secrets", "-n", "team-a"]);
    no(op, &["delete", "nodes"]);
    no(op, &["delete", "sandboxes.hangar.dev", "-n", "team-a"]);
    no(op, &["update", "sandboxes.hangar.dev", "-n", "team-a"]);
    no(op, &["create", "leases.coordination.k8s.io", "-n", "team-a"]);
    no(op, &["create", "clusterroles"]);

    let wh = "hangar-webhook";
    // It writes nothing a tenant can see, nor the command ledgers (the
    // operator's leader decides command admissions).
    yes(wh, &["get", "sandboxes.hangar.dev", "-n", "team-a"]);
    no(wh, &["patch", "sandboxes.hangar.dev", "-n", "team-a"]);
    no(wh, &["update", "configmaps", "-n", "hangar-system"]);
    no(wh, &["update", "configmaps", "-n", "team-a"]);
    no(wh, &["delete", "configmaps", "-n", "hangar-system"]);
    yes(wh, &["list", "commands.hangar.dev", "-n", "team-a"]);
    no(wh, &["create", "commands.hangar.dev", "-n", "team-a"]);
    no(wh, &["patch", "sandboxes.hangar.dev", "--subresource=status", "-n", "team-a"]);
    // An attachment's Secret by name (its tenant label; metadata only),
    // never a list of them.
    yes(wh, &["get", "secrets", "-n", "team-a"]);
    no(wh, &["list", "secrets", "-n", "team-a"]);
    no(wh, &["watch", "secrets", "-n", "team-a"]);
    no(wh, &["update", "secrets", "-n", "team-a"]);

    let gw = "hangar-gateway";
    yes(gw, &["create", "tokenreviews.authentication.k8s.io"]);
    yes(gw, &["create", "subjectaccessreviews.authorization.k8s.io"]);
    // It writes as the caller (impersonation), never as itself.
    no(gw, &["create", "sandboxes.hangar.dev", "-n", "team-a"]);
    no(gw, &["create", "commands.hangar.dev", "-n", "team-a"]);
    no(gw, &["patch", "commands.hangar.dev", "-n", "team-a"]);
    yes(gw, &["impersonate", "users"]);
    yes(gw, &["impersonate", "serviceaccounts", "-n", "team-a"]);
    yes(gw, &["impersonate", "groups/hangar:session-tokens"]);
    no(gw, &["impersonate", "groups/system:masters"]);
    no(gw, &["impersonate", "groups"]);
    yes(gw, &["patch", "sessiontokens.hangar.dev", "--subresource=status", "-n", "team-a"]);
    no(gw, &["get", "secrets", "-n", "team-a"]);
    // The output key-encryption key only: never the organisation key (which
    // seals the workspace keys), a workspace key or a raw hand-off.
    yes(gw, &["get", "secrets/hangar-output-kek", "-n", "hangar-system"]);
    no(gw, &["get", "secrets/hangar-org-key", "-n", "hangar-system"]);
    no(gw, &["get", "secrets", "-n", "hangar-system"]);
    yes(gw, &["get", "configmaps", "-n", "hangar-system"]);
    no(gw, &["list", "secrets", "-n", "hangar-system"]);
    no(gw, &["patch", "secrets", "-n", "hangar-system"]);
    no(gw, &["delete", "sandboxes.hangar.dev", "-n", "team-a"]);
    no(gw, &["patch", "sandboxes.hangar.dev", "--subresource=status", "-n", "team-a"]);

    // Metrics: every metrics server may check a scraper's token, and none
    // of hangar's own identities may read another's metrics.
    for sa in [op, wh, gw] {
        yes(sa, &["create", "tokenreviews.authentication.k8s.io"]);
        yes(sa, &["create", "subjectaccessreviews.authorization.k8s.io"]);
        no(sa, &["get", "/metrics"]);
    }
    no("hangar-worker", &["get", "/metrics"]);
    no("hangar-worker", &["create", "tokenreviews.authentication.k8s.io"]);

    // A session token's identity may make the writes a token can make (the
    // admission webhook holds each to its token) and read nothing.
    let token = |args: &[&str]| {
        let out = cp
            .kubectl()
            .args(["auth", "can-i", "--as", "hangar:token:team-a:t", "--as-group", "hangar:session-tokens"])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim() == "yes"
    };
    assert!(token(&["create", "commands.hangar.dev", "-n", "team-a"]));
    assert!(token(&["patch", "sandboxes.hangar.dev", "-n", "team-a"]));
    for denied in [
        &["get", "commands.hangar.dev", "-n", "team-a"][..],
        &["delete", "sandboxes.hangar.dev", "-n", "team-a"],
        &["create", "sessiontokens.hangar.dev", "-n", "team-a"],
        &["patch", "commands.hangar.dev", "--subresource=status", "-n", "team-a"],
        &["get", "secrets", "-n", "team-a"],
    ] {
        assert!(!token(denied), "a token identity must not {denied:?}");
    }

    let worker = "hangar-worker";
    // Its session's Commands it reads and reports as its node's account,
    // bound in that namespace only: as itself, nothing of any tenant.
    no(worker, &["list", "commands.hangar.dev", "-n", "team-a"]);
    no(worker, &["patch", "commands.hangar.dev", "--subresource=status", "-n", "team-a"]);
    yes(worker, &["create", "serviceaccounts", "--subresource=token", "-n", "hangar-system"]);
    yes(worker, &["update", "leases.coordination.k8s.io", "-n", "hangar-system"]);
    no(worker, &["patch", "sandboxes.hangar.dev", "--subresource=status", "-n", "team-a"]);
    no(worker, &["create", "commands.hangar.dev", "-n", "team-a"]);
    no(worker, &["get", "secrets", "-n", "team-a"]);
    // It hands in its attempt's output key but can read no Secret back,
    // not even the organisation key beside it.
    yes(worker, &["create", "secrets", "-n", "hangar-system"]);
    no(worker, &["get", "secrets", "-n", "hangar-system"]);
    no(worker, &["get", "secrets/hangar-org-key", "-n", "hangar-system"]);
    no(worker, &["list", "secrets", "-n", "hangar-system"]);
}

/// The key service the workers are pointed at is the operator's: its
/// Service selects the operator and targets the port it listens on, the
/// worker trusts only the CA of that Secret and reaches IMDS from the
/// host network; unset values serve no key at all.
#[test]
fn workers_reach_the_operators_workspace_key_service() {
    let docs = render(&[
        "--set",
        "operator.workspaceKeys.tlsSecret=workspace-keys-tls",
        "--set",
        "operator.workspaceKeys.identityCertificate=PEM",
    ]);
    let svc = find(&docs, "Service", "hangar-workspace-keys", Some("hangar-system")).expect("the key Service");
    assert_eq!(svc["spec"]["selector"]["app.kubernetes.io/component"].as_str(), Some("operator"));
    assert_eq!(svc["spec"]["ports"][0]["targetPort"].as_str(), Some("workspace-keys"));
    let op = &find(&docs, "Deployment", "hangar-operator", None).unwrap()["spec"]["template"]["spec"];
    let port = op["containers"][0]["ports"].as_sequence().unwrap().iter().find(|p| p["name"] == "workspace-keys");
    assert_eq!(port.unwrap()["containerPort"].as_u64(), Some(8443));
    let ds = &find(&docs, "DaemonSet", "hangar-worker", None).unwrap()["spec"]["template"]["spec"];
    assert_eq!(ds["hostNetwork"].as_bool(), Some(true), "IMDSv2 with hop limit 1 answers the host network only");
    let env = |name: &str| {
        ds["containers"][0]["env"].as_sequence().unwrap().iter().find(|e| e["name"] == name).map(|e| e["value"].clone())
    };
    assert_eq!(
        env("HANGAR_WORKSPACE_KEY_URL").and_then(|v| v.as_str().map(str::to_owned)).as_deref(),
        Some("https://hangar-workspace-keys.hangar-system.svc:8443")
    );
    let ca = ds["volumes"].as_sequence().unwrap().iter().find(|v| v["name"] == "workspace-keys-ca").unwrap();
    let items: Vec<&str> =
        ca["secret"]["items"].as_sequence().unwrap().iter().map(|i| i["key"].as_str().unwrap()).collect();
    assert_eq!(items, ["ca.crt"], "the worker gets the CA, never the service's private key");
    assert!(env("HANGAR_WORKSPACE_DEVICE").is_some());

    let bare = render(&[]);
    assert!(find(&bare, "Service", "hangar-workspace-keys", None).is_none());
    let op = &find(&bare, "Deployment", "hangar-operator", None).unwrap()["spec"]["template"]["spec"];
    let args = serde_yaml::to_string(&op["containers"][0]["args"]).unwrap();
    assert!(!args.contains("workspace-key-listen"), "no key service without its certificate and TLS Secret");
}

/// With `webhook.certificate.source=cert-manager` the chart asks
/// cert-manager for the serving certificate (a Certificate for the
/// webhook Service's names, from the given issuer), mounts its Secret into
/// the webhook, which reads the files (and reloads them:
/// `runtime/tests/serving_cert_files.rs`), and has cert-manager inject the
/// CA into every webhook of the configuration; the webhook then neither
/// makes certificates nor writes the configuration. Without an issuer the
/// chart refuses to render.
#[test]
fn cert_manager_issues_the_webhook_certificate_when_asked() {
    let docs = render(&[
        "--set",
        "webhook.certificate.source=cert-manager",
        "--set",
        "webhook.certificate.issuerRef.name=platform-ca",
        "--set",
        "webhook.certificate.issuerRef.kind=ClusterIssuer",
    ]);
    let cert = find(&docs, "Certificate", "hangar-webhook", Some("hangar-system")).expect("a Certificate");
    assert_eq!(cert["apiVersion"].as_str(), Some("cert-manager.io/v1"));
    let spec = &cert["spec"];
    assert_eq!(spec["secretName"].as_str(), Some("hangar-webhook-tls"));
    assert_eq!(spec["issuerRef"]["name"].as_str(), Some("platform-ca"));
    assert_eq!(spec["issuerRef"]["kind"].as_str(), Some("ClusterIssuer"));
    let dns: Vec<&str> = spec["dnsNames"].as_sequence().unwrap().iter().filter_map(|d| d.as_str()).collect();
    assert!(dns.contains(&"hangar-webhook.hangar-system.svc"), "{dns:?}");
    assert_eq!(spec["renewBefore"].as_str(), Some("720h"), "renewed 30 days before its end");

    let deploy = find(&docs, "Deployment", "hangar-webhook", None).expect("webhook Deployment");
    let pod = &deploy["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let env = |name: &str| {
        container["env"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|e| e["name"].as_str() == Some(name))
            .map(|e| e["value"].clone())
    };
    assert_eq!(env("HANGAR_WEBHOOK_CERTIFICATE").and_then(|v| v.as_str().map(str::to_owned)).as_deref(), Some("files"));
    let mount = container["volumeMounts"].as_sequence().unwrap().iter().find(|m| m["name"].as_str() == Some("tls"));
    assert_eq!(mount.and_then(|m| m["readOnly"].as_bool()), Some(true), "the Secret mounted read-only");
    let volume = pod["volumes"].as_sequence().unwrap().iter().find(|v| v["name"].as_str() == Some("tls")).unwrap();
    assert_eq!(volume["secret"]["secretName"].as_str(), Some("hangar-webhook-tls"));

    let config = find(&docs, "ValidatingWebhookConfiguration", "hangar-webhook", None).expect("configuration");
    assert_eq!(
        config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].as_str(),
        Some("hangar-system/hangar-webhook"),
        "cert-manager injects the CA"
    );

    let chart = chart();
    let out = helm(&["template", "hangar", &chart, "--set", "webhook.certificate.source=cert-manager"]);
    assert!(!out.status.success(), "no issuer, no render");
    assert!(text(&out).contains("issuerRef.name is required"), "{}", text(&out));
}

/// The hangar-crds chart (`helm upgrade` upgrades its CRDs, where the
/// hangar chart's `crds/` are installed once and never again): from the
/// previous release's CRDs (today's without `spec.egress` on Sandbox), an
/// upgrade changes the schema in place and keeps every session, spec and
/// status, each object the same (uid and resourceVersion); the field the
/// upgrade adds is then accepted and kept. `helm uninstall` leaves the
/// CRDs, and with them every session.
#[test]
fn a_crd_upgrade_keeps_every_session() {
    let cp = ControlPlane::start_without_crds().expect("control plane");
    let new_chart = repo_root().join("charts/hangar-crds");
    let old = tempfile::tempdir().unwrap();
    copy_chart(&new_chart, old.path(), |file, body| match file {
        "Chart.yaml" => body.replace("version: 0.1.0", "version: 0.0.9"),
        "sandboxes.hangar.dev.yaml" => without_egress(body),
        _ => body.to_owned(),
    });
    let helm = |args: &[&str]| {
        let out = cp.helm().unwrap().args(args).output().unwrap();
        assert!(out.status.success(), "helm {args:?}: {}", text(&out));
    };
    let kubectl = |args: &[&str], stdin: Option<&str>| {
        use std::io::Write;
        let mut child = cp
            .kubectl()
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin.unwrap_or_default().as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    };
    let old_chart = old.path().display().to_string();
    helm(&["install", "hangar-crds", &old_chart]);
    let crds = ["sandboxes", "commands", "sessiontokens", "sandboxtemplates"].map(|n| format!("crd/{n}.hangar.dev"));
    let mut wait = vec!["wait", "--for=condition=Established", "--timeout=60s"];
    wait.extend(crds.iter().map(String::as_str));
    assert!(kubectl(&wait, None).status.success(), "the old CRDs are Established");
    assert!(kubectl(&["create", "namespace", "team-a"], None).status.success());

    // Sessions of the old release: the example without egress (which the
    // old CRD does not know: a strict apply of the whole example fails),
    // one of them with a status, and its Command.
    let example = std::fs::read_to_string(repo_root().join("examples/sandbox-commands.yaml")).unwrap();
    let refused = kubectl(&["apply", "-n", "team-a", "-f", "-"], Some(&example));
    assert!(!refused.status.success(), "the old CRD has no egress: {}", text(&refused));
    assert!(text(&refused).contains("egress"), "{}", text(&refused));
    let old_sessions = without_egress(&example);
    let second = old_sessions.split("\n---\n").next().unwrap().replace("name: dev-box", "name: dev-box-2");
    for manifest in [old_sessions.as_str(), second.as_str()] {
        let out = kubectl(&["apply", "-n", "team-a", "-f", "-"], Some(manifest));
        assert!(out.status.success(), "{}", text(&out));
    }
    let status =
        r#"{"status":{"phase":"running","attempt":1,"instanceId":"i-0a1b2c3d4e5f60718","zone":"ap-southeast-2a"}}"#;
    let out = kubectl(
        &["patch", "sandbox", "dev-box", "-n", "team-a", "--subresource=status", "--type=merge", "-p", status],
        None,
    );
    assert!(out.status.success(), "{}", text(&out));
    let snapshot = || {
        let out = kubectl(&["get", "sandboxes,commands", "-n", "team-a", "-o", "json"], None);
        assert!(out.status.success(), "{}", text(&out));
        let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let mut objects: Vec<serde_json::Value> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| {
                let m = &o["metadata"];
                serde_json::json!([o["kind"], m["name"], m["uid"], m["resourceVersion"], o["spec"], o["status"]])
            })
            .collect();
        objects.sort_by_key(|o| o.to_string());
        objects
    };
    let before = snapshot();
    assert_eq!(before.len(), 3, "two sessions and a command: {before:?}");

    // The upgrade: the schema changes in place, every object stays.
    helm(&["upgrade", "hangar-crds", &new_chart.display().to_string()]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        // The apiserver serves a changed schema shortly after the update.
        let out = kubectl(&["apply", "-n", "team-a", "--dry-run=server", "-f", "-"], Some(&example));
        if out.status.success() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "egress never accepted: {}", text(&out));
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(snapshot(), before, "every session, spec and status, unchanged by the upgrade");
    let out = kubectl(&["apply", "-n", "team-a", "-f", "-"], Some(&example));
    assert!(out.status.success(), "{}", text(&out));
    let out = kubectl(&["get", "sandbox", "dev-box", "-n", "team-a", "-o", "jsonpath={.spec.egress.allow}"], None);
    assert_eq!(String::from_utf8_lossy(&out.stdout), r#"["pypi.org","*.pythonhosted.org"]"#, "egress is kept");
    let out = kubectl(&["get", "sandbox", "dev-box", "-n", "team-a", "-o", "jsonpath={.status.instanceId}"], None);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "i-0a1b2c3d4e5f60718", "the status survives the apply");

    // Uninstall keeps the CRDs, and every session.
    let kept = snapshot();
    helm(&["uninstall", "hangar-crds"]);
    let out = kubectl(
        &["get", "-o", "name"].iter().copied().chain(crds.iter().map(String::as_str)).collect::<Vec<_>>(),
        None,
    );
    assert!(out.status.success(), "the CRDs outlive the release: {}", text(&out));
    assert_eq!(snapshot(), kept, "every session outlives the release");
}

/// Copies the chart at `from` into `to`, each file through `edit(file name,
/// body)`.
fn copy_chart(from: &std::path::Path, to: &std::path::Path, edit: impl Fn(&str, &str) -> String) {
    for entry in walk(from) {
        let relative = entry.strip_prefix(from).unwrap();
        let target = to.join(relative);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        let body = std::fs::read_to_string(&entry).unwrap();
        let name = relative.file_name().unwrap().to_str().unwrap();
        std::fs::write(target, edit(name, &body)).unwrap();
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() { files.extend(walk(&path)) } else { files.push(path) }
    }
    files
}

/// `yaml` (one or more documents) without any Sandbox `spec.egress`: in a
/// CRD, the schema's property; in a Sandbox, the field.
fn without_egress(yaml: &str) -> String {
    use serde::Deserialize;
    let mut out = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let mut value = serde_yaml::Value::deserialize(doc).unwrap();
        if value["kind"].as_str() == Some("CustomResourceDefinition") {
            for version in value["spec"]["versions"].as_sequence_mut().unwrap() {
                let spec = &mut version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
                assert!(spec.as_mapping_mut().unwrap().remove("egress").is_some(), "the CRD has egress today");
            }
        } else if value["kind"].as_str() == Some("Sandbox") {
            value["spec"].as_mapping_mut().unwrap().remove("egress");
        }
        out.push(serde_yaml::to_string(&value).unwrap());
    }
    out.join("---\n")
}

//! `make up` end to end: the hangar-up binary starts the stack, prints the
//! KUBECONFIG line, `kubectl get crd` shows the four hangar CRDs, the
//! examples apply and their command succeeds, and Ctrl-C (SIGINT) stops
//! every process it started; a part that dies is reported and stops it.
//! `make up NODE=real` likewise on real nodes.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hangar_e2e::registry::{EXAMPLE_IMAGES, Image, example_images};

/// Kills hangar-up if the test fails before it stops it.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn make_up_serves_the_examples_and_stops_on_ctrl_c() {
    let dir = std::env::temp_dir().join(format!("hangar-up-test-{}", std::process::id()));
    let mut guard = start_hangar_up(&dir, "sim");
    let up = &mut guard.0;

    let mut kubeconfig = None;
    let mut lines = BufReader::new(up.stdout.take().unwrap()).lines();
    for line in lines.by_ref() {
        let line = line.unwrap();
        if let Some(path) = line.trim().strip_prefix("export KUBECONFIG=") {
            kubeconfig = Some(path.to_owned());
        }
        if line.contains("Ctrl-C stops everything") {
            break;
        }
    }
    let kubeconfig = kubeconfig.expect("hangar-up printed the KUBECONFIG line");
    let kubectl = |args: &[&str]| {
        let out = Command::new("kubectl").env("KUBECONFIG", &kubeconfig).args(args).output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.success(), text)
    };

    let (ok, crds) = kubectl(&["get", "crd"]);
    assert!(ok, "{crds}");
    assert_eq!(crds.lines().filter(|l| l.contains("hangar.dev")).count(), 4, "{crds}");

    let examples = hangar_e2e::paths::repo_root().join("examples");
    // The examples name the images hangar-up pushed, by their digests.
    for file in std::fs::read_dir(&examples).unwrap().flatten() {
        let text = std::fs::read_to_string(file.path()).unwrap();
        for image in
            text.lines().filter_map(|l| l.trim().strip_prefix("image: ").or(l.trim().strip_prefix("- image: ")))
        {
            assert!(
                EXAMPLE_IMAGES.contains(&image),
                "{}: {image} is not an image hangar-up pushes",
                file.path().display()
            );
        }
    }
    let (ok, out) = kubectl(&["apply", "-f", examples.to_str().unwrap()]);
    assert!(ok, "kubectl apply -f examples/: {out}");
    let (ok, out) = kubectl(&["get", "sbx"]);
    assert!(ok && out.contains("dev-box") && out.contains("review-agent"), "{out}");

    // Polls a jsonpath until it reads `want`.
    let wait_jsonpath = |args: &[&str], want: &str| {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let (_, out) = kubectl(args);
            if out.trim() == want {
                return;
            }
            assert!(Instant::now() < deadline, "{args:?} never read {want:?}: {out}");
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    // The operator and node simulator bring the example sessions up.
    wait_jsonpath(&["get", "sbx", "dev-box", "-o", "jsonpath={.status.phase}"], "running");
    // Its image came from the loopback registry: an index of amd64 and
    // arm64, judged (and run) on its arm64 entry.
    let Image::Index { entries, .. } = &example_images()[0] else { panic!("the example agent image is an index") };
    let arm64 = entries.iter().find(|(_, arch, _)| arch == "arm64").expect("an arm64 entry").2.digest();
    wait_jsonpath(
        &[
            "get",
            "sbx",
            "dev-box",
            "-o",
            "jsonpath={.status.imagePreflight.state} {.status.imagePreflight.images[0].manifestDigest}",
        ],
        &format!("Passed {arm64}"),
    );
    // The example template is signed with the examples' key: Registered,
    // and the session started from it runs.
    wait_jsonpath(&["get", "sbxtpl", "python-dev-1.2", "-o", "jsonpath={.status.phase}"], "Registered");
    wait_jsonpath(&["get", "sbx", "templated-box", "-o", "jsonpath={.status.phase}"], "running");
    // The example command runs to success through webhook, operator,
    // worker and supervisor (number 1, exit code 0).
    wait_jsonpath(
        &["get", "sbxcmd", "dev-box-hello", "-o", "jsonpath={.status.phase} {.status.number} {.status.exitCode}"],
        "exited 1 0",
    );

    // Ctrl-C: hangar-up stops everything it started, then exits 0.
    // Two gateway replicas (a proof's jti is claimed once across them).
    let names = [
        ("etcd", 1),
        ("kube-apiserver", 1),
        ("moto_server", 1),
        ("registry-", 1),
        ("hangar-webhook", 1),
        ("hangar-operator", 1),
        ("hangar-gateway", 2),
    ];
    let mut pids = Vec::new();
    for (name, count) in names {
        let found = children_named(up.id() as i32, name);
        assert_eq!(found.len(), count, "expected {count} of {name}");
        pids.extend(found);
    }
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(up.id() as i32), nix::sys::signal::Signal::SIGINT).unwrap();
    let status = exit_within(up, Duration::from_secs(30), "hangar-up did not stop after SIGINT");
    assert!(status.success(), "hangar-up exited with {status}");
    assert_all_ended(&pids);
    let _ = std::fs::remove_dir_all(dir);
}

/// When a part of the stack dies, hangar-up says which (with its log
/// tail), stops the rest and exits with failure, instead of serving half a
/// stack.
#[test]
fn make_up_reports_a_part_that_dies_and_stops() {
    let dir = std::env::temp_dir().join(format!("hangar-up-dies-{}", std::process::id()));
    let up = Command::new(env!("CARGO_BIN_EXE_hangar-up"))
        .env("HANGAR_UP_DIR", &dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start hangar-up");
    let mut guard = KillOnDrop(up);
    let up = &mut guard.0;
    let stderr = up.stderr.take().unwrap();
    let said = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    for line in BufReader::new(up.stdout.take().unwrap()).lines() {
        if line.unwrap().contains("Ctrl-C stops everything") {
            break;
        }
    }
    let names = ["etcd", "kube-apiserver", "moto_server", "hangar-webhook", "hangar-operator", "hangar-gateway"];
    let pids: Vec<i32> = names.iter().flat_map(|name| children_named(up.id() as i32, name)).collect();
    let webhook = children_named(up.id() as i32, "hangar-webhook")[0];
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(webhook), nix::sys::signal::Signal::SIGKILL).unwrap();

    let status = exit_within(up, Duration::from_secs(30), "hangar-up kept running without its webhook");
    assert!(!status.success(), "a dead part is a failure");
    let said = said.join().unwrap();
    assert!(said.contains("hangar-webhook exited"), "names the part that died: {said}");
    assert_all_ended(&pids);
    let _ = std::fs::remove_dir_all(dir);
}

/// Polls until `child` exits (it is our own child: no event to wait on
/// with a deadline), failing with `why` after `limit`.
/// hangar-up in its own run directory, on the simulator's nodes or real
/// ones (`make up NODE=…`), its banner on a pipe.
fn start_hangar_up(dir: &std::path::Path, node: &str) -> KillOnDrop {
    let up = Command::new(env!("CARGO_BIN_EXE_hangar-up"))
        .env("HANGAR_UP_DIR", dir)
        .env("HANGAR_UP_NODE", node)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start hangar-up");
    KillOnDrop(up)
}

fn exit_within(child: &mut std::process::Child, limit: Duration, why: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "{why}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn children_named(parent: i32, name: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        // pid (comm) state ppid ...; comm may hold spaces, so split after ')'.
        let Some((_, tail)) = stat.rsplit_once(')') else { continue };
        let ppid = tail.split_whitespace().nth(1).and_then(|p| p.parse::<i32>().ok());
        // argv[0], or argv[1] for a script run by its interpreter (moto_server).
        let cmdline = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let program = |arg: &str| arg.rsplit('/').next().unwrap_or_default().starts_with(name);
        if ppid == Some(parent) && cmdline.split('\0').take(2).any(program) {
            found.push(pid);
        }
    }
    found
}

fn assert_all_ended(pids: &[i32]) {
    for &pid in pids {
        assert!(!alive(pid), "child {pid} outlived hangar-up");
    }
}

fn alive(pid: i32) -> bool {
    // A zombie has exited; only a process still running counts.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.rsplit_once(')').and_then(|(_, t)| t.split_whitespace().next().map(|st| st != "Z")).unwrap_or(false))
        .unwrap_or(false)
}

/// `make up NODE=real`: hangar's Pods on a real kubelet; the session the
/// banner shows, pasted as printed, runs on a real session node (kubelet
/// and containerd), its command exits 0 (it reached the companion); Ctrl-C
/// stops the nodes and every process.
#[test]
fn make_up_on_the_real_node_runs_the_printed_session() {
    let dir = std::env::temp_dir().join(format!("hangar-up-real-{}", std::process::id()));
    let mut guard = start_hangar_up(&dir, "real");
    let up = &mut guard.0;

    let (mut kubeconfig, mut manifest, mut in_manifest) = (None, String::new(), false);
    for line in BufReader::new(up.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if let Some(path) = line.trim().strip_prefix("export KUBECONFIG=") {
            kubeconfig = Some(path.to_owned());
        } else if line.contains("apply -f - <<EOF") {
            in_manifest = true;
        } else if line == "EOF" {
            in_manifest = false;
        } else if in_manifest {
            manifest.push_str(&line);
            manifest.push('\n');
        }
        if line.contains("Ctrl-C stops everything") {
            break;
        }
    }
    let kubeconfig = kubeconfig.expect("hangar-up printed the KUBECONFIG line");
    assert!(manifest.contains("kind: Sandbox"), "hangar-up printed a session to apply: {manifest}");
    let kubectl = |args: &[&str], stdin: &str| {
        use std::io::Write;
        let mut child = Command::new("kubectl")
            .env("KUBECONFIG", &kubeconfig)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.success(), text)
    };
    let (ok, pods) = kubectl(&["-n", "hangar-system", "get", "pods", "-o", "name"], "");
    assert!(ok && pods.contains("hangar-operator") && pods.contains("hangar-gateway"), "hangar's Pods: {pods}");
    assert!(kubectl(&["create", "namespace", "demo"], "").0);
    let (ok, out) = kubectl(&["-n", "demo", "apply", "-f", "-"], &manifest);
    assert!(ok, "the printed session applies: {out}");

    let deadline = Instant::now() + Duration::from_secs(300);
    let jsonpath = "jsonpath={.status.phase} {.status.exitCode}";
    loop {
        let (_, out) = kubectl(&["-n", "demo", "get", "sbxcmd", "hello", "-o", jsonpath], "");
        if out.trim() == "exited 0" {
            break;
        }
        let (_, sbx) = kubectl(&["-n", "demo", "get", "sbx", "box", "-o", "jsonpath={.status}"], "");
        assert!(Instant::now() < deadline, "the printed command never exited 0: {out}; session: {sbx}");
        std::thread::sleep(Duration::from_millis(500));
    }
    let (_, node) = kubectl(&["-n", "demo", "get", "sbx", "box", "-o", "jsonpath={.status.nodeName}"], "");
    let (ok, nodes) =
        kubectl(&["get", "node", node.trim(), "-o", "jsonpath={.status.nodeInfo.containerRuntimeVersion}"], "");
    assert!(ok && nodes.starts_with("containerd://"), "a real node (kubelet and containerd) ran it: {nodes}");

    // Ctrl-C: every process hangar-up started ends, the nodes' with them.
    let names = ["etcd", "kube-apiserver", "kubelet", "containerd", "moto_server", "registry-"];
    let pids: Vec<i32> = names.iter().flat_map(|name| children_named(up.id() as i32, name)).collect();
    assert!(children_named(up.id() as i32, "kubelet").len() >= 2, "the system node's kubelet and the session node's");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(up.id() as i32), nix::sys::signal::Signal::SIGINT).unwrap();
    let status = exit_within(up, Duration::from_secs(90), "hangar-up did not stop after SIGINT");
    assert!(status.success(), "hangar-up exited with {status}");
    assert_all_ended(&pids);
    let _ = std::fs::remove_dir_all(dir);
}

//! `make up` end to end: the hangar-up binary starts the stack, prints the
//! KUBECONFIG line, `kubectl get crd` shows the four hangar CRDs, the
//! examples apply and their command succeeds, and Ctrl-C (SIGINT) stops
//! every process it started; a part that dies is reported and stops it.

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
    let up = Command::new(env!("CARGO_BIN_EXE_hangar-up"))
        .env("HANGAR_UP_DIR", &dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start hangar-up");
    let mut guard = KillOnDrop(up);
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
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = up.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "hangar-up did not stop after SIGINT");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "hangar-up exited with {status}");
    for pid in pids {
        assert!(!alive(pid), "child {pid} outlived hangar-up");
    }
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

    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = up.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "hangar-up kept running without its webhook");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success(), "a dead part is a failure");
    let said = said.join().unwrap();
    assert!(said.contains("hangar-webhook exited"), "names the part that died: {said}");
    for pid in pids {
        assert!(!alive(pid), "child {pid} outlived hangar-up");
    }
    let _ = std::fs::remove_dir_all(dir);
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

fn alive(pid: i32) -> bool {
    // A zombie has exited; only a process still running counts.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.rsplit_once(')').and_then(|(_, t)| t.split_whitespace().next().map(|st| st != "Z")).unwrap_or(false))
        .unwrap_or(false)
}

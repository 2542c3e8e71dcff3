//! hangar's own images, built without a Docker engine (the local set `make
//! test` builds): static binaries for linux/amd64 and, for what a session
//! node runs, linux/arm64 (run under qemu-user), one reproducible index per
//! component in a real registry (multi-platform for the session node's
//! images, which hangar's own image preflight passes), and the chart
//! pulling each by the digest of the build. `make images` builds the
//! release set: every component for both platforms.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use hangar_e2e::build::go_binary;
use hangar_e2e::chart::{find, render, text};
use hangar_e2e::images::{
    EM_AARCH64, EM_X86_64, Elf, IMAGES, SESSION_NODE_IMAGES, local_platforms, push, static_binary,
};
use hangar_e2e::registry::{REGISTRY_HOST, Registry};
use hangar_operator::images::registry::Registries;
use oci_client::secrets::RegistryAuth;

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Runs a binary for `target`: natively for amd64, under qemu-user for
/// arm64 (this machine is x86_64).
fn run(target: &str, binary: &Path, args: &[&str]) -> std::process::Output {
    let mut cmd = if target.starts_with("aarch64") {
        let mut c = Command::new("qemu-aarch64-static");
        c.arg(binary);
        c
    } else {
        Command::new(binary)
    };
    cmd.args(args).output().unwrap_or_else(|e| panic!("run {}: {e}", binary.display()))
}

#[test]
fn binaries_are_static_for_their_platforms_and_print_their_version() {
    for (image, name) in IMAGES {
        for (target, _) in local_platforms(image) {
            let machine = if target.starts_with("aarch64") { EM_AARCH64 } else { EM_X86_64 };
            let binary = static_binary(target, name);
            let elf = Elf::read(&binary).unwrap();
            assert_eq!(elf, Elf { machine, interpreter: false }, "{target}/{name}: static, for its machine");
            let out = run(target, &binary, &["--version"]);
            assert!(out.status.success(), "{target}/{name} --version: {}", text(&out));
            assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), format!("{name} {VERSION}"), "{target}/{name}");
        }
    }
}

/// The agent Pod's init container runs the supervisor image's binary with
/// `--install`; the copy must run on its own (it lands in a tenant's
/// image, which has no libc of ours).
#[test]
fn the_supervisor_installs_a_copy_that_runs() {
    let dir = tempfile::tempdir().unwrap();
    for (target, _) in local_platforms("supervisor") {
        let dest = dir.path().join(format!("{target}-supervisor"));
        let out = run(target, &static_binary(target, "hangar-supervisor"), &["--install", dest.to_str().unwrap()]);
        assert!(out.status.success(), "{target} --install: {}", text(&out));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&dest).unwrap().permissions().mode() & 0o777, 0o555, "read-only copy");
        let out = run(target, &dest, &["--version"]);
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), format!("hangar-supervisor {VERSION}"), "{target}");
    }
}

fn crane(args: &[&str]) -> serde_json::Value {
    let out = Command::new(go_binary("crane").unwrap()).arg("--insecure").args(args).output().unwrap();
    assert!(out.status.success(), "crane {args:?}: {}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("crane {args:?}: {e}: {}", text(&out)))
}

const CA_BUNDLE: &str = "etc/ssl/certs/ca-certificates.crt";

/// The bytes of `path` in the filesystem of `reference` for `platform`.
fn file_in_image(reference: &str, platform: &str, path: &str) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let tar = dir.path().join("fs.tar");
    let out = Command::new(go_binary("crane").unwrap())
        .args(["--insecure", "export", "--platform", platform, reference])
        .arg(&tar)
        .output()
        .unwrap();
    assert!(out.status.success(), "crane export {reference}: {}", text(&out));
    let out = Command::new("tar").arg("-xOf").arg(&tar).arg(path).output().unwrap();
    assert!(out.status.success(), "{reference} {platform}: no {path}: {}", text(&out));
    out.stdout
}

/// Pushes every image to a new registry; image → reference by digest.
fn push_to_new_registry(dir: &Path) -> (Registry, BTreeMap<String, String>) {
    let registry = Registry::start(dir, None).unwrap();
    let refs = push(&format!("127.0.0.1:{}", registry.port)).unwrap();
    let names: Vec<&str> = refs.keys().map(String::as_str).collect();
    assert_eq!(names, IMAGES.map(|(image, _)| image), "one index per image");
    (registry, refs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_are_reproducible_multi_platform_indexes_that_pass_our_preflight() {
    hangar_e2e::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let (registry, refs) = tokio::task::block_in_place(|| push_to_new_registry(dir.path()));
    let (_other, again) = tokio::task::block_in_place(|| push_to_new_registry(dir.path()));
    let digest = |r: &String| r.rsplit_once('@').unwrap().1.to_owned();
    for (image, reference) in &refs {
        assert_eq!(digest(reference), digest(&again[image]), "{image}: the same build packs to the same digest");
    }

    let registries = Registries::new(&[(REGISTRY_HOST.to_owned(), registry.endpoint())]).unwrap();
    for (image, binary) in IMAGES {
        let reference = &refs[image];
        let index = tokio::task::block_in_place(|| crane(&["manifest", reference]));
        assert_eq!(index["mediaType"], "application/vnd.oci.image.index.v1+json", "{image}");
        let mut platforms: Vec<String> = index["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                format!("{}/{}", m["platform"]["os"].as_str().unwrap(), m["platform"]["architecture"].as_str().unwrap())
            })
            .collect();
        platforms.sort();
        let built: Vec<&str> = local_platforms(image).into_iter().map(|(_, p)| p).collect();
        assert_eq!(platforms, built, "{image}");
        for platform in built {
            let config = tokio::task::block_in_place(|| crane(&["config", "--platform", platform, reference]));
            assert_eq!(
                format!("{}/{}", config["os"].as_str().unwrap(), config["architecture"].as_str().unwrap()),
                platform
            );
            assert_eq!(
                config["config"]["Entrypoint"],
                serde_json::json!([format!("/usr/local/bin/{binary}")]),
                "{image}"
            );
            assert_eq!(config["config"]["User"], "65532:65532", "{image} {platform}: not root by default");
            // The CA store its clients of public servers (EC2, S3, a
            // registry) load: without one they fail to build at all.
            let bundle = tokio::task::block_in_place(|| file_in_image(reference, platform, CA_BUNDLE));
            assert_eq!(bundle, std::fs::read(format!("/{CA_BUNDLE}")).unwrap(), "{image} {platform}: the CA store");
        }
        if !SESSION_NODE_IMAGES.contains(&image) {
            continue;
        }
        let arm64 = index["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["platform"]["architecture"] == "arm64")
            .unwrap()["digest"]
            .as_str()
            .unwrap()
            .to_owned();
        // Named as a cluster would name it; the preflight reads it from the
        // loopback registry, like a containerd mirror.
        let named = format!("{REGISTRY_HOST}/hangar/{image}@{}", digest(reference));
        let passed = registries.check(&named, &RegistryAuth::Anonymous).await.expect("reachable");
        let passed = passed.unwrap_or_else(|refusal| panic!("{image} refused by our own preflight: {refusal:?}"));
        assert_eq!(passed.manifest_digest, arm64, "{image}: the preflight judged its arm64 image");
    }

    // The chart pulls each component by the digest of this build.
    let repository = format!("127.0.0.1:{}/hangar", registry.port);
    let mut values = vec!["--set".to_owned(), format!("image.repository={repository}")];
    for (image, reference) in &refs {
        values.extend(["--set".to_owned(), format!("image.digests.{image}={}", digest(reference))]);
    }
    let docs = render(&values.iter().map(String::as_str).collect::<Vec<_>>());
    for (kind, name, image) in [
        ("Deployment", "hangar-operator", "operator"),
        ("Deployment", "hangar-webhook", "webhook"),
        ("Deployment", "hangar-gateway", "gateway"),
        ("DaemonSet", "hangar-worker", "worker"),
    ] {
        let workload = find(&docs, kind, name, Some("hangar-system")).unwrap_or_else(|| panic!("{kind} {name}"));
        let container = &workload["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(container["image"].as_str(), Some(refs[image].as_str()), "{kind} {name}");
    }
    let operator = find(&docs, "Deployment", "hangar-operator", None).unwrap();
    let args = operator["spec"]["template"]["spec"]["containers"][0]["args"].as_sequence().unwrap();
    let supervisor = format!("--supervisor-image={}", refs["supervisor"]);
    assert!(args.iter().any(|a| a.as_str() == Some(supervisor.as_str())), "{args:?}");
}

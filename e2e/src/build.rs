//! Builds what the local stack needs, once, into the cache (see
//! e2e/scripts/*.sh): the Go binaries and the moto venv.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use crate::error::{HarnessError, Result, io};
use crate::paths::{cache_dir, repo_root, version};

fn run_script(name: &str, args: &[&str]) -> Result<()> {
    let script = repo_root().join("e2e/scripts").join(name);
    // Progress goes to stderr, which cargo test shows on failure and `make up` always.
    let status = Command::new("bash")
        .arg(&script)
        .args(args)
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(io(format!("run {}", script.display())))?;
    if !status.success() {
        return Err(HarnessError::Build { script, status });
    }
    Ok(())
}

/// `$CACHE/bin/<name>-<version>`, built if missing.
pub fn go_binary(name: &str) -> Result<PathBuf> {
    let key = match name {
        "etcd" => "ETCD_VERSION",
        "kube-apiserver" | "kubelet" | "kube-controller-manager" | "kube-scheduler" => "KUBE_VERSION",
        "containerd" | "containerd-shim-runc-v2" => "CONTAINERD_VERSION",
        // A directory of plugins (bridge, host-local, loopback, portmap).
        "cni" => "CNI_PLUGINS_VERSION",
        "pause" => "PAUSE_VERSION",
        "helm" => "HELM_VERSION",
        "registry" | "crane" => "GGCR_VERSION",
        "kwok" => "KWOK_VERSION",
        "agent-sandbox-controller" => "AGENT_SANDBOX_VERSION",
        other => panic!("no build recipe for {other}"),
    };
    let path = cache_dir().join("bin").join(format!("{name}-{}", version(key)));
    if !path.exists() {
        // One build at a time across the test binaries that cargo runs in turn.
        static LOCK: OnceLock<std::sync::Mutex<()>> = OnceLock::new();
        let _g = LOCK.get_or_init(Default::default).lock();
        if !path.exists() {
            // The shim is built with containerd, under containerd's name.
            let target = match name {
                "containerd-shim-runc-v2" => "containerd",
                "agent-sandbox-controller" => "agent-sandbox",
                other => other,
            };
            run_script("build-binaries.sh", &[target])?;
        }
    }
    Ok(path)
}

/// `$CACHE/share/<name>-<version>`: the data files (Stage YAML, CRDs) the
/// build script keeps beside binary `binary`, which is built if missing.
pub fn go_share(binary: &str, name: &str, version_key: &str) -> Result<PathBuf> {
    go_binary(binary)?;
    Ok(cache_dir().join("share").join(format!("{name}-{}", version(version_key))))
}

/// The `moto_server` entry point of the cached venv, created if missing.
pub fn moto_server() -> Result<PathBuf> {
    let venv = cache_dir().join(format!("venv/moto-{}", version("MOTO_VERSION")));
    let path = venv.join("bin/moto_server");
    if !venv.join(".complete").exists() {
        run_script("moto-venv.sh", &[])?;
    }
    Ok(path)
}

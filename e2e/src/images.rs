//! hangar's own images (e2e/scripts/images.sh): the static binaries of the
//! local set `make test` builds (every component for linux/amd64, the
//! session node's two for linux/arm64 too), and the indexes packed from
//! them and pushed to a loopback registry.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use crate::error::{HarnessError, Result, io};
use crate::paths::{cache_dir, repo_root};

/// Image name → the binary it runs, as images.sh packs them.
pub const IMAGES: [(&str, &str); 5] = [
    ("gateway", "hangar-gateway"),
    ("operator", "hangar-operator"),
    ("supervisor", "hangar-supervisor"),
    ("webhook", "hangar-webhook"),
    ("worker", "hangar-worker"),
];

/// Rust target → OCI platform of the images.
pub const PLATFORMS: [(&str, &str); 2] =
    [("x86_64-unknown-linux-musl", "linux/amd64"), ("aarch64-unknown-linux-musl", "linux/arm64")];

/// What a session node (arm64) runs: the local set builds these for both
/// platforms, the control plane's images for this machine's amd64 only
/// (`make images` builds every image for both).
pub const SESSION_NODE_IMAGES: [&str; 2] = ["supervisor", "worker"];

/// The (Rust target, OCI platform) pairs the local set builds `image` for.
pub fn local_platforms(image: &str) -> Vec<(&'static str, &'static str)> {
    PLATFORMS
        .into_iter()
        .filter(|(target, _)| !target.starts_with("aarch64") || SESSION_NODE_IMAGES.contains(&image))
        .collect()
}

/// The local set's static binary `name` for Rust target `target` (cargo's
/// dev profile, stripped by images.sh).
pub fn static_binary(target: &str, name: &str) -> PathBuf {
    let path = cache_dir().join("images/local").join(target).join(name);
    assert!(path.exists(), "{} is missing: run `bash e2e/scripts/images.sh build` (make test does)", path.display());
    path
}

/// Packs and pushes every image of the local set to `registry`
/// (`host:port`, plain HTTP); image name → reference by index digest.
pub fn push(registry: &str) -> Result<BTreeMap<String, String>> {
    let script = repo_root().join("e2e/scripts/images.sh");
    let out = Command::new("bash")
        .arg(&script)
        .args(["push", registry])
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(io(format!("run {}", script.display())))?;
    if !out.status.success() {
        return Err(HarnessError::Build { script, status: out.status });
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(image, reference)| (image.to_owned(), reference.to_owned()))
        .collect())
}

/// What an ELF file says about itself: its machine and whether it asks
/// for a dynamic loader (`PT_INTERP`). A static binary asks for none.
#[derive(Debug, PartialEq, Eq)]
pub struct Elf {
    pub machine: u16,
    pub interpreter: bool,
}

pub const EM_X86_64: u16 = 0x3e;
pub const EM_AARCH64: u16 = 0xb7;

impl Elf {
    /// Reads the header and program headers of a 64-bit little-endian ELF.
    pub fn read(path: &std::path::Path) -> std::io::Result<Self> {
        let bytes = std::fs::read(path)?;
        let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "not a 64-bit little-endian ELF");
        if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" || bytes[4] != 2 || bytes[5] != 1 {
            return Err(bad());
        }
        let u16_at = |o: usize| u16::from_le_bytes([bytes[o], bytes[o + 1]]);
        let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap());
        let phoff = u64::from_le_bytes(bytes[0x20..0x28].try_into().unwrap()) as usize;
        let (phentsize, phnum) = (u16_at(0x36) as usize, u16_at(0x38) as usize);
        if phoff + phentsize * phnum > bytes.len() {
            return Err(bad());
        }
        const PT_INTERP: u32 = 3;
        let interpreter = (0..phnum).any(|i| u32_at(phoff + i * phentsize) == PT_INTERP);
        Ok(Self { machine: u16_at(0x12), interpreter })
    }
}

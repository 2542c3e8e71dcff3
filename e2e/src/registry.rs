//! The OCI registry on loopback (go-containerregistry's in-memory registry,
//! built from its Go module) and the images the tests make and push to it
//! themselves: layers are real gzipped tar archives, configs real image
//! configs, and everything is byte-for-byte reproducible, so an image's
//! digest is the same on every machine (the examples name them by digest).

use std::io::Write;
use std::process::Command;
use std::time::Duration;

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::build::go_binary;
use crate::error::Result;
use crate::process::{ChildProcess, free_port, http_get, wait_until};

/// The host the images are named under; the operator is told where it is
/// (`--registry-endpoint registry.hangar.test=http://127.0.0.1:<port>`),
/// as containerd is told of a mirror.
pub const REGISTRY_HOST: &str = "registry.hangar.test";

pub struct Registry {
    process: ChildProcess,
    pub port: u16,
    /// Basic-auth credentials the registry asks for, if any.
    pub credentials: Option<(String, String)>,
}

impl Registry {
    /// Starts a registry with its log in `dir`; `credentials`: ask every
    /// request for basic auth.
    pub fn start(dir: &std::path::Path, credentials: Option<(&str, &str)>) -> Result<Self> {
        let port = free_port();
        let mut cmd = Command::new(go_binary("registry")?);
        cmd.args(["-addr", &format!("127.0.0.1:{port}")]);
        if let Some((u, p)) = credentials {
            cmd.env("HANGAR_REGISTRY_USER", u).env("HANGAR_REGISTRY_PASSWORD", p);
        }
        let log = dir.join(format!("registry-{port}.log"));
        let mut process = ChildProcess::spawn("registry", cmd, &log)?;
        wait_until("registry", &mut process, Duration::from_secs(30), || {
            http_get(port, "/v2/").is_ok_and(|(s, _)| s == 200 || s == 401)
        })?;
        Ok(Self { process, port, credentials: credentials.map(|(u, p)| (u.to_owned(), p.to_owned())) })
    }

    pub fn check_alive(&mut self) -> Result<()> {
        self.process.check_alive()
    }

    /// The operator's endpoint override for `REGISTRY_HOST`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Pushes `image` (blobs, then manifests) and returns its reference by
    /// digest under `REGISTRY_HOST`. Blocking; safe inside a test's runtime.
    pub fn push(&self, image: &Image) -> String {
        let base = format!("http://127.0.0.1:{}", self.port);
        let creds = self.credentials.clone();
        let image = image.clone();
        std::thread::spawn(move || {
            let _ = rustls::crypto::ring::default_provider().install_default();
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            rt.block_on(push(&base, creds, &image))
        })
        .join()
        .expect("push thread")
    }
}

/// A blob: bytes and the descriptor a manifest gives it (whose size may
/// lie, to test the preflight's "larger of declared and stored").
#[derive(Clone, Debug)]
pub struct Blob {
    pub media_type: &'static str,
    pub bytes: Vec<u8>,
    pub declared_size: u64,
}

impl Blob {
    pub fn new(media_type: &'static str, bytes: Vec<u8>) -> Self {
        let declared_size = bytes.len() as u64;
        Self { media_type, bytes, declared_size }
    }

    pub fn digest(&self) -> String {
        sha256(&self.bytes)
    }

    fn descriptor(&self) -> Descriptor {
        Descriptor { media_type: self.media_type, digest: self.digest(), size: self.declared_size, platform: None }
    }
}

/// A single-platform image: config and layers.
#[derive(Clone, Debug)]
pub struct Manifest {
    pub config: Blob,
    pub layers: Vec<Blob>,
}

impl Manifest {
    /// An image of `os/arch` with one real layer holding `files`.
    pub fn of(os: &str, arch: &str, files: &[(&str, &[u8])]) -> Self {
        let tar = tar_of(files);
        let diff_id = sha256(&tar);
        let layer = Blob::new("application/vnd.oci.image.layer.v1.tar+gzip", gzip(&tar));
        Self { config: config(os, arch, &[diff_id]), layers: vec![layer] }
    }

    /// The same with each file's mode (`0o755` for a program).
    pub fn with_modes(os: &str, arch: &str, files: &[(&str, &[u8], u32)]) -> Self {
        let tar = tar_with_modes(files);
        let diff_id = sha256(&tar);
        let layer = Blob::new("application/vnd.oci.image.layer.v1.tar+gzip", gzip(&tar));
        Self { config: config(os, arch, &[diff_id]), layers: vec![layer] }
    }

    pub fn bytes(&self) -> Vec<u8> {
        let doc = ManifestDoc {
            schema_version: 2,
            media_type: "application/vnd.oci.image.manifest.v1+json",
            config: self.config.descriptor(),
            layers: self.layers.iter().map(Blob::descriptor).collect(),
        };
        serde_json::to_vec(&doc).expect("manifest json")
    }

    pub fn digest(&self) -> String {
        sha256(&self.bytes())
    }
}

/// An image as pushed under a repository: one manifest, or an index of
/// manifests with their platforms.
#[derive(Clone, Debug)]
pub enum Image {
    Single { repository: String, manifest: Manifest },
    Index { repository: String, entries: Vec<(String, String, Manifest)> },
}

impl Image {
    pub fn single(repository: &str, manifest: Manifest) -> Self {
        Self::Single { repository: repository.into(), manifest }
    }

    /// An index with one entry per `(os, arch)`.
    pub fn index(repository: &str, platforms: &[(&str, &str)]) -> Self {
        let entries = platforms
            .iter()
            .map(|(os, arch)| {
                let m = Manifest::of(os, arch, &[("etc/hangar-image", format!("{os}/{arch}\n").as_bytes())]);
                (os.to_string(), arch.to_string(), m)
            })
            .collect();
        Self::Index { repository: repository.into(), entries }
    }

    fn repository(&self) -> &str {
        match self {
            Self::Single { repository, .. } | Self::Index { repository, .. } => repository,
        }
    }

    fn index_bytes(entries: &[(String, String, Manifest)]) -> Vec<u8> {
        let doc = IndexDoc {
            schema_version: 2,
            media_type: "application/vnd.oci.image.index.v1+json",
            manifests: entries
                .iter()
                .map(|(os, arch, m)| Descriptor {
                    media_type: "application/vnd.oci.image.manifest.v1+json",
                    digest: m.digest(),
                    size: m.bytes().len() as u64,
                    platform: Some(PlatformDoc { architecture: arch.clone(), os: os.clone() }),
                })
                .collect(),
        };
        serde_json::to_vec(&doc).expect("index json")
    }

    /// The digest the image is named by (the index's, or the manifest's).
    pub fn digest(&self) -> String {
        match self {
            Self::Single { manifest, .. } => manifest.digest(),
            Self::Index { entries, .. } => sha256(&Self::index_bytes(entries)),
        }
    }

    /// `registry.hangar.test/<repository>@<digest>`.
    pub fn reference(&self) -> String {
        format!("{REGISTRY_HOST}/{}@{}", self.repository(), self.digest())
    }
}

/// The image every test session runs unless it says otherwise: linux/arm64,
/// one small layer. Its digest is fixed (`sessions::TEST_IMAGE`).
pub fn test_agent_image() -> Image {
    Image::single("hangar/agent", Manifest::of("linux", "arm64", &[("etc/hangar-image", b"hangar test agent\n")]))
}

/// The images `make up` pushes for the examples: an agent image for both
/// platforms (an index) and an arm64 companion.
/// Their references (`examples/*.yaml` name these).
pub const EXAMPLE_IMAGES: [&str; 2] = [
    "registry.hangar.test/examples/python@sha256:ef7d4b966af9c166e80e257eb2434ad8f3da4c4e89c6f55f5471f6d639d0b321",
    "registry.hangar.test/examples/redis@sha256:b61487848dd9c6cd3a85b24aa1f3e641b0aad270650c21ab01ec9d94f88065bd",
];

pub fn example_images() -> Vec<Image> {
    vec![
        Image::index("examples/python", &[("linux", "amd64"), ("linux", "arm64")]),
        Image::single(
            "examples/redis",
            Manifest::of("linux", "arm64", &[("etc/hangar-image", b"hangar example companion\n")]),
        ),
    ]
}

/// Where Debian's busybox-static installs its static busybox.
pub const STATIC_BUSYBOX: &str = "/bin/busybox";

/// A tenant's image with a shell for the real node's sessions: Debian's
/// static busybox as `/bin/sh` (see [`busybox_image`]). `None` without
/// busybox-static (system-packages.sh installs it).
pub fn shell_image() -> Option<Image> {
    busybox_image("examples/shell", &[], &[])
}

/// The page [`web_companion_image`] serves.
pub const COMPANION_PAGE: &[u8] = b"served by the companion\n";
/// Where [`web_companion_image`] listens, in its Pod's network.
pub const COMPANION_PORT: u16 = 8080;

/// A companion that stays up and can be reached beside the agent: busybox
/// `httpd` in the foreground serving [`COMPANION_PAGE`] on
/// [`COMPANION_PORT`] of the Pod's loopback.
pub fn web_companion_image() -> Option<Image> {
    let port = COMPANION_PORT.to_string();
    let entrypoint = ["/bin/busybox", "httpd", "-f", "-p", &format!("127.0.0.1:{port}"), "-h", "/www"];
    busybox_image("examples/web", &[("www/index.html", COMPANION_PAGE, 0o644)], &entrypoint)
}

/// Debian's static busybox (also as `/bin/sh`) and `files`, started by
/// `entrypoint`, for this machine's architecture, in an index whose arm64
/// entry (what a session node would run; the real node here is this
/// machine) holds a marker only, as the examples' do.
fn busybox_image(repository: &str, files: &[(&str, &[u8], u32)], entrypoint: &[&str]) -> Option<Image> {
    let busybox = std::fs::read(STATIC_BUSYBOX).ok()?;
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let mut all = vec![("bin/busybox", busybox.as_slice(), 0o755), ("bin/sh", busybox.as_slice(), 0o755)];
    all.extend_from_slice(files);
    let mut image = Manifest::with_modes("linux", arch, &all);
    if !entrypoint.is_empty() {
        image.config = config_with_entrypoint("linux", arch, &[sha256(&tar_with_modes(&all))], entrypoint);
    }
    let mut entries = vec![("linux".to_owned(), arch.to_owned(), image)];
    if arch != "arm64" {
        let marker = Manifest::of("linux", "arm64", &[("etc/hangar-image", b"linux/arm64\n")]);
        entries.push(("linux".to_owned(), "arm64".to_owned(), marker));
    }
    Some(Image::Index { repository: repository.into(), entries })
}

/// An image config of `os/arch` whose rootfs lists `diff_ids`.
pub fn config(os: &str, arch: &str, diff_ids: &[String]) -> Blob {
    config_with_entrypoint(os, arch, diff_ids, &[])
}

/// The same, started by `entrypoint` (none: the runtime's default).
pub fn config_with_entrypoint(os: &str, arch: &str, diff_ids: &[String], entrypoint: &[&str]) -> Blob {
    let doc = ConfigDoc {
        architecture: arch.into(),
        os: os.into(),
        config: RunConfig {
            env: vec!["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()],
            entrypoint: entrypoint.iter().map(|s| s.to_string()).collect(),
        },
        rootfs: RootFs { kind: "layers", diff_ids: diff_ids.to_vec() },
    };
    Blob::new("application/vnd.oci.image.config.v1+json", serde_json::to_vec(&doc).expect("config json"))
}

// The documents as structs, not `json!` maps: a struct's fields serialize
// in declaration order whatever serde_json's features, so the bytes (and
// digests) are the same in every build.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    media_type: &'static str,
    digest: String,
    size: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    platform: Option<PlatformDoc>,
}

#[derive(Serialize)]
struct PlatformDoc {
    architecture: String,
    os: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ManifestDoc {
    schema_version: u32,
    media_type: &'static str,
    config: Descriptor,
    layers: Vec<Descriptor>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct IndexDoc {
    schema_version: u32,
    media_type: &'static str,
    manifests: Vec<Descriptor>,
}

#[derive(Serialize)]
struct ConfigDoc {
    architecture: String,
    os: String,
    config: RunConfig,
    rootfs: RootFs,
}

#[derive(Serialize)]
struct RunConfig {
    #[serde(rename = "Env")]
    env: Vec<String>,
    // Absent when empty: the examples' digests stay what they were.
    #[serde(rename = "Entrypoint", skip_serializing_if = "Vec::is_empty")]
    entrypoint: Vec<String>,
}

#[derive(Serialize)]
struct RootFs {
    #[serde(rename = "type")]
    kind: &'static str,
    diff_ids: Vec<String>,
}

pub fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

/// A tar archive of `files` with fixed owners and times (reproducible).
fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    let files: Vec<(&str, &[u8], u32)> = files.iter().map(|(p, d)| (*p, *d, 0o644)).collect();
    tar_with_modes(&files)
}

/// The same with each file's mode.
fn tar_with_modes(files: &[(&str, &[u8], u32)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, data, mode) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(*mode);
        h.set_mtime(0);
        h.set_uid(0);
        h.set_gid(0);
        h.set_cksum();
        b.append_data(&mut h, path, *data).expect("tar entry");
    }
    b.into_inner().expect("tar")
}

/// gzip with no name and time 0 in its header (reproducible).
fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::GzBuilder::new().mtime(0).write(Vec::new(), flate2::Compression::default());
    e.write_all(bytes).expect("gzip");
    e.finish().expect("gzip")
}

async fn push(base: &str, creds: Option<(String, String)>, image: &Image) -> String {
    let http = reqwest::Client::new();
    let repo = image.repository();
    let auth = |r: reqwest::RequestBuilder| match &creds {
        Some((u, p)) => r.basic_auth(u, Some(p)),
        None => r,
    };
    let put_blob = |blob: Blob| {
        let (http, auth) = (&http, &auth);
        async move {
            let start = auth(http.post(format!("{base}/v2/{repo}/blobs/uploads/"))).send().await.expect("start upload");
            assert!(start.status().is_success(), "start upload: {}", start.status());
            let location = start.headers()["location"].to_str().expect("location").to_owned();
            let url = if location.starts_with("http") { location } else { format!("{base}{location}") };
            let sep = if url.contains('?') { '&' } else { '?' };
            let done = auth(http.put(format!("{url}{sep}digest={}", blob.digest())))
                .header("content-type", "application/octet-stream")
                .body(blob.bytes)
                .send()
                .await
                .expect("upload blob");
            assert!(done.status().is_success(), "upload blob: {}", done.status());
        }
    };
    let put_manifest = |reference: String, media_type: &'static str, bytes: Vec<u8>| {
        let (http, auth) = (&http, &auth);
        async move {
            let r = auth(http.put(format!("{base}/v2/{repo}/manifests/{reference}")))
                .header("content-type", media_type)
                .body(bytes)
                .send()
                .await
                .expect("put manifest");
            assert!(r.status().is_success(), "put manifest: {} {}", r.status(), r.text().await.unwrap_or_default());
        }
    };
    let manifests: Vec<&Manifest> = match image {
        Image::Single { manifest, .. } => vec![manifest],
        Image::Index { entries, .. } => entries.iter().map(|(_, _, m)| m).collect(),
    };
    for m in manifests {
        put_blob(m.config.clone()).await;
        for l in &m.layers {
            put_blob(l.clone()).await;
        }
        put_manifest(m.digest(), "application/vnd.oci.image.manifest.v1+json", m.bytes()).await;
    }
    if let Image::Index { entries, .. } = image {
        put_manifest(image.digest(), "application/vnd.oci.image.index.v1+json", Image::index_bytes(entries)).await;
    }
    image.reference()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_images_are_reproducible() {
        // The digests the tests and the examples name.
        assert_eq!(test_agent_image().reference(), crate::sessions::TEST_IMAGE);
        let examples: Vec<String> = example_images().iter().map(Image::reference).collect();
        assert_eq!(examples, EXAMPLE_IMAGES);
        // And an index's entries are the manifests pushed under it.
        let Image::Index { entries, .. } = &example_images()[0] else { panic!("an index") };
        assert_eq!(
            entries[1].2.config.bytes,
            config("linux", "arm64", &[sha256(&tar_of(&[("etc/hangar-image", b"linux/arm64\n")]))]).bytes
        );
    }
}

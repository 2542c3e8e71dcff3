//! Reading an image from its registry for the preflight, with `oci-client`:
//! the manifest (or index, then its linux/arm64 entry), the config's
//! platform, and the size the registry reports for each layer blob. No
//! layer is downloaded: a blob's size is read from its response headers
//! and the body is dropped unread.

use std::collections::HashMap;
use std::str::FromStr;

use hangar_core::images::preflight::{self, IndexEntry, Layer, Passed, Platform};
use hangar_core::refusal::Refusal;
use hangar_crds::ErrorCode;
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::manifest::{
    IMAGE_DOCKER_CONFIG_MEDIA_TYPE, IMAGE_MANIFEST_LIST_MEDIA_TYPE, IMAGE_MANIFEST_MEDIA_TYPE,
    OCI_IMAGE_INDEX_MEDIA_TYPE, OCI_IMAGE_MEDIA_TYPE,
};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use serde::Deserialize;

/// A config blob larger than this is not read (a platform fits in a few
/// hundred bytes; the registry is the tenant's and may be hostile).
const MAX_CONFIG_BYTES: u64 = 4 << 20;
/// Manifests and indexes larger than this are refused (the distribution
/// spec's registries accept up to 4 MiB).
const MAX_MANIFEST_BYTES: usize = 4 << 20;

const MANIFEST_TYPES: [&str; 4] =
    [OCI_IMAGE_MEDIA_TYPE, IMAGE_MANIFEST_MEDIA_TYPE, OCI_IMAGE_INDEX_MEDIA_TYPE, IMAGE_MANIFEST_LIST_MEDIA_TYPE];

/// Why an image could not be judged this time: worth asking again later.
#[derive(Debug, thiserror::Error)]
#[error("{image}: {reason}")]
pub struct Unreachable {
    pub image: String,
    pub reason: String,
}

/// How to reach the registries: endpoint overrides per host, and which of
/// them speak plain HTTP (loopback only).
pub struct Registries {
    config: fn() -> oci_client::client::ClientConfig,
    http: Vec<String>,
    /// One client per credential: oci-client keeps the first credential
    /// it is given for a registry, so a rotated (or newly added) one needs
    /// a client of its own. Keyed by a digest of the credential.
    clients: std::sync::Mutex<HashMap<[u8; 32], Client>>,
    /// host as images name it → host:port to connect to.
    endpoints: HashMap<String, String>,
}

impl Registries {
    /// `endpoints`: `(host, url)`, e.g. `("registry.hangar.test",
    /// "http://127.0.0.1:5000")`. Plain HTTP is refused for anything but a
    /// loopback address.
    pub fn new(endpoints: &[(String, String)]) -> Result<Self, String> {
        let mut map = HashMap::new();
        let mut http = Vec::new();
        for (host, url) in endpoints {
            let (plain, rest) = match url.split_once("://") {
                Some(("http", rest)) => (true, rest),
                Some(("https", rest)) => (false, rest),
                _ => return Err(format!("registry endpoint {url}: expected http:// or https://")),
            };
            let authority = rest.trim_end_matches('/').to_owned();
            if plain && !is_loopback(&authority) {
                return Err(format!("registry endpoint {url}: plain http only for a loopback registry"));
            }
            if plain {
                http.push(authority.clone());
            }
            map.insert(host.clone(), authority);
        }
        let config = || oci_client::client::ClientConfig {
            connect_timeout: Some(std::time::Duration::from_secs(5)),
            read_timeout: Some(std::time::Duration::from_secs(30)),
            ..Default::default()
        };
        Ok(Self { config, http, clients: Default::default(), endpoints: map })
    }

    /// The client for `auth` (made on first use).
    fn client(&self, auth: &RegistryAuth) -> Client {
        use sha2::Digest;
        let key: [u8; 32] = match auth {
            RegistryAuth::Anonymous => sha2::Sha256::digest(b"anonymous").into(),
            RegistryAuth::Basic(u, p) => sha2::Sha256::digest(format!("basic\0{u}\0{p}")).into(),
            RegistryAuth::Bearer(t) => sha2::Sha256::digest(format!("bearer\0{t}")).into(),
        };
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        // A bound on stale credentials' clients (rotations): start afresh.
        if clients.len() > 64 {
            clients.clear();
        }
        clients
            .entry(key)
            .or_insert_with(|| {
                Client::new(oci_client::client::ClientConfig {
                    protocol: oci_client::client::ClientProtocol::HttpsExcept(self.http.clone()),
                    ..(self.config)()
                })
            })
            .clone()
    }

    /// The registry host an image names (`docker.io` when it names none).
    pub fn host_of(image: &str) -> Option<String> {
        Reference::from_str(image).ok().map(|r| r.registry().to_owned())
    }

    /// Reads `image` and judges it. `Ok(Err(_))`: refused, for good (the
    /// same bytes get the same answer); `Err(_)`: could not read it now.
    pub async fn check(&self, image: &str, auth: &RegistryAuth) -> Result<Result<Passed, Refusal>, Unreachable> {
        let unreachable = |reason: String| Unreachable { image: image.to_owned(), reason };
        let named = Reference::from_str(image).map_err(|e| unreachable(format!("not an image reference: {e}")))?;
        let Some(digest) = named.digest().map(str::to_owned) else {
            return Err(unreachable("not pinned by digest".into()));
        };
        let host = self.endpoints.get(named.registry()).cloned().unwrap_or_else(|| named.registry().to_owned());
        let reference = Reference::with_digest(host, named.repository().to_owned(), digest.clone());

        let client = self.client(auth);
        let manifest = match read_manifest(&client, &reference, auth).await {
            Ok(m) => m,
            Err(e) => return judged_or_unreachable(image, e),
        };
        let (manifest_digest, image_manifest) = match manifest {
            Manifest::Index(entries) => {
                let entry = match preflight::choose_entry(image, &entries) {
                    Ok(e) => e.digest.clone(),
                    Err(refusal) => return Ok(Err(refusal)),
                };
                match read_manifest(&client, &reference.clone_with_digest(entry.clone()), auth).await {
                    Ok(Manifest::Image(m)) => (entry, m),
                    Ok(Manifest::Index(_)) => {
                        return Ok(Err(not_an_image(image, "its linux/arm64 entry is another index")));
                    }
                    Err(e) => return judged_or_unreachable(image, e),
                }
            }
            Manifest::Image(m) => (digest, m),
        };
        let platform = match read_platform(&client, &reference, &image_manifest.config).await {
            Ok(Ok(p)) => p,
            Ok(Err(refusal)) => return Ok(Err(refusal)),
            Err(e) => return judged_or_unreachable(image, e),
        };
        // The platform first: an image of another platform is refused
        // without asking for its layers.
        if !platform.runs_here() {
            return Ok(preflight::judge(image, &manifest_digest, &platform, &[]));
        }
        let mut layers = Vec::with_capacity(image_manifest.layers.len());
        for l in &image_manifest.layers {
            let reported = match client.pull_blob_stream(&reference, l.digest.as_str()).await {
                Ok(stream) => stream.content_length,
                Err(e) => return judged_or_unreachable(image, e),
            };
            layers.push(Layer { digest: l.digest.clone(), declared: l.size.max(0) as u64, reported });
        }
        Ok(preflight::judge(image, &manifest_digest, &platform, &layers))
    }
}

async fn read_manifest(
    client: &Client,
    reference: &Reference,
    auth: &RegistryAuth,
) -> Result<Manifest, OciDistributionError> {
    let (body, _digest) = client.pull_manifest_raw(reference, auth, &MANIFEST_TYPES).await?;
    if body.len() > MAX_MANIFEST_BYTES {
        return Err(OciDistributionError::ManifestParsingError(format!(
            "manifest of {} bytes, over the {MAX_MANIFEST_BYTES} bytes read",
            body.len()
        )));
    }
    let doc: ManifestDoc =
        serde_json::from_slice(&body).map_err(|e| OciDistributionError::ManifestParsingError(e.to_string()))?;
    match (doc.manifests, doc.config) {
        (Some(entries), _) => Ok(Manifest::Index(
            entries
                .into_iter()
                .map(|e| IndexEntry {
                    digest: e.digest,
                    platform: e.platform.map(|p| Platform { os: p.os, architecture: p.architecture }),
                })
                .collect(),
        )),
        (None, Some(config)) => Ok(Manifest::Image(ImageManifest { config, layers: doc.layers })),
        (None, None) => Err(OciDistributionError::ManifestParsingError(
            "neither an image manifest (config, layers) nor an index (manifests)".into(),
        )),
    }
}

/// The platform from the image's config blob (bounded read).
async fn read_platform(
    client: &Client,
    reference: &Reference,
    config: &Descriptor,
) -> Result<Result<Platform, Refusal>, OciDistributionError> {
    if config.size < 0 || config.size as u64 > MAX_CONFIG_BYTES {
        return Ok(Err(not_an_image(&reference.whole(), "its config is larger than 4 MiB")));
    }
    if !matches!(
        config.media_type.as_str(),
        oci_client::manifest::IMAGE_CONFIG_MEDIA_TYPE | IMAGE_DOCKER_CONFIG_MEDIA_TYPE
    ) {
        return Ok(Err(not_an_image(
            &reference.whole(),
            &format!("its config is {}, not an image config", config.media_type),
        )));
    }
    let mut bytes = Vec::with_capacity(config.size as usize);
    // The descriptor's size bounds the read; pull_blob checks the digest.
    let limited = LimitedWriter { inner: &mut bytes, left: MAX_CONFIG_BYTES as usize };
    client.pull_blob(reference, config.digest.as_str(), limited).await?;
    let c: ConfigDoc =
        serde_json::from_slice(&bytes).map_err(|e| OciDistributionError::ManifestParsingError(e.to_string()))?;
    Ok(Ok(Platform { os: c.os, architecture: c.architecture }))
}

/// A registry's answer that settles the image (no such manifest; denied)
/// is a refusal; anything else is asked again later.
fn judged_or_unreachable(image: &str, e: OciDistributionError) -> Result<Result<Passed, Refusal>, Unreachable> {
    let refusal = |code, text: String| Ok(Err(Refusal::new(code, text)));
    match &e {
        OciDistributionError::ImageManifestNotFoundError(_) => {
            refusal(ErrorCode::PreflightImageNotFound, format!("{image} is not in its registry"))
        }
        OciDistributionError::RegistryError { envelope, .. }
            if envelope.errors.iter().any(|c| {
                matches!(
                    c.code,
                    OciErrorCode::ManifestUnknown
                        | OciErrorCode::NameUnknown
                        | OciErrorCode::BlobUnknown
                        | OciErrorCode::NotFound
                )
            }) =>
        {
            refusal(ErrorCode::PreflightImageNotFound, format!("{image} (or one of its blobs) is not in its registry"))
        }
        OciDistributionError::RegistryError { envelope, .. }
            if envelope.errors.iter().any(|c| matches!(c.code, OciErrorCode::Unauthorized | OciErrorCode::Denied)) =>
        {
            refusal(ErrorCode::PreflightRegistryDenied, denied(image))
        }
        OciDistributionError::UnauthorizedError { .. } | OciDistributionError::AuthenticationFailure(_) => {
            refusal(ErrorCode::PreflightRegistryDenied, denied(image))
        }
        OciDistributionError::ServerError { code: 404, .. } => {
            refusal(ErrorCode::PreflightImageNotFound, format!("{image} is not in its registry"))
        }
        OciDistributionError::ServerError { code: 401 | 403, .. } => {
            refusal(ErrorCode::PreflightRegistryDenied, denied(image))
        }
        OciDistributionError::ManifestParsingError(why)
        | OciDistributionError::VersionedParsingError(why)
        | OciDistributionError::UnsupportedMediaTypeError(why) => Ok(Err(not_an_image(image, why))),
        OciDistributionError::DigestError(d) => Ok(Err(not_an_image(image, &format!("digest mismatch: {d}")))),
        _ => Err(Unreachable { image: image.to_owned(), reason: e.to_string() }),
    }
}

fn denied(image: &str) -> String {
    format!(
        "the registry of {image} refused hangar's credentials; next step: put a pull credential for it in the \
         operator's registry credentials Secret (chart value operator.registries.credentialsSecret)"
    )
}

fn not_an_image(image: &str, why: &str) -> Refusal {
    Refusal::new(ErrorCode::PreflightImageNotFound, format!("{image} is not an image hangar can run: {why}"))
}

fn is_loopback(authority: &str) -> bool {
    let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h);
    host == "localhost" || host.trim_matches(['[', ']']).parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

enum Manifest {
    Index(Vec<IndexEntry>),
    Image(ImageManifest),
}

struct ImageManifest {
    config: Descriptor,
    layers: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct ManifestDoc {
    #[serde(default)]
    manifests: Option<Vec<IndexEntryDoc>>,
    #[serde(default)]
    config: Option<Descriptor>,
    #[serde(default)]
    layers: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct IndexEntryDoc {
    digest: String,
    #[serde(default)]
    platform: Option<PlatformDoc>,
}

#[derive(Deserialize)]
struct PlatformDoc {
    os: String,
    architecture: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    #[serde(default)]
    media_type: String,
    digest: String,
    size: i64,
}

#[derive(Deserialize)]
struct ConfigDoc {
    #[serde(default)]
    os: String,
    #[serde(default)]
    architecture: String,
}

/// Writes at most `left` bytes, then fails (a config larger than its
/// descriptor said).
struct LimitedWriter<'a> {
    inner: &'a mut Vec<u8>,
    left: usize,
}

impl tokio::io::AsyncWrite for LimitedWriter<'_> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if buf.len() > self.left {
            return std::task::Poll::Ready(Err(std::io::Error::other("config blob larger than allowed")));
        }
        self.left -= buf.len();
        self.inner.extend_from_slice(buf);
        std::task::Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_only_to_loopback() {
        assert!(Registries::new(&[("r.test".into(), "http://127.0.0.1:5000".into())]).is_ok());
        assert!(Registries::new(&[("r.test".into(), "http://localhost:5000".into())]).is_ok());
        assert!(Registries::new(&[("r.test".into(), "http://[::1]:5000".into())]).is_ok());
        assert!(Registries::new(&[("r.test".into(), "http://10.0.0.8:5000".into())]).is_err());
        assert!(Registries::new(&[("r.test".into(), "https://mirror.corp:443".into())]).is_ok());
        assert!(Registries::new(&[("r.test".into(), "ftp://x".into())]).is_err());
    }
}

//! The image preflight, as pure judgements over what the registry showed.
//!
//! A session's instance is Graviton, so every image must be `linux/arm64`,
//! or an index with a `linux/arm64` entry (judged on that entry); and it
//! must fit 8 GiB compressed, each layer counted at the larger of the size
//! its manifest declares and the size the registry reports for the blob
//! (a manifest cannot under-declare its way past the limit).

use hangar_crds::ErrorCode;

use crate::refusal::Refusal;

/// The CPU pool's allowance: 8 GiB compressed.
pub const MAX_COMPRESSED_BYTES: u64 = 8 << 30;

/// What the session's instance runs.
pub const OS: &str = "linux";
pub const ARCHITECTURE: &str = "arm64";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Platform {
    pub os: String,
    pub architecture: String,
}

impl Platform {
    pub fn runs_here(&self) -> bool {
        self.os == OS && self.architecture == ARCHITECTURE
    }

    fn name(&self) -> String {
        format!("{}/{}", self.os, self.architecture)
    }
}

/// One entry of an image index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    pub digest: String,
    /// `None`: the entry names no platform (an attestation, say).
    pub platform: Option<Platform>,
}

/// One layer: its declared size and, once asked, the size the registry
/// reports for its blob.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layer {
    pub digest: String,
    pub declared: u64,
    pub reported: Option<u64>,
}

impl Layer {
    /// The size the layer counts at.
    pub fn counted(&self) -> u64 {
        self.declared.max(self.reported.unwrap_or(0))
    }
}

/// An image that passed: the manifest the session runs and its size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Passed {
    /// The digest of the `linux/arm64` image manifest (the index's entry,
    /// or the image itself).
    pub manifest_digest: String,
    pub compressed_bytes: u64,
}

/// The `linux/arm64` entry of an index, else `preflight_architecture`
/// naming the platforms it has.
pub fn choose_entry<'a>(image: &str, entries: &'a [IndexEntry]) -> Result<&'a IndexEntry, Refusal> {
    if let Some(e) = entries.iter().find(|e| e.platform.as_ref().is_some_and(Platform::runs_here)) {
        return Ok(e);
    }
    let mut has: Vec<String> = entries.iter().filter_map(|e| e.platform.as_ref().map(Platform::name)).collect();
    has.sort();
    has.dedup();
    Err(architecture_refusal(image, &format!("an index of {}", list(&has))))
}

/// Judges one image manifest: its config's platform, then its size.
pub fn judge(image: &str, manifest_digest: &str, platform: &Platform, layers: &[Layer]) -> Result<Passed, Refusal> {
    if !platform.runs_here() {
        return Err(architecture_refusal(image, &format!("a {} image", platform.name())));
    }
    let total = layers.iter().fold(0u64, |sum, l| sum.saturating_add(l.counted()));
    if total > MAX_COMPRESSED_BYTES {
        let under_declared = layers.iter().filter(|l| l.reported.is_some_and(|r| r > l.declared)).count();
        let note = if under_declared > 0 {
            format!(
                " ({under_declared} layer(s) larger in the registry than the manifest declares, counted at the larger)"
            )
        } else {
            String::new()
        };
        return Err(Refusal::new(
            ErrorCode::PreflightTooLarge,
            format!(
                "{image} is {} compressed{note}, over the CPU pool's allowance of 8 GiB; next step: \
                 make the image smaller (fewer or slimmer layers) and push it again",
                human(total)
            ),
        ));
    }
    Ok(Passed { manifest_digest: manifest_digest.to_owned(), compressed_bytes: total })
}

fn architecture_refusal(image: &str, what: &str) -> Refusal {
    Refusal::new(
        ErrorCode::PreflightArchitecture,
        format!(
            "{image} is {what}, with no linux/arm64 image; the session's instance is Graviton (arm64). \
             Next step: build for linux/arm64 (e.g. docker buildx --platform linux/arm64,linux/amd64) and push it again"
        ),
    )
}

fn list(platforms: &[String]) -> String {
    if platforms.is_empty() { "no platforms".into() } else { platforms.join(", ") }
}

fn human(bytes: u64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    format!("{:.2} GiB ({bytes} bytes)", bytes as f64 / GIB)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn platform(os: &str, arch: &str) -> Platform {
        Platform { os: os.into(), architecture: arch.into() }
    }

    fn layer(declared: u64, reported: Option<u64>) -> Layer {
        Layer { digest: "sha256:l".into(), declared, reported }
    }

    #[test]
    fn an_index_is_judged_on_its_linux_arm64_entry() {
        let entries = vec![
            IndexEntry { digest: "sha256:amd".into(), platform: Some(platform("linux", "amd64")) },
            IndexEntry { digest: "sha256:att".into(), platform: None },
            IndexEntry { digest: "sha256:arm".into(), platform: Some(platform("linux", "arm64")) },
        ];
        assert_eq!(choose_entry("r/i", &entries).unwrap().digest, "sha256:arm");
        let err = choose_entry("r/i", &entries[..2]).unwrap_err();
        assert_eq!(err.code, ErrorCode::PreflightArchitecture);
        assert!(err.text.contains("an index of linux/amd64"), "{}", err.text);
        // windows/arm64 is not linux/arm64.
        let win = [IndexEntry { digest: "sha256:w".into(), platform: Some(platform("windows", "arm64")) }];
        assert!(choose_entry("r/i", &win).is_err());
    }

    #[test]
    fn a_single_platform_image_of_another_platform_is_refused() {
        let err = judge("r/i", "sha256:m", &platform("linux", "amd64"), &[layer(10, Some(10))]).unwrap_err();
        assert_eq!(err.code, ErrorCode::PreflightArchitecture);
        assert!(err.text.contains("a linux/amd64 image"), "{}", err.text);
        let ok = judge("r/i", "sha256:m", &platform("linux", "arm64"), &[layer(10, Some(10))]).unwrap();
        assert_eq!(ok, Passed { manifest_digest: "sha256:m".into(), compressed_bytes: 10 });
    }

    #[test]
    fn each_layer_counts_at_the_larger_of_declared_and_reported() {
        let arm = platform("linux", "arm64");
        // Exactly at the allowance passes; one byte over does not.
        let at = [layer(MAX_COMPRESSED_BYTES - 100, Some(1)), layer(100, None)];
        assert_eq!(judge("r/i", "d", &arm, &at).unwrap().compressed_bytes, MAX_COMPRESSED_BYTES);
        let declared_over = [layer(MAX_COMPRESSED_BYTES, None), layer(1, Some(1))];
        assert_eq!(judge("r/i", "d", &arm, &declared_over).unwrap_err().code, ErrorCode::PreflightTooLarge);
        // Declared under the limit, but the registry holds more than declared.
        let under_declared = [layer(MAX_COMPRESSED_BYTES - 100, Some(5)), layer(1, Some(65_536))];
        let err = judge("r/i", "d", &arm, &under_declared).unwrap_err();
        assert_eq!(err.code, ErrorCode::PreflightTooLarge);
        assert!(err.text.contains("1 layer(s) larger in the registry"), "{}", err.text);
        // Sizes that would overflow saturate instead of wrapping under the limit.
        let huge = [layer(u64::MAX, None), layer(u64::MAX, None)];
        assert_eq!(judge("r/i", "d", &arm, &huge).unwrap_err().code, ErrorCode::PreflightTooLarge);
    }
}

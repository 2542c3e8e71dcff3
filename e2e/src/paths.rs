//! Where things are: the repository, the build cache, the pinned versions.

use std::collections::HashMap;
use std::path::PathBuf;

/// The repository root (this crate lives in `<root>/e2e`).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("e2e has a parent").to_path_buf()
}

/// Cache outside the work tree for built binaries and the Python venv:
/// `$HANGAR_CACHE`, else `~/.cache/hangar`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("HANGAR_CACHE") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/tmp"));
    home.join(".cache/hangar")
}

/// `e2e/versions.env`, the one place the out-of-tree versions are pinned.
pub fn versions() -> HashMap<String, String> {
    let text = std::fs::read_to_string(repo_root().join("e2e/versions.env")).expect("e2e/versions.env");
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

pub fn version(key: &str) -> String {
    versions().remove(key).unwrap_or_else(|| panic!("{key} missing from e2e/versions.env"))
}

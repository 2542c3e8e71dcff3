//! Writes the generated CRDs to `crds/manifests/` and `charts/hangar/crds/`.
//! `crdgen --check` writes nothing and exits 1 when a file is out of date.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

fn main() -> ExitCode {
    let check = std::env::args().any(|a| a == "--check");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf();
    let dirs: [PathBuf; 2] = [root.join("crds/manifests"), root.join("charts/hangar/crds")];
    let manifests = match hangar_crds::manifests::all() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("crdgen: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut stale = 0;
    for dir in &dirs {
        for m in &manifests {
            let path = dir.join(m.file_name);
            let yaml = m.to_yaml().expect("CRD serialises");
            let current = std::fs::read_to_string(&path).unwrap_or_default();
            if current == yaml {
                continue;
            }
            if check {
                eprintln!("crdgen: {} is out of date; run `make crds`", path.display());
                stale += 1;
            } else {
                std::fs::create_dir_all(dir).expect("create manifest dir");
                std::fs::write(&path, yaml).expect("write manifest");
                eprintln!("crdgen: wrote {}", path.display());
            }
        }
    }
    if stale > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}

//! Writes the generated CRDs to every `manifests::COMMITTED_DIRS`.
//! `crdgen --check` writes nothing and exits 1 when a file is out of date.

use std::path::Path;
use std::process::ExitCode;

fn main() -> ExitCode {
    let check = std::env::args().any(|a| a == "--check");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf();
    let manifests = match hangar_crds::manifests::all() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("crdgen: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut stale = 0;
    for committed in &hangar_crds::manifests::COMMITTED_DIRS {
        let dir = root.join(committed.path);
        for m in &manifests {
            let path = dir.join(m.file_name);
            let yaml = m.to_yaml_for(committed).expect("CRD serialises");
            let current = std::fs::read_to_string(&path).unwrap_or_default();
            if current == yaml {
                continue;
            }
            if check {
                eprintln!("crdgen: {} is out of date; run `make crds`", path.display());
                stale += 1;
            } else {
                std::fs::create_dir_all(&dir).expect("create manifest dir");
                std::fs::write(&path, yaml).expect("write manifest");
                eprintln!("crdgen: wrote {}", path.display());
            }
        }
    }
    if stale > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}

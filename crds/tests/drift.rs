//! The committed CRD YAML (crds/manifests and the Helm charts' copies) must be
//! exactly what the Rust types generate. Run `make crds` to refresh it.

use std::path::Path;

#[test]
fn committed_crd_yaml_matches_the_rust_types() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut stale = Vec::new();
    for dir in &hangar_crds::manifests::COMMITTED_DIRS {
        for m in hangar_crds::manifests::all().unwrap() {
            let path = root.join(dir.path).join(m.file_name);
            let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
            if on_disk != m.to_yaml_for(dir).unwrap() {
                stale.push(path.display().to_string());
            }
        }
    }
    assert!(stale.is_empty(), "out of date (run `make crds`): {stale:?}");
}

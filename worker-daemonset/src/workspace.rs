//! The workspace at /workspace: opened at the start of an attempt, closed
//! (everything flushed to the volume) before a pause stops the instance.
//! Encryption under the session key arrives with the key hand-off.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

pub struct Workspace {
    root: PathBuf,
}

impl Workspace {
    pub fn open(root: &Path) -> io::Result<Self> {
        fs::create_dir_all(root.join(".hangar"))?;
        Ok(Self { root: root.to_path_buf() })
    }

    /// Flushes every file under the workspace to the volume and records the
    /// close, so nothing written before the pause is lost with the instance.
    pub fn close(&self) -> io::Result<()> {
        sync_tree(&self.root)?;
        fs::write(self.root.join(".hangar/closed"), b"closed\n")?;
        nix::unistd::sync();
        Ok(())
    }
}

fn sync_tree(dir: &Path) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let ty = entry.file_type()?;
        if ty.is_dir() {
            sync_tree(&entry.path())?;
        } else if ty.is_file() {
            fs::File::open(entry.path())?.sync_all()?;
        }
    }
    fs::File::open(dir)?.sync_all()
}

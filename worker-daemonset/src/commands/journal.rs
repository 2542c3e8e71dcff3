//! The hand-over journal, on the node's disk: for every command handed to a
//! supervisor, the boot id of that supervisor
//! (`<spool>/journal/<session id>/<number>`). Written before the Run is
//! sent, it is what tells, after a restart, a command lost with its
//! container (journalled for another boot) from one never handed over (not
//! journalled); see `plan::after_hello`.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
#[error("journal {path}: {source}")]
pub struct JournalError {
    path: PathBuf,
    #[source]
    source: std::io::Error,
}

pub struct Journal {
    dir: PathBuf,
}

impl Journal {
    pub fn new(spool_root: &Path, session_id: &str) -> Self {
        Self { dir: spool_root.join("journal").join(session_id) }
    }

    fn path(&self, n: u32) -> PathBuf {
        self.dir.join(n.to_string())
    }

    /// The boot command `n` was handed over to, if it was.
    pub fn read(&self, n: u32) -> Option<String> {
        std::fs::read_to_string(self.path(n)).ok()
    }

    /// Records that command `n` is handed over to the supervisor `boot`.
    pub fn write(&self, n: u32, boot: &str) -> Result<(), JournalError> {
        let path = self.path(n);
        let err = |source| JournalError { path: path.clone(), source };
        std::fs::create_dir_all(&self.dir).map_err(err)?;
        std::fs::write(&path, boot).map_err(err)
    }

    /// Forgets command `n`: its Run was not delivered, so the next
    /// connection hands it over again instead of taking it for a command
    /// lost with its container.
    pub fn forget(&self, n: u32) {
        let _ = std::fs::remove_file(self.path(n));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hand_over_is_kept_per_session_until_forgotten() {
        let spool = tempfile::tempdir().unwrap();
        let journal = Journal::new(spool.path(), "session-a");
        assert_eq!(journal.read(1), None);
        journal.write(1, "boot-1").unwrap();
        journal.write(2, "boot-1").unwrap();
        journal.write(2, "boot-2").unwrap();
        assert_eq!(journal.read(1).as_deref(), Some("boot-1"));
        assert_eq!(journal.read(2).as_deref(), Some("boot-2"), "the latest hand-over");
        assert_eq!(Journal::new(spool.path(), "session-b").read(1), None, "another session's journal");
        assert_eq!(std::fs::read_to_string(spool.path().join("journal/session-a/1")).unwrap(), "boot-1");
        journal.forget(1);
        journal.forget(3);
        assert_eq!(journal.read(1), None);
        assert_eq!(
            Journal::new(spool.path(), "session-a").read(2).as_deref(),
            Some("boot-2"),
            "on disk, for a restarted worker"
        );
    }
}

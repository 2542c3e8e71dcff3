//! The node's side of the hard stop: the worker hands the attempt's
//! deadline (`status.hardStopAt`, set by the operator) to the node, as a
//! file in its spool that a unit from the user data watches; at the
//! deadline that unit powers the instance off. The worker holds no right
//! to stop anything itself.

use std::io;
use std::path::Path;

use hangar_crds::sandbox::HARD_STOP_FILE_NAME;

/// Writes (atomically) or removes the deadline, in Unix seconds.
pub fn hand_to_node(spool: &Path, deadline: Option<i64>) -> io::Result<()> {
    let path = spool.join(HARD_STOP_FILE_NAME);
    match deadline {
        Some(t) => {
            std::fs::create_dir_all(spool)?;
            let tmp = spool.join(format!(".{HARD_STOP_FILE_NAME}.tmp"));
            std::fs::write(&tmp, format!("{t}\n"))?;
            std::fs::rename(&tmp, &path)
        }
        None => match std::fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deadline_is_written_replaced_and_removed() {
        let dir = std::env::temp_dir().join(format!("hangar-hard-stop-{}", std::process::id()));
        hand_to_node(&dir, Some(1_800_000_000)).unwrap();
        assert_eq!(std::fs::read_to_string(dir.join(HARD_STOP_FILE_NAME)).unwrap(), "1800000000\n");
        hand_to_node(&dir, Some(1_800_000_060)).unwrap();
        assert_eq!(std::fs::read_to_string(dir.join(HARD_STOP_FILE_NAME)).unwrap(), "1800000060\n");
        hand_to_node(&dir, None).unwrap();
        assert!(!dir.join(HARD_STOP_FILE_NAME).exists());
        hand_to_node(&dir, None).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

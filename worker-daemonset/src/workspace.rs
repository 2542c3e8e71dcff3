//! The workspace at /workspace, encrypted under the session's 64-byte key
//! (LUKS2, `cryptsetup`): opened at the start of an attempt, closed
//! (flushed, unmounted, the mapping removed) before a pause stops the
//! instance. The key reaches `cryptsetup` on a pipe, never a file.
//!
//! Opening, on the session's volume device:
//! 1. a blank device (no LUKS header, no filesystem signature) is formatted
//!    LUKS2 with the key; a device holding anything else is never formatted;
//! 2. the key is checked against the header's keyslot;
//! 3. the device is mapped (dm-crypt), a filesystem made on first use, and
//!    mounted at the workspace directory.
//!
//! The local node simulator (`plaintext_fallback`) runs steps 1 and 2 on a
//! real loop device but not step 3: its processes share one mount
//! namespace, and its VM's kernel has no device-mapper. There the files
//! stay in the directory. Anywhere else a device that cannot be mapped is
//! an error, never a silent plain workspace. No device at all
//! (`device: None`): the plain directory, for local runs.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The device-mapper name of the open workspace.
pub const MAPPER_NAME: &str = "hangar-workspace";

#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    #[error("workspace directory {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("could not run {program}: {source}")]
    Spawn {
        program: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("{step} failed (exit {code:?}): {stderr}")]
    Step { step: &'static str, code: Option<i32>, stderr: String },
    #[error("device {0} holds data that is not a LUKS volume: it is never formatted")]
    NotBlank(PathBuf),
    #[error("the session key does not open the workspace volume {0}")]
    WrongKey(PathBuf),
    #[error("device-mapper is not available here, so {0} cannot be opened")]
    NoDeviceMapper(PathBuf),
}

/// Where the workspace lives.
#[derive(Clone, Debug)]
pub struct Backing {
    /// The session's volume (`None`: a plain directory).
    pub device: Option<PathBuf>,
    /// Check the key on the device but keep the files in the directory,
    /// never mapped (the local simulator only).
    pub plaintext_fallback: bool,
}

pub struct Workspace {
    root: PathBuf,
    /// The device mapped and mounted at `root`, while open.
    mapped: bool,
}

/// Whether this kernel has device-mapper (dm-crypt needs it). Asked of
/// the kernel's list of misc devices: `/dev/mapper/control` alone proves
/// nothing (libdevmapper makes that node even where the kernel has none).
pub fn device_mapper_available() -> bool {
    fs::read_to_string("/proc/misc").is_ok_and(|m| m.lines().any(|l| l.trim_end().ends_with(" device-mapper")))
}

impl Workspace {
    pub fn open(root: &Path, backing: &Backing, key: &[u8]) -> Result<Self, WorkspaceError> {
        let io_err = |source| WorkspaceError::Io { path: root.to_path_buf(), source };
        fs::create_dir_all(root).map_err(io_err)?;
        let mut mapped = false;
        if let Some(device) = &backing.device {
            prepare_volume(device, key)?;
            if backing.plaintext_fallback {
                tracing::warn!(
                    device = %device.display(),
                    device_mapper = device_mapper_available(),
                    "simulated node: the key was checked against the volume's LUKS2 header, \
                     but the files stay in the plain directory"
                );
            } else if device_mapper_available() {
                map_and_mount(device, root, key)?;
                mapped = true;
            } else {
                return Err(WorkspaceError::NoDeviceMapper(device.clone()));
            }
        }
        fs::create_dir_all(root.join(".hangar")).map_err(io_err)?;
        let marker = root.join(hangar_supervisor_protocol::WORKSPACE_OPEN_MARKER);
        fs::write(&marker, b"open\n").map_err(io_err)?;
        Ok(Self { root: root.to_path_buf(), mapped })
    }

    /// Flushes every file under the workspace to the volume and records the
    /// close, so nothing written before the pause is lost with the
    /// instance; then unmounts and closes the encrypted mapping.
    pub fn close(&self) -> Result<(), WorkspaceError> {
        let io_err = |source| WorkspaceError::Io { path: self.root.clone(), source };
        // Closed first: a supervisor started from now on waits for the next
        // open.
        match fs::remove_file(self.root.join(hangar_supervisor_protocol::WORKSPACE_OPEN_MARKER)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(io_err(e)),
            _ => {}
        }
        sync_tree(&self.root).map_err(io_err)?;
        fs::write(self.root.join(".hangar/closed"), b"closed\n").map_err(io_err)?;
        nix::unistd::sync();
        if self.mapped {
            run("umount", Command::new("umount").arg(&self.root), None)?;
            run("cryptsetup close", Command::new("cryptsetup").args(["close", MAPPER_NAME]), None)?;
        }
        Ok(())
    }
}

/// Steps 1 and 2: format a blank device, then check the key opens it.
fn prepare_volume(device: &Path, key: &[u8]) -> Result<(), WorkspaceError> {
    let is_luks = Command::new("cryptsetup")
        .args(["isLuks", "--type", "luks2"])
        .arg(device)
        .status()
        .map_err(|source| WorkspaceError::Spawn { program: "cryptsetup", source })?
        .success();
    if !is_luks {
        if !is_blank(device)? {
            return Err(WorkspaceError::NotBlank(device.to_path_buf()));
        }
        // The key is 64 random bytes, not a passphrase: a slow key
        // derivation adds nothing, so PBKDF2 at its minimum keeps the
        // open fast.
        let mut format = Command::new("cryptsetup");
        format
            .args(["luksFormat", "--type", "luks2", "--batch-mode", "--cipher", "aes-xts-plain64", "--key-size", "512"])
            .args(["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000", "--key-file", "-"])
            .arg(device);
        run("cryptsetup luksFormat", &mut format, Some(key))?;
        tracing::info!(device = %device.display(), "workspace volume formatted (LUKS2)");
    }
    let mut test = Command::new("cryptsetup");
    test.args(["open", "--test-passphrase", "--key-file", "-"]).arg(device);
    match run("cryptsetup open --test-passphrase", &mut test, Some(key)) {
        Ok(()) => Ok(()),
        Err(WorkspaceError::Step { .. }) => Err(WorkspaceError::WrongKey(device.to_path_buf())),
        Err(e) => Err(e),
    }
}

/// No filesystem, partition table or other signature `blkid` knows (its
/// exit code 2 means "nothing found").
fn is_blank(device: &Path) -> Result<bool, WorkspaceError> {
    let status = Command::new("blkid")
        .args(["-p"])
        .arg(device)
        .stdout(Stdio::null())
        .status()
        .map_err(|source| WorkspaceError::Spawn { program: "blkid", source })?;
    Ok(status.code() == Some(2))
}

/// Step 3: map, make the filesystem on first use, mount.
fn map_and_mount(device: &Path, root: &Path, key: &[u8]) -> Result<(), WorkspaceError> {
    let mapper = Path::new("/dev/mapper").join(MAPPER_NAME);
    if !mapper.exists() {
        let mut open = Command::new("cryptsetup");
        open.args(["open", "--type", "luks2", "--key-file", "-"]).arg(device).arg(MAPPER_NAME);
        run("cryptsetup open", &mut open, Some(key))?;
    }
    if is_blank(&mapper)? {
        run("mkfs.ext4", Command::new("mkfs.ext4").args(["-q", "-L", "workspace"]).arg(&mapper), None)?;
    }
    let mounted = fs::read_to_string("/proc/mounts")
        .map_err(|source| WorkspaceError::Io { path: "/proc/mounts".into(), source })?
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(&*root.to_string_lossy()));
    if !mounted {
        run("mount", Command::new("mount").arg(&mapper).arg(root), None)?;
    }
    Ok(())
}

/// Runs a step, with `stdin` (the key) on a pipe when given.
fn run(step: &'static str, cmd: &mut Command, stdin: Option<&[u8]>) -> Result<(), WorkspaceError> {
    let program = if step.starts_with("cryptsetup") { "cryptsetup" } else { step };
    let mut child = cmd
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| WorkspaceError::Spawn { program, source })?;
    if let (Some(bytes), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(bytes).map_err(|source| WorkspaceError::Spawn { program, source })?;
    }
    let out = child.wait_with_output().map_err(|source| WorkspaceError::Spawn { program, source })?;
    if out.status.success() {
        return Ok(());
    }
    Err(WorkspaceError::Step {
        step,
        code: out.status.code(),
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
    })
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

#[cfg(test)]
mod tests {
    //! On a file standing for the device (cryptsetup formats and checks
    //! keys on files as on block devices); skipped where cryptsetup is
    //! missing, with the reason printed.
    use super::*;

    fn cryptsetup_present() -> bool {
        let found = Command::new("cryptsetup").arg("--version").output().is_ok_and(|o| o.status.success());
        if !found {
            eprintln!("skipped: cryptsetup is not installed");
        }
        found
    }

    fn blank_volume(dir: &Path) -> PathBuf {
        let path = dir.join("volume.img");
        fs::File::create(&path).and_then(|f| f.set_len(32 << 20)).expect("volume file");
        path
    }

    #[test]
    fn a_blank_volume_is_formatted_and_opens_only_with_its_key() {
        if !cryptsetup_present() {
            return;
        }
        let dir = tempfile::tempdir().expect("tmp");
        let device = blank_volume(dir.path());
        let key = [7u8; 64];
        prepare_volume(&device, &key).expect("formatted with the key");
        prepare_volume(&device, &key).expect("opens again with it, not formatted twice");
        let other = [8u8; 64];
        assert!(matches!(prepare_volume(&device, &other), Err(WorkspaceError::WrongKey(_))));
    }

    /// The whole opening (map, filesystem, mount) and closing, where this
    /// kernel has device-mapper and we are root; skipped otherwise.
    #[test]
    fn the_workspace_opens_encrypted_and_survives_a_close() {
        if !cryptsetup_present() {
            return;
        }
        if !nix::unistd::geteuid().is_root() || !device_mapper_available() {
            eprintln!("skipped: needs root and device-mapper (dm-crypt), which this kernel lacks");
            return;
        }
        let dir = tempfile::tempdir().expect("tmp");
        let image = blank_volume(dir.path());
        let out = Command::new("losetup").args(["--find", "--show"]).arg(&image).output().expect("losetup");
        let device = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        let root = dir.path().join("workspace");
        let backing = Backing { device: Some(device.clone()), plaintext_fallback: false };
        let key = [9u8; 64];
        let ws = Workspace::open(&root, &backing, &key).expect("opened");
        fs::write(root.join("kept"), b"across a close").expect("write");
        ws.close().expect("closed");
        assert!(!root.join("kept").exists(), "unmounted at the close");
        let ws = Workspace::open(&root, &backing, &key).expect("opened again");
        assert_eq!(fs::read(root.join("kept")).expect("read"), b"across a close");
        ws.close().expect("closed");
        let _ = Command::new("losetup").arg("--detach").arg(&device).status();
    }

    #[test]
    fn a_device_holding_other_data_is_never_formatted() {
        if !cryptsetup_present() {
            return;
        }
        let dir = tempfile::tempdir().expect("tmp");
        let device = blank_volume(dir.path());
        let made = Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&device).status().expect("mkfs.ext4");
        assert!(made.success());
        assert!(matches!(prepare_volume(&device, &[7u8; 64]), Err(WorkspaceError::NotBlank(_))));
    }
}

//! The key this attempt's command output is sealed under. The worker makes
//! it, keeps it on the node (beside the spool, so a restarted worker seals
//! with the same key) and hands it in as a Secret it can create but not
//! read; the operator seals it under the organisation key. The file is
//! written before the Secret, so a crash between them only means the
//! hand-off is created on the next start.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use hangar_crds::output_keys;
use hangar_output::{AttemptKey, KeyBytes};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use zeroize::Zeroizing;

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("attempt key file {path}: {source}")]
    File {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Seal(#[from] hangar_output::SealError),
    #[error("handing in the attempt key: {0}")]
    Kube(#[from] kube::Error),
}

/// Loads this attempt's key from the node, or makes it; then makes sure the
/// hand-off Secret exists (an existing one is left alone: workers cannot
/// overwrite keys).
pub async fn load_or_create(
    cfg: &crate::commands::RunnerConfig,
    secrets: &Api<Secret>,
    attempt: i64,
) -> Result<KeyBytes<32>, KeyError> {
    let (spool_root, session_id) = (cfg.spool_root.as_path(), cfg.session_id.as_str());
    let dir = spool_root.join("keys").join(session_id);
    let path = dir.join(format!("attempt-{attempt}"));
    let file_err = |source| KeyError::File { path: path.clone(), source };
    let read = std::fs::read(&path).map(Zeroizing::new);
    let key: KeyBytes<32> = match read {
        Ok(bytes) if bytes.len() == 32 => Zeroizing::new(bytes.as_slice().try_into().expect("32 bytes")),
        _ => {
            let key = AttemptKey::generate()?;
            std::fs::create_dir_all(&dir).map_err(file_err)?;
            let tmp = path.with_extension("tmp");
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)
                .map_err(file_err)?;
            f.write_all(key.as_slice()).and_then(|_| f.sync_all()).map_err(file_err)?;
            std::fs::rename(&tmp, &path).map_err(file_err)?;
            key
        }
    };
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(output_keys::handoff_secret_name(&cfg.node_name, session_id, attempt)),
            labels: Some(
                [
                    (output_keys::SESSION_ID_LABEL.to_owned(), session_id.to_owned()),
                    (output_keys::ATTEMPT_LABEL.to_owned(), attempt.to_string()),
                ]
                .into(),
            ),
            ..Default::default()
        },
        data: Some([(output_keys::HANDOFF_KEY.to_owned(), ByteString(key.to_vec()))].into()),
        type_: Some("Opaque".into()),
        ..Default::default()
    };
    // One that exists is left alone: workers cannot overwrite keys.
    hangar_runtime::kube_ext::ignore_already_exists(secrets.create(&PostParams::default(), &secret).await)?;
    Ok(key)
}

/// Keys of attempts before `attempt` are no longer needed on the node.
pub fn forget_earlier(spool_root: &Path, session_id: &str, attempt: i64) {
    let dir = spool_root.join("keys").join(session_id);
    let Ok(entries) = std::fs::read_dir(&dir) else { return };
    for e in entries.flatten() {
        let name = e.file_name();
        let n = name.to_str().and_then(|n| n.strip_prefix("attempt-")).and_then(|n| n.parse::<i64>().ok());
        if n.is_some_and(|n| n < attempt) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

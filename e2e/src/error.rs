use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{script} failed with {status}; see its output above")]
    Build { script: PathBuf, status: std::process::ExitStatus },
    #[error("certificate generation: {0}")]
    Pki(#[from] rcgen::Error),
    #[error("{name} exited ({status}); last log lines:\n{log_tail}")]
    Exited { name: String, status: std::process::ExitStatus, log_tail: String },
    #[error("{what} was not ready within {seconds}s; last log lines:\n{log_tail}")]
    NotReady { what: String, seconds: u64, log_tail: String },
    #[error("{0} has not been started")]
    NotStarted(&'static str),
    #[error("kube client: {0}")]
    Kube(#[from] kube::Error),
    #[error("kubeconfig: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    #[error("CRD manifests: {0}")]
    Manifest(#[from] hangar_crds::manifests::ManifestError),
    #[error("{command} failed: {stderr}")]
    Command { command: String, stderr: String },
    #[error("no free 10.89.<k>.0/24 for a node's bridge")]
    NoNodeNetwork,
    #[error("EC2: {0}")]
    Ec2(#[from] Box<aws_sdk_ec2::Error>),
    #[error("CRD {0} did not become Established")]
    CrdNotEstablished(String),
}

pub type Result<T, E = HarnessError> = std::result::Result<T, E>;

pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> HarnessError {
    let what = what.into();
    move |source| HarnessError::Io { what, source }
}

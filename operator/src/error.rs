use crate::ec2::Ec2Error;
use crate::keys::KeyError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Ec2(#[from] Ec2Error),
    #[error("session key: {0}")]
    Key(#[from] KeyError),
    #[error("command ledger: {0}")]
    Ledger(#[from] hangar_runtime::json_document::DocumentError),
    #[error("Sandbox has no {0}")]
    MissingField(&'static str),
    #[error("the reset of the session is not complete yet")]
    ResetPending,
    #[error("session certificate: {0}")]
    Certificate(#[from] crate::certificates::CertificateError),
    #[error("Secret {0} holds no key hangar sealed for this session: refused, the session waits")]
    ForeignKeySecret(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

//! Admission: `review` reads an AdmissionReview and writes the answer;
//! each kind's rules live in a module of its own.

pub mod commands;
pub mod review;

use hangar_crds::ErrorCode;

/// A refusal: the contract's code and why. The message the client sees
/// starts with the code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: ErrorCode,
    pub text: String,
}

impl Refusal {
    pub fn new(code: ErrorCode, text: impl Into<String>) -> Self {
        Self { code, text: text.into() }
    }

    pub fn message(&self) -> String {
        self.code.message(&self.text)
    }
}

/// Errors that keep the webhook from deciding (the apiserver then applies
/// the webhook's failure policy: refuse).
#[derive(Debug, thiserror::Error)]
pub enum AdmissionError {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("the request has no object")]
    NoObject,
    #[error("the object is not a valid {kind}: {source}")]
    Decode {
        kind: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("too many concurrent admissions for one session; try again")]
    Contended,
}

//! Admission: `review` reads an AdmissionReview and writes the answer;
//! each kind's rules live in a module of its own.

pub mod caches;
pub mod commands;
pub mod review;
pub mod sandboxes;
pub mod session_tokens;
pub mod token_callers;

pub use hangar_core::admission::Refusal;

/// Errors that keep the webhook from deciding (the apiserver then applies
/// the webhook's failure policy: refuse).
#[derive(Debug, thiserror::Error)]
pub enum AdmissionError {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("the review has no request")]
    NoRequest,
    #[error("the request has no object")]
    NoObject,
    #[error("the object is not a valid {kind}: {source}")]
    Decode {
        kind: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("the command decider (the operator's leader): {0}")]
    Decider(String),
    #[error("the command decider (the operator's leader): {0}")]
    DeciderHttp(#[from] reqwest::Error),
    #[error("the command decider (the operator's leader) answered HTTP {0}")]
    DeciderAnswered(http::StatusCode),
    #[error("the Sandbox or Command watch ended before its first list")]
    CacheNotReady,
}

impl AdmissionError {
    /// A failure that may be gone when asked again shortly: the decider
    /// could not be reached, was changing leader (502/503) or held the
    /// request back (429).
    pub fn is_transient(&self) -> bool {
        use http::StatusCode;
        match self {
            Self::DeciderAnswered(s) => {
                matches!(*s, StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE | StatusCode::BAD_GATEWAY)
            }
            Self::DeciderHttp(e) => e.is_connect(),
            _ => false,
        }
    }
}

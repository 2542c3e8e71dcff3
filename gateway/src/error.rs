//! Errors in the contract's shape: `{"error":{"code":"…","message":"…"}}`
//! with the code's HTTP status.

use hangar_crds::ErrorCode;
use serde_json::{Value, json};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { status: code.http_status(), code: code.as_str(), message: message.into() }
    }

    /// No such route (404, `not_found`: not a session that does not exist).
    pub fn not_found(message: impl Into<String>) -> Self {
        Self { status: 404, code: "not_found", message: message.into() }
    }

    /// A route that exists, with another method.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self { status: 405, code: "method_not_allowed", message: message.into() }
    }

    /// Not a refusal: something on our side failed.
    pub fn internal(message: impl Into<String>) -> Self {
        Self { status: 500, code: "internal", message: message.into() }
    }

    pub fn body(&self) -> Value {
        json!({"error": {"code": self.code, "message": self.message}})
    }
}

/// The contract code a refusal message carries (CEL rules and the
/// admission webhook put it first in their part of the message). The
/// gateway's own generic codes are never looked for: the apiserver's RBAC
/// refusals say "is forbidden: User …", which is not a refusal of ours and
/// must not reach a client.
pub fn code_in(message: &str) -> Option<ErrorCode> {
    ErrorCode::ALL
        .iter()
        .filter(|c| !matches!(c, ErrorCode::Forbidden | ErrorCode::BadRequest | ErrorCode::RateLimited))
        .filter_map(|c| message.find(&format!("{}: ", c.as_str())).map(|at| (at, *c)))
        .min_by_key(|(at, c)| (*at, usize::MAX - c.as_str().len()))
        .map(|(_, c)| c)
}

impl axum::response::IntoResponse for ApiError {
    fn into_response(self) -> axum::response::Response {
        let status =
            axum::http::StatusCode::from_u16(self.status).unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR);
        if status == axum::http::StatusCode::TOO_MANY_REQUESTS {
            return (status, [(axum::http::header::RETRY_AFTER, "1")], axum::Json(self.body())).into_response();
        }
        (status, axum::Json(self.body())).into_response()
    }
}

impl From<kube::Error> for ApiError {
    fn from(e: kube::Error) -> Self {
        match &e {
            kube::Error::Api(ae) => match code_in(&ae.message) {
                Some(code) => {
                    let at = ae.message.find(code.as_str()).unwrap_or(0);
                    let text = ae.message[at..].trim_start_matches(code.as_str()).trim_start_matches(": ");
                    ApiError::new(code, text.to_owned())
                }
                // The apiserver's own words name objects, namespaces and
                // identities: they go to the log, the client gets the code.
                // RBAC refused the caller (the write is made as them).
                None if ae.code == 403 => {
                    tracing::info!(error = %ae.message, "request refused by the apiserver's authorisation");
                    ApiError::new(ErrorCode::Forbidden, "you may not do this to this session")
                }
                None if ae.code == 422 || ae.code == 400 => {
                    tracing::info!(error = %ae.message, "request refused by the apiserver");
                    ApiError::new(ErrorCode::SandboxRequestInvalid, "the request is not valid")
                }
                None => {
                    tracing::warn!(status = ae.code, error = %ae.message, "Kubernetes API");
                    ApiError::internal("the session API could not complete the request")
                }
            },
            _ => {
                tracing::warn!(error = %e, "Kubernetes API");
                ApiError::internal("the session API could not complete the request")
            }
        }
    }
}

impl From<hangar_core::refusal::Refusal> for ApiError {
    fn from(r: hangar_core::refusal::Refusal) -> Self {
        ApiError::new(r.code, r.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_code_is_found_inside_an_apiserver_message() {
        let m = r#"admission webhook "commands.hangar.dev" denied the request: sandbox_command_limit: a session takes at most 247 commands"#;
        assert_eq!(code_in(m), Some(ErrorCode::SandboxCommandLimit));
        let cel = r#"Command.hangar.dev "x" is invalid: spec.argv: Invalid value: "array": sandbox_request_invalid: argv needs a program"#;
        assert_eq!(code_in(cel), Some(ErrorCode::SandboxRequestInvalid));
        assert_eq!(code_in("nothing here"), None);
        let e = ApiError::new(ErrorCode::SandboxOutputErased, "gone");
        assert_eq!(e.status, 410);
        assert_eq!(e.body()["error"]["code"], "sandbox_output_erased");
    }

    #[test]
    fn an_apiserver_error_reaches_the_client_as_its_code_and_a_safe_message() {
        let raw = kube::Error::Api(Box::new(kube::core::Status {
            code: 403,
            message: "secrets \"hangar-org-key\" is forbidden: User \"system:serviceaccount:hangar-system:gateway\" cannot get resource".into(),
            ..Default::default()
        }));
        let e = ApiError::from(raw);
        // The caller's own RBAC refused it (writes are made as the caller).
        assert_eq!((e.status, e.code), (403, "forbidden"));
        assert!(!e.message.contains("hangar-system") && !e.message.contains("org-key"), "{}", e.message);
        let invalid = kube::Error::Api(Box::new(kube::core::Status {
            code: 422,
            message: "Command.hangar.dev \"x\" is invalid: metadata.name: tenant-b".into(),
            ..Default::default()
        }));
        let e = ApiError::from(invalid);
        assert_eq!((e.status, e.code), (400, "sandbox_request_invalid"));
        assert!(!e.message.contains("tenant-b"), "{}", e.message);
    }
}

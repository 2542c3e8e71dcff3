//! The contract's error codes (ARCHITECTURE §5). Every refusal, whether it
//! comes from a CEL rule, the webhook or the gateway, starts its message with
//! one of these, so clients can match on the code rather than the prose.

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    BadRequest,
    SandboxRequestInvalid,
    TokenInvalid,
    TokenScopeForbidden,
    Forbidden,
    SandboxNotFound,
    SandboxNotRunning,
    SandboxPauseUnavailable,
    SandboxCommandCancelled,
    SandboxCommandLimit,
    SandboxTokenLimit,
    SandboxEnded,
    SandboxOutputErased,
    PreflightArchitecture,
    PreflightTooLarge,
    ImagePreflightPending,
    /// Not in the contract's table: the preflight could not read the image
    /// (no such manifest in its registry; the registry refused hangar's
    /// credentials; unreachable for the preflight timeout). 422.
    PreflightImageNotFound,
    PreflightRegistryDenied,
    PreflightRegistryUnreachable,
    /// Not in the contract's table: `spec.template` names no template
    /// registered for the session's namespace (422), or one whose signature
    /// does not verify under the platform's trusted keys (422).
    TemplateNotRegistered,
    TemplateRejected,
    /// Not in the contract's table: an attachment names a Secret that is
    /// not the session's tenant's (or does not exist: the same answer). 403.
    AttachmentForbidden,
    SandboxLiveSnapshotUnsupported,
    /// Not in the contract's table: the gateway's per-caller and long-poll
    /// limits (429, with Retry-After).
    RateLimited,
    /// Not in the contract's table: the session certificate is asked for
    /// before the reset has signed it (409).
    SandboxCertificatePending,
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 25] = [
        ErrorCode::BadRequest,
        ErrorCode::SandboxRequestInvalid,
        ErrorCode::TokenInvalid,
        ErrorCode::TokenScopeForbidden,
        ErrorCode::Forbidden,
        ErrorCode::SandboxNotFound,
        ErrorCode::SandboxNotRunning,
        ErrorCode::SandboxPauseUnavailable,
        ErrorCode::SandboxCommandCancelled,
        ErrorCode::SandboxCommandLimit,
        ErrorCode::SandboxTokenLimit,
        ErrorCode::SandboxEnded,
        ErrorCode::SandboxOutputErased,
        ErrorCode::PreflightArchitecture,
        ErrorCode::PreflightTooLarge,
        ErrorCode::ImagePreflightPending,
        ErrorCode::PreflightImageNotFound,
        ErrorCode::PreflightRegistryDenied,
        ErrorCode::PreflightRegistryUnreachable,
        ErrorCode::TemplateNotRegistered,
        ErrorCode::TemplateRejected,
        ErrorCode::AttachmentForbidden,
        ErrorCode::SandboxLiveSnapshotUnsupported,
        ErrorCode::RateLimited,
        ErrorCode::SandboxCertificatePending,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::SandboxRequestInvalid => "sandbox_request_invalid",
            ErrorCode::TokenInvalid => "token_invalid",
            ErrorCode::TokenScopeForbidden => "token_scope_forbidden",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::SandboxNotFound => "sandbox_not_found",
            ErrorCode::SandboxNotRunning => "sandbox_not_running",
            ErrorCode::SandboxPauseUnavailable => "sandbox_pause_unavailable",
            ErrorCode::SandboxCommandCancelled => "sandbox_command_cancelled",
            ErrorCode::SandboxCommandLimit => "sandbox_command_limit",
            ErrorCode::SandboxTokenLimit => "sandbox_token_limit",
            ErrorCode::SandboxEnded => "sandbox_ended",
            ErrorCode::SandboxOutputErased => "sandbox_output_erased",
            ErrorCode::PreflightArchitecture => "preflight_architecture",
            ErrorCode::PreflightTooLarge => "preflight_too_large",
            ErrorCode::ImagePreflightPending => "image_preflight_pending",
            ErrorCode::PreflightImageNotFound => "preflight_image_not_found",
            ErrorCode::PreflightRegistryDenied => "preflight_registry_denied",
            ErrorCode::PreflightRegistryUnreachable => "preflight_registry_unreachable",
            ErrorCode::TemplateNotRegistered => "template_not_registered",
            ErrorCode::TemplateRejected => "template_rejected",
            ErrorCode::AttachmentForbidden => "sandbox_attachment_forbidden",
            ErrorCode::SandboxLiveSnapshotUnsupported => "sandbox_live_snapshot_unsupported",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::SandboxCertificatePending => "sandbox_certificate_pending",
        }
    }

    /// The HTTP status the gateway answers with (ARCHITECTURE §5).
    pub const fn http_status(self) -> u16 {
        match self {
            ErrorCode::BadRequest | ErrorCode::SandboxRequestInvalid => 400,
            ErrorCode::TokenInvalid => 401,
            ErrorCode::TokenScopeForbidden | ErrorCode::Forbidden | ErrorCode::AttachmentForbidden => 403,
            ErrorCode::SandboxNotFound => 404,
            ErrorCode::SandboxNotRunning
            | ErrorCode::SandboxPauseUnavailable
            | ErrorCode::SandboxCommandCancelled
            | ErrorCode::SandboxCommandLimit
            | ErrorCode::SandboxTokenLimit
            | ErrorCode::SandboxEnded
            | ErrorCode::ImagePreflightPending
            | ErrorCode::SandboxCertificatePending => 409,
            ErrorCode::SandboxOutputErased => 410,
            ErrorCode::PreflightArchitecture
            | ErrorCode::PreflightTooLarge
            | ErrorCode::PreflightImageNotFound
            | ErrorCode::PreflightRegistryDenied
            | ErrorCode::PreflightRegistryUnreachable
            | ErrorCode::TemplateNotRegistered
            | ErrorCode::TemplateRejected => 422,
            ErrorCode::RateLimited => 429,
            ErrorCode::SandboxLiveSnapshotUnsupported => 501,
        }
    }

    /// The code named `text` (e.g. the code a status records).
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == text)
    }

    /// `"<code>: <message>"`, the shape every refusal message takes.
    pub fn message(self, text: &str) -> String {
        format!("{}: {text}", self.as_str())
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct_snake_case() {
        let mut seen = std::collections::HashSet::new();
        for c in ErrorCode::ALL {
            assert!(seen.insert(c.as_str()), "duplicate {c}");
            assert!(c.as_str().chars().all(|ch| ch.is_ascii_lowercase() || ch == '_'));
        }
    }

    #[test]
    fn statuses_follow_the_contract_table() {
        assert_eq!(ErrorCode::TokenInvalid.http_status(), 401);
        assert_eq!(ErrorCode::SandboxOutputErased.http_status(), 410);
        assert_eq!(ErrorCode::ImagePreflightPending.http_status(), 409);
        assert_eq!(ErrorCode::PreflightTooLarge.http_status(), 422);
        assert_eq!(ErrorCode::SandboxLiveSnapshotUnsupported.http_status(), 501);
        assert_eq!(ErrorCode::SandboxPauseUnavailable.message("x"), "sandbox_pause_unavailable: x");
    }
}

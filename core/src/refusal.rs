//! A refusal of the contract: its error code and why.

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

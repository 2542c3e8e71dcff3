//! Tenants: a session attaches only Secrets of its own tenant (labelled
//! `hangar.dev/tenant=<tenant>` in its namespace). A Secret that does not
//! exist and one of another tenant get the same answer, so a session's
//! author cannot learn which Secrets exist.

use hangar_crds::{Attachment, ErrorCode};

use crate::refusal::Refusal;

/// What admission found of an attachment's Secret.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecretFound<'a> {
    Absent,
    /// It exists; its `hangar.dev/tenant` label, if any.
    Labelled(Option<&'a str>),
}

/// Whether a session of `tenant` may attach `attachment`'s Secret.
pub fn may_attach(tenant: Option<&str>, attachment: &Attachment, found: SecretFound<'_>) -> Result<(), Refusal> {
    let Some(tenant) = tenant else {
        return Err(Refusal::new(
            ErrorCode::AttachmentForbidden,
            "a session without a tenant attaches no secrets: set spec.tenant",
        ));
    };
    match found {
        SecretFound::Labelled(Some(label)) if label == tenant => Ok(()),
        _ => Err(Refusal::new(
            ErrorCode::AttachmentForbidden,
            format!(
                "{} is not a secret of tenant {tenant} in this namespace (label it hangar.dev/tenant={tenant})",
                attachment.secret_name
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_tenants_own_secrets_attach_and_absence_looks_the_same() {
        let a = Attachment { secret_name: "db".into(), destination: "/run/db".into(), companions: vec![] };
        assert!(may_attach(Some("acme"), &a, SecretFound::Labelled(Some("acme"))).is_ok());
        let other = may_attach(Some("acme"), &a, SecretFound::Labelled(Some("globex"))).unwrap_err();
        let unlabelled = may_attach(Some("acme"), &a, SecretFound::Labelled(None)).unwrap_err();
        let absent = may_attach(Some("acme"), &a, SecretFound::Absent).unwrap_err();
        assert_eq!(other, absent);
        assert_eq!(unlabelled, absent);
        assert_eq!(absent.code, ErrorCode::AttachmentForbidden);
        assert!(may_attach(None, &a, SecretFound::Labelled(Some("acme"))).is_err());
    }
}

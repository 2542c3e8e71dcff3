//! Templates: what a release signs, and whether a session may start from a
//! template. The signature itself is checked with the platform's trusted
//! keys (`hangar_keys::template_signing`); the operator, the webhook and
//! the gateway all decide with these functions.
//!
//! A template is usable by a session when its signature verifies under the
//! key it names, and it is shared (no `owner`) or owned by the session's
//! namespace (the organisation). Another owner's template is answered like
//! one that does not exist, so a namespace cannot learn what others have.

use hangar_crds::{ErrorCode, SandboxTemplate, SandboxTemplateSpec};

use crate::refusal::Refusal;

/// What a release signs: its name, version and manifest, one field a line,
/// in this order, after a fixed first line. The values cannot hold a line
/// break (the schema's patterns), and one that does is refused rather
/// than signed, so two templates never share a payload.
pub fn signing_payload(spec: &SandboxTemplateSpec) -> Result<Vec<u8>, Refusal> {
    let m = &spec.manifest;
    let allow = m.build_network_policy.allow.join(",");
    let fields = [
        ("name", spec.name.as_str()),
        ("version", spec.version.as_str()),
        ("image", m.image.as_str()),
        ("sbom", m.sbom_digest.as_str()),
        ("allow", allow.as_str()),
    ];
    let mut out = String::from("hangar-template-release-v1\n");
    for (key, value) in fields {
        if value.chars().any(char::is_control) {
            return Err(Refusal::new(ErrorCode::SandboxRequestInvalid, format!("{key} holds a control character")));
        }
        out.push_str(&format!("{key}={value}\n"));
    }
    Ok(out.into_bytes())
}

/// Whether `spec`'s release signature checks out, with `check(signed_by,
/// payload, signature)` (the platform's trusted keys); `Err` says why not,
/// to follow "its signature …".
pub fn verify<E: std::fmt::Display>(
    spec: &SandboxTemplateSpec,
    check: impl Fn(&str, &[u8], &str) -> Result<(), E>,
) -> Result<(), String> {
    let payload = signing_payload(spec).map_err(|r| r.text)?;
    check(&spec.signed_by, &payload, &spec.signature).map_err(|e| e.to_string())
}

/// Whether sessions in `namespace` may see `template` at all.
pub fn visible_to(template: &SandboxTemplate, namespace: &str) -> bool {
    template.spec.owner.as_deref().is_none_or(|o| o == namespace)
}

/// The template `reference` (`name@version`) names for a session in
/// `namespace`, among `templates`: refused `template_not_registered` when
/// none is visible, `template_rejected` (with why) when its signature does
/// not verify (`verify` says why not).
pub fn resolve<'a>(
    templates: impl IntoIterator<Item = &'a SandboxTemplate>,
    reference: &str,
    namespace: &str,
    verify: impl Fn(&SandboxTemplateSpec) -> Result<(), String>,
) -> Result<&'a SandboxTemplate, Refusal> {
    let not_registered =
        || Refusal::new(ErrorCode::TemplateNotRegistered, format!("{reference} is not a registered template here"));
    let (name, version) = reference.split_once('@').ok_or_else(not_registered)?;
    let template = templates
        .into_iter()
        .find(|t| t.spec.name == name && t.spec.version == version && visible_to(t, namespace))
        .ok_or_else(not_registered)?;
    verify(&template.spec).map_err(|why| {
        Refusal::new(ErrorCode::TemplateRejected, format!("{reference} is not usable: its signature {why}"))
    })?;
    Ok(template)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn template(name: &str, version: &str, owner: Option<&str>) -> SandboxTemplate {
        serde_json::from_value(json!({
            "apiVersion": "hangar.dev/v1alpha1", "kind": "SandboxTemplate",
            "metadata": {"name": format!("{name}-{version}")},
            "spec": {"name": name, "version": version, "owner": owner, "signature": "c2ln", "signedBy": "k",
                     "manifest": {"image": "r/i@sha256:aa", "sbomDigest": "sha256:bb",
                                  "buildNetworkPolicy": {"allow": ["pypi.org", "files.pythonhosted.org"]}}},
        }))
        .unwrap()
    }

    #[test]
    fn the_payload_names_every_signed_field_once_in_order() {
        let t = template("python-dev", "1.2", None);
        let text = String::from_utf8(signing_payload(&t.spec).unwrap()).unwrap();
        assert_eq!(
            text,
            "hangar-template-release-v1\nname=python-dev\nversion=1.2\nimage=r/i@sha256:aa\nsbom=sha256:bb\nallow=pypi.org,files.pythonhosted.org\n"
        );
        // Any change to a signed field changes the payload.
        let mut other = t.spec.clone();
        other.manifest.build_network_policy.allow.push("evil.example".into());
        assert_ne!(signing_payload(&other).unwrap(), signing_payload(&t.spec).unwrap());
        other = t.spec.clone();
        other.version = "1.2\nimage=x".into();
        assert!(signing_payload(&other).is_err(), "a line break cannot forge another field");
    }

    #[test]
    fn a_session_resolves_only_visible_verified_templates() {
        let shared = template("py", "1", None);
        let mine = template("py", "2", Some("team-a"));
        let all = [shared.clone(), mine.clone()];
        let ok = |_: &SandboxTemplateSpec| Ok(());
        assert_eq!(resolve(&all, "py@1", "team-b", ok).unwrap().spec.version, "1");
        assert_eq!(resolve(&all, "py@2", "team-a", ok).unwrap().spec.version, "2");
        // Another owner's template is answered as absent.
        let other = resolve(&all, "py@2", "team-b", ok).unwrap_err();
        let absent = resolve(&all, "py@9", "team-b", ok).unwrap_err();
        assert_eq!(other.code, ErrorCode::TemplateNotRegistered);
        assert_eq!(other.text.replace("py@2", "X"), absent.text.replace("py@9", "X"));
        let bad = resolve(&all, "py@1", "team-a", |_: &SandboxTemplateSpec| Err("does not verify".into())).unwrap_err();
        assert_eq!(bad.code, ErrorCode::TemplateRejected);
        assert!(resolve(&all, "no-at-sign", "team-a", ok).is_err());
    }
}

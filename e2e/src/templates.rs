//! Template release keys for the local stack: a signing key made fresh for
//! each test process (its public key trusted by the stack's operator and
//! webhook), and the public key the examples were signed with
//! (`hangar-template sign`; its signing key is not kept in the repo).

use std::sync::OnceLock;

use hangar_crds::SandboxTemplate;
use hangar_keys::template_signing;
use serde_json::{Value, json};

/// The name the examples' key is trusted under, and its public key.
pub const EXAMPLES_KEY_NAME: &str = "hangar-examples";
pub const EXAMPLES_PUBLIC_KEY: &str = "r7UOSoy/zvxvq2+SHgqSfBK+pbC5gcWPHG4HzOSzwdA=";

/// The name the tests' key is trusted under.
pub const TEST_KEY_NAME: &str = "hangar-test-release";

fn test_key() -> &'static (String, String) {
    static KEY: OnceLock<(String, String)> = OnceLock::new();
    KEY.get_or_init(|| {
        let (secret, public) = template_signing::generate().expect("a test signing key");
        (secret.to_string(), public)
    })
}

/// The tests' signing key (base64 PKCS#8), for `hangar-template sign`.
pub fn test_signing_key() -> &'static str {
    &test_key().0
}

/// `HANGAR_TEMPLATE_KEYS` for the operator and the webhook.
pub fn trusted_keys_env() -> String {
    format!("{TEST_KEY_NAME}={},{EXAMPLES_KEY_NAME}={EXAMPLES_PUBLIC_KEY}", test_key().1)
}

/// A SandboxTemplate `name@version` of `image`, shared (`owner: None`) or a
/// namespace's own; unsigned until `sign`ed.
pub fn template(name: &str, version: &str, image: &str, owner: Option<&str>) -> SandboxTemplate {
    let spec: Value = json!({
        "name": name, "version": version, "owner": owner,
        "signature": "unsigned", "signedBy": TEST_KEY_NAME,
        "manifest": {"image": image, "sbomDigest": format!("sha256:{}", "5b".repeat(32)),
                     "buildNetworkPolicy": {"allow": ["pypi.org"]}},
    });
    serde_json::from_value(json!({
        "apiVersion": "hangar.dev/v1alpha1", "kind": "SandboxTemplate",
        "metadata": {"name": format!("{name}-{}", version.replace('.', "-"))},
        "spec": spec,
    }))
    .expect("template manifest")
}

/// Signs `t` with the tests' trusted key.
pub fn sign(mut t: SandboxTemplate) -> SandboxTemplate {
    t.spec.signed_by = TEST_KEY_NAME.into();
    let payload = hangar_core::templates::signing_payload(&t.spec).expect("payload");
    t.spec.signature = template_signing::sign(&test_key().0, &payload).expect("sign");
    t
}

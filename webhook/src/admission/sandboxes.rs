//! Sandbox creates: a session that names a template may start only from
//! one registered for its namespace whose release signature verifies
//! under the platform's trusted keys (`hangar_core::templates`, the same
//! decision the operator makes again at launch).

use hangar_core::refusal::Refusal;
use hangar_core::templates;
use hangar_crds::{ErrorCode, Sandbox, SandboxTemplate};
use hangar_keys::template_signing::TrustedKeys;
use kube::api::{Api, ListParams};
use kube::runtime::reflector::Store;

use super::AdmissionError;
use super::caches::Caches;

pub struct SandboxAdmission {
    client: kube::Client,
    templates: Store<SandboxTemplate>,
    keys: TrustedKeys,
}

impl SandboxAdmission {
    pub fn new(client: kube::Client, caches: &Caches, keys: TrustedKeys) -> Self {
        Self { client, templates: caches.templates.clone(), keys }
    }

    /// `Some(refusal)` when the Sandbox may not be created in `namespace`.
    /// Decided on the watch cache; a template the cache does not show yet
    /// (created a moment ago, as `kubectl apply -f examples/` does) is
    /// looked for in the apiserver before the answer is no.
    pub async fn create(&self, namespace: &str, sandbox: &Sandbox) -> Result<Option<Refusal>, AdmissionError> {
        let Some(reference) = sandbox.spec.template.as_deref() else { return Ok(None) };
        let cached = self.templates.state();
        let refusal = self.decide(cached.iter().map(|t| t.as_ref()), reference, namespace);
        if refusal.as_ref().is_none_or(|r| r.code != ErrorCode::TemplateNotRegistered) {
            return Ok(refusal);
        }
        let listed = Api::<SandboxTemplate>::all(self.client.clone()).list(&ListParams::default()).await?.items;
        Ok(self.decide(listed.iter(), reference, namespace))
    }

    fn decide<'a>(
        &self,
        known: impl IntoIterator<Item = &'a SandboxTemplate>,
        reference: &str,
        namespace: &str,
    ) -> Option<Refusal> {
        templates::resolve(known, reference, namespace, |spec| {
            templates::verify(spec, |key, payload, signature| self.keys.verify(key, payload, signature))
        })
        .err()
    }
}

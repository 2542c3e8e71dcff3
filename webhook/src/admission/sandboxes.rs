//! Sandbox creates: a session that names a template may start only from
//! one registered for its namespace whose release signature verifies
//! under the platform's trusted keys (`hangar_core::templates`, the same
//! decision the operator makes again at launch); and it attaches only
//! Secrets of its own tenant (`hangar_core::tenants`), read as metadata
//! only (labels; never a value).

use hangar_core::refusal::Refusal;
use hangar_core::templates;
use hangar_core::tenants::{self, SecretFound};
use hangar_crds::{ErrorCode, Sandbox, SandboxTemplate, TENANT_LABEL};
use hangar_keys::template_signing::TrustedKeys;
use k8s_openapi::api::core::v1::Secret;
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
        if let Some(refusal) = self.attachments(namespace, sandbox).await? {
            return Ok(Some(refusal));
        }
        let Some(reference) = sandbox.spec.template.as_deref() else { return Ok(None) };
        let cached = self.templates.state();
        let refusal = self.decide(cached.iter().map(|t| t.as_ref()), reference, namespace);
        if refusal.as_ref().is_none_or(|r| r.code != ErrorCode::TemplateNotRegistered) {
            return Ok(refusal);
        }
        let listed = Api::<SandboxTemplate>::all(self.client.clone()).list(&ListParams::default()).await?.items;
        Ok(self.decide(listed.iter(), reference, namespace))
    }

    /// The first attachment whose Secret is not the session's tenant's.
    async fn attachments(&self, namespace: &str, sandbox: &Sandbox) -> Result<Option<Refusal>, AdmissionError> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        for a in &sandbox.spec.attachments {
            let meta = secrets.get_metadata_opt(&a.secret_name).await?;
            let label = meta.as_ref().map(|m| m.metadata.labels.as_ref().and_then(|l| l.get(TENANT_LABEL)));
            let found = match &label {
                None => SecretFound::Absent,
                Some(l) => SecretFound::Labelled(l.map(String::as_str)),
            };
            if let Err(refusal) = tenants::may_attach(sandbox.spec.tenant.as_deref(), a, found) {
                return Ok(Some(refusal));
            }
        }
        Ok(None)
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

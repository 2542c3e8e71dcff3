//! Admission of a new SessionToken: its session exists and has not ended,
//! it has room (at most 32 active tokens per session), and its public key
//! is a P-256 point (a key that can never verify a proof is refused now,
//! not at first use). The operator holds the limit again when it issues a
//! token, in creation order, so two creates racing past this check cannot
//! make a 33rd active token.

use hangar_crds::{ErrorCode, SessionToken};
use hangar_keys::proof::{PublicKey, key_is_valid};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;

use super::caches::Caches;
use super::{AdmissionError, Refusal};

pub struct TokenAdmission {
    client: kube::Client,
    caches: Caches,
}

impl TokenAdmission {
    pub fn new(client: kube::Client, caches: &Caches) -> Self {
        Self { client, caches: caches.clone() }
    }

    pub async fn create(&self, namespace: &str, token: &SessionToken) -> Result<Option<Refusal>, AdmissionError> {
        let k = &token.spec.public_key;
        if !key_is_valid(PublicKey { kty: &k.kty, crv: &k.crv, x: &k.x, y: &k.y }) {
            return Ok(Some(Refusal::new(
                ErrorCode::SandboxRequestInvalid,
                "publicKey must be a P-256 public key (a point on the curve)",
            )));
        }
        let name = &token.spec.sandbox;
        // The session's state must be current: a token for a session that
        // just ended is refused.
        let session = Api::<hangar_crds::Sandbox>::namespaced(self.client.clone(), namespace).get_opt(name).await?;
        let ns = Some(namespace.to_owned());
        let tokens: Vec<_> = self
            .caches
            .tokens
            .state()
            .into_iter()
            .filter(|t| t.metadata.namespace == ns && &t.spec.sandbox == name)
            .collect();
        let uid = token.uid();
        let decided = hangar_core::tokens::token_create(
            namespace,
            name,
            session.as_ref(),
            tokens.iter().map(|t| t.as_ref()),
            uid.as_deref(),
            Timestamp::now(),
        );
        Ok(decided.err())
    }
}

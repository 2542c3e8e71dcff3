//! The last reset step: the session certificate is built
//! (`hangar_core::session::certificate`), signed with the platform's
//! certificate key (`hangar_keys::session_certificate`), stored in the
//! output store next to the session's output, and recorded in
//! `status.certificate`.
//!
//! The key is read from a Secret in the operator's namespace at each
//! signing, so a rotated key (a new `key-id` and `signing-key`) is used
//! from the next certificate on without a restart. Every key's public half
//! is published by id in a ConfigMap that only grows
//! (`hangar_crds::CERTIFICATE_KEYS_CONFIGMAP`), so a certificate signed
//! before a rotation still finds its key. Absent, the Secret is made once with a new key
//! (create-if-absent: replicas agree on one).

use std::collections::BTreeMap;

use hangar_core::session::certificate::{self, Signing};
use hangar_crds::{Certificate, Command, SandboxStatus};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use zeroize::Zeroizing;

use crate::context::Context;
use crate::error::Result;
use crate::lifecycle::actions::Session;

/// The Secret's fields: the key's id, its PKCS#8 document (base64 text),
/// and its public key (base64, to hand to verifiers).
pub const KEY_ID: &str = "key-id";
pub const SIGNING_KEY: &str = "signing-key";
pub const PUBLIC_KEY: &str = "public-key";

/// Why no certificate could be signed (the reset waits, `reset_incomplete`
/// saying this).
#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    #[error("Secret {secret} has no usable {field}")]
    KeySecret { secret: String, field: &'static str },
    #[error("signing: {0}")]
    Signing(#[from] hangar_keys::template_signing::SigningError),
    #[error("key id {0} is already published with another public key: give the new key a new id")]
    KeyIdReused(String),
    #[error("encoding: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("output store: {0}")]
    Store(#[from] hangar_output::StoreError),
}

struct SigningKey {
    id: String,
    pkcs8: Zeroizing<String>,
}

async fn signing_key(ctx: &Context) -> Result<SigningKey> {
    let name = &ctx.settings.certificate_signing_secret;
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ctx.settings.system_namespace);
    let secret = match secrets.get_opt(name).await? {
        Some(s) => s,
        None => {
            let (pkcs8, public) = hangar_keys::template_signing::generate().map_err(CertificateError::Signing)?;
            let id = format!("hangar-{}", &hangar_keys::session_certificate::digest(public.as_bytes())[7..19]);
            let secret = Secret {
                metadata: ObjectMeta { name: Some(name.clone()), ..Default::default() },
                data: Some(BTreeMap::from([
                    (KEY_ID.to_owned(), ByteString(id.clone().into_bytes())),
                    (SIGNING_KEY.to_owned(), ByteString(pkcs8.as_bytes().to_vec())),
                    (PUBLIC_KEY.to_owned(), ByteString(public.clone().into_bytes())),
                ])),
                ..Default::default()
            };
            if hangar_runtime::kube_ext::ignore_already_exists(secrets.create(&PostParams::default(), &secret).await)?
                .is_some()
            {
                tracing::info!(secret = %name, key_id = %id, public_key = %public, "made the certificate signing key");
            }
            secrets.get(name).await?
        }
    };
    let field = |f: &'static str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(f))
            .and_then(|b| String::from_utf8(b.0.clone()).ok())
            .filter(|v| !v.trim().is_empty())
            .ok_or_else(|| CertificateError::KeySecret { secret: name.clone(), field: f })
    };
    let key = SigningKey { id: field(KEY_ID)?.trim().to_owned(), pkcs8: Zeroizing::new(field(SIGNING_KEY)?) };
    publish(ctx, &key).await?;
    Ok(key)
}

/// Adds the key's public half (derived from the signing key itself, not
/// read from the Secret) to the published set, before anything is signed
/// with it; entries are never removed.
async fn publish(ctx: &Context, key: &SigningKey) -> Result<()> {
    let public = hangar_keys::template_signing::public_key(&key.pkcs8).map_err(CertificateError::Signing)?;
    let maps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ctx.settings.system_namespace);
    let name = hangar_crds::CERTIFICATE_KEYS_CONFIGMAP;
    let published = maps.get_opt(name).await?;
    match published.as_ref().and_then(|m| m.data.as_ref()).and_then(|d| d.get(&key.id)) {
        Some(p) if *p == public => return Ok(()),
        Some(_) => return Err(CertificateError::KeyIdReused(key.id.clone()).into()),
        None => {}
    }
    let patch = serde_json::json!({"data": {key.id.as_str(): public}});
    if published.is_none() {
        let map =
            ConfigMap { metadata: ObjectMeta { name: Some(name.into()), ..Default::default() }, ..Default::default() };
        hangar_runtime::kube_ext::ignore_already_exists(maps.create(&PostParams::default(), &map).await)?;
    }
    maps.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    tracing::info!(key_id = %key.id, "published the certificate signing key's public key");
    Ok(())
}

/// Builds, signs and stores the certificate of a session whose every other
/// reset step is confirmed, and records it in `status`. Run again after a
/// crash it stores a fresh one in the same place: nothing pointed at the
/// first yet.
pub async fn sign(ctx: &Context, s: &Session<'_>, status: &mut SandboxStatus) -> Result<()> {
    let key = signing_key(ctx).await?;
    let commands: Api<Command> = Api::namespaced(ctx.client.clone(), s.namespace);
    let list = commands.list(&ListParams::default().fields(&format!("spec.sandbox={}", s.name))).await?;
    let signed_at = Timestamp::now();
    let signing = Signing { signed_at, retention_day_seconds: ctx.settings.retention_day_seconds };
    let record = certificate::build(s.sandbox, status, &list.items, signing);
    let value = serde_json::to_value(&record).map_err(CertificateError::Encode)?;
    let file =
        hangar_keys::session_certificate::sign(&value, &key.pkcs8, &key.id).map_err(CertificateError::Signing)?;
    let digest = hangar_keys::session_certificate::digest(&file);
    let record_ref = ctx.output_store.put_certificate(s.session_id, file).await.map_err(CertificateError::Store)?;
    status.certificate = Some(Certificate {
        signed_at: Some(Time(signed_at)),
        record_ref: Some(record_ref),
        digest: Some(digest),
        key_id: Some(key.id.clone()),
    });
    tracing::info!(key_id = %key.id, jobs = record.jobs.len(), "signed the session certificate");
    Ok(())
}

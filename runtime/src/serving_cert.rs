//! A serving certificate a server makes and rotates itself (the admission
//! webhook), or reloads when files it is given change (cert-manager).
//!
//! Made: a new CA and a certificate it signs for the service's names, kept
//! in a Secret (`tls.crt`, `tls.key`, `ca.crt`, the trusted `ca-bundle.crt`
//! and `not-after`); the CA's key is thrown away at once, so nothing can
//! sign another certificate under it. Replicas share the Secret: whoever
//! writes it first wins (compare-and-swap), the others take theirs.
//!
//! Trusted: the bundle (the current CA and, until it expires, the previous
//! one) is written into each named ValidatingWebhookConfiguration's
//! `caBundle`, and always before the Secret that uses the new CA: the
//! apiserver trusts a certificate before any replica serves it, and still
//! trusts the old one while replicas switch.
//!
//! Rotated: `renew_before` the certificate expires, by whichever replica
//! sees it first; every replica re-reads the Secret on each check and
//! serves what it holds, without a restart.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("making a certificate: {0}")]
    Make(#[from] rcgen::Error),
    #[error("the certificate: {0}")]
    Pem(String),
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// What to make, where to keep it and whom to tell.
#[derive(Clone, Debug)]
pub struct SelfManaged {
    pub namespace: String,
    pub secret: String,
    /// DNS names (and IP addresses) the certificate is for.
    pub names: Vec<String>,
    pub validity: Duration,
    pub renew_before: Duration,
    /// ValidatingWebhookConfigurations whose `caBundle` is kept current.
    pub webhook_configurations: Vec<String>,
    /// How often the Secret and the configurations are checked.
    pub check_every: Duration,
}

/// The certificate the server presents, swapped in place on rotation.
#[derive(Debug)]
pub struct Resolver {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().unwrap_or_else(|p| p.into_inner()).clone())
    }
}

impl Resolver {
    fn set(&self, key: Arc<CertifiedKey>) {
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = key;
    }

    /// The end-entity certificate served now (DER).
    pub fn serving(&self) -> Vec<u8> {
        self.current.read().unwrap_or_else(|p| p.into_inner()).cert[0].to_vec()
    }
}

fn certified(cert_pem: &[u8], key_pem: &[u8]) -> Result<Arc<CertifiedKey>, CertError> {
    let certs = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CertError::Pem(e.to_string()))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| CertError::Pem(e.to_string()))?;
    let provider =
        CryptoProvider::get_default().cloned().unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
    Ok(Arc::new(CertifiedKey::from_der(certs, key, &provider)?))
}

/// A fresh CA and a certificate it signs: (cert, key, CA cert), PEM.
pub fn issue(names: &[String], validity: Duration) -> Result<(String, String, String), CertError> {
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
        KeyUsagePurpose,
    };
    let now = time::OffsetDateTime::now_utc();
    // A minute of slack for clocks a little behind.
    let (from, until) = (now - time::Duration::minutes(1), now + time::Duration::seconds(validity.as_secs() as i64));
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.distinguished_name.push(DnType::CommonName, "hangar-webhook-ca");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    (ca.not_before, ca.not_after) = (from, until);
    let issuer = CertifiedIssuer::self_signed(ca, KeyPair::generate()?)?;
    let mut leaf = CertificateParams::new(names.to_vec())?;
    leaf.distinguished_name.push(DnType::CommonName, names.first().cloned().unwrap_or_default());
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    (leaf.not_before, leaf.not_after) = (from, until);
    let key = KeyPair::generate()?;
    let cert = leaf.signed_by(&key, &issuer)?;
    // The CA's key goes out of scope here and is never kept.
    Ok((cert.pem(), key.serialize_pem(), issuer.pem()))
}

fn unix(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

fn field<'a>(s: &'a Secret, key: &str) -> Option<&'a [u8]> {
    s.data.as_ref().and_then(|d| d.get(key)).map(|b| b.0.as_slice())
}

/// Whether the stored certificate must be replaced at `now`.
pub fn due(not_after: Option<i64>, renew_before: Duration, now: i64) -> bool {
    not_after.is_none_or(|at| at - renew_before.as_secs() as i64 <= now)
}

/// The CAs to trust: the new one, and the previous one while it is valid.
pub fn bundle(new_ca: &str, previous: Option<(&str, i64)>, now: i64) -> String {
    match previous {
        Some((ca, not_after)) if not_after > now && ca != new_ca => format!("{new_ca}{ca}"),
        _ => new_ca.to_owned(),
    }
}

/// Starts the self-managed certificate: returns once one is served and
/// trusted, and keeps it current in the background.
pub async fn start_self_managed(client: kube::Client, spec: SelfManaged) -> Result<Arc<Resolver>, CertError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &spec.namespace);
    let configs: Api<ValidatingWebhookConfiguration> = Api::all(client);
    let key = check(&secrets, &configs, &spec).await?;
    let resolver = Arc::new(Resolver { current: RwLock::new(key) });
    let r = resolver.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(spec.check_every).await;
            match check(&secrets, &configs, &spec).await {
                Ok(key) => r.set(key),
                Err(e) => {
                    tracing::warn!(error = %e, "could not check the serving certificate; serving the current one")
                }
            }
        }
    });
    Ok(resolver)
}

/// One check: rotate if due, publish the bundle, return what to serve.
async fn check(
    secrets: &Api<Secret>,
    configs: &Api<ValidatingWebhookConfiguration>,
    spec: &SelfManaged,
) -> Result<Arc<CertifiedKey>, CertError> {
    loop {
        let now = unix(SystemTime::now());
        let stored = secrets.get_opt(&spec.secret).await?;
        let not_after = stored
            .as_ref()
            .and_then(|s| field(s, "not-after"))
            .and_then(|b| std::str::from_utf8(b).ok()?.parse::<i64>().ok());
        if let Some(s) = stored.as_ref().filter(|_| !due(not_after, spec.renew_before, now)) {
            let (Some(cert), Some(key), Some(ca_bundle)) =
                (field(s, "tls.crt"), field(s, "tls.key"), field(s, "ca-bundle.crt"))
            else {
                return Err(CertError::Pem(format!("Secret {} lacks tls.crt, tls.key or ca-bundle.crt", spec.secret)));
            };
            publish(configs, spec, ca_bundle).await?;
            return certified(cert, key);
        }
        let (cert, key, ca) = issue(&spec.names, spec.validity)?;
        let previous_ca = stored.as_ref().and_then(|s| field(s, "ca.crt")).and_then(|b| std::str::from_utf8(b).ok());
        let trusted = bundle(&ca, previous_ca.zip(not_after), now);
        // Trusted before it is served.
        publish(configs, spec, trusted.as_bytes()).await?;
        let expires = now + spec.validity.as_secs() as i64;
        let data = [
            ("tls.crt", cert.as_bytes()),
            ("tls.key", key.as_bytes()),
            ("ca.crt", ca.as_bytes()),
            ("ca-bundle.crt", trusted.as_bytes()),
            ("not-after", expires.to_string().as_bytes()),
        ]
        .map(|(k, v)| (k.to_owned(), ByteString(v.to_vec())))
        .into();
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(spec.secret.clone()),
                resource_version: stored.as_ref().and_then(|s| s.metadata.resource_version.clone()),
                labels: Some([("app.kubernetes.io/managed-by".to_owned(), "hangar".to_owned())].into()),
                ..Default::default()
            },
            data: Some(data),
            type_: Some("kubernetes.io/tls".into()),
            ..Default::default()
        };
        let written = match stored {
            None => secrets.create(&PostParams::default(), &secret).await,
            Some(_) => secrets.replace(&spec.secret, &PostParams::default(), &secret).await,
        };
        match written {
            Ok(_) => {
                tracing::info!(secret = %spec.secret, expires_at = expires, "serving certificate made");
                return certified(cert.as_bytes(), key.as_bytes());
            }
            // Another replica wrote first: take theirs (next turn).
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Writes `ca_bundle` into every webhook of the named configurations that
/// does not have it (compare-and-swap on each configuration). A
/// configuration that does not exist yet is skipped: the next check finds it.
async fn publish(
    configs: &Api<ValidatingWebhookConfiguration>,
    spec: &SelfManaged,
    ca_bundle: &[u8],
) -> Result<(), CertError> {
    for name in &spec.webhook_configurations {
        for _ in 0..10 {
            let Some(mut config) = configs.get_opt(name).await? else {
                break;
            };
            let hooks = config.webhooks.get_or_insert_with(Vec::new);
            let stale =
                hooks.iter().any(|w| w.client_config.ca_bundle.as_ref().map(|b| b.0.as_slice()) != Some(ca_bundle));
            if !stale {
                break;
            }
            for w in hooks.iter_mut() {
                w.client_config.ca_bundle = Some(ByteString(ca_bundle.to_vec()));
            }
            match configs.replace(name, &PostParams::default(), &config).await {
                Ok(_) => {
                    tracing::info!(configuration = %name, "trusted CA bundle published");
                    break;
                }
                Err(kube::Error::Api(e)) if e.code == 409 => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(())
}

/// A certificate made now and kept only in memory (a new CA each start,
/// its key thrown away): for a server whose clients skip verification and
/// rely on their bearer token, as metrics scrapers do.
pub fn self_signed(names: &[String]) -> Result<Arc<Resolver>, CertError> {
    let (cert, key, _ca) = issue(names, Duration::from_secs(365 * 86400))?;
    Ok(Arc::new(Resolver { current: RwLock::new(certified(cert.as_bytes(), key.as_bytes())?) }))
}

/// A certificate from files (cert-manager's Secret, mounted), reloaded when
/// they change.
pub fn start_from_files(cert: PathBuf, key: PathBuf, check_every: Duration) -> Result<Arc<Resolver>, CertError> {
    let read =
        |p: &PathBuf| std::fs::read(p).map_err(|source| CertError::Read { path: p.display().to_string(), source });
    let load = move |cert: &PathBuf, key: &PathBuf| -> Result<(Vec<u8>, Arc<CertifiedKey>), CertError> {
        let (c, k) = (read(cert)?, read(key)?);
        let certified = certified(&c, &k)?;
        Ok((c, certified))
    };
    let (mut last, first) = load(&cert, &key)?;
    let resolver = Arc::new(Resolver { current: RwLock::new(first) });
    let r = resolver.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(check_every).await;
            match load(&cert, &key) {
                Ok((bytes, certified)) if bytes != last => {
                    tracing::info!(path = %cert.display(), "serving certificate reloaded");
                    r.set(certified);
                    last = bytes;
                }
                Ok(_) => {}
                // Half-written during a rotation: the next check reads it whole.
                Err(e) => tracing::warn!(error = %e, "could not reload the serving certificate"),
            }
        }
    });
    Ok(resolver)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::client::danger::ServerCertVerifier;

    #[test]
    fn renewed_before_expiry_and_the_old_ca_trusted_meanwhile() {
        let before = Duration::from_secs(100);
        assert!(due(None, before, 0), "none yet");
        assert!(!due(Some(1000), before, 899));
        assert!(due(Some(1000), before, 900));
        assert_eq!(bundle("NEW\n", Some(("OLD\n", 1000)), 950), "NEW\nOLD\n");
        assert_eq!(bundle("NEW\n", Some(("OLD\n", 1000)), 1000), "NEW\n", "an expired CA is dropped");
        assert_eq!(bundle("NEW\n", None, 0), "NEW\n");
    }

    #[test]
    fn an_issued_certificate_is_for_its_names_and_verifies_under_its_ca() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let names = vec!["hangar-webhook.hangar-system.svc".to_owned(), "127.0.0.1".to_owned()];
        let (cert, key, ca) = issue(&names, Duration::from_secs(3600)).unwrap();
        let certified = certified(cert.as_bytes(), key.as_bytes()).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(ca.as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
        let verifier = rustls::client::WebPkiServerVerifier::builder(Arc::new(roots)).build().unwrap();
        for name in ["hangar-webhook.hangar-system.svc", "127.0.0.1"] {
            let server = rustls::pki_types::ServerName::try_from(name.to_owned()).unwrap();
            let now = rustls::pki_types::UnixTime::now();
            verifier.verify_server_cert(&certified.cert[0], &[], &server, &[], now).unwrap();
        }
        let other = rustls::pki_types::ServerName::try_from("evil.example".to_owned()).unwrap();
        let now = rustls::pki_types::UnixTime::now();
        assert!(verifier.verify_server_cert(&certified.cert[0], &[], &other, &[], now).is_err());
    }
}

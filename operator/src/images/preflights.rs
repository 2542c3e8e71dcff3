//! The operator's image preflights: one check per image at a time, run in
//! the background, its result cached by the image (pinned by digest, so
//! the same bytes always get the same answer), and every session waiting
//! on it woken when it is done. A registry that cannot be reached is asked
//! again after a backoff; the session stays `image_preflight_pending`
//! meanwhile, and fails after the preflight timeout.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use hangar_core::images::preflight::Passed;
use hangar_core::refusal::Refusal;
use hangar_core::session::ending::StopReason;
use hangar_core::session::phase_machine::ImageCheck;
use hangar_crds::{CheckedImage, ErrorCode, Sandbox};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use oci_client::secrets::RegistryAuth;
use tokio::sync::mpsc;

use super::registry::{Registries, Unreachable};

/// Results kept at most; past it the oldest half goes (a cache, not a
/// record: a forgotten image is simply read again).
const MAX_CACHED: usize = 10_000;
const RETRY_FIRST: Duration = Duration::from_secs(2);
const RETRY_MAX: Duration = Duration::from_secs(30);

enum Entry {
    InFlight {
        waiters: Vec<ObjectRef<Sandbox>>,
    },
    /// Settled by the image's bytes: the same for every session.
    Done {
        result: Result<Passed, Refusal>,
        at: Instant,
    },
    /// The registry refused hangar's credentials: an answer about the
    /// credentials of that moment, so it answers only the sessions that
    /// waited for that check; a later session (after the Secret is fixed)
    /// asks again.
    Denied {
        refusal: Refusal,
        waiters: Vec<ObjectRef<Sandbox>>,
    },
    Unreachable {
        reason: String,
        retry_at: Instant,
        failures: u32,
    },
}

/// What the cache knows about one image.
#[derive(Debug, PartialEq)]
pub enum Lookup {
    Done(Result<Passed, Refusal>),
    Pending(Option<String>),
}

pub struct Preflights {
    registries: Registries,
    entries: Mutex<HashMap<String, Entry>>,
    wake: mpsc::Sender<ObjectRef<Sandbox>>,
    client: kube::Client,
    /// The dockerconfigjson Secret (namespace, name) with registry credentials.
    credentials: Option<(String, String)>,
    checks: prometheus_client::metrics::counter::Counter,
}

impl Preflights {
    pub fn new(
        registries: Registries,
        client: kube::Client,
        credentials: Option<(String, String)>,
        wake: mpsc::Sender<ObjectRef<Sandbox>>,
        checks: prometheus_client::metrics::counter::Counter,
    ) -> Arc<Self> {
        Arc::new(Self { registries, entries: Default::default(), wake, client, credentials, checks })
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What is known of `image` for session `who`.
    pub fn lookup(&self, image: &str, who: &ObjectRef<Sandbox>) -> Lookup {
        match self.entries().get(image) {
            Some(Entry::Done { result, .. }) => Lookup::Done(result.clone()),
            Some(Entry::Denied { refusal, waiters }) if waiters.contains(who) => Lookup::Done(Err(refusal.clone())),
            Some(Entry::Denied { .. }) => Lookup::Pending(None),
            Some(Entry::Unreachable { reason, .. }) => {
                Lookup::Pending(Some(format!("cannot read {image} yet: {reason}")))
            }
            Some(Entry::InFlight { .. }) | None => Lookup::Pending(None),
        }
    }

    /// The session's verdict: every image passed, the first refused, or
    /// pending (refused as unreachable once pending longer than `timeout`).
    pub fn judge(
        &self,
        images: &[String],
        who: &ObjectRef<Sandbox>,
        pending_since: Option<Timestamp>,
        now: Timestamp,
        timeout: Duration,
    ) -> ImageCheck {
        let mut passed = Vec::with_capacity(images.len());
        let mut note = None;
        for image in images {
            match self.lookup(image, who) {
                Lookup::Done(Ok(p)) => passed.push(CheckedImage {
                    image: image.clone(),
                    manifest_digest: p.manifest_digest,
                    compressed_bytes: i64::try_from(p.compressed_bytes).unwrap_or(i64::MAX),
                }),
                Lookup::Done(Err(refusal)) => return ImageCheck::Refused(StopReason::Preflight(refusal)),
                Lookup::Pending(why) => note = note.or(why).or(Some(String::new())),
            }
        }
        let Some(note) = note else { return ImageCheck::Passed(passed) };
        let waited = pending_since.map(|t| now.duration_since(t).unsigned_abs()).unwrap_or_default();
        if !note.is_empty() && waited > timeout {
            return ImageCheck::Refused(StopReason::Preflight(Refusal::new(
                ErrorCode::PreflightRegistryUnreachable,
                format!("{note}; gave up after {} s", timeout.as_secs()),
            )));
        }
        ImageCheck::Pending { note: (!note.is_empty()).then_some(note) }
    }

    /// Starts a check of each image that has none done or under way (or
    /// whose registry's backoff is over); `waiter` is woken when each ends.
    pub fn start(self: &Arc<Self>, images: &[String], waiter: ObjectRef<Sandbox>) {
        let now = Instant::now();
        let mut entries = self.entries();
        for image in images {
            match entries.get_mut(image) {
                Some(Entry::Done { .. }) => continue,
                Some(Entry::InFlight { waiters }) => {
                    if !waiters.contains(&waiter) {
                        waiters.push(waiter.clone());
                    }
                    continue;
                }
                Some(Entry::Unreachable { retry_at, .. }) if *retry_at > now => continue,
                Some(Entry::Denied { waiters, .. }) if waiters.contains(&waiter) => continue,
                _ => {}
            }
            let failures = match entries.get(image) {
                Some(Entry::Unreachable { failures, .. }) => *failures,
                _ => 0,
            };
            entries.insert(image.clone(), Entry::InFlight { waiters: vec![waiter.clone()] });
            let this = self.clone();
            let image = image.clone();
            tokio::spawn(async move { this.check(image, failures).await });
        }
        if entries.len() > MAX_CACHED {
            let mut done: Vec<(Instant, String)> = entries
                .iter()
                .filter_map(|(k, e)| match e {
                    Entry::Done { at, .. } => Some((*at, k.clone())),
                    _ => None,
                })
                .collect();
            done.sort();
            for (_, k) in done.into_iter().take(MAX_CACHED / 2) {
                entries.remove(&k);
            }
        }
    }

    async fn check(self: Arc<Self>, image: String, failures: u32) {
        self.checks.inc();
        let started = Instant::now();
        let result = match self.auth(&image).await {
            Ok(auth) => self.registries.check(&image, &auth).await,
            Err(reason) => Err(Unreachable { image: image.clone(), reason }),
        };
        let entry = match result {
            Ok(Err(refusal)) if refusal.code == ErrorCode::PreflightRegistryDenied => {
                tracing::info!(%image, "image preflight: the registry refused hangar's credentials");
                Entry::Denied { refusal, waiters: vec![] }
            }
            Ok(result) => {
                match &result {
                    Ok(p) => {
                        tracing::info!(%image, bytes = p.compressed_bytes, elapsed_ms = started.elapsed().as_millis() as u64, "image preflight passed")
                    }
                    Err(r) => {
                        tracing::info!(%image, code = %r.code, elapsed_ms = started.elapsed().as_millis() as u64, "image preflight refused")
                    }
                }
                Entry::Done { result, at: Instant::now() }
            }
            Err(e) => {
                let backoff = (RETRY_FIRST * 2u32.saturating_pow(failures.min(5))).min(RETRY_MAX);
                tracing::warn!(%image, reason = %e.reason, ?backoff, "image preflight could not read the image; asking again later");
                Entry::Unreachable { reason: e.reason, retry_at: Instant::now() + backoff, failures: failures + 1 }
            }
        };
        let retry_in = match &entry {
            Entry::Unreachable { retry_at, .. } => Some(retry_at.saturating_duration_since(Instant::now())),
            _ => None,
        };
        let waiters = {
            let mut entries = self.entries();
            let waiters = match entries.remove(&image) {
                Some(Entry::InFlight { waiters }) => waiters,
                _ => vec![],
            };
            let entry = match entry {
                Entry::Denied { refusal, .. } => Entry::Denied { refusal, waiters: waiters.clone() },
                other => other,
            };
            entries.insert(image, entry);
            waiters
        };
        for w in &waiters {
            let _ = self.wake.send(w.clone()).await;
        }
        // An unreachable registry: wake the waiters again when the backoff
        // ends, so they ask again without waiting for their requeue.
        if let Some(delay) = retry_in {
            tokio::time::sleep(delay).await;
            for w in waiters {
                let _ = self.wake.send(w).await;
            }
        }
    }

    /// Credentials for the image's registry from the dockerconfigjson
    /// Secret, read at each check (a rotated Secret is used at once).
    async fn auth(&self, image: &str) -> Result<RegistryAuth, String> {
        let Some((ns, name)) = &self.credentials else { return Ok(RegistryAuth::Anonymous) };
        let Some(host) = Registries::host_of(image) else { return Ok(RegistryAuth::Anonymous) };
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), ns);
        let secret = match secrets.get_opt(name).await {
            Ok(Some(s)) => s,
            Ok(None) => return Ok(RegistryAuth::Anonymous),
            Err(e) => return Err(format!("cannot read the registry credentials Secret {ns}/{name}: {e}")),
        };
        let Some(config) = secret.data.as_ref().and_then(|d| d.get(".dockerconfigjson")) else {
            return Ok(RegistryAuth::Anonymous);
        };
        Ok(auth_for(&config.0, &host).unwrap_or(RegistryAuth::Anonymous))
    }
}

/// The credential a dockerconfigjson holds for `host`.
fn auth_for(dockerconfig: &[u8], host: &str) -> Option<RegistryAuth> {
    #[derive(serde::Deserialize)]
    struct Config {
        auths: HashMap<String, AuthEntry>,
    }
    #[derive(serde::Deserialize)]
    struct AuthEntry {
        #[serde(default)]
        auth: Option<String>,
        #[serde(default)]
        username: Option<String>,
        #[serde(default)]
        password: Option<String>,
    }
    let config: Config = serde_json::from_slice(dockerconfig).ok()?;
    let entry = config
        .auths
        .iter()
        .find(|(k, _)| {
            let k = k.trim_start_matches("https://").trim_start_matches("http://");
            k.split('/').next() == Some(host)
        })?
        .1;
    if let (Some(u), Some(p)) = (&entry.username, &entry.password) {
        return Some(RegistryAuth::Basic(u.clone(), p.clone()));
    }
    let decoded = base64::engine::general_purpose::STANDARD.decode(entry.auth.as_deref()?).ok()?;
    let (u, p) = std::str::from_utf8(&decoded).ok()?.split_once(':')?;
    Some(RegistryAuth::Basic(u.to_owned(), p.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dockerconfigjson_credential_is_found_by_host() {
        let auth = base64::engine::general_purpose::STANDARD.encode("robot:s3cret");
        let config = format!(
            r#"{{"auths": {{"https://registry.hangar.test/v1/": {{"auth": "{auth}"}}, "other.io": {{"username": "u", "password": "p"}}}}}}"#
        );
        assert!(
            matches!(auth_for(config.as_bytes(), "registry.hangar.test"), Some(RegistryAuth::Basic(u, p)) if u == "robot" && p == "s3cret")
        );
        assert!(matches!(auth_for(config.as_bytes(), "other.io"), Some(RegistryAuth::Basic(u, _)) if u == "u"));
        assert!(auth_for(config.as_bytes(), "third.io").is_none());
        assert!(auth_for(b"not json", "other.io").is_none());
    }
}

//! Small helpers over kube's errors and writes, so every binary reads an
//! apiserver answer the same way.

use kube::api::{Api, Patch, PatchParams};
use kube::core::Status;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// Orders two resourceVersions of objects of the same resource, as
/// Kubernetes 1.35 and later allow (KEP-5504: a positive decimal integer
/// without leading zeros, of any length). `None` when either is not one,
/// as an older or another apiserver may send: then only equality means
/// anything.
pub fn compare_resource_versions(a: &str, b: &str) -> Option<std::cmp::Ordering> {
    let well_formed = |rv: &str| !rv.is_empty() && !rv.starts_with('0') && rv.bytes().all(|c| c.is_ascii_digit());
    (well_formed(a) && well_formed(b)).then(|| a.len().cmp(&b.len()).then_with(|| a.cmp(b)))
}

/// HTTP status of an apiserver refusal, if `e` is one.
pub fn status_of(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

pub fn is_not_found(e: &kube::Error) -> bool {
    status_of(e) == Some(404)
}

/// A create found the object already there (409).
pub fn is_already_exists(e: &kube::Error) -> bool {
    status_of(e) == Some(409)
}

/// A write whose resourceVersion precondition failed: the object changed
/// since it was read (409).
pub fn is_conflict(e: &kube::Error) -> bool {
    status_of(e) == Some(409)
}

/// A missing object is not an error (a delete that already happened).
pub fn ignore_not_found<T>(r: Result<T, kube::Error>) -> Result<Option<T>, kube::Error> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if is_not_found(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A create that finds the object already there is not an error (someone,
/// perhaps an earlier run of ourselves, made it first).
pub fn ignore_already_exists<T>(r: Result<T, kube::Error>) -> Result<Option<T>, kube::Error> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if is_already_exists(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// What a compare-and-swap of a status came to.
#[derive(Debug)]
pub enum Swap<K> {
    /// Written; the object as it now is.
    Swapped(K),
    /// The object changed since it was read (409): read it again and decide
    /// again.
    LostRace,
    /// The apiserver refused the new status itself (422: a CEL rule, e.g. a
    /// final status may not change): reading again will not help.
    Refused(Box<Status>),
}

/// Merge-patches `status` onto `obj` only if it is still at the version
/// that was read.
pub async fn swap_status<K>(api: &Api<K>, obj: &K, status: Value) -> Result<Swap<K>, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let patch = json!({"metadata": {"resourceVersion": obj.resource_version()}, "status": status});
    match api.patch_status(&obj.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(updated) => Ok(Swap::Swapped(updated)),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(Swap::LostRace),
        Err(kube::Error::Api(e)) if e.code == 422 => Ok(Swap::Refused(e)),
        Err(e) => Err(e),
    }
}

/// As [`swap_status`], for a caller that only needs to know whether the
/// status was written: false when the object changed meanwhile (the next
/// pass sees the new version) or the apiserver refused the change (logged
/// with the object's name and the rule's message).
pub async fn try_swap_status<K>(api: &Api<K>, obj: &K, status: Value) -> Result<bool, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    Ok(match swap_status(api, obj, status).await? {
        Swap::Swapped(_) => true,
        Swap::LostRace => false,
        Swap::Refused(e) => {
            tracing::info!(object = %obj.name_any(), reason = %e.message, "status change refused");
            false
        }
    })
}

/// Whether a reflector's cache has completed its first list (without
/// waiting for it: a reconcile fed by the same watch must not block on it).
pub fn has_listed<K>(store: &kube::runtime::reflector::Store<K>) -> bool
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    matches!(futures::FutureExt::now_or_never(store.wait_until_ready()), Some(Ok(())))
}

/// For a watch stream's `for_each`: a watch of `kind` that fails is
/// retried (with the stream's backoff) and logged, never dropped silently;
/// meanwhile a cache fed by it may lag.
pub fn log_watch_errors<T>(
    kind: &'static str,
) -> impl FnMut(Result<T, kube::runtime::watcher::Error>) -> futures::future::Ready<()> {
    move |r| {
        if let Err(e) = r {
            tracing::warn!(kind, error = %e, "watch failed; a cache fed by it may lag until it is back");
        }
        futures::future::ready(())
    }
}

#[cfg(test)]
mod tests {
    use std::cmp::Ordering::{Equal, Greater, Less};

    use super::compare_resource_versions as cmp;

    #[test]
    fn resource_versions_order_as_integers_of_any_length() {
        assert_eq!(cmp("9", "10"), Some(Less), "not as text");
        assert_eq!(cmp("10", "9"), Some(Greater));
        assert_eq!(cmp("123", "123"), Some(Equal));
        assert_eq!(cmp("99999999999999999999999", "100000000000000000000000"), Some(Less), "past u64");
    }

    #[test]
    fn anything_else_has_no_order() {
        for odd in ["", "0", "012", "12a", "-3", " 5"] {
            assert_eq!(cmp(odd, "7"), None, "{odd:?}");
            assert_eq!(cmp("7", odd), None, "{odd:?}");
        }
    }
}

//! The Sandbox's finalizer: added before anything is launched, removed once
//! the reset is complete (so a delete waits for the reset).

use hangar_crds::Sandbox;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::error::{Error, Result};

pub const FINALIZER: &str = "hangar.dev/session";

/// Returns the Sandbox as the patch left it, if one was made.
pub(super) async fn ensure_finalizer(api: &Api<Sandbox>, sandbox: &Sandbox) -> Result<Option<Sandbox>> {
    if sandbox.finalizers().iter().any(|f| f == FINALIZER) || sandbox.metadata.deletion_timestamp.is_some() {
        return Ok(None);
    }
    let mut finalizers = sandbox.finalizers().to_vec();
    finalizers.push(FINALIZER.to_owned());
    patch_finalizers(api, sandbox, finalizers).await
}

/// Once the reset is complete nothing is left to clean up, so the
/// finalizer goes (and a pending delete completes).
pub(super) async fn remove_finalizer(api: &Api<Sandbox>, sandbox: &Sandbox) -> Result<()> {
    if !sandbox.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(());
    }
    let finalizers = sandbox.finalizers().iter().filter(|f| *f != FINALIZER).cloned().collect();
    match patch_finalizers(api, sandbox, finalizers).await {
        Err(Error::Kube(e)) if hangar_runtime::kube_ext::is_not_found(&e) => Ok(()),
        other => other.map(|_| ()),
    }
}

/// A JSON patch that tests the finalizers it read before replacing them:
/// safe against another controller's concurrent finalizer edit, and not
/// refused merely because our own status write moved the resourceVersion.
/// When the test fails (our copy was stale), it reads the object again once.
/// Returns the Sandbox as the patch left it (none if nothing was patched).
async fn patch_finalizers(api: &Api<Sandbox>, sandbox: &Sandbox, next: Vec<String>) -> Result<Option<Sandbox>> {
    match try_patch_finalizers(api, sandbox, &next).await {
        Err(kube::Error::Api(e)) if e.code == 422 => {
            let fresh = api.get(&sandbox.name_any()).await?;
            let wanted = next.iter().any(|f| f == FINALIZER);
            let mut list: Vec<String> = fresh.finalizers().iter().filter(|f| *f != FINALIZER).cloned().collect();
            if wanted {
                list.push(FINALIZER.to_owned());
            }
            if list.as_slice() == fresh.finalizers() {
                return Ok(None);
            }
            Ok(Some(try_patch_finalizers(api, &fresh, &list).await?))
        }
        other => Ok(Some(other?)),
    }
}

async fn try_patch_finalizers(api: &Api<Sandbox>, sandbox: &Sandbox, next: &[String]) -> Result<Sandbox, kube::Error> {
    let ops = if sandbox.metadata.finalizers.is_none() {
        json!([{"op": "add", "path": "/metadata/finalizers", "value": next}])
    } else {
        json!([
            {"op": "test", "path": "/metadata/finalizers", "value": sandbox.finalizers()},
            {"op": "replace", "path": "/metadata/finalizers", "value": next},
        ])
    };
    let patch: json_patch::Patch = serde_json::from_value(ops).expect("valid JSON patch");
    api.patch(&sandbox.name_any(), &PatchParams::default(), &Patch::<()>::Json(patch)).await
}

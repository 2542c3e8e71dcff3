//! Writing a Sandbox's status: server-side apply under the operator's own
//! field manager, so the status is the operator's alone, and only over the
//! version it was decided from. A reconcile can start from a cached
//! Sandbox that does not yet show the operator's own last write; applying
//! its status anyway would take back what that write recorded (a node name,
//! an attempt's end). With the resourceVersion as a precondition such a
//! write is refused (409) and the reconcile runs again on the newer copy.

use hangar_crds::{Sandbox, SandboxStatus};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::error::Result;

/// The operator's field manager on every object it applies.
pub const FIELD_MANAGER: &str = "hangar-operator";

/// Returns the Sandbox as the write stored it.
pub async fn write_status(api: &Api<Sandbox>, sandbox: &Sandbox, status: &SandboxStatus) -> Result<Sandbox> {
    let name = sandbox.name_any();
    let patch = json!({
        "apiVersion": "hangar.dev/v1alpha1", "kind": "Sandbox",
        "metadata": {"resourceVersion": sandbox.resource_version()},
        "status": status,
    });
    Ok(api.patch_status(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch)).await?)
}

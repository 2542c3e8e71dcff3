//! Writing a Sandbox's status: server-side apply under the operator's own
//! field manager, so the status is the operator's alone.

use hangar_crds::{Sandbox, SandboxStatus};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::error::Result;

/// The operator's field manager on every object it applies.
pub const FIELD_MANAGER: &str = "hangar-operator";

pub async fn write_status(api: &Api<Sandbox>, name: &str, status: &SandboxStatus) -> Result<()> {
    let patch = json!({"apiVersion": "hangar.dev/v1alpha1", "kind": "Sandbox", "status": status});
    api.patch_status(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch)).await?;
    Ok(())
}

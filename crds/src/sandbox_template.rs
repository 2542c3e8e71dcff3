//! `SandboxTemplate` (cluster-scoped): an image a session starts from,
//! referenced as `name@version`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A template is registered only with a signed manifest listing the image
/// digest, the SBOM digest and the build network policy. `metadata.name` is
/// free; sessions refer to `spec.name@spec.version`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "hangar.dev",
    version = "v1alpha1",
    kind = "SandboxTemplate",
    shortname = "sbxtpl",
    category = "hangar",
    status = "SandboxTemplateStatus",
    derive = "PartialEq",
    printcolumn = r#"{"name":"Template","type":"string","jsonPath":".spec.name"}"#,
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".spec.version"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.reason","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct SandboxTemplateSpec {
    /// Template name, the part before `@`.
    pub name: String,
    /// Template version, the part after `@`.
    pub version: String,
    /// The signed release manifest.
    pub manifest: TemplateManifest,
    /// Ed25519 signature (base64) over the release payload: name, version
    /// and manifest, one a line (`hangar_core::templates::signing_payload`;
    /// `hangar-template sign` makes it).
    pub signature: String,
    /// Name of the release key that signed it, one the platform trusts
    /// (chart value `templates.trustedKeys`).
    pub signed_by: String,
    /// The namespace (organisation) whose sessions may use it; unset means
    /// shared with every namespace. Not signed: the platform team assigns
    /// it when it registers the release (only it can write templates).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateManifest {
    /// Image pinned by digest.
    pub image: String,
    /// `sha256:<hex>` of the software bill of materials.
    pub sbom_digest: String,
    pub build_network_policy: BuildNetworkPolicy,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BuildNetworkPolicy {
    /// Destinations the build could reach; empty means none.
    #[serde(default)]
    pub allow: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxTemplateStatus {
    /// `Registered` once the signature checks out, else `Rejected`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Rejected: why (unknown key, a signature that does not verify).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registered_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

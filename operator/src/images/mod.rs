//! Images: the preflight every image passes before an instance starts.
//! `registry` reads an image from its registry; `preflights` runs the
//! checks in the background and caches their results by image.

pub mod preflights;
pub mod registry;

use hangar_core::refusal::Refusal;
use hangar_core::session::ending::StopReason;
use hangar_core::templates;
use hangar_crds::{Sandbox, SandboxTemplate};
use kube::api::{Api, ListParams};

use crate::context::Context;
use crate::error::Result;

/// The agent image: `spec.image`, or the image of the template
/// `spec.template` (`name@version`) names, if the session may use it: one
/// registered for its namespace whose signature verifies under the
/// platform's trusted keys now (checked here again, not taken from the
/// template's status).
pub async fn agent_image(ctx: &Context, sandbox: &Sandbox) -> Result<std::result::Result<String, Refusal>> {
    if let Some(image) = &sandbox.spec.image {
        return Ok(Ok(image.clone()));
    }
    let reference = sandbox.spec.template.as_deref().unwrap_or("");
    let namespace = sandbox.metadata.namespace.as_deref().unwrap_or("");
    let templates: Api<SandboxTemplate> = Api::all(ctx.client.clone());
    let list = templates.list(&ListParams::default()).await?.items;
    Ok(templates::resolve(&list, reference, namespace, |spec| crate::templates::verify(&ctx.trusted_keys, spec))
        .map(|t| t.spec.manifest.image.clone()))
}

/// Every image the session runs (agent first, then companions), or why it
/// cannot start.
pub async fn session_images(ctx: &Context, sandbox: &Sandbox) -> Result<std::result::Result<Vec<String>, StopReason>> {
    let agent = match agent_image(ctx, sandbox).await? {
        Ok(image) => image,
        Err(refusal) => return Ok(Err(StopReason::Template(refusal))),
    };
    let mut images = vec![agent];
    for c in &sandbox.spec.companions {
        if !images.contains(&c.image) {
            images.push(c.image.clone());
        }
    }
    Ok(Ok(images))
}

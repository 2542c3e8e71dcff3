//! Images: the preflight every image passes before an instance starts.
//! `registry` reads an image from its registry; `preflights` runs the
//! checks in the background and caches their results by image.

pub mod preflights;
pub mod registry;

use hangar_core::session::ending::StopReason;
use hangar_crds::{Sandbox, SandboxTemplate};
use kube::api::{Api, ListParams};

use crate::context::Context;
use crate::error::Result;

/// The agent image: `spec.image`, or the image of the registered template
/// `spec.template` (`name@version`) names. `None`: no such template.
pub async fn agent_image(ctx: &Context, sandbox: &Sandbox) -> Result<Option<String>> {
    if let Some(image) = &sandbox.spec.image {
        return Ok(Some(image.clone()));
    }
    let Some((name, version)) = sandbox.spec.template.as_deref().and_then(|t| t.split_once('@')) else {
        return Ok(None);
    };
    let templates: Api<SandboxTemplate> = Api::all(ctx.client.clone());
    Ok(templates
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .find(|t| t.spec.name == name && t.spec.version == version)
        .map(|t| t.spec.manifest.image))
}

/// Every image the session runs (agent first, then companions), or why it
/// cannot start.
pub async fn session_images(ctx: &Context, sandbox: &Sandbox) -> Result<std::result::Result<Vec<String>, StopReason>> {
    let Some(agent) = agent_image(ctx, sandbox).await? else {
        let template = sandbox.spec.template.as_deref().unwrap_or("");
        return Ok(Err(StopReason::TemplateNotFound(format!("{template} is not a registered template"))));
    };
    let mut images = vec![agent];
    for c in &sandbox.spec.companions {
        if !images.contains(&c.image) {
            images.push(c.image.clone());
        }
    }
    Ok(Ok(images))
}

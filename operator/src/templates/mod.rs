//! The SandboxTemplate controller: a template is `Registered` when its
//! release signature verifies under one of the platform's trusted keys,
//! else `Rejected` with why. The status is for people and for the
//! gateway's list; the operator and the webhook verify the signature
//! themselves before a session uses a template.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use hangar_crds::{SandboxTemplate, SandboxTemplateSpec, SandboxTemplateStatus};
use hangar_keys::template_signing::TrustedKeys;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::{Event, EventType};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::{Instrument, info_span, warn};

use crate::context::Context;
use crate::error::{Error, Result};
use crate::sandbox_status::FIELD_MANAGER;

pub const REGISTERED: &str = "Registered";
pub const REJECTED: &str = "Rejected";

/// Whether `spec`'s signature verifies under the key it names; `Err` says
/// why not, to follow "its signature …".
pub fn verify(keys: &TrustedKeys, spec: &SandboxTemplateSpec) -> std::result::Result<(), String> {
    hangar_core::templates::verify(spec, |key, payload, signature| keys.verify(key, payload, signature))
}

pub async fn run(ctx: Arc<Context>) {
    let api: Api<SandboxTemplate> = Api::all(ctx.client.clone());
    hangar_runtime::controllers::controller(api, watcher::Config::default().any_semantic())
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|_| futures::future::ready(()))
        .await;
}

async fn reconcile(template: Arc<SandboxTemplate>, ctx: Arc<Context>) -> Result<Requeue> {
    let span = info_span!("reconcile_template", template = %template.name_any());
    async move {
        let verdict = verify(&ctx.trusted_keys, &template.spec);
        let current = template.status.clone().unwrap_or_default();
        let status = match &verdict {
            Ok(()) => SandboxTemplateStatus {
                phase: Some(REGISTERED.into()),
                reason: None,
                // Kept from the first registration.
                registered_at: current.registered_at.clone().or_else(|| Some(Time(Timestamp::now()))),
                conditions: vec![],
            },
            Err(why) => SandboxTemplateStatus {
                phase: Some(REJECTED.into()),
                reason: Some(format!("its signature {why}")),
                registered_at: None,
                conditions: vec![],
            },
        };
        if status == current {
            return Ok(Requeue::await_change());
        }
        let api: Api<SandboxTemplate> = Api::all(ctx.client.clone());
        let patch = json!({"apiVersion": "hangar.dev/v1alpha1", "kind": "SandboxTemplate", "status": status});
        api.patch_status(&template.name_any(), &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch))
            .await?;
        let (type_, reason, note) = match &verdict {
            Ok(()) => (
                EventType::Normal,
                REGISTERED,
                format!("{}@{} signed by {}", template.spec.name, template.spec.version, template.spec.signed_by),
            ),
            Err(why) => (EventType::Warning, REJECTED, format!("its signature {why}")),
        };
        tracing::info!(phase = status.phase.as_deref(), reason = status.reason.as_deref(), "template status");
        let event = Event { type_, reason: reason.into(), note: Some(note), action: "Verify".into(), secondary: None };
        ctx.events.publish(event, template.object_ref(&()));
        Ok(Requeue::await_change())
    }
    .instrument(span)
    .await
}

fn error_policy(template: Arc<SandboxTemplate>, error: &Error, _ctx: Arc<Context>) -> Requeue {
    warn!(template = %template.name_any(), %error, "template reconcile failed; retrying");
    Requeue::requeue(Duration::from_secs(5))
}

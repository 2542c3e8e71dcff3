//! Output retention: `outputRetentionDays` after a session ends, its output
//! keys are destroyed — the session's sealed output keys and any hand-off
//! left — and the erasure is recorded (`status.outputErasedAt`); from then
//! on the sealed chunks in the store open for nobody and the gateway
//! answers 410 `sandbox_output_erased`.
//!
//! The deadline is written onto the sealed output keys themselves
//! (`hangar.dev/erase-after`) in the reconcile that ends the session, before
//! the finalizer goes: a Sandbox deleted right after its end leaves no key
//! behind, because the periodic sweep erases any sealed keys past their
//! deadline whether or not their Sandbox still exists.

use std::time::Duration;

use hangar_crds::output_keys::{self, SESSION_ID_LABEL};
use hangar_crds::{Sandbox, SandboxStatus};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::context::Context;
use crate::error::Result;
use hangar_core::retention::{ended_at, erase_after};
use hangar_runtime::kube_ext::{ignore_already_exists, ignore_not_found};

pub const ERASE_AFTER: &str = "hangar.dev/erase-after";

/// For an ended session: write the deadline, or erase once it has passed.
/// Returns how long until the deadline (None once erased).
pub async fn enforce(ctx: &Context, sandbox: &Sandbox, status: &SandboxStatus) -> Result<Option<Duration>> {
    if status.output_erased_at.is_some() {
        return Ok(None);
    }
    let Some(session_id) = sandbox.uid() else { return Ok(None) };
    let ended = ended_at(status).unwrap_or_else(Timestamp::now);
    let deadline = erase_after(ended, sandbox.spec.output_retention_days, ctx.settings.retention_day_seconds);
    let now = Timestamp::now();
    if now < deadline {
        mark(ctx, &session_id, deadline).await?;
        let left = deadline.duration_since(now).unsigned_abs();
        return Ok(Some(left));
    }
    erase(ctx, &session_id, status.node_name.as_deref(), status.attempt.unwrap_or(0)).await?;
    let api: Api<Sandbox> = Api::namespaced(ctx.client.clone(), &sandbox.namespace().unwrap_or_default());
    let mut next = status.clone();
    next.output_erased_at = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now));
    let written = crate::sandbox_status::write_status(&api, sandbox, &next).await?;
    ctx.wrote(&format!("{}/{}", sandbox.namespace().unwrap_or_default(), sandbox.name_any()), written);
    tracing::info!(session = %session_id, "output retention over: output keys destroyed");
    Ok(None)
}

/// Puts the deadline on the session's sealed output keys (creating an
/// empty ConfigMap if no attempt ever made a key, so the sweep still knows
/// the session).
async fn mark(ctx: &Context, session_id: &str, deadline: Timestamp) -> Result<()> {
    let maps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ctx.settings.system_namespace);
    let name = output_keys::sealed_keys_name(session_id);
    let value = deadline.to_string();
    match maps.get_opt(&name).await? {
        Some(s) if s.annotations().get(ERASE_AFTER) == Some(&value) => Ok(()),
        Some(_) => {
            let patch = json!({"metadata": {"annotations": {ERASE_AFTER: value}}});
            maps.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
            Ok(())
        }
        None => {
            let map = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(name),
                    labels: Some([(SESSION_ID_LABEL.to_owned(), session_id.to_owned())].into()),
                    annotations: Some([(ERASE_AFTER.to_owned(), value)].into()),
                    ..Default::default()
                },
                ..Default::default()
            };
            ignore_already_exists(maps.create(&PostParams::default(), &map).await)?;
            Ok(())
        }
    }
}

/// Destroys every output key of the session.
async fn erase(ctx: &Context, session_id: &str, node_name: Option<&str>, attempts: i64) -> Result<()> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ctx.settings.system_namespace);
    let maps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ctx.settings.system_namespace);
    if let Some(node) = node_name {
        for a in 1..=attempts {
            let name = output_keys::handoff_secret_name(node, session_id, a);
            ignore_not_found(secrets.delete(&name, &DeleteParams::default()).await)?;
        }
    }
    ignore_not_found(maps.delete(&output_keys::sealed_keys_name(session_id), &DeleteParams::default()).await)?;
    Ok(())
}

/// The sweep: erases every output-key Secret past its deadline, including
/// those whose Sandbox is gone.
pub async fn sweep(client: &kube::Client, system_namespace: &str) -> Result<Vec<String>> {
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), system_namespace);
    let now = Timestamp::now();
    let mut erased = Vec::new();
    for s in maps.list(&ListParams::default().labels(SESSION_ID_LABEL)).await?.items {
        let due = s.annotations().get(ERASE_AFTER).and_then(|v| v.parse::<Timestamp>().ok()).is_some_and(|d| d <= now);
        if due && ignore_not_found(maps.delete(&s.name_any(), &DeleteParams::default()).await)?.is_some() {
            erased.push(s.name_any());
        }
    }
    Ok(erased)
}

//! The Command controller: gives each command its number and job id
//! (`numbering`), and ends a queued command whose `cancel` is set, even
//! while its session is paused (a cancelled command never runs). Running
//! commands are the worker's: it runs, cancels and reports them.
//!
//! Every status write is a compare-and-swap on the resourceVersion: the
//! worker starts a queued command the same way, so a command is either
//! cancelled before it starts or started before it is cancelled, never both.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use hangar_crds::{Command, CommandPhase, Sandbox, job_id};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::controller::{Action as Requeue, Controller};
use kube::runtime::watcher;
use serde_json::{Value, json};
use tracing::{Instrument, info_span, warn};

use hangar_runtime::kube_ext::{Swap, swap_status};

use crate::context::Context;
use crate::error::{Error, Result};

pub async fn run(ctx: Arc<Context>) {
    let commands: Api<Command> = match ctx.settings.watch_namespaces.as_slice() {
        [one] => Api::namespaced(ctx.client.clone(), one),
        _ => Api::all(ctx.client.clone()),
    };
    let watched = ctx.settings.watch_namespaces.clone();
    Controller::new(commands, watcher::Config::default().any_semantic())
        .shutdown_on_signal()
        .run(
            move |c, ctx| {
                let serves = watched.is_empty() || c.namespace().is_some_and(|ns| watched.contains(&ns));
                reconcile(c, ctx, serves)
            },
            error_policy,
            ctx,
        )
        .for_each(|_| futures::future::ready(()))
        .await;
}

fn error_policy(command: Arc<Command>, error: &Error, _ctx: Arc<Context>) -> Requeue {
    warn!(command = %command.name_any(), %error, "command reconcile failed; retrying");
    Requeue::requeue(Duration::from_secs(1))
}

async fn reconcile(command: Arc<Command>, ctx: Arc<Context>, serves: bool) -> Result<Requeue> {
    if !serves {
        return Ok(Requeue::await_change());
    }
    let ns = command.namespace().unwrap_or_default();
    let span = info_span!("reconcile_command", namespace = %ns, command = %command.name_any(), sandbox = %command.spec.sandbox);
    async move {
        let api: Api<Command> = Api::namespaced(ctx.client.clone(), &ns);
        let status = command.status.clone().unwrap_or_default();
        if status.number.is_none() {
            let uid = command.uid().unwrap_or_default();
            if !ctx.numbering.is_numbered(&uid) {
                return number_session(&ctx, &api, &ns, &command.spec.sandbox).await;
            }
            return Ok(Requeue::await_change());
        }
        if command.spec.cancel && status.phase == Some(CommandPhase::Queued) {
            cancel_queued(&api, &command).await?;
        }
        Ok(Requeue::await_change())
    }
    .instrument(span)
    .await
}

/// Numbers every unnumbered command of one session, oldest first.
async fn number_session(ctx: &Context, api: &Api<Command>, ns: &str, sandbox: &str) -> Result<Requeue> {
    let lock = ctx.numbering.lock_for(&format!("{ns}/{sandbox}"));
    let _guard = lock.lock().await;
    let sandboxes: Api<Sandbox> = Api::namespaced(ctx.client.clone(), ns);
    let Some(session_id) = sandboxes.get_opt(sandbox).await?.and_then(|s| s.uid()) else {
        // The admission webhook refuses these; without it, wait for the
        // Sandbox rather than number into nothing.
        return Ok(Requeue::requeue(Duration::from_secs(5)));
    };
    // A fresh (quorum) list: it holds every number already given.
    let list = api.list(&ListParams::default().fields(&format!("spec.sandbox={sandbox}"))).await?.items;
    let by_name: HashMap<String, &Command> = list.iter().map(|c| (c.name_any(), c)).collect();
    for (name, number) in hangar_core::commands::numbering::assign(&list) {
        let c = by_name[&name];
        let now = Time(Timestamp::now());
        let mut status = json!({
            "number": number,
            "jobId": job_id(&session_id, number),
            "phase": "queued",
            "queuedAt": now,
        });
        if c.spec.cancel {
            status["phase"] = json!("cancelled");
            status["finishedAt"] = json!(now);
            status["reason"] = json!("cancelled before it ran");
        }
        if !cas(api, c, status).await? {
            // Changed under us (e.g. cancel set): the next pass numbers it.
            return Ok(Requeue::requeue(Duration::from_millis(50)));
        }
        ctx.numbering.mark(c.uid().unwrap_or_default());
        tracing::debug!(command = %name, number, "numbered");
    }
    Ok(Requeue::await_change())
}

/// Queued → cancelled, unless the worker started it first.
async fn cancel_queued(api: &Api<Command>, command: &Command) -> Result<()> {
    let status = json!({
        "phase": "cancelled",
        "finishedAt": Time(Timestamp::now()),
        "reason": "cancelled before it ran",
    });
    cas(api, command, status).await?;
    Ok(())
}

/// Merge-patches the status if the object is still at `command`'s version.
/// False when it changed meanwhile (the next pass sees the new version) or
/// when the apiserver refused the change (a final status never changes).
pub async fn cas(api: &Api<Command>, command: &Command, status: Value) -> Result<bool> {
    match swap_status(api, command, status).await? {
        Swap::Swapped(_) => Ok(true),
        Swap::LostRace => Ok(false),
        Swap::Refused(e) => {
            tracing::info!(command = %command.name_any(), reason = %e.message, "status change refused");
            Ok(false)
        }
    }
}

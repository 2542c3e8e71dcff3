//! The Command controller: gives each command its number and job id
//! (`numbering`), and ends a queued command whose `cancel` is set, even
//! while its session is paused (a cancelled command never runs). Running
//! commands are the worker's: it runs, cancels and reports them.
//!
//! Every status write is a compare-and-swap on the resourceVersion: the
//! worker starts a queued command the same way, so a command is either
//! cancelled before it starts or started before it is cancelled, never both.

pub mod admission;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use hangar_core::commands::ledger::{Ledger, Live};
use hangar_core::commands::numbering;
use hangar_core::tokens::scope;
use hangar_crds::{Command, CommandPhase, Sandbox, SessionToken, job_id};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action as Requeue;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use serde_json::json;
use tracing::{Instrument, info_span, warn};

use hangar_runtime::kube_ext::{Swap, swap_status, try_swap_status};

use crate::context::Context;
use crate::error::{Error, Result};

pub async fn run(ctx: Arc<Context>) {
    let commands: Api<Command> = match ctx.settings.watch_namespaces.as_slice() {
        [one] => Api::namespaced(ctx.client.clone(), one),
        _ => Api::all(ctx.client.clone()),
    };
    let watched = ctx.settings.watch_namespaces.clone();
    hangar_runtime::controllers::controller(commands, watcher::Config::default().any_semantic())
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
        if status.phase == Some(CommandPhase::Queued) {
            if command.spec.cancel {
                cancel_queued(&api, &command, "cancelled before it ran").await?;
            } else if let Some(sender) = &status.sender
                && sender_token_ended(&ctx, &ns, sender).await?
            {
                cancel_queued(&api, &command, TOKEN_ENDED).await?;
            }
        }
        Ok(Requeue::await_change())
    }
    .instrument(span)
    .await
}

/// Numbers every unnumbered command of one session, oldest first: in the
/// session's ledger first, then on the commands (a crash between the two
/// repeats the copy, not the choice). A command the ledger does not hold
/// and that was created before this process led was admitted by the leader
/// before it, which stopped before it wrote the place: it is taken in while
/// the limits have room. Any other command the ledger does not hold was
/// never admitted for this session (created while no webhook answered, or
/// for a session that has ended): it ends `cancelled` and never runs.
async fn number_session(ctx: &Context, api: &Api<Command>, ns: &str, sandbox: &str) -> Result<Requeue> {
    let lock = ctx.numbering.lock_for(&format!("{ns}/{sandbox}"));
    let mut held = lock.lock().await;
    let sandboxes: Api<Sandbox> = Api::namespaced(ctx.client.clone(), ns);
    let Some(session) = sandboxes.get_opt(sandbox).await? else {
        // The admission webhook refuses these; without it, wait for the
        // Sandbox rather than number into nothing.
        return Ok(Requeue::requeue(Duration::from_secs(5)));
    };
    let session_id = session.uid().unwrap_or_default();
    // The ledger before the list: a command's place is in the ledger (in
    // memory, under this lock) before the command exists, so the list
    // shows every command that holds a place, and nothing is admitted
    // while the lock is held.
    held.load(ctx, &session_id).await?;
    let list = api.list(&ListParams::default().fields(&format!("spec.sandbox={sandbox}"))).await?.items;
    let mine: Vec<&Command> = list.iter().filter(|c| c.belongs_to(&session)).collect();
    let live: Vec<Live> = mine.iter().map(|c| Live::of(c)).collect();
    let mut next: Ledger = held.current.clone();
    let bound = next.bind(&live);
    let now_s = Timestamp::now().as_second();
    let mut adopted = false;
    let mut strays: Vec<&Live> = live
        .iter()
        .filter(|l| next.entry(&l.uid).is_none() && l.session_uid.is_none() && l.created <= ctx.leading_since)
        .collect();
    strays.sort_by_key(|l| (l.created, l.name.clone()));
    for l in strays {
        adopted |= next.adopt(l, &live, now_s);
    }
    if (numbering::assign(&mut next, &live) || bound || adopted) && !held.store(ctx, &session_id, next.clone()).await? {
        // Another writer changed it: decide again on what it holds now.
        return Ok(Requeue::requeue(Duration::from_millis(20)));
    }
    // The numbers are in the ledger: admissions may go on while they are
    // written to the commands (a concurrent pass writes the same ones, and
    // each write is a compare-and-swap).
    drop(held);
    let node = session.status.as_ref().and_then(|s| s.node_name.clone());
    // Written in number order, not name order: a worker hands over the
    // lowest numbers it sees queued, so a higher number must not become
    // visible before a lower one.
    let mut unnumbered: Vec<&&Command> =
        mine.iter().filter(|c| c.status.as_ref().and_then(|s| s.number).is_none()).collect();
    unnumbered.sort_by_key(|c| next.entry(&c.uid().unwrap_or_default()).and_then(|e| e.number).unwrap_or(i64::MAX));
    for c in unnumbered {
        let now = Time(Timestamp::now());
        let finished = c.status.as_ref().and_then(|s| s.phase).is_some_and(CommandPhase::is_final);
        let entry = next.entry(&c.uid().unwrap_or_default());
        // The apiserver's own record of who created it; the ledger's for a
        // command made before the chart's sender policy.
        let sender = c.sender().map(str::to_owned).or_else(|| entry.and_then(|e| e.sender.clone()));
        let token_ended = match &sender {
            Some(s) => sender_token_ended(ctx, ns, s).await?,
            None => false,
        };
        let mut status = match entry.and_then(|e| e.number) {
            // Ended before it was numbered (its session ended): it keeps
            // its status and gets its number.
            Some(number) if finished => json!({
                "number": number, "jobId": job_id(&session_id, number), "sandboxUid": session_id,
            }),
            Some(number) if c.spec.cancel => json!({
                "number": number, "jobId": job_id(&session_id, number), "sandboxUid": session_id,
                "phase": "cancelled", "queuedAt": now, "finishedAt": now, "reason": "cancelled before it ran",
            }),
            // Its token ended before it was numbered: it never runs.
            Some(number) if token_ended => json!({
                "number": number, "jobId": job_id(&session_id, number), "sandboxUid": session_id,
                "phase": "cancelled", "queuedAt": now, "finishedAt": now, "reason": TOKEN_ENDED,
            }),
            Some(number) => json!({
                "number": number, "jobId": job_id(&session_id, number), "sandboxUid": session_id,
                "phase": "queued", "queuedAt": now, "nodeName": node,
            }),
            None if finished => continue,
            None => {
                tracing::warn!(command = %c.name_any(), "a command no admission let in for this session; cancelled");
                json!({
                    "sandboxUid": session_id, "phase": "cancelled", "finishedAt": now,
                    "reason": "not admitted for this session",
                })
            }
        };
        if let Some(sender) = &sender {
            status["sender"] = json!(sender);
            status["sentBy"] = json!(scope::sent_by(sender));
        }
        match swap_status(api, *c, status).await? {
            Swap::Swapped(_) => ctx.numbering.mark(c.uid().unwrap_or_default()),
            // Changed under us (e.g. cancel set): the next pass numbers it.
            Swap::LostRace => return Ok(Requeue::requeue(Duration::from_millis(50))),
            Swap::Refused(e) => tracing::warn!(command = %c.name_any(), reason = %e.message, "number refused"),
        }
        tracing::debug!(command = %c.name_any(), "numbered");
    }
    Ok(Requeue::await_change())
}

/// Stamps every unfinished command of the session with the node it runs
/// on: the worker there may write their status, no other. Read from the
/// watch cache; a stale copy loses its compare-and-swap and is stamped on
/// the next pass.
pub async fn stamp_node(ctx: &Context, sandbox: &Sandbox, node: &str) -> Result<()> {
    let ns = sandbox.namespace().unwrap_or_default();
    let api: Api<Command> = Api::namespaced(ctx.client.clone(), &ns);
    for c in ctx.commands.state().iter().filter(|c| c.belongs_to(sandbox)) {
        let status = c.status.clone().unwrap_or_default();
        if status.number.is_none() || status.phase.is_some_and(CommandPhase::is_final) {
            continue;
        }
        if status.node_name.as_deref() != Some(node) {
            try_swap_status(&api, c, json!({"nodeName": node})).await?;
        }
    }
    Ok(())
}

/// Why a command its token's end cancelled never ran.
pub const TOKEN_ENDED: &str = "the session token that sent it ended before it ran";

/// Whether `sender` is a session token that has ended (revoked, expired or
/// gone): the commands it sent that have not started never run.
async fn sender_token_ended(ctx: &Context, namespace: &str, sender: &str) -> Result<bool> {
    let Some((token_ns, name)) = scope::token_of_identity(sender) else {
        return Ok(false);
    };
    if token_ns != namespace {
        return Ok(true);
    }
    // The token controller's cache answers for a token it holds (an ended
    // token never becomes active again, and expiry is a time); one it does
    // not hold yet may be new, so the apiserver is asked.
    let cached = ctx.tokens.get().and_then(|s| s.get(&ObjectRef::new(name).within(token_ns)));
    let token = match cached {
        Some(t) => Some((*t).clone()),
        None => Api::<SessionToken>::namespaced(ctx.client.clone(), token_ns).get_opt(name).await?,
    };
    Ok(token.is_none_or(|t| scope::active(&t, None, Timestamp::now()).is_err()))
}

/// Queued → cancelled (`reason`), unless the worker started it first.
pub async fn cancel_queued(api: &Api<Command>, command: &Command, reason: &str) -> Result<()> {
    let status = json!({
        "phase": "cancelled",
        "finishedAt": Time(Timestamp::now()),
        "reason": reason,
    });
    try_swap_status(api, command, status).await?;
    Ok(())
}

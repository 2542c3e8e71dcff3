//! The session verbs a kubectl user wants: `create`, `pause`, `resume`,
//! `stop` write the Sandbox through the Kubernetes API (as the kubeconfig's
//! user, so RBAC decides), then watch it reach the phase asked for,
//! reporting each phase on stderr.

use std::cell::RefCell;
use std::time::Duration;

use hangar_crds::{Phase, Sandbox};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use serde_json::json;

use crate::CliError;

#[derive(clap::Args)]
pub struct CreateArgs {
    pub name: String,
    /// `commands` (default) or `agent`.
    #[arg(long, default_value = "commands")]
    pub mode: String,
    /// The agent image, by digest (or --template).
    #[arg(long, conflicts_with = "template")]
    pub image: Option<String>,
    /// A registered template, `name@version`.
    #[arg(long)]
    pub template: Option<String>,
    #[arg(long)]
    pub tenant: Option<String>,
    /// `tiny`, `small` (default), `medium`, `large`.
    #[arg(long)]
    pub size: Option<String>,
    /// Mode agent: the agent's command.
    #[arg(last = true)]
    pub command: Vec<String>,
}

pub async fn sandboxes(namespace: &str) -> Result<Api<Sandbox>, CliError> {
    Ok(Api::namespaced(kube::Client::try_default().await?, namespace))
}

/// The session id (the Sandbox's uid) of `name`.
pub async fn session_id(api: &Api<Sandbox>, name: &str, namespace: &str) -> Result<String, CliError> {
    api.get_opt(name)
        .await?
        .and_then(|s| s.metadata.uid)
        .ok_or_else(|| CliError::NoSandbox(name.to_owned(), namespace.to_owned()))
}

pub async fn create(api: &Api<Sandbox>, args: &CreateArgs, wait: Duration) -> Result<(), CliError> {
    let mut spec = json!({"mode": args.mode});
    for (field, value) in
        [("image", &args.image), ("template", &args.template), ("tenant", &args.tenant), ("size", &args.size)]
    {
        if let Some(v) = value {
            spec[field] = json!(v);
        }
    }
    if !args.command.is_empty() {
        spec["command"] = json!(args.command);
    }
    let sandbox: Sandbox = serde_json::from_value(json!({
        "apiVersion": "hangar.dev/v1alpha1", "kind": "Sandbox",
        "metadata": {"name": args.name}, "spec": spec,
    }))
    .map_err(|e| CliError::Invalid(e.to_string()))?;
    api.create(&PostParams::default(), &sandbox).await?;
    eprintln!("hangar: created sandbox {}", args.name);
    reach(api, &args.name, &[Phase::Running], wait).await
}

/// Pause, resume or stop: `state` in the spec; a resume of a session whose
/// spec already says Running (paused by idle, or a failed resume) is a new
/// request through the retry annotation, as the gateway's resume route.
pub async fn set_state(api: &Api<Sandbox>, name: &str, state: &str, wait: Duration) -> Result<(), CliError> {
    let current = api.get(name).await?;
    let mut patch = json!({"spec": {"state": state}});
    if state == "Running" && current.spec.state == hangar_crds::DesiredState::Running {
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        patch["metadata"] = json!({"annotations": {hangar_core::session::requests::RETRY_RESUME_ANNOTATION: now}});
    }
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    let want: &[Phase] = match state {
        "Paused" => &[Phase::Paused],
        "Running" => &[Phase::Running],
        _ => &[Phase::Ended, Phase::Failed],
    };
    reach(api, name, want, wait).await
}

/// Watches `name` until its phase is one of `want` (each phase on stderr);
/// an end that was not asked for is an error.
async fn reach(api: &Api<Sandbox>, name: &str, want: &[Phase], wait: Duration) -> Result<(), CliError> {
    let last = RefCell::new(None::<Phase>);
    let seen = |s: Option<&Sandbox>| {
        let phase = s.and_then(|s| s.status.as_ref()).and_then(|st| st.phase);
        if phase.is_some() && phase != *last.borrow() {
            let p = phase.map(|p| serde_json::to_value(p).unwrap_or_default()).unwrap_or_default();
            eprintln!("hangar: {name}: {}", p.as_str().unwrap_or("?"));
            *last.borrow_mut() = phase;
        }
        phase.is_some_and(|p| want.contains(&p) || matches!(p, Phase::Ended | Phase::Failed))
    };
    let done = tokio::time::timeout(wait, await_condition(api.clone(), name, seen))
        .await
        .map_err(|_| CliError::Timeout(name.to_owned(), wait))?
        .map_err(|e| CliError::Watch(e.to_string()))?;
    let phase = done.and_then(|s| s.status).and_then(|s| s.phase);
    match phase {
        Some(p) if want.contains(&p) => Ok(()),
        other => Err(CliError::Ended(name.to_owned(), format!("{other:?}"))),
    }
}

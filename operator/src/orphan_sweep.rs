//! The orphan sweep: what a session leaves behind when its Sandbox is gone
//! without its reset (a tenant stripped the finalizer, say) is removed all
//! the same:
//! - a tagged instance or workspace volume is terminated or deleted;
//! - its workspace key (and any output-key hand-off) is destroyed, its
//!   command ledger and its worker's node account deleted;
//! - its sealed output keys get an erase deadline if they had none (the
//!   default retention from now: the Sandbox, with its own setting, is
//!   gone), and the retention sweep erases them then.

use std::collections::HashSet;

use hangar_core::commands::ledger;
use hangar_crds::Sandbox;
use hangar_crds::output_keys::{self, SESSION_ID_LABEL};
use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;

use crate::output_retention::ERASE_AFTER;
use hangar_runtime::kube_ext::ignore_not_found;

use crate::ec2::Ec2;
use crate::error::Result;

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Swept {
    pub instances: Vec<String>,
    pub volumes: Vec<String>,
    /// Secrets and ConfigMaps removed or given an erase deadline.
    pub keys: Vec<String>,
}

/// The uids of every Sandbox now.
async fn live_sessions(client: &kube::Client) -> Result<HashSet<String>> {
    let sandboxes: Api<Sandbox> = Api::all(client.clone());
    Ok(sandboxes.list_metadata(&ListParams::default()).await?.items.iter().filter_map(|s| s.uid()).collect())
}

/// The keys and ledgers of sessions that are gone. Listed before the
/// sessions, like the EC2 resources: each belongs to a session that
/// existed when it was made.
pub async fn sweep_keys(
    client: &kube::Client,
    system_namespace: &str,
    retention: std::time::Duration,
) -> Result<Vec<String>> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), system_namespace);
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), system_namespace);
    let keyed = secrets.list_metadata(&ListParams::default().labels(SESSION_ID_LABEL)).await?.items;
    let sealed = maps.list_metadata(&ListParams::default().labels(SESSION_ID_LABEL)).await?.items;
    let ledgers = maps.list_metadata(&ListParams::default().labels(ledger::SESSION_LABEL)).await?.items;
    let accounts_api: Api<ServiceAccount> = Api::namespaced(client.clone(), system_namespace);
    let accounts = accounts_api.list_metadata(&ListParams::default().labels(SESSION_ID_LABEL)).await?.items;
    let live = live_sessions(client).await?;
    let gone = |labels: &std::collections::BTreeMap<String, String>, label: &str| {
        labels.get(label).is_some_and(|s| !live.contains(s))
    };
    let mut swept = Vec::new();
    for s in keyed.iter().filter(|o| gone(o.labels(), SESSION_ID_LABEL)) {
        tracing::warn!(secret = %s.name_any(), "destroying a key whose session is gone");
        ignore_not_found(secrets.delete(&s.name_any(), &DeleteParams::default()).await)?;
        swept.push(s.name_any());
    }
    // A worker's node account: its RoleBinding (in the session's
    // namespace) grants nothing once the account is gone.
    for a in accounts.iter().filter(|o| gone(o.labels(), SESSION_ID_LABEL)) {
        ignore_not_found(accounts_api.delete(&a.name_any(), &DeleteParams::default()).await)?;
        swept.push(a.name_any());
    }
    for m in ledgers.iter().filter(|o| gone(o.labels(), ledger::SESSION_LABEL)) {
        ignore_not_found(maps.delete(&m.name_any(), &DeleteParams::default()).await)?;
        swept.push(m.name_any());
    }
    let deadline = Timestamp::now() + retention;
    for m in sealed.iter().filter(|o| gone(o.labels(), SESSION_ID_LABEL) && !o.annotations().contains_key(ERASE_AFTER))
    {
        let is_sealed_keys =
            m.labels().get(SESSION_ID_LABEL).is_some_and(|s| m.name_any() == output_keys::sealed_keys_name(s));
        if is_sealed_keys {
            let patch = json!({"metadata": {"annotations": {ERASE_AFTER: deadline.to_string()}}});
            ignore_not_found(maps.patch(&m.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await)?;
            swept.push(m.name_any());
        }
    }
    Ok(swept)
}

/// Sessions are listed *after* EC2 is described, so anything described
/// belongs to a Sandbox that existed then; missing now means deleted.
pub async fn sweep(ec2: &Ec2, client: &kube::Client) -> Result<Swept> {
    let instances = ec2.describe_cluster_instances().await?;
    let volumes = ec2.describe_cluster_volumes().await?;
    let live = live_sessions(client).await?;
    let mut swept = Swept::default();
    for i in instances.iter().filter(|i| !i.state.is_gone()) {
        if i.session_id.as_ref().is_some_and(|s| !live.contains(s)) {
            tracing::warn!(instance = %i.id, session = ?i.session_id, "terminating an orphaned instance");
            ec2.terminate(&i.id).await?;
            swept.instances.push(i.id.clone());
        }
    }
    for v in volumes {
        if v.session_id.as_ref().is_some_and(|s| !live.contains(s)) {
            tracing::warn!(volume = %v.id, session = ?v.session_id, "deleting an orphaned workspace volume");
            if v.attached_to.is_some() && !v.available {
                ec2.detach(&v.id).await?;
            } else {
                ec2.delete_volume(&v.id).await?;
            }
            swept.volumes.push(v.id);
        }
    }
    Ok(swept)
}

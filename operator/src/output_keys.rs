//! Output keys: the worker of each attempt makes the key that attempt's
//! command output is sealed under and hands it in as a Secret it cannot
//! read back. Here the operator seals each hand-off under the output
//! key-encryption key into the session's sealed output keys (a ConfigMap of
//! ciphertext, one entry per attempt) and deletes the hand-off, so no raw
//! output key stays in the cluster.

use std::collections::BTreeMap;

use hangar_crds::output_keys::{self, HANDOFF_KEY, SESSION_ID_LABEL};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::reflector::ObjectRef;
use serde_json::json;

use crate::context::Context;
use crate::error::Result;

/// How `seal_handoffs` learns whether a hand-off is there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// From the watch cache of hand-off names (`ctx.handoffs`), once it has
    /// listed: a pass of a running session makes no apiserver read while
    /// its worker has handed nothing in (a hand-off's arrival wakes the
    /// session, so it is sealed at once).
    Cached,
    /// From the apiserver: the pass that lets go of the node, which must
    /// not miss one the cache has not shown yet.
    Read,
}

/// Seals every hand-off of attempts `1..=attempt` not settled yet. An
/// earlier attempt with no hand-off is settled too: its instance stopped,
/// so no worker can hand its key in any more, and it is not looked for on
/// every later reconcile.
pub async fn seal_handoffs(
    ctx: &Context,
    session_id: &str,
    node_name: &str,
    attempt: i64,
    lookup: Lookup,
) -> Result<()> {
    let cached = lookup == Lookup::Cached && hangar_runtime::kube_ext::has_listed(&ctx.handoffs);
    let namespace = ctx.settings.system_namespace.as_str();
    let handed_in = |a: i64| {
        let name = output_keys::handoff_secret_name(node_name, session_id, a);
        ctx.handoffs.get(&ObjectRef::new(&name).within(namespace)).is_some()
    };
    let pending: Vec<i64> =
        (1..=attempt).filter(|a| !ctx.is_sealed(session_id, *a)).filter(|a| !cached || handed_in(*a)).collect();
    if pending.is_empty() {
        return Ok(());
    }
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ctx.settings.system_namespace);
    let maps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ctx.settings.system_namespace);
    let sealed_name = output_keys::sealed_keys_name(session_id);
    let sealed = maps.get_opt(&sealed_name).await?;
    let has = |a: i64| {
        sealed
            .as_ref()
            .and_then(|s| s.binary_data.as_ref())
            .is_some_and(|d| d.contains_key(&output_keys::sealed_entry(a)))
    };
    let mut exists = sealed.is_some();
    for a in pending {
        // Only from the session's own node: a hand-off named for another
        // node was made by another session's worker.
        let handoff_name = output_keys::handoff_secret_name(node_name, session_id, a);
        if !has(a) {
            let key =
                secrets.get_opt(&handoff_name).await?.and_then(|h| h.data).and_then(|d| d.get(HANDOFF_KEY).cloned());
            let Some(key) = key else {
                if a < attempt {
                    ctx.mark_sealed(session_id, a);
                }
                continue;
            };
            let entry = ctx.output_kek.seal(&key.0, &output_keys::seal_context(session_id, a))?;
            let data = BTreeMap::from([(output_keys::sealed_entry(a), ByteString(entry))]);
            if exists {
                let patch = json!({"binaryData": data});
                maps.patch(&sealed_name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
            } else {
                let map = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(sealed_name.clone()),
                        labels: Some(BTreeMap::from([(SESSION_ID_LABEL.to_owned(), session_id.to_owned())])),
                        ..Default::default()
                    },
                    binary_data: Some(data),
                    ..Default::default()
                };
                maps.create(&PostParams::default(), &map).await?;
                exists = true;
            }
            tracing::info!(attempt = a, "sealed the attempt's output key under the output key-encryption key");
        }
        hangar_runtime::kube_ext::ignore_not_found(secrets.delete(&handoff_name, &DeleteParams::default()).await)?;
        ctx.mark_sealed(session_id, a);
    }
    Ok(())
}

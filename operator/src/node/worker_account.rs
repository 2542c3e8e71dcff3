//! The worker's per-node account (`hangar_crds::worker_identity`): made
//! when the session's node is prepared, before the node is labelled for the
//! session (so the worker, which waits for the labels, finds it), and
//! removed with the instance. Bound in the session's namespace only, to the
//! chart's session-worker ClusterRole: the worker reads its own session's
//! namespace and nothing else.

use std::collections::BTreeMap;

use hangar_crds::worker_identity::{SESSION_ID_LABEL, account_name};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{RoleBinding, RoleRef, Subject};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};

use crate::context::Context;
use crate::error::Result;
use hangar_runtime::kube_ext::{ignore_already_exists, ignore_not_found};

/// Makes the account of the worker on `node` and binds it in `namespace`.
pub async fn grant(ctx: &Context, node: &str, namespace: &str, session_id: &str) -> Result<()> {
    let name = account_name(node);
    let labels = BTreeMap::from([(SESSION_ID_LABEL.to_owned(), session_id.to_owned())]);
    let system = &ctx.settings.system_namespace;
    let account = ServiceAccount {
        metadata: ObjectMeta { name: Some(name.clone()), labels: Some(labels.clone()), ..Default::default() },
        automount_service_account_token: Some(false),
        ..Default::default()
    };
    let accounts: Api<ServiceAccount> = Api::namespaced(ctx.client.clone(), system);
    ignore_already_exists(accounts.create(&PostParams::default(), &account).await)?;
    let binding = RoleBinding {
        metadata: ObjectMeta { name: Some(name.clone()), labels: Some(labels), ..Default::default() },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: ctx.settings.session_worker_role.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name,
            namespace: Some(system.clone()),
            ..Default::default()
        }]),
    };
    let bindings: Api<RoleBinding> = Api::namespaced(ctx.client.clone(), namespace);
    ignore_already_exists(bindings.create(&PostParams::default(), &binding).await)?;
    Ok(())
}

/// Removes every node account of session `session_id` and its binding in
/// the session's namespace (found by label: the node may no longer be in
/// the status).
pub async fn revoke(ctx: &Context, session_id: &str, namespace: &str) -> Result<()> {
    let accounts: Api<ServiceAccount> = Api::namespaced(ctx.client.clone(), &ctx.settings.system_namespace);
    let bindings: Api<RoleBinding> = Api::namespaced(ctx.client.clone(), namespace);
    let mine = ListParams::default().labels(&format!("{SESSION_ID_LABEL}={session_id}"));
    for account in accounts.list_metadata(&mine).await?.items {
        let name = account.name_any();
        ignore_not_found(bindings.delete(&name, &DeleteParams::default()).await)?;
        ignore_not_found(accounts.delete(&name, &DeleteParams::default()).await)?;
    }
    Ok(())
}

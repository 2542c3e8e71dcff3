//! Where the operator keeps the sessions' command ledgers
//! (`hangar_core::commands::ledger`): ConfigMaps in its own namespace,
//! out of every tenant's reach. The admission webhook reserves places in
//! them; the Command controller numbers in them; a session's ledger goes
//! when the session has ended (nothing is admitted or numbered after).

use hangar_core::commands::ledger;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;

use crate::context::Context;

pub fn api(ctx: &Context) -> Api<ConfigMap> {
    Api::namespaced(ctx.client.clone(), &ctx.settings.system_namespace)
}

/// Deletes the ledger of a session that has ended.
pub async fn forget(ctx: &Context, session_id: &str) -> Result<(), kube::Error> {
    hangar_runtime::json_document::delete(&api(ctx), &ledger::document_name(session_id)).await
}

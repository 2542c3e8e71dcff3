//! Where the operator keeps the sessions' command ledgers
//! (`hangar_core::commands::ledger`): ConfigMaps in its own namespace, out
//! of every tenant's reach, and, in the leader, a copy of each in memory
//! that is the authority while it leads. Admission decisions
//! (`commands::admission`) reserve places in the copy; numbering
//! (`commands::number_session`) writes the copy, numbers and all, to the
//! ConfigMap before it numbers a command. Both take the session's lock, so
//! they see one ledger. A session's ledger goes when the session has ended
//! (nothing is admitted or numbered after).

use hangar_core::commands::ledger::{self, Ledger};
use hangar_runtime::json_document::{self, Read};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;

use crate::context::Context;
use crate::error::Result;

pub fn api(ctx: &Context) -> Api<ConfigMap> {
    Api::namespaced(ctx.client.clone(), &ctx.settings.system_namespace)
}

/// Deletes the ledger of a session that has ended.
pub async fn forget(ctx: &Context, session_id: &str) -> Result<(), kube::Error> {
    json_document::delete(&api(ctx), &ledger::document_name(session_id)).await
}

/// One session's ledger in the leader's memory. Held under the session's
/// lock (`NumberingState::lock_for`).
#[derive(Default)]
pub struct SessionLedger {
    /// The session the copy is of: a re-created Sandbox of the same name is
    /// a new session with a ledger of its own.
    session_id: Option<String>,
    /// The ledger as stored, with its version.
    stored: Option<Read<Ledger>>,
    /// What the ledger holds now: `stored` and the places reserved since.
    pub current: Ledger,
}

impl SessionLedger {
    /// Makes the copy the one of `session_id`, read from the apiserver the
    /// first time (and after another session of the name).
    pub async fn load(&mut self, ctx: &Context, session_id: &str) -> Result<()> {
        if self.session_id.as_deref() == Some(session_id) && self.stored.is_some() {
            return Ok(());
        }
        let stored: Read<Ledger> = json_document::read(&api(ctx), &ledger::document_name(session_id)).await?;
        self.current = stored.document.clone();
        self.stored = Some(stored);
        self.session_id = Some(session_id.to_owned());
        Ok(())
    }

    /// Stores `next` as the session's ledger (compare-and-swap on the
    /// version last read or written); true when written. When another
    /// writer changed it meanwhile (a leader before this one), it is read
    /// again, the places reserved here since kept, and false returned:
    /// decide again on what it holds now.
    pub async fn store(&mut self, ctx: &Context, session_id: &str, next: Ledger) -> Result<bool> {
        self.load(ctx, session_id).await?;
        let stored = self.stored.as_ref().expect("loaded");
        let api = api(ctx);
        let doc = ledger::document_name(session_id);
        match json_document::write(&api, &doc, ledger::document_labels(session_id), stored, &next).await? {
            Some(written) => {
                self.current = next;
                self.stored = Some(written);
                Ok(true)
            }
            None => {
                let fresh: Read<Ledger> = json_document::read(&api, &doc).await?;
                let mut current = fresh.document.clone();
                for e in &self.current.entries {
                    if current.entry(&e.uid).is_none() && e.number.is_none() {
                        current.entries.push(e.clone());
                    }
                }
                self.current = current;
                self.stored = Some(fresh);
                Ok(false)
            }
        }
    }
}

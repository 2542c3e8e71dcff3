//! What the Command controller remembers between reconciles to number
//! commands without gaps. Nothing here is authoritative: a restart loses it
//! and numbering starts again from a fresh list.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// Per session: numbering runs one at a time; uids numbered by this process
/// are remembered so a reconcile of a command whose cached copy predates its
/// number does not list the session again.
#[derive(Default)]
pub struct NumberingState {
    sessions: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    numbered: Mutex<HashSet<String>>,
}

impl NumberingState {
    pub fn lock_for(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner()).entry(key.to_owned()).or_default().clone()
    }

    pub fn is_numbered(&self, uid: &str) -> bool {
        self.numbered.lock().unwrap_or_else(|p| p.into_inner()).contains(uid)
    }

    pub fn mark(&self, uid: String) {
        self.numbered.lock().unwrap_or_else(|p| p.into_inner()).insert(uid);
    }
}

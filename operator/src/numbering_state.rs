//! What the leader holds of each session's commands between calls: the
//! session's ledger in memory (the places admission reserved and the
//! numbers given, `command_ledger::SessionLedger`) under one lock per
//! session, the uids it numbered, and the ends the webhook announced.
//! A restart loses the memory, never a decision: the ledger is read again
//! from its ConfigMap, and a command stored without a written place is
//! counted all the same (`hangar_core::commands::ledger::Ledger::counts`).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::command_ledger::SessionLedger;

/// How long an announced end is trusted without the watch showing it (the
/// apiserver may have refused the write after the webhook allowed it).
const ENDING_FOR: Duration = Duration::from_secs(60);

#[derive(Default)]
pub struct NumberingState {
    sessions: Mutex<HashMap<String, Arc<tokio::sync::Mutex<SessionLedger>>>>,
    numbered: Mutex<HashSet<String>>,
    endings: Mutex<HashMap<String, Instant>>,
}

impl NumberingState {
    /// The ledger of session `key` (`<namespace>/<name>`), to lock.
    pub fn lock_for(&self, key: &str) -> Arc<tokio::sync::Mutex<SessionLedger>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner()).entry(key.to_owned()).or_default().clone()
    }

    /// Forgets a session's ledger copy (its session has ended).
    pub fn forget(&self, key: &str) {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
    }

    pub fn is_numbered(&self, uid: &str) -> bool {
        self.numbered.lock().unwrap_or_else(|p| p.into_inner()).contains(uid)
    }

    pub fn mark(&self, uid: String) {
        self.numbered.lock().unwrap_or_else(|p| p.into_inner()).insert(uid);
    }

    /// Session `session_id`'s end was admitted.
    pub fn mark_ending(&self, session_id: &str) {
        let mut endings = self.endings.lock().unwrap_or_else(|p| p.into_inner());
        endings.retain(|_, at| at.elapsed() < ENDING_FOR);
        endings.insert(session_id.to_owned(), Instant::now());
    }

    /// Whether session `session_id`'s end was admitted a moment ago.
    pub fn is_ending(&self, session_id: &str) -> bool {
        self.endings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(session_id)
            .is_some_and(|at| at.elapsed() < ENDING_FOR)
    }
}

//! The command ledger of one session: every command admitted for it, by
//! uid, and the number each was given.
//!
//! Limits and numbers are taken from the ledger, never from what a tenant
//! can edit or delete: it is kept in the operator's namespace under the
//! session's uid (not its name, so a re-created Sandbox of the same name
//! starts a new ledger and never sees the old session's commands).
//!
//! - The operator's leader decides each create (the webhook asks it) and
//!   adds an entry for each admitted one, in its memory: the apiserver gives
//!   the object its uid before validating admission, and the entry is
//!   written with the command's number once the command is stored. A live
//!   command of the session the ledger does not hold (admitted by a leader
//!   that stopped before it wrote) counts all the same.
//! - An entry whose command never appeared within [`PENDING_GRACE_SECONDS`]
//!   (the create failed after admission: an existing name, a later
//!   refusal) is released.
//! - The operator gives numbers in the ledger first, then on the commands;
//!   a numbered entry is kept forever, so deleting a command frees no place
//!   and no number is given twice.
//! - A repeated review of the same object (same uid) takes no second place;
//!   a create of a name the session already has takes none (the apiserver
//!   refuses it as AlreadyExists).

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::limits::Counts;

/// How long a reservation waits for its command to appear. The apiserver
/// stores the object right after validating admission (webhooks time out
/// within 30 s), so a command that has not appeared by then never will.
pub const PENDING_GRACE_SECONDS: i64 = 30;

/// The name of session `session_id`'s ledger (a ConfigMap in the
/// operator's namespace).
pub fn document_name(session_id: &str) -> String {
    format!("hangar-commands-{session_id}")
}

/// The label that marks a ledger, valued with its session's uid.
pub const SESSION_LABEL: &str = "hangar.dev/command-ledger-of";

/// The labels of session `session_id`'s ledger.
pub fn document_labels(session_id: &str) -> std::collections::BTreeMap<String, String> {
    [
        (SESSION_LABEL.to_owned(), session_id.to_owned()),
        ("app.kubernetes.io/managed-by".to_owned(), "hangar".to_owned()),
    ]
    .into()
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    #[serde(default)]
    pub entries: Vec<Entry>,
}

/// One admitted command.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    pub uid: String,
    pub name: String,
    /// Unix seconds at admission.
    pub admitted_at: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub number: Option<i64>,
    /// Who sent it: the username the apiserver told the webhook (a session
    /// token's is `hangar:token:<namespace>:<name>`). The operator copies it
    /// to `status.sender` and `status.sentBy`; no tenant can edit it here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender: Option<String>,
}

/// A command of the session as it exists now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Live {
    pub uid: String,
    pub name: String,
    pub finished: bool,
    /// Unix seconds of creation: numbers follow creation order.
    pub created: i64,
    /// The session it was numbered for (`status.sandboxUid`); `None` before
    /// its number.
    pub session_uid: Option<String>,
}

impl Live {
    pub fn of(c: &hangar_crds::Command) -> Self {
        Live {
            uid: c.metadata.uid.clone().unwrap_or_default(),
            name: c.metadata.name.clone().unwrap_or_default(),
            finished: c.status.as_ref().and_then(|s| s.phase).is_some_and(hangar_crds::CommandPhase::is_final),
            created: c.metadata.creation_timestamp.as_ref().map_or(0, |t| t.0.as_second()),
            session_uid: c.status.as_ref().and_then(|s| s.sandbox_uid.clone()),
        }
    }
}

/// A create to decide: the object's uid and name, and who sends it.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Create {
    pub uid: String,
    pub name: String,
    pub sender: Option<String>,
}

/// What a create does to the ledger when it is allowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// A new entry holds its place.
    Reserved,
    /// Already in the ledger (a repeated review): nothing changes.
    Repeated,
    /// The session already has a command of this name: the apiserver will
    /// refuse the create, so it takes no place.
    NameTaken,
}

impl Entry {
    fn pending_at(&self, now: i64) -> bool {
        self.number.is_none() && now - self.admitted_at < PENDING_GRACE_SECONDS
    }
}

impl Ledger {
    pub fn entry(&self, uid: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.uid == uid)
    }

    /// The highest number given so far (0 before the first).
    pub fn highest_number(&self) -> i64 {
        self.entries.iter().filter_map(|e| e.number).max().unwrap_or(0)
    }

    /// The session's counts: admitted are the numbered entries, and the
    /// unnumbered ones whose command exists or may still appear;
    /// unfinished are those whose command exists and has not finished, and
    /// those that may still appear. A deleted command is no longer
    /// unfinished but stays admitted once it had a number. A command not
    /// numbered yet and not finished that the ledger does not hold counts
    /// as admitted and unfinished: its reservation was never written (or
    /// it was never admitted, and numbering cancels it), and a limit must
    /// never stretch.
    pub fn counts(&self, live: &[Live], now: i64) -> Counts {
        let mut counts = Counts::default();
        let unrecorded =
            live.iter().filter(|l| self.entry(&l.uid).is_none() && l.session_uid.is_none() && !l.finished).count();
        counts.admitted += unrecorded as i64;
        counts.unfinished += unrecorded as i64;
        let live: HashMap<&str, &Live> = live.iter().map(|l| (l.uid.as_str(), l)).collect();
        for e in &self.entries {
            let command = live.get(e.uid.as_str());
            if e.number.is_some() || command.is_some() || e.pending_at(now) {
                counts.admitted += 1;
            }
            let unfinished = match command {
                Some(c) => !c.finished,
                None => e.pending_at(now),
            };
            counts.unfinished += i64::from(unfinished);
        }
        counts
    }

    /// Drops reservations whose command never appeared; true if any.
    pub fn release_expired(&mut self, live: &[Live], now: i64) -> bool {
        let live: HashSet<&str> = live.iter().map(|l| l.uid.as_str()).collect();
        let before = self.entries.len();
        self.entries.retain(|e| e.number.is_some() || live.contains(e.uid.as_str()) || e.pending_at(now));
        self.entries.len() != before
    }

    /// Where `create` would go, before the limits are asked: `None` when
    /// it needs a new place.
    pub fn existing_place(&self, create: &Create, live: &[Live], now: i64) -> Option<Place> {
        if self.entry(&create.uid).is_some() {
            return Some(Place::Repeated);
        }
        let live_uids: HashSet<&str> = live.iter().map(|l| l.uid.as_str()).collect();
        let name_live = live.iter().any(|l| l.name == create.name);
        // Two creates of one name racing: at most one is stored, and
        // `bind` gives the reservation to whichever it was.
        let name_pending = self
            .entries
            .iter()
            .any(|e| e.name == create.name && !live_uids.contains(e.uid.as_str()) && e.pending_at(now));
        (name_live || name_pending).then_some(Place::NameTaken)
    }

    /// Takes in a command stored without a written place (admitted by a
    /// leader that stopped before it wrote one) if the limits have room for
    /// it, counted on the ledger's own commands (not the other strays: the
    /// caller adopts them oldest first); false when they do not (it is then
    /// never run).
    pub fn adopt(&mut self, command: &Live, live: &[Live], now: i64) -> bool {
        let others: Vec<Live> = live
            .iter()
            .filter(|l| l.uid != command.uid && (self.entry(&l.uid).is_some() || l.session_uid.is_some()))
            .cloned()
            .collect();
        if super::limits::room_for_one_more("", self.counts(&others, now)).is_err() {
            return false;
        }
        self.entries.push(Entry {
            uid: command.uid.clone(),
            name: command.name.clone(),
            admitted_at: now,
            number: None,
            sender: None,
        });
        true
    }

    /// Adds the reservation of an admitted create.
    pub fn reserve(&mut self, create: &Create, now: i64) {
        self.entries.push(Entry {
            uid: create.uid.clone(),
            name: create.name.clone(),
            admitted_at: now,
            number: None,
            sender: create.sender.clone(),
        });
    }

    /// A command whose uid is not in the ledger but whose name is, on a
    /// reservation no command holds: two creates of one name raced and the
    /// unreserved one was stored. The reservation passes to it. True if any
    /// entry changed.
    pub fn bind(&mut self, live: &[Live]) -> bool {
        let mut changed = false;
        for l in live {
            if self.entry(&l.uid).is_some() {
                continue;
            }
            let held: HashSet<String> = live.iter().map(|l| l.uid.clone()).collect();
            if let Some(e) =
                self.entries.iter_mut().find(|e| e.name == l.name && e.number.is_none() && !held.contains(&e.uid))
            {
                e.uid = l.uid.clone();
                // The stored create was another request, maybe another
                // sender's: who sent it is not known here.
                e.sender = None;
                changed = true;
            }
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(uid: &str, name: &str, finished: bool) -> Live {
        Live { uid: uid.into(), name: name.into(), finished, created: 0, session_uid: Some("s".into()) }
    }

    fn create(uid: &str, name: &str) -> Create {
        Create { uid: uid.into(), name: name.into(), sender: None }
    }

    fn ledger(entries: &[(&str, &str, i64, Option<i64>)]) -> Ledger {
        Ledger {
            entries: entries
                .iter()
                .map(|(uid, name, at, number)| Entry {
                    uid: (*uid).into(),
                    name: (*name).into(),
                    admitted_at: *at,
                    number: *number,
                    sender: None,
                })
                .collect(),
        }
    }

    #[test]
    fn a_deleted_numbered_command_stays_admitted_but_is_no_longer_unfinished() {
        let l = ledger(&[("u1", "a", 0, Some(1)), ("u2", "b", 0, Some(2))]);
        // "b" was deleted while running; "a" still runs.
        let counts = l.counts(&[live("u1", "a", false)], 1000);
        assert_eq!(counts, Counts { admitted: 2, unfinished: 1 });
    }

    #[test]
    fn a_reservation_counts_until_its_command_appears_or_the_grace_ends() {
        let mut l = ledger(&[("u1", "a", 100, None)]);
        assert_eq!(l.counts(&[], 100 + PENDING_GRACE_SECONDS - 1), Counts { admitted: 1, unfinished: 1 });
        assert_eq!(l.counts(&[], 100 + PENDING_GRACE_SECONDS), Counts { admitted: 0, unfinished: 0 });
        assert!(!l.release_expired(&[], 100 + PENDING_GRACE_SECONDS - 1));
        assert!(l.release_expired(&[], 100 + PENDING_GRACE_SECONDS));
        assert!(l.entries.is_empty());
        // One whose command exists is never released, numbered or not.
        let mut l = ledger(&[("u1", "a", 0, None)]);
        assert!(!l.release_expired(&[live("u1", "a", true)], 1000));
        assert_eq!(l.counts(&[live("u1", "a", true)], 1000), Counts { admitted: 1, unfinished: 0 });
    }

    #[test]
    fn a_repeated_review_and_an_existing_name_take_no_place() {
        let l = ledger(&[("u1", "a", 0, Some(1)), ("u2", "b", 995, None)]);
        let now_live = [live("u1", "a", false)];
        assert_eq!(l.existing_place(&create("u1", "a"), &now_live, 1000), Some(Place::Repeated));
        assert_eq!(l.existing_place(&create("u9", "a"), &now_live, 1000), Some(Place::NameTaken));
        // "b" is reserved and not stored yet: a second create of "b" races it.
        assert_eq!(l.existing_place(&create("u8", "b"), &now_live, 1000), Some(Place::NameTaken));
        assert_eq!(l.existing_place(&create("u7", "c"), &now_live, 1000), None);
        // Once the first "b" reservation has expired, a new "b" needs a place.
        assert_eq!(l.existing_place(&create("u8", "b"), &now_live, 995 + PENDING_GRACE_SECONDS), None);
    }

    #[test]
    fn the_stored_one_of_two_racing_creates_takes_the_reservation() {
        let mut l = ledger(&[("u1", "a", 0, None)]);
        assert!(l.bind(&[live("u2", "a", false)]));
        assert_eq!(l.entries[0].uid, "u2");
        // A command of a name never reserved stays unbound.
        assert!(!l.bind(&[live("u2", "a", false), live("u3", "z", false)]));
        assert!(l.entry("u3").is_none());
        // A numbered entry is never rebound.
        let mut l = ledger(&[("u1", "a", 0, Some(1))]);
        assert!(!l.bind(&[live("u2", "a", false)]));
    }

    #[test]
    fn an_unrecorded_unnumbered_command_counts_and_an_earlier_sessions_does_not() {
        let l = ledger(&[("u1", "a", 0, Some(1))]);
        let unrecorded = Live { uid: "u2".into(), name: "b".into(), finished: false, created: 0, session_uid: None };
        let earlier =
            Live { session_uid: Some("old".into()), uid: "u3".into(), name: "c".into(), ..unrecorded.clone() };
        let settled = Live { finished: true, uid: "u4".into(), name: "d".into(), ..unrecorded.clone() };
        let counts = l.counts(&[live("u1", "a", false), unrecorded, earlier, settled], 1000);
        assert_eq!(counts, Counts { admitted: 2, unfinished: 2 });
    }

    #[test]
    fn an_unrecorded_command_is_adopted_only_while_the_limits_have_room() {
        let stray =
            |uid: &str| Live { uid: uid.into(), name: uid.into(), finished: false, created: 0, session_uid: None };
        // 63 unfinished and numbered: room for one more, not two.
        let mut l = Ledger {
            entries: (1..=63)
                .map(|n| Entry {
                    uid: format!("n{n}"),
                    name: format!("n{n}"),
                    admitted_at: 0,
                    number: Some(n),
                    sender: None,
                })
                .collect(),
        };
        let mut live: Vec<Live> = (1..=63).map(|n| live(&format!("n{n}"), &format!("n{n}"), false)).collect();
        live.extend([stray("x"), stray("y")]);
        assert!(l.adopt(&live[63].clone(), &live, 1000));
        assert!(!l.adopt(&live[64].clone(), &live, 1000), "the 65th unfinished is never run");
        assert!(l.entry("x").is_some() && l.entry("y").is_none());
    }

    #[test]
    fn the_ledger_reads_back_what_it_wrote() {
        let l = ledger(&[("u1", "a", 7, Some(1)), ("u2", "b", 8, None)]);
        let text = serde_json::to_string(&l).unwrap();
        assert_eq!(serde_json::from_str::<Ledger>(&text).unwrap(), l);
        assert!(text.contains("\"admittedAt\":7"));
    }
}

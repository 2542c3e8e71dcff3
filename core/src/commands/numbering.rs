//! Numbering: the commands of a session get 1, 2, 3… in the order they were
//! created. Numbers are given in the session's ledger first (only the
//! leader-elected operator numbers, one session at a time), then copied to
//! the commands: the ledger keeps every number ever given, so a deleted
//! command's number is never given again, and a crash between the two
//! writes repeats the copy, not the choice. The CRD refuses to change a
//! number once set.

use super::ledger::{Ledger, Live};

/// Numbers every live command that holds a ledger entry without one, in
/// the order they were admitted, after the highest number given. True if
/// any was given.
///
/// Admission order is the ledger's own: the webhook appends each entry
/// by compare-and-swap, so their order is exact, where creationTimestamp
/// (one-second resolution) would tie commands made in the same second.
pub fn assign(ledger: &mut Ledger, live: &[Live]) -> bool {
    let mut waiting: Vec<(usize, &Live)> = live
        .iter()
        .filter_map(|l| {
            let at = ledger.entries.iter().position(|e| e.uid == l.uid)?;
            ledger.entries[at].number.is_none().then_some((at, l))
        })
        .collect();
    waiting.sort_by_key(|(at, _)| *at);
    let mut next = ledger.highest_number() + 1;
    for (_, l) in &waiting {
        if let Some(e) = ledger.entries.iter_mut().find(|e| e.uid == l.uid) {
            e.number = Some(next);
            next += 1;
        }
    }
    !waiting.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::ledger::Entry;

    fn entry(uid: &str, number: Option<i64>) -> Entry {
        Entry { uid: uid.into(), name: uid.into(), admitted_at: 0, number, sender: None }
    }

    fn live(uid: &str, created: i64) -> Live {
        Live { uid: uid.into(), name: uid.into(), finished: false, created, session_uid: None }
    }

    #[test]
    fn unnumbered_commands_continue_after_the_highest_in_admission_order() {
        // Admitted c, then a, d, b; made within one second (the same
        // creationTimestamp), and named against that order.
        let mut l = Ledger { entries: vec![entry("c", None), entry("a", Some(2)), entry("d", None), entry("b", None)] };
        let live = [live("b", 1), live("a", 1), live("d", 1), live("c", 1)];
        assert!(assign(&mut l, &live));
        let number = |uid: &str| l.entry(uid).unwrap().number;
        assert_eq!([number("c"), number("d"), number("b")], [Some(3), Some(4), Some(5)]);
        assert!(!assign(&mut l, &live), "a second pass gives nothing");
    }

    #[test]
    fn a_deleted_commands_number_is_never_given_again_and_unbound_ones_get_none() {
        // Number 7 was the highest; its command is gone.
        let mut l = Ledger { entries: vec![entry("gone", Some(7)), entry("new", None)] };
        assert!(assign(&mut l, &[live("new", 9), live("stranger", 1)]));
        assert_eq!(l.entry("new").unwrap().number, Some(8));
        assert!(l.entry("stranger").is_none());
    }

    #[test]
    fn a_fresh_session_starts_at_one() {
        let mut l = Ledger { entries: vec![entry("x", None)] };
        assign(&mut l, &[live("x", 0)]);
        assert_eq!(l.entry("x").unwrap().number, Some(1));
    }
}

//! What the admission webhook decides, as pure functions: each takes what
//! was read and answers allowed or a [`Refusal`] carrying the contract's
//! error code. The webhook only reads and answers.

use hangar_crds::{ErrorCode, Sandbox};

use crate::commands::ledger::{Create, Ledger, Live, Place};
use crate::commands::limits::{self, Counts};
pub use crate::refusal::Refusal;

/// Whether session `name` takes commands at all: it exists and has not
/// ended (a paused session queues them).
pub fn session_takes_commands(namespace: &str, name: &str, sandbox: Option<&Sandbox>) -> Result<(), Refusal> {
    let Some(sandbox) = sandbox else {
        return Err(Refusal::new(ErrorCode::SandboxNotFound, format!("no Sandbox {name} in namespace {namespace}")));
    };
    if sandbox.has_ended() {
        return Err(Refusal::new(
            ErrorCode::SandboxEnded,
            format!("session {name} has ended; it takes no more commands"),
        ));
    }
    Ok(())
}

/// A new Command for session `name`: the session takes commands, and its
/// limits hold with one more.
pub fn command_create(namespace: &str, name: &str, sandbox: Option<&Sandbox>, counts: Counts) -> Result<(), Refusal> {
    session_takes_commands(namespace, name, sandbox)?;
    limits::room_for_one_more(name, counts)
}

/// Decides creates that arrive together, in arrival order, on one reading
/// of the session: each admitted one that needs a place reserves it in
/// `ledger` before the next is decided. Expired reservations are released
/// first. A create already in the ledger (a repeated review) or of a name
/// the session has takes no place. The caller writes `ledger` back when
/// any place was reserved.
pub fn command_creates(
    namespace: &str,
    name: &str,
    sandbox: Option<&Sandbox>,
    ledger: &mut Ledger,
    creates: &[Create],
    live: &[Live],
    now: i64,
) -> Vec<Result<Place, Refusal>> {
    ledger.release_expired(live, now);
    let mut counts = ledger.counts(live, now);
    creates
        .iter()
        .map(|create| {
            session_takes_commands(namespace, name, sandbox)?;
            if let Some(place) = ledger.existing_place(create, live, now) {
                return Ok(place);
            }
            limits::room_for_one_more(name, counts)?;
            ledger.reserve(create, now);
            counts.admitted += 1;
            counts.unfinished += 1;
            Ok(Place::Reserved)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(yaml: &str) -> Sandbox {
        serde_yaml::from_str(yaml).unwrap()
    }

    fn counts(admitted: i64, finished: i64) -> Counts {
        Counts { admitted, unfinished: admitted - finished }
    }

    const RUNNING: &str =
        "metadata: {name: box, namespace: ns}\nspec: {mode: commands, image: i}\nstatus: {phase: running}\n";

    #[test]
    fn a_missing_or_ended_session_takes_no_command() {
        assert_eq!(command_create("ns", "box", None, counts(0, 0)).unwrap_err().code, ErrorCode::SandboxNotFound);
        for s in [
            "metadata: {name: box}\nspec: {mode: commands, image: i, state: Ended}\n",
            "metadata: {name: box}\nspec: {mode: commands, image: i}\nstatus: {phase: stopping}\n",
            "metadata: {name: box}\nspec: {mode: commands, image: i}\nstatus: {phase: ended}\n",
            "metadata: {name: box}\nspec: {mode: commands, image: i}\nstatus: {phase: failed}\n",
            "metadata: {name: box, deletionTimestamp: '2026-11-30T10:00:00Z'}\nspec: {mode: commands, image: i}\n",
        ] {
            let refused = command_create("ns", "box", Some(&sandbox(s)), counts(0, 0)).unwrap_err();
            assert_eq!(refused.code, ErrorCode::SandboxEnded, "{s}");
        }
        let paused = sandbox(
            "metadata: {name: box}\nspec: {mode: commands, image: i, state: Paused}\nstatus: {phase: paused}\n",
        );
        assert!(command_create("ns", "box", Some(&paused), counts(0, 0)).is_ok(), "a paused session queues commands");
    }

    fn creates(n: usize) -> Vec<Create> {
        (0..n).map(|i| Create { uid: format!("u{i}"), name: format!("c{i}"), sender: None }).collect()
    }

    #[test]
    fn a_burst_is_admitted_up_to_the_unfinished_limit_and_a_repeat_takes_no_place() {
        let s = sandbox(RUNNING);
        let mut ledger = Ledger::default();
        let mut burst = creates(70);
        // The apiserver retried one review: same object, same uid.
        burst.insert(10, burst[3].clone());
        let decided = command_creates("ns", "box", Some(&s), &mut ledger, &burst, &[], 1000);
        assert_eq!(decided.iter().filter(|d| d == &&Ok(Place::Reserved)).count(), 64);
        assert_eq!(decided[10], Ok(Place::Repeated));
        assert_eq!(decided.last().unwrap().as_ref().unwrap_err().code, ErrorCode::SandboxCommandLimit);
        assert_eq!(ledger.entries.len(), 64);
    }

    #[test]
    fn the_248th_is_refused_though_commands_were_deleted() {
        let s = sandbox(RUNNING);
        let mut ledger = Ledger::default();
        for round in 0..4 {
            let batch: Vec<Create> = (0..64)
                .map(|i| Create { uid: format!("u{round}-{i}"), name: format!("c{round}-{i}"), sender: None })
                .collect();
            command_creates("ns", "box", Some(&s), &mut ledger, &batch, &[], 1000);
            for (n, e) in ledger.entries.iter_mut().enumerate() {
                e.number = Some(n as i64 + 1);
            }
        }
        // 247 admitted, numbered, and every command deleted since.
        assert_eq!(ledger.entries.len(), 247);
        let refused = command_creates("ns", "box", Some(&s), &mut ledger, &creates(1), &[], 2000);
        assert_eq!(refused[0].as_ref().unwrap_err().code, ErrorCode::SandboxCommandLimit);
    }

    #[test]
    fn the_248th_and_the_65th_unfinished_are_refused() {
        let s = sandbox(RUNNING);
        assert!(command_create("ns", "box", Some(&s), counts(246, 200)).is_ok(), "the 247th");
        let r = command_create("ns", "box", Some(&s), counts(247, 247)).unwrap_err();
        assert_eq!(r.code, ErrorCode::SandboxCommandLimit);
        assert!(r.message().starts_with("sandbox_command_limit: a session takes at most 247"));
        assert!(command_create("ns", "box", Some(&s), counts(63, 0)).is_ok(), "the 64th unfinished");
        let r = command_create("ns", "box", Some(&s), counts(64, 0)).unwrap_err();
        assert!(r.message().starts_with("sandbox_command_limit: at most 64"), "{}", r.message());
        assert!(command_create("ns", "box", Some(&s), counts(100, 40)).is_ok(), "finished ones free a place");
    }
}

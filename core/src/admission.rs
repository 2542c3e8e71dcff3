//! What the admission webhook decides, as pure functions: each takes what
//! was read and answers allowed or a [`Refusal`] carrying the contract's
//! error code. The webhook only reads and answers.

use hangar_crds::{ErrorCode, Sandbox};

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

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(yaml: &str) -> Sandbox {
        serde_yaml::from_str(yaml).unwrap()
    }

    fn counts(admitted: i64, finished: i64) -> Counts {
        Counts { admitted, finished }
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

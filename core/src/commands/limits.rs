//! A session's command limits: at most 247 commands in all, at most 64 not
//! yet finished, at most 16 running at once.

use hangar_crds::ErrorCode;
pub use hangar_crds::command::{MAX_PER_SESSION, MAX_RUNNING, MAX_UNFINISHED};

use crate::refusal::Refusal;

/// How many commands a session has had admitted, and how many of them have
/// not finished (see `ledger::Ledger::counts`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub admitted: i64,
    pub unfinished: i64,
}

/// Whether one more command fits.
pub fn room_for_one_more(name: &str, counts: Counts) -> Result<(), Refusal> {
    if counts.admitted >= MAX_PER_SESSION {
        return Err(Refusal::new(
            ErrorCode::SandboxCommandLimit,
            format!("a session takes at most {MAX_PER_SESSION} commands; {name} has had {}", counts.admitted),
        ));
    }
    if counts.unfinished >= MAX_UNFINISHED {
        return Err(Refusal::new(
            ErrorCode::SandboxCommandLimit,
            format!(
                "at most {MAX_UNFINISHED} commands of a session may be unfinished; {name} has {}",
                counts.unfinished
            ),
        ));
    }
    Ok(())
}

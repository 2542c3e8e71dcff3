//! A session's command limits: at most 247 commands in all, at most 64 not
//! yet finished, at most 16 running at once.

use hangar_crds::ErrorCode;
pub use hangar_crds::command::{MAX_PER_SESSION, MAX_RUNNING, MAX_UNFINISHED};

use crate::refusal::Refusal;

/// How many commands a session has had admitted, and how many of them have
/// finished.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub admitted: i64,
    pub finished: i64,
}

impl Counts {
    pub fn unfinished(self) -> i64 {
        self.admitted - self.finished
    }
}

/// Whether one more command fits.
pub fn room_for_one_more(name: &str, counts: Counts) -> Result<(), Refusal> {
    if counts.admitted >= MAX_PER_SESSION {
        return Err(Refusal::new(
            ErrorCode::SandboxCommandLimit,
            format!("a session takes at most {MAX_PER_SESSION} commands; {name} has had {}", counts.admitted),
        ));
    }
    if counts.unfinished() >= MAX_UNFINISHED {
        return Err(Refusal::new(
            ErrorCode::SandboxCommandLimit,
            format!(
                "at most {MAX_UNFINISHED} commands of a session may be unfinished; {name} has {}",
                counts.unfinished()
            ),
        ));
    }
    Ok(())
}

/// Decides `n` creates that arrive together, in order, on one reading of
/// the counts: each admitted one takes a place before the next is decided.
/// Returns the decisions and how many were admitted.
pub fn decide_in_order(
    n: usize,
    counts: Counts,
    mut decide: impl FnMut(Counts) -> Result<(), Refusal>,
) -> (Vec<Result<(), Refusal>>, i64) {
    let mut admitted = 0;
    let decisions = (0..n)
        .map(|_| {
            let d = decide(Counts { admitted: counts.admitted + admitted, ..counts });
            admitted += i64::from(d.is_ok());
            d
        })
        .collect();
    (decisions, admitted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_admitted_up_to_the_unfinished_limit_and_no_further() {
        let (decisions, admitted) =
            decide_in_order(70, Counts { admitted: 10, finished: 0 }, |c| room_for_one_more("box", c));
        assert_eq!(admitted, 54, "64 unfinished in all");
        assert!(decisions[..54].iter().all(Result::is_ok));
        assert!(decisions[54..].iter().all(|d| d.as_ref().unwrap_err().code == ErrorCode::SandboxCommandLimit));
    }

    #[test]
    fn a_burst_stops_at_the_247th() {
        let (_, admitted) =
            decide_in_order(10, Counts { admitted: 240, finished: 230 }, |c| room_for_one_more("box", c));
        assert_eq!(admitted, 7);
    }
}

//! The command runner's decisions, with no I/O: which commands to hand over
//! next, what status each supervisor message means, and how to settle the
//! commands marked running when a supervisor says hello. The runner (the
//! parent module) reads the watch, the journal and the socket, asks these
//! functions, and writes what they decide.
//!
//! A status here is a `CommandStatus` used as a merge patch: the fields
//! left `None` are not sent, and stay as they are on the object.

use hangar_crds::command::MAX_RUNNING;
use hangar_crds::{Command, CommandPhase, CommandStatus};
use hangar_supervisor_protocol::{EndedBy, FromSupervisor, Hello, ToSupervisor};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// The command's number in the session, which is its id on the supervisor.
pub fn number(c: &Command) -> Option<u32> {
    c.status.as_ref().and_then(|s| s.number).and_then(|n| u32::try_from(n).ok())
}

pub fn phase(c: &Command) -> Option<CommandPhase> {
    c.status.as_ref().and_then(|s| s.phase)
}

/// Runs in `attempt` and has not ended.
pub fn live_here(c: &Command, attempt: i64) -> bool {
    matches!(phase(c), Some(CommandPhase::Running | CommandPhase::Cancelling))
        && c.status.as_ref().and_then(|s| s.attempt) == Some(attempt)
}

/// No command of `attempt` is still running: a pause may close the
/// workspace.
pub fn drained<'a>(commands: impl IntoIterator<Item = &'a Command>, attempt: i64) -> bool {
    !commands.into_iter().any(|c| live_here(c, attempt))
}

/// The queued commands to hand over now, by number: as many as
/// `MAX_RUNNING` leaves room for beside those live in `attempt`. A queued
/// command with cancel set is never handed over.
pub fn to_hand_over<'a>(commands: impl IntoIterator<Item = &'a Command>, attempt: i64) -> Vec<(u32, &'a Command)> {
    let mut running = 0;
    let mut queued = Vec::new();
    for c in commands {
        if live_here(c, attempt) {
            running += 1;
        } else if phase(c) == Some(CommandPhase::Queued)
            && !c.spec.cancel
            && let Some(n) = number(c)
        {
            queued.push((n, c));
        }
    }
    queued.sort_by_key(|(n, _)| *n);
    queued.truncate(MAX_RUNNING.saturating_sub(running));
    queued
}

/// The live commands of `attempt` whose cancel is set: each is marked
/// `cancelling` (if still `running`) and the supervisor is told.
pub fn to_cancel<'a>(commands: impl IntoIterator<Item = &'a Command>, attempt: i64) -> Vec<(u32, &'a Command)> {
    commands
        .into_iter()
        .filter(|c| c.spec.cancel && live_here(c, attempt))
        .filter_map(|c| Some((number(c)?, c)))
        .collect()
}

/// The Run that hands command `n` over to the supervisor.
pub fn run(c: &Command, n: u32) -> ToSupervisor {
    ToSupervisor::Run {
        id: n,
        argv: c.spec.argv.clone(),
        env: c.spec.env.iter().map(|e| (e.name.clone(), e.value.clone())).collect(),
        cwd: c.spec.working_dir.clone(),
        timeout_seconds: c.spec.timeout_seconds.max(1) as u64,
    }
}

/// The status a command gets just before it is handed over (and
/// journalled); a crash in between is settled by `after_hello`.
pub fn running(attempt: i64, now: Time) -> CommandStatus {
    CommandStatus {
        phase: Some(CommandPhase::Running),
        attempt: Some(attempt),
        started_at: Some(now),
        ..Default::default()
    }
}

/// A running command whose cancel is set, until the supervisor reports it
/// ended.
pub fn cancelling() -> CommandStatus {
    CommandStatus { phase: Some(CommandPhase::Cancelling), ..Default::default() }
}

/// How a command ended.
#[derive(Clone, Debug, PartialEq)]
pub struct Ending {
    pub phase: CommandPhase,
    pub exit_code: Option<i32>,
    pub reason: Option<String>,
}

impl Ending {
    fn new(phase: CommandPhase, exit_code: Option<i32>, reason: Option<&str>) -> Self {
        Self { phase, exit_code, reason: reason.map(str::to_owned) }
    }

    /// The final status: when it ended and, when known, how many bytes of
    /// output it left.
    pub fn status(self, now: Time, output_bytes: Option<u64>) -> CommandStatus {
        CommandStatus {
            phase: Some(self.phase),
            finished_at: Some(now),
            output_bytes: output_bytes.map(|b| i64::try_from(b).unwrap_or(i64::MAX)),
            exit_code: self.exit_code,
            reason: self.reason,
            ..Default::default()
        }
    }
}

/// The final status of a process that ended: who ended it decides.
pub fn ended(ended_by: EndedBy, exit_code: Option<i32>, signal: Option<i32>) -> Ending {
    match ended_by {
        EndedBy::Itself => {
            Ending { phase: CommandPhase::Exited, exit_code, reason: signal.map(|s| format!("ended by signal {s}")) }
        }
        EndedBy::Timeout => Ending::new(CommandPhase::TimedOut, None, Some("ran past timeoutSeconds")),
        EndedBy::Cancel => Ending::new(CommandPhase::Cancelled, None, Some("cancelled while running")),
        EndedBy::KillAll => Ending::new(CommandPhase::KilledAtPause, None, Some("the session paused while it ran")),
    }
}

/// The command a supervisor message ends, and how. `None` for a message
/// that changes no status: output (written to the store), a start (the
/// command was marked `running` before it was handed over), the agent's own
/// exit (mode agent, no Command).
pub fn ending(msg: &FromSupervisor) -> Option<(u32, Ending)> {
    match msg {
        FromSupervisor::Failed { id, message } => Some((
            *id,
            Ending {
                phase: CommandPhase::Exited,
                exit_code: Some(127),
                reason: Some(format!("cannot start: {message}")),
            },
        )),
        FromSupervisor::Exited { id, exit_code, signal, ended_by } => {
            Some((*id, ended(*ended_by, *exit_code, *signal)))
        }
        FromSupervisor::Started { .. } | FromSupervisor::Output { .. } | FromSupervisor::AgentExited { .. } => None,
    }
}

/// What to do, after a supervisor's hello, with a command marked running.
#[derive(Clone, Debug, PartialEq)]
pub enum Recovery {
    /// The supervisor has it: it keeps running, and its output and exit
    /// come again (unacknowledged).
    Keep,
    /// Marked running but never handed over: hand it over now.
    HandOver,
    /// It cannot be running any more: record this final status.
    Settle(Box<CommandStatus>),
}

/// Settles every command marked running (or cancelling) against the hello
/// of a (re)connected supervisor, in the crash-safety rules of the runner:
/// - one of an earlier attempt ran in an instance that is gone:
///   `outcome_unknown`;
/// - one the supervisor knows keeps running;
/// - one journalled for another boot ran in a container that restarted:
///   `outcome_unknown`;
/// - any other was never handed over (or its Run never arrived): during a
///   pause it ends `killed_at_pause` without having run, otherwise it is
///   handed over now.
///
/// `journal` gives the boot a command was handed over to, if it was.
pub fn after_hello<'a>(
    commands: impl IntoIterator<Item = &'a Command>,
    attempt: i64,
    hello: &Hello,
    pausing: bool,
    journal: impl Fn(u32) -> Option<String>,
    now: &Time,
) -> Vec<(u32, &'a Command, Recovery)> {
    let mut steps = Vec::new();
    for c in commands {
        if !matches!(phase(c), Some(CommandPhase::Running | CommandPhase::Cancelling)) {
            continue;
        }
        let Some(n) = number(c) else { continue };
        let ran_in = c.status.as_ref().and_then(|s| s.attempt);
        let settle = |phase, reason: Option<&str>, output_bytes| {
            Recovery::Settle(Box::new(Ending::new(phase, None, reason).status(now.clone(), output_bytes)))
        };
        let step = if ran_in != Some(attempt) {
            let reason = format!("running when attempt {} ended", ran_in.unwrap_or(0));
            settle(CommandPhase::OutcomeUnknown, Some(&reason), None)
        } else if hello.known.contains(&n) {
            Recovery::Keep
        } else {
            match journal(n) {
                Some(boot) if boot != hello.boot => {
                    settle(CommandPhase::OutcomeUnknown, Some("the container it ran in restarted"), None)
                }
                // Not run at all: no output.
                _ if pausing => settle(CommandPhase::KilledAtPause, None, Some(0)),
                _ => Recovery::HandOver,
            }
        };
        steps.push((n, c, step));
    }
    steps
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use hangar_crds::CommandSpec;
    use hangar_supervisor_protocol::OutputStream;
    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;

    use super::*;

    fn cmd(name: &str, number: Option<i64>, phase: CommandPhase, attempt: Option<i64>) -> Command {
        let spec = CommandSpec {
            sandbox: "box".into(),
            argv: vec!["sh".into(), "-c".into(), "true".into()],
            env: vec![],
            working_dir: None,
            timeout_seconds: 60,
            cancel: false,
        };
        let mut c = Command::new(name, spec);
        c.status = Some(CommandStatus { number, phase: Some(phase), attempt, ..Default::default() });
        c
    }

    fn queued(name: &str, n: i64) -> Command {
        cmd(name, Some(n), CommandPhase::Queued, None)
    }

    fn numbers(picked: &[(u32, &Command)]) -> Vec<u32> {
        picked.iter().map(|(n, _)| *n).collect()
    }

    fn now() -> Time {
        Time(Timestamp::from_second(1_700_000_000).unwrap())
    }

    /// The merge patch the runner sends for `status`.
    fn patch(status: &CommandStatus) -> serde_json::Value {
        serde_json::to_value(status).unwrap()
    }

    #[test]
    fn queued_commands_are_handed_over_by_number_not_by_name() {
        let commands = [queued("a", 3), queued("b", 1), queued("c", 2)];
        assert_eq!(numbers(&to_hand_over(&commands, 1)), vec![1, 2, 3]);
    }

    #[test]
    fn at_most_sixteen_run_at_once() {
        let mut commands: Vec<Command> = (1..=20).map(|n| queued(&format!("q{n}"), n)).collect();
        assert_eq!(
            numbers(&to_hand_over(&commands, 1)),
            (1..=16).collect::<Vec<_>>(),
            "16 of 20 at once, the lowest numbers"
        );

        // 14 running and 1 cancelling in this attempt leave room for one.
        commands.clear();
        commands.extend((1..=14).map(|n| cmd(&format!("r{n}"), Some(n), CommandPhase::Running, Some(2))));
        commands.push(cmd("cancelling", Some(15), CommandPhase::Cancelling, Some(2)));
        // Neither counts: one left over from an earlier attempt, one ended.
        commands.push(cmd("stale", Some(16), CommandPhase::Running, Some(1)));
        commands.push(cmd("done", Some(17), CommandPhase::Exited, Some(2)));
        commands.extend([queued("q20", 20), queued("q18", 18), queued("q19", 19)]);
        assert_eq!(numbers(&to_hand_over(&commands, 2)), vec![18]);

        commands.push(cmd("r16", Some(21), CommandPhase::Running, Some(2)));
        assert!(to_hand_over(&commands, 2).is_empty(), "16 running: nothing more");
        assert!(!drained(&commands, 2));
    }

    #[test]
    fn a_cancelled_or_unnumbered_queued_command_is_not_handed_over() {
        let mut cancelled = queued("a", 1);
        cancelled.spec.cancel = true;
        let unnumbered = cmd("b", None, CommandPhase::Queued, None);
        let commands = [cancelled, unnumbered, queued("c", 3)];
        assert_eq!(numbers(&to_hand_over(&commands, 1)), vec![3]);
    }

    #[test]
    fn only_live_commands_of_this_attempt_are_cancelled() {
        let mut running = cmd("a", Some(1), CommandPhase::Running, Some(2));
        let mut being_cancelled = cmd("b", Some(2), CommandPhase::Cancelling, Some(2));
        let mut other_attempt = cmd("c", Some(3), CommandPhase::Running, Some(1));
        let mut q = queued("d", 4);
        let not_asked = cmd("e", Some(5), CommandPhase::Running, Some(2));
        for c in [&mut running, &mut being_cancelled, &mut other_attempt, &mut q] {
            c.spec.cancel = true;
        }
        let commands = [running, being_cancelled, other_attempt, q, not_asked];
        assert_eq!(numbers(&to_cancel(&commands, 2)), vec![1, 2]);
        assert_eq!(patch(&cancelling()), json!({"phase": "cancelling"}));
    }

    #[test]
    fn the_run_carries_the_spec() {
        let mut c = queued("a", 7);
        c.spec.env = vec![hangar_crds::EnvVar { name: "A".into(), value: "b".into() }];
        c.spec.working_dir = Some("/tmp".into());
        c.spec.timeout_seconds = 0;
        assert_eq!(
            run(&c, 7),
            ToSupervisor::Run {
                id: 7,
                argv: vec!["sh".into(), "-c".into(), "true".into()],
                env: vec![("A".into(), "b".into())],
                cwd: Some("/tmp".into()),
                timeout_seconds: 1,
            }
        );
        let t = now();
        assert_eq!(patch(&running(2, t.clone())), json!({"phase": "running", "attempt": 2, "startedAt": t}));
    }

    fn exited(id: u32, exit_code: Option<i32>, signal: Option<i32>, ended_by: EndedBy) -> FromSupervisor {
        FromSupervisor::Exited { id, exit_code, signal, ended_by }
    }

    #[test]
    fn each_supervisor_message_maps_to_its_status() {
        let t = now();
        let status = |msg: FromSupervisor| {
            let (id, ending) = ending(&msg).expect("a final status");
            (id, patch(&ending.status(t.clone(), Some(5))))
        };
        assert_eq!(
            status(exited(1, Some(3), None, EndedBy::Itself)),
            (1, json!({"phase": "exited", "exitCode": 3, "finishedAt": t, "outputBytes": 5}))
        );
        assert_eq!(
            status(exited(2, None, Some(9), EndedBy::Itself)),
            (2, json!({"phase": "exited", "reason": "ended by signal 9", "finishedAt": t, "outputBytes": 5})),
            "a process killed by someone else still exited by itself as far as we asked"
        );
        assert_eq!(
            status(exited(3, None, Some(15), EndedBy::Timeout)),
            (3, json!({"phase": "timed_out", "reason": "ran past timeoutSeconds", "finishedAt": t, "outputBytes": 5}))
        );
        assert_eq!(
            status(exited(4, Some(0), None, EndedBy::Cancel)),
            (4, json!({"phase": "cancelled", "reason": "cancelled while running", "finishedAt": t, "outputBytes": 5})),
            "who ended it decides, not the exit code"
        );
        assert_eq!(
            status(exited(5, None, Some(9), EndedBy::KillAll)),
            (
                5,
                json!({"phase": "killed_at_pause", "reason": "the session paused while it ran", "finishedAt": t, "outputBytes": 5})
            )
        );
        assert_eq!(
            status(FromSupervisor::Failed { id: 6, message: "sh: not found".into() }),
            (
                6,
                json!({"phase": "exited", "exitCode": 127, "reason": "cannot start: sh: not found", "finishedAt": t, "outputBytes": 5})
            )
        );
        for by in [EndedBy::Itself, EndedBy::Timeout, EndedBy::Cancel, EndedBy::KillAll] {
            assert!(ended(by, Some(0), None).phase.is_final());
        }
        for no_change in [
            FromSupervisor::Started { id: 1, pid: 42 },
            FromSupervisor::Output { id: 1, stream: OutputStream::Stdout, offset: 0, data_b64: String::new() },
            FromSupervisor::AgentExited { exit_code: Some(0), signal: None },
        ] {
            assert_eq!(ending(&no_change), None, "{no_change:?}");
        }
    }

    fn hello(boot: &str, known: &[u32]) -> Hello {
        Hello { boot: boot.into(), known: known.to_vec() }
    }

    fn recovery(c: &Command, hello: &Hello, pausing: bool, journal: &HashMap<u32, &str>) -> Option<Recovery> {
        let steps = after_hello([c], 2, hello, pausing, |n| journal.get(&n).map(|b| b.to_string()), &now());
        assert!(steps.len() <= 1);
        steps.into_iter().next().map(|(_, _, r)| r)
    }

    fn unknown(reason: &str) -> Recovery {
        Recovery::Settle(Box::new(CommandStatus {
            phase: Some(CommandPhase::OutcomeUnknown),
            finished_at: Some(now()),
            reason: Some(reason.into()),
            ..Default::default()
        }))
    }

    #[test]
    fn a_hello_that_knows_a_journalled_command_keeps_it_running() {
        let c = cmd("a", Some(1), CommandPhase::Running, Some(2));
        let journal = HashMap::from([(1, "boot-1")]);
        assert_eq!(recovery(&c, &hello("boot-1", &[1]), false, &journal), Some(Recovery::Keep));
        let cancelling = cmd("b", Some(1), CommandPhase::Cancelling, Some(2));
        assert_eq!(recovery(&cancelling, &hello("boot-1", &[1]), true, &journal), Some(Recovery::Keep));
    }

    #[test]
    fn a_hello_that_does_not_know_a_command_journalled_for_another_boot_settles_it_unknown() {
        let c = cmd("a", Some(1), CommandPhase::Running, Some(2));
        let journal = HashMap::from([(1, "boot-1")]);
        for pausing in [false, true] {
            assert_eq!(
                recovery(&c, &hello("boot-2", &[]), pausing, &journal),
                Some(unknown("the container it ran in restarted")),
                "the container restarted; pausing: {pausing}"
            );
        }
    }

    #[test]
    fn a_command_the_supervisor_never_got_is_handed_over_or_killed_at_pause() {
        let c = cmd("a", Some(1), CommandPhase::Running, Some(2));
        let none = HashMap::new();
        assert_eq!(recovery(&c, &hello("boot-1", &[]), false, &none), Some(Recovery::HandOver), "never journalled");
        // Journalled for this very boot, yet unknown to it: the Run never
        // arrived.
        let same_boot = HashMap::from([(1, "boot-1")]);
        assert_eq!(recovery(&c, &hello("boot-1", &[2]), false, &same_boot), Some(Recovery::HandOver));
        assert_eq!(
            recovery(&c, &hello("boot-1", &[]), true, &none),
            Some(Recovery::Settle(Box::new(CommandStatus {
                phase: Some(CommandPhase::KilledAtPause),
                finished_at: Some(now()),
                output_bytes: Some(0),
                ..Default::default()
            }))),
            "a pause ends it before it ran"
        );
    }

    #[test]
    fn a_command_of_an_earlier_attempt_is_settled_unknown_whatever_the_hello_says() {
        let c = cmd("a", Some(1), CommandPhase::Running, Some(1));
        let journal = HashMap::from([(1, "boot-1")]);
        assert_eq!(
            recovery(&c, &hello("boot-1", &[1]), false, &journal),
            Some(unknown("running when attempt 1 ended"))
        );
        let never = cmd("b", Some(2), CommandPhase::Cancelling, None);
        assert_eq!(
            recovery(&never, &hello("boot-1", &[2]), false, &journal),
            Some(unknown("running when attempt 0 ended"))
        );
    }

    #[test]
    fn a_hello_leaves_queued_ended_and_unnumbered_commands_alone() {
        let journal = HashMap::new();
        let h = hello("boot-1", &[]);
        for c in [
            queued("a", 1),
            cmd("b", Some(2), CommandPhase::Exited, Some(2)),
            cmd("c", Some(3), CommandPhase::OutcomeUnknown, Some(1)),
            cmd("d", None, CommandPhase::Running, Some(2)),
        ] {
            assert_eq!(recovery(&c, &h, false, &journal), None, "{}", c.metadata.name.as_deref().unwrap_or_default());
        }
    }

    #[test]
    fn an_outcome_unknown_patch_leaves_the_output_bytes_alone() {
        let Some(Recovery::Settle(status)) =
            recovery(&cmd("a", Some(1), CommandPhase::Running, Some(1)), &hello("b", &[]), false, &HashMap::new())
        else {
            panic!("settled")
        };
        assert_eq!(
            patch(&status),
            json!({"phase": "outcome_unknown", "finishedAt": now(), "reason": "running when attempt 1 ended"})
        );
    }
}

//! Numbering: the commands of a session get 1, 2, 3… in the order they were
//! created, with no gap and no duplicate. Only the (leader-elected)
//! operator numbers, one session at a time, from a fresh list, so
//! concurrent creates cannot race for a number; the CRD refuses to change a
//! number once set.

use hangar_crds::Command;

/// The numbers to give: every unnumbered command, oldest first, continuing
/// after the highest number already given.
fn name(c: &Command) -> String {
    c.metadata.name.clone().unwrap_or_default()
}

pub fn assign(commands: &[Command]) -> Vec<(String, i64)> {
    let highest = commands.iter().filter_map(|c| c.status.as_ref()?.number).max().unwrap_or(0);
    let mut unnumbered: Vec<&Command> =
        commands.iter().filter(|c| c.status.as_ref().and_then(|s| s.number).is_none()).collect();
    // creationTimestamp has one-second resolution: the name breaks ties, so
    // every pass over the same list gives the same answer.
    unnumbered.sort_by(|a, b| {
        let key = |c: &Command| (c.metadata.creation_timestamp.as_ref().map(|t| t.0), name(c));
        key(a).cmp(&key(b))
    });
    unnumbered.into_iter().zip(highest + 1..).map(|(c, n)| (name(c), n)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commands(yaml: &str) -> Vec<Command> {
        serde_yaml::from_str(yaml).unwrap()
    }

    #[test]
    fn unnumbered_commands_continue_after_the_highest_in_creation_order() {
        let list = commands(
            r#"
- metadata: {name: b, creationTimestamp: "2026-11-30T10:00:02Z"}
  spec: {sandbox: s, argv: [true]}
- metadata: {name: a, creationTimestamp: "2026-11-30T10:00:00Z"}
  spec: {sandbox: s, argv: [true]}
  status: {number: 2, phase: exited}
- metadata: {name: d, creationTimestamp: "2026-11-30T10:00:01Z"}
  spec: {sandbox: s, argv: [true]}
- metadata: {name: c, creationTimestamp: "2026-11-30T10:00:01Z"}
  spec: {sandbox: s, argv: [true]}
"#,
        );
        assert_eq!(assign(&list), vec![("c".into(), 3), ("d".into(), 4), ("b".into(), 5)]);
    }

    #[test]
    fn a_fresh_session_starts_at_one_and_a_numbered_one_is_left_alone() {
        let list = commands("- metadata: {name: x}\n  spec: {sandbox: s, argv: [ls]}\n");
        assert_eq!(assign(&list), vec![("x".into(), 1)]);
        let done = commands("- metadata: {name: x}\n  spec: {sandbox: s, argv: [ls]}\n  status: {number: 1}\n");
        assert!(assign(&done).is_empty());
    }
}

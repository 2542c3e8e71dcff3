//! Crash points for the crash-safety tests: `HANGAR_FAILPOINTS=after:RunInstances`
//! makes the process abort right after that EC2 call returns, before the
//! status records what it did, exactly like a SIGKILL at the worst moment.
//! Unset (always, outside tests) this is one environment read at start-up.

use std::sync::OnceLock;

fn points() -> &'static Vec<String> {
    static POINTS: OnceLock<Vec<String>> = OnceLock::new();
    POINTS.get_or_init(|| {
        std::env::var("HANGAR_FAILPOINTS")
            .map(|v| v.split(',').map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()).collect())
            .unwrap_or_default()
    })
}

/// Aborts the process when `name` is an armed crash point.
pub fn hit(name: &str) {
    if points().iter().any(|p| p == name) {
        eprintln!("failpoint {name}: aborting");
        std::process::abort();
    }
}

//! Hard stop: `stopAfterSeconds` counts metered compute across all attempts
//! (a pause does not use it); at the limit the session ends with stop
//! reason `stop_after`. The timer arrives with the session-over-time issue;
//! these are the contract's bounds.

pub const MIN_STOP_AFTER_SECONDS: i64 = 3_600;
pub const MAX_STOP_AFTER_SECONDS: i64 = 604_800;

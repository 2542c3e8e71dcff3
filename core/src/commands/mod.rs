//! The rules of a session's commands.

pub mod limits;
pub mod numbering;

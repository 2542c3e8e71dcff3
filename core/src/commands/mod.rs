//! The rules of a session's commands: the ledger of admitted commands
//! (`ledger`), their numbers (`numbering`) and the limits (`limits`).

pub mod ledger;
pub mod limits;
pub mod numbering;

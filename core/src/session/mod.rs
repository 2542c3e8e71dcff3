//! The session: its phases, the instance it runs on, how it ends.

pub mod certificate;
pub mod ending;
pub mod instance;
pub mod node_choice;
pub mod phase_machine;
pub mod requests;
pub mod reset;

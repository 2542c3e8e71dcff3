//! Images a session runs: the preflight every image from a registry passes
//! before any instance starts (`preflight`).

pub mod preflight;

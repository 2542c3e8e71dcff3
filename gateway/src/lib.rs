//! hangar-gateway: the HTTPS session API (ARCHITECTURE §5).
//!
//! - `auth`: members by Kubernetes bearer token (TokenReview), authorised
//!   per action against the Sandbox's namespace (SubjectAccessReview);
//! - `index`: Sandboxes by session id and their Commands, from watches;
//! - `views`: the JSON the routes return;
//! - `commands`: send (with `Idempotency-Key`), list, cancel;
//! - `output`: the output keys and reads by byte offset with long-poll;
//! - `session_tokens`: session tokens (`hgt_…`) with their proof of
//!   possession, and `replay`: a proof's `jti` used once across replicas;
//!   `acting`: writes made as the caller (impersonation);
//! - `sessions`: start a session, templates; `tokens`: mint and revoke;
//! - `routes`: the route table; `openapi`: its document; `error`: the
//!   contract's error shape.

pub mod acting;
pub mod auth;
pub mod commands;
pub mod error;
pub mod hex;
pub mod index;
pub mod openapi;
pub mod output;
pub mod replay;
pub mod routes;
pub mod session_tokens;
pub mod sessions;
pub mod tokens;
pub mod views;

//! hangar-gateway: the HTTPS session API (ARCHITECTURE §5).
//!
//! - `auth`: members by Kubernetes bearer token (TokenReview), authorised
//!   per action against the Sandbox's namespace (SubjectAccessReview);
//! - `index`: Sandboxes by session id and their Commands, from watches;
//! - `views`: the JSON the routes return;
//! - `commands`: send (with `Idempotency-Key`), list, cancel;
//! - `output`: the output keys and reads by byte offset with long-poll;
//! - `routes`: the route table; `error`: the contract's error shape.

pub mod auth;
pub mod commands;
pub mod error;
pub mod index;
pub mod output;
pub mod routes;
pub mod views;

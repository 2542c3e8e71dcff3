//! hangar-runtime: the plumbing every hangar binary shares, so the binaries
//! stay thin and do it one way.
//!
//! - `admin`: `/healthz` and `/readyz` on a plain port of their own;
//!   `/metrics` (prometheus-client) over HTTPS behind delegated auth
//! - `delegated_auth`: TokenReview and SubjectAccessReview, cached by
//!   token digest (the gateway's members, metrics scrapers)
//! - `telemetry`: structured logs (tracing) and the process's one TLS
//!   crypto provider
//! - `https`: the TLS server every credential-carrying listener uses
//!   (handshake timeout, connection cap, request-body limit, graceful
//!   shutdown)
//! - `serving_cert`: a serving certificate made, trusted (webhook CA
//!   bundles) and rotated by the server itself, or reloaded from files
//! - `retry`: waiting for a dependency that is not answering yet, with
//!   backoff, instead of exiting
//! - `leader`: leader election on a Lease (kube-lease-manager)
//! - `controllers`: a kube-runtime Controller whose watches each back off
//!   on their own (no controller-wide backoff that errors lengthen)
//! - `events`: Kubernetes Events queued and written off the reconcile
//!   path (a pass never waits on its Event)
//! - `kube_ext`: ignore-not-found / already-exists, and the typed
//!   compare-and-swap status patch
//! - `json_document`: a JSON document in a ConfigMap, written by
//!   compare-and-swap (the session command ledgers)

pub mod admin;
pub mod controllers;
pub mod delegated_auth;
pub mod events;
pub mod https;
pub mod json_document;
pub mod kube_ext;
pub mod leader;
pub mod memory;
pub mod retry;
pub mod serving_cert;
pub mod telemetry;

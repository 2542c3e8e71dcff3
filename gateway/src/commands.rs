//! Sending, listing and cancelling commands. A command sent with an
//! `Idempotency-Key` gets a name derived from (session, key): sending it
//! again finds the same Command (HTTP 200, the same command), or
//! `sandbox_command_cancelled` once it was cancelled. A body asking for
//! standard input, a terminal or a shell is refused with `bad_request`: a
//! command has no such thing.

use hangar_crds::{Command, CommandPhase, CommandSpec, EnvVar, ErrorCode, Sandbox};
use kube::ResourceExt;
use kube::api::{Api, ObjectMeta};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::acting::Acting;
use crate::error::ApiError;
use crate::hex::sha256_hex;

/// Annotation holding the SHA-256 of the Idempotency-Key (never the key).
pub const IDEMPOTENCY_ANNOTATION: &str = "hangar.dev/idempotency-key-sha256";

#[derive(Deserialize, Debug, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NewCommand {
    pub argv: Vec<String>,
    #[serde(default)]
    pub env: Vec<EnvVar>,
    #[serde(default)]
    pub working_dir: Option<String>,
    #[serde(default)]
    pub timeout_seconds: Option<i64>,
}

/// Fields a command never has; asking for one is `bad_request`.
const INTERACTIVE: [&str; 6] = ["stdin", "tty", "shell", "interactive", "interactiveShell", "pty"];

pub fn parse(body: &[u8]) -> Result<NewCommand, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::new(ErrorCode::BadRequest, format!("body is not JSON: {e}")))?;
    if let Some(field) = INTERACTIVE.iter().find(|f| v.get(**f).is_some()) {
        return Err(ApiError::new(
            ErrorCode::BadRequest,
            format!(
                "a command has no standard input, terminal or interactive shell ({field} is not a field of a command)"
            ),
        ));
    }
    serde_json::from_value(v).map_err(|e| ApiError::new(ErrorCode::BadRequest, e.to_string()))
}

/// The Command name for (session, caller, Idempotency-Key): a key is the
/// caller's own, so another caller reusing it (or guessing it) sends a
/// command of its own instead of replaying, or learning of, someone else's.
pub fn name_for_key(session_id: &str, caller: &str, key: &str) -> (String, String) {
    let hex = sha256_hex(format!("{session_id}\u{0}{caller}\u{0}{key}").as_bytes());
    (format!("cmd-{}", &hex[..24]), sha256_hex(key.as_bytes()))
}

fn manifest(sandbox: &Sandbox, req: &NewCommand, name: Option<(String, String)>) -> Command {
    let mut spec = CommandSpec {
        sandbox: sandbox.name_any(),
        argv: req.argv.clone(),
        env: req.env.clone(),
        working_dir: req.working_dir.clone(),
        timeout_seconds: hangar_crds::command::DEFAULT_TIMEOUT_SECONDS,
        cancel: false,
    };
    if let Some(t) = req.timeout_seconds {
        spec.timeout_seconds = t;
    }
    let mut meta = ObjectMeta { namespace: sandbox.namespace(), ..Default::default() };
    match name {
        Some((name, key_hex)) => {
            meta.name = Some(name);
            meta.annotations = Some([(IDEMPOTENCY_ANNOTATION.to_owned(), key_hex)].into());
        }
        None => meta.generate_name = Some("cmd-".into()),
    }
    Command { metadata: meta, spec, status: None }
}

/// Whether the new request is the one already stored under its key.
fn same_request(existing: &Command, req: &NewCommand) -> bool {
    existing.spec.argv == req.argv
        && existing.spec.env == req.env
        && existing.spec.working_dir == req.working_dir
        && existing.spec.timeout_seconds == req.timeout_seconds.unwrap_or(hangar_crds::command::DEFAULT_TIMEOUT_SECONDS)
}

/// Creates the command as `acting`; `Ok((command, replayed))`.
pub async fn send(
    client: &kube::Client,
    acting: &Acting,
    sandbox: &Sandbox,
    req: &NewCommand,
    key: Option<&str>,
) -> Result<(Command, bool), ApiError> {
    let caller = acting.user.as_str();
    let api: Api<Command> = Api::namespaced(client.clone(), &sandbox.namespace().unwrap_or_default());
    // The webhook decides again at the create; answering here first keeps
    // an ended session from costing an apiserver round trip.
    let (namespace, name) = (sandbox.namespace().unwrap_or_default(), sandbox.name_any());
    hangar_core::admission::session_takes_commands(&namespace, &name, Some(sandbox))?;
    let session_id = sandbox.uid().unwrap_or_default();
    let named = key.map(|k| name_for_key(&session_id, caller, k));
    let namespace = namespace.as_str();
    let Some(wanted) = named.as_ref().map(|(n, _)| n.clone()) else {
        return Ok((acting.create(client, namespace, &manifest(sandbox, req, None)).await?, false));
    };
    // A replay is answered from what is stored, without a create (and so
    // without an admission): it takes no second place in the session.
    if let Some(existing) = api.get_opt(&wanted).await? {
        return replay(existing, req);
    }
    match acting.create_raw(client, namespace, &manifest(sandbox, req, named)).await {
        Ok(c) => Ok((c, false)),
        Err(kube::Error::Api(e)) if e.reason == "AlreadyExists" => replay(api.get(&wanted).await?, req),
        Err(e) => Err(e.into()),
    }
}

/// The answer to a request whose Idempotency-Key names `existing`.
fn replay(existing: Command, req: &NewCommand) -> Result<(Command, bool), ApiError> {
    if !same_request(&existing, req) {
        return Err(ApiError::new(
            ErrorCode::SandboxRequestInvalid,
            "this Idempotency-Key was used for a different command",
        ));
    }
    let cancelled =
        existing.spec.cancel || existing.status.as_ref().and_then(|s| s.phase) == Some(CommandPhase::Cancelled);
    if cancelled {
        return Err(ApiError::new(
            ErrorCode::SandboxCommandCancelled,
            "the command sent with this Idempotency-Key was cancelled",
        ));
    }
    Ok((existing, true))
}

/// Sets `cancel` as `acting`.
pub async fn cancel(client: &kube::Client, acting: &Acting, namespace: &str, name: &str) -> Result<Command, ApiError> {
    acting.patch(client, namespace, name, &json!({"spec": {"cancel": true}})).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interactive_bodies_are_bad_requests_and_unknown_fields_too() {
        for body in [
            r#"{"argv":["sh"],"stdin":"ls\n"}"#,
            r#"{"argv":["bash"],"tty":true}"#,
            r#"{"argv":["x"],"shell":true}"#,
            r#"{"argv":["x"],"interactive":true}"#,
        ] {
            let e = parse(body.as_bytes()).unwrap_err();
            assert_eq!((e.status, e.code), (400, "bad_request"), "{body}");
        }
        assert_eq!(parse(br#"{"argv":["x"],"colour":1}"#).unwrap_err().code, "bad_request");
        assert_eq!(parse(b"not json").unwrap_err().code, "bad_request");
        let ok =
            parse(br#"{"argv":["ls","-l"],"env":[{"name":"A","value":"1"}],"workingDir":"/tmp","timeoutSeconds":5}"#)
                .unwrap();
        assert_eq!(ok.argv, vec!["ls", "-l"]);
        assert_eq!(ok.timeout_seconds, Some(5));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 1000, ..Default::default() })]

        /// Any body: a command or 400 `bad_request`, never a panic.
        #[test]
        fn any_body_is_a_command_or_a_400(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400)) {
            if let Err(e) = parse(&body) {
                proptest::prop_assert_eq!((e.status, e.code), (400, "bad_request"));
            }
        }

        #[test]
        fn any_argv_and_fields_are_a_command_or_a_400(argv in proptest::collection::vec(".{0,10}", 0..4),
                                                     extra in "[a-zA-Z]{1,10}", t in proptest::prelude::any::<i64>()) {
            let body = json!({"argv": argv, "timeoutSeconds": t, extra: true});
            if let Err(e) = parse(&serde_json::to_vec(&body).unwrap()) {
                proptest::prop_assert_eq!((e.status, e.code), (400, "bad_request"));
            }
        }
    }

    #[test]
    fn one_key_one_name_per_session_and_caller() {
        let (a, _) = name_for_key("s1", "alice", "k");
        assert_eq!(a, name_for_key("s1", "alice", "k").0);
        assert_ne!(a, name_for_key("s2", "alice", "k").0);
        assert_ne!(a, name_for_key("s1", "alice", "k2").0);
        assert_ne!(a, name_for_key("s1", "bob", "k").0, "another caller's key is its own");
        assert!(a.len() <= 63 && a.starts_with("cmd-"));
    }
}

//! What the OpenAPI schema of each kind says beyond the Rust types: CEL
//! rules (each message starting with the contract's error code), defaults,
//! and the length bounds CEL's cost estimator needs.
//!
//! Ranges and enumerations are CEL rules rather than `minimum`/`enum`
//! keywords on purpose: the apiserver words keyword failures itself
//! ("should be greater than or equal to"), so only a CEL rule can put the
//! Hangar code at the start of the message.

use serde_json::{Value, json};

use crate::ErrorCode::{self, *};

/// Edits one `openAPIV3Schema` in place. Paths are dotted property names from
/// the object root; `name[]` steps into a list's items.
pub(crate) struct SchemaEditor<'a> {
    root: &'a mut Value,
}

impl<'a> SchemaEditor<'a> {
    pub(crate) fn new(root: &'a mut Value) -> Self {
        Self { root }
    }

    fn node(&mut self, path: &str) -> &mut Value {
        let mut cur: &mut Value = self.root;
        if path.is_empty() {
            return cur;
        }
        for seg in path.split('.') {
            let (name, items) = match seg.strip_suffix("[]") {
                Some(n) => (n, true),
                None => (seg, false),
            };
            cur = cur
                .get_mut("properties")
                .and_then(|p| p.get_mut(name))
                .unwrap_or_else(|| panic!("schema has no property {name:?} (path {path:?})"));
            if items {
                cur = cur.get_mut("items").unwrap_or_else(|| panic!("{path:?} is not a list"));
            }
        }
        cur
    }

    fn set(&mut self, path: &str, key: &str, value: Value) -> &mut Self {
        let node = self.node(path);
        node.as_object_mut().unwrap_or_else(|| panic!("{path:?} is not a schema object")).insert(key.to_owned(), value);
        self
    }

    /// Adds a CEL rule whose message is `<code>: <text>`.
    pub(crate) fn rule(&mut self, path: &str, rule: &str, code: ErrorCode, text: &str) -> &mut Self {
        let node = self.node(path);
        let list =
            node.as_object_mut().expect("schema object").entry("x-kubernetes-validations").or_insert_with(|| json!([]));
        list.as_array_mut().expect("list").push(json!({
            "rule": rule,
            "message": code.message(text),
        }));
        self
    }

    pub(crate) fn default(&mut self, path: &str, value: Value) -> &mut Self {
        self.set(path, "default", value)
    }

    pub(crate) fn max_length(&mut self, path: &str, n: u64) -> &mut Self {
        self.set(path, "maxLength", json!(n))
    }

    pub(crate) fn max_items(&mut self, path: &str, n: u64) -> &mut Self {
        self.set(path, "maxItems", json!(n))
    }

    /// `lo <= value <= hi`.
    pub(crate) fn range(&mut self, path: &str, lo: i64, hi: i64, code: ErrorCode) -> &mut Self {
        let field = label(path);
        self.rule(path, &format!("self >= {lo} && self <= {hi}"), code, &format!("{field} must be from {lo} to {hi}"))
    }

    /// One of a fixed set of strings. Replaces the `enum` keyword schemars
    /// wrote, whose failure message the apiserver words without our code.
    pub(crate) fn one_of(&mut self, path: &str, values: &[&str], code: ErrorCode) -> &mut Self {
        let field = label(path);
        let node = self.node(path);
        let obj = node.as_object_mut().expect("schema object");
        obj.remove("enum");
        let list = values.iter().map(|v| format!("'{v}'")).collect::<Vec<_>>().join(", ");
        let desc = format!("One of: {}.", values.join(", "));
        let merged = match obj.get("description").and_then(Value::as_str) {
            Some(d) => format!("{d} {desc}"),
            None => desc,
        };
        obj.insert("description".into(), json!(merged));
        self.max_length(path, 64);
        self.rule(path, &format!("self in [{list}]"), code, &format!("{field} must be one of {}", values.join(", ")))
    }

    /// Matches an RE2 pattern (no backslashes: use character classes).
    pub(crate) fn pattern(&mut self, path: &str, re: &str, code: ErrorCode, what: &str) -> &mut Self {
        assert!(!re.contains('\\'), "write {re:?} with character classes, not escapes");
        self.rule(path, &format!("self.matches('{re}')"), code, what)
    }

    /// A boolean that, once true, stays true (a transition rule on `oldSelf`).
    pub(crate) fn final_true(&mut self, path: &str, code: ErrorCode, text: &str) -> &mut Self {
        self.default(path, json!(false));
        self.rule(path, "!oldSelf || self", code, text)
    }

    /// A field that is always present (required or defaulted) and never changes.
    pub(crate) fn immutable(&mut self, path: &str) -> &mut Self {
        let field = label(path);
        self.rule(path, "self == oldSelf", SandboxRequestInvalid, &format!("{field} cannot change after create"))
    }

    /// An optional field of the object at `parent` that may not be added,
    /// removed or changed after create.
    pub(crate) fn immutable_optional(&mut self, parent: &str, field: &str) -> &mut Self {
        self.rule(
            parent,
            &format!(
                "has(self.{field}) == has(oldSelf.{field}) && (!has(self.{field}) || self.{field} == oldSelf.{field})"
            ),
            SandboxRequestInvalid,
            &format!("{field} cannot change after create"),
        )
    }
}

/// The last path segment, for messages.
fn label(path: &str) -> &str {
    path.rsplit('.').next().unwrap_or(path).trim_end_matches("[]")
}

// Shared patterns. RE2, anchored, no backslashes.
const DIGEST_IMAGE: &str = "^[a-z0-9][a-z0-9._/:-]*@sha256:[0-9a-f]{64}$";
const DNS_LABEL: &str = "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$";
const DNS_SUBDOMAIN: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
const HOST: &str = "^([*][.])?[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?([.][a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*$";
const TENANT: &str = "^[a-z0-9][a-z0-9._-]{0,62}$";
const TEMPLATE_NAME: &str = "^[a-z0-9][a-z0-9-]{0,62}$";
const TEMPLATE_VERSION: &str = "^[0-9A-Za-z][0-9A-Za-z._+-]{0,63}$";
const TEMPLATE_REF: &str = "^[a-z0-9][a-z0-9-]{0,62}@[0-9A-Za-z][0-9A-Za-z._+-]{0,63}$";
const ENV_NAME: &str = "^[A-Za-z_][A-Za-z0-9_]*$";
const B64URL_32: &str = "^[A-Za-z0-9_-]{43}$";
const SHA256: &str = "^sha256:[0-9a-f]{64}$";

fn image(e: &mut SchemaEditor, path: &str) {
    e.max_length(path, 512).pattern(
        path,
        DIGEST_IMAGE,
        SandboxRequestInvalid,
        &format!("{} must be pinned by digest: <repository>@sha256:<64 hex>", label(path)),
    );
}

fn hosts(e: &mut SchemaEditor, list: &str) {
    e.max_items(list, 256).max_length(&format!("{list}[]"), 253).pattern(
        &format!("{list}[]"),
        HOST,
        SandboxRequestInvalid,
        "each allowed destination must be a host name, optionally starting with *.",
    );
}

pub(crate) fn sandbox(e: &mut SchemaEditor) {
    e.one_of("spec.mode", &["agent", "commands"], SandboxRequestInvalid)
        .default("spec.mode", json!("agent"))
        .immutable("spec.mode");
    image(e, "spec.image");
    e.max_length("spec.template", 256)
        .pattern("spec.template", TEMPLATE_REF, SandboxRequestInvalid, "template must be name@version")
        .rule(
            "spec",
            "has(self.image) != has(self.template)",
            SandboxRequestInvalid,
            "exactly one of image and template must be set",
        )
        .immutable_optional("spec", "image")
        .immutable_optional("spec", "template");

    e.max_items("spec.command", 1024).max_length("spec.command[]", 65536).rule(
        "spec",
        "self.mode == 'agent' || !has(self.command) || size(self.command) == 0",
        SandboxRequestInvalid,
        "command is for mode agent; a session in mode commands runs the Commands sent to it",
    );

    e.max_items("spec.companions", 16)
        .max_length("spec.companions[].name", 63)
        .pattern("spec.companions[].name", DNS_LABEL, SandboxRequestInvalid, "a companion name must be a DNS label")
        .rule(
            "spec.companions",
            "self.all(c, self.exists_one(d, d.name == c.name))",
            SandboxRequestInvalid,
            "companion names must be unique",
        );
    image(e, "spec.companions[].image");
    e.immutable_optional("spec", "companions");

    e.max_length("spec.tenant", 256)
        .pattern("spec.tenant", TENANT, SandboxRequestInvalid, "tenant must match ^[a-z0-9][a-z0-9._-]{0,62}$")
        .immutable_optional("spec", "tenant");

    e.range("spec.idleTimeoutSeconds", 60, 86400, SandboxRequestInvalid)
        .one_of("spec.idleAction", &["end", "pause"], SandboxRequestInvalid)
        .rule(
            "spec",
            "!(self.mode == 'agent' && has(self.idleAction) && self.idleAction == 'pause')",
            SandboxPauseUnavailable,
            "a session in mode agent cannot pause (idleAction pause)",
        )
        .rule(
            "spec",
            "self.mode != 'agent' || (!has(self.idleTimeoutSeconds) && !has(self.idleAction)) || (has(self.idleAction) && self.idleAction == 'pause')",
            SandboxRequestInvalid,
            "a session in mode agent is never idle: idleTimeoutSeconds and idleAction are for mode commands",
        );

    e.range("spec.stopAfterSeconds", 3600, 604800, SandboxRequestInvalid)
        .range("spec.outputRetentionDays", 1, 90, SandboxRequestInvalid)
        .default("spec.outputRetentionDays", json!(crate::sandbox::DEFAULT_OUTPUT_RETENTION_DAYS))
        .one_of("spec.size", &["tiny", "small", "medium", "large"], SandboxRequestInvalid)
        .default("spec.size", json!("small"));

    hosts(e, "spec.egress.allow");

    e.max_items("spec.attachments", 32)
        .max_length("spec.attachments[].secretName", 253)
        .pattern(
            "spec.attachments[].secretName",
            DNS_SUBDOMAIN,
            SandboxRequestInvalid,
            "secretName must be a Secret name",
        )
        .max_length("spec.attachments[].destination", 4096)
        .rule(
            "spec.attachments[].destination",
            "self.startsWith('/') && !self.contains('/../') && !self.endsWith('/..')",
            SandboxRequestInvalid,
            "destination must be an absolute path without ..",
        )
        // hangar's own mounts in the agent container (the workspace, the
        // supervisor's socket directory, which images often reach through
        // /var/run -> /run, and the installed supervisor): an attachment at,
        // inside or above one would hide it. Plain paths only, so no
        // spelling ("/var/", "/./hangar") slips past the comparison.
        .rule(
            "spec.attachments[].destination",
            "self != '/' && !self.endsWith('/') && !self.contains('//') && !self.contains('/./') \
             && ['/workspace', '/var/run/hangar', '/run/hangar', '/hangar'].all(r, \
             self != r && !self.startsWith(r + '/') && !r.startsWith(self + '/'))",
            SandboxRequestInvalid,
            "destination must not be, be inside or contain hangar's mounts (/workspace, /var/run/hangar, /run/hangar, /hangar)",
        )
        .rule(
            "spec.attachments",
            "self.all(a, self.exists_one(b, b.destination == a.destination))",
            SandboxRequestInvalid,
            "attachment destinations must be unique",
        )
        // Checked against the tenant at admission (create): never changed after.
        .rule("spec.attachments", "self == oldSelf", SandboxRequestInvalid, "attachments are immutable")
        .max_items("spec.attachments[].companions", 16)
        .max_length("spec.attachments[].companions[]", 63)
        .rule(
            "spec",
            "!has(self.attachments) || self.attachments.all(a, !has(a.companions) || a.companions.all(c, has(self.companions) && self.companions.exists(k, k.name == c)))",
            SandboxRequestInvalid,
            "an attachment's companions must be companions of the session",
        );

    e.one_of("spec.state", &["Running", "Paused", "Ended"], SandboxRequestInvalid)
        .default("spec.state", json!("Running"))
        .rule(
            "spec.state",
            "oldSelf != 'Ended' || self == 'Ended'",
            SandboxEnded,
            "state Ended is final: an ended session never comes back",
        )
        .rule(
            "spec",
            "!(self.mode == 'agent' && self.state == 'Paused')",
            SandboxPauseUnavailable,
            "a session in mode agent cannot pause",
        )
        .final_true("spec.revokeAll", SandboxEnded, "revokeAll is final: a revoked session never comes back");
}

pub(crate) fn command(e: &mut SchemaEditor) {
    e.max_length("spec.sandbox", 253)
        .pattern("spec.sandbox", DNS_SUBDOMAIN, SandboxRequestInvalid, "sandbox must be a Sandbox name")
        .immutable("spec.sandbox");
    e.max_items("spec.argv", 1024)
        .max_length("spec.argv[]", 65536)
        .rule(
            "spec.argv",
            "size(self) >= 1 && size(self[0]) >= 1",
            SandboxRequestInvalid,
            "argv needs a program: at least one string, the first not empty",
        )
        .immutable("spec.argv");
    e.max_items("spec.env", 256)
        .max_length("spec.env[].name", 256)
        .pattern("spec.env[].name", ENV_NAME, SandboxRequestInvalid, "an env name must match ^[A-Za-z_][A-Za-z0-9_]*$")
        .max_length("spec.env[].value", 32768)
        .immutable_optional("spec", "env");
    e.max_length("spec.workingDir", 4096)
        .rule("spec.workingDir", "self.startsWith('/')", SandboxRequestInvalid, "workingDir must be an absolute path")
        .immutable_optional("spec", "workingDir");
    e.range("spec.timeoutSeconds", 1, 86400, SandboxRequestInvalid)
        .default("spec.timeoutSeconds", json!(crate::command::DEFAULT_TIMEOUT_SECONDS))
        .immutable("spec.timeoutSeconds");
    e.final_true(
        "spec.cancel",
        SandboxCommandCancelled,
        "cancel is final: a cancelled command stays cancelled and never runs",
    );
    // The status is written by the operator (number) and the worker
    // (progress); these rules make the apiserver hold both to the contract.
    let finals = crate::CommandPhase::FINAL.iter().map(|p| format!("'{}'", p.as_str())).collect::<Vec<_>>().join(", ");
    e.rule(
        "status",
        &format!(
            "!has(oldSelf.phase) || !(oldSelf.phase in [{finals}]) || \
             (has(self.phase) && self.phase == oldSelf.phase && \
              has(self.exitCode) == has(oldSelf.exitCode) && (!has(self.exitCode) || self.exitCode == oldSelf.exitCode))"
        ),
        SandboxRequestInvalid,
        "a command never leaves a final status",
    )
    .rule(
        "status",
        "!has(oldSelf.number) || (has(self.number) && self.number == oldSelf.number)",
        SandboxRequestInvalid,
        "a command's number never changes",
    )
    .rule(
        "status",
        &format!(
            "!has(oldSelf.phase) || (has(self.phase) && {rank}[self.phase] >= {rank}[oldSelf.phase])",
            rank = command_phase_rank()
        ),
        SandboxRequestInvalid,
        "a command's phase only moves forward (queued, running, cancelling, then a final status)",
    );
    for field in ["jobId", "sentBy", "sender", "sandboxUid"] {
        e.rule(
            "status",
            &format!("!has(oldSelf.{field}) || (has(self.{field}) && self.{field} == oldSelf.{field})"),
            SandboxRequestInvalid,
            &format!("a command's {field} is written once"),
        );
    }
}

/// A CEL map from each command phase to its place in the only order a
/// command may move in: queued, running, cancelling, then any final status.
fn command_phase_rank() -> String {
    let rank = |p: crate::CommandPhase| match p {
        crate::CommandPhase::Queued => 0,
        crate::CommandPhase::Running => 1,
        crate::CommandPhase::Cancelling => 2,
        _ => 3,
    };
    let entries: Vec<String> =
        crate::CommandPhase::ALL.iter().map(|p| format!("'{}': {}", p.as_str(), rank(*p))).collect();
    format!("{{{}}}", entries.join(", "))
}

pub(crate) fn session_token(e: &mut SchemaEditor) {
    e.max_length("spec.sandbox", 253)
        .pattern("spec.sandbox", DNS_SUBDOMAIN, SandboxRequestInvalid, "sandbox must be a Sandbox name")
        .immutable("spec.sandbox");
    e.max_items("spec.scopes", 8)
        .one_of("spec.scopes[]", &["read", "exec", "control"], SandboxRequestInvalid)
        .rule(
            "spec.scopes",
            "size(self) >= 1 && size(self) <= 3 && self.all(s, self.exists_one(t, t == s))",
            SandboxRequestInvalid,
            "scopes must be 1 to 3 distinct values of read, exec, control",
        )
        .immutable("spec.scopes");
    e.range("spec.ttlSeconds", 60, 86400, SandboxRequestInvalid)
        .default("spec.ttlSeconds", json!(crate::session_token::DEFAULT_TTL_SECONDS))
        .immutable("spec.ttlSeconds");
    e.max_length("spec.publicKey.kty", 16)
        .rule("spec.publicKey.kty", "self == 'EC'", SandboxRequestInvalid, "publicKey must be an EC key (kty EC)")
        .max_length("spec.publicKey.crv", 16)
        .rule("spec.publicKey.crv", "self == 'P-256'", SandboxRequestInvalid, "publicKey must be on curve P-256")
        .max_length("spec.publicKey.x", 64)
        .pattern(
            "spec.publicKey.x",
            B64URL_32,
            SandboxRequestInvalid,
            "publicKey.x must be 32 bytes, base64url without padding",
        )
        .max_length("spec.publicKey.y", 64)
        .pattern(
            "spec.publicKey.y",
            B64URL_32,
            SandboxRequestInvalid,
            "publicKey.y must be 32 bytes, base64url without padding",
        )
        .immutable("spec.publicKey");
    e.final_true("spec.revoked", SandboxRequestInvalid, "revoked is final: a revoked token never comes back");
    // The status is the operator's; these rules hold it (and anyone with
    // status rights) to the token's life: a revoked or expired token never
    // becomes active again, and its digest and expiry are written once.
    e.rule(
        "status",
        "!has(oldSelf.phase) || !(oldSelf.phase in ['revoked', 'expired']) || (has(self.phase) && self.phase == oldSelf.phase)",
        SandboxRequestInvalid,
        "a revoked or expired token never becomes active again",
    );
    for field in ["digest", "expiresAt", "sessionId"] {
        e.rule(
            "status",
            &format!("!has(oldSelf.{field}) || (has(self.{field}) && self.{field} == oldSelf.{field})"),
            SandboxRequestInvalid,
            &format!("a token's {field} is written once"),
        );
    }
}

pub(crate) fn sandbox_template(e: &mut SchemaEditor) {
    e.max_length("spec.name", 63)
        .pattern("spec.name", TEMPLATE_NAME, SandboxRequestInvalid, "name must match ^[a-z0-9][a-z0-9-]{0,62}$")
        .max_length("spec.version", 64)
        .pattern(
            "spec.version",
            TEMPLATE_VERSION,
            SandboxRequestInvalid,
            "version must match ^[0-9A-Za-z][0-9A-Za-z._+-]{0,63}$",
        );
    image(e, "spec.manifest.image");
    e.max_length("spec.manifest.sbomDigest", 71).pattern(
        "spec.manifest.sbomDigest",
        SHA256,
        SandboxRequestInvalid,
        "sbomDigest must be sha256:<64 hex>",
    );
    hosts(e, "spec.manifest.buildNetworkPolicy.allow");
    e.max_length("spec.signature", 8192)
        .pattern("spec.signature", "^[A-Za-z0-9+/_=-]+$", SandboxRequestInvalid, "signature must be base64")
        .max_length("spec.signedBy", 253)
        .rule("spec.signedBy", "size(self) > 0", SandboxRequestInvalid, "signedBy must name the release key")
        .rule(
            "spec",
            "self == oldSelf",
            SandboxRequestInvalid,
            "a registered template is immutable: publish a new version",
        );
}

//! The hangar.dev API against a real kube-apiserver: the examples are
//! accepted, every rule the schema and CEL can say refuses bad input with
//! the contract's code (and changes nothing), defaults are applied, and
//! strict field validation refuses unknown fields.

use std::io::Write;
use std::process::{Command, Stdio};

use hangar_e2e::{ControlPlane, shared_control_plane};
use serde_json::{Value, json};

const DIGEST: &str = "sha256:4f5b5c1a9d2e3f40718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8";
const X: &str = "uFMC9hyxMYx4HypaWHIg-oXUy8BwCplQ04jqx1WQjJk";
const Y: &str = "QmB8XEkqD7D2hm9NjVgCN2tZLo_0fRPPd3-EQB7AA98";

fn image() -> String {
    format!("registry.example/agent@{DIGEST}")
}

/// `kubectl <args>` with `stdin`; returns (success, stdout + stderr).
fn kubectl(cp: &ControlPlane, args: &[&str], stdin: Option<&str>) -> (bool, String) {
    let mut cmd: Command = cp.kubectl();
    cmd.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("run kubectl");
    if let Some(input) = stdin {
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

fn namespace(cp: &ControlPlane, name: &str) {
    let (ok, out) = kubectl(cp, &["create", "namespace", name], None);
    assert!(ok || out.contains("AlreadyExists"), "create namespace {name}: {out}");
}

/// RFC 7386 merge: `null` in `patch` removes the key.
fn merge(base: &mut Value, patch: &Value) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    b.remove(k);
                } else {
                    merge(b.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (b, p) => *b = p.clone(),
    }
}

fn object(kind: &str, name: &str, spec: Value, patch: Value) -> Value {
    let mut spec = spec;
    merge(&mut spec, &patch);
    json!({"apiVersion": "hangar.dev/v1alpha1", "kind": kind, "metadata": {"name": name}, "spec": spec})
}

fn sandbox(name: &str, patch: Value) -> Value {
    object("Sandbox", name, json!({"mode": "commands", "image": image()}), patch)
}

fn agent(name: &str, patch: Value) -> Value {
    object("Sandbox", name, json!({"mode": "agent", "image": image(), "command": ["run-agent"]}), patch)
}

fn command(name: &str, patch: Value) -> Value {
    object("Command", name, json!({"sandbox": "box", "argv": ["echo", "hi"]}), patch)
}

fn token(name: &str, patch: Value) -> Value {
    object(
        "SessionToken",
        name,
        json!({"sandbox": "box", "scopes": ["read"], "publicKey": {"kty": "EC", "crv": "P-256", "x": X, "y": Y}}),
        patch,
    )
}

fn template(name: &str, patch: Value) -> Value {
    object(
        "SandboxTemplate",
        name,
        json!({
            "name": name, "version": "1.0",
            "manifest": {"image": image(), "sbomDigest": DIGEST, "buildNetworkPolicy": {"allow": []}},
            "signature": "c2lnbmF0dXJl", "signedBy": "release-key"
        }),
        patch,
    )
}

/// One refusal: `before` (if any) is created first and must be accepted;
/// then `apply` must be refused with `code`, and the object must be left as
/// it was.
struct Row {
    name: &'static str,
    before: Option<Value>,
    apply: Value,
    code: &'static str,
}

fn create(name: &'static str, apply: Value, code: &'static str) -> Row {
    Row { name, before: None, apply, code }
}

fn update(name: &'static str, before: Value, apply: Value, code: &'static str) -> Row {
    Row { name, before: Some(before), apply, code }
}

const INVALID: &str = "sandbox_request_invalid";

fn rows() -> Vec<Row> {
    let long_tenant = "a".repeat(64);
    vec![
        // Sandbox, on create.
        create("image by tag", sandbox("s-tag", json!({"image": "python:3.12"})), INVALID),
        create("image and template", sandbox("s-both", json!({"template": "python-dev@1.2"})), INVALID),
        create("neither image nor template", sandbox("s-none", json!({"image": null})), INVALID),
        create(
            "template without version",
            sandbox("s-tplv", json!({"image": null, "template": "python-dev"})),
            INVALID,
        ),
        create("idleTimeoutSeconds 59", sandbox("s-idle-lo", json!({"idleTimeoutSeconds": 59})), INVALID),
        create("idleTimeoutSeconds 86401", sandbox("s-idle-hi", json!({"idleTimeoutSeconds": 86401})), INVALID),
        create("stopAfterSeconds 3599", sandbox("s-stop-lo", json!({"stopAfterSeconds": 3599})), INVALID),
        create("stopAfterSeconds 604801", sandbox("s-stop-hi", json!({"stopAfterSeconds": 604801})), INVALID),
        create("outputRetentionDays 0", sandbox("s-ret-lo", json!({"outputRetentionDays": 0})), INVALID),
        create("outputRetentionDays 91", sandbox("s-ret-hi", json!({"outputRetentionDays": 91})), INVALID),
        create("tenant upper case", sandbox("s-ten-uc", json!({"tenant": "Acme"})), INVALID),
        create("tenant 64 characters", sandbox("s-ten-long", json!({"tenant": long_tenant})), INVALID),
        create("tenant starting with a dot", sandbox("s-ten-dot", json!({"tenant": ".acme"})), INVALID),
        create("unknown mode", sandbox("s-mode", json!({"mode": "batch"})), INVALID),
        create("unknown size", sandbox("s-size", json!({"size": "huge"})), INVALID),
        create("unknown idleAction", sandbox("s-idle-act", json!({"idleAction": "sleep"})), INVALID),
        create("unknown state", sandbox("s-state", json!({"state": "Stopped"})), INVALID),
        create(
            "mode agent, idleAction pause",
            agent("a-idle-pause", json!({"idleAction": "pause"})),
            "sandbox_pause_unavailable",
        ),
        create("mode agent, idleAction end", agent("a-idle-end", json!({"idleAction": "end"})), INVALID),
        create("mode agent, idleTimeoutSeconds", agent("a-idle-t", json!({"idleTimeoutSeconds": 600})), INVALID),
        create("mode agent, state Paused", agent("a-paused", json!({"state": "Paused"})), "sandbox_pause_unavailable"),
        create(
            "mode defaults to agent: idle set",
            sandbox("d-idle", json!({"mode": null, "idleTimeoutSeconds": 600})),
            INVALID,
        ),
        create("command in mode commands", sandbox("s-cmd", json!({"command": ["sh"]})), INVALID),
        create(
            "companion image by tag",
            sandbox("s-comp", json!({"companions": [{"name": "db", "image": "postgres:16"}]})),
            INVALID,
        ),
        create(
            "duplicate companion names",
            sandbox(
                "s-comp-dup",
                json!({"companions": [{"name": "db", "image": image()}, {"name": "db", "image": image()}]}),
            ),
            INVALID,
        ),
        create(
            "egress host with a scheme",
            sandbox("s-egress", json!({"egress": {"allow": ["https://pypi.org"]}})),
            INVALID,
        ),
        create(
            "attachment to a relative path",
            sandbox("s-attach", json!({"attachments": [{"secretName": "creds", "destination": "etc/creds"}]})),
            INVALID,
        ),
        create(
            "an attachment over the workspace",
            sandbox("s-attach-r0", json!({"attachments": [{"secretName": "creds", "destination": "/workspace"}]})),
            INVALID,
        ),
        create(
            "an attachment inside the workspace",
            sandbox(
                "s-attach-r1",
                json!({"attachments": [{"secretName": "creds", "destination": "/workspace/creds"}]}),
            ),
            INVALID,
        ),
        create(
            "an attachment over the installed supervisor",
            sandbox("s-attach-r2", json!({"attachments": [{"secretName": "creds", "destination": "/hangar"}]})),
            INVALID,
        ),
        create(
            "an attachment inside the supervisor's directory",
            sandbox(
                "s-attach-r3",
                json!({"attachments": [{"secretName": "creds", "destination": "/hangar/supervisor"}]}),
            ),
            INVALID,
        ),
        create(
            "an attachment above hangar's socket directory",
            sandbox("s-attach-r4", json!({"attachments": [{"secretName": "creds", "destination": "/var"}]})),
            INVALID,
        ),
        create(
            "an attachment at the socket directory through /run",
            sandbox("s-attach-r5", json!({"attachments": [{"secretName": "creds", "destination": "/run/hangar"}]})),
            INVALID,
        ),
        create(
            "an attachment at the root",
            sandbox("s-attach-r6", json!({"attachments": [{"secretName": "creds", "destination": "/"}]})),
            INVALID,
        ),
        create(
            "an attachment spelled with a trailing slash",
            sandbox("s-attach-r7", json!({"attachments": [{"secretName": "creds", "destination": "/var/"}]})),
            INVALID,
        ),
        create(
            "an attachment spelled with a dot segment",
            sandbox(
                "s-attach-r8",
                json!({"attachments": [{"secretName": "creds", "destination": "/var/./run/hangar"}]}),
            ),
            INVALID,
        ),
        // Names that only look like hangar's mounts are the tenant's to use
        // (the first object is accepted; the change is refused as any
        // change of attachments is).
        update(
            "near names of hangar's mounts are accepted, attachments stay immutable",
            sandbox(
                "u-attach-near",
                json!({"attachments": [
                    {"secretName": "a", "destination": "/workspaces/a"},
                    {"secretName": "b", "destination": "/hangar-data/b"},
                    {"secretName": "c", "destination": "/var/run/hangarx"},
                    {"secretName": "d", "destination": "/run/secrets/d"},
                ]}),
            ),
            sandbox("u-attach-near", json!({"attachments": [{"secretName": "a", "destination": "/workspaces/z"}]})),
            INVALID,
        ),
        // Sandbox, on update.
        update("mode is immutable", sandbox("u-mode", json!({})), sandbox("u-mode", json!({"mode": "agent"})), INVALID),
        update(
            "image is immutable",
            sandbox("u-image", json!({})),
            sandbox("u-image", json!({"image": format!("registry.example/other@{DIGEST}")})),
            INVALID,
        ),
        update(
            "image cannot become a template",
            sandbox("u-image-tpl", json!({})),
            sandbox("u-image-tpl", json!({"image": null, "template": "python-dev@1.2"})),
            INVALID,
        ),
        update(
            "tenant is immutable",
            sandbox("u-tenant", json!({"tenant": "acme"})),
            sandbox("u-tenant", json!({"tenant": "other"})),
            INVALID,
        ),
        update(
            "tenant cannot be added",
            sandbox("u-tenant-add", json!({})),
            sandbox("u-tenant-add", json!({"tenant": "acme"})),
            INVALID,
        ),
        update(
            "companions are immutable",
            sandbox("u-comp", json!({"companions": [{"name": "db", "image": image()}]})),
            sandbox("u-comp", json!({"companions": [{"name": "cache", "image": image()}]})),
            INVALID,
        ),
        update(
            "state Ended is final",
            sandbox("u-ended", json!({"state": "Ended"})),
            sandbox("u-ended", json!({"state": "Running"})),
            "sandbox_ended",
        ),
        update(
            "state Ended cannot be unset",
            sandbox("u-ended-unset", json!({"state": "Ended"})),
            sandbox("u-ended-unset", json!({})),
            "sandbox_ended",
        ),
        update(
            "revokeAll is final",
            sandbox("u-revoke", json!({"revokeAll": true})),
            sandbox("u-revoke", json!({"revokeAll": false})),
            "sandbox_ended",
        ),
        update(
            "mode agent cannot be paused",
            agent("u-agent-pause", json!({})),
            agent("u-agent-pause", json!({"state": "Paused"})),
            "sandbox_pause_unavailable",
        ),
        // Command.
        create("empty argv", command("c-argv", json!({"argv": []})), INVALID),
        create("empty program", command("c-argv0", json!({"argv": [""]})), INVALID),
        create("timeoutSeconds 0", command("c-t-lo", json!({"timeoutSeconds": 0})), INVALID),
        create("timeoutSeconds 86401", command("c-t-hi", json!({"timeoutSeconds": 86401})), INVALID),
        create("env name with a dash", command("c-env", json!({"env": [{"name": "MY-VAR", "value": "1"}]})), INVALID),
        create("relative workingDir", command("c-wd", json!({"workingDir": "src"})), INVALID),
        update(
            "argv is immutable",
            command("cu-argv", json!({})),
            command("cu-argv", json!({"argv": ["rm", "-rf", "/"]})),
            INVALID,
        ),
        update(
            "sandbox reference is immutable",
            command("cu-sbx", json!({})),
            command("cu-sbx", json!({"sandbox": "other"})),
            INVALID,
        ),
        update(
            "env is immutable",
            command("cu-env", json!({})),
            command("cu-env", json!({"env": [{"name": "A", "value": "1"}]})),
            INVALID,
        ),
        update(
            "workingDir is immutable",
            command("cu-wd", json!({})),
            command("cu-wd", json!({"workingDir": "/tmp"})),
            INVALID,
        ),
        update(
            "timeoutSeconds is immutable",
            command("cu-t", json!({})),
            command("cu-t", json!({"timeoutSeconds": 10})),
            INVALID,
        ),
        update(
            "cancel is final",
            command("cu-cancel", json!({"cancel": true})),
            command("cu-cancel", json!({"cancel": false})),
            "sandbox_command_cancelled",
        ),
        // SessionToken.
        create("no scopes", token("t-none", json!({"scopes": []})), INVALID),
        create("unknown scope", token("t-admin", json!({"scopes": ["admin"]})), INVALID),
        create("duplicate scopes", token("t-dup", json!({"scopes": ["read", "read"]})), INVALID),
        create("four scopes", token("t-four", json!({"scopes": ["read", "exec", "control", "read"]})), INVALID),
        create("ttlSeconds 59", token("t-ttl-lo", json!({"ttlSeconds": 59})), INVALID),
        create("ttlSeconds 86401", token("t-ttl-hi", json!({"ttlSeconds": 86401})), INVALID),
        create("RSA key", token("t-rsa", json!({"publicKey": {"kty": "RSA"}})), INVALID),
        create("P-384 key", token("t-p384", json!({"publicKey": {"crv": "P-384"}})), INVALID),
        create("short x coordinate", token("t-x", json!({"publicKey": {"x": "abc"}})), INVALID),
        update(
            "scopes are immutable",
            token("tu-scopes", json!({})),
            token("tu-scopes", json!({"scopes": ["read", "control"]})),
            INVALID,
        ),
        update(
            "publicKey is immutable",
            token("tu-key", json!({})),
            token("tu-key", json!({"publicKey": {"x": Y, "y": X}})),
            INVALID,
        ),
        update(
            "token sandbox is immutable",
            token("tu-sbx", json!({})),
            token("tu-sbx", json!({"sandbox": "other"})),
            INVALID,
        ),
        update(
            "ttlSeconds is immutable",
            token("tu-ttl", json!({})),
            token("tu-ttl", json!({"ttlSeconds": 86400})),
            INVALID,
        ),
        update(
            "revoked is final",
            token("tu-revoked", json!({"revoked": true})),
            token("tu-revoked", json!({"revoked": false})),
            INVALID,
        ),
        // SandboxTemplate (cluster-scoped).
        create(
            "template sbomDigest not sha256",
            template("tpl-sbom", json!({"manifest": {"sbomDigest": "md5:00"}})),
            INVALID,
        ),
        create("template image by tag", template("tpl-img", json!({"manifest": {"image": "python:3"}})), INVALID),
        create("template name with @", template("tpl-name", json!({"name": "python@dev"})), INVALID),
        update(
            "template is immutable",
            template("tpl-imm", json!({})),
            template("tpl-imm", json!({"version": "2.0"})),
            INVALID,
        ),
    ]
}

fn spec_of(cp: &ControlPlane, ns: &str, obj: &Value) -> Value {
    let kind = obj["kind"].as_str().unwrap();
    let name = obj["metadata"]["name"].as_str().unwrap();
    let (ok, out) = kubectl(cp, &["get", "-n", ns, kind, name, "-o", "json"], None);
    assert!(ok, "get {kind}/{name}: {out}");
    serde_json::from_str::<Value>(&out).unwrap()["spec"].clone()
}

#[test]
fn refusal_table_carries_the_contract_codes_and_changes_nothing() {
    let cp = shared_control_plane();
    let ns = "refusals";
    namespace(cp, ns);
    let rows = rows();
    assert!(rows.len() >= 30, "the table has {} rows", rows.len());
    let mut failures = Vec::new();
    for row in &rows {
        let mut before_spec = None;
        if let Some(before) = &row.before {
            let (ok, out) = kubectl(cp, &["apply", "-n", ns, "-f", "-"], Some(&before.to_string()));
            assert!(ok, "{}: the valid starting object was refused: {out}", row.name);
            before_spec = Some(spec_of(cp, ns, before));
        }
        let (ok, out) = kubectl(cp, &["apply", "-n", ns, "-f", "-"], Some(&row.apply.to_string()));
        if ok {
            failures.push(format!("{}: accepted, expected {}", row.name, row.code));
            continue;
        }
        if !out.contains(&format!("{}: ", row.code)) {
            failures.push(format!("{}: refused without `{}`: {}", row.name, row.code, out.trim()));
        }
        match before_spec {
            Some(spec) => {
                if spec_of(cp, ns, &row.apply) != spec {
                    failures.push(format!("{}: the refused update changed the object", row.name));
                }
            }
            None => {
                let kind = row.apply["kind"].as_str().unwrap();
                let name = row.apply["metadata"]["name"].as_str().unwrap();
                let (exists, _) = kubectl(cp, &["get", "-n", ns, kind, name], None);
                if exists {
                    failures.push(format!("{}: the refused create left an object behind", row.name));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} of {} rows failed:\n{}", failures.len(), rows.len(), failures.join("\n"));
}

#[test]
fn every_example_is_accepted() {
    let cp = shared_control_plane();
    let ns = "examples";
    namespace(cp, ns);
    let dir = hangar_e2e::paths::repo_root().join("examples");
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.path()).collect();
    files.sort();
    assert!(files.len() >= 5, "examples/ has {} files", files.len());
    for file in &files {
        let (ok, out) = kubectl(cp, &["apply", "-n", ns, "-f", file.to_str().unwrap()], None);
        assert!(ok, "{} was refused: {out}", file.display());
    }
    // Applying again is a no-op, not a refusal (GitOps re-syncs).
    let (ok, out) = kubectl(cp, &["apply", "-n", ns, "-f", dir.to_str().unwrap()], None);
    assert!(ok, "re-apply of examples/: {out}");
    assert!(out.contains("unchanged"), "re-apply should leave objects unchanged: {out}");
}

/// The committed YAML (what `kubectl apply -f crds/manifests/` and Helm
/// install) is read as the harness's typed CRDs are: YAML 1.1 quirks such as
/// a bare `y` key would break it.
#[test]
fn committed_crd_yaml_applies_with_kubectl() {
    let cp = shared_control_plane();
    let dir = hangar_e2e::paths::repo_root().join("crds/manifests");
    let (ok, out) = kubectl(
        cp,
        &["apply", "--server-side", "--force-conflicts", "--dry-run=server", "-f", dir.to_str().unwrap()],
        None,
    );
    assert!(ok, "{out}");
    assert_eq!(out.matches("serverside-applied").count(), 4, "{out}");
}

#[test]
fn unknown_fields_are_refused_by_strict_field_validation() {
    let cp = shared_control_plane();
    let ns = "strict";
    namespace(cp, ns);
    for (obj, field) in [
        (command("stdin", json!({"stdin": true})), "spec.stdin"),
        (command("tty", json!({"tty": true})), "spec.tty"),
        (sandbox("shell", json!({"interactiveShell": true})), "spec.interactiveShell"),
    ] {
        let (ok, out) = kubectl(cp, &["apply", "-n", ns, "-f", "-"], Some(&obj.to_string()));
        assert!(!ok, "{field} was accepted: {out}");
        assert!(out.contains(&format!("unknown field \"{field}\"")), "{field}: {out}");
    }
}

#[test]
fn defaults_are_applied_by_the_schema() {
    let cp = shared_control_plane();
    let ns = "defaults";
    namespace(cp, ns);
    let minimal = object("Sandbox", "minimal", json!({"image": image()}), json!({}));
    let (ok, out) = kubectl(cp, &["apply", "-n", ns, "-f", "-"], Some(&minimal.to_string()));
    assert!(ok, "{out}");
    let spec = spec_of(cp, ns, &minimal);
    assert_eq!(spec["mode"], "agent");
    assert_eq!(spec["size"], "small");
    assert_eq!(spec["state"], "Running");
    assert_eq!(spec["outputRetentionDays"], 30);
    assert_eq!(spec["revokeAll"], false);
    // The idle defaults depend on the mode, so the schema leaves them unset
    // and SandboxSpec::idle_policy supplies them (commands mode: 900 s, end).
    let commands = sandbox("commands-minimal", json!({}));
    let (ok, out) = kubectl(cp, &["apply", "-n", ns, "-f", "-"], Some(&commands.to_string()));
    assert!(ok, "{out}");
    let spec: hangar_crds::SandboxSpec = serde_json::from_value(spec_of(cp, ns, &commands)).unwrap();
    assert_eq!(spec.idle_timeout_seconds, None);
    let policy = spec.idle_policy().expect("commands mode has an idle policy");
    assert_eq!((policy.timeout_seconds, policy.action), (900, hangar_crds::IdleAction::End));

    let cmd = command("defaulted", json!({}));
    let (ok, out) = kubectl(cp, &["apply", "-n", ns, "-f", "-"], Some(&cmd.to_string()));
    assert!(ok, "{out}");
    let spec = spec_of(cp, ns, &cmd);
    assert_eq!(spec["timeoutSeconds"], 3600);
    assert_eq!(spec["cancel"], false);

    let tok = token("defaulted", json!({}));
    let (ok, out) = kubectl(cp, &["apply", "-n", ns, "-f", "-"], Some(&tok.to_string()));
    assert!(ok, "{out}");
    let spec = spec_of(cp, ns, &tok);
    assert_eq!(spec["ttlSeconds"], 3600);
    assert_eq!(spec["revoked"], false);
}

#[test]
fn printer_columns_and_short_names_work() {
    let cp = shared_control_plane();
    let ns = "columns";
    namespace(cp, ns);
    let sbx = sandbox("listed", json!({}));
    let (ok, out) = kubectl(cp, &["apply", "-n", ns, "-f", "-"], Some(&sbx.to_string()));
    assert!(ok, "{out}");
    let (ok, out) = kubectl(cp, &["get", "sbx", "-n", ns], None);
    assert!(ok, "{out}");
    let header = out.lines().next().unwrap_or_default();
    for col in ["NAME", "PHASE", "MODE", "INSTANCE", "AGE"] {
        assert!(header.contains(col), "missing column {col}: {header}");
    }
    assert!(out.contains("listed") && out.contains("commands"), "{out}");
    let (ok, out) = kubectl(cp, &["get", "hangar", "-n", ns], None);
    assert!(ok && out.contains("sandbox.hangar.dev/listed"), "category `hangar`: {out}");
}

//! The admission webhook as a real process on loopback, registered with the
//! local apiserver by a ValidatingWebhookConfiguration whose
//! `clientConfig.url` is `https://127.0.0.1:PORT/...` and whose caBundle is
//! the local CA (the webhook serves the apiserver's own loopback
//! certificate, which that CA signed).

use std::process::Command;
use std::time::Duration;

use base64::Engine;
use serde_json::json;

use crate::control_plane::ControlPlane;
use crate::error::Result;
use crate::operator::workspace_binary;
use crate::process::{ChildProcess, free_port, port_open, wait_until};

pub const CONFIGURATION: &str = "hangar-webhook";

pub struct WebhookProcess {
    process: ChildProcess,
    pub port: u16,
    /// Its admin server (/healthz, /readyz, /metrics).
    pub admin_port: u16,
}

impl WebhookProcess {
    pub fn start(cp: &ControlPlane) -> Result<Self> {
        let port = free_port();
        let admin_port = free_port();
        let mut cmd = Command::new(workspace_binary("hangar-webhook"));
        cmd.env("KUBECONFIG", &cp.kubeconfig)
            .env("HANGAR_WEBHOOK_ADMIN_LISTEN", format!("127.0.0.1:{admin_port}"))
            .env("HANGAR_WEBHOOK_LISTEN", format!("127.0.0.1:{port}"))
            .env("HANGAR_WEBHOOK_TLS_CERT", &cp.pki.serving_cert)
            .env("HANGAR_WEBHOOK_TLS_KEY", &cp.pki.serving_key)
            .env("HANGAR_WEBHOOK_CLIENT_CA", &cp.pki.admission_client_ca)
            .env("RUST_LOG", "info");
        let mut process = ChildProcess::spawn("hangar-webhook", cmd, &cp.dir().join("webhook.log"))?;
        // Ready once its HTTPS listener is bound.
        wait_until("hangar-webhook /readyz", &mut process, Duration::from_secs(30), || {
            port_open(port) && crate::process::http_get(admin_port, "/readyz").is_ok_and(|(s, _)| s == 200)
        })?;
        Ok(Self { process, port, admin_port })
    }

    /// Its `/metrics` text.
    pub fn metrics(&self) -> String {
        crate::process::http_get(self.admin_port, "/metrics").map(|(_, b)| b).unwrap_or_default()
    }

    /// `Err` with its log tail when the process has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        self.process.check_alive()
    }

    /// Registers the webhooks (Command creates, SessionToken creates, writes
    /// by session-token identities) (`kubectl apply`, so a
    /// restarted stack simply takes the new port).
    pub fn register(&self, cp: &ControlPlane) -> Result<()> {
        let ca = std::fs::read(&cp.pki.ca_cert).map_err(crate::error::io("read CA"))?;
        let ca_bundle = base64::engine::general_purpose::STANDARD.encode(ca);
        let hook = |name: &str, path: &str, rules: serde_json::Value| {
            json!({
                "name": name,
                "clientConfig": {
                    "url": format!("https://127.0.0.1:{}{path}", self.port),
                    "caBundle": ca_bundle,
                },
                "rules": rules,
                "failurePolicy": "Fail",
                "sideEffects": "NoneOnDryRun",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 10,
            })
        };
        let rule = |ops: &[&str], resources: &[&str]| json!({"apiGroups": ["hangar.dev"], "apiVersions": ["v1alpha1"], "operations": ops, "resources": resources});
        // The same three webhooks as the chart's (charts/hangar/templates/webhook.yaml).
        let mut token_callers = hook(
            "token-callers.hangar.dev",
            "/validate/token-callers",
            json!([
                rule(&["UPDATE", "DELETE"], &["commands", "commands/status"]),
                rule(
                    &["CREATE", "UPDATE", "DELETE"],
                    &["sandboxes", "sandboxes/status", "sessiontokens", "sessiontokens/status", "sandboxtemplates"]
                ),
            ]),
        );
        token_callers["matchConditions"] =
            json!([{"name": "session-token-identity", "expression": TOKEN_CALLER_CONDITION}]);
        let config = json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": CONFIGURATION},
            "webhooks": [
                hook("commands.hangar.dev", "/validate/commands", json!([rule(&["CREATE"], &["commands"])])),
                hook("sessiontokens.hangar.dev", "/validate/sessiontokens", json!([rule(&["CREATE"], &["sessiontokens"])])),
                token_callers,
            ],
        });
        let path = cp.dir().join("webhook-configuration.json");
        std::fs::write(&path, config.to_string()).map_err(crate::error::io("write webhook configuration"))?;
        let out = cp.kubectl().args(["apply", "-f"]).arg(&path).output().map_err(crate::error::io("kubectl apply"))?;
        if !out.status.success() {
            return Err(crate::error::HarnessError::NotReady {
                what: "the webhook registration".into(),
                seconds: 0,
                log_tail: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        Ok(())
    }
}

/// Which requests the token-callers webhook sees: those of a session
/// token's identity (the chart's matchCondition too).
pub const TOKEN_CALLER_CONDITION: &str = "request.userInfo.username.startsWith('hangar:token:') || (has(request.userInfo.groups) && 'hangar:session-tokens' in request.userInfo.groups)";

//! The admission webhook as a real process on loopback, registered with the
//! local apiserver by a ValidatingWebhookConfiguration whose
//! `clientConfig.url` is `https://127.0.0.1:PORT/...`. As in the chart, the
//! webhook makes its own serving certificate at start-up (kept in a Secret
//! in the system namespace), writes its CA into the configuration's
//! caBundle and rotates it before it expires; `start_with_files` serves the
//! local CA's loopback certificate instead (benchmarks that call it
//! directly).

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
    /// Its health server (/healthz, /readyz) and metrics server (HTTPS).
    pub admin_port: u16,
    pub metrics_port: u16,
    scraper: std::sync::Arc<crate::scrape::Scraper>,
    /// Its ValidatingWebhookConfiguration, and the Secret of its certificate
    /// when it makes its own.
    pub configuration: String,
    pub cert_secret: Option<String>,
}

/// How a webhook process is started.
#[derive(Clone, Debug)]
pub struct WebhookOptions {
    pub configuration: String,
    /// `Some(secret)`: it makes and rotates its own certificate, kept there;
    /// `None`: it serves the local CA's loopback certificate from files.
    pub cert_secret: Option<String>,
    pub cert_validity_seconds: u64,
    pub cert_renew_before_seconds: u64,
    pub cert_check_seconds: u64,
    /// Only requests in these namespaces (a second webhook beside the stack's).
    pub namespaces: Option<Vec<String>>,
    pub log: String,
    /// Where command admissions are decided (the operator's node service).
    pub decider: Option<crate::operator::WebhookDecider>,
}

impl Default for WebhookOptions {
    fn default() -> Self {
        Self {
            configuration: CONFIGURATION.into(),
            cert_secret: Some("hangar-webhook-tls".into()),
            cert_validity_seconds: 86400,
            cert_renew_before_seconds: 3600,
            cert_check_seconds: 5,
            namespaces: None,
            log: "webhook.log".into(),
            decider: None,
        }
    }
}

impl WebhookProcess {
    /// The stack's webhook: its own certificate, registered for every
    /// namespace, asking `decider` for command admissions.
    pub fn start(cp: &ControlPlane, decider: crate::operator::WebhookDecider) -> Result<Self> {
        Self::start_with(cp, WebhookOptions { decider: Some(decider), ..Default::default() })
    }

    /// Serving the local CA's certificate from files.
    pub fn start_with_files(cp: &ControlPlane, decider: crate::operator::WebhookDecider) -> Result<Self> {
        Self::start_with(cp, WebhookOptions { cert_secret: None, decider: Some(decider), ..Default::default() })
    }

    /// Registered first (without a caBundle when it makes its own
    /// certificate: it writes the bundle itself), then started.
    pub fn start_with(cp: &ControlPlane, opts: WebhookOptions) -> Result<Self> {
        let port = free_port();
        let (admin_port, metrics_port) = (free_port(), free_port());
        let scraper = crate::scrape::Scraper::of(cp)?;
        register(cp, port, &opts)?;
        let mut cmd = Command::new(workspace_binary("hangar-webhook"));
        cmd.envs(crate::scrape::metrics_env(cp, metrics_port));
        cmd.env("KUBECONFIG", &cp.kubeconfig)
            .env("HANGAR_WEBHOOK_ADMIN_LISTEN", format!("127.0.0.1:{admin_port}"))
            .env("HANGAR_WEBHOOK_LISTEN", format!("127.0.0.1:{port}"))
            .env("HANGAR_WEBHOOK_CLIENT_CA", &cp.pki.admission_client_ca)
            .env("POD_NAMESPACE", crate::operator::SYSTEM_NAMESPACE)
            .env("HANGAR_TEMPLATE_KEYS", crate::templates::trusted_keys_env())
            .env("RUST_LOG", "info");
        if let Some(d) = &opts.decider {
            cmd.env("HANGAR_OPERATOR_URL", &d.url)
                .env("HANGAR_OPERATOR_CA", &d.ca)
                .env("HANGAR_OPERATOR_TOKEN_FILE", &d.token_file);
        }
        match &opts.cert_secret {
            Some(secret) => {
                cmd.env("HANGAR_WEBHOOK_CERTIFICATE", "self")
                    .env("HANGAR_WEBHOOK_CERT_SECRET", secret)
                    .env("HANGAR_WEBHOOK_CERT_NAMES", "127.0.0.1,localhost")
                    .env("HANGAR_WEBHOOK_CONFIGURATIONS", &opts.configuration)
                    .env("HANGAR_WEBHOOK_CERT_VALIDITY_SECONDS", opts.cert_validity_seconds.to_string())
                    .env("HANGAR_WEBHOOK_CERT_RENEW_BEFORE_SECONDS", opts.cert_renew_before_seconds.to_string())
                    .env("HANGAR_WEBHOOK_CERT_CHECK_SECONDS", opts.cert_check_seconds.to_string());
            }
            None => {
                cmd.env("HANGAR_WEBHOOK_CERTIFICATE", "files")
                    .env("HANGAR_WEBHOOK_TLS_CERT", &cp.pki.serving_cert)
                    .env("HANGAR_WEBHOOK_TLS_KEY", &cp.pki.serving_key);
            }
        }
        let mut process = ChildProcess::spawn("hangar-webhook", cmd, &cp.dir().join(&opts.log))?;
        // Ready once its HTTPS listener is bound.
        wait_until("hangar-webhook /readyz", &mut process, Duration::from_secs(30), || {
            port_open(port) && crate::process::http_get(admin_port, "/readyz").is_ok_and(|(s, _)| s == 200)
        })?;
        Ok(Self {
            process,
            port,
            admin_port,
            metrics_port,
            scraper,
            configuration: opts.configuration,
            cert_secret: opts.cert_secret,
        })
    }

    /// Killed and started again (a new certificate, as at any start).
    pub fn restart(&mut self) -> Result<()> {
        self.process.respawn()?;
        let (port, admin) = (self.port, self.admin_port);
        wait_until("hangar-webhook /readyz", &mut self.process, Duration::from_secs(30), || {
            port_open(port) && crate::process::http_get(admin, "/readyz").is_ok_and(|(s, _)| s == 200)
        })
    }

    /// The CAs it is trusted under now: its Secret's bundle, or the local CA.
    pub async fn ca_bundle(&self, cp: &ControlPlane) -> String {
        let Some(secret) = &self.cert_secret else {
            return cp.pki.ca_pem.clone();
        };
        let client = cp.client().await.expect("client");
        let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
            kube::Api::namespaced(client, crate::operator::SYSTEM_NAMESPACE);
        let s = secrets.get(secret).await.expect("the webhook's certificate Secret");
        String::from_utf8(s.data.unwrap_or_default()["ca-bundle.crt"].0.clone()).expect("PEM")
    }

    /// Its `/metrics` text.
    pub fn metrics(&self) -> String {
        self.scraper.metrics(self.metrics_port)
    }

    /// `Err` with its log tail when the process has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        self.process.check_alive()
    }
}

/// Registers the webhooks (Command creates, SessionToken creates, writes by
/// session-token identities) for a webhook on `port` (`kubectl apply`, so a
/// restarted stack simply takes the new port).
fn register(cp: &ControlPlane, port: u16, opts: &WebhookOptions) -> Result<()> {
    let ca = std::fs::read(&cp.pki.ca_cert).map_err(crate::error::io("read CA"))?;
    let ca_bundle = base64::engine::general_purpose::STANDARD.encode(ca);
    let hook = |name: &str, path: &str, rules: serde_json::Value| {
        let mut hook = json!({
            "name": name,
            "clientConfig": {"url": format!("https://127.0.0.1:{port}{path}")},
            "rules": rules,
            "failurePolicy": "Fail",
            "sideEffects": "NoneOnDryRun",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 10,
        });
        if opts.cert_secret.is_none() {
            hook["clientConfig"]["caBundle"] = json!(ca_bundle);
        }
        if let Some(namespaces) = &opts.namespaces {
            hook["namespaceSelector"] = json!({"matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": namespaces}]});
        }
        hook
    };
    let rule = |ops: &[&str], resources: &[&str]| json!({"apiGroups": ["hangar.dev"], "apiVersions": ["v1alpha1"], "operations": ops, "resources": resources});
    // The same four webhooks as the chart's (charts/hangar/templates/webhook.yaml).
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
    let mut sandboxes = hook(
        "sandboxes.hangar.dev",
        "/validate/sandboxes",
        json!([rule(&["CREATE", "UPDATE", "DELETE"], &["sandboxes"])]),
    );
    sandboxes["matchConditions"] = json!([{"name": "create-or-end", "expression": SANDBOX_CREATE_OR_END_CONDITION}]);
    let config = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": opts.configuration},
        "webhooks": [
            hook("commands.hangar.dev", "/validate/commands", json!([rule(&["CREATE"], &["commands"])])),
            hook("sessiontokens.hangar.dev", "/validate/sessiontokens", json!([rule(&["CREATE"], &["sessiontokens"])])),
            sandboxes,
            token_callers,
        ],
    });
    let path = cp.dir().join(format!("{}.json", opts.configuration));
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

/// Which requests the token-callers webhook sees: those of a session
/// token's identity (the chart's matchCondition too).
/// The Sandbox writes the webhook sees: creates, and ends (an update to
/// `state: Ended`, a delete), which it announces to the command decider.
pub const SANDBOX_CREATE_OR_END_CONDITION: &str = "request.operation == 'CREATE' || request.operation == 'DELETE' || (has(object.spec.state) && object.spec.state == 'Ended' && !(has(oldObject.spec.state) && oldObject.spec.state == 'Ended'))";

pub const TOKEN_CALLER_CONDITION: &str = "request.userInfo.username.startsWith('hangar:token:') || (has(request.userInfo.groups) && 'hangar:session-tokens' in request.userInfo.groups)";

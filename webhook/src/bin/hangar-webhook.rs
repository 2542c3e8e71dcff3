//! hangar-webhook: serves admission for the hangar.dev kinds over TLS.
//! `POST /validate/commands`, `/validate/sessiontokens`, `/validate/sandboxes`
//! and `/validate/token-callers` (ValidatingWebhookConfiguration),
//! `GET /healthz`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use bytes::Bytes;
use clap::Parser;
use hangar_crds::{Command, Sandbox, SessionToken};
use hangar_webhook::admission::{AdmissionError, caches, commands, review, sandboxes, session_tokens, token_callers};
use kube::core::admission::{AdmissionRequest, AdmissionReview, Operation};
use std::sync::Arc;
use tracing::Instrument;

use hangar_runtime::admin::{self, HttpMetrics};
use hangar_runtime::https::{self, Body, RequestBody};
use hangar_runtime::serving_cert;
use hangar_webhook::metrics::AdmissionMetrics;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, Response, StatusCode};
use prometheus_client::registry::Registry;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum CertificateSource {
    #[value(name = "self")]
    SelfManaged,
    Files,
}

#[derive(Parser, Debug)]
#[command(version, about = "hangar admission webhook")]
struct Settings {
    /// Address to serve HTTPS on.
    #[arg(long, env = "HANGAR_WEBHOOK_LISTEN", default_value = "0.0.0.0:8443")]
    listen: SocketAddr,
    /// Where the serving certificate comes from: `self` (made at start-up,
    /// kept in a Secret, its CA written into the webhook configurations,
    /// rotated before expiry) or `files` (`--tls-cert`/`--tls-key`, e.g.
    /// cert-manager's Secret mounted; reloaded when they change).
    #[arg(long, env = "HANGAR_WEBHOOK_CERTIFICATE", default_value = "files")]
    certificate: CertificateSource,
    /// PEM certificate chain of the serving certificate (`files`).
    #[arg(long, env = "HANGAR_WEBHOOK_TLS_CERT", default_value = "/etc/hangar/webhook-tls/tls.crt")]
    tls_cert: PathBuf,
    /// PEM private key of the serving certificate (`files`).
    #[arg(long, env = "HANGAR_WEBHOOK_TLS_KEY", default_value = "/etc/hangar/webhook-tls/tls.key")]
    tls_key: PathBuf,
    /// `self`: the Secret (in the system namespace) holding the certificate.
    #[arg(long, env = "HANGAR_WEBHOOK_CERT_SECRET", default_value = "hangar-webhook-tls")]
    cert_secret: String,
    /// `self`: the names (DNS or IP) the certificate is for.
    #[arg(long, env = "HANGAR_WEBHOOK_CERT_NAMES", value_delimiter = ',', default_value = "")]
    cert_names: Vec<String>,
    /// `self`: the ValidatingWebhookConfigurations whose caBundle is kept.
    #[arg(long, env = "HANGAR_WEBHOOK_CONFIGURATIONS", value_delimiter = ',', default_value = "")]
    webhook_configurations: Vec<String>,
    /// `self`: how long a certificate is valid, and how long before its end
    /// it is replaced.
    #[arg(long, env = "HANGAR_WEBHOOK_CERT_VALIDITY_SECONDS", default_value_t = 90 * 86400)]
    cert_validity_seconds: u64,
    #[arg(long, env = "HANGAR_WEBHOOK_CERT_RENEW_BEFORE_SECONDS", default_value_t = 30 * 86400)]
    cert_renew_before_seconds: u64,
    /// How often the certificate is checked (either source).
    #[arg(long, env = "HANGAR_WEBHOOK_CERT_CHECK_SECONDS", default_value_t = 60)]
    cert_check_seconds: u64,
    /// PEM CA that issued the apiserver's admission client certificate:
    /// when set, only a client presenting one may send reviews (anything
    /// else that can reach the port is refused at the handshake).
    #[arg(long, env = "HANGAR_WEBHOOK_CLIENT_CA")]
    client_ca: Option<PathBuf>,
    /// Address of the health server (/healthz, /readyz; plain HTTP).
    #[arg(long, env = "HANGAR_WEBHOOK_ADMIN_LISTEN", default_value = "0.0.0.0:9090")]
    admin_listen: SocketAddr,
    #[command(flatten)]
    metrics: admin::MetricsArgs,
    /// Namespace of the operator (the webhook's own certificate Secret).
    #[arg(long, env = "POD_NAMESPACE", default_value = "hangar-system")]
    system_namespace: String,
    /// The operator's node service, where the leader decides command
    /// admissions (e.g. `https://hangar-operator-keys.hangar-system:8444`).
    /// Unset: no command can be admitted (every create is refused).
    #[arg(long, env = "HANGAR_OPERATOR_URL")]
    operator_url: Option<String>,
    /// PEM CA of the node service's certificate (nothing else is trusted).
    #[arg(long, env = "HANGAR_OPERATOR_CA")]
    operator_ca: Option<PathBuf>,
    /// This webhook's ServiceAccount token, shown to the operator.
    #[arg(
        long,
        env = "HANGAR_OPERATOR_TOKEN_FILE",
        default_value = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    )]
    operator_token_file: PathBuf,
    /// Public keys trusted to sign template releases, `name=<base64 Ed25519
    /// public key>` (the operator's own list).
    #[arg(long = "template-key", env = "HANGAR_TEMPLATE_KEYS", value_delimiter = ',', value_parser = parse_pair)]
    template_keys: Vec<(String, String)>,
}

fn parse_pair(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .filter(|(k, v)| !k.is_empty() && !v.is_empty())
        .ok_or_else(|| format!("expected name=key, got {s:?}"))
}

/// What every admission shares.
struct Webhook {
    commands: commands::CommandAdmission,
    tokens: session_tokens::TokenAdmission,
    sandboxes: sandboxes::SandboxAdmission,
    token_callers: token_callers::TokenCallers,
    http: HttpMetrics,
    metrics: AdmissionMetrics,
}

#[tokio::main]
async fn main() -> ExitCode {
    hangar_runtime::telemetry::init();
    let settings = Settings::parse();
    match run(settings).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "hangar-webhook stopped");
            ExitCode::FAILURE
        }
    }
}

async fn run(settings: Settings) -> Result<(), Box<dyn std::error::Error>> {
    let client = kube::Client::try_default().await?;
    let check_every = std::time::Duration::from_secs(settings.cert_check_seconds);
    let resolver = match settings.certificate {
        CertificateSource::Files => {
            serving_cert::start_from_files(settings.tls_cert.clone(), settings.tls_key.clone(), check_every)?
        }
        CertificateSource::SelfManaged => {
            let spec = serving_cert::SelfManaged {
                namespace: settings.system_namespace.clone(),
                secret: settings.cert_secret.clone(),
                names: settings.cert_names.iter().filter(|n| !n.is_empty()).cloned().collect(),
                validity: std::time::Duration::from_secs(settings.cert_validity_seconds),
                renew_before: std::time::Duration::from_secs(settings.cert_renew_before_seconds),
                webhook_configurations: settings
                    .webhook_configurations
                    .iter()
                    .filter(|n| !n.is_empty())
                    .cloned()
                    .collect(),
                check_every,
            };
            serving_cert::start_self_managed(client.clone(), spec).await?
        }
    };
    let config = https::server_config_with_resolver(resolver, settings.client_ca.as_deref())?;
    if settings.client_ca.is_none() {
        tracing::warn!("no client CA: any client that reaches the port can send reviews (rely on a NetworkPolicy)");
    }
    let (http, metrics) = (HttpMetrics::default(), AdmissionMetrics::default());
    let mut registry = Registry::with_prefix("hangar_webhook");
    http.register(&mut registry);
    metrics.register(&mut registry);
    // /healthz answers (and /readyz says 503) while the caches fill: an
    // apiserver slow to answer is waited for, not a reason to look dead.
    let readiness = admin::start_health(settings.admin_listen).await?;
    admin::start_metrics(&settings.metrics, client.clone(), registry, Default::default()).await?;
    let caches = caches::Caches::start(&client).await?;
    let decider = match (&settings.operator_url, &settings.operator_ca) {
        (Some(url), Some(ca)) => Some(commands::DeciderSettings {
            url: url.clone(),
            ca: std::fs::read(ca)?,
            token_file: settings.operator_token_file.clone(),
        }),
        _ => {
            tracing::warn!("no HANGAR_OPERATOR_URL and HANGAR_OPERATOR_CA: every Command create is refused");
            None
        }
    };
    let commands = commands::CommandAdmission::new(decider)?;
    let tokens = session_tokens::TokenAdmission::new(client.clone(), &caches);
    let keys = hangar_keys::template_signing::TrustedKeys::from_pairs(&settings.template_keys)?;
    let sandboxes = sandboxes::SandboxAdmission::new(client.clone(), &caches, keys);
    let token_callers = token_callers::TokenCallers::new(client, &caches);
    let wh = Arc::new(Webhook { commands, tokens, sandboxes, token_callers, http, metrics });
    let listener = tokio::net::TcpListener::bind(settings.listen).await?;
    tracing::info!(addr = %listener.local_addr()?, "admission webhook serving");
    readiness.set_ready();
    https::serve(listener, config, https::Limits::default(), https::shutdown_signal(), move |req| {
        let wh = wh.clone();
        async move {
            let started = std::time::Instant::now();
            let method = req.method().clone();
            let response = handle(&wh, req).await;
            wh.http.observe(method.as_str(), response.status().as_u16(), started.elapsed());
            response
        }
    })
    .await;
    Ok(())
}

async fn handle(wh: &Webhook, req: Request<RequestBody>) -> Response<Body> {
    let path = req.uri().path().to_owned();
    match (req.method(), path.as_str()) {
        (&Method::GET, "/healthz") => return text(StatusCode::OK, "ok"),
        (
            &Method::POST,
            "/validate/commands" | "/validate/sessiontokens" | "/validate/sandboxes" | "/validate/token-callers",
        ) => {}
        _ => return text(StatusCode::NOT_FOUND, "not found"),
    }
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return text(StatusCode::PAYLOAD_TOO_LARGE, "request body too large");
        }
        Err(e) => return text(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let decided = match path.as_str() {
        "/validate/commands" => validate_command(wh, &body).await,
        "/validate/sessiontokens" => validate_token(wh, &body).await,
        "/validate/sandboxes" => validate_sandbox(wh, &body).await,
        _ => validate_token_caller(wh, &body).await,
    };
    match decided {
        Ok(answer) => json(StatusCode::OK, &answer),
        // The apiserver applies failurePolicy (Fail): the write is refused.
        Err(e) => {
            tracing::warn!(error = %e, "could not decide an admission");
            text(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string())
        }
    }
}

fn request<K: kube::Resource + serde::de::DeserializeOwned>(
    body: &[u8],
) -> Result<AdmissionRequest<K>, AdmissionError> {
    let review: AdmissionReview<K> =
        serde_json::from_slice(body).map_err(|source| AdmissionError::Decode { kind: "AdmissionReview", source })?;
    review.try_into().map_err(|_| AdmissionError::NoRequest)
}

async fn validate_command(wh: &Webhook, body: &[u8]) -> Result<serde_json::Value, Arc<AdmissionError>> {
    let req: AdmissionRequest<Command> = request(body)?;
    if req.operation != Operation::Create {
        return Ok(to_json(review::answer(&req, None)));
    }
    let command = req.object.as_ref().ok_or(AdmissionError::NoObject)?;
    let ns = req.namespace.clone().unwrap_or_default();
    let span = tracing::info_span!("admit_command", namespace = %ns, sandbox = %command.spec.sandbox);
    // A token's scope first: a command it may not send takes no place.
    if let Some(refusal) =
        wh.token_callers.command_create(&req.user_info, &ns, command).instrument(span.clone()).await?
    {
        span.in_scope(|| tracing::info!(code = refusal.code.as_str(), "refused for the token"));
        wh.metrics.decided("Command", Some(refusal.code.as_str()));
        return Ok(to_json(review::answer(&req, Some(&refusal))));
    }
    let sender = token_callers::sender(&req.user_info);
    let decision = wh.commands.admit(&ns, command, sender, req.dry_run).instrument(span.clone()).await?;
    match &decision {
        Err(r) => span.in_scope(|| tracing::info!(code = r.code.as_str(), "refused")),
        Ok(()) => span.in_scope(|| tracing::debug!("admitted")),
    }
    wh.metrics.decided("Command", decision.as_ref().err().map(|r| r.code.as_str()));
    Ok(to_json(review::answer(&req, decision.as_ref().err())))
}

async fn validate_token(wh: &Webhook, body: &[u8]) -> Result<serde_json::Value, Arc<AdmissionError>> {
    let req: AdmissionRequest<SessionToken> = request(body)?;
    let refusal = match (&req.operation, req.object.as_ref()) {
        (Operation::Create, Some(token)) => {
            let ns = req.namespace.clone().unwrap_or_default();
            let span = tracing::info_span!("admit_session_token", namespace = %ns, sandbox = %token.spec.sandbox);
            wh.tokens.create(&ns, token).instrument(span).await?
        }
        _ => None,
    };
    wh.metrics.decided("SessionToken", refusal.as_ref().map(|r| r.code.as_str()));
    Ok(to_json(review::answer(&req, refusal.as_ref())))
}

async fn validate_sandbox(wh: &Webhook, body: &[u8]) -> Result<serde_json::Value, Arc<AdmissionError>> {
    let req: AdmissionRequest<Sandbox> = request(body)?;
    let refusal = match (&req.operation, req.object.as_ref()) {
        (Operation::Create, Some(sandbox)) => {
            let ns = req.namespace.clone().unwrap_or_default();
            let refusal = wh.sandboxes.create(&ns, sandbox).await?;
            if let Some(r) = &refusal {
                tracing::info!(namespace = %ns, sandbox = %req.name, code = r.code.as_str(), "refused a Sandbox");
            }
            refusal
        }
        // An end (the configuration sends only updates to `state: Ended`,
        // and deletes): announced to the command decider before the
        // apiserver stores it.
        (Operation::Update | Operation::Delete, _) if !req.dry_run => {
            let ns = req.namespace.clone().unwrap_or_default();
            let uid = req.old_object.as_ref().and_then(|s| s.metadata.uid.clone()).unwrap_or_default();
            wh.commands.announce_end(&ns, &req.name, &uid).await;
            None
        }
        _ => None,
    };
    wh.metrics.decided("Sandbox", refusal.as_ref().map(|r| r.code.as_str()));
    Ok(to_json(review::answer(&req, refusal.as_ref())))
}

async fn validate_token_caller(wh: &Webhook, body: &[u8]) -> Result<serde_json::Value, Arc<AdmissionError>> {
    let req: AdmissionRequest<kube::core::DynamicObject> = request(body)?;
    let span =
        tracing::info_span!("admit_token_write", kind = %req.kind.kind, namespace = ?req.namespace, name = %req.name);
    let refusal = wh.token_callers.write(&req).instrument(span).await?;
    if let Some(r) = &refusal {
        tracing::info!(code = r.code.as_str(), kind = %req.kind.kind, "refused a token's write");
    }
    let kind = match req.kind.kind.as_str() {
        "Command" => "Command",
        "Sandbox" => "Sandbox",
        "SessionToken" => "SessionToken",
        _ => "other",
    };
    wh.metrics.decided(kind, refusal.as_ref().map(|r| r.code.as_str()));
    Ok(to_json(review::answer(&req, refusal.as_ref())))
}

fn to_json(review: AdmissionReview<kube::core::DynamicObject>) -> serde_json::Value {
    serde_json::to_value(review).expect("an AdmissionReview serialises")
}

fn text(status: StatusCode, body: &str) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_owned())));
    *r.status_mut() = status;
    r
}

fn json(status: StatusCode, v: &serde_json::Value) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(serde_json::to_vec(v).expect("json"))));
    *r.status_mut() = status;
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    r
}

//! hangar-webhook: serves admission for the hangar.dev kinds over TLS.
//! `POST /validate/commands` (ValidatingWebhookConfiguration), `GET /healthz`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use bytes::Bytes;
use clap::Parser;
use hangar_crds::Command;
use hangar_webhook::admission::{AdmissionError, commands, review};
use hangar_runtime::https::{self, Body, RequestBody};
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, Response, StatusCode};

#[derive(Parser, Debug)]
#[command(version, about = "hangar admission webhook")]
struct Settings {
    /// Address to serve HTTPS on.
    #[arg(long, env = "HANGAR_WEBHOOK_LISTEN", default_value = "0.0.0.0:8443")]
    listen: SocketAddr,
    /// PEM certificate chain of the serving certificate.
    #[arg(long, env = "HANGAR_WEBHOOK_TLS_CERT", default_value = "/etc/hangar/webhook-tls/tls.crt")]
    tls_cert: PathBuf,
    /// PEM private key of the serving certificate.
    #[arg(long, env = "HANGAR_WEBHOOK_TLS_KEY", default_value = "/etc/hangar/webhook-tls/tls.key")]
    tls_key: PathBuf,
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
    let config = https::server_config(&settings.tls_cert, &settings.tls_key)?;
    let listener = tokio::net::TcpListener::bind(settings.listen).await?;
    tracing::info!(addr = %listener.local_addr()?, "admission webhook serving");
    let queues = std::sync::Arc::new(commands::SessionQueues::default());
    https::serve(listener, config, https::Limits::default(), https::shutdown_signal(), move |req| {
        handle(client.clone(), queues.clone(), req)
    })
    .await;
    Ok(())
}

async fn handle(client: kube::Client, queues: std::sync::Arc<commands::SessionQueues>, req: Request<RequestBody>) -> Response<Body> {
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/healthz") => text(StatusCode::OK, "ok"),
        (&Method::POST, "/validate/commands") => {
            let body = match req.into_body().collect().await {
                Ok(b) => b.to_bytes(),
                Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                    return text(StatusCode::PAYLOAD_TOO_LARGE, "request body too large");
                }
                Err(e) => return text(StatusCode::BAD_REQUEST, &e.to_string()),
            };
            match validate_command(&client, &queues, &body).await {
                Ok(answer) => json(StatusCode::OK, &answer),
                // The apiserver applies failurePolicy (Fail): the create is refused.
                Err(e) => {
                    tracing::warn!(error = %e, "could not decide an admission");
                    text(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string())
                }
            }
        }
        _ => text(StatusCode::NOT_FOUND, "not found"),
    }
}

async fn validate_command(
    client: &kube::Client,
    queues: &commands::SessionQueues,
    body: &[u8],
) -> Result<serde_json::Value, std::sync::Arc<AdmissionError>> {
    let review: review::Review =
        serde_json::from_slice(body).map_err(|source| AdmissionError::Decode { kind: "AdmissionReview", source })?;
    let req = review.request;
    if req.operation != "CREATE" {
        return Ok(review::answer(&req.uid, None));
    }
    let object = req.object.ok_or(AdmissionError::NoObject)?;
    let command: Command = serde_json::from_value(object).map_err(|source| AdmissionError::Decode { kind: "Command", source })?;
    let ns = req.namespace.unwrap_or_default();
    let span = tracing::info_span!("admit_command", namespace = %ns, sandbox = %command.spec.sandbox);
    let decision = tracing::Instrument::instrument(commands::admit(client, queues, &ns, &command, req.dry_run.unwrap_or(false)), span).await?;
    if let Err(r) = &decision {
        tracing::info!(code = r.code.as_str(), "refused");
    }
    Ok(review::answer(&req.uid, decision.as_ref().err()))
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

//! Admission of a new Command: its session must exist and not have ended,
//! and the session's limits hold: at most 247 commands in all and 64 not
//! yet finished.
//!
//! Decided by the operator's leader (`hangar_crds::command_admission`),
//! the one process that also numbers the session's commands: it holds
//! each session's ledger in memory, so a decision costs no write to the
//! apiserver and stays exact however many replicas of this webhook ask at
//! once. This module asks it over TLS (trusting only the operator's CA),
//! with this webhook's ServiceAccount token, which the operator checks by
//! TokenReview against its configured admission callers. And it announces
//! to the leader every end this webhook admits, before the apiserver
//! stores it, so a command sent right after an end is refused.
//!
//! No count a tenant can edit or delete is trusted (the ledger is out of
//! the tenant's reach), a repeated review or a create of an existing name
//! takes no place, and a reservation whose command never appeared is
//! released.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use backon::{ConstantBuilder, Retryable};
use hangar_core::refusal::Refusal;
use hangar_crds::command_admission::{
    CommandAdmissionAnswer, CommandAdmissionRequest, ENDING_PATH, EndingNotice, PATH,
};
use hangar_crds::{Command, ErrorCode};
use kube::ResourceExt;

use super::AdmissionError;

/// How long the token file is trusted before it is read again (projected
/// tokens are rotated well before they expire).
const TOKEN_REREAD: Duration = Duration::from_secs(60);
/// How long an end's announcement may take before the end is let through
/// anyway (the leader, when back, reads the session afresh).
const ENDING_TIMEOUT: Duration = Duration::from_secs(2);
/// Asks after a transient failure, and the pause before each: well within
/// the apiserver's 10 s for the whole review.
const ASK_RETRIES: usize = 2;
const RETRY_AFTER: Duration = Duration::from_millis(100);

/// Where the decisions are made and how to reach it.
pub struct DeciderSettings {
    /// The operator's node service, e.g. `https://hangar-operator-keys:8444`.
    pub url: String,
    /// The CA its certificate is checked against (PEM).
    pub ca: Vec<u8>,
    /// This webhook's ServiceAccount token (a projected token file).
    pub token_file: PathBuf,
}

pub struct CommandAdmission {
    decider: Option<Decider>,
}

struct Decider {
    http: reqwest::Client,
    decide_url: String,
    ending_url: String,
    token_file: PathBuf,
    token: Mutex<Option<(Instant, String)>>,
}

impl CommandAdmission {
    /// `None`: no decider is configured, and no command is admitted.
    pub fn new(settings: Option<DeciderSettings>) -> Result<Self, AdmissionError> {
        Ok(Self { decider: settings.map(Decider::new).transpose()? })
    }

    fn decider(&self) -> Result<&Decider, AdmissionError> {
        self.decider.as_ref().ok_or_else(|| AdmissionError::Decider("none is configured".into()))
    }

    /// Decides (and unless a dry run, reserves) the command's place.
    pub async fn admit(
        &self,
        namespace: &str,
        command: &Command,
        sender: Option<String>,
        dry_run: bool,
    ) -> Result<Result<(), Refusal>, AdmissionError> {
        self.decider()?.admit(namespace, command, sender, dry_run).await
    }

    /// Tells the leader that the session `uid` (`namespace`/`sandbox`) is
    /// ending. Best effort: an end is never held up by it.
    pub async fn announce_end(&self, namespace: &str, sandbox: &str, uid: &str) {
        match self.decider() {
            Ok(d) => d.announce_end(namespace, sandbox, uid).await,
            Err(e) => tracing::warn!(%namespace, %sandbox, error = %e, "could not announce an end"),
        }
    }
}

impl Decider {
    fn new(settings: DeciderSettings) -> Result<Self, AdmissionError> {
        let tls = hangar_runtime::https::client_config_trusting(&settings.ca)
            .map_err(|e| AdmissionError::Decider(e.to_string()))?;
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            // Within the apiserver's 10 s for the whole review.
            .timeout(Duration::from_secs(8))
            .pool_idle_timeout(Duration::from_secs(90))
            .build()
            .map_err(|e| AdmissionError::Decider(e.to_string()))?;
        let base = settings.url.trim_end_matches('/');
        Ok(Self {
            http,
            decide_url: format!("{base}{PATH}"),
            ending_url: format!("{base}{ENDING_PATH}"),
            token_file: settings.token_file,
            token: Mutex::default(),
        })
    }

    fn token(&self) -> Result<String, AdmissionError> {
        let mut held = self.token.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, t)) = held.as_ref()
            && at.elapsed() < TOKEN_REREAD
        {
            return Ok(t.clone());
        }
        let text = std::fs::read_to_string(&self.token_file)
            .map_err(|e| AdmissionError::Decider(format!("token file {}: {e}", self.token_file.display())))?;
        let t = text.trim().to_owned();
        *held = Some((Instant::now(), t.clone()));
        Ok(t)
    }

    async fn admit(
        &self,
        namespace: &str,
        command: &Command,
        sender: Option<String>,
        dry_run: bool,
    ) -> Result<Result<(), Refusal>, AdmissionError> {
        let ask = CommandAdmissionRequest {
            namespace: namespace.to_owned(),
            sandbox: command.spec.sandbox.clone(),
            uid: command.uid().unwrap_or_default(),
            name: command.name_any(),
            sender,
            dry_run,
        };
        let token = self.token()?;
        let ask_once = || async {
            let response = self.http.post(&self.decide_url).bearer_auth(&token).json(&ask).send().await?;
            if !response.status().is_success() {
                return Err(AdmissionError::DeciderAnswered(response.status()));
            }
            Ok(response.json::<CommandAdmissionAnswer>().await?)
        };
        // A decision is idempotent (a repeated ask takes no second place),
        // so a moment's unavailability is asked through: a leader changing,
        // or the operator's token checks at their limit.
        let answer = ask_once
            .retry(ConstantBuilder::default().with_delay(RETRY_AFTER).with_max_times(ASK_RETRIES).with_jitter())
            .when(AdmissionError::is_transient)
            .notify(|e, _| tracing::info!(error = %e, "asking the command decider again"))
            .await?;
        if answer.allowed {
            return Ok(Ok(()));
        }
        let code = answer.code.as_deref().and_then(ErrorCode::parse).ok_or_else(|| {
            AdmissionError::Decider(format!("a refusal with no code the contract knows: {:?}", answer.code))
        })?;
        Ok(Err(Refusal::new(code, answer.reason.unwrap_or_default())))
    }

    async fn announce_end(&self, namespace: &str, sandbox: &str, uid: &str) {
        let notice = EndingNotice { namespace: namespace.to_owned(), sandbox: sandbox.to_owned(), uid: uid.to_owned() };
        let sent = async {
            let r = self.http.post(&self.ending_url).bearer_auth(self.token()?).json(&notice).send().await?;
            if !r.status().is_success() {
                return Err(AdmissionError::DeciderAnswered(r.status()));
            }
            Ok(())
        };
        match tokio::time::timeout(ENDING_TIMEOUT, sent).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(%namespace, %sandbox, error = %e, "could not announce an end"),
            Err(_) => tracing::warn!(%namespace, %sandbox, "announcing an end timed out"),
        }
    }
}

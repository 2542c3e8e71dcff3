//! A client of the operator's workspace key service, for the tests that
//! act as a worker or an attacker and for the hand-over benchmark.

use base64::Engine;
use hangar_crds::Sandbox;
use kube::ResourceExt;
use serde_json::{Value, json};
use zeroize::Zeroizing;

use crate::LocalStack;
use crate::imds::{IdentityAuthority, InstanceIdentity};

pub struct KeyClient {
    http: reqwest::Client,
    pub url: String,
}

impl KeyClient {
    pub fn new(stack: &LocalStack) -> Self {
        let ca = std::fs::read_to_string(&stack.key_service.ca).expect("key service CA");
        Self { http: crate::gateway::https_client_trusting(&ca, None), url: stack.key_service.url() }
    }

    pub async fn nonce(&self) -> String {
        let r = self.http.post(format!("{}/v1/workspace-keys/nonces", self.url)).send().await.expect("nonce");
        assert_eq!(r.status(), 200);
        r.json::<Value>().await.expect("nonce json")["nonce"].as_str().expect("nonce").to_owned()
    }

    /// The status and, when granted, the key.
    pub async fn ask_raw(&self, body: Vec<u8>) -> (u16, Option<Zeroizing<Vec<u8>>>) {
        let r = self
            .http
            .post(format!("{}/v1/workspace-keys", self.url))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("key request");
        let status = r.status().as_u16();
        let body: Value = r.json().await.unwrap_or_default();
        let key = body["key"]
            .as_str()
            .map(|k| Zeroizing::new(base64::engine::general_purpose::STANDARD.decode(k).expect("base64 key")));
        (status, key)
    }

    pub async fn ask(&self, body: &Value) -> (u16, Option<Zeroizing<Vec<u8>>>) {
        self.ask_raw(serde_json::to_vec(body).expect("json")).await
    }

    /// The node service's answer to a request for the commands of
    /// `namespace`/`sandbox` with bearer `token`: the status and, on 200,
    /// the commands (asked without a version: answered at once).
    pub async fn node_commands(
        &self,
        token: Option<&str>,
        namespace: &str,
        sandbox: &str,
    ) -> (u16, Option<hangar_crds::node_commands::NodeCommands>) {
        let mut req = self
            .http
            // Kubernetes names need no escaping in a query.
            .get(format!("{}{}?namespace={namespace}&sandbox={sandbox}", self.url, hangar_crds::node_commands::PATH));
        if let Some(token) = token {
            req = req.bearer_auth(token);
        }
        let r = req.send().await.expect("node commands request");
        let status = r.status().as_u16();
        let body = if status == 200 { Some(r.json().await.expect("node commands json")) } else { None };
        (status, body)
    }

    /// `POST path` (an admission route) with `body` as `token`: the status.
    pub async fn admission(&self, token: Option<&str>, path: &str, body: &Value) -> u16 {
        let mut req = self.http.post(format!("{}{path}", self.url)).json(body);
        if let Some(token) = token {
            req = req.bearer_auth(token);
        }
        req.send().await.expect("admission request").status().as_u16()
    }
}

/// A key request for `sandbox`'s session with `identity`'s document signed
/// by `authority`, and a fresh nonce.
pub async fn request(kc: &KeyClient, s: &Sandbox, identity: &InstanceIdentity, authority: &IdentityAuthority) -> Value {
    let document = identity.document();
    json!({
        "namespace": s.namespace().expect("namespace"),
        "sandbox": s.name_any(),
        "sessionId": s.uid().expect("uid"),
        "signature": authority.sign(&document).expect("signed"),
        "document": document,
        "nonce": kc.nonce().await,
    })
}

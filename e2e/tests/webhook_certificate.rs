//! The admission webhook's own serving certificate: made at start-up, its
//! CA written into the webhook configuration, rotated before it expires —
//! while admissions go on without a single failure.

use std::time::{Duration, Instant};

use hangar_e2e::gateway::https_client_trusting;
use hangar_e2e::operator::SYSTEM_NAMESPACE;
use hangar_e2e::sessions;
use hangar_e2e::shared_stack;
use hangar_e2e::webhook::{WebhookOptions, WebhookProcess};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use serde_json::json;

fn field(s: &Secret, key: &str) -> String {
    String::from_utf8(s.data.clone().unwrap_or_default()[key].0.clone()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_rotates_its_certificate_without_refusing_an_admission() {
    let stack = shared_stack();
    let ns = "cert-rotation";
    let client = stack.cp.client().await.unwrap();
    sessions::ensure_namespace(&client, ns).await;
    // A second webhook for this namespace only, on a certificate valid for
    // 30 s and replaced 20 s before its end: a rotation every ~10 s.
    let opts = WebhookOptions {
        configuration: "hangar-webhook-rotation".into(),
        cert_secret: Some("hangar-webhook-rotation-tls".into()),
        cert_validity_seconds: 30,
        cert_renew_before_seconds: 20,
        cert_check_seconds: 1,
        namespaces: Some(vec![ns.into()]),
        log: "webhook-rotation.log".into(),
        decider: Some(stack.key_service.decider_for_webhook(&stack.cp, stack.cp.dir()).expect("a webhook token")),
    };
    let webhook = WebhookProcess::start_with(&stack.cp, opts).expect("the rotating webhook");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let configs: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let boxes: Api<hangar_crds::Sandbox> = Api::namespaced(client.clone(), ns);
    boxes.create(&PostParams::default(), &sessions::sandbox("box", "commands", json!({}))).await.unwrap();
    let commands: Api<hangar_crds::Command> = Api::namespaced(client.clone(), ns);

    let first = secrets.get("hangar-webhook-rotation-tls").await.unwrap();
    let mut seen_cas = vec![field(&first, "ca.crt")];
    assert!(!first.data.clone().unwrap().contains_key("ca.key"), "the CA's key is never kept");
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut created = 0;
    while seen_cas.len() < 3 {
        assert!(Instant::now() < deadline, "two rotations within 90 s; saw {}", seen_cas.len() - 1);
        // Every create goes through the rotating webhook (and the stack's).
        let c = hangar_e2e::commands::sh(&format!("c-{created}"), "box", "true");
        commands.create(&PostParams::default(), &c).await.unwrap_or_else(|e| panic!("create {created}: {e}"));
        created += 1;
        let now = secrets.get("hangar-webhook-rotation-tls").await.unwrap();
        let ca = field(&now, "ca.crt");
        if seen_cas.last() != Some(&ca) {
            // The new CA is trusted by the apiserver, with the one before it.
            let bundle = field(&now, "ca-bundle.crt");
            assert!(bundle.starts_with(&ca) && bundle.contains(seen_cas.last().unwrap()), "new + previous CA");
            let config = configs.get("hangar-webhook-rotation").await.unwrap();
            let published = config.webhooks.unwrap_or_default();
            assert!(!published.is_empty());
            for w in published {
                let b = String::from_utf8(w.client_config.ca_bundle.unwrap().0).unwrap();
                assert!(b.contains(&ca), "the configuration trusts the new CA before it is served");
            }
            seen_cas.push(ca);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(created >= 10, "admissions went on throughout: {created}");

    // Once it has switched, it serves a certificate under the newest CA alone.
    let pki = &stack.cp.pki;
    let (cert, key) =
        (std::fs::read(&pki.admission_client_cert).unwrap(), std::fs::read(&pki.admission_client_key).unwrap());
    let newest = seen_cas.last().unwrap().clone();
    let url = format!("https://127.0.0.1:{}/healthz", webhook.port);
    let switched = Instant::now() + Duration::from_secs(10);
    loop {
        let http = https_client_trusting(&newest, Some((&cert, &key)));
        match http.get(&url).send().await {
            Ok(r) if r.status() == 200 => break,
            other => assert!(Instant::now() < switched, "never served the newest certificate: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The first CA, long expired from the bundle, is trusted no more.
    let http = https_client_trusting(&seen_cas[0], Some((&cert, &key)));
    assert!(http.get(&url).send().await.is_err(), "a certificate under the first CA is no longer served");
}

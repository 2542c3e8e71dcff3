//! Key custody: nobody but the operator makes the Secrets it trusts. A
//! session key Secret that someone else put under a session's name before
//! the operator got to it (a plaintext key, or another session's genuine
//! sealed key copied over) is refused: a Warning Event, a counter, no
//! instance launched, the Secret left as found for whoever investigates.
//! Once it is gone the operator makes its own and the session runs.

use std::collections::BTreeMap;

use hangar_crds::Phase;
use hangar_crds::Sandbox;
use hangar_e2e::ec2::{client as ec2_client, session_instances};
use hangar_e2e::metrics_text;
use hangar_e2e::operator::SYSTEM_NAMESPACE;
use hangar_e2e::sessions::{self, DEADLINE, ensure_namespace, wait_event};
use hangar_e2e::shared_stack;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Event, Secret};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

fn key_secret(session_id: &str, type_: &str, data: Vec<u8>) -> Secret {
    serde_json::from_value(json!({
        "metadata": {
            "name": format!("hangar-session-key-{session_id}"),
            "labels": {"hangar.dev/session-id": session_id},
        },
        "type": type_,
        "immutable": true,
    }))
    .map(|mut s: Secret| {
        s.data = Some(BTreeMap::from([("sealed-key".to_owned(), ByteString(data))]));
        s
    })
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_secret_hangar_did_not_make_is_never_trusted() {
    let stack = shared_stack();
    let ns = "custody";
    let client = stack.cp.client().await.unwrap();
    ensure_namespace(&client, ns).await;
    let boxes: Api<Sandbox> = Api::namespaced(client.clone(), ns);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let ec2 = ec2_client(&stack.moto.endpoint()).await;

    // A session whose genuine sealed key an attacker copies.
    boxes.create(&PostParams::default(), &sessions::sandbox("donor", "commands", json!({}))).await.unwrap();
    let donor = sessions::wait_phase(stack, &boxes, "donor", Phase::Running).await.uid().unwrap();
    let donor_key = secrets.get(&format!("hangar-session-key-{donor}")).await.unwrap();
    let donor_sealed = donor_key.data.unwrap()["sealed-key"].0.clone();

    // While the operator is down, two sessions are made and a Secret put
    // under each one's key name first.
    stack.operator().kill();
    boxes.create(&PostParams::default(), &sessions::sandbox("plain", "commands", json!({}))).await.unwrap();
    boxes.create(&PostParams::default(), &sessions::sandbox("copied", "commands", json!({}))).await.unwrap();
    let plain = boxes.get("plain").await.unwrap().uid().unwrap();
    let copied = boxes.get("copied").await.unwrap().uid().unwrap();
    let forged = [
        key_secret(&plain, "Opaque", vec![7u8; 64]),
        key_secret(&copied, "hangar.dev/sealed-session-key", donor_sealed),
    ];
    for s in &forged {
        secrets.create(&PostParams::default(), s).await.unwrap();
    }
    let before: Vec<Secret> =
        futures::future::join_all(forged.iter().map(|s| secrets.get(s.metadata.name.as_deref().unwrap())))
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
    stack.operator().restart().unwrap();
    stack.operator().wait_ready(DEADLINE).unwrap();

    // Each is refused with a Warning Event, and nothing launches.
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    for name in ["plain", "copied"] {
        wait_event(&events, name, "ForeignKeySecret warning", |e| {
            e.reason.as_deref() == Some("ForeignKeySecret") && e.type_.as_deref() == Some("Warning")
        })
        .await;
    }
    assert!(
        metrics_text::sum(&stack.operator().metrics(), "hangar_foreign_key_secrets_total").expect("exposed") >= 2.0
    );
    for (name, sid) in [("plain", &plain), ("copied", &copied)] {
        assert!(
            session_instances(&ec2, sid).await.is_empty(),
            "{name}: no instance for a session whose key is not hangar's"
        );
        let s = boxes.get(name).await.unwrap();
        assert_ne!(sessions::phase(&s), Some(Phase::Running), "{name}");
    }
    for b in &before {
        let now = secrets.get(b.metadata.name.as_deref().unwrap()).await.unwrap();
        assert_eq!((now.uid(), &now.data), (b.uid(), &b.data), "left as found");
    }

    // Removed, the operator makes its own key and the session runs.
    secrets.delete(&format!("hangar-session-key-{plain}"), &DeleteParams::default()).await.unwrap();
    let running = sessions::wait_phase(stack, &boxes, "plain", Phase::Running).await;
    assert_eq!(running.uid().as_deref(), Some(plain.as_str()));
    let own = secrets.get(&format!("hangar-session-key-{plain}")).await.unwrap();
    assert_ne!(own.uid(), before[0].uid(), "a Secret of the operator's own");
    assert_eq!(own.type_.as_deref(), Some("hangar.dev/sealed-session-key"));
}

//! Leader election (`hangar_runtime::leader`) against a real apiserver: one
//! of two replicas leads; when the leader dies without releasing, the other
//! takes over once the Lease expires; a clean release gives it up at once.

use std::time::{Duration, Instant};

use hangar_e2e::ControlPlane;
use hangar_runtime::leader::{Leadership, LeaseSettings};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;

fn settings(identity: &str) -> LeaseSettings {
    LeaseSettings {
        namespace: "default".into(),
        name: "hangar-test-leader".into(),
        identity: identity.into(),
        duration: Duration::from_secs(3),
        renew_before: Duration::from_secs(1),
    }
}

async fn holder(api: &Api<Lease>) -> Option<String> {
    api.get("hangar-test-leader").await.ok()?.spec?.holder_identity
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_leads_and_a_follower_takes_over_when_it_dies() {
    hangar_runtime::telemetry::init();
    let cp = ControlPlane::start().expect("control plane");
    let client = cp.client().await.unwrap();
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");

    let mut a = Leadership::join(client.clone(), &settings("a")).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), a.acquired()).await.expect("a leads an empty election");
    let mut b = Leadership::join(client.clone(), &settings("b")).await.unwrap();
    // Several renewals of a's Lease pass; b never leads meanwhile.
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        assert!(!b.is_leading(), "two leaders at once");
        assert_eq!(holder(&leases).await.as_deref(), Some("a"));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // a dies without releasing: b leads once the Lease has expired.
    let died = Instant::now();
    drop(a);
    tokio::time::timeout(Duration::from_secs(15), b.acquired()).await.expect("b takes over");
    assert!(died.elapsed() >= Duration::from_secs(1), "not before a's Lease could have expired");
    assert_eq!(holder(&leases).await.as_deref(), Some("b"));

    // A clean release gives the Lease up at once; the follower takes it at
    // its next look.
    let mut c = Leadership::join(client.clone(), &settings("c")).await.unwrap();
    b.release().await;
    assert_ne!(holder(&leases).await.as_deref(), Some("b"), "released");
    tokio::time::timeout(Duration::from_secs(10), c.acquired()).await.expect("c takes over");
    assert_eq!(holder(&leases).await.as_deref(), Some("c"));
}

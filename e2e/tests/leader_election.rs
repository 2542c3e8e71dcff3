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

/// Two operator replicas on the local stack: the leader dies (SIGKILL)
/// without giving up its Lease. The standby leads once the Lease has
/// expired; a running session goes on in the same attempt with no
/// interruption (a failover is invisible to its sessions), and a session
/// created while nobody led comes up under the new leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_operator_takes_over_and_interrupts_no_session() {
    use hangar_crds::{Phase, Sandbox};
    use hangar_e2e::sessions::{self, DEADLINE, ensure_namespace};
    use hangar_e2e::{LocalStack, StackOptions};
    use kube::api::PostParams;
    use serde_json::json;

    hangar_runtime::telemetry::init();
    let leader_env = [("HANGAR_LEADER_ELECT", "true"), ("POD_NAME", "operator-a")];
    let opts = StackOptions {
        operator_env: leader_env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        ..Default::default()
    };
    let stack = LocalStack::start(ControlPlane::start().expect("control plane"), opts).expect("stack");
    let client = stack.cp.client().await.unwrap();
    ensure_namespace(&client, "failover").await;
    let api: Api<Sandbox> = Api::namespaced(client.clone(), "failover");
    let create = |name: &'static str| {
        let api = api.clone();
        async move { api.create(&PostParams::default(), &sessions::sandbox(name, "commands", json!({}))).await.unwrap() }
    };
    create("before").await;
    let before = sessions::wait_phase(&stack, &api, "before", Phase::Running).await;

    let leases: Api<Lease> = Api::namespaced(client.clone(), hangar_e2e::operator::SYSTEM_NAMESPACE);
    let leader = || async { leases.get("hangar-operator-leader").await.ok()?.spec?.holder_identity };
    let standby = stack.operator().replica("operator-b").expect("standby");
    assert_eq!(leader().await.as_deref(), Some("operator-a"));
    stack.operator().kill();
    create("during").await;
    let deadline = Instant::now() + DEADLINE;
    while leader().await.as_deref() != Some("operator-b") {
        assert!(Instant::now() < deadline, "the standby did not take over");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    sessions::wait_phase(&stack, &api, "during", Phase::Running).await;

    let after = api.get("before").await.unwrap();
    let (was, is) = (before.status.clone().unwrap_or_default(), after.status.clone().unwrap_or_default());
    assert_eq!(sessions::phase(&after), Some(Phase::Running), "{is:?}");
    assert_eq!(is.attempt, was.attempt, "the same attempt");
    assert!(is.interruptions.is_empty(), "no interruption: {:?}", is.interruptions);
    drop(standby);
}

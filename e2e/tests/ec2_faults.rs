//! EC2 faults, injected by a loopback proxy in front of moto: throttling is
//! retried with backoff, a capacity error falls back to the next instance
//! type, and an invalid configuration fails the session with a readable
//! reason and leaves nothing behind.

use std::sync::OnceLock;

use hangar_crds::{Phase, Sandbox};
use hangar_e2e::ec2::{client as ec2_client, session_instances, session_volumes};
use hangar_e2e::ec2_faults::Fault;
use hangar_e2e::sessions::{self, ensure_namespace};
use hangar_e2e::{ControlPlane, LocalStack, StackOptions};
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use serde_json::json;

/// A stack whose operator reaches EC2 through the fault proxy
/// (`ec2_proxy()`).
fn faulty() -> &'static LocalStack {
    static S: OnceLock<LocalStack> = OnceLock::new();
    S.get_or_init(|| {
        let cp = ControlPlane::start().expect("control plane");
        let opts = StackOptions { ec2_transitions: Some(std::time::Duration::ZERO), ..Default::default() };
        LocalStack::start(cp, opts).expect("stack")
    })
}

async fn start_session(stack: &LocalStack, ns: &str, name: &str) -> (Api<Sandbox>, Sandbox) {
    let client = stack.cp.client().await.unwrap();
    ensure_namespace(&client, ns).await;
    let api: Api<Sandbox> = Api::namespaced(client, ns);
    let created = api
        .create(&PostParams::default(), &sessions::sandbox(name, "commands", json!({"size": "small"})))
        .await
        .unwrap();
    (api, created)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_is_retried_then_capacity_falls_back_to_the_next_type() {
    let f = faulty();
    // The Name tag (hangar-<namespace>-<name>) is in the RunInstances body.
    let marker = "hangar-faults-fallback";
    f.ec2_proxy().inject(Fault {
        action: "RunInstances",
        body_contains: vec![marker.into()],
        code: "RequestLimitExceeded",
        status: 503,
        times: 2,
    });
    f.ec2_proxy().inject(Fault {
        action: "RunInstances",
        body_contains: vec![marker.into(), "InstanceType=m7g.large".into()],
        code: "InsufficientInstanceCapacity",
        status: 500,
        times: 1,
    });
    let (api, created) = start_session(f, "faults", "fallback").await;
    let s = sessions::wait_phase(f, &api, "fallback", Phase::Running).await;
    let status = s.status.unwrap();
    assert_eq!(status.instance_type.as_deref(), Some("m6g.large"), "fell back to the second type of size small");

    let calls: Vec<_> = f.ec2_proxy().seen(marker).into_iter().filter(|c| c.action == "RunInstances").collect();
    let injected: Vec<Option<&str>> = calls.iter().map(|c| c.injected).collect();
    assert_eq!(
        injected,
        [Some("RequestLimitExceeded"), Some("RequestLimitExceeded"), Some("InsufficientInstanceCapacity"), None],
        "two throttled tries, one capacity error, then the fallback"
    );
    assert!(calls[3].body.contains("InstanceType=m6g.large"));
    // The operator's throttle backoff (100 ms, doubling, jittered): two
    // throttled tries cost well under a second before the capacity error.
    let retried_ms = (calls[2].at - calls[0].at).as_millis();
    eprintln!("figure: first throttled RunInstances → third try: {retried_ms} ms");
    let metrics = f.operator().metrics();
    let throttled = hangar_e2e::metrics_text::value(&metrics, "hangar_ec2_throttled_total").unwrap_or(0.0);
    assert!(throttled >= 2.0, "throttles counted: {metrics}");
    let ec2 = ec2_client(&f.moto.endpoint()).await;
    assert_eq!(session_instances(&ec2, &created.uid().unwrap()).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_ami_fails_the_session_and_leaves_nothing_behind() {
    let f = faulty();
    let marker = "hangar-faults-badami";
    f.ec2_proxy().inject(Fault {
        action: "RunInstances",
        body_contains: vec![marker.into()],
        code: "InvalidAMIID.NotFound",
        status: 400,
        // An unknown AMI stays unknown, however often it is tried.
        times: usize::MAX,
    });
    let (api, created) = start_session(f, "faults", "badami").await;
    let session = created.uid().unwrap();
    let s = sessions::wait_for(f, &api, "badami", "failed", |s| {
        let phase = sessions::phase(s);
        assert_ne!(
            phase,
            Some(Phase::Running),
            "launched past the injected fault; the proxy saw {:#?}",
            f.ec2_proxy().seen(marker)
        );
        phase == Some(Phase::Failed)
    })
    .await;
    let status = s.status.unwrap();
    let reason = status.stop_reason.unwrap_or_default();
    assert!(reason.starts_with("launch_failed: InvalidAMIID.NotFound"), "readable reason: {reason}");
    let ready = status.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "Failed"));
    assert!(ready.message.contains("InvalidAMIID"), "{}", ready.message);

    let ec2 = ec2_client(&f.moto.endpoint()).await;
    assert!(session_instances(&ec2, &session).await.is_empty(), "no instance");
    assert!(session_volumes(&ec2, &session).await.is_empty(), "no volume");
    let secrets: Api<Secret> = Api::namespaced(f.cp.client().await.unwrap(), "hangar-system");
    assert!(secrets.get_opt(&format!("hangar-session-key-{session}")).await.unwrap().is_none(), "no key");
    sessions::wait_for(f, &api, "badami", "without finalizer", |s| s.finalizers().is_empty()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_that_cannot_start_the_instance_stays_paused_until_asked_again() {
    use hangar_crds::AttemptEnd;
    use kube::api::{Patch, PatchParams};
    let f = faulty();
    let (api, _) = start_session(f, "faults", "noresume").await;
    let s = sessions::wait_phase(f, &api, "noresume", Phase::Running).await;
    let instance = s.status.unwrap().instance_id.unwrap();
    sessions::set_state(&api, "noresume", "Paused").await.unwrap();
    sessions::wait_phase(f, &api, "noresume", Phase::Paused).await;
    // No capacity for the next two starts of this instance.
    f.ec2_proxy().inject(Fault {
        action: "StartInstances",
        body_contains: vec![instance.clone()],
        code: "InsufficientInstanceCapacity",
        status: 500,
        times: 2,
    });
    let starts = || f.ec2_proxy().seen(&instance).into_iter().filter(|c| c.action == "StartInstances").count();
    sessions::set_state(&api, "noresume", "Running").await.unwrap();
    let s = sessions::wait_for(f, &api, "noresume", "resume failed", |s| {
        s.status.as_ref().is_some_and(|st| st.resume_failed.is_some() && st.phase == Some(Phase::Paused))
    })
    .await;
    let status = s.status.unwrap();
    assert_eq!(status.attempts.last().unwrap().end, Some(AttemptEnd::StartFailed));
    assert!(status.resume_failed.unwrap().reason.contains("InsufficientInstanceCapacity"));
    let ready = status.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(ready.reason, "ResumeFailed", "{}", ready.message);
    // No hot loop: the same request is not tried again. Reconciles keep
    // coming (heartbeats, watches); the attempts stay as they are.
    let attempts = status.attempts.len();
    assert_eq!(starts(), 1);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while std::time::Instant::now() < until {
        let now = api.get("noresume").await.unwrap().status.unwrap();
        assert_eq!((now.attempts.len(), now.phase), (attempts, Some(Phase::Paused)), "a failed resume loops");
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    assert_eq!(starts(), 1, "StartInstances was not asked again");
    // A new request (the retry annotation): fails once more, then succeeds.
    let retry = |v: &str| json!({"metadata": {"annotations": {"hangar.dev/retry-resume": v}}});
    api.patch("noresume", &PatchParams::default(), &Patch::Merge(retry("1"))).await.unwrap();
    sessions::wait_for(f, &api, "noresume", "failed again", |s| {
        s.status.as_ref().is_some_and(|st| st.attempts.len() == attempts + 1 && st.phase == Some(Phase::Paused))
    })
    .await;
    assert_eq!(starts(), 2);
    api.patch("noresume", &PatchParams::default(), &Patch::Merge(retry("2"))).await.unwrap();
    let s = sessions::wait_phase(f, &api, "noresume", Phase::Running).await;
    let status = s.status.unwrap();
    assert!(status.resume_failed.is_none(), "cleared once it runs");
    assert_eq!(status.instance_id.as_deref(), Some(instance.as_str()), "the same instance");
    assert_eq!(status.attempts.len(), attempts + 2, "one attempt per request: {:?}", status.attempts);
}

/// The proxy plays EC2's idempotent RunInstances (moto ignores the
/// ClientToken): the same token twice is one instance, answered twice; a
/// new token is a new instance. The crash tests lean on it for a launch
/// whose first call was in flight when the operator was killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_instances_with_a_client_token_it_has_seen_is_answered_with_the_same_instance() {
    let stack = faulty();
    let ec2 = ec2_client(&stack.ec2_proxy.endpoint()).await;
    let launch = |token: &'static str| {
        let ec2 = ec2.clone();
        async move {
            let out = ec2
                .run_instances()
                .image_id("ami-0a1b2c3d4e5f60718")
                .instance_type(aws_sdk_ec2::types::InstanceType::M7gLarge)
                .min_count(1)
                .max_count(1)
                .client_token(token)
                .send()
                .await
                .expect("RunInstances");
            out.instances()[0].instance_id().expect("an instance id").to_owned()
        }
    };
    let (first, again) = tokio::join!(launch("proxy-token-a"), launch("proxy-token-a"));
    let later = launch("proxy-token-a").await;
    let other = launch("proxy-token-b").await;
    assert_eq!(first, again, "a concurrent retry with the token is the same instance");
    assert_eq!(first, later, "a later retry with the token is the same instance");
    assert_ne!(first, other, "a new token launches a new instance");
    let moto = ec2_client(&format!("http://127.0.0.1:{}", stack.moto.port)).await;
    let described = moto.describe_instances().instance_ids(&first).instance_ids(&other).send().await.unwrap();
    let count: usize = described.reservations().iter().map(|r| r.instances().len()).sum();
    assert_eq!(count, 2, "moto holds two instances, not four");
    moto.terminate_instances().instance_ids(&first).instance_ids(&other).send().await.unwrap();
}

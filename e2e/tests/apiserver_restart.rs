//! The apiserver going away for a moment (a control-plane upgrade, a
//! crash) leaves the operator deaf for no longer than its own watches take
//! to reconnect: a Sandbox change made once the apiserver is back is acted
//! on within seconds, not after a backoff that every watch's errors
//! lengthened together.

use std::time::{Duration, Instant};

use hangar_crds::{Phase, Sandbox};
use hangar_e2e::sessions::{self, running_box};
use hangar_e2e::{ControlPlane, LocalStack, StackOptions};
use kube::api::Api;

/// Far below the ~25 s a shared backoff over five watches' connection
/// errors adds (0.8 + 1.6 + 3.2 + 6.4 + 12.8 s), far above one watch's
/// reconnect (its own backoff: 0.8 s, then 1.6 s, …).
const HEARD_WITHIN: Duration = Duration::from_secs(12);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_after_an_apiserver_restart_is_acted_on_within_seconds() {
    let cp = ControlPlane::start().expect("control plane");
    let mut stack = LocalStack::start(cp, StackOptions::default()).expect("stack");
    running_box(&stack, "restart").await;

    stack.cp.restart_apiserver().expect("apiserver restart");
    stack.cp.restart_apiserver().expect("apiserver restart");
    let back = Instant::now();
    let client = stack.cp.client().await.expect("client");
    let boxes: Api<Sandbox> = Api::namespaced(client, "restart");
    let changed = sessions::set_state(&boxes, "box", "Paused").await.expect("pause");
    let generation = changed.metadata.generation;
    let seen = sessions::wait_for(&stack, &boxes, "box", "observed after the restart", |s| {
        s.status.as_ref().and_then(|st| st.observed_generation) >= generation
    })
    .await;
    let heard = back.elapsed();
    println!("apiserver restart: the pause was acted on {:.1} s after the apiserver was ready", heard.as_secs_f64());
    assert!(heard < HEARD_WITHIN, "the operator stayed deaf {heard:?} after the apiserver came back");
    assert!(seen.status.as_ref().is_some_and(|s| s.pause.is_some()), "it acted on the pause: {:?}", seen.status);
    sessions::wait_phase(&stack, &boxes, "box", Phase::Paused).await;
}

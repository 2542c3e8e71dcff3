//! Kubernetes Events published off the reconcile path.
//!
//! A reconcile that awaited its Event write held its object for one more
//! apiserver round trip, and kube-runtime runs one pass per object at a
//! time: the next change of that object (its agent Pod running, say) waited
//! for it. Found in the lifecycle benchmark, where a pass that wrote
//! `running` spent half a second on its Event under load. Here a pass only
//! queues the Event; a background task writes a few at a time, in order of
//! arrival. Events are advisory (the status is the record), so when the
//! queue is full, as when the apiserver stalls, an Event is dropped and
//! counted rather than a pass made to wait.

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, Recorder};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::mpsc;

/// Events written at once by the background task.
const WRITERS: usize = 4;

#[derive(Clone)]
pub struct EventQueue {
    tx: mpsc::Sender<(Event, ObjectReference)>,
    dropped: Counter,
}

impl EventQueue {
    /// Starts the task that writes queued Events through `recorder`; at
    /// most `capacity` wait. Must be called within a tokio runtime.
    pub fn start(recorder: Recorder, capacity: usize) -> Self {
        let (tx, rx) = mpsc::channel::<(Event, ObjectReference)>(capacity);
        let queued = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|v| (v, rx)) });
        tokio::spawn(queued.for_each_concurrent(WRITERS, move |(event, reference)| {
            let recorder = recorder.clone();
            async move {
                if let Err(error) = recorder.publish(&event, &reference).await {
                    tracing::warn!(%error, reason = %event.reason, "could not record event");
                }
            }
        }));
        Self { tx, dropped: Counter::default() }
    }

    /// Queues `event` about `reference`; never waits.
    pub fn publish(&self, event: Event, reference: ObjectReference) {
        if let Err(mpsc::error::TrySendError::Full((event, _)) | mpsc::error::TrySendError::Closed((event, _))) =
            self.tx.try_send((event, reference))
        {
            self.dropped.inc();
            tracing::warn!(reason = %event.reason, "event queue full; event dropped");
        }
    }

    /// Events dropped because the queue was full (a metric to register).
    pub fn dropped(&self) -> Counter {
        self.dropped.clone()
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use kube::runtime::events::{EventType, Reporter};

    use super::*;

    fn event(n: usize) -> Event {
        Event {
            type_: EventType::Normal,
            reason: format!("Step{n}"),
            note: None,
            action: "Step".into(),
            secondary: None,
        }
    }

    fn reference() -> ObjectReference {
        ObjectReference { kind: Some("Sandbox".into()), name: Some("box".into()), ..Default::default() }
    }

    /// A client whose apiserver never answers, counting the requests made.
    fn stalled_client(requests: Arc<AtomicU64>) -> kube::Client {
        let service = tower::service_fn(move |_req: http::Request<kube::client::Body>| {
            requests.fetch_add(1, Ordering::SeqCst);
            futures::future::pending::<Result<http::Response<kube::client::Body>, Infallible>>()
        });
        kube::Client::new(service, "default")
    }

    #[tokio::test]
    async fn a_stalled_apiserver_never_holds_up_the_caller() {
        let requests = Arc::new(AtomicU64::new(0));
        let reporter = Reporter { controller: "test".into(), instance: None };
        let queue = EventQueue::start(Recorder::new(stalled_client(requests.clone()), reporter), 8);
        let started = std::time::Instant::now();
        for n in 0..100 {
            queue.publish(event(n), reference());
        }
        assert!(started.elapsed() < Duration::from_secs(1), "publishing waited: {:?}", started.elapsed());
        // The writers took some (and hang on them), 8 wait, the rest go.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while requests.load(Ordering::SeqCst) < WRITERS as u64 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(requests.load(Ordering::SeqCst), WRITERS as u64, "written a few at a time");
        let dropped = queue.dropped().get();
        assert!((100 - 8 - WRITERS as u64..=100 - 8).contains(&dropped), "dropped {dropped}");
    }
}

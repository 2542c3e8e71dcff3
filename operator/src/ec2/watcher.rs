//! One DescribeInstances call refreshes every session's instance: the
//! reconcilers read this cache instead of describing their own instance, so
//! EC2 read traffic does not grow with the number of sessions. A reconcile
//! that just changed an instance asks for an early refresh; requests that
//! arrive together share one call.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use kube::runtime::reflector::ObjectRef;
use tokio::sync::{Notify, mpsc};

use super::Ec2;
use super::instances::InstanceView;

#[derive(Clone)]
pub struct InstanceWatcher {
    inner: Arc<Inner>,
}

struct Inner {
    by_session: RwLock<HashMap<String, InstanceView>>,
    /// Bumped after each refresh, so a caller can wait for a fresh view.
    generation: RwLock<u64>,
    refresh: Notify,
    refreshed: Notify,
}

impl Default for InstanceWatcher {
    fn default() -> Self {
        Self {
            inner: Arc::new(Inner {
                by_session: RwLock::default(),
                generation: RwLock::new(0),
                refresh: Notify::new(),
                refreshed: Notify::new(),
            }),
        }
    }
}

impl InstanceWatcher {
    /// The session's newest non-terminated instance, else its newest one.
    pub fn get(&self, session_id: &str) -> Option<InstanceView> {
        self.inner.by_session.read().expect("lock").get(session_id).cloned()
    }

    /// The Sandbox an instance belongs to (from its tags).
    pub fn sandbox_of_instance(&self, instance_id: &str) -> Option<ObjectRef<hangar_crds::Sandbox>> {
        let map = self.inner.by_session.read().expect("lock");
        let v = map.values().find(|v| v.id == instance_id)?;
        Some(ObjectRef::new(v.sandbox.as_deref()?).within(v.namespace.as_deref()?))
    }

    pub fn len(&self) -> usize {
        self.inner.by_session.read().expect("lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records what a mutating call just returned (e.g. RunInstances), so
    /// the next reconcile sees it before the next describe.
    pub fn observe(&self, view: InstanceView) {
        if let Some(session) = view.session_id.clone() {
            self.inner.by_session.write().expect("lock").insert(session, view);
        }
    }

    pub fn request_refresh(&self) {
        self.inner.refresh.notify_one();
    }

    /// Asks for a refresh and waits (up to `timeout`) until one completes.
    pub async fn refresh_and_wait(&self, timeout: Duration) {
        let start = *self.inner.generation.read().expect("lock");
        let waiting = self.inner.refreshed.notified();
        tokio::pin!(waiting);
        waiting.as_mut().enable();
        self.request_refresh();
        let _ = tokio::time::timeout(timeout, async {
            loop {
                if *self.inner.generation.read().expect("lock") > start {
                    return;
                }
                waiting.as_mut().await;
                waiting.set(self.inner.refreshed.notified());
                waiting.as_mut().enable();
            }
        })
        .await;
    }

    /// Refreshes every `interval`, or sooner when asked; sends the Sandbox
    /// of every instance whose state changed to `changed`.
    pub async fn run(self, ec2: Ec2, interval: Duration, changed: mpsc::Sender<ObjectRef<hangar_crds::Sandbox>>) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = self.inner.refresh.notified() => {
                    // Let requests from a burst of reconciles coalesce.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            match ec2.describe_cluster_instances().await {
                Ok(instances) => {
                    for sandbox in self.replace(instances) {
                        let _ = changed.try_send(sandbox);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "DescribeInstances failed; keeping the last view"),
            }
            *self.inner.generation.write().expect("lock") += 1;
            self.inner.refreshed.notify_waiters();
        }
    }

    /// Swaps in a new view; returns the Sandboxes whose instance changed.
    fn replace(&self, instances: Vec<InstanceView>) -> Vec<ObjectRef<hangar_crds::Sandbox>> {
        let mut next: HashMap<String, InstanceView> = HashMap::new();
        for i in instances {
            let Some(session) = i.session_id.clone() else { continue };
            // Prefer a live instance over a terminated one of the same session.
            let keep = match next.get(&session) {
                Some(old) => old.state.is_gone() && !i.state.is_gone(),
                None => true,
            };
            if keep {
                next.insert(session, i);
            }
        }
        let mut map = self.inner.by_session.write().expect("lock");
        let changed = next
            .iter()
            .filter(|(s, v)| map.get(*s) != Some(*v))
            .filter_map(|(_, v)| Some(ObjectRef::new(v.sandbox.as_deref()?).within(v.namespace.as_deref()?)))
            .collect();
        *map = next;
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ec2::instances::InstanceState;

    fn view(id: &str, session: &str, state: InstanceState) -> InstanceView {
        InstanceView {
            id: id.into(),
            state,
            instance_type: "m7g.large".into(),
            zone: "z".into(),
            session_id: Some(session.into()),
            namespace: Some("ns".into()),
            sandbox: Some(format!("sbx-{session}")),
            launched_at: None,
        }
    }

    #[test]
    fn a_refresh_reports_only_changed_sessions_and_prefers_live_instances() {
        let w = InstanceWatcher::default();
        let first = w.replace(vec![view("i-1", "a", InstanceState::Running), view("i-2", "b", InstanceState::Running)]);
        assert_eq!(first.len(), 2);
        let second = w.replace(vec![
            view("i-1", "a", InstanceState::Running),
            view("i-2", "b", InstanceState::Stopped),
            view("i-0", "a", InstanceState::Terminated),
        ]);
        assert_eq!(second, vec![ObjectRef::new("sbx-b").within("ns")]);
        assert_eq!(w.get("a").unwrap().id, "i-1");
        assert_eq!(w.get("b").unwrap().state, InstanceState::Stopped);
    }
}

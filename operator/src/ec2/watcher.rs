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
    /// When a mutating call last set an instance's state here: a describe
    /// that started before that must not overwrite it with older news.
    local_updates: RwLock<HashMap<String, std::time::Instant>>,
    refresh: Notify,
    /// Instances EC2 warned are about to be reclaimed (EventBridge).
    reclaim_warned: RwLock<std::collections::HashSet<String>>,
}

impl Default for InstanceWatcher {
    fn default() -> Self {
        Self {
            inner: Arc::new(Inner {
                by_session: RwLock::default(),
                local_updates: RwLock::default(),
                refresh: Notify::new(),
                reclaim_warned: RwLock::default(),
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
            self.inner.local_updates.write().expect("lock").insert(view.id.clone(), std::time::Instant::now());
            self.inner.by_session.write().expect("lock").insert(session, view);
        }
    }

    /// Records the state a mutating call just reported for an instance.
    pub fn set_state(&self, instance_id: &str, state: super::instances::InstanceState) {
        let mut map = self.inner.by_session.write().expect("lock");
        if let Some(v) = map.values_mut().find(|v| v.id == instance_id) {
            v.state = state;
            self.inner.local_updates.write().expect("lock").insert(instance_id.to_owned(), std::time::Instant::now());
        }
    }

    /// Records EC2's warning that an instance is about to be reclaimed.
    pub fn warn_reclaim(&self, instance_id: &str) {
        self.inner.reclaim_warned.write().expect("lock").insert(instance_id.to_owned());
    }

    pub fn reclaim_warned(&self, instance_id: &str) -> bool {
        self.inner.reclaim_warned.read().expect("lock").contains(instance_id)
    }

    /// True while some instance is between states (pending, stopping,
    /// shutting down): worth describing sooner than the steady interval.
    fn in_transition(&self) -> bool {
        use super::instances::InstanceState::*;
        self.inner
            .by_session
            .read()
            .expect("lock")
            .values()
            .any(|v| matches!(v.state, Pending | Stopping | ShuttingDown))
    }

    pub fn request_refresh(&self) {
        self.inner.refresh.notify_one();
    }

    /// Refreshes every `interval`, or sooner when asked; sends the Sandbox
    /// of every instance whose state changed to `changed`.
    pub async fn run(self, ec2: Ec2, interval: Duration, changed: mpsc::Sender<ObjectRef<hangar_crds::Sandbox>>) {
        // While an instance is changing state, one describe every 500 ms (for
        // all sessions together) notices the change promptly.
        let fast = interval.min(Duration::from_millis(500));
        loop {
            let wait = if self.in_transition() { fast } else { interval };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.inner.refresh.notified() => {
                    // Let requests from a burst of reconciles coalesce.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            let started = std::time::Instant::now();
            match ec2.describe_cluster_instances().await {
                Ok(instances) => {
                    for sandbox in self.replace(instances, started) {
                        let _ = changed.try_send(sandbox);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "DescribeInstances failed; keeping the last view"),
            }
        }
    }

    /// Swaps in a new view; returns the Sandboxes whose instance changed.
    fn replace(
        &self,
        instances: Vec<InstanceView>,
        started: std::time::Instant,
    ) -> Vec<ObjectRef<hangar_crds::Sandbox>> {
        let mut next: HashMap<String, InstanceView> = HashMap::new();
        let newer_here: Vec<String> = {
            let mut local = self.inner.local_updates.write().expect("lock");
            local.retain(|_, at| *at > started);
            local.keys().cloned().collect()
        };
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
        // A warning is about the instance's current run: once it has
        // stopped (or is gone) the warning is spent.
        self.inner.reclaim_warned.write().expect("lock").retain(|id| {
            next.values().any(|v| {
                &v.id == id && !matches!(v.state, super::instances::InstanceState::Stopped) && !v.state.is_gone()
            })
        });
        let mut map = self.inner.by_session.write().expect("lock");
        // Keep what a mutating call reported after this describe began.
        for (session, old) in map.iter() {
            if newer_here.contains(&old.id) {
                next.insert(session.clone(), old.clone());
            }
        }
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
        let t = std::time::Instant::now();
        let first =
            w.replace(vec![view("i-1", "a", InstanceState::Running), view("i-2", "b", InstanceState::Running)], t);
        assert_eq!(first.len(), 2);
        let second = w.replace(
            vec![
                view("i-1", "a", InstanceState::Running),
                view("i-2", "b", InstanceState::Stopped),
                view("i-0", "a", InstanceState::Terminated),
            ],
            t,
        );
        assert_eq!(second, vec![ObjectRef::new("sbx-b").within("ns")]);
        assert_eq!(w.get("a").unwrap().id, "i-1");
        assert_eq!(w.get("b").unwrap().state, InstanceState::Stopped);
    }

    #[test]
    fn a_describe_older_than_a_mutating_call_does_not_undo_it() {
        let w = InstanceWatcher::default();
        let t0 = std::time::Instant::now();
        w.replace(vec![view("i-1", "a", InstanceState::Stopped)], t0);
        let describe_started = std::time::Instant::now();
        w.set_state("i-1", InstanceState::Pending); // StartInstances answered
        w.replace(vec![view("i-1", "a", InstanceState::Stopped)], describe_started);
        assert_eq!(w.get("a").unwrap().state, InstanceState::Pending);
        // A describe that began after the call is believed.
        w.replace(vec![view("i-1", "a", InstanceState::Running)], std::time::Instant::now());
        assert_eq!(w.get("a").unwrap().state, InstanceState::Running);
    }
}

//! Controllers whose watches each back off on their own.
//!
//! kube-runtime's `Controller` puts one backoff around all of its trigger
//! streams together: while it sleeps, no watch is read at all, and every
//! error of any watch lengthens that one sleep. An apiserver restart makes
//! each watch fail to reconnect at once, so the errors add up (0.8 + 1.6 +
//! 3.2 + 6.4 + 12.8 s … for five watches) and the controller hears nothing
//! for up to a minute after the apiserver is back (found by the chaos test:
//! a resumed session stayed paused). Here each watch, the controller's own
//! included, has its own backoff, and the controller adds none.

use std::fmt::Debug;
use std::hash::Hash;
use std::time::Duration;

use futures::Stream;
use kube::Resource;
use kube::api::Api;
use kube::runtime::controller::Controller;
use kube::runtime::utils::Backoff;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde::de::DeserializeOwned;

/// A controller of `K` whose own watch backs off by itself (the default
/// backoff); add other triggers with [`watch`] and `watches_stream`.
pub fn controller<K>(api: Api<K>, config: watcher::Config) -> Controller<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Debug + Unpin,
{
    let (reader, writer) = reflector::store();
    let own = reflector(writer, watcher(api, config).modify(lean)).default_backoff().applied_objects();
    Controller::for_stream(own, reader).trigger_backoff(EachWatchBacksOff)
}

/// A trigger stream for `watches_stream`, backing off by itself.
pub fn watch<K>(api: Api<K>, config: watcher::Config) -> impl Stream<Item = Result<K, watcher::Error>> + Send
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    watcher(api, config).modify(lean).default_backoff().applied_objects()
}

/// Drops from a watched object what no controller here reads: its
/// managedFields (often the larger part of what the apiserver sends) and
/// kubectl's last-applied copy. At 5,000 sessions the operator's caches
/// hold some 25,000 objects. Nothing cached is ever written back whole
/// (status goes by server-side apply of the status alone), so nothing
/// is lost on the server.
pub fn lean<K: Resource>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.managed_fields = None;
    if let Some(a) = meta.annotations.as_mut() {
        a.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

/// The controller-wide backoff: none, since each watch has its own (a
/// watch's error still reaches the controller, which goes on reading the
/// others at once).
#[derive(Clone, Copy, Debug, Default)]
pub struct EachWatchBacksOff;

impl Iterator for EachWatchBacksOff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(Duration::ZERO)
    }
}

impl Backoff for EachWatchBacksOff {
    fn reset(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_never_add_a_controller_wide_wait() {
        let mut b = EachWatchBacksOff;
        let waits: Vec<Duration> = (0..20).map(|_| b.next().expect("never gives up")).collect();
        assert!(waits.iter().all(Duration::is_zero), "{waits:?}");
    }
}

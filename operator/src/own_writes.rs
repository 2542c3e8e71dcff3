//! Whether the watch cache's copy of a Sandbox can be acted on, given the
//! status writes this operator made itself.
//!
//! A reconcile decides from the cached copy. When that copy predates the
//! operator's own last status write, acting on it would repeat side effects
//! the write already records (sign a certificate again, retry a resume that
//! failed). So each write's answer (the object as the apiserver stored it)
//! is kept until the watch shows that version or a later one (versions of
//! one resource compare as integers since Kubernetes 1.35), and a pass that starts
//! before then acts on the written copy: it is at least as new as anything
//! the operator knows, and its resourceVersion guards the next status write
//! (refused with 409 if anyone wrote since). Waiting for the watch instead
//! put a requeue on the path of every event that arrived meanwhile (the
//! lifecycle benchmark's tail: a pod Ready behind a lagging Sandbox watch).
//!
//! When the watch has not shown the write for [`WAIT_FOR_WATCH`] (it may
//! have relisted past it), or a status write was refused as decided from an
//! old copy (409), the next reconcile reads the object from the apiserver.

use std::cmp::Ordering;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hangar_runtime::kube_ext::compare_resource_versions;

/// How long the written copy stands in for the watch's; after that the
/// object is read from the apiserver.
pub const WAIT_FOR_WATCH: Duration = Duration::from_secs(2);

/// What a reconcile may act on instead of the cached copy of an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheView<T> {
    /// Nothing of ours is missing from it: act on it.
    Current,
    /// It predates our own last write: act on what that write stored.
    Written(Arc<T>),
    /// It may be old and the watch has not caught up: read the object from
    /// the apiserver and act on that copy.
    ReadThrough,
}

struct Write<T> {
    resource_version: String,
    at: Instant,
    stored: Arc<T>,
}

pub struct OwnWrites<T> {
    /// `namespace/name` → our last status write, until the watch shows it.
    written: Mutex<HashMap<String, Write<T>>>,
    /// Objects whose last status write was refused as decided from an old
    /// copy.
    refused: Mutex<HashSet<String>>,
}

impl<T> Default for OwnWrites<T> {
    fn default() -> Self {
        Self { written: Mutex::default(), refused: Mutex::default() }
    }
}

impl<T> OwnWrites<T> {
    /// Records the object as this operator's write to `key` stored it (at
    /// `resource_version`).
    pub fn wrote(&self, key: &str, resource_version: Option<String>, stored: Arc<T>) {
        let now = Instant::now();
        let mut w = self.written.lock().unwrap_or_else(|p| p.into_inner());
        match resource_version {
            Some(resource_version) => w.insert(key.to_owned(), Write { resource_version, at: now, stored }),
            None => w.remove(key),
        };
        // An object deleted right after our write never shows it to a pass:
        // past the wait an entry is of no use, so it goes.
        if w.len() > 64 && w.len().is_power_of_two() {
            w.retain(|_, write| now.duration_since(write.at) <= WAIT_FOR_WATCH);
        }
    }

    /// A status write to `key` was refused (409): it was decided from a
    /// copy older than the object.
    pub fn refused(&self, key: &str) {
        self.refused.lock().unwrap_or_else(|p| p.into_inner()).insert(key.to_owned());
    }

    /// How to treat the cached copy of `key` at `resource_version`.
    pub fn view(&self, key: &str, resource_version: Option<&str>) -> CacheView<T> {
        self.view_at(key, resource_version, Instant::now())
    }

    fn view_at(&self, key: &str, resource_version: Option<&str>, now: Instant) -> CacheView<T> {
        let mut w = self.written.lock().unwrap_or_else(|p| p.into_inner());
        let refused = self.refused.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
        let Some(write) = w.get(key) else {
            return if refused { CacheView::ReadThrough } else { CacheView::Current };
        };
        // The watch has shown our write, or a later version (several
        // changes can arrive before the next pass runs).
        let shown = resource_version.is_some_and(|cached| {
            cached == write.resource_version
                || compare_resource_versions(cached, &write.resource_version) == Some(Ordering::Greater)
        });
        if shown {
            w.remove(key);
            return if refused { CacheView::ReadThrough } else { CacheView::Current };
        }
        if refused || now.duration_since(write.at) > WAIT_FOR_WATCH {
            // Someone else may have written after us (the watch then shows
            // a newer copy than ours) or the watch lags: either way, read.
            w.remove(key);
            return CacheView::ReadThrough;
        }
        CacheView::Written(write.stored.clone())
    }

    /// Writes awaiting their watch event (for tests and the memory bound).
    pub fn pending(&self) -> usize {
        self.written.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "tenant/box";

    fn writes() -> OwnWrites<&'static str> {
        OwnWrites::default()
    }

    #[test]
    fn a_copy_with_nothing_of_ours_pending_is_current() {
        let w = writes();
        assert_eq!(w.view(KEY, Some("5")), CacheView::Current);
    }

    #[test]
    fn a_copy_before_our_write_gives_way_to_the_written_one_until_the_watch_shows_it() {
        let w = writes();
        w.wrote(KEY, Some("7".into()), Arc::new("as written at 7"));
        assert_eq!(w.view(KEY, Some("6")), CacheView::Written(Arc::new("as written at 7")));
        assert_eq!(w.view(KEY, Some("6")), CacheView::Written(Arc::new("as written at 7")), "until the watch shows it");
        assert_eq!(w.view(KEY, Some("7")), CacheView::Current);
        // Seen once, forgotten: a later copy is simply current.
        assert_eq!(w.view(KEY, Some("9")), CacheView::Current);
        assert_eq!(w.pending(), 0);
    }

    #[test]
    fn a_copy_newer_than_our_write_is_current() {
        let w = writes();
        w.wrote(KEY, Some("7".into()), Arc::new("at 7"));
        // Someone wrote after us, and the watch brought both before a pass.
        assert_eq!(w.view(KEY, Some("12")), CacheView::Current);
        assert_eq!(w.pending(), 0);
        // Not comparable (not a KEP-5504 version): only equality counts.
        w.wrote(KEY, Some("x7".into()), Arc::new("at x7"));
        assert_eq!(w.view(KEY, Some("x8")), CacheView::Written(Arc::new("at x7")));
    }

    #[test]
    fn the_newest_write_is_the_one_acted_on() {
        let w = writes();
        w.wrote(KEY, Some("7".into()), Arc::new("at 7"));
        w.wrote(KEY, Some("8".into()), Arc::new("at 8"));
        assert_eq!(w.view(KEY, Some("7")), CacheView::Written(Arc::new("at 8")));
        assert_eq!(w.view(KEY, Some("8")), CacheView::Current);
    }

    #[test]
    fn a_watch_that_lags_past_the_wait_means_read_through_once() {
        let w = writes();
        w.wrote(KEY, Some("7".into()), Arc::new("at 7"));
        let later = Instant::now() + WAIT_FOR_WATCH + Duration::from_millis(1);
        assert_eq!(w.view_at(KEY, Some("6"), later), CacheView::ReadThrough);
        // The read copy is acted on; the next reconcile trusts the cache.
        assert_eq!(w.view_at(KEY, Some("6"), later), CacheView::Current);
    }

    #[test]
    fn a_refused_write_means_read_through_once_even_without_a_pending_write() {
        let w = writes();
        w.refused(KEY);
        assert_eq!(w.view(KEY, Some("6")), CacheView::ReadThrough);
        assert_eq!(w.view(KEY, Some("6")), CacheView::Current);

        w.wrote(KEY, Some("8".into()), Arc::new("at 8"));
        w.refused(KEY);
        assert_eq!(w.view(KEY, Some("6")), CacheView::ReadThrough, "no written copy after a refusal");
    }

    #[test]
    fn objects_are_tracked_apart() {
        let w = writes();
        w.wrote(KEY, Some("7".into()), Arc::new("at 7"));
        w.refused("tenant/other");
        assert_eq!(w.view("tenant/other", Some("1")), CacheView::ReadThrough);
        assert_eq!(w.view(KEY, Some("6")), CacheView::Written(Arc::new("at 7")));
    }

    #[test]
    fn writes_never_shown_to_a_pass_do_not_pile_up() {
        let w = writes();
        let long_ago = Instant::now() - WAIT_FOR_WATCH - Duration::from_secs(1);
        {
            let mut map = w.written.lock().unwrap();
            for i in 0..100 {
                let stored = Arc::new("gone");
                map.insert(format!("tenant/deleted-{i}"), Write { resource_version: "1".into(), at: long_ago, stored });
            }
        }
        for i in 0..100 {
            w.wrote(&format!("tenant/live-{i}"), Some("2".into()), Arc::new("live"));
        }
        assert_eq!(w.pending(), 100, "only the live writes are kept");
    }
}

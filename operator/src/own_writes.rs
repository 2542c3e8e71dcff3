//! Whether the watch cache's copy of a Sandbox can be acted on, given the
//! status writes this operator made itself.
//!
//! A reconcile decides from the cached copy. When that copy predates the
//! operator's own last status write, acting on it would repeat side effects
//! the write already records (sign a certificate again, retry a resume that
//! failed). The write's resourceVersion is kept until the watch shows it.
//! When the watch is slow to show it (more than [`WAIT_FOR_WATCH`]), or a
//! status write was refused as decided from an old copy (409), the next
//! reconcile reads the Sandbox from the apiserver instead of trusting the
//! cache. Without that it would act on the same old copy again every
//! requeue until the watch caught up.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a reconcile waits for the watch to show our own write before
/// it reads the object from the apiserver instead.
pub const WAIT_FOR_WATCH: Duration = Duration::from_secs(2);

/// What a reconcile may do with the cached copy of an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheView {
    /// Nothing of ours is missing from it: act on it.
    Current,
    /// It predates our own last write, which the watch should show soon:
    /// wait for it.
    Behind,
    /// It may be old and the watch has not caught up: read the object from
    /// the apiserver and act on that copy.
    ReadThrough,
}

#[derive(Default)]
pub struct OwnWrites {
    /// `namespace/name` → the resourceVersion of our last status write and
    /// when it was made, until the watch shows it.
    written: Mutex<HashMap<String, (String, Instant)>>,
    /// Objects whose last status write was refused as decided from an old
    /// copy.
    refused: Mutex<HashSet<String>>,
}

impl OwnWrites {
    /// Records the status this operator just wrote to `key`.
    pub fn wrote(&self, key: &str, resource_version: Option<String>) {
        let mut w = self.written.lock().unwrap_or_else(|p| p.into_inner());
        match resource_version {
            Some(rv) => w.insert(key.to_owned(), (rv, Instant::now())),
            None => w.remove(key),
        };
    }

    /// A status write to `key` was refused (409): it was decided from a
    /// copy older than the object.
    pub fn refused(&self, key: &str) {
        self.refused.lock().unwrap_or_else(|p| p.into_inner()).insert(key.to_owned());
    }

    /// How to treat the cached copy of `key` at `resource_version`.
    pub fn view(&self, key: &str, resource_version: Option<&str>) -> CacheView {
        self.view_at(key, resource_version, Instant::now())
    }

    fn view_at(&self, key: &str, resource_version: Option<&str>, now: Instant) -> CacheView {
        let mut w = self.written.lock().unwrap_or_else(|p| p.into_inner());
        let refused = self.refused.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
        let Some((rv, at)) = w.get(key) else {
            return if refused { CacheView::ReadThrough } else { CacheView::Current };
        };
        if Some(rv.as_str()) == resource_version {
            w.remove(key);
            return if refused { CacheView::ReadThrough } else { CacheView::Current };
        }
        if refused || now.duration_since(*at) > WAIT_FOR_WATCH {
            // Someone else may have written after us (the watch then shows
            // a newer copy than ours) or the watch lags: either way, read.
            w.remove(key);
            return CacheView::ReadThrough;
        }
        CacheView::Behind
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "tenant/box";

    #[test]
    fn a_copy_with_nothing_of_ours_pending_is_current() {
        let w = OwnWrites::default();
        assert_eq!(w.view(KEY, Some("5")), CacheView::Current);
    }

    #[test]
    fn a_copy_before_our_write_waits_then_the_write_seen_is_current() {
        let w = OwnWrites::default();
        w.wrote(KEY, Some("7".into()));
        assert_eq!(w.view(KEY, Some("6")), CacheView::Behind);
        assert_eq!(w.view(KEY, Some("7")), CacheView::Current);
        // Seen once, forgotten: a later copy is simply current.
        assert_eq!(w.view(KEY, Some("9")), CacheView::Current);
    }

    #[test]
    fn a_watch_that_lags_past_the_wait_means_read_through_once() {
        let w = OwnWrites::default();
        w.wrote(KEY, Some("7".into()));
        let later = Instant::now() + WAIT_FOR_WATCH + Duration::from_millis(1);
        assert_eq!(w.view_at(KEY, Some("6"), later), CacheView::ReadThrough);
        // The read copy is acted on; the next reconcile trusts the cache.
        assert_eq!(w.view_at(KEY, Some("6"), later), CacheView::Current);
    }

    #[test]
    fn a_refused_write_means_read_through_once_even_without_a_pending_write() {
        let w = OwnWrites::default();
        w.refused(KEY);
        assert_eq!(w.view(KEY, Some("6")), CacheView::ReadThrough);
        assert_eq!(w.view(KEY, Some("6")), CacheView::Current);

        w.wrote(KEY, Some("8".into()));
        w.refused(KEY);
        assert_eq!(w.view(KEY, Some("6")), CacheView::ReadThrough, "no waiting after a refusal");
    }

    #[test]
    fn objects_are_tracked_apart() {
        let w = OwnWrites::default();
        w.wrote(KEY, Some("7".into()));
        w.refused("tenant/other");
        assert_eq!(w.view("tenant/other", Some("1")), CacheView::ReadThrough);
        assert_eq!(w.view(KEY, Some("6")), CacheView::Behind);
    }
}

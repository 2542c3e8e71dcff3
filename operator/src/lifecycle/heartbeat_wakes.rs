//! Which heartbeat Lease events wake their session.
//!
//! A worker renews its Lease every few seconds. A renewal that moves only
//! `renewTime` changes nothing a pass decides while the gap between
//! renewals stays under the staleness limit (the worker counts as
//! reporting throughout), and each session's own requeue already looks
//! again at its worker-lost deadline. Waking on every renewal cost one
//! reconcile per session every 10 s: 500 a second at 5,000 sessions, for
//! nothing. So a Lease wakes its session when it is first seen, when
//! anything besides its renewal time changes (the attempt, the workspace
//! closed, the holder, a new Lease under the same name), and when a
//! renewal comes after a gap long enough that the worker counted as silent
//! meanwhile. The cache (`ctx.leases`) still holds every renewal.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;

/// What was last seen of each Lease: a fingerprint of all but its renewal
/// time, and that renewal time (ms since the epoch).
#[derive(Debug)]
pub struct HeartbeatWakes {
    stale_ms: i64,
    seen: HashMap<(String, String), (u64, Option<i64>)>,
}

impl HeartbeatWakes {
    /// `stale`: the age past which a heartbeat no longer counts
    /// (`--heartbeat-stale-seconds`).
    pub fn new(stale: Duration) -> Self {
        Self { stale_ms: stale.as_millis() as i64, seen: HashMap::new() }
    }

    /// Whether this event of `lease` should wake its session.
    pub fn wakes(&mut self, lease: &Lease) -> bool {
        let key =
            (lease.metadata.namespace.clone().unwrap_or_default(), lease.metadata.name.clone().unwrap_or_default());
        let renewed = lease.spec.as_ref().and_then(|s| s.renew_time.as_ref()).map(|t| t.0.as_millisecond());
        let content = fingerprint(lease);
        match self.seen.insert(key, (content, renewed)) {
            None => true,
            Some((before, _)) if before != content => true,
            Some((_, before)) => match (before, renewed) {
                (Some(b), Some(r)) => r - b > self.stale_ms,
                (None, Some(_)) => true,
                _ => false,
            },
        }
    }

    /// Forgets the Leases `exists` no longer knows (deleted ones; a
    /// deletion is not an event that wakes anyone).
    pub fn forget_gone(&mut self, exists: impl Fn(&str, &str) -> bool) {
        self.seen.retain(|(ns, name), _| exists(ns, name));
    }

    pub fn len(&self) -> usize {
        self.seen.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

/// Everything a pass could read from a Lease but its renewal time (and
/// the bookkeeping the apiserver changes on every write).
fn fingerprint(lease: &Lease) -> u64 {
    let mut h = DefaultHasher::new();
    let m = &lease.metadata;
    (&m.uid, &m.labels, &m.annotations).hash(&mut h);
    if let Some(s) = &lease.spec {
        (&s.holder_identity, s.lease_duration_seconds, s.lease_transitions).hash(&mut h);
        s.acquire_time.as_ref().map(|t| t.0.as_millisecond()).hash(&mut h);
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use k8s_openapi::jiff::Timestamp;
    use kube::api::ObjectMeta;
    use std::collections::BTreeMap;

    fn lease(uid: &str, attempt: &str, renewed_s: i64) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some("hangar-worker-node-a".into()),
                namespace: Some("hangar-system".into()),
                uid: Some(uid.into()),
                resource_version: Some(renewed_s.to_string()),
                annotations: Some(BTreeMap::from([("hangar.dev/attempt".to_owned(), attempt.to_owned())])),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some("node-a".into()),
                renew_time: Some(MicroTime(Timestamp::from_second(renewed_s).unwrap())),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_renewal_alone_wakes_nobody_but_a_change_or_a_silence_does() {
        let mut w = HeartbeatWakes::new(Duration::from_secs(30));
        assert!(w.wakes(&lease("u1", "1", 1000)), "first seen");
        assert!(!w.wakes(&lease("u1", "1", 1010)), "a renewal 10 s later");
        assert!(!w.wakes(&lease("u1", "1", 1040)), "30 s later: fresh all along");
        assert!(w.wakes(&lease("u1", "2", 1050)), "the attempt changed");
        assert!(w.wakes(&lease("u1", "2", 1081)), "31 s of silence: the worker counted as silent meanwhile");
        assert!(w.wakes(&lease("u2", "2", 1091)), "a new Lease under the same name");
        assert!(!w.wakes(&lease("u2", "2", 1091)), "the same again (a relist)");
    }

    #[test]
    fn gone_leases_are_forgotten() {
        let mut w = HeartbeatWakes::new(Duration::from_secs(30));
        w.wakes(&lease("u1", "1", 1000));
        w.forget_gone(|_, _| false);
        assert!(w.is_empty());
        assert!(w.wakes(&lease("u1", "1", 1010)), "seen anew");
    }
}

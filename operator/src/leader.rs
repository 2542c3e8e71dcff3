//! Leader election with a coordination.k8s.io Lease: one replica reconciles,
//! the others wait. A leader that cannot renew within the deadline exits, so
//! two replicas never act at once for longer than one lease.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};

pub struct LeaderElection {
    pub api: Api<Lease>,
    pub name: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl LeaderElection {
    /// Returns once this replica holds the Lease.
    pub async fn acquire(&self) {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => {
                    tracing::info!(identity = %self.identity, lease = %self.name, "became leader");
                    return;
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "leader election"),
            }
            tokio::time::sleep(self.retry_period).await;
        }
    }

    /// Renews until a renewal fails past the deadline; then returns (the
    /// caller exits).
    pub async fn keep_renewing(&self) {
        let mut last_ok = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(self.retry_period).await;
            match self.try_acquire_or_renew().await {
                Ok(true) => last_ok = tokio::time::Instant::now(),
                Ok(false) => {
                    tracing::error!("lost the leader Lease to another replica");
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not renew the leader Lease");
                    if last_ok.elapsed() > self.renew_deadline {
                        return;
                    }
                }
            }
        }
    }

    async fn try_acquire_or_renew(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let spec = LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.lease_duration.as_secs() as i32),
            renew_time: Some(MicroTime(now)),
            acquire_time: Some(MicroTime(now)),
            ..Default::default()
        };
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta { name: Some(self.name.clone()), ..Default::default() },
                spec: Some(spec),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let current = lease.spec.clone().unwrap_or_default();
        let ours = current.holder_identity.as_deref() == Some(&self.identity);
        let expired = current.renew_time.as_ref().is_none_or(|t| {
            let held = current.lease_duration_seconds.unwrap_or(15) as i64;
            now.as_second() - t.0.as_second() > held
        });
        if !ours && !expired {
            return Ok(false);
        }
        let mut next = spec;
        if ours {
            next.acquire_time = current.acquire_time;
            next.lease_transitions = current.lease_transitions;
        } else {
            next.lease_transitions = Some(current.lease_transitions.unwrap_or(0) + 1);
        }
        lease.spec = Some(next);
        // replace() carries resourceVersion: a concurrent taker makes this 409.
        match self.api.replace(&self.name, &PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }
}

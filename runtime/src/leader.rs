//! Leader election on a coordination.k8s.io Lease (kube-lease-manager):
//! one replica leads, the others wait. A leader that loses the Lease (it
//! could not renew in time, or another replica took it after it expired)
//! is told, and stops acting: two replicas never act at once for longer
//! than one lease.

use std::time::Duration;

use kube_lease_manager::{LeaseManagerBuilder, LeaseManagerError};
use tokio::sync::watch;

#[derive(Clone, Debug)]
pub struct LeaseSettings {
    pub namespace: String,
    pub name: String,
    /// This replica's name (its Pod name).
    pub identity: String,
    /// How long a Lease holds after its last renewal.
    pub duration: Duration,
    /// The holder renews this long before the Lease would expire.
    pub renew_before: Duration,
}

/// This replica's part in the election. Dropping it stops renewing without
/// giving the Lease up, as a process that dies would; `release` gives it up.
pub struct Leadership {
    leading: watch::Receiver<bool>,
    task: Option<tokio::task::JoinHandle<Result<kube_lease_manager::LeaseManager, LeaseManagerError>>>,
}

impl Drop for Leadership {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl Leadership {
    /// Joins the election (creating the Lease if needed).
    pub async fn join(client: kube::Client, s: &LeaseSettings) -> Result<Self, LeaseManagerError> {
        let manager = LeaseManagerBuilder::new(client, &s.name)
            .with_namespace(&s.namespace)
            .with_identity(&s.identity)
            .with_duration(s.duration.as_secs().max(2))
            .with_grace(s.renew_before.as_secs().clamp(1, s.duration.as_secs().max(2) - 1))
            .build()
            .await?;
        let (leading, task) = manager.watch().await;
        Ok(Self { leading, task: Some(task) })
    }

    pub fn is_leading(&self) -> bool {
        *self.leading.borrow()
    }

    /// Returns once this replica leads.
    pub async fn acquired(&mut self) {
        if self.leading.wait_for(|l| *l).await.is_ok() {
            tracing::info!("became leader");
        }
    }

    /// Returns when this replica no longer leads (the caller stops acting
    /// and exits, so that it starts again as a follower).
    pub async fn lost(&mut self) {
        let _ = self.leading.wait_for(|l| !*l).await;
        tracing::error!("lost the leader Lease");
    }

    /// Gives the Lease up at a clean shutdown, so a follower takes it at its
    /// next look instead of after it expires.
    pub async fn release(mut self) {
        let task = self.task.take();
        // Closing the channel tells the manager's task to release and end.
        let (_, closed) = watch::channel(false);
        drop(std::mem::replace(&mut self.leading, closed));
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}
